"""sdrt.pipelines.flowparts against what diffusers' SD3, Flux and Chroma pipelines computed (refs.npz).

Seeded noise, packing, ids, the Chroma mask, the VAE's scale and shift and the transformer's timestep are
checked against the recorded transformer inputs; the text side (SD3's joint sequence, Flux's pooled CLIP and
T5, Chroma's masked T5) and the img2img start latent run the folders' ONNX parts on the reference backend.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import KINDS, cases, folder, refs, register

import sdrt
from sdrt.errors import InputError
from sdrt.pipelines import flowparts as fp
from sdrt.samplers import TorchGenerator, randn
from sdrt.samplers.flowmatch import FlowMatchSchedule, flux_sigmas, img2img_timesteps, scale_noise


def _txt2img(kind: str) -> list[dict]:
    return [c for c in cases(kind) if c["mode"] == "txt2img"]


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_noise_and_packing_give_the_first_transformer_input(kind: str) -> None:
    r = refs(kind)
    for case in _txt2img(kind):
        name, b = case["name"], case["batch"]
        if kind == "sd3":
            noise = randn(case["seed"], fp.sd3_latent_shape(b, case["height"], case["width"]))
            want = np.concatenate([noise, noise]) if case["cfg"] > 1 else noise
        else:
            noise = randn(case["seed"], fp.flux_latent_shape(b, case["height"], case["width"]))
            want = fp.pack_latents(noise)
            np.testing.assert_array_equal(fp.unpack_latents(want, case["height"], case["width"]), noise)
        np.testing.assert_array_equal(r[f"{name}/call0/hidden_states"], want, err_msg=name)


@pytest.mark.parametrize("kind", ["flux-dev", "flux-schnell", "chroma"])
def test_ids_and_chroma_mask(kind: str) -> None:
    r = refs(kind)
    for case in cases(kind):
        name = case["name"]
        h, w = (64, 64) if case["mode"] == "img2img" else (case["height"], case["width"])
        np.testing.assert_array_equal(r[f"{name}/call0/img_ids"], fp.latent_image_ids(h, w), err_msg=name)
        np.testing.assert_array_equal(r[f"{name}/call0/txt_ids"], fp.text_ids(case["max_sequence_length"]))
        np.testing.assert_array_equal(r[f"{name}/prompt/text_ids"], fp.text_ids(case["max_sequence_length"]))
        if kind == "chroma":
            text = fp.chroma_text_mask(r[f"{name}/prompt/tokenizer_mask"])
            np.testing.assert_array_equal(text, r[f"{name}/prompt/text_mask"], err_msg=name)
            real = int(r[f"{name}/prompt/tokenizer_mask"].sum())
            assert text.sum() == min(real + 1, case["max_sequence_length"])  # and the first padding token
            want = fp.chroma_attention_mask(text, (h // 16) * (w // 16))
            got = r[f"{name}/call0/attention_mask"]
            assert got.dtype == bool
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_vae_scale_and_shift_give_the_decoder_input(kind: str) -> None:
    cfg = json.loads((folder(kind) / "vae_decoder" / "config.json").read_text())
    r = refs(kind)
    for case in cases(kind):
        name = case["name"]
        last = r[f"{name}/step_latents"][-1]
        if kind != "sd3":
            h, w = (64, 64) if case["mode"] == "img2img" else (case["height"], case["width"])
            last = fp.unpack_latents(last, h, w)
        got = fp.to_vae(last, cfg["scaling_factor"], cfg["shift_factor"])
        np.testing.assert_allclose(got, r[f"{name}/decoder_in"], rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(fp.from_vae(got, cfg["scaling_factor"], cfg["shift_factor"]), last, atol=1e-5)


def test_transformer_timestep_by_family() -> None:
    np.testing.assert_array_equal(fp.transformer_timestep("sd3", 750.0, 2), [750.0, 750.0])
    np.testing.assert_array_equal(fp.transformer_timestep("flux", 750.0, 1), [np.float32(750.0) / np.float32(1000)])
    with pytest.raises(InputError, match="family"):
        fp.transformer_timestep("sdxl", 1.0, 1)


def test_bad_inputs_are_one_line_errors() -> None:
    with pytest.raises(InputError, match="multiple of 16"):
        fp.sd3_latent_shape(1, 72, 64)
    with pytest.raises(InputError, match="do not fit"):
        fp.unpack_latents(np.zeros((1, 16, 64), np.float32), 128, 128)
    with pytest.raises(InputError, match="clip_skip"):
        fp.sd3_clip_output(3, clip_skip=5)
    with pytest.raises(InputError, match="CLIP"):
        fp.sd3_prompt_embeds(np.zeros((1, 77, 8)), np.zeros((1, 76, 8)), None, t5_width=32)
    assert fp.sd3_clip_output(3) == "hidden_states.2"  # hidden_states[-2] of 4 outputs


# ---------------------------------------------------------------- the text side, on the reference backend
def _run(kind: str, part: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    register("reference")
    with sdrt.load(folder(kind) / part / "model.onnx", backend="reference") as s:
        return s.run(feeds)


def test_sd3_joint_text_sequence() -> None:
    r = refs("sd3")
    case = cases("sd3")[0]
    name = case["name"]
    for key, pe, pp in (("prompt", "prompt_embeds", "pooled_prompt_embeds"),
                        ("negative", "negative_prompt_embeds", "negative_pooled_prompt_embeds")):
        layers = json.loads((folder("sd3") / "text_encoder" / "config.json").read_text())["num_hidden_layers"]
        out_l = _run("sd3", "text_encoder", {"input_ids": r[f"{name}/{key}/ids_l"].astype(np.int64)})
        out_g = _run("sd3", "text_encoder_2", {"input_ids": r[f"{name}/{key}/ids_g"].astype(np.int64)})
        t5 = _run("sd3", "text_encoder_3", {"input_ids": r[f"{name}/{key}/ids_t5"].astype(np.int64)})
        out = fp.sd3_clip_output(layers)
        joint = fp.sd3_prompt_embeds(out_l[out], out_g[out], t5["last_hidden_state"])
        np.testing.assert_allclose(joint, r[f"{name}/{pe}"], rtol=0, atol=2e-5, err_msg=key)
        pooled = fp.sd3_pooled(out_l["text_embeds"], out_g["text_embeds"])
        np.testing.assert_allclose(pooled, r[f"{name}/{pp}"], rtol=0, atol=2e-5, err_msg=key)


def test_flux_pooled_clip_and_t5_sequence() -> None:
    r = refs("flux-dev")
    name = cases("flux-dev")[0]["name"]
    clip = _run("flux-dev", "text_encoder", {"input_ids": r[f"{name}/prompt/ids_clip"].astype(np.int64)})
    t5 = _run("flux-dev", "text_encoder_2", {"input_ids": r[f"{name}/prompt/ids_t5"].astype(np.int64)})
    np.testing.assert_allclose(clip["pooler_output"], r[f"{name}/prompt/pooled_prompt_embeds"], atol=2e-5)
    np.testing.assert_allclose(t5["last_hidden_state"], r[f"{name}/prompt/prompt_embeds"], atol=2e-5)


def test_chroma_t5_takes_the_tokenizer_mask() -> None:
    r = refs("chroma")
    name = cases("chroma")[0]["name"]
    ids, mask = r[f"{name}/prompt/ids_t5"].astype(np.int64), r[f"{name}/prompt/tokenizer_mask"].astype(np.int64)
    out = _run("chroma", "text_encoder", {"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
    np.testing.assert_allclose(out, r[f"{name}/prompt/prompt_embeds"], atol=2e-5)
    unmasked = _run("chroma", "text_encoder", {"input_ids": ids, "attention_mask": np.ones_like(mask)})
    assert np.abs(unmasked["last_hidden_state"] - out).max() > 1e-3  # the mask matters


@pytest.mark.parametrize("kind", ["sd3", "flux-dev", "flux-schnell"])
def test_img2img_start_latent(kind: str) -> None:
    """VAE encode (the sample drawn first from the run's generator), scale and shift, then noise at the cut."""
    r = refs(kind)
    case = next(c for c in cases(kind) if c["mode"] == "img2img")
    name, steps = case["name"], case["steps"]
    image = r["init_image"].astype(np.float32)[None].transpose(0, 3, 1, 2) / np.float32(255) * 2 - 1
    params = _run(kind, "vae_encoder", {"sample": image.astype(np.float32)})["latent_parameters"]
    gen = TorchGenerator(case["seed"])
    latent = fp.vae_latent(params, gen.randn(params[:, :16].shape))
    cfg = json.loads((folder(kind) / "vae_encoder" / "config.json").read_text())
    latent = fp.from_vae(latent, cfg["scaling_factor"], cfg["shift_factor"])
    sched = FlowMatchSchedule.from_config(json.loads((folder(kind) / "scheduler" / "scheduler_config.json").read_text()))
    if kind == "sd3":
        ts, sig = sched.timesteps(steps)
        shape = fp.sd3_latent_shape(1, 64, 64)
    else:
        mu = sched.mu_for(16) if sched.use_dynamic_shifting else None
        ts, sig = sched.timesteps(steps, sigmas=flux_sigmas(steps), mu=mu)
        shape = fp.flux_latent_shape(1, 64, 64)
    ts, sig, _ = img2img_timesteps(ts, sig, steps, case["strength"])
    x = scale_noise(latent, gen.randn(shape), sig[0])
    want = r[f"{name}/call0/hidden_states"]
    if kind == "sd3":
        want = want[:1]
    else:
        x = fp.pack_latents(x)
    np.testing.assert_allclose(x, want, rtol=0, atol=5e-5, err_msg=name)
