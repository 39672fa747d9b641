"""LoRA merge/unmerge against plain numpy: linear, conv 1x1 and kxk, kohya and PEFT, several at once."""

from __future__ import annotations

from pathlib import Path

import gw_models as M
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdrt
from sdrt.errors import WeightsError
from sdrt.graph import Graph
from sdrt.lora import Lora, merge
from sdrt.weights import Weights, stfile

R = np.random.default_rng(11)
PROJ = "down_blocks.0.attentions.0.proj_in"
TOQ = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"
CONV = "down_blocks.0.resnets.0.conv1"


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def base_weights() -> dict[str, np.ndarray]:
    return {f"{PROJ}.weight": f32(16, 8), f"{TOQ}.weight": f32(8, 8), f"{CONV}.weight": f32(6, 4, 3, 3),
            f"{PROJ}.bias": f32(16)}


def expected(w: np.ndarray, terms) -> np.ndarray:
    """W + sum scale*(alpha/rank)*(up@down), the plain numpy way (float64, then back)."""
    acc = w.astype(np.float64)
    for up, down, alpha, scale in terms:
        r = down.shape[0]
        d = up.reshape(up.shape[0], r).astype(np.float64) @ down.reshape(r, -1).astype(np.float64)
        acc += scale * (alpha / r) * d.reshape(acc.shape if d.size == acc.size else d.shape)
    return acc.astype(w.dtype)


def kohya(module: str, down, up, alpha) -> dict[str, np.ndarray]:
    k = "lora_unet_" + module.replace(".", "_")
    return {f"{k}.lora_down.weight": down, f"{k}.lora_up.weight": up, f"{k}.alpha": np.array(alpha, np.float32)}


