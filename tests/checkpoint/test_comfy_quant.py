"""ComfyUI's per-layer quantized files (comfy-kitchen's "mixed precision" layout, ``comfy.quant_ops.QUANT_ALGOS``).

Each quantized layer ``X`` is marked by ``X.comfy_quant`` (uint8 JSON, ``{"format": "float8_e4m3fn"}``) or listed in
the header's ``_quantization_metadata``; ``X.weight`` is stored as ``W / s`` rounded to the format, with
``X.weight_scale`` = ``s`` (one value, ``max|W| / 448`` for e4m3) and an ``X.input_scale``. ComfyUI reads
``weight * weight_scale``. sdrt read the stored codes unscaled (the scales were "keys not used", a warning): every
such weight hundreds of times too large, silently. The expected values here are computed with numpy from the
stored codes and scales (comfy-kitchen's per-tensor dequantization).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from ckpt_data import DATA

from sdrt.checkpoint import open_single_file
from sdrt.errors import WeightsError
from sdrt.weights import Weights, stfile

GRAPHS = {p: DATA / "sd1" / p / "model.onnx" for p in ("unet", "text_encoder", "vae_decoder", "vae_encoder")}
STORE = {"float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0), "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0),
         "int8_tensorwise": (np.int8, 127.0)}


def _marker(fmt: str) -> np.ndarray:
    return np.frombuffer(json.dumps({"format": fmt}).encode(), np.uint8).copy()


def _quantized(arrays: dict, fmt: str, in_header: bool) -> tuple[dict, dict, dict]:
    """(the file's tensors, what each quantized weight must read as, the header's metadata)."""
    dtype, top = STORE[fmt]
    out, want, layers = {}, {}, {}
    for k, v in arrays.items():
        v32 = np.asarray(v, np.float32)
        if k.endswith(".weight") and v32.ndim >= 2 and k.startswith("model.diffusion_model."):
            layer = k[: -len(".weight")]
            s = np.float32(max(float(np.abs(v32).max()) / top, 1e-8))
            q = np.clip(np.round(v32 / s), -127, 127).astype(np.int8) if dtype is np.int8 else (v32 / s).astype(dtype)
            out[k], out[layer + ".weight_scale"], out[layer + ".input_scale"] = q, np.array(s), np.ones((), np.float32)
            if in_header:
                layers[layer] = {"format": fmt}
            else:
                out[layer + ".comfy_quant"] = _marker(fmt)
            want[k] = q.astype(np.float32) * s
        else:
            out[k] = v
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})} if in_header else None
    return out, want, meta


@pytest.mark.parametrize("in_header", [False, True], ids=["comfy_quant tensors", "header metadata"])
@pytest.mark.parametrize("fmt", list(STORE))
def test_comfyui_quantized_layers_read_as_comfyui_dequantizes_them(tmp_path, fmt, in_header):
    base = Weights.open(DATA / "sd1" / "ldm.safetensors")
    tensors, want, meta = _quantized({k: np.asarray(base[k]) for k in base}, fmt, in_header)
    f = tmp_path / f"sd15_{fmt}.safetensors"
    stfile.write(f, tensors, meta)
    w = Weights.open(f)
    assert not any(k.endswith((".comfy_quant", ".weight_scale", ".input_scale")) for k in w)
    for k, v in want.items():
        np.testing.assert_array_equal(w[k], v)
    m = open_single_file(f, graph_paths=GRAPHS)
    ref = open_single_file(DATA / "sd1" / "ldm.safetensors", graph_paths=GRAPHS)
    _, bound = m.parts["unet"]
    _, fp16 = ref.parts["unet"]
    worst = max(float(np.abs(np.asarray(bound[n], np.float32) - np.asarray(fp16[n], np.float32)).max()
                     / max(float(np.abs(np.asarray(fp16[n], np.float32)).max()), 1e-6)) for n in fp16)
    assert worst < {"float8_e4m3fn": 0.07, "float8_e5m2": 0.13, "int8_tensorwise": 0.01}[fmt]


def test_a_format_sdrt_cannot_read_is_one_error_naming_it(tmp_path):
    f = tmp_path / "flux_nvfp4.safetensors"
    stfile.write(f, {"double_blocks.0.img_attn.qkv.weight": np.zeros((64, 16), np.uint8),
                     "double_blocks.0.img_attn.qkv.weight_scale": np.zeros((64, 2), ml_dtypes.float8_e4m3fn),
                     "double_blocks.0.img_attn.qkv.weight_scale_2": np.ones((), np.float32),
                     "double_blocks.0.img_attn.qkv.comfy_quant": _marker("nvfp4"),
                     "img_in.weight": np.zeros((32, 64), np.float16)})
    with pytest.raises(WeightsError, match=r"1 layers of flux_nvfp4\.safetensors are stored in ComfyUI's nvfp4 "
                                           r"quantization \(double_blocks\.0\.img_attn\.qkv, \.\.\.\), which sdrt "
                                           r"cannot read") as e:
        Weights.open(f)
    assert "\n" not in str(e.value) and "fp16 / bf16" in str(e.value)


@pytest.mark.parametrize("drop, says", [(".weight_scale", "its weight_scale is missing"),
                                        (".weight", "its weight is missing")])
def test_a_marked_layer_without_its_scale_or_weight_is_refused(tmp_path, drop, says):
    layer = "model.diffusion_model.out.2"
    tensors = {layer + ".weight": np.ones((4, 4), ml_dtypes.float8_e4m3fn), layer + ".weight_scale": np.ones((), np.float32),
               layer + ".comfy_quant": _marker("float8_e4m3fn")}
    del tensors[layer + drop]
    f = tmp_path / "cut.safetensors"
    stfile.write(f, tensors)
    with pytest.raises(WeightsError, match=f"ComfyUI float8_e4m3fn layer {layer}: {says}"):
        Weights.open(f)


def test_a_comfyui_fp8_t5_file_beside_flux_binds_its_dequantized_weights(tmp_path):
    """A T5-XXL file quantized this way (convert_to_quant's t5xxl preset) beside a Flux.1 dev transformer: before,
    its scales were "keys not used" (a warning) and T5 ran on the raw fp8 codes."""
    from test_flow_single_files import _files

    f = _files("flux-dev", tmp_path)
    t5 = next(p for p in f["text_encoders"] if p.name.startswith("t5xxl"))
    src = Weights.open(t5)
    tensors, want = {}, {}
    for k in src:
        v = np.asarray(src[k], np.float32)
        if k.endswith(".weight") and v.ndim == 2 and k.startswith("encoder.block."):
            s = np.float32(np.abs(v).max() / 448)
            q = (v / s).astype(ml_dtypes.float8_e4m3fn)
            layer = k[: -len(".weight")]
            tensors.update({k: q, layer + ".weight_scale": np.array(s), layer + ".comfy_quant": _marker("float8_e4m3fn")})
            want[k] = q.astype(np.float32) * s
        else:
            tensors[k] = v
    qt5 = tmp_path / "t5xxl_fp8_comfy_quant.safetensors"
    stfile.write(qt5, tensors)
    others = [p for p in f["text_encoders"] if p != t5]
    m = open_single_file(f["file"], [qt5, *others, f["vae"]], graph_paths=f["graphs"], family="flux-dev")
    ref = open_single_file(f["file"], [*f["text_encoders"], f["vae"]], graph_paths=f["graphs"], family="flux-dev")
    _, got = m.parts["text_encoder_2"]
    _, plain = ref.parts["text_encoder_2"]
    assert len(want) > 4
    for n in plain:
        a, b = np.asarray(got[n], np.float32), np.asarray(plain[n], np.float32)
        assert np.abs(a - b).max() <= 0.07 * max(float(np.abs(b).max()), 1e-6), n
