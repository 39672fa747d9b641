"""sdrt.graph.contrib: each onnxruntime contrib op rewritten into standard ONNX ops computes what onnxruntime's own
kernel computes, on random inputs, in float32 and float16, with the attribute variants onnxruntime's optimizer
and Olive emit.

References: onnxruntime's CPU contrib kernels where it has one (MultiHeadAttention, Attention, the GELUs,
SkipLayerNormalization, FusedMatMul, FusedConv). GroupNorm, SkipGroupNorm, BiasSplitGelu, BiasAdd, NhwcConv and
packed-QKV/KV attention have CUDA kernels only: their references are numpy written from the op's documentation
(onnxruntime's ContribOperators.md) and onnxruntime's standard Conv. The rewritten graph runs on onnxruntime
(standard ops only) and on the ONNX reference evaluator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdrt.graph.contrib import rewrite_contrib

ort = pytest.importorskip("onnxruntime")

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
NP = {F32: np.float32, F16: np.float16}
#: (float32, float16) tolerance on max |a - b| / max(1, max |ref|)
TOL = {F32: 2e-5, F16: 8e-3}


def _model(op: str, inputs: dict[str, np.ndarray | None], outputs: int | list[str] = 1, *, elem: int = F32,
           inits: dict[str, np.ndarray] | None = None, opset: int = 17, domain: str = "com.microsoft",
           **attrs) -> tuple:
    """One contrib node; ``inputs`` in order (None: an omitted optional input); ``inits`` become initializers."""
    inits = inits or {}
    names = [n if v is not None else "" for n, v in inputs.items()]
    outs = [f"y{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
    node = helper.make_node(op, names, outs, name=f"the_{op}", domain=domain, **attrs)
    feeds = {n: v for n, v in inputs.items() if v is not None and n not in inits}
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, elem, None) for o in outs if o],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m, feeds


def _run(model, feeds) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _rewritten(model, feeds) -> list[np.ndarray]:
    """The rewritten model's outputs on onnxruntime and on the ONNX reference evaluator (which agree)."""
    from onnx.reference import ReferenceEvaluator

    r = rewrite_contrib(model)
    assert sum(r.rewritten.values()) == 1 and not r.kept, (r.rewritten, r.kept)
    assert not any(n.domain for n in r.model.graph.node), "a contrib node is left"
    assert [o.domain for o in r.model.opset_import] == [""]
    got = _run(r.model, feeds)
    ref = ReferenceEvaluator(r.model).run(None, feeds)
    for a, b in zip(got, ref):
        _close(a, b, F16 if a.dtype == np.float16 else F32)
    return got


def _close(got: np.ndarray, want: np.ndarray, elem: int) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
    assert err <= TOL[elem], f"max relative difference {err:.2e}"


def _check_against_ort(op: str, inputs, *, elem: int = F32, inits=None, outputs=1, **attrs) -> None:
    """The rewrite against onnxruntime's own kernel: float32 directly; float16 against the float32 kernel on the
    same (float16-rounded) values, as onnxruntime's CPU kernels are float32 only."""
    inputs = {n: (v.astype(NP[elem]) if v is not None and v.dtype == np.float32 else v) for n, v in inputs.items()}
    inits = {n: inputs[n] for n in (inits or ())}
    m, feeds = _model(op, inputs, outputs, elem=elem, inits=inits, **attrs)
    got = _rewritten(m, feeds)
    up = {n: (v.astype(np.float32) if v is not None and v.dtype == np.float16 else v) for n, v in inputs.items()}
    m32, feeds32 = _model(op, up, outputs, inits={n: up[n] for n in inits}, **attrs)
    want = _run(m32, feeds32)
    for g, w in zip(got, want):
        _close(g, w, elem)


rng = np.random.default_rng(0)


