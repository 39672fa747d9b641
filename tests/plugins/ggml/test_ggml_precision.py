"""sdrt-ggml at precision="bf16" / "fp16": the weights of MatMul, Gemm and dense convs stored in ggml's half
types (sdrt_ggml/half.py), everything else float32.

The reference is onnxruntime in float32 on the same graph with those weights rounded to bf16/fp16 in numpy
(ml_dtypes' casts, not sdrt's): the same rounding, float32 compute. ggml also rounds each activation row to
the weight's type before its dot products (its ``vec_dot_type``), so:

- where the graph input is the matmul's input, the feeds are rounded too: both sides then multiply the
  same numbers and differ only by the order of float32 accumulation (ggml's dot products against MLAS), a
  few float32 ulps of the sum of |terms|; the bound used is 1e-5 of sum(|w| |x|) per output;
- where an activation computed inside the graph feeds a half matmul, ggml rounds it and the reference does
  not: each product then moves by at most the unit roundoff u of the half type (2^-9 for bf16, 2^-12 for
  fp16, round to nearest), so |error| <= u * sum(|w| |x|) plus the float32 term; the tests hold 2u.

ggml's CPU code has a bf16 dot product for AVX-512-BF16 (``vdpbf16ps``), AVX-512F, AVX2/AVX and plain C,
and an fp16 one through F16C (or plain C) (ggml-cpu's ``ggml_vec_dot_bf16``/``ggml_vec_dot_f16``): all of
them compute the products of the rounded values exactly in float32 and accumulate in float32, so these bounds
hold on AVX2-only CPUs too. ggml-python builds one CPU library for the build machine (no runtime dispatch to
pin), so only the widest path of this machine runs here.

At bf16 on the CPU with sdrt-ggml's native kernels (the default build), MatMul, Gemm and dense convs run on
sdrt-ggml's own bf16 GEMM instead (native.bf16_for): ``vdpbf16ps`` with each activation block rounded to
bf16 where the CPU has AVX-512-BF16 (the same numbers as ggml's path, so the same bounds), else the bf16
weights widened to float32 for the float32 kernels (activations not rounded: within the same bounds, closer
to the float32 result). ``test_native_bf16_kernel`` and ``test_native_bf16_fallback`` check both, the second
through the ISA pin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from ggml_helpers import F, compile_ggml, make_model, rand, run_ort
from onnx import TensorProto, helper, numpy_helper

ml_dtypes = pytest.importorskip("ml_dtypes")

UNIT = {"bf16": 2.0 ** -9, "fp16": 2.0 ** -12}
HALF = ("bf16", "fp16")


def rounded(precision: str, a: np.ndarray) -> np.ndarray:
    """The independent rounding: ml_dtypes' bfloat16 / numpy's float16, back to float32."""
    t = ml_dtypes.bfloat16 if precision == "bf16" else np.float16
    return np.asarray(a, np.float32).astype(t).astype(np.float32)


def with_rounded_weights(model: onnx.ModelProto, precision: str, names: set[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name in names:
            init.CopyFrom(numpy_helper.from_array(rounded(precision, numpy_helper.to_array(init)), init.name))
    return out


def test_rounding_matches_ggml_and_ml_dtypes():
    """bf16: the bit patterns of ggml's own ``ggml_fp32_to_bf16_row`` and of ml_dtypes; fp16: numpy's cast,
    finite values beyond its range clipped (as ``to_half``)."""
    import ctypes

    from sdrt_ggml.half import bf16_bits, round_to
    from sdrt_ggml.ops._common import ggml_lib

    rng = np.random.default_rng(0)
    a = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.4e38,
                                  1e-40, -1e-45], np.float32)]).astype(np.float32)
    g = ggml_lib()
    theirs = np.zeros(a.size, np.uint16)
    g.ggml_fp32_to_bf16_row(a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                            theirs.ctypes.data_as(ctypes.POINTER(g.ggml_bf16_t)), a.size)
    assert np.array_equal(bf16_bits(a), theirs)  # round to nearest even, bit for bit
    assert np.array_equal(bf16_bits(a), a.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.isnan(round_to("bf16", np.array([np.nan], np.float32))).all()
    small = a[:10000] / np.float32(1e25)
    assert np.array_equal(round_to("fp16", small), small.astype(np.float16).astype(np.float32))
    assert list(round_to("fp16", np.array([1e6, -7e4, np.inf], np.float32))) == [65504.0, -65504.0, np.inf]


def _layers(precision: str | None = None) -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """MatMul (2-D and batched constant B), Gemm (transB 0/1, alpha, bias), Conv (3x3, 1x1, strided, 1-D),
    each reading a graph input; and the weights stored half at ``precision`` (on sdrt-ggml's native bf16 kernels,
    a conv of fewer than 16 output channels keeps float32 weights: conv_kernels.BF16_MIN_OC)."""
    inits = {
        "w": rand(96, 40, seed=1), "wb": rand(3, 24, 16, seed=2), "g0": rand(96, 33, seed=3),
        "g1": rand(20, 96, seed=4), "gb": rand(20, seed=5), "k3": rand(16, 7, 3, 3, seed=6),
        "k1": rand(18, 7, 1, 1, seed=7), "ks": rand(5, 7, 3, 3, seed=8), "cb": rand(16, seed=9),
        "k1d": rand(6, 4, 3, seed=10),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("MatMul", ["xb", "wb"], ["mmb"]),
        helper.make_node("Gemm", ["x", "g0"], ["gemm0"], alpha=0.5),
        helper.make_node("Gemm", ["x", "g1", "gb"], ["gemm1"], transB=1),
        helper.make_node("Conv", ["im", "k3", "cb"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["im", "k1"], ["c1"]),
        helper.make_node("Conv", ["im2", "ks"], ["cs"], strides=[2, 2], pads=[0, 1, 1, 0]),
        helper.make_node("Conv", ["seq", "k1d"], ["c1d"], pads=[1, 1]),
    ]
    inputs = {"x": ((5, 96), F), "xb": ((3, 10, 24), F), "im": ((1, 7, 9, 11), F), "im2": ((2, 7, 10, 9), F),
              "seq": ((1, 4, 17), F)}
    outputs = {n: (None, F) for n in ("mm", "mmb", "gemm0", "gemm1", "c3", "c1", "cs", "c1d")}
    halved = {"w", "wb", "g0", "g1", "k3", "k1", "ks"}  # biases stay float32; the 1-D conv's kernel too
    if precision is not None and _native_bf16(precision):
        halved.discard("ks")  # 5 output channels
    return make_model(nodes, inputs, outputs, inits), inputs, halved


def _abs_terms(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """sum(|w| |x|) per output (onnxruntime on the graph with |weights| and |feeds|, biases zeroed)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for init in m.graph.initializer:
        a = np.abs(numpy_helper.to_array(init))
        if init.name in ("gb", "cb"):
            a = np.zeros_like(a)
        init.CopyFrom(numpy_helper.from_array(a, init.name))
    return run_ort(m, {k: np.abs(v) for k, v in feeds.items()})


