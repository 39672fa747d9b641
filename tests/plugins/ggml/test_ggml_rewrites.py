"""The rewrites to ggml's fused kernels: each one fires on the pattern torch exports, and the
outputs with and without it match each other and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from ggml_helpers import F, check, compile_ggml, make_model, rand
from onnx import helper

mk = helper.make_node


def _both(model, feeds):
    """Outputs with every rewrite and with none (gelu stays: ggml has no erf kernel); rewrite hit counts."""
    with compile_ggml(model) as on, compile_ggml(model, rewrites=()) as off:
        return on.run(feeds), off.run(feeds), on.rewrite_hits, off.rewrite_hits


def attention_model(scale_style: str, mask: bool = False, rank: int = 4, d: int = 16, n: int = 10):
    b, h, m = 2, 3, 7
    shape_q = (b, h, n, d) if rank == 4 else (b * h, n, d)
    shape_kv = (b, h, m, d) if rank == 4 else (b * h, m, d)
    perm = [0, 1, 3, 2] if rank == 4 else [0, 2, 1]
    nodes = [mk("Transpose", ["k"], ["kt"], perm=perm)]
    inits = {}
    if scale_style == "qk":  # torch SDPA export: sqrt(scale) on q and on k^T
        nodes += [mk("Mul", ["q", "s"], ["qs"]), mk("Mul", ["kt", "s"], ["ks"]), mk("MatMul", ["qs", "ks"], ["sc"])]
        inits["s"] = np.array(d ** -0.25, np.float32)
    else:  # scores scaled after the product
        nodes += [mk("MatMul", ["q", "kt"], ["raw"]), mk("Div", ["raw", "s"], ["sc"])]
        inits["s"] = np.array(d ** 0.5, np.float32)
    last = "sc"
    if mask:
        inits["mask"] = np.triu(np.full((n, m), -np.inf, np.float32), 1)
        nodes.append(mk("Add", ["sc", "mask"], ["scm"]))
        last = "scm"
    nodes += [mk("Softmax", [last], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, {"q": (shape_q, F), "k": (shape_kv, F), "v": (shape_kv, F)}, {"y": (None, F)}, inits)
    feeds = {"q": rand(*shape_q), "k": rand(*shape_kv, seed=1), "v": rand(*shape_kv, seed=2)}
    return model, feeds


@pytest.mark.parametrize("impl", ["native", "ggml"])
@pytest.mark.parametrize("scale_style", ["qk", "scores"])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("rank", [3, 4])
def test_attention_becomes_one_kernel(scale_style, mask, rank, impl):
    """impl "native": sdrt-ggml's attention kernel; "ggml": ggml_flash_attn_ext."""
    model, feeds = attention_model(scale_style, mask, rank)
    with compile_ggml(model, attention=impl) as on, compile_ggml(model, rewrites=()) as off:
        hits, hits_off = on.rewrite_hits, off.rewrite_hits
        assert hits.get("attention") == 1 and "attention" not in hits_off
        assert on.impl_hits.get("attention native", 0) == (impl == "native")
        np.testing.assert_allclose(on.run(feeds)["y"], off.run(feeds)["y"], rtol=1e-4, atol=1e-5)
    check(model, feeds, attention=impl)


@pytest.mark.parametrize("d", [8, 40])
def test_attention_head_dims_padded_for_the_fast_kernel(d):
    """Head dims that are not a multiple of 16 are zero-padded for flash attention (and the
    output cropped); the native kernel takes any head dim as it is."""
    model, feeds = attention_model("qk", mask=True, d=d, n=70)
    on, off, hits, _ = _both(model, feeds)
    assert hits.get("attention") == 1
    np.testing.assert_allclose(on["y"], off["y"], rtol=1e-4, atol=1e-5)
    check(model, feeds)
    check(model, feeds, attention="ggml")
    check(model, feeds, attention="ggml", pad_k=False)


def test_attention_with_non_f16_mask_is_left_alone_by_flash_attention():
    """ggml's flash attention takes an f16 mask; the native kernel takes any float32 one."""
    model, feeds = attention_model("scores", mask=True)
    for init in model.graph.initializer:
        if init.name == "mask":
            from onnx import numpy_helper

            init.CopyFrom(numpy_helper.from_array(rand(10, 7) * 1e-3, "mask"))
    with compile_ggml(model, attention="ggml") as s:
        assert "attention" not in s.rewrite_hits
    check(model, feeds, attention="ggml")
    with compile_ggml(model) as s:
        assert s.rewrite_hits.get("attention") == 1 and s.impl_hits.get("attention native") == 1
    check(model, feeds)


