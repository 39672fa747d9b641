"""`sdrt install` / `sdrt.install()`: the plan, and real pip runs into a throwaway environment.

The install tests build small wheels by hand (a wheel is a zip with a .dist-info folder), put them in
a local folder, and let the real pip install them into a fresh ``venv --without-pip`` with
``--no-index --find-links``. Nothing is mocked: success, pip's own failure, and the rollback are
what pip really does.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import io
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import sdrt
from sdrt import installer
from sdrt.cli import main
from sdrt.errors import InstallError
from sdrt.hardware import CPU, Accelerator, Hardware
from sdrt.installer import install, plan, restore, snapshot
from sdrt.plugins import compatible_requirement


@pytest.fixture(autouse=True)
def _installed_not_checkout(request, monkeypatch):
    """Plan as an installed sdrt does (from the index), unless a test says otherwise."""
    if "checkout" not in request.node.name:
        monkeypatch.setattr(installer, "CHECKOUT", None)

X86 = CPU(vendor="intel", model="Intel Xeon", arch="x86_64", features=("avx2", "avx512f", "amx_tile"))
RTX = Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[Accelerator(
    kind="gpu", vendor="nvidia", name="NVIDIA GeForce RTX 4090", compute_capability="8.9", integrated=False)])
GTX = Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[Accelerator(
    kind="gpu", vendor="nvidia", name="NVIDIA GeForce GTX 1060", compute_capability="6.1", integrated=False)])
CPU_ONLY = Hardware(os="Linux", arch="x86_64", cpu=X86)


# -- the plan (no pip run) ---------------------------------------------------

def test_plan_installs_the_recommended_plugin_pinned_to_this_core():
    p = plan(hw=RTX)
    assert (p.plugin, p.distribution, p.requirement) == ("trt", "sdrt-trt", "sdrt-trt==0.1.*")
    assert p.requirement == compatible_requirement("sdrt-trt")
    assert p.argv == [sys.executable, "-m", "pip", "install", "sdrt-trt==0.1.*"] and p.env == {}
    assert p.command.endswith("-m pip install 'sdrt-trt==0.1.*'")


def test_plan_for_ggml_passes_the_cmake_flag_and_builds_from_source(monkeypatch):
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    p = plan(hw=GTX)
    assert (p.plugin, p.build) == ("ggml", "cuda")
    assert p.env == {"CMAKE_ARGS": "-DGGML_CUDA=ON -DGGML_LLAMAFILE=ON"}
    assert p.argv[-3:] == ["sdrt-ggml==0.1.*", "--no-binary", "ggml-python"]
    assert p.command.startswith("CMAKE_ARGS='-DGGML_CUDA=ON -DGGML_LLAMAFILE=ON' ")


@pytest.mark.parametrize("build, flag", [("vulkan", "-DGGML_VULKAN=ON"), ("metal", "-DGGML_METAL=ON"),
                                         ("hip", "-DGGML_HIP=ON")])
def test_plan_for_each_ggml_build(build, flag, monkeypatch):
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    p = plan("ggml", build=build, hw=CPU_ONLY)
    assert p.env == {"CMAKE_ARGS": f"-DGGML_NATIVE=OFF {flag} -DGGML_LLAMAFILE=ON"}  # the user's own flags are kept


def test_plan_for_ggml_cpu_builds_llamafile_kernels_from_source(monkeypatch):
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    p = plan("ggml", hw=CPU_ONLY)
    assert (p.build, p.env) == ("cpu", {"CMAKE_ARGS": "-DGGML_LLAMAFILE=ON"})
    assert p.argv[-2:] == ["--no-binary", "ggml-python"]


def test_plan_for_ggml_by_name_picks_the_build_for_the_gpu_here():
    assert plan("ggml", hw=RTX).build == "cuda"


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in uv on PATH is a POSIX shell script")
def test_plan_with_uv(monkeypatch, tmp_path):
    fake_uv = tmp_path / "uv"
    fake_uv.write_text("#!/bin/sh\n")
    fake_uv.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    p = plan("ggml", build="vulkan", use_uv=True, hw=CPU_ONLY)
    assert p.argv == [str(fake_uv), "pip", "install", "--python", sys.executable, "sdrt-ggml==0.1.*",
                      "--no-binary-package", "ggml-python"]


def test_plan_with_uv_missing_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InstallError, match="uv command is not on PATH.*pip install uv"):
        plan(use_uv=True, hw=RTX)


def test_unknown_plugin_is_an_install_error():
    with pytest.raises(InstallError, match="unknown plugin 'cuda'.*trt, migraphx, openvino, coreml, ggml"):
        plan("cuda", hw=RTX)


def test_one_extra_pip_argument_given_as_a_string_is_one_argument():
    """``sdrt.install(extra_args="--no-deps")`` ran pip with the arguments '-', '-', 'n', 'o', ...: its letters."""
    p = plan("openvino", extra_args="--no-deps", hw=RTX)
    assert p.argv[-1] == "--no-deps" and "n" not in p.argv, p.argv


def test_a_ggml_build_for_another_plugin_is_an_install_error():
    with pytest.raises(InstallError, match="applies to the ggml plugin only"):
        plan("openvino", build="cuda", hw=RTX)
    with pytest.raises(InstallError, match="unknown ggml build 'rocm'"):
        plan("ggml", build="rocm", hw=RTX)


def test_extras_pull_the_matching_plugin_with_the_compatible_pin():
    requires = md.requires("sdrt") or []
    for plugin in ("trt", "migraphx", "openvino", "coreml", "ggml"):
        want = f'{compatible_requirement("sdrt-" + plugin)}; extra == "{plugin}"'
        assert want in requires, f"pip install sdrt[{plugin}] must pull {want}"
    assert any(r.startswith("torchruntime") for r in requires)


MAC = Hardware(os="Darwin", arch="arm64", cpu=CPU(vendor="apple", model="Apple M3", arch="arm64"), devices=[
    Accelerator(kind="gpu", vendor="apple", name="Apple M3", integrated=True)])


@pytest.mark.parametrize(("plugin", "build", "hw", "says"), [
    ("coreml", None, CPU_ONLY, "Core ML runs models only on macOS (this is Linux)"),
    ("trt", None, CPU_ONLY, "no GPU here that trt runs on: it needs an NVIDIA RTX GPU"),
    ("trt", None, GTX, "no GPU here that trt runs on (NVIDIA GeForce GTX 1060: compute 6.1 is older than Turing"),
    ("migraphx", None, RTX, "no GPU here that migraphx runs on: it needs an AMD GPU on ROCm's Linux support list"),
    ("ggml", "cuda", CPU_ONLY, "no NVIDIA GPU found here: ggml's cuda build would run on the CPU only"),
    ("ggml", "metal", RTX, "ggml's Metal build runs only on macOS (this is Linux)"),
])
def test_a_plugin_asked_for_that_runs_nothing_here_is_named(plugin, build, hw, says):
    assert says in plan(plugin, build=build, hw=hw).caveat


@pytest.mark.parametrize(("plugin", "build", "hw"), [
    ("trt", None, RTX), ("coreml", None, MAC), ("openvino", None, RTX), ("ggml", "cuda", GTX), ("ggml", "cpu", RTX),
    ("ggml", "vulkan", RTX), (None, None, CPU_ONLY), ("ggml", None, RTX)])
def test_a_plugin_that_runs_here_has_no_caveat(plugin, build, hw):
    assert plan(plugin, build=build, hw=hw).caveat is None


def test_sdrt_install_is_a_plain_function():
    result = sdrt.install(dry_run=True, hw=RTX)
    assert result.dry_run and result.plan.plugin == "trt" and result.added == {}
    assert sdrt.install is install and type(installer) is type(sys)


def test_from_a_source_checkout_the_plugin_folder_is_installed(monkeypatch, tmp_path):
    """Any plugin-<name>/ folder of the checkout is found; a plugin without one comes from the index."""
    for name in ("openvino", "coreml"):
        (tmp_path / f"plugin-{name}").mkdir()
        (tmp_path / f"plugin-{name}" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.setattr(installer, "CHECKOUT", tmp_path)
    monkeypatch.setattr(installer, "CHECKOUT_EDITABLE", True)  # the core runs from the checkout: plugins too
    for name in ("openvino", "coreml"):
        p = plan(name, hw=RTX)
        assert p.argv[-2:] == ["-e", str(tmp_path / f"plugin-{name}")] and p.requirement == p.argv[-1]
        assert "from this source checkout" in p.reason
    monkeypatch.setattr(installer, "CHECKOUT_EDITABLE", False)  # the core was copied from it: the plugin is too
    p = plan("openvino", hw=RTX)
    assert p.argv[-2:] == ["install", str(tmp_path / "plugin-openvino")] and "-e" not in p.argv
    assert plan("trt", hw=RTX).requirement == compatible_requirement("sdrt-trt")


def test_this_checkout_is_found_when_sdrt_runs_from_it():
    here = Path(__file__).resolve().parents[2]
    if Path(installer.__file__).resolve().parents[3] != here:
        pytest.skip("sdrt is installed as a package here, not run from this checkout")
    assert installer.CHECKOUT == here
    assert installer.source_folder("openvino") == here / "plugin-openvino"


def test_cli_dry_run_prints_the_exact_command(capsys):
    assert main(["install", "--dry-run", "--plugin", "openvino"]) == 0
    out = capsys.readouterr().out
    assert "plugin: openvino  ->  sdrt-openvino" in out
    assert f"command: {sys.executable} -m pip install 'sdrt-openvino==0.1.*'" in out
    assert "dry run: nothing was installed" in out


def test_cli_dry_run_on_this_machine_names_the_recommended_plugin(capsys):
    from sdrt.hardware import detect, recommend

    rec = recommend(detect())
    assert main(["install", "--dry-run"]) == 0
    assert f"plugin: {rec.plugin}  ->  {rec.distribution}" in capsys.readouterr().out


def test_cli_rejects_a_build_for_a_non_ggml_plugin(capsys):
    assert main(["install", "--dry-run", "--plugin", "trt", "--build", "cuda"]) == 1
    assert "applies to the ggml plugin only" in capsys.readouterr().err


# -- real pip runs -----------------------------------------------------------

def make_wheel(folder: Path, name: str, version: str, requires: list[str] = (), files: dict[str, str] | None = None
               ) -> Path:
    """A minimal, valid py3-none-any wheel."""
    norm = name.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    contents = dict(files or {f"{norm}/__init__.py": f"VERSION = {version!r}\n"})
    contents[f"{info}/METADATA"] = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires))
    contents[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: sdrt-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    contents[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
    return wheel


@pytest.fixture
def env(tmp_path):
    """A fresh, empty environment to install into, and a folder of wheels to install from."""
    target = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    links = tmp_path / "wheels"
    links.mkdir()
    return str(python), links


def source(links: Path) -> list[str]:
    return ["--no-index", "--find-links", str(links)]


def site_packages(python: str) -> Path:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def test_install_puts_the_compatible_version_into_the_target_env(env):
    python, links = env
    make_wheel(links, "sdrt-openvino", "0.1.3")
    make_wheel(links, "sdrt-openvino", "0.2.0")          # built for a newer core: must not be chosen
    before = snapshot(python)
    result = install("openvino", python=python, extra_args=source(links), hw=CPU_ONLY)
    assert result.added == {"sdrt-openvino": "0.1.3"} and result.changed == {}
    assert snapshot(python) == dict(before, **{"sdrt-openvino": "0.1.3"})


def test_a_requirement_pip_cannot_resolve_reports_pips_error_and_changes_nothing(env):
    python, links = env
    make_wheel(links, "sdrt-keepme", "1.0")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", *source(links), "sdrt-keepme"],
                   check=True)
    make_wheel(links, "sdrt-ggml", "0.1.0", requires=["sdrt-missing-dependency>=1"])
    before = snapshot(python)
    with pytest.raises(InstallError) as err:
        install("ggml", build="cpu", python=python, extra_args=source(links), hw=CPU_ONLY)
    msg = str(err.value)
    assert "No matching distribution found for sdrt-missing-dependency>=1" in msg   # pip's own words
    assert "nothing was changed" in msg and "--find-links" in msg
    assert snapshot(python) == before and "sdrt-keepme" in before


def test_no_plugin_published_for_this_core_is_an_install_error(env):
    python, links = env
    make_wheel(links, "sdrt-trt", "0.2.0")
    with pytest.raises(InstallError, match=r"No matching distribution found for sdrt-trt==0\.1\.\*"):
        install(python=python, extra_args=source(links), hw=RTX)


def test_a_failure_half_way_through_the_install_is_rolled_back(env):
    """pip installs the dependency, then fails writing the plugin: the dependency is removed again."""
    python, links = env
    make_wheel(links, "sdrt-dep", "1.0")
    make_wheel(links, "sdrt-openvino", "0.1.0", requires=["sdrt-dep"],
               files={"sdrt_clash": "a file where the env has a folder\n"})
    clash = site_packages(python) / "sdrt_clash"
    clash.mkdir()
    (clash / "keep.txt").write_text("not pip's\n")
    before = snapshot(python)
    log = io.StringIO()
    with pytest.raises(InstallError) as err:
        install("openvino", python=python, extra_args=source(links), hw=CPU_ONLY, echo=log)
    assert "Installing collected packages: sdrt-dep, sdrt-openvino" in log.getvalue()   # pip got half way
    assert "failed to install sdrt-openvino==0.1.*" in str(err.value)
    assert "Is a directory" in str(err.value)
    assert "the environment is as it was" in str(err.value)
    assert snapshot(python) == before and (clash / "keep.txt").exists()


def test_restore_removes_added_and_puts_back_changed_versions(env):
    python, links = env
    for v in ("1.0", "2.0"):
        make_wheel(links, "sdrt-pinned", v)
    make_wheel(links, "sdrt-extra", "1.0")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", *source(links)]
    subprocess.run([*pip, "sdrt-pinned==1.0"], check=True)
    before = snapshot(python)
    subprocess.run([*pip, "sdrt-pinned==2.0", "sdrt-extra"], check=True)
    after = snapshot(python)
    assert after["sdrt-pinned"] == "2.0" and "sdrt-extra" in after
    assert restore(python, before, after, source(links)) is True
    assert snapshot(python) == before


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed here (pip install uv to run this)")
def test_install_with_uv(env):
    python, links = env
    make_wheel(links, "sdrt-openvino", "0.1.0")
    result = install("openvino", use_uv=True, python=python, extra_args=source(links), hw=CPU_ONLY)
    assert result.added == {"sdrt-openvino": "0.1.0"}


# -- a source build without a compiler ---------------------------------------

NO_COMPILER_LOG = Path(__file__).parent / "data" / "pip_no_compiler.txt"


def test_a_build_without_a_compiler_says_what_to_install(monkeypatch):
    """pip's real output when ggml-python's CMake build finds no C compiler (captured with no
    compiler on PATH: scripts/capture_no_compiler.sh): one line that names the fix."""
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    lines = NO_COMPILER_LOG.read_text(encoding="utf-8").splitlines()
    p = plan("ggml", build="cpu", hw=CPU_ONLY)
    fix = installer._fix_for(p, lines)
    assert "needs a C/C++ compiler" in fix and "build-essential" in fix and "xcode-select --install" in fix
    assert fix.endswith(p.command) and "\n" not in fix
    assert "ggml-python" in installer._pip_error(lines)


def test_the_compiler_line_survives_a_long_build_log():
    """The CMake line that names the missing compiler comes long before pip's last lines."""
    script = "print('CMake Error: CMAKE_C_COMPILER: /x/cc is not a full path to an existing compiler tool.')\n" \
             "for i in range(500): print('log line', i)\n"
    rc, lines = installer._run([sys.executable, "-c", script], dict(os.environ), None)
    assert rc == 0 and "not a full path to an existing compiler tool" in lines[0] and lines[-1] == "log line 499"
    assert len(lines) == 61