@pytest.mark.parametrize("precision", HALF)
def test_layers_match_the_rounded_reference(precision):
    model, inputs, halved = _layers(precision)
    feeds = {k: rounded(precision, rand(*shape, seed=20 + i)) for i, (k, (shape, _)) in enumerate(inputs.items())}
    want = run_ort(with_rounded_weights(model, precision, halved), feeds)
    bound = _abs_terms(model, feeds)
    with compile_ggml(model, precision=precision) as s:
        got = s.run(feeds)
        hits = s.impl_hits
        held = s.weight_bytes()
    for k in want:
        assert got[k].shape == want[k].shape, k
        err = np.abs(got[k].astype(np.float64) - want[k])
        assert (err <= 1e-5 * bound[k] + 1e-6).all(), (k, float(err.max()), float((err / (bound[k] + 1e-6)).max()))
    n_half = sum(numpy_helper.to_array(i).size for i in model.graph.initializer if i.name in halved)
    n_f32 = sum(numpy_helper.to_array(i).size for i in model.graph.initializer if i.name not in halved)
    if _native_bf16(precision):
        # sdrt-ggml's bf16 GEMM panels and conv rows (the batched MatMul's weight: ggml's mul_mat); the panels
        # pad N to 32 columns, as the float32 panels do: half the float32 lowering's weights, give or take a
        # padded pair of K
        bf16 = ("gemm bf16", "conv bf16", "conv amx", "mul_mat bf16")
        assert sum(hits.get(k, 0) for k in bf16) >= len(halved), hits
        with compile_ggml(model, precision="fp32") as s32:
            held32 = s32.weight_bytes()
        assert held <= 0.55 * (held32 - 4 * n_f32) + 4 * n_f32 + 1024, (held, held32)
        return
    assert hits.get(f"mul_mat {precision}", 0) >= len(halved), hits
    # half weights, float32 biases and 1-D kernel, and a few int32 constants of the lowering (a shape)
    assert 2 * n_half + 4 * n_f32 <= held <= 2 * n_half + 4 * n_f32 + 64, (held, n_half, n_f32)


