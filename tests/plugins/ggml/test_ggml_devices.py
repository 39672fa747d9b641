"""GPU devices of ggml (Vulkan, CUDA, ...): what a non-CPU session lowers and where its nodes run.

The first tests run everywhere: they lower a graph the way a GPU device gets it (no CPU-only
custom ops, scratch tensors as scheduler-placed leaves) and run it through ggml's scheduler on
the CPU. The rest need a ggml build with a GPU backend and are skipped without one (CI's
build is CPU-only); ``nox -s ggml_vulkan`` builds ggml-python's Vulkan backend and runs them on
Mesa's lavapipe, a Vulkan driver that runs on the CPU.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from ggml_helpers import F, make_model, rand, run_ort
from onnx import helper
from test_ggml_exports import MODELS, range_error

mk = helper.make_node


def _backend():
    from sdrt_ggml import GgmlBackend

    return GgmlBackend()


GPUS = [d for d in _backend().devices() if d.kind != "cpu"]
needs_gpu = pytest.mark.skipif(
    not GPUS, reason="this ggml-python build registers no GPU device (CPU-only build, as in CI); "
    "`nox -s ggml_vulkan` builds the Vulkan backend and runs these on Mesa's lavapipe")
gpu_ids = [d.id for d in GPUS]
#: max error on a GPU device, relative to the output's range. ggml's Vulkan matmul (mul_mm) rounds
#: its float32 operands to float16 on Mesa's lavapipe (docs/ggml.md, "GPUs"): 2^-11 of
#: each operand, 3.5e-3 of the range after the small SD 1.5 UNet; the CPU tests hold 1e-4
GPU_LIMIT = 5e-3


def _compile_as_gpu(model: onnx.ModelProto):
    """A session lowered as for a GPU device (``on_cpu=False``) but running on the CPU device
    through ggml's scheduler: the GPU code path, testable without a GPU."""
    from sdrt import resolve_weights
    from sdrt.graph import Graph
    from sdrt_ggml.devices import open_device
    from sdrt_ggml.lower import LoweringSpec, lower_graph
    from sdrt_ggml.session import GgmlSession

    graph = Graph(model)
    handles = open_device("CPU", 2)
    spec = LoweringSpec(
        nodes=list(model.graph.node), initializers=dict(resolve_weights(graph)),
        input_infos=[(i.name, tuple(int(d) for d in i.shape), i.dtype) for i in graph.inputs],
        output_names=[o.name for o in graph.outputs],
        opsets={o.domain or "": int(o.version) for o in model.opset_import}, options={}, on_cpu=False)
    return GgmlSession(graph.inputs, graph.outputs, graph=graph, spec=spec, lowered=lower_graph(spec),
                       device=handles, scheduler=True)