def _r(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


ELEMS = pytest.mark.parametrize("elem", [F32, F16], ids=["fp32", "fp16"])


# -- ops with an onnxruntime CPU kernel ----------------------------------------------------------------------
@ELEMS
def test_gelu_family(elem: int) -> None:
    x, b = _r(2, 5, 16), _r(16)
    _check_against_ort("Gelu", {"x": x}, elem=elem)
    _check_against_ort("BiasGelu", {"x": x, "b": b}, elem=elem, inits=["b"])
    _check_against_ort("FastGelu", {"x": x}, elem=elem)
    _check_against_ort("FastGelu", {"x": x, "b": b}, elem=elem, inits=["b"])
    _check_against_ort("QuickGelu", {"x": x}, elem=elem)
    _check_against_ort("QuickGelu", {"x": x}, elem=elem, alpha=1.5)


@ELEMS
@pytest.mark.parametrize("variant", ["plain", "beta", "bias+sum", "opset14"])
def test_skip_layer_normalization(elem: int, variant: str) -> None:
    x, skip, gamma, beta, bias = _r(2, 7, 32), _r(2, 7, 32), _r(32), _r(32), _r(32)
    ins = {"x": x, "skip": skip, "gamma": gamma, "beta": beta if variant != "plain" else None,
           "bias": bias if variant == "bias+sum" else None}
    outs = ["y0", "", "", "y3"] if variant == "bias+sum" else ["y0"]
    _check_against_ort("SkipLayerNormalization", ins, elem=elem, inits=["gamma"] + (["beta"] if variant != "plain"
                       else []), outputs=outs, epsilon=1e-5, opset=14 if variant == "opset14" else 17)


@ELEMS
def test_skip_simplified_layer_normalization(elem: int) -> None:
    x, skip, gamma = _r(2, 7, 32), _r(2, 7, 32), _r(32)
    _check_against_ort("SkipSimplifiedLayerNormalization", {"x": x, "skip": skip, "gamma": gamma}, elem=elem,
                       inits=["gamma"], outputs=["y0", "", "", "y3"], epsilon=1e-6)


@ELEMS
def test_simplified_layer_normalization(elem: int) -> None:
    """onnxruntime registers it in the ONNX domain (no standard op of that name): rewritten there too."""
    x, gamma = _r(2, 7, 32), _r(32)
    _check_against_ort("SimplifiedLayerNormalization", {"x": x, "gamma": gamma}, elem=elem, inits=["gamma"],
                       domain="", epsilon=1e-6, axis=-1)


@pytest.mark.parametrize("variant", ["plain", "alpha+transB", "transA"])
def test_fused_matmul(variant: str) -> None:
    a, b = _r(2, 3, 6, 5), _r(2, 3, 5, 4)
    attrs = {}
    if variant == "alpha+transB":
        b, attrs = np.ascontiguousarray(np.swapaxes(b, -1, -2)), {"alpha": 0.125, "transB": 1}
    if variant == "transA":
        a, attrs = np.ascontiguousarray(np.swapaxes(a, -1, -2)), {"transA": 1}
    _check_against_ort("FusedMatMul", {"a": a, "b": b}, **attrs)


@pytest.mark.parametrize("act", ["", "Relu", "Sigmoid", "LeakyRelu", "Clip", "sum+Relu"])
def test_fused_conv(act: str) -> None:
    x, w, b = _r(1, 4, 9, 9), _r(6, 4, 3, 3), _r(6)
    ins = {"x": x, "w": w, "b": b}
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]}
    if act == "sum+Relu":
        ins["z"], act = _r(1, 6, 9, 9), "Relu"
    if act:
        attrs["activation"] = act
    if act == "LeakyRelu":
        attrs["activation_params"] = [0.2]
    if act == "Clip":
        attrs["activation_params"] = [-0.5, 0.5]
    _check_against_ort("FusedConv", ins, inits=["w", "b"], **attrs)


@pytest.mark.parametrize("variant", ["self", "cross", "bias", "key_padding_mask", "scale"])
def test_multi_head_attention(variant: str) -> None:
    b, s, l_, n, h = 2, 6, 5 if variant != "self" else 6, 2, 4
    q, k, v = _r(b, s, n * h), _r(b, l_, n * h), _r(b, l_, n * h)
    ins = {"q": q, "k": k, "v": v}
    attrs = {"num_heads": n}
    if variant == "bias":
        ins["bias"] = _r(3 * n * h)
    if variant == "key_padding_mask":
        ins["bias"] = None
        mask = np.ones((b, l_), np.int32)
        mask[1, 3:] = 0
        ins["mask"] = mask
    if variant == "scale":
        attrs["scale"] = 0.3
    _check_against_ort("MultiHeadAttention", ins, **attrs)


@pytest.mark.parametrize("variant", ["plain", "unidirectional", "mask", "qkv_hidden_sizes"])
def test_attention(variant: str) -> None:
    b, s, d, n = 2, 5, 8, 2
    x, w, bias = _r(b, s, d), _r(d, 3 * d, scale=0.3), _r(3 * d)
    ins = {"x": x, "w": w, "bias": bias}
    attrs = {"num_heads": n}
    if variant == "unidirectional":
        attrs["unidirectional"] = 1
    if variant == "mask":
        mask = np.ones((b, s), np.int32)
        mask[0, 3:] = 0
        ins["mask"] = mask
    if variant == "qkv_hidden_sizes":
        w, bias = _r(d, 2 * d + 4, scale=0.3), _r(2 * d + 4)
        ins.update(w=w, bias=bias)
        attrs["qkv_hidden_sizes"] = [d, d, 4]
    _check_against_ort("Attention", ins, inits=["w", "bias"], **attrs)