def _native_bf16(precision: str) -> bool:
    """Whether a CPU lowering at ``precision`` takes sdrt-ggml's native bf16 products (native.bf16_for)."""
    from sdrt_ggml import native

    return precision == "bf16" and native.native() is not None


@pytest.mark.parametrize("precision", HALF)
def test_activations_rounded_inside_the_graph_stay_within_the_unit_roundoff(precision):
    """MatMul -> Add -> Relu -> Gemm -> Conv: the half matmuls after the first read float32 activations that
    ggml rounds to the weight's type and the reference does not."""
    inits = {"w": rand(64, 48, seed=1), "b": rand(48, seed=2), "g": rand(48, 72, seed=3),
             "k": rand(4, 2, 3, 3, seed=4)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Gemm", ["r", "g"], ["y"]),
             helper.make_node("Reshape", ["y", "shape"], ["im"]),
             helper.make_node("Conv", ["im", "k"], ["out"], pads=[1, 1, 1, 1])]
    inits["shape"] = np.array([1, 2, 12, 18], np.int64)
    model = make_model(nodes, {"x": ((6, 64), F)}, {"out": (None, F)}, inits)
    feeds = {"x": rand(6, 64, seed=9)}
    halved = {"w", "g", "k"}
    want = run_ort(with_rounded_weights(model, precision, halved), feeds)["out"]
    # sum(|.| |.|) through the three layers, on |weights| and |x| (an upper bound of each layer's terms)
    m_abs = onnx.ModelProto()
    m_abs.CopyFrom(model)
    for init in m_abs.graph.initializer:
        if init.name != "shape":
            init.CopyFrom(numpy_helper.from_array(np.abs(numpy_helper.to_array(init)), init.name))
    bound = run_ort(m_abs, {"x": np.abs(feeds["x"])})["out"]
    with compile_ggml(model, precision=precision) as s:
        got = s.run(feeds)["out"]
    err = np.abs(got.astype(np.float64) - want)
    # each of the 3 layers rounds its input once (the first: x) and its terms are bounded by bound's
    assert (err <= 3 * 2 * UNIT[precision] * bound + 1e-5 * bound + 1e-6).all(), float((err / bound).max())
    # and the half path does round: at bf16 the result is not the float32 one
    with compile_ggml(model, precision="fp32") as s:
        f32 = s.run(feeds)["out"]
    assert np.abs(got - f32).max() > 0


@pytest.mark.parametrize("precision", HALF)
def test_update_weights_encodes_half(precision):
    import sdrt

    model, inputs, halved = _layers(precision)
    feeds = {k: rounded(precision, rand(*shape, seed=40 + i)) for i, (k, (shape, _)) in enumerate(inputs.items())}
    new = {n: numpy_helper.to_array(i) * np.float32(-1.5) + np.float32(0.01) for n, i in
           ((i.name, i) for i in model.graph.initializer)}
    m_new = onnx.ModelProto()
    m_new.CopyFrom(model)
    for init in m_new.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(new[init.name], init.name))
    want = run_ort(with_rounded_weights(m_new, precision, halved), feeds)
    bound = _abs_terms(m_new, feeds)
    with compile_ggml(model, precision=precision) as s:
        s.update_weights(sdrt.Weights.from_arrays(new))
        got = s.run(feeds)
    for k in want:
        err = np.abs(got[k].astype(np.float64) - want[k])
        assert (err <= 1e-5 * bound[k] + 1e-6).all(), k


