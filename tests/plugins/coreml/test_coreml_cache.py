"""The package cache: misses build, hits do not, damaged entries are rebuilt, writes are atomic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from coreml_helpers import graph_of, make_model
from onnx import TensorProto as TP
from onnx import helper

from sdrt_coreml import cache as cache_mod
from sdrt_coreml.backend import CoreMLBackend
from sdrt_coreml.options import parse_options


def _fake_package(out: Path, payload: bytes = b"weights") -> None:
    """Stand-in for a package build (the cache only sees a folder of files)."""
    (out / "Data").mkdir(parents=True)
    (out / "Data" / "weight.bin").write_bytes(payload)
    (out / "Manifest.json").write_text("{}")


class Counter:
    def __init__(self, payload: bytes = b"weights") -> None:
        self.calls = 0
        self.payload = payload

    def __call__(self, out: Path) -> None:
        self.calls += 1
        _fake_package(out, self.payload)


def test_miss_builds_then_hit_reuses(tmp_path):
    store = cache_mod.PackageCache(tmp_path)
    build = Counter()
    pkg, hit = store.get_or_build("k" * 64, build)
    assert not hit and build.calls == 1 and (pkg / "Data" / "weight.bin").read_bytes() == b"weights"
    pkg2, hit2 = store.get_or_build("k" * 64, build)
    assert hit2 and pkg2 == pkg and build.calls == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k" * 64]  # no temporary folders left


@pytest.mark.parametrize("damage", ["flip", "truncate", "extra", "remove", "checksums", "no-checksums"])
def test_damaged_entry_is_removed_and_rebuilt(tmp_path, damage, caplog):
    store = cache_mod.PackageCache(tmp_path)
    build = Counter()
    pkg, _ = store.get_or_build("d" * 64, build)
    weight = pkg / "Data" / "weight.bin"
    if damage == "flip":
        weight.write_bytes(b"weighTs")
    elif damage == "truncate":
        weight.write_bytes(b"wei")
    elif damage == "extra":
        (pkg / "Data" / "stray.bin").write_bytes(b"x")
    elif damage == "remove":
        weight.unlink()
    elif damage == "checksums":
        (pkg.parent / cache_mod.CHECKSUMS).write_text("{not json")
    else:
        (pkg.parent / cache_mod.CHECKSUMS).unlink()
    pkg2, hit = store.get_or_build("d" * 64, build)
    assert not hit and build.calls == 2
    assert (pkg2 / "Data" / "weight.bin").read_bytes() == b"weights"
    assert "damaged" in caplog.text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_failed_build_leaves_nothing(tmp_path):
    store = cache_mod.PackageCache(tmp_path)

    def broken(out: Path) -> None:
        _fake_package(out)
        raise RuntimeError("lowering failed")

    with pytest.raises(RuntimeError):
        store.get_or_build("f" * 64, broken)
    assert list(tmp_path.iterdir()) == []


def test_entry_written_by_another_process_meanwhile_wins(tmp_path):
    store = cache_mod.PackageCache(tmp_path)
    key = "r" * 64

    def racing(out: Path) -> None:  # another process stores the entry while this one builds
        other = tmp_path / "other"
        _fake_package(other / cache_mod.PACKAGE, b"theirs")
        (other / cache_mod.CHECKSUMS).write_text(json.dumps(cache_mod.checksums(other / cache_mod.PACKAGE)))
        os.rename(other, tmp_path / key)
        _fake_package(out, b"ours")

    pkg, hit = store.get_or_build(key, racing)
    assert not hit and (pkg / "Data" / "weight.bin").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == [key]


def test_default_dir_follows_sdrt_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path))
    assert cache_mod.default_dir() == tmp_path / "coreml"
    monkeypatch.delenv("SDRT_CACHE_DIR")
    assert cache_mod.default_dir().parts[-2:] == ("sdrt", "coreml")


def _small_model(scale: float = 1.0):
    w = (np.arange(12, dtype=np.float32).reshape(3, 4) * scale)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return make_model([node], {"x": ((2, 3), TP.FLOAT)}, {"y": (None, TP.FLOAT)}, {"w": w})


def test_key_changes_with_weights_graph_and_options_but_not_compute_unit():
    be = CoreMLBackend()

    def key(model, **opts):
        o = parse_options(opts)
        static, arrays = be._prepare(graph_of(model), None, o)
        return be._cache_key(static, arrays, o)

    base = key(_small_model())
    assert base == key(_small_model())
    assert base != key(_small_model(2.0))
    assert base != key(_small_model(), precision="fp32")
    assert base != key(_small_model(), target="macOS15")
    other = _small_model()
    other.graph.node[0].name = "renamed"
    assert base != key(other)


def test_real_package_through_the_cache(tmp_path):
    """A real build stored, checked on the next get, and damaged weights caught by the checksum."""
    be = CoreMLBackend()
    opts = parse_options({"precision": "fp32"})
    static, arrays = be._prepare(graph_of(_small_model()), None, opts)
    store = cache_mod.PackageCache(tmp_path)
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        be._build(static, arrays, opts, out)

    key = be._cache_key(static, arrays, opts)
    pkg, hit = store.get_or_build(key, build)
    assert not hit and (pkg / "Data/com.apple.CoreML/weights/weight.bin").is_file()
    assert store.get_or_build(key, build) == (pkg, True) and len(calls) == 1
    weight = pkg / "Data/com.apple.CoreML/weights/weight.bin"
    data = bytearray(weight.read_bytes())
    data[-1] ^= 0xFF
    weight.write_bytes(bytes(data))
    assert store.get_or_build(key, build)[1] is False and len(calls) == 2