# -- CUDA-only ops: numpy references -------------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


def _group_norm_ref(x: np.ndarray, gamma, beta, groups: int, eps: float, silu: bool, last: bool) -> np.ndarray:
    x = x.astype(np.float64)
    if last:
        x = x.transpose(0, 3, 1, 2)
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    y = y * gamma.reshape(-1, 1, 1) + beta.reshape(-1, 1, 1)
    if silu:
        y = y / (1 + np.exp(-y))
    return y.transpose(0, 2, 3, 1) if last else y


def _check_rewrite(op: str, inputs, want: list[np.ndarray], *, elem: int, inits=(), outputs=1, **attrs) -> None:
    inputs = {n: (v.astype(NP[elem]) if v is not None and v.dtype == np.float32 else v) for n, v in inputs.items()}
    m, feeds = _model(op, inputs, outputs, elem=elem, inits={n: inputs[n] for n in inits}, **attrs)
    for g, w in zip(_rewritten(m, feeds), want):
        _close(g, w, elem)


@ELEMS
@pytest.mark.parametrize("variant", ["channels_last", "channels_last+silu", "channels_first", "fp32_gamma"])
def test_group_norm(elem: int, variant: str) -> None:
    last = int(variant.startswith("channels_last") or variant == "fp32_gamma")
    silu = variant.endswith("silu")
    x = _r(2, 6, 5, 8) if last else _r(2, 8, 6, 5)
    gamma, beta = _r(8), _r(8)
    want = _group_norm_ref(x.astype(NP[elem]), gamma, beta, 4, 1e-5, silu, bool(last))
    ins = {"x": x, "gamma": gamma, "beta": beta}
    if variant == "fp32_gamma" and elem == F16:  # onnxruntime's fp16 conversion keeps GroupNorm's gamma/beta fp32
        m, feeds = _model("GroupNorm", {"x": x.astype(np.float16), "gamma": gamma, "beta": beta}, elem=F16,
                          inits={"gamma": gamma, "beta": beta}, groups=4, epsilon=1e-5, activation=0,
                          channels_last=1)
        _close(_rewritten(m, feeds)[0], want, F16)
        return
    _check_rewrite("GroupNorm", ins, [want], elem=elem, inits=["gamma", "beta"], groups=4, epsilon=1e-5,
                   activation=int(silu), channels_last=last)


@ELEMS
@pytest.mark.parametrize("variant", ["bias+sum", "broadcast_skip"])
def test_skip_group_norm(elem: int, variant: str) -> None:
    x, gamma, beta, bias = _r(2, 6, 5, 8), _r(8), _r(8), _r(8)
    skip = _r(2, 6, 5, 8) if variant == "bias+sum" else _r(2, 1, 1, 8)
    x16 = {k: v.astype(NP[elem]) for k, v in dict(x=x, skip=skip, bias=bias).items()}
    s = x16["x"].astype(np.float64) + x16["skip"] + (x16["bias"] if variant == "bias+sum" else 0)
    want = [_group_norm_ref(s, gamma, beta, 2, 1e-5, True, True), s]
    ins = {"x": x, "gamma": gamma, "beta": beta, "skip": skip, "bias": bias if variant == "bias+sum" else None}
    _check_rewrite("SkipGroupNorm", ins, want, elem=elem, inits=["gamma", "beta"], outputs=2, groups=2,
                   epsilon=1e-5, activation=1, channels_last=1)


@ELEMS
def test_bias_split_gelu_and_bias_add(elem: int) -> None:
    x, bias, skip = _r(2, 9, 16), _r(16), _r(2, 9, 8)
    xs = (x.astype(NP[elem]).astype(np.float64) + bias.astype(NP[elem]))
    left, right = xs[..., :8], xs[..., 8:]
    _check_rewrite("BiasSplitGelu", {"x": x, "bias": bias}, [left * 0.5 * right * (1 + _erf(right / math.sqrt(2)))],
                   elem=elem, inits=["bias"])
    x8 = _r(2, 9, 8)
    want = x8.astype(NP[elem]).astype(np.float64) + bias[:8].astype(NP[elem]) + skip.astype(NP[elem])
    _check_rewrite("BiasAdd", {"x": x8, "bias": bias[:8], "skip": skip}, [want], elem=elem, inits=["bias"])