def test_precision_option(monkeypatch):
    from sdrt.errors import SdrtError
    from sdrt_ggml import GgmlBackend

    model, _, _ = _layers()
    be = GgmlBackend()
    cpu = next(d for d in be.devices() if d.kind == "cpu")
    assert set(be.precisions) == {"fp32", "bf16", "fp16"}
    monkeypatch.delenv("SDRT_PRECISION", raising=False)
    from sdrt_ggml import devices
    from sdrt_ggml.ops._common import ggml_lib

    # bf16 where sdrt-ggml's vdpbf16ps kernels run (AVX-512-BF16) and were measured faster (CPU_BF16_FASTER)
    want = devices.default_precision(ggml_lib(), "cpu")
    assert want in ("fp32", "bf16")
    assert cpu.properties["precision"] == be.precision_for(cpu) == want
    with compile_ggml(model, precision="fp32") as s:
        assert not any(k.endswith(("bf16", "fp16")) for k in s.impl_hits)
    with compile_ggml(model, precision="bfloat16") as s:  # the vocabulary's aliases
        assert s.impl_hits.get("gemm bf16" if _native_bf16("bf16") else "mul_mat bf16")
    monkeypatch.setenv("SDRT_PRECISION", "half")  # replaces the default
    assert be.precision_for(cpu) == "fp16"
    with pytest.raises(SdrtError, match="precision 'int8'"):
        compile_ggml(model, precision="int8")