def groupnorm_model(c=8, groups=4, hw=5, n=2, silu=False, conv=False):
    nodes = [mk("Reshape", ["x", "gshape"], ["g"]),
             mk("InstanceNormalization", ["g", "ones", "zeros"], ["gn"], epsilon=1e-5),
             mk("Reshape", ["gn", "xshape"], ["r"]),
             mk("Mul", ["r", "gamma"], ["m"]), mk("Add", ["m", "beta"], ["a"])]
    last = "a"
    if silu:
        nodes += [mk("Sigmoid", ["a"], ["sg"]), mk("Mul", ["a", "sg"], ["s"])]
        last = "s"
    inits = {"gshape": np.array([n, groups, -1], np.int64), "ones": np.ones(groups, np.float32),
             "zeros": np.zeros(groups, np.float32), "xshape": np.array([n, c, hw, hw], np.int64),
             "gamma": rand(c, 1, 1), "beta": rand(c, 1, 1, seed=1)}
    if conv:  # a 3x3 conv reads the channels-last twin
        inits["w"] = rand(6, c, 3, 3, seed=2) * 0.2
        nodes.append(mk("Conv", [last, "w"], ["y"], pads=[1, 1, 1, 1]))
    else:
        nodes.append(mk("Identity", [last], ["y"]))
    x = rand(n, c, hw, hw) * 2 + 0.5
    return make_model(nodes, {"x": ((n, c, hw, hw), F)}, {"y": (None, F)}, inits), {"x": x}


def test_groupnorm_pattern_becomes_ggml_group_norm():
    model, feeds = groupnorm_model()
    with compile_ggml(model, groupnorm="ggml") as on, compile_ggml(model, rewrites=()) as off:
        assert on.rewrite_hits.get("groupnorm") == 1 and "groupnorm" not in off.rewrite_hits
        np.testing.assert_allclose(on.run(feeds)["y"], off.run(feeds)["y"], rtol=1e-4, atol=1e-5)
    check(model, feeds, groupnorm="ggml")


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("conv", [False, True])
def test_groupnorm_native_fuses_affine_and_silu(n, silu, conv):
    """Reshape/InstanceNorm/Reshape, then Mul(gamma), Add(beta) [and SiLU]: one native pass; with
    batch 1 the conv after it reads the channels-last output the same kernel writes."""
    model, feeds = groupnorm_model(c=12, groups=3, hw=7, n=n, silu=silu, conv=conv)
    with compile_ggml(model) as on, compile_ggml(model, rewrites=()) as off:
        assert ("groupnorm native +affine" + (" +silu" if silu else "")) in on.impl_hits
        np.testing.assert_allclose(on.run(feeds)["y"], off.run(feeds)["y"], rtol=1e-4, atol=1e-5)
    check(model, feeds)


def gelu_model(variant: int):
    inits = {"sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [mk("Div", ["x", "sqrt2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["a"])]
    if variant == 0:  # torch: (x * (1 + erf)) * 0.5
        nodes += [mk("Mul", ["x", "a"], ["m"]), mk("Mul", ["m", "half"], ["y"])]
    else:  # x * ((1 + erf) * 0.5)
        nodes += [mk("Mul", ["a", "half"], ["m"]), mk("Mul", ["x", "m"], ["y"])]
    return make_model(nodes, {"x": ((3, 40), F)}, {"y": (None, F)}, inits), {"x": rand(3, 40) * 3}


@pytest.mark.parametrize("impl", ["native", "ggml"])
@pytest.mark.parametrize("variant", [0, 1])
def test_gelu_erf_pattern(variant, impl):
    model, feeds = gelu_model(variant)
    with compile_ggml(model, gelu=impl) as s:
        assert s.rewrite_hits.get("gelu") == 1
        assert s.impl_hits.get(f"gelu {impl}") == 1
    check(model, feeds, gelu=impl)


def test_silu_pattern():
    model = make_model([mk("Sigmoid", ["x"], ["s"]), mk("Mul", ["x", "s"], ["y"])], {"x": ((2, 4, 6, 6), F)},
                       {"y": (None, F)})
    feeds = {"x": rand(2, 4, 6, 6) * 4}
    on, off, hits, hits_off = _both(model, feeds)
    assert hits.get("silu") == 1 and not hits_off
    np.testing.assert_allclose(on["y"], off["y"], rtol=1e-5, atol=1e-6)
    check(model, feeds)