def test_other_build_failures_keep_the_generic_fix():
    p = plan("ggml", build="cpu", hw=CPU_ONLY)
    assert "needs a C/C++ compiler" not in installer._fix_for(p, ["ERROR: Failed building wheel for ggml-python"])


def test_a_core_copied_from_a_checkout_installs_plugins_from_that_checkout(monkeypatch, tmp_path):
    """``pip install ./core`` (no -e, as the Quick start does) records the folder in direct_url.json:
    ``sdrt install`` then installs ``plugin-<name>/`` of that checkout, without -e (issue 31)."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "pyproject.toml").write_text("[project]\nname = 'sdrt'\n")
    (tmp_path / "plugin-openvino").mkdir()
    (tmp_path / "plugin-openvino" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    record = {"url": (tmp_path / "core").as_uri(), "dir_info": {}}
    assert installer.checkout_of(record) == (tmp_path, False)
    assert installer.checkout_of({**record, "dir_info": {"editable": True}}) == (tmp_path, True)
    assert installer.checkout_of({"url": "https://example.org/sdrt.whl", "archive_info": {}}) == (None, False)
    assert installer.checkout_of({"url": (tmp_path / "gone" / "core").as_uri(), "dir_info": {}}) == (None, False)
    monkeypatch.setattr(installer, "CHECKOUT", tmp_path)
    monkeypatch.setattr(installer, "CHECKOUT_EDITABLE", False)
    p = plan("openvino", hw=RTX)
    assert p.argv[-1] == str(tmp_path / "plugin-openvino") and "-e" not in p.argv
