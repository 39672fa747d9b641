"""Engines in the core's compile cache, and engine files: keyed, checksummed; a hit skips the build, a corrupt
entry rebuilds.

``compile`` runs here up to the point where it needs CUDA (no driver on this machine): the engine is
built or taken from the cache for real, and the session then fails with a clear ``TrtError``.
"""

from __future__ import annotations

import logging

import pytest

from bench.models import build
from sdrt import Device
from sdrt.errors import NoDeviceError, SdrtError
from sdrt.graph import Graph
from sdrt_trt.enginefile import CorruptEngine, pack, read_engine, unpack, write_engine
from sdrt_trt.errors import TrtError

RTX3060 = Device(backend="trt", id="cuda:0", name="NVIDIA GeForce RTX 3060", kind="gpu",
                 properties={"target": "sm86", "compute_capability": "8.6", "bf16": True})


def _entries(tmp_path):  # type: ignore[no-untyped-def]
    found = (tmp_path / "cache" / "compiled" / "trt").glob("*/engine.bin")
    return sorted(p for p in found if not p.parent.name.startswith("."))


def _compile_until_cuda(backend, graph: Graph, **options) -> None:  # type: ignore[no-untyped-def]
    """Compile for a hand-made RTX 3060; with no GPU here, it ends when the session needs CUDA."""
    if backend.devices():
        pytest.skip("this machine has a GPU; the GPU tests compile for real")
    with pytest.raises(TrtError, match="CUDA cudaSetDevice failed"):
        backend.compile(graph, None, RTX3060, refit="none", **options)


def test_round_trip_and_corruptions() -> None:
    data = b"".join(pack({"target": "sm86"}, b"engine-bytes"))
    assert unpack(data) == ({"target": "sm86"}, b"engine-bytes")
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for bad, reason in [(bytes(flipped), "checksum mismatch"), (data[:-3], "where the header says"),
                        (data[:5], "shorter than its header"), (b"XXXXXXXX" + data[8:], "wrong magic"),
                        (data[:14], "truncated metadata")]:
        with pytest.raises(CorruptEngine, match=reason):
            unpack(bad)


def test_cache_miss_build_then_hit(backend, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    caplog.set_level(logging.INFO, logger="sdrt.trt")
    _compile_until_cuda(backend, graph)
    (entry,) = _entries(tmp_path)
    assert any("built mobilenet_v2 for sm86" in r.message for r in caplog.records)
    caplog.clear()
    stamp = entry.stat().st_mtime_ns
    _compile_until_cuda(backend, graph)
    assert any("engine cache hit" in r.message for r in caplog.records)
    assert any("loaded mobilenet_v2" in r.message and "compile cache" in r.message for r in caplog.records) is False
    assert not any("built " in r.message for r in caplog.records)
    assert entry.stat().st_mtime_ns == stamp


def test_corrupted_entry_is_removed_and_rebuilt(backend, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    _compile_until_cuda(backend, graph)
    (entry,) = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    caplog.set_level(logging.INFO, logger="sdrt")
    _compile_until_cuda(backend, graph)
    assert any("checksum mismatch" in r.message and "removing it" in r.message for r in caplog.records)
    assert any("built mobilenet_v2" in r.message for r in caplog.records)
    from sdrt.cache import CompileCache

    hit = CompileCache("trt", tmp_path / "cache").lookup(entry.parent.name)  # rewritten whole
    assert hit is not None and hit.meta["target"] == "sm86" and hit.file("engine.bin").stat().st_size > 1_000_000


def test_key_follows_options_and_weights(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    _compile_until_cuda(backend, graph)
    _compile_until_cuda(backend, graph, precision="fp32")
    assert len(_entries(tmp_path)) == 2
    _compile_until_cuda(backend, graph, cache=False)
    assert len(_entries(tmp_path)) == 2


def test_cache_key_parts(backend) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])

    def key(device=RTX3060, **options):  # type: ignore[no-untyped-def]
        opts = backend.parse_options(options, device)
        return backend.cache_key(graph, None, backend._cache_parts(graph, device, opts),
                                 with_weights=backend._weights_in_key(opts))

    ada = Device(backend="trt", id="cuda:0", properties={"target": "sm89", "bf16": True})
    base = key()
    variants = [key(device=ada), key(precision="fp32"), key(refit="none"), key(shapes={"batch": 2}),
                key(profiles={"x": [[1, 3, 32, 32], [1, 3, 32, 32], [1, 3, 32, 32]]})]
    assert len({base, *variants}) == len(variants) + 1
    assert backend._cache_parts(graph, RTX3060, backend.parse_options({"engine": "x.engine"}, RTX3060)) is None


def test_unwritable_cache_is_not_fatal(backend, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    _compile_until_cuda(backend, graph, cache_dir=str(blocked))
    assert any("going on without" in r.message for r in caplog.records)


def test_engine_file_must_match_the_graph(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    mobilenet = Graph(build("mobilenet_v2", "tiny")[0])
    path = backend.build(mobilenet, None, "sm86", tmp_path / "m.engine")
    _compile_until_cuda(backend, mobilenet, engine=str(path))  # the right graph: on to CUDA
    other = Graph(build("mobilenet_v3", "tiny")[0])
    with pytest.raises(TrtError, match="does not match this graph.*graph: file"):
        backend.compile(other, None, RTX3060, engine=str(path))
    with pytest.raises(TrtError, match="does not match.*target: file 'sm86', wanted 'sm89'"):
        backend.compile(mobilenet, None, Device(backend="trt", id="cuda:0", properties={"target": "sm89"}),
                        engine=str(path))


def test_corrupt_or_missing_engine_file(backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    path = write_engine(tmp_path / "x.engine", {"target": "sm86"}, b"12345678")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(TrtError, match="the engine file is corrupt: engine of 7 bytes where the header says 8"):
        backend.compile(graph, None, RTX3060, engine=str(path))
    with pytest.raises(TrtError, match="cannot read the engine file"):
        read_engine(tmp_path / "absent.engine")


def test_device_of_another_backend(backend) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    with pytest.raises(NoDeviceError, match="belongs to backend 'openvino'"):
        backend.compile(graph, None, Device(backend="openvino", id="CPU"))


def test_device_without_a_target(backend) -> None:  # type: ignore[no-untyped-def]
    graph = Graph(build("mobilenet_v2", "tiny")[0])
    with pytest.raises(NoDeviceError, match="has no TensorRT-RTX target"):
        backend.compile(graph, None, Device(backend="trt", id="cuda:0"))


def test_bf16_needs_ampere(backend) -> None:  # type: ignore[no-untyped-def]
    turing = Device(backend="trt", id="cuda:0", name="RTX 2060", properties={"target": "sm75", "bf16": False,
                                                                                "compute_capability": "7.5"})
    with pytest.raises(SdrtError, match="RTX 2060 \\(compute 7.5\\) has no bf16"):
        backend.compile(Graph(build("mobilenet_v2", "tiny")[0]), None, turing, precision="bf16")
