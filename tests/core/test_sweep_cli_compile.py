"""``sdrt compile`` as a newcomer tries it, with a backend that builds ahead of time (a plain file per target): an
-o that cannot take the output was found only after the build (a folder, a dangling link: an OSError traceback;
/dev/null: "wrote /dev/null  0 bytes"), and a flag given twice or beside one that overrides it lost in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

import sdrt
from sdrt.backend import Backend, Device
from sdrt.cli import main


class _Aot(Backend):
    """Builds a file that records the options it was given; runs nothing."""

    name = "aot"
    built: list[dict] = []

    def devices(self):
        return [Device("aot", "CPU")]

    def compile(self, graph, weights, device, **options):  # pragma: no cover
        raise AssertionError("sdrt compile builds ahead of time")

    def targets(self):
        return ["t1"]

    def build(self, graph, weights, target, path, **options):
        self.built.append(options)
        Path(path).write_bytes(b"engine")
        return Path(path)


@pytest.fixture
def aot(registry, affine_path):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(_Aot())

    registry.register_plugin(Plugin(), "aot")
    _Aot.built.clear()
    return affine_path


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_build_writes_its_file(aot, tmp_path, capsys):
    out = tmp_path / "m.engine"
    assert main(["compile", str(aot), "-b", "aot", "-t", "t1", "-o", str(out), "--shape", "batch=2"]) == 0
    assert out.read_bytes() == b"engine" and _Aot.built == [{"shapes": {"batch": 2}}]


@pytest.mark.parametrize("kind", ["folder", "folder/", "device", "dangling link", "read-only file", "/proc"])
def test_an_output_that_cannot_take_the_file_is_refused_before_the_build(aot, tmp_path, capsys, kind):
    out = {"folder": str(tmp_path), "folder/": f"{tmp_path}/", "device": "/dev/null",
           "dangling link": str(tmp_path / "link.engine"), "read-only file": str(tmp_path / "ro.engine"),
           "/proc": "/proc/m.engine"}[kind]
    if kind == "dangling link":
        (tmp_path / "link.engine").symlink_to(tmp_path / "gone" / "m.engine")
    if kind == "read-only file":
        (tmp_path / "ro.engine").write_bytes(b"kept")
        (tmp_path / "ro.engine").chmod(0o444)
    assert main(["compile", str(aot), "-b", "aot", "-t", "t1", "-o", out]) == 1
    err = _error(capsys)
    assert "Where: -o." in err and _Aot.built == []
    assert not (tmp_path / "gone").exists()
    if kind == "read-only file":
        assert (tmp_path / "ro.engine").read_bytes() == b"kept"


@pytest.mark.parametrize(("flags", "said"), [
    (["--shape", "batch=2", "--shape", "batch=3"], "--shape 'batch' is given twice"),
    (["--option", "a=1", "--option", "a=2"], "--option 'a' is given twice"),
    (["--option", "shapes={\"batch\": 1}", "--shape", "batch=2"], "--shape and --option shapes=... both pin"),
])
def test_a_setting_given_twice_is_refused_not_overridden(aot, tmp_path, capsys, flags, said):
    assert main(["compile", str(aot), "-b", "aot", "-t", "t1", "-o", str(tmp_path / "m.engine"), *flags]) == 1
    assert said in _error(capsys) and _Aot.built == []


def test_build_flags_beside_list_targets_are_refused(aot, tmp_path, capsys):
    assert main(["compile", str(aot), "-b", "aot", "--list-targets"]) == 0
    assert capsys.readouterr().out.strip() == "aot: t1"
    assert main(["compile", str(aot), "-b", "aot", "--list-targets", "-t", "t1", "-o", str(tmp_path / "m")]) == 1
    assert "--target and --output would be ignored" in _error(capsys)


def test_a_bad_shape_names_the_flag(aot, tmp_path, capsys):
    assert main(["compile", str(aot), "-b", "aot", "-t", "t1", "-o", str(tmp_path / "m"), "--shape", "batch=0"]) == 1
    assert "Where: --shape." in _error(capsys)


def test_one_weights_file_given_twice_is_refused(aot, tmp_path, capsys):
    import numpy as np
    from safetensors.numpy import save_file

    w = tmp_path / "w.safetensors"
    save_file({"W": np.ones((4, 3), np.float32)}, str(w))
    (tmp_path / "again.safetensors").symlink_to(w)
    argv = ["compile", str(aot), "-b", "aot", "-t", "t1", "-o", str(tmp_path / "m"), "--weights", str(w),
            "--weights", str(tmp_path / "again.safetensors")]
    assert main(argv) == 1
    assert "name one file. Where: --weights." in _error(capsys) and _Aot.built == []