def test_kohya_linear_and_conv_kxk_match_numpy_and_unmerge_is_exact(tmp_path):
    base = Weights.from_arrays(base_weights())
    d1, u1 = f32(4, 8), f32(16, 4)
    d2, u2 = f32(2, 4, 3, 3), f32(6, 2, 1, 1)
    p = tmp_path / "l.safetensors"
    stfile.write(p, {**kohya(PROJ, d1, u1, 2.0), **kohya(CONV, d2, u2, 1.0)})
    lora = Lora.open(p)
    assert lora.format == "kohya" and {la.rank for la in lora.layers.values()} == {2, 4}
    merged = merge(base, [(lora, 0.7)])
    np.testing.assert_allclose(merged[f"{PROJ}.weight"], expected(base[f"{PROJ}.weight"], [(u1, d1, 2.0, 0.7)]),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(merged[f"{CONV}.weight"], expected(base[f"{CONV}.weight"], [(u2, d2, 1.0, 0.7)]),
                               rtol=1e-6, atol=1e-6)
    assert merged[f"{TOQ}.weight"] is base[f"{TOQ}.weight"]  # untouched tensors are not copied
    assert sorted(merged.report.applied) == sorted([f"{CONV}.weight", f"{PROJ}.weight"])
    restored = merged.unmerge()
    for k in base:
        assert restored[k].tobytes() == base[k].tobytes()


def test_a_merge_that_keeps_no_originals_merges_the_same_and_refuses_to_unmerge(tmp_path):
    """keep_originals=False (a pipeline's merge: it binds its base weights again itself) copies no weight as it was:
    those copies doubled the merge's memory (a rank-16 LoRA bound on a live full-size SD 1.5 pipeline: 5.97 GB peak
    with them, 4.69 GB without)."""
    base = Weights.from_arrays(base_weights())
    d1, u1 = f32(4, 8), f32(16, 4)
    p = tmp_path / "l.safetensors"
    stfile.write(p, kohya(PROJ, d1, u1, 2.0))
    lora = Lora.open(p)
    kept, lean = merge(base, [(lora, 0.7)]), merge(base, [(lora, 0.7)], keep_originals=False)
    assert lean.merged_names == kept.merged_names == (f"{PROJ}.weight",) and not lean.originals
    for k in base:
        assert lean[k].tobytes() == kept[k].tobytes()
    with pytest.raises(WeightsError, match="kept no originals to unmerge"):
        lean.unmerge()


def test_conv_1x1_and_linear_lora_on_conv_weight():
    w = {f"{PROJ}.weight": f32(16, 8, 1, 1)}  # SD1.5 proj_in is a 1x1 conv
    d, u = f32(4, 8), f32(16, 4)  # LoRA trained on the linear view
    merged = merge(Weights.from_arrays(w), Lora.from_arrays(kohya(PROJ, d, u, 4.0)))
    want = expected(w[f"{PROJ}.weight"].reshape(16, 8), [(u, d, 4.0, 1.0)]).reshape(16, 8, 1, 1)
    np.testing.assert_allclose(merged[f"{PROJ}.weight"], want, rtol=1e-6, atol=1e-6)
    d4, u4 = f32(4, 8, 1, 1), f32(16, 4, 1, 1)  # LoCon 1x1
    merged4 = merge(Weights.from_arrays(w), Lora.from_arrays(kohya(PROJ, d4, u4, 4.0)))
    np.testing.assert_allclose(merged4[f"{PROJ}.weight"], expected(w[f"{PROJ}.weight"], [(u4, d4, 4.0, 1.0)]),
                               rtol=1e-6, atol=1e-6)


def test_peft_format_and_several_loras_with_own_scales():
    base = Weights.from_arrays(base_weights())
    a1, b1 = f32(4, 8), f32(8, 4)
    peft = Lora.from_arrays({f"unet.{TOQ}.lora_A.weight": a1, f"unet.{TOQ}.lora_B.weight": b1})
    assert peft.format == "peft" and peft.layers[f"unet.{TOQ}"].alpha == 4.0  # alpha defaults to rank
    d2, u2 = f32(2, 8), f32(8, 2)
    k = Lora.from_arrays(kohya(TOQ, d2, u2, 1.0))
    merged = merge(base, [(peft, 0.5), (k, -1.25)])
    want = expected(base[f"{TOQ}.weight"], [(b1, a1, 4.0, 0.5), (u2, d2, 1.0, -1.25)])
    np.testing.assert_allclose(merged[f"{TOQ}.weight"], want, rtol=1e-6, atol=1e-6)
    assert merged.report.applied[f"{TOQ}.weight"] == [f"unet.{TOQ}", "lora_unet_" + TOQ.replace(".", "_")]
    assert merged.unmerge()[f"{TOQ}.weight"].tobytes() == base[f"{TOQ}.weight"].tobytes()


def test_peft_alpha_default_can_be_given(tmp_path):
    a, b = f32(4, 8), f32(8, 4)
    p = tmp_path / "adapter_model.safetensors"
    stfile.write(p, {f"base_model.model.{TOQ}.lora_A.weight": a, f"base_model.model.{TOQ}.lora_B.weight": b})
    lora = Lora.open(p, alpha=8.0)
    base = base_weights()
    merged = merge(Weights.from_arrays(base), lora)
    np.testing.assert_allclose(merged[f"{TOQ}.weight"], expected(base[f"{TOQ}.weight"], [(b, a, 8.0, 1.0)]),
                               rtol=1e-6, atol=1e-6)


def test_half_and_bf16_weights_stay_in_their_dtype():
    for dt in (np.float16, ml_dtypes.bfloat16):
        w = {f"{PROJ}.weight": f32(16, 8).astype(dt)}
        d, u = f32(4, 8), f32(16, 4)
        merged = merge(Weights.from_arrays(w), Lora.from_arrays(kohya(PROJ, d, u, 4.0)))
        got = merged[f"{PROJ}.weight"]
        assert got.dtype == np.dtype(dt)
        want = (w[f"{PROJ}.weight"].astype(np.float32) + (u @ d)).astype(dt)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
        assert merged.unmerge()[f"{PROJ}.weight"].tobytes() == w[f"{PROJ}.weight"].tobytes()


def test_unmatched_keys_are_reported_all_at_once():
    lora = Lora.from_arrays({**kohya("up_blocks.9.nothing", f32(2, 8), f32(8, 2), 1.0),
                             **kohya(PROJ, f32(2, 8), f32(16, 2), 1.0),
                             **kohya("mid_block.missing", f32(2, 8), f32(8, 2), 1.0)})
    base = Weights.from_arrays(base_weights())
    with pytest.raises(WeightsError) as e:
        merge(base, lora)
    assert "2 match no weight" in str(e.value)
    assert "lora_unet_up_blocks_9_nothing" in str(e.value) and "lora_unet_mid_block_missing" in str(e.value)
    merged = merge(base, lora, strict=False)
    assert len(merged.report.unmatched) == 2 and list(merged.report.applied) == [f"{PROJ}.weight"]


def test_shape_mismatch_is_reported():
    lora = Lora.from_arrays(kohya(PROJ, f32(2, 5), f32(16, 2), 1.0))
    with pytest.raises(WeightsError, match="do not fit"):
        merge(Weights.from_arrays(base_weights()), lora)


def test_non_finite_lora_is_reported():
    d = f32(2, 8)
    d[0, 0] = np.nan
    with pytest.raises(WeightsError, match="NaN/Inf"):
        merge(Weights.from_arrays(base_weights()), Lora.from_arrays(kohya(PROJ, d, f32(16, 2), 1.0)))


def test_component_filter_skips_text_encoder_keys():
    lora = Lora.from_arrays({**kohya(PROJ, f32(2, 8), f32(16, 2), 1.0),
                             "lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": f32(2, 4),
                             "lora_te_text_model_encoder_layers_0_mlp_fc1.lora_up.weight": f32(4, 2)})
    with pytest.raises(WeightsError, match="1 match no weight"):
        merge(Weights.from_arrays(base_weights()), lora)
    merged = merge(Weights.from_arrays(base_weights()), lora, component="unet")
    assert merged.report.skipped == ["lora_te_text_model_encoder_layers_0_mlp_fc1"]


@pytest.mark.parametrize(("keys", "match"), [
    ({"x.hada_w1_a": np.zeros((2, 2))}, "LyCORIS"),
    ({"lora_unet_a.lora_down.weight": np.zeros((2, 4))}, "needs both down and up"),
    ({"lora_unet_a.lora_down.weight": np.zeros((2, 4)), "lora_unet_a.lora_up.weight": np.zeros((4, 3))},
     "do not make a LoRA pair"),
    ({"lora_unet_a.lora_down.weight": np.zeros((2, 4)), "lora_unet_a.lora_up.weight": np.zeros((4, 2)),
      "lora_unet_a.alpha": np.zeros(3)}, "one finite number"),
    ({"lora_unet_a.lora_down.weight": np.zeros((2, 4)), "lora_unet_a.lora_up.weight": np.zeros((4, 2)),
      "lora_unet_a.alpha": np.array(np.inf)}, "one finite number"),
    ({}, "no LoRA layers"),
])
def test_bad_lora_files(keys, match):
    with pytest.raises(WeightsError, match=match):
        Lora.from_arrays(keys)


def test_a_torch_lora_reads_as_its_safetensors():
    """tinylora.pt: the kohya LoRA of tests/data/ckpt/pipe-sd15 as torch.save wrote it (scripts/gen_torch_fixtures.py)."""
    data = Path(__file__).resolve().parent.parent / "data"
    pt, st = Lora.open(data / "torch" / "pipe-sd15" / "tinylora.pt"), Lora.open(data / "ckpt" / "pipe-sd15" /
                                                                                 "tinylora.safetensors")
    assert pt.format == st.format == "kohya" and list(pt.layers) == list(st.layers)
    for name, layer in st.layers.items():
        other = pt.layers[name]
        assert other.alpha == layer.alpha
        assert np.array_equal(other.down, layer.down) and np.array_equal(other.up, layer.up)


def test_a_lora_pickle_that_is_no_checkpoint_is_refused(tmp_path):
    p = tmp_path / "lora.pt"
    p.write_bytes(b"\x80\x04.")
    with pytest.raises(WeightsError, match="not a readable PyTorch checkpoint"):
        Lora.open(p)


def _square_matmul_graph() -> Graph:
    """x[2, 8] -> MatMul with an anonymous square [8, 8] weight, as torch exports Linear(8, 8, bias=False)."""
    wt = f32(8, 8)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "onnx::MatMul_3"], ["y"], name=f"/{TOQ.replace('.', '/')}/MatMul")],
        "sq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [numpy_helper.from_array(wt, "onnx::MatMul_3")])
    return Graph.load(helper.make_model(g, opset_imports=M.OPSET, ir_version=M.IR).SerializeToString())


