"""The diffusion transformers' rewrites (rewrites_dit.py): RMSNorm -> ggml_rms_norm and the interleaved rotary
embedding -> sdrt-ggml's native rope op. Each fires on the forms torch exports, matches onnxruntime, and a
pattern that differs (another rotation, another axis) is left to the op-by-op lowering."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import F, check, compile_ggml, make_model, rand
from onnx import helper

mk = helper.make_node
BIG = np.array([1 << 62], np.int64)


def _both(model, feeds):
    with compile_ggml(model) as on, compile_ggml(model, rewrites=()) as off:
        return on.run(feeds), off.run(feeds), on.rewrite_hits, off.rewrite_hits


def rms_model(form: str, opset: int = 17, shape=(2, 9, 3, 20), axis: int = -1):
    sq = [mk("Pow", ["x", "two"], ["sq"])] if form != "mul_square" else [mk("Mul", ["x", "x"], ["sq"])]
    mean = (mk("ReduceMean", ["sq"], ["m"], axes=[axis], keepdims=1) if opset < 18
            else mk("ReduceMean", ["sq", "axes"], ["m"], keepdims=1))
    nodes = sq + [mean, mk("Add", ["m", "eps"], ["me"]), mk("Sqrt", ["me"], ["std"])]
    if form == "reciprocal":
        nodes += [mk("Reciprocal", ["std"], ["inv"]), mk("Mul", ["inv", "x"], ["y0"])]
    elif form == "div":
        nodes += [mk("Div", ["x", "std"], ["y0"])]
    else:
        nodes += [mk("Div", ["one", "std"], ["inv"]), mk("Mul", ["x", "inv"], ["y0"])]
    nodes += [mk("Mul", ["y0", "w"], ["y"])]
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
             "w": rand(shape[-1]) + 1.0}
    if opset >= 18:
        inits["axes"] = np.array([axis], np.int64)
    return make_model(nodes, {"x": (shape, F)}, {"y": (None, F)}, inits, opset=opset)


@pytest.mark.parametrize("form", ["div_one", "reciprocal", "div", "mul_square"])
@pytest.mark.parametrize("opset", [17, 18])
def test_rms_norm_becomes_one_op(form, opset):
    model = rms_model(form, opset)
    feeds = {"x": rand(2, 9, 3, 20) * 3 + 0.5}
    on, off, hits, hits_off = _both(model, feeds)
    assert hits.get("rmsnorm") == 1 and not hits_off.get("rmsnorm"), hits
    np.testing.assert_allclose(on["y"], off["y"], rtol=1e-5, atol=1e-6)
    check(model, feeds, rtol=1e-5, atol=1e-6)


def test_rms_norm_over_another_axis_is_not_matched():
    model = rms_model("div_one", shape=(2, 9, 20, 3), axis=2)
    feeds = {"x": rand(2, 9, 20, 3)}
    with compile_ggml(model) as s:
        assert not s.rewrite_hits.get("rmsnorm"), s.rewrite_hits
    check(model, feeds, rtol=1e-5, atol=1e-6)


def rope_model(shape=(1, 11, 3, 12), table=(11, 1, 12), const_tables=False, rotation="flux", export=False):
    """diffusers' apply_rotary_emb (use_real_unbind_dim=-1) as torch exports it; ``rotation="other"`` pairs
    (x_even, -x_odd) instead, which is not the rope the native op computes."""
    big, last = "big", "last"
    nodes = [mk("Slice", ["x", "zero", big, last, "two"], ["real"]), mk("Slice", ["x", "one", big, last, "two"], ["imag"])]
    if rotation == "flux":
        nodes += [mk("Neg", ["imag"], ["ni"]), mk("Unsqueeze", ["ni", last], ["a"]), mk("Unsqueeze", ["real", last], ["b"])]
    else:
        nodes += [mk("Neg", ["imag"], ["ni"]), mk("Unsqueeze", ["real", last], ["a"]), mk("Unsqueeze", ["ni", last], ["b"])]
    nodes += [mk("Concat", ["a", "b"], ["pair"], axis=-1)]
    if export:  # as torch exports diffusers' module: the target shape read from the pair's Shape, x.float() Casts
        nodes += [mk("Shape", ["pair"], ["pshape"]), mk("Slice", ["pshape", "zero", "three"], ["lead"]),
                  mk("Concat", ["lead", "minus1"], ["tshape"], axis=0), mk("Reshape", ["pair", "tshape"], ["rot0"]),
                  mk("Cast", ["rot0"], ["rot"], to=1), mk("Cast", ["x"], ["xf"], to=1),
                  mk("Mul", ["xf", "cos"], ["xc"])]
    else:
        nodes += [mk("Reshape", ["pair", "shape"], ["rot"]), mk("Mul", ["x", "cos"], ["xc"])]
    nodes += [mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["xc", "rs"], ["y"])]
    inits = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64), "two": np.array([2], np.int64),
             big: BIG, last: np.array([-1], np.int64), "shape": np.array([0, 0, 0, -1], np.int64),
             "three": np.array([3], np.int64), "minus1": np.array([-1], np.int64)}
    ang = np.random.default_rng(3).uniform(-3, 3, table).astype(np.float32)
    tabs = {"cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32)}
    inputs = {"x": (shape, F)}
    if const_tables:
        inits.update(tabs)
        feeds = {}
    else:
        inputs.update({"cos": (table, F), "sin": (table, F)})
        feeds = dict(tabs)
    feeds["x"] = rand(*shape)
    return make_model(nodes, inputs, {"y": (None, F)}, inits), feeds


@pytest.mark.parametrize("shape,table", [((1, 11, 3, 12), (11, 1, 12)), ((2, 5, 4, 6), (5, 1, 6)),
                                         ((2, 5, 4, 6), (1, 6)), ((1, 7, 2, 2), (1, 7, 1, 2))])
@pytest.mark.parametrize("const_tables", [False, True])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("export", [False, True])
def test_rope_becomes_one_native_op(shape, table, const_tables, threads, export):
    model, feeds = rope_model(shape, table, const_tables, export=export)
    with compile_ggml(model, threads=threads) as on, compile_ggml(model, rewrites=(), threads=threads) as off:
        got, ref = on.run(feeds), off.run(feeds)
        assert on.rewrite_hits.get("rope") == 1 and not off.rewrite_hits.get("rope"), on.rewrite_hits
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
    check(model, feeds, rtol=1e-5, atol=1e-6, threads=threads)


def test_another_rotation_is_not_matched():
    model, feeds = rope_model(rotation="other")
    with compile_ggml(model) as s:
        assert not s.rewrite_hits.get("rope"), s.rewrite_hits
    check(model, feeds, rtol=1e-5, atol=1e-6)