def test_default_follows_the_cpu_flag(monkeypatch):
    """Once a bf16 kernel is measured faster (CPU_BF16_FASTER), the CPU flag and sdrt-ggml's kernels decide."""
    from sdrt import precision_default
    from sdrt_ggml import devices, native
    from sdrt_ggml.ops._common import ggml_lib

    lib = ggml_lib()
    assert devices.default_precision(lib, "gpu") == "fp32"  # fp16 on GPUs: not measured yet
    monkeypatch.setattr(devices, "CPU_BF16_FASTER", False)
    assert devices.default_precision(lib, "cpu") == "fp32"
    monkeypatch.setattr(devices, "CPU_BF16_FASTER", True)
    monkeypatch.setattr(precision_default, "cpu_flags", lambda: frozenset({"avx2", "f16c"}))
    assert devices.default_precision(lib, "cpu") == "fp32"  # AVX2 only: bf16 emulated
    monkeypatch.setattr(precision_default, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    nat = native.native()
    kernel = nat.bf16_kernel_name if nat is not None else "none"
    vendor = precision_default.cpu_vendor()
    # sdrt-ggml's kernels decide: the AMX tiles, or vdpbf16ps on AMD (on Intel it was slower than float32)
    want = "bf16" if kernel == "amx-bf16" or (kernel == "avx512bf16" and vendor != "intel") else "fp32"
    assert devices.default_precision(lib, "cpu") == want
    if nat is not None and nat.amx_available:
        try:
            nat.set_amx(False)  # the tiles off (SDRT_GGML_AMX=0): vdpbf16ps on an Intel CPU, slower than float32
            assert nat.bf16_kernel_name == "avx512bf16"
            assert devices.default_precision(lib, "cpu") == "fp32"
        finally:
            nat.set_amx(True)
    if nat is not None and "avx2" in nat.available_isas():
        active = nat.isa
        try:
            nat.set_isa("avx2")  # the ISA pin: no vdpbf16ps, so float32 by default
            assert devices.default_precision(lib, "cpu") == "fp32"
        finally:
            nat.set_isa(active)
    monkeypatch.setattr(devices, "GPU_FP16_FASTER", True)
    assert devices.default_precision(lib, "gpu") == "fp16"


@pytest.mark.parametrize(("kernel", "vendor", "faster"), [
    ("amx-bf16", "intel", True), ("avx512bf16", "intel", False), ("avx512bf16", "amd", True),
    ("avx512bf16", "hygon", True), ("none", "amd", False), ("none", "intel", False)])
def test_bf16_is_the_default_only_on_kernels_measured_faster(kernel, vendor, faster):
    """bf16 beat float32 on the AMX tiles (Sapphire Rapids) and on AMD's vdpbf16ps (Zen 5); Intel's vdpbf16ps
    (Sapphire Rapids with the tiles off) and the widened weights were slower."""
    from sdrt_ggml import devices

    assert devices.bf16_kernel_faster(kernel, vendor) is faster


def _kernel_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The shapes sdrt-ggml's bf16 GEMM and conv meet: K of several blocks (1101 > 2 x 256 pairs) and odd, N
    not a multiple of 32, M beyond one 14-row tile, a residual and an activation fused into the epilogue, a
    strided and a channels-last (transposed) product, a conv with a bias and a ReLU, one with a residual."""
    inits = {"w": rand(1101, 70, seed=1), "g": rand(45, 1101, seed=2), "gb": rand(45, seed=3),
             "k3": rand(40, 33, 3, 3, seed=4), "kb": rand(40, seed=5), "kr": rand(33, 33, 3, 3, seed=6),
             "ks": rand(24, 33, 1, 1, seed=7), "k1": rand(19, 33, 1, 1, seed=8)}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "r"], ["mm_res"]),
        helper.make_node("Gemm", ["x", "g", "gb"], ["gemm"], transB=1),
        helper.make_node("Relu", ["gemm"], ["gemm_relu"]),
        helper.make_node("Conv", ["im", "k3", "kb"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["c3_relu"]),
        helper.make_node("Conv", ["im", "kr"], ["cr"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["cr", "im"], ["c_res"]),
        helper.make_node("Conv", ["im", "ks"], ["cs"], strides=[2, 2]),
        helper.make_node("Conv", ["im", "k1"], ["c1"]),
        helper.make_node("Transpose", ["c1"], ["c1_cl"], perm=[0, 2, 3, 1]),
    ]
    inputs = {"x": ((37, 1101), F), "r": ((37, 70), F), "im": ((1, 33, 13, 15), F)}
    outputs = {n: (None, F) for n in ("mm_res", "gemm_relu", "c3_relu", "c_res", "cs", "c1_cl")}
    return make_model(nodes, inputs, outputs, inits), inputs


def _kernel_case() -> tuple[Any, onnx.ModelProto, dict[str, np.ndarray], dict[str, np.ndarray],
                            dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The native kernels, the model, its feeds, the two references (weights rounded to bf16 by ml_dtypes;
    activations rounded too, or not) and sum(|w| |x|) per output."""
    from sdrt_ggml import native

    nat = native.native()
    if nat is None:
        pytest.skip(f"sdrt-ggml's native kernels are not loaded: {native.unavailable_reason()}")
    model, inputs = _kernel_model()
    halved = {"w", "g", "k3", "kr", "ks", "k1"}
    feeds = {k: rand(*shape, seed=50 + i) for i, (k, (shape, _)) in enumerate(inputs.items())}
    m16 = with_rounded_weights(model, "bf16", halved)
    ref_f32_act = run_ort(m16, feeds)
    ref_bf16_act = run_ort(m16, {k: rounded("bf16", v) if k != "r" else v for k, v in feeds.items()})  # r: added
    # the residual ``im`` is added in float32 as it is: only the conv's operand is rounded
    ref_bf16_act["c_res"] = ref_bf16_act["c_res"] - rounded("bf16", feeds["im"]) + feeds["im"]
    return nat, model, feeds, ref_bf16_act, ref_f32_act, _abs_terms(model, feeds)


def _check_kernel(got: dict[str, np.ndarray], want: dict[str, np.ndarray], other: dict[str, np.ndarray],
                  bound: dict[str, np.ndarray]) -> None:
    """The bound: the products of bf16 values are exact in float32, so the two sides differ only by the float32
    roundings of their sums: at most n 2^-24 sum(|w| |x|) for sums of n terms. vdpbf16ps adds a pair a step, at
    most 512 roundings in a 256-pair block of K, plus one per further block; onnxruntime's own sum adds up to K
    = 1101 more; 1e-4 sum(|w| |x|) covers n = 1677. That bound alone does not tell the rounding of the
    activations apart (it moves a sum by about 2^-9 sum/sqrt(K)), so each path must also sit much closer to
    its own reference than to the other one."""
    for k in want:
        err = np.abs(got[k].astype(np.float64) - want[k])
        assert (err <= 1e-4 * bound[k] + 1e-6).all(), (k, float((err / (bound[k] + 1e-6)).max()))
        apart = float(np.abs(want[k] - other[k]).max())
        assert float(err.max()) < 0.1 * apart, (k, float(err.max()), apart)


def test_native_bf16_kernel():
    """sdrt-ggml's vdpbf16ps GEMM and conv (AVX-512-BF16): both operands rounded to bf16, float32 sums."""
    nat, model, feeds, ref_bf16_act, ref_f32_act, bound = _kernel_case()
    if not nat.bf16_kernel:
        pytest.skip(f"no vdpbf16ps kernels here (CPU or build without AVX-512-BF16, or GEMM ISA {nat.isa} pinned): "
                    "test_native_bf16_fallback covers this CPU's bf16 path")
    with compile_ggml(model, precision="bf16") as s:
        got = s.run(feeds)
        hits = s.impl_hits
    # on AMX tiles the stride-1 convs take the conv without packing ("conv amx", native/amx_conv.c)
    assert hits.get("gemm bf16", 0) >= 2 and hits.get("conv bf16", 0) + hits.get("conv amx", 0) >= 3, hits
    _check_kernel(got, ref_bf16_act, ref_f32_act, bound)


def test_native_bf16_fallback():
    """Without vdpbf16ps (forced here through the ISA pin, SDRT_GGML_GEMM_ISA's runtime form): the bf16 weights
    widened to float32 for the float32 kernels, the activations not rounded."""
    nat, model, feeds, ref_bf16_act, ref_f32_act, bound = _kernel_case()
    active = nat.isa
    fallback = "avx2" if "avx2" in nat.available_isas() else "portable"
    try:
        nat.set_isa(fallback)
        assert not nat.bf16_kernel
        with compile_ggml(model, precision="bf16") as s:
            got = s.run(feeds)
            hits = s.impl_hits
            held = s.weight_bytes()
    finally:
        nat.set_isa(active)
    assert hits.get("gemm bf16", 0) >= 2 and hits.get("conv bf16", 0) >= 3, hits
    _check_kernel(got, ref_f32_act, ref_bf16_act, bound)
    n = sum(numpy_helper.to_array(i).size for i in model.graph.initializer if i.name in ("w", "g", "k3", "kr", "ks", "k1"))
    assert held < 3 * n, (held, n)  # bf16 weights held (2 bytes each, some padding), not float32 copies


def test_tiny_sd15_image_at_bf16_within_the_bar(registry):
    """The tiny SD 1.5 folder, 20 Euler steps, CFG 7 with a negative prompt: the bf16 image against the
    float32 one, both on ggml, at the bar the default precisions are held to (docs/precision.md)."""
    from pathlib import Path

    import sdrt_ggml
    from sdrt import pipelines
    from sdrt.precision_default import PSNR_BAR_DB, psnr

    folder = Path(__file__).resolve().parents[2] / "data" / "pipelines" / "tiny-sd15"
    registry.register_plugin(sdrt_ggml, "ggml", distribution="sdrt-ggml")
    images = {}
    for precision in ("bf16", "fp32"):
        pipe = pipelines.load(folder, backend="ggml", device="CPU", precision=precision)
        images[precision] = pipe.generate("an astronaut riding a horse on the moon", "blurry, lowres", steps=20,
                                          cfg=7.0, sampler="Euler", seed=1).images[0]
    value = psnr(images["bf16"], images["fp32"])
    assert PSNR_BAR_DB <= value < float("inf"), value


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_float16_matmul_weight_takes_the_native_gemm(precision):
    """A float16 graph (onnxruntime's float16 converter, Olive's float16 folders) holds float16 MatMul weights:
    they take the native GEMM like float32 ones (they fell to ggml's mul_mat before). Reference: numpy in
    float32 on the float16 weight (rounded to bf16 by ml_dtypes at bf16; the activations too where the bf16 kernel
    rounds them, vdpbf16ps), within the bounds above plus the float16 output's rounding."""
    from sdrt_ggml import native
    from sdrt_ggml.ops._common import ggml_lib

    if native.native() is None:
        pytest.skip("sdrt-ggml's native kernels are not loaded")
    h = onnx.TensorProto.FLOAT16
    w = (rand(64, 48, seed=3) * 0.2).astype(np.float16)
    b = rand(48, seed=4).astype(np.float16)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                       {"x": ((2, 8, 64), h)}, {"y": ((2, 8, 48), h)}, {"w": w, "b": b})
    x = rand(2, 8, 64, seed=5).astype(np.float16)
    wf = rounded("bf16", w) if precision == "bf16" else w.astype(np.float32)
    # vdpbf16ps (AVX-512-BF16) rounds the activations to bf16; the fallback (an AVX2 CPU) keeps them in float32
    bf16_act = precision == "bf16" and bool(native.native().bf16_kernel)
    xf = rounded("bf16", x) if bf16_act else x.astype(np.float32)
    want = xf @ wf + b.astype(np.float32)
    with compile_ggml(model, precision=precision) as s:
        got = s.run({"x": x})["y"].astype(np.float32)
        g = ggml_lib()
        ops = {g.ggml_op_desc(g.ggml_graph_node(s._graph, i)).decode() for i in range(g.ggml_graph_n_nodes(s._graph))}
        assert "MUL_MAT" not in ops, ops
        if precision == "bf16":
            assert s.impl_hits.get("gemm bf16") == 1, s.impl_hits
    scale = np.abs(xf) @ np.abs(wf) + np.abs(b.astype(np.float32))
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 2.0 ** -11 * np.abs(want) + 1e-6)