def _conv_stack(c: int = 8, hw: int = 12) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """3x3 (stride 1 and 2), 1x1 and depthwise convs, a GroupNorm pattern, SiLU and a nearest upsample."""
    inits = {"w1": rand(c, c, 3, 3, seed=1) / 9, "b1": rand(c, seed=2), "w2": rand(c, c, 3, 3, seed=3) / 9,
             "w3": rand(c, c, 1, 1, seed=4) / 3, "w4": rand(c, 1, 3, 3, seed=5) / 3,
             "scales": np.array([1, 1, 2, 2], np.float32), "shape_g": np.array([1, 2, -1], np.int64),
             "one": np.ones(2, np.float32), "zero": np.zeros(2, np.float32),
             "shape_x": np.array([1, c, hw, hw], np.int64)}
    nodes = [
        mk("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        mk("Reshape", ["a", "shape_g"], ["ag"]),
        mk("InstanceNormalization", ["ag", "one", "zero"], ["an"], epsilon=1e-5),
        mk("Reshape", ["an", "shape_x"], ["a2"]),
        mk("Sigmoid", ["a2"], ["sg"]), mk("Mul", ["a2", "sg"], ["s"]),
        mk("Conv", ["s", "w2"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2]),
        mk("Conv", ["d", "w3"], ["e"]),
        mk("Conv", ["e", "w4"], ["f"], pads=[1, 1, 1, 1], group=c),
        mk("Resize", ["f", "", "scales"], ["y"], mode="nearest", coordinate_transformation_mode="asymmetric",
           nearest_mode="floor"),
    ]
    model = make_model(nodes, {"x": ((1, c, hw, hw), F)}, {"y": (None, F)}, inits)
    return model, {"x": rand(1, c, hw, hw)}


def _attention(d: int = 16, n: int = 24, heads: int = 2) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    scale = np.array(d ** -0.5, np.float32)
    nodes = [mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), mk("MatMul", ["q", "kt"], ["qk"]),
             mk("Mul", ["qk", "scale"], ["sc"]), mk("Softmax", ["sc"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["y"])]
    shape = (1, heads, n, d)
    model = make_model(nodes, {"q": (shape, F), "k": (shape, F), "v": (shape, F)}, {"y": (None, F)}, {"scale": scale})
    return model, {"q": rand(*shape, seed=1), "k": rand(*shape, seed=2), "v": rand(*shape, seed=3)}


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], limit: float = 1e-4) -> None:
    """Every output within ``limit`` of its range (max |want|) of onnxruntime's."""
    for k, w in want.items():
        assert got[k].shape == w.shape, (k, got[k].shape, w.shape)
        err = range_error(got[k], w)
        assert err <= limit, f"{k}: max error {err:.2e} of the output's range"


# -- the GPU route, on the CPU --------------------------------------------------------------------

def test_gpu_lowering_uses_no_cpu_only_route_and_matches_onnxruntime():
    model, feeds = _conv_stack()
    with _compile_as_gpu(model) as s:
        assert not any("window" in k or "native" in k for k in s.impl_hits), s.impl_hits
        _close(s.run(feeds), run_ort(model, feeds))
        place = s.placement()
    assert place["fallback_nodes"] == 0 and place["device_nodes"] > 0 and place["splits"] == 1


def test_placement_of_a_cpu_session():
    """Every node runs on the CPU device, and each op of the stack is one kernel on every ISA."""
    from ggml_helpers import compile_ggml

    from sdrt_ggml.native_ops import native_ops

    model, feeds = _conv_stack()
    with compile_ggml(model) as s:
        place = s.placement()
        kernels = _compute_nodes(s)
    assert place == {"device_nodes": len(kernels), "fallback_nodes": 0, "fallback_ops": {}, "splits": 1}
    if native_ops() is None:  # ggml's own ops: one node or more for each op of the stack
        assert len(kernels) >= 8
        return
    # sdrt-ggml's kernels: one node for each op of the stack, the same on every ISA. The one
    # ISA-dependent node is a convolution's own zero-padding copy (`sdrt_pad`): the AVX2 GEMM
    # pads the first conv's input apart, AVX-512 and the portable C read it padded in place.
    kernels = sorted(k for k in kernels if k != ("CUSTOM", "sdrt_pad"))
    assert kernels == sorted([("CUSTOM", "sdrt_conv")] * 3 + [
        ("CUSTOM", "sdrt_dwconv"), ("CUSTOM", "sdrt_gn_stats"), ("CUSTOM", "sdrt_group_norm"),
        ("CUSTOM", "sdrt_upscale")])


def _compute_nodes(session) -> list[tuple[str, str]]:
    """(op, name) of each node of a session's ggml graph that computes (views left out)."""
    from sdrt_ggml.ops._common import ggml_lib

    g = ggml_lib()
    views = {g.GGML_OP_NONE, g.GGML_OP_RESHAPE, g.GGML_OP_VIEW, g.GGML_OP_PERMUTE, g.GGML_OP_TRANSPOSE}
    nodes = [g.ggml_graph_node(session._graph, i) for i in range(int(g.ggml_graph_n_nodes(session._graph)))]
    return [(g.ggml_op_desc(t).decode(), t.contents.name.decode()) for t in nodes if t.contents.op not in views]


