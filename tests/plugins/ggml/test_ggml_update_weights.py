"""update_weights on ggml when every initializer is passed (as a pipeline does): only changed weights count."""

from __future__ import annotations

import logging

import numpy as np
from ggml_helpers import F, compile_ggml, make_model, rand
from onnx import helper

mk = helper.make_node


class _Weights:
    def __init__(self, arrays):
        self.arrays = arrays

    def bind(self, graph):
        return dict(self.arrays)


def _model():
    w, b = rand(6, 4), rand(4)
    nodes = [mk("MatMul", ["x", "w"], ["m"]), mk("Add", ["m", "b"], ["y"]),
             mk("Mul", ["b", "b"], ["bb"]), mk("Add", ["y", "bb"], ["z"])]  # b*b is folded at lowering
    return make_model(nodes, {"x": ((2, 6), F)}, {"z": (None, F)}, {"w": w, "b": b}), w, b


def test_an_unchanged_folded_weight_does_not_lower_the_graph_again(caplog):
    model, w, b = _model()
    x = rand(2, 6, seed=7)
    caplog.set_level(logging.DEBUG, logger="sdrt.ggml")
    with compile_ggml(model) as s:
        w2 = rand(6, 4, seed=9)
        s.update_weights(_Weights({"w": w2, "b": b.copy()}))  # b passed again, equal: no rebuild
        assert not any("lowering the graph again" in r.getMessage() for r in caplog.records)
        assert any("wrote 1 of" in r.getMessage() for r in caplog.records)
        np.testing.assert_allclose(s.run({"x": x})["z"], x @ w2 + b + b * b, rtol=1e-5, atol=1e-5)
        s.update_weights(_Weights({"w": w2.copy(), "b": b}))  # nothing changed: nothing written
        assert sum("wrote" in r.getMessage() for r in caplog.records) == 1
        b2 = rand(4, seed=11)
        s.update_weights(_Weights({"w": w, "b": b2}))  # the folded weight changed: lowered again
        assert any("lowering the graph again" in r.getMessage() for r in caplog.records)
        np.testing.assert_allclose(s.run({"x": x})["z"], x @ w + b2 + b2 * b2, rtol=1e-5, atol=1e-5)


def test_many_changed_weights_are_written_through_the_thread_window():
    rng = np.random.default_rng(0)
    n = 40  # more than one window of conversions
    nodes, inits = [], {}
    prev = "x"
    for i in range(n):
        inits[f"w{i}"] = rng.standard_normal((4, 4)).astype(np.float32) * 0.5
        nodes.append(mk("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    model = make_model(nodes, {"x": ((2, 4), F)}, {prev: (None, F)}, inits)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    with compile_ggml(model) as s:
        new = {k: v[::-1].copy() for k, v in inits.items()}
        s.update_weights(_Weights(new))
        want = x
        for i in range(n):
            want = want @ new[f"w{i}"]
        np.testing.assert_allclose(s.run({"x": x})[prev], want, rtol=1e-4, atol=1e-5)


def test_cpu_weights_live_in_the_arrays_lowering_made_not_in_a_second_copy():
    # the CPU reads each weight from the array lowering made for it (a buffer over it): no ggml buffer holds
    # them all again. The caller's arrays are never wrapped: changing them leaves the session as it was, and
    # update_weights writes into the session's own copies.
    model, w, b = _model()
    x = rand(2, 6, seed=7)
    arrays = {"w": w.copy(), "b": b.copy()}
    with compile_ggml(model, _Weights(arrays)) as s:
        assert s._wbuf is None and len(s._wrapped) == len(s._wrapped_arrays) > 0
        for a in s._wrapped_arrays:
            assert a.ctypes.data % 64 == 0
            assert not any(np.may_share_memory(a, v) for v in [*arrays.values(), *s._spec.initializers.values()])
        want = x @ w + b + b * b
        np.testing.assert_allclose(s.run({"x": x})["z"], want, rtol=1e-5, atol=1e-5)
        arrays["w"][:] = 0.0  # the caller's array, changed in place after compiling
        np.testing.assert_allclose(s.run({"x": x})["z"], want, rtol=1e-5, atol=1e-5)
        w2 = rand(6, 4, seed=9)
        s.update_weights(_Weights({"w": w2, "b": b}))
        np.testing.assert_allclose(s.run({"x": x})["z"], x @ w2 + b + b * b, rtol=1e-5, atol=1e-5)