def test_quick_gelu_pattern_becomes_scaled_silu():
    model = make_model([mk("Mul", ["x", "c"], ["xc"]), mk("Sigmoid", ["xc"], ["s"]), mk("Mul", ["x", "s"], ["y"])],
                       {"x": ((3, 77), F)}, {"y": (None, F)}, {"c": np.array(1.702, np.float32)})
    feeds = {"x": rand(3, 77) * 4}
    on, off, hits, _ = _both(model, feeds)
    assert hits.get("silu") == 1
    np.testing.assert_allclose(on["y"], off["y"], rtol=1e-5, atol=1e-6)
    check(model, feeds)


def test_intermediate_used_elsewhere_stays_correct():
    """The sigmoid output is also a graph output: the fused op must not change it."""
    model = make_model([mk("Sigmoid", ["x"], ["s"]), mk("Mul", ["x", "s"], ["y"])], {"x": ((3, 9), F)},
                       {"y": (None, F), "s": (None, F)})
    check(model, {"x": rand(3, 9)})


def geglu_model(split: str):
    """diffusers' GEGLU as torch exports it: proj(x).chunk(2, -1) -> hidden * gelu(gate)."""
    inits = {"w": rand(24, 40) * 0.3, "b": rand(40, seed=1), "sqrt2": np.array(np.sqrt(2.0), np.float32),
             "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [mk("MatMul", ["x", "w"], ["p0"]), mk("Add", ["p0", "b"], ["p"])]
    if split == "split":
        nodes.append(mk("Split", ["p"], ["h", "g"], axis=-1, num_outputs=2))
    else:
        inits.update({"s0": np.array([0], np.int64), "s1": np.array([20], np.int64),
                      "s2": np.array([40], np.int64), "ax": np.array([-1], np.int64)})
        nodes += [mk("Slice", ["p", "s0", "s1", "ax"], ["h"]), mk("Slice", ["p", "s1", "s2", "ax"], ["g"])]
    nodes += [mk("Div", ["g", "sqrt2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["a"]),
              mk("Mul", ["g", "a"], ["m"]), mk("Mul", ["m", "half"], ["gelu"]), mk("Mul", ["h", "gelu"], ["y"])]
    model = make_model(nodes, {"x": ((2, 9, 24), F)}, {"y": (None, F)}, inits, opset=18)
    return model, {"x": rand(2, 9, 24) * 2}


@pytest.mark.parametrize("split", ["split", "slice"])
def test_geglu_reads_both_halves_in_place(split):
    model, feeds = geglu_model(split)
    on, off, hits, hits_off = _both(model, feeds)
    assert hits.get("geglu") == 1 and "geglu" not in hits_off
    np.testing.assert_allclose(on["y"], off["y"], rtol=1e-5, atol=1e-6)
    check(model, feeds)
    check(model, feeds, gelu="ggml")


@pytest.mark.parametrize("key", ["attention", "gelu", "groupnorm"])
def test_kernel_options_are_checked(key):
    from sdrt.errors import SdrtError

    model, _ = gelu_model(0)
    with pytest.raises(SdrtError, match=f"{key}='flash' is not a choice"):
        compile_ggml(model, **{key: "flash"})


def nan_guard_model(hide_a_row: bool):
    """Softmax(x + mask) read through torch's SDPA NaN guard, Where(IsNaN(S), 0, S), then @ v."""
    n, m = 5, 6
    mask = np.triu(np.full((n, m), -np.inf, np.float32), 1)
    if hide_a_row:
        mask[2] = -np.inf  # row 2 is hidden entirely: its softmax is NaN and the guard zeroes it
    nodes = [mk("Add", ["x", "mask"], ["xm"]), mk("Softmax", ["xm"], ["s"], axis=-1), mk("IsNaN", ["s"], ["nan"]),
             mk("Where", ["nan", "zero", "s"], ["p"]), mk("MatMul", ["p", "v"], ["y"])]
    inits = {"mask": mask, "zero": np.array(0.0, np.float32)}
    model = make_model(nodes, {"x": ((2, n, m), F), "v": ((2, m, 4), F)}, {"y": (None, F)}, inits)
    return model, {"x": rand(2, n, m), "v": rand(2, m, 4, seed=1)}


def test_nan_guard_that_cannot_fire_is_dropped():
    model, feeds = nan_guard_model(hide_a_row=False)
    check(model, feeds)  # against onnxruntime
    with compile_ggml(model) as session:
        assert session.rewrite_hits.get("nan_guard", 0) + session.rewrite_hits.get("attention", 0) >= 1


def test_nan_guard_on_a_hidden_row_is_refused():
    from sdrt.errors import UnsupportedGraph

    model, _ = nan_guard_model(hide_a_row=True)
    with pytest.raises(UnsupportedGraph, match="IsNaN"):
        compile_ggml(model).__enter__()
