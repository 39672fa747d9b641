"""Quantized weights: the tiny SD 1.5 UNet from tests/data/pipelines, and registries with real backends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt import plugins

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
UNET = DATA / "tiny-sd15" / "unet" / "model.onnx"


@pytest.fixture(scope="module")
def unet_path():
    return UNET


@pytest.fixture(scope="module")
def unet():
    from sdrt.graph import Graph

    return Graph.load(UNET)


@pytest.fixture(scope="module")
def unet_feeds():
    rng = np.random.default_rng(0)
    return {"sample": rng.standard_normal((1, 4, 8, 8), np.float32), "timestep": np.array([500], np.float32),
            "encoder_hidden_states": rng.standard_normal((1, 7, 32), np.float32)}


@pytest.fixture
def backends(tmp_path, monkeypatch):
    """A registry with the reference backend and every real backend importable here."""
    import sdrt_reference

    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    plugins.reset_registry()
    reg = plugins.get_registry()
    reg.register_plugin(sdrt_reference, "reference", distribution="sdrt-reference")
    for name in ("openvino", "ggml"):
        try:
            mod = __import__(f"sdrt_{name}")
        except ImportError:
            continue
        reg.register_plugin(mod, name, distribution=f"sdrt-{name}", version="0.1.0")
    try:
        yield reg
    finally:
        plugins.reset_registry()


@pytest.fixture(scope="module")
def unet_transposed(unet):
    """The tiny UNet with every MatMul weight stored in torch's [out, in] layout and transposed in the graph, as
    sdrt's shipped weight-free graphs take a checkpoint's linear weights (``Transpose`` -> ``MatMul``)."""
    from onnx import helper, numpy_helper

    from sdrt.graph import Graph
    from sdrt.graph.protos import copy_model

    arrays = unet.initializer_arrays()
    weights = {n.input[1] for n in unet.model.graph.node if n.op_type == "MatMul" and n.input[1] in arrays
               and np.asarray(arrays[n.input[1]]).ndim == 2}
    m = copy_model(unet.model, initializers=False)
    for t in unet.model.graph.initializer:
        a = np.asarray(arrays[t.name])
        m.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(a.T if t.name in weights else a),
                                                           t.name + ".oi" if t.name in weights else t.name))
    transposes = [helper.make_node("Transpose", [w + ".oi"], [w], perm=[1, 0], name=w + ".transpose")
                  for w in sorted(weights)]
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(transposes + nodes)
    return Graph(m, unet.path, base_dir=unet.base_dir)