def test_anonymous_transposed_matmul_found_through_node_name(registry):
    """The torch-layout delta [out, in] is transposed into the MatMul's [in, out] weight, even when square."""
    graph = _square_matmul_graph()
    d, u = f32(4, 8), f32(8, 4)
    lora = Lora.from_arrays(kohya(TOQ, d, u, 2.0))
    merged = merge(graph, [(lora, 0.8)])
    assert merged.report.applied == {"onnx::MatMul_3": ["lora_unet_" + TOQ.replace(".", "_")]}
    x = f32(2, 8)
    wt = graph.initializer_arrays()["onnx::MatMul_3"]
    w_torch = wt.T.astype(np.float64) + 0.8 * (2.0 / 4) * (u.astype(np.float64) @ d)  # torch Linear: y = x @ W.T
    with sdrt.load(graph, backend="reference") as s:
        before = s.run({"x": x})["y"]
        s.update_weights(merged)
        np.testing.assert_allclose(s.run({"x": x})["y"], x.astype(np.float64) @ w_torch.T, rtol=1e-5, atol=1e-5)
        s.update_weights(merged.unmerge())
        assert s.run({"x": x})["y"].tobytes() == before.tobytes()


def test_without_graph_square_matmul_weight_is_taken_as_torch_layout():
    graph = _square_matmul_graph()
    d, u = f32(4, 8), f32(8, 4)
    lora = Lora.from_arrays(kohya(TOQ, d, u, 4.0))
    merged = merge(Weights.from_graph(graph), lora, targets={"lora_unet_" + TOQ.replace(".", "_"): "onnx::MatMul_3"})
    wt = graph.initializer_arrays()["onnx::MatMul_3"]
    np.testing.assert_allclose(merged["onnx::MatMul_3"], wt + u @ d, rtol=1e-6, atol=1e-6)


