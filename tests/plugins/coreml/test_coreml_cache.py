"""Core ML's part of the compile cache: what keys a package, and a real package stored and checked by the
core's cache (``sdrt.cache``; its own behaviour is tested in tests/core/test_cache.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from coreml_helpers import graph_of, make_model
from onnx import TensorProto as TP
from onnx import helper

from sdrt import Device, resolve_weights
from sdrt.cache import CompileCache
from sdrt.weights import Weights
from sdrt_coreml.backend import PACKAGE, CoreMLBackend
from sdrt_coreml.options import parse_options

ALL = Device("coreml", "ALL", kind="auto")


def _small_model(scale: float = 1.0):
    w = (np.arange(12, dtype=np.float32).reshape(3, 4) * scale)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return make_model([node], {"x": ((2, 3), TP.FLOAT)}, {"y": (None, TP.FLOAT)}, {"w": w})


def _key(be, model, weights=None, device=ALL, **opts):
    o = parse_options(opts)
    static = be._prepare(graph_of(model), device, o)
    return be.cache_key(static, weights, be._cache_parts(static, device, o))


def test_key_changes_with_weights_graph_and_options_but_not_compute_unit():
    be = CoreMLBackend()
    base = _key(be, _small_model())
    assert base == _key(be, _small_model())
    assert base == _key(be, _small_model(), device=Device("coreml", "ANE", kind="npu"))
    assert base != _key(be, _small_model(2.0))
    assert base != _key(be, _small_model(), Weights.from_arrays({"w": np.ones((3, 4), np.float32)}))
    assert base != _key(be, _small_model(), precision="fp32")
    assert base != _key(be, _small_model(), target="macOS15")
    other = _small_model()
    other.graph.node[0].name = "renamed"
    assert base != _key(be, other)


def test_real_package_through_the_cache(tmp_path):
    """A real build stored in the compile cache, checked on the next lookup, damaged weights caught."""
    be = CoreMLBackend()
    opts = parse_options({"precision": "fp32"})
    static = be._prepare(graph_of(_small_model()), ALL, opts)
    cache = CompileCache("coreml", tmp_path)
    key = be.cache_key(static, None, be._cache_parts(static, ALL, opts))

    def build(folder: Path) -> None:
        be._build(static, resolve_weights(static), opts, folder / PACKAGE)

    assert cache.store(key, build) is not None
    entry = cache.lookup(key)
    weight = entry.file(PACKAGE) / "Data/com.apple.CoreML/weights/weight.bin"
    assert weight.is_file() and entry.meta == {}
    data = bytearray(weight.read_bytes())
    data[-1] ^= 0xFF
    weight.write_bytes(bytes(data))
    assert cache.lookup(key) is None and not entry.path.exists()