@ELEMS
@pytest.mark.parametrize("variant", ["3x3", "stride2+bias"])
def test_nhwc_conv(elem: int, variant: str) -> None:
    x, w, b = _r(1, 9, 9, 4), _r(6, 4, 3, 3), _r(6)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1] if variant == "3x3" else [2, 2]}
    ins = {"x": x, "w": w} | ({"b": b} if variant != "3x3" else {})
    ref_ins = {k: v.astype(NP[elem]).astype(np.float32) for k, v in ins.items()}
    ref_ins["x"] = np.ascontiguousarray(ref_ins["x"].transpose(0, 3, 1, 2))
    m, feeds = _model("Conv", ref_ins, inits={k: v for k, v in ref_ins.items() if k != "x"}, domain="", **attrs)
    want = _run(m, feeds)[0].transpose(0, 2, 3, 1)
    ins["w"] = np.ascontiguousarray(w.transpose(0, 2, 3, 1))  # NhwcConv's weight is (M, kH, kW, C)
    _check_rewrite("NhwcConv", ins, [want], elem=elem, inits=[k for k in ins if k != "x"], **attrs)


def _attention_ref(q, k, v, heads: int, scale: float | None = None) -> np.ndarray:
    b, s, d = q.shape
    h = d // heads
    qh, kh, vh = (t.astype(np.float64).reshape(b, -1, heads, t.shape[-1] // heads).transpose(0, 2, 1, 3)
                  for t in (q, k, v))
    p = qh @ kh.transpose(0, 1, 3, 2) * (scale or 1 / math.sqrt(h))
    p = np.exp(p - p.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ vh
    return y.transpose(0, 2, 1, 3).reshape(b, s, -1)


@ELEMS
@pytest.mark.parametrize("packed", ["qkv", "kv"])
def test_multi_head_attention_packed(elem: int, packed: str) -> None:
    b, s, l_, n, h = 2, 6, 4, 2, 4
    q, k, v = (x.astype(NP[elem]) for x in (_r(b, s, n * h), _r(b, l_ if packed == "kv" else s, n * h),
                                           _r(b, l_ if packed == "kv" else s, n * h)))
    want = _attention_ref(q, k, v, n)
    if packed == "qkv":  # (B, S, N, 3, H)
        qkv = np.stack([t.reshape(b, s, n, h) for t in (q, k, v)], axis=3)
        ins = {"qkv": qkv, "k": None, "v": None}
    else:  # query (B, S, D), key (B, L, N, 2, H)
        ins = {"q": q, "kv": np.stack([t.reshape(b, l_, n, h) for t in (k, v)], axis=3), "v": None}
    _check_rewrite("MultiHeadAttention", ins, [want], elem=elem, num_heads=n)


# -- the pass itself ------------------------------------------------------------------------------------------
def test_kept_ops_and_unhandled_nodes_stay() -> None:
    """``keep`` leaves the named ops; a node with inputs the rewrite does not handle (a past key cache) stays, named."""
    x = _r(2, 5, 8)
    m, _ = _model("Gelu", {"x": x})
    assert rewrite_contrib(m, keep={"com.microsoft.Gelu"}).model is m
    q = _r(2, 3, 8)
    m, _ = _model("MultiHeadAttention", {"q": q, "k": q, "v": q, "bias": None, "mask": None, "ab": None,
                                         "past_k": _r(2, 2, 3, 4), "past_v": _r(2, 2, 3, 4)}, num_heads=2)
    r = rewrite_contrib(m)
    assert r.rewritten == {} and r.kept == {"com.microsoft.MultiHeadAttention": ["the_MultiHeadAttention"]}


@pytest.mark.parametrize(("op", "attrs", "said"), [
    ("MultiHeadAttention", {"num_heads": 0}, "has num_heads=0; it must be a whole number of 1 or more"),
    ("MultiHeadAttention", {}, "has no num_heads attribute"),
    ("Attention", {"num_heads": -2}, "has num_heads=-2"),
    ("GroupNorm", {"groups": 0, "activation": 0}, "has groups=0"),
    ("QuickGelu", {"alpha": "x"}, r"has an attribute or input onnxruntime's schema does not allow \(ValueError"),
])
def test_a_node_with_attributes_its_schema_forbids_is_a_model_error(op: str, attrs: dict, said: str) -> None:
    """num_heads=0 was rewritten into a Reshape to (B, S, 0, -1), which keeps the width: attention over one head,
    a different image (32 levels on tiny-sd15-ort); a missing num_heads left the node to the backend (OpenVINO:
    "com.microsoft.MultiHeadAttention: Summary:"), and a string alpha was a traceback. Each names the node now."""
    from sdrt.errors import ModelError

    x = _r(2, 3, 8)
    inputs = {"MultiHeadAttention": {"q": x, "k": x, "v": x}, "Attention": {"x": x, "w": _r(8, 24)},
              "GroupNorm": {"x": _r(1, 4, 4, 8), "gamma": _r(8), "beta": _r(8)}, "QuickGelu": {"x": x}}[op]
    m, _ = _model(op, inputs, **attrs)
    with pytest.raises(ModelError, match=f"the com.microsoft.{op} node 'the_{op}' {said}") as err:
        rewrite_contrib(m, where="unet/model.onnx")
    assert err.value.where == "unet/model.onnx" and "re-export" in str(err.value)


def test_rotary_attention_is_refused_not_left_to_the_backend() -> None:
    """Attention with do_rotary=1 was left as it is for the backend to refuse; OpenVINO converts it and drops the
    rotation (the image equalled do_rotary=0's). It is a ModelError naming the node now."""
    from sdrt.errors import ModelError

    m, _ = _model("Attention", {"x": _r(2, 3, 8), "w": _r(8, 24)}, num_heads=2, do_rotary=1)
    with pytest.raises(ModelError, match="the com.microsoft.Attention node 'the_Attention' has do_rotary=1") as err:
        rewrite_contrib(m, where="unet/model.onnx")
    assert "before onnxruntime's optimizer" in err.value.fix and "\n" not in str(err.value)


def test_opset_is_kept() -> None:
    """The rewrite uses the graph's opset: at 13 no LayerNormalization (opset 17), ReduceMean with axes attribute."""
    x, skip, gamma = _r(2, 3, 8), _r(2, 3, 8), _r(8)
    m, feeds = _model("SkipLayerNormalization", {"x": x, "skip": skip, "gamma": gamma}, inits={"gamma": gamma},
                      opset=13)
    r = rewrite_contrib(m)
    assert {o.domain: o.version for o in r.model.opset_import} == {"": 13}
    assert "LayerNormalization" not in {n.op_type for n in r.model.graph.node}
    _close(_run(r.model, feeds)[0], _run(m, feeds)[0], F32)


def test_the_cost_model_costs_an_optimized_unet_as_the_unoptimized_one() -> None:
    """``sdrt plan`` costs contrib ops as the standard ops they become: the ORT-optimized tiny UNet (NhwcConv,
    GroupNorm, attention...) has the unoptimized one's FLOPs within 2% (before: 1.29e6 of 7.94e6, 102 heavy nodes
    uncosted), and its float16 copy (Resize scales in float16, which ONNX shape inference refuses) is costed too."""
    from pathlib import Path

    from sdrt.cost.nodes import graph_costs
    from sdrt.graph import Graph

    data = Path(__file__).resolve().parents[1] / "data" / "pipelines"
    shapes = {"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)}
    flops = {}
    for folder in ("tiny-sd15", "tiny-sd15-ort", "tiny-sd15-ort-fp16"):
        c = graph_costs(Graph.load(data / folder / "unet" / "model.onnx"), shapes)
        assert not c.unknown_ops and not c.uncosted_heavy, (folder, c.unknown_ops)
        flops[folder] = sum(n.flops for n in c.nodes)
    for folder in ("tiny-sd15-ort", "tiny-sd15-ort-fp16"):
        assert abs(flops[folder] / flops["tiny-sd15"] - 1) < 0.02, flops


def test_nhwc_transposes_cancel() -> None:
    """The ORT-optimized tiny VAE decoder runs channels-last (NhwcConv, GroupNorm, SkipGroupNorm, with float->float
    Casts between them): once rewritten, 9 Transposes of activations are left (the unoptimized export has 7; 84
    without the cancelling), besides the constant ones of the conv weights."""
    from pathlib import Path

    import onnx

    path = Path(__file__).resolve().parents[1] / "data" / "pipelines" / "tiny-sd15-ort" / "vae_decoder" / "model.onnx"
    model = onnx.load(str(path))
    r = rewrite_contrib(model)
    inits = {t.name for t in r.model.graph.initializer}
    runtime = [n for n in r.model.graph.node if n.op_type == "Transpose" and n.input[0] not in inits]
    assert len(runtime) <= 9, len(runtime)
