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