@pytest.mark.parametrize("impl", ["auto", "winograd", "implicit", "igemm", "window", "rowcopy", "taps", "direct",
                                  pytest.param("im2col", marks=pytest.mark.xfail(
                                      strict=True, reason="kept: ggml's im2col takes its kernel's shape from the plain "
                                      "tensor, held beside the packed copy (a route only conv_impl='im2col' picks)"))])
def test_a_conv_kernel_is_held_once_whatever_its_route(impl):
    """Each conv route that transforms its kernel (Winograd tiles, implicit-GEMM rows, taps) holds that copy alone:
    a plain float32 copy made before the route was chosen held every such kernel twice (a float32 SD 1.5 UNet on
    ggml: 2.36 GB of unused kernels, an 11.7 GB peak for 4.3 GB of weights)."""
    from sdrt_ggml.lower import Binding

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05
    b = rng.standard_normal(64).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": ((1, 64, 16, 16), TensorProto.FLOAT)}, {"y": ((1, 64, 16, 16), TensorProto.FLOAT)},
                       {"w": w, "b": b})
    x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
    with compile_ggml(model, precision="fp32", conv_impl=impl) as s:
        got = s.run({"x": x})["y"]
        bound: list[Binding] = s._lo.bindings
    held = [bd for bd in bound if bd.name == "w"]  # the taps route holds one slice per tap: one copy in all
    assert held and not (len(held) > 1 and any(bd.transform is None for bd in held)), \
        f"{impl}: a plain copy of the kernel beside {len(held) - 1} transformed ones"
    want = run_ort(model, {"x": x})["y"]
    assert np.abs(got - want).max() < 1e-3
