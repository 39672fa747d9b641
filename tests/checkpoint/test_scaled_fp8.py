"""ComfyUI's "scaled fp8" files (``t5xxl_fp8_e4m3fn_scaled.safetensors``, ``*_fp8_scaled`` checkpoints).

Each fp8 ``X.weight`` has an ``X.scale_weight`` beside it and means ``weight * scale_weight`` (ComfyUI's
dequantization); a ``scaled_fp8`` marker and ``scale_input`` tensors come with them. Read without the scale the
weights are off by that factor (hundreds of times too large or small, what diffusers 0.42's ``from_single_file``
does: it drops the scales with a warning). Before, sdrt refused such files ("checkpoint weights have no place in
the graph": the SD 1.x file below for its 83 ``scale_weight`` keys, an all-in-one Flux file for 27).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from ckpt_data import DATA

from sdrt.checkpoint import open_single_file
from sdrt.errors import WeightsError
from sdrt.weights import Weights, stfile

GRAPHS = {p: DATA / "sd1" / p / "model.onnx" for p in ("unet", "text_encoder", "vae_decoder", "vae_encoder")}
F8 = ml_dtypes.float8_e4m3fn


def _scaled(arrays: dict, per_row: bool = False) -> tuple[dict, dict]:
    """The file's tensors, and what each scaled weight must read as (numpy: fp8 values times their scale)."""
    out, want = {}, {}
    for k, v in arrays.items():
        v32 = np.asarray(v, np.float32)
        if k.endswith(".weight") and v32.ndim >= 2 and k.startswith("model.diffusion_model."):
            s = (np.abs(v32).reshape(v32.shape[0], -1).max(1) if per_row else np.abs(v32).max()) / 448.0
            s = np.maximum(s, 1e-8).astype(np.float32)
            sb = s.reshape((-1,) + (1,) * (v32.ndim - 1)) if per_row else s
            q = (v32 / sb).astype(F8)
            out[k], out[k[: -len("weight")] + "scale_weight"] = q, s
            out[k[: -len("weight")] + "scale_input"] = np.ones((), np.float32)
            want[k] = q.astype(np.float32) * sb
        else:
            out[k] = v
    out["model.diffusion_model.scaled_fp8"] = np.zeros(0, F8)
    return out, want


@pytest.mark.parametrize("per_row", [False, True])
def test_scaled_fp8_weights_read_as_comfyui_dequantizes_them(tmp_path, per_row):
    base = Weights.open(DATA / "sd1" / "ldm.safetensors")
    orig = {k: np.asarray(base[k]) for k in base}
    tensors, want = _scaled(orig, per_row)
    f = tmp_path / "sd15_fp8_scaled.safetensors"
    stfile.write(f, tensors)
    w = Weights.open(f)
    assert not any(k.endswith(("scale_weight", "scale_input", "scaled_fp8")) for k in w)
    for k, v in want.items():
        np.testing.assert_array_equal(w[k], v)
    m = open_single_file(f, graph_paths=GRAPHS)  # binds: no unplaced keys, every part there
    ref = open_single_file(DATA / "sd1" / "ldm.safetensors", graph_paths=GRAPHS)
    g, bound = m.parts["unet"]
    _, fp16 = ref.parts["unet"]
    worst = max(float(np.abs(np.asarray(bound[n], np.float32) - np.asarray(fp16[n], np.float32)).max()
                     / max(float(np.abs(np.asarray(fp16[n], np.float32)).max()), 1e-6)) for n in fp16)
    assert worst < 0.07  # fp8 e4m3's rounding (3 mantissa bits), relative to each tensor's largest value


def test_a_scale_without_its_weight_is_one_error(tmp_path):
    f = tmp_path / "bad_scaled.safetensors"
    stfile.write(f, {"a.weight": np.ones((4, 4), F8), "b.scale_weight": np.ones((), np.float32)})
    with pytest.raises(WeightsError, match=r"b.scale_weight .* b.weight is missing: not a scaled-fp8 pair") as e:
        Weights.open(f)
    assert "\n" not in str(e.value) and "bad_scaled.safetensors" in str(e.value)


def test_all_in_one_scaled_fp8_flux_file_binds_every_part(tmp_path):
    """ComfyUI's all-in-one Flux checkpoint (transformer, CLIP-L, T5 and VAE in one file), transformer and T5 in
    scaled fp8: every part binds, within fp8's rounding of the separate float32 files."""
    import single_file_helpers as h
    from flow_file_helpers import bfl_transformer, clip_file, t5_file
    from test_flow_single_files import PIPES, _files, _params, _vae

    f = _files("flux-dev", tmp_path)
    folder = PIPES / "tiny-flux-dev"
    main = {"model.diffusion_model." + k: v for k, v in bfl_transformer(_params(folder, "transformer")).items()}
    main.update({"text_encoders.clip_l.transformer." + k: v for k, v in clip_file(_params(folder, "text_encoder")).items()})
    main.update({"text_encoders.t5xxl.transformer." + k: v for k, v in t5_file(_params(folder, "text_encoder_2")).items()})
    main.update({"vae." + k: v for k, v in _vae(folder).items()})
    scaled = {}
    for k, v in main.items():
        if k.endswith(".weight") and v.ndim == 2 and (k.startswith("model.diffusion_model.") or "t5xxl" in k):
            s = np.float32(max(np.abs(v).max(), 1e-8) / 448)
            scaled[k], scaled[k[: -len("weight")] + "scale_weight"] = (v / s).astype(F8), np.array(s, np.float32)
        else:
            scaled[k] = v
    scaled["model.diffusion_model.scaled_fp8"] = np.zeros(0, F8)
    path = h.write(tmp_path / "flux1-dev-aio-fp8-scaled.safetensors", scaled)
    m = open_single_file(path, graph_paths=f["graphs"], family="flux-dev")
    ref = open_single_file(f["file"], [*f["text_encoders"], f["vae"]], graph_paths=f["graphs"], family="flux-dev")
    assert sorted(m.parts) == sorted(ref.parts)
    for part, (_, w) in ref.parts.items():
        got = m.parts[part][1]
        for n in w:
            a, b = np.asarray(got[n], np.float32), np.asarray(w[n], np.float32)
            assert np.abs(a - b).max() <= 0.07 * max(float(np.abs(b).max()), 1e-6), (part, n)

