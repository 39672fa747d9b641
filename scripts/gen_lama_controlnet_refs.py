"""References for ``inpaint_only+lama`` on tiny-sd15-controlnet: the extension's whole unit, written in torch.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/gen_lama_controlnet_refs.py

The picture and mask of gen_inpaint_controlnet_refs.py; LaMa's fill of them by the extension's own
``FFCResNetGenerator`` (ref_lama.py: the small seeded generator tests/pipelines/lama_helpers.py writes, and the
extension's code around it); then the extension's ``inpaint_only`` unit on the filled picture (the hint, the restore
after every UNet call, the pixel blend: gen_inpaint_controlnet_refs.run_inpaint_only's loop) with what ``+lama``
adds (``scripts/controlnet.py``: ``noise_modifier`` = the VAE latent of the hint's picture; ``scripts/hook.py``'s
``HackedImageRNG``: the first noise drawn becomes ``predict_q_sample(x0=latent, t=999, noise)``). The latent is the
VAE's mean (the extension samples). Euler, 8 steps, CFG 7, seed 105 (the noise drawn from torch's seeded generator,
as sdrt's default stream draws it).

Writes tests/data/pipelines/tiny-sd15-controlnet/lama.npz (the filled map and the image) and lama.json (the case).
"""

from __future__ import annotations

import json

import gen_inpaint_controlnet_refs as I  # noqa: N812
import numpy as np
import ref_lama
import torch
from diffusers import EulerDiscreteScheduler

SIZE = I.SIZE


def run_lama(pipe, net, case, img, m, lean: bool = True) -> np.ndarray:
    """The extension's inpaint_only loop and blend on the filled picture ``img``; ``lean``: the noise hack."""
    hint = I.make_hint(img, m)
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(case["steps"])
    ac = sched.alphas_cumprod.double()
    sqrt_recip, sqrt_recipm1 = torch.sqrt(1.0 / ac).float(), torch.sqrt(1.0 / ac - 1).float()
    sqrt_ac, sqrt_1m = torch.sqrt(ac).float(), torch.sqrt(1.0 - ac).float()  # ldm's buffers (float32)
    w = max(0.0, min(1.0, case["scale"]))
    with torch.no_grad():
        pe, npe = pipe.encode_prompt(case["prompt"], "cpu", 1, True, negative_prompt=case["negative_prompt"])
        hidden = torch.cat([npe, pe])
        raw = torch.from_numpy(img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0)
        origin = pipe.vae.encode(raw * 2 - 1).latent_dist.mean * pipe.vae.config.scaling_factor
        g = torch.Generator("cpu").manual_seed(case["seed"])
        noise = torch.randn((1, 4, SIZE // 8, SIZE // 8), generator=g)
        if lean:  # HackedImageRNG.next: predict_q_sample(sd_model, x0, 999, noise)
            noise = sqrt_ac[999] * origin + sqrt_1m[999] * noise
        latents = noise * sched.init_noise_sigma
        cond = hint.repeat(2, 1, 1, 1)
        mpix = torch.from_numpy(m.astype(np.float32)[None, None] / 255.0)
        mlat = torch.nn.functional.max_pool2d(mpix, (10, 10), stride=(8, 8), padding=1)
        for t in sched.timesteps:
            x_in = sched.scale_model_input(torch.cat([latents] * 2), t)
            down, mid = net(x_in, t, encoder_hidden_states=hidden, controlnet_cond=cond,
                            conditioning_scale=case["scale"], guess_mode=False, return_dict=False)
            h = pipe.unet(x_in, t, encoder_hidden_states=hidden, down_block_additional_residuals=down,
                          mid_block_additional_residual=mid, return_dict=False)[0]
            ti = int(torch.round(t.float()).long())
            x0_prd = sqrt_recip[ti] * x_in - sqrt_recipm1[ti] * h
            x0 = x0_prd * mlat + origin * (1 - mlat)
            eps = (sqrt_recip[ti] * x_in - x0) / sqrt_recipm1[ti]
            h = eps * w + h * (1 - w)
            u, c = h.chunk(2)
            latents = sched.step(u + case["cfg"] * (c - u), t, latents).prev_sample
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    x = (image / 2 + 0.5).clamp(0, 1)[0].numpy()
    k = 7
    mm = m.astype(np.float32) / 255.0
    mm = I.cv2.dilate(mm, np.ones((k, k), dtype=np.uint8))
    mm = I.cv2.blur(mm, (k, k))[None]
    r = img.astype(np.float32).transpose(2, 0, 1) / 255.0
    x = np.clip(mm * np.clip(x, 0, 1) + (1 - mm) * r, 0, 1)
    return (x.transpose(1, 2, 0)[None] * 255).round().astype(np.uint8)


def main() -> None:
    from lama_helpers import BLOCKS, NGF, make_lama

    torch.set_num_threads(1)
    folder = I.G.OUT / "tiny-sd15-controlnet"
    I.G.write_tokenizer = I.M._tokenizer_from(folder)
    pipe = I.G.build("sd15")
    nets = {name: I.C.make_controlnet(pipe.unet, 40 + i) for i, name in enumerate(I.C.CONTROLNETS)}
    I.M.check_nets(pipe, nets, "sd15", folder)
    img, m = I.picture(), I.mask()
    cls, cfg = ref_lama._generator_class(ref_lama.EXTENSION)
    lama = cls(**ref_lama._kwargs(cfg, NGF, BLOCKS)).eval()
    lama.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in make_lama().items()}, strict=True)
    filled, _, _ = ref_lama.lama_inpaint(np.concatenate([img, m[:, :, None]], axis=2), lama)
    print("LaMa changed", int((filled[:, :, :3] != img).any(axis=2).sum()), "pixels of", SIZE * SIZE)
    case = dict(name="inpaint_only+lama/txt2img", prompt=I.G.PROMPT, negative_prompt=I.G.NEGATIVE, steps=8, cfg=7.0,
                width=SIZE, height=SIZE, sampler="Euler", controlnet="controlnet", seed=105,
                preprocessor="inpaint_only+lama", scale=1.0)
    image = run_lama(pipe, nets["controlnet"], case, filled[:, :, :3], m)
    plain = run_lama(pipe, nets["controlnet"], case, filled[:, :, :3], m, lean=False)
    only = run_lama(pipe, nets["controlnet"], case, img, m, lean=False)
    print("without the noise hack: max diff", int(np.abs(plain.astype(int) - image.astype(int)).max()))
    print("inpaint_only (no fill, no hack): max diff", int(np.abs(only.astype(int) - image.astype(int)).max()))
    (folder / "lama.json").write_text(json.dumps([case], indent=1) + "\n")
    np.savez_compressed(folder / "lama.npz", filled=filled, image=image, without_lean=plain)


if __name__ == "__main__":
    main()
