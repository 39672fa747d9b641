"""The flow transformers and T5 encoders built ahead of time by TensorRT-RTX and Core ML (their AOT paths run
on any machine; running the engines needs the vendor's hardware). MIGraphX has no AOT target: its check is
the op list of its ONNX parser, which every flow part passes. Chroma's transformer takes a bool
``attention_mask``; Core ML models take no bool inputs, so Core ML refuses it up front, naming the input.
"""

from __future__ import annotations

import pytest
from conftest import KINDS, folder
from test_flow_backends import T5, _parts, feeds_for

from sdrt.errors import UnsupportedGraph
from sdrt.graph import Graph

AOT = {"trt": ("sdrt_trt", "tensorrt_rtx", "sm86", ".engine"), "coreml": ("sdrt_coreml", "coremltools", "macOS14",
                                                                         ".mlpackage")}
PARAMS = [(b, k, p) for b in AOT for k in KINDS for p in ("transformer", T5[k])]


@pytest.fixture
def aot_backend(request, registry, tmp_path, monkeypatch):
    module, vendor, _, _ = AOT[request.param]
    plugin = pytest.importorskip(module)
    pytest.importorskip(vendor, reason=f"{vendor} is not installed")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    registry.register_plugin(plugin, request.param, distribution=module.replace("_", "-"))
    return registry.backends[request.param]


@pytest.mark.parametrize(("aot_backend", "kind", "part"), PARAMS, indirect=["aot_backend"],
                         ids=[f"{b}-{k}-{p}" for b, k, p in PARAMS])
def test_builds_ahead_of_time(aot_backend, kind: str, part: str, tmp_path) -> None:
    name, (_, _, target, suffix) = aot_backend.name, AOT[aot_backend.name]
    shapes = {k: v.shape for k, v in feeds_for(kind, part).items()}
    graph = Graph.load(folder(kind) / part / "model.onnx")
    if name == "coreml" and kind == "chroma" and part == "transformer":
        with pytest.raises(UnsupportedGraph, match="attention_mask.*bool"):
            aot_backend.build(graph, None, target, tmp_path / f"m{suffix}", shapes=shapes)
        return
    out = aot_backend.build(graph, None, target, tmp_path / f"m{suffix}", shapes=shapes)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else out.stat().st_size
    assert size > 10_000


@pytest.mark.parametrize("kind", KINDS)
def test_every_flow_part_passes_the_migraphx_parser_op_list(kind: str) -> None:
    ops = pytest.importorskip("sdrt_migraphx.ops")
    for part in _parts(kind):
        ops.check(Graph.load(folder(kind) / part / "model.onnx"), None)  # raises UnsupportedGraph otherwise
