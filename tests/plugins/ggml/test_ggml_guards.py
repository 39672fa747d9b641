"""ggml's asserted preconditions are checked before the call: GgmlPrecondition, not abort()."""

from __future__ import annotations

import ggml
import numpy as np
import pytest
from ggml_helpers import F, compile_ggml, make_model
from onnx import helper

from sdrt.errors import UnsupportedGraph
from sdrt_ggml.guards import CheckedGgml, GgmlPrecondition, is_contiguous, is_packed
from sdrt_ggml.ops._common import ggml_lib


@pytest.fixture
def ctx():
    c = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 * ggml.ggml_tensor_overhead(), mem_buffer=None,
                                             no_alloc=True))
    yield c
    ggml.ggml_free(c)


def test_the_plugin_only_sees_checked_bindings():
    assert isinstance(ggml_lib(), CheckedGgml)


def test_scale_of_a_size_one_strided_tensor_is_refused_not_aborted(ctx):
    lib = ggml_lib()
    t = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, 4, 1, 3, 1)
    odd = lib.ggml_permute(ctx, t, 0, 2, 1, 3)  # ne (4, 3, 1, 1) with nb[2] != nb[1] * ne[1]
    assert is_contiguous(odd) and not is_packed(odd)  # what ggml_is_contiguous accepts, ggml_scale asserts on
    with pytest.raises(GgmlPrecondition, match="ggml_scale_bias.*padded"):
        lib.ggml_scale_bias(ctx, odd, 2.0, 1.0)


@pytest.mark.parametrize("call", ["mul_mat", "add", "reshape", "concat", "get_rows", "view", "permute"])
def test_each_guard_raises_before_ggml_would_abort(ctx, call):
    lib = ggml_lib()
    a = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, 4, 3, 2, 1)
    b = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, 5, 3, 2, 1)
    with pytest.raises(GgmlPrecondition):
        if call == "mul_mat":
            lib.ggml_mul_mat(ctx, a, b)
        elif call == "add":
            lib.ggml_add(ctx, a, b)
        elif call == "reshape":
            lib.ggml_reshape_2d(ctx, lib.ggml_transpose(ctx, a), 12, 2)
        elif call == "concat":
            lib.ggml_concat(ctx, a, b, 1)
        elif call == "get_rows":
            lib.ggml_get_rows(ctx, a, b)  # float indices
        elif call == "view":
            lib.ggml_view_2d(ctx, a, 4, 7, 16, 0)  # past the end
        else:
            lib.ggml_permute(ctx, a, 0, 0, 1, 2)


def test_a_failed_precondition_names_the_node():
    # Split of a transposed tensor along its innermost axis used to read the strided data as dense
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
             helper.make_node("Split", ["t", "s"], ["a", "b"], axis=2, name="split_inner")]
    m = make_model(nodes, {"x": ((1, 4, 4), F)}, {"a": (None, F)}, {"s": np.array([1, 3], np.int64)})
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    with compile_ggml(m) as s:
        np.testing.assert_array_equal(s.run({"x": x})["a"], x.transpose(2, 0, 1)[:, :, :1])


def test_guard_errors_become_unsupported_graph_with_the_node(monkeypatch):
    from sdrt_ggml import guards

    def refuse(*_args):
        raise GgmlPrecondition("ggml_mul_mat: test refusal")

    monkeypatch.setitem(guards.CHECKS, "ggml_mul_mat", refuse)
    monkeypatch.delattr(ggml_lib(), "ggml_mul_mat", raising=False)  # drop the cached wrapper
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm1")], {"x": ((2, 3), F)}, {"y": (None, F)},
                   {"w": np.ones((3, 4), np.float32)})
    try:
        with pytest.raises(UnsupportedGraph) as err:
            compile_ggml(m, gemm="ggml")  # the MatMul through ggml_mul_mat (the CPU default is the native GEMM)
        assert "mm1" in str(err.value) and "test refusal" in str(err.value)
    finally:
        monkeypatch.undo()
        ggml_lib().__dict__.pop("ggml_mul_mat", None)


def test_an_empty_graph_input_is_refused_not_aborted():
    """A graph whose input declares a 0 dim (onnxruntime runs it): ggml's allocator aborted the process
    (GGML_ASSERT(tensor->buffer == NULL) in ggml-backend.cpp). An empty Slice inside the graph, or an empty output,
    still run."""
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ((0, 4), F)}, {"y": ((0, 4), F)})
    with pytest.raises(UnsupportedGraph, match=r"graph input 'x' is empty \(shape \(0, 4\)\)"):
        compile_ggml(m)
    starts, ends, axes = (np.array([1], np.int64) for _ in range(3))
    axes[:] = 0
    m = make_model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], {"x": ((3, 4), F)}, {"y": ((0, 4), F)},
                   {"s": starts, "e": ends, "a": axes})
    with compile_ggml(m) as s:
        assert s.run({"x": np.ones((3, 4), np.float32)})["y"].shape == (0, 4)
