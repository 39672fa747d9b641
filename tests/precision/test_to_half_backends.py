"""``to_half`` measured against float32 on every backend that runs here: reference, OpenVINO, ggml.

Each bench model (tiny size: the real layer structure at small widths) runs in float32 and after
``to_half`` on the same backend; the half graph must stay within 1e-2 of the float32 output
relative to its largest value (measured: 7e-4 to 2.8e-3, see docs/trt.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.models import build
from sdrt.graph import Graph
from sdrt.precision import to_half

#: the UNet is left out of the suite (10-16 s per backend here); docs/trt.md has its figures
MODELS = ["vae_decoder", "text_encoder", "mobilenet_v2"]
#: relative max error of a half graph against its float32 original
RTOL = 1e-2


def _backend(name: str):  # type: ignore[no-untyped-def]
    if name == "reference":
        from sdrt_reference import ReferenceBackend

        return ReferenceBackend()
    if name == "openvino":
        pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
        from sdrt_openvino import OpenVINOBackend

        return OpenVINOBackend()
    pytest.importorskip("ggml", reason="ggml-python is not installed (pip install ggml-python)")
    from sdrt_ggml import GgmlBackend

    return GgmlBackend()


def _run(backend_name: str, graph: Graph, feeds: dict[str, np.ndarray], tmp_path) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    be = _backend(backend_name)
    options = {"cache_dir": str(tmp_path)} if backend_name == "openvino" else {}
    device = next(d for d in be.devices() if d.kind == "cpu")
    with be.compile(graph, None, device, **options) as session:
        return session.run(feeds)


def _rel_err(want: np.ndarray, got: np.ndarray) -> float:
    return float(np.abs(want.astype(np.float64) - got).max() / (np.abs(want).max() + 1e-12))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_half_graph_matches_float32_on_backend(backend: str, model: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto, feeds = build(model, "tiny")
    graph = Graph(proto)
    half = to_half(graph)
    want = _run(backend, graph, feeds, tmp_path / "f32")
    got = _run(backend, half, feeds, tmp_path / "f16")
    assert set(got) == set(want)
    for name, ref in want.items():
        assert got[name].dtype == np.float32, "inputs and outputs keep float32 by default"
        assert np.isfinite(got[name]).all()
        err = _rel_err(ref, got[name])
        assert err < RTOL, f"{model} on {backend}: {name} relative error {err:.2e}"
        assert err > 0, "the half graph must really compute in half precision"