def test_explicit_target_and_non_square_transpose_by_shape(registry):
    """linear_model: fc2 is MatMul with anonymous [16, 4] weight; the LoRA for Linear(16 -> 4) is [4, 16]."""
    graph = Graph.load(M.linear_model().SerializeToString())
    d, u = f32(2, 16), f32(4, 2)
    lora = Lora.from_arrays(kohya("head.out", d, u, 2.0))
    key = "lora_unet_head_out"
    merged = merge(Weights.from_graph(graph), lora, targets={key: "onnx::MatMul_7"})  # no graph: shape decides
    wt = graph.initializer_arrays()["onnx::MatMul_7"]
    np.testing.assert_allclose(merged["onnx::MatMul_7"], wt + (u @ d).T, rtol=1e-6, atol=1e-6)
    # the node-name route finds it too: /fc2/MatMul -> module fc2
    merged2 = merge(graph, Lora.from_arrays(kohya("fc2", d, u, 2.0)))
    assert merged2["onnx::MatMul_7"].tobytes() == merged["onnx::MatMul_7"].tobytes()
    # Gemm(transB=1) keeps torch layout: fc1.weight [16, 8]
    d1, u1 = f32(2, 8), f32(16, 2)
    merged3 = merge(graph, Lora.from_arrays(kohya("fc1", d1, u1, 2.0)))
    np.testing.assert_allclose(merged3["fc1.weight"], graph.initializer_arrays()["fc1.weight"] + u1 @ d1,
                               rtol=1e-6, atol=1e-6)


def test_merged_weights_on_a_real_conv_graph_session(registry):
    graph = Graph.load(M.conv_model().SerializeToString())
    d, u = f32(2, 3, 3, 3), f32(8, 2, 1, 1)
    d1, u1 = f32(2, 8), f32(8, 2)
    lora = Lora.from_arrays({**kohya("conv_in", d, u, 1.0), **kohya("proj_in", d1, u1, 2.0)})
    merged = merge(graph, [(lora, 1.0)])
    x = f32(1, 3, 5, 5)
    ref = M.conv_model()
    new = {t.name: merged[t.name] for t in ref.graph.initializer}
    for t in ref.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(np.asarray(new[t.name]), t.name))
    with sdrt.load(graph, backend="reference") as s:
        base_y = s.run({"x": x})["y"]
        s.update_weights(merged)
        np.testing.assert_array_equal(s.run({"x": x})["y"], M.run_reference(ref, {"x": x})["y"])
        s.update_weights(merged.unmerge())
        assert s.run({"x": x})["y"].tobytes() == base_y.tobytes()
    assert onnx.numpy_helper.to_array(ref.graph.initializer[0]).shape == (8, 3, 3, 3)


def test_text_encoder_kohya_and_peft_adapter_names():
    q = "text_model.encoder.layers.0.self_attn.q_proj"
    fc = "text_model.encoder.layers.0.mlp.fc1"
    base = Weights.from_arrays({f"{q}.weight": f32(8, 8), f"{fc}.weight": f32(16, 8)})
    d, u = f32(2, 8), f32(8, 2)
    kohya_te = {"lora_te1_" + q.replace(".", "_") + ".lora_down.weight": d,
                "lora_te1_" + q.replace(".", "_") + ".lora_up.weight": u}
    peft = {f"text_encoder.{fc}.lora_A.default.weight": f32(2, 8), f"text_encoder.{fc}.lora_B.default.weight": f32(16, 2)}
    lora = Lora.from_arrays({**kohya_te, **peft})
    merged = merge(base, lora, component="te")
    assert sorted(merged.report.applied) == [f"{fc}.weight", f"{q}.weight"]
    np.testing.assert_allclose(merged[f"{q}.weight"], expected(base[f"{q}.weight"], [(u, d, 2.0, 1.0)]),
                               rtol=1e-6, atol=1e-6)
    # the same kohya keys are skipped, not reported, when merging the UNet
    unet = merge(Weights.from_arrays(base_weights()), Lora.from_arrays(kohya_te), component="unet")
    assert unet.report.skipped and not unet.report.applied