def test_ggml_log_goes_to_python_logging_not_stderr():
    """ggml's log (the Vulkan backend's device list, for one) is routed to ``sdrt.ggml.native``."""
    import ctypes

    from sdrt_ggml import bindings

    lib = bindings.ggml_lib()
    cb, user = lib.ggml_log_callback(), ctypes.c_void_p()
    lib.ggml_log_get(ctypes.byref(cb), ctypes.byref(user))
    assert ctypes.cast(cb, ctypes.c_void_p).value == ctypes.cast(bindings._LOG_CALLBACK, ctypes.c_void_p).value


# -- real GPU devices -----------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("device", gpu_ids)
def test_gpu_device_is_listed_with_its_memory(device):
    dev = next(d for d in _backend().devices() if d.id == device)
    assert dev.kind == "gpu" and dev.name and dev.properties["ggml_backend"]


@needs_gpu
@pytest.mark.parametrize("device", gpu_ids)
@pytest.mark.parametrize("case", ["convs", "attention"])
def test_small_graphs_on_the_gpu_match_onnxruntime(device, case):
    from sdrt.graph import Graph

    model, feeds = _conv_stack() if case == "convs" else _attention()
    dev = next(d for d in _backend().devices() if d.id == device)
    with _backend().compile(Graph(model), None, dev) as s:
        _close(s.run(feeds), run_ort(model, feeds), GPU_LIMIT)
        place = s.placement()
    assert place["device_nodes"] > 0 and place["fallback_nodes"] == 0, place


@needs_gpu
@pytest.mark.parametrize("device", gpu_ids)
def test_gpu_session_reruns_and_updates_weights(device):
    from sdrt import Weights
    from sdrt.graph import Graph

    w = rand(6, 4)
    model = make_model([mk("MatMul", ["x", "w"], ["y"])], {"x": ((3, 6), F)}, {"y": (None, F)}, {"w": w})
    dev = next(d for d in _backend().devices() if d.id == device)
    x = rand(3, 6)
    with _backend().compile(Graph(model), None, dev) as s:
        _close(s.run({"x": x}), {"y": x @ w}, GPU_LIMIT)
        s.update_weights(Weights.from_arrays({"w": 2 * w}))
        _close(s.run({"x": x}), {"y": x @ (2 * w)}, GPU_LIMIT)


@needs_gpu
@pytest.mark.parametrize("device", gpu_ids)
def test_a_weight_the_gpu_cannot_hold_stays_in_cpu_memory(device):
    """A weight above the device's storage-buffer range (lavapipe: 128 MiB) made ggml's scheduler
    abort the process (the conformance kit's vgg19: a 392 MiB weight); it now stays in CPU memory
    and the ops reading it run on the CPU."""
    from sdrt.graph import Graph

    dev = next(d for d in _backend().devices() if d.id == device)
    k, n = 8192, 4224  # 138 MB of float32
    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32) / np.sqrt(k)
    model = make_model([mk("MatMul", ["x", "w"], ["h"]), mk("Relu", ["h"], ["y"])], {"x": ((2, k), F)},
                       {"y": (None, F)}, {"w": w})
    x = rand(2, k)
    with _backend().compile(Graph(model), None, dev) as s:
        _close(s.run({"x": x}), {"y": np.maximum(x.astype(np.float64) @ w, 0)}, GPU_LIMIT)
        place = s.placement()
    if dev.properties.get("software"):  # lavapipe: 128 MiB storage-buffer range
        assert place["fallback_ops"].get("MUL_MAT") == 1, place


@needs_gpu
@pytest.mark.parametrize("device", gpu_ids)
@pytest.mark.parametrize("name", MODELS)
def test_real_exports_on_the_gpu(device, name, tmp_path):
    """The exports of issue 20 point 2 on each GPU device, within GPU_LIMIT of the output's range."""
    from test_ggml_exports import reference

    from sdrt.graph import Graph

    path, feeds, want = reference(name, tmp_path)
    dev = next(d for d in _backend().devices() if d.id == device)
    with _backend().compile(Graph(onnx.load(str(path))), None, dev) as s:
        _close(s.run(feeds), want, GPU_LIMIT)
