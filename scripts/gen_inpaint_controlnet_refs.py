"""References for ControlNet inpainting (sd-webui-controlnet's inpaint / inpaint_only) on tiny-sd15-controlnet.

    /work/refvenv/bin/python scripts/gen_inpaint_controlnet_refs.py   # tests/data/pipelines/tiny-sd15-controlnet/inpaint.*

The folder stays as ``gen_controlnet_refs.py`` made it: the torch models are rebuilt (seeded) and checked against
``parts.npz`` as ``gen_controlnet_mode_refs.py`` does. The hint is diffusers' ``make_inpaint_condition`` (the
picture in [0, 1], -1 where the mask is above 0.5), fed as a tensor:

- ``inpaint/txt2img``: ``StableDiffusionControlNetPipeline`` with that hint (Euler, 8 steps, CFG 7);
- ``inpaint/img2img mask``: ``StableDiffusionControlNetInpaintPipeline`` (a plain 4-channel UNet, strength 0.75),
  the picture as init image, the mask as the run's and the hint made from both;
- ``inpaint_only/txt2img``: sd-webui-controlnet's ``inpaint_only`` (``scripts/hook.py``'s restore after every UNet
  call, ``scripts/controlnet.py``'s pixel post-processing), written here in torch around diffusers' UNet,
  ControlNetModel, EulerDiscreteScheduler and VAE (the same loop without the restore gives the pipeline's image of
  the first case: checked, within 2 levels); the picture's latent is the VAE's mean (the extension samples);
  the pixel blend uses OpenCV's ``dilate`` and ``blur`` as the extension;
- ``inpaint_only/weight 0.5``: the same at weight 0.5 (the restore mixed at the weight).

``inpaint.json`` lists the cases, ``inpaint.npz`` holds the picture, the mask and the uint8 images;
``inpaint_maps.npz`` the extension's resized maps (``detectmap_proc`` with OpenCV, float32) of the picture and mask
at six sizes and modes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]

import cv2  # noqa: E402
import gen_controlnet_mode_refs as M  # noqa: E402
import gen_controlnet_refs as C  # noqa: E402
import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    EulerDiscreteScheduler,
    StableDiffusionControlNetInpaintPipeline,
    StableDiffusionControlNetPipeline,
)

SIZE = G.SIZE


def picture() -> np.ndarray:
    """A smooth colour field with a darker disc: many colours, so maps resize as photos do."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    img = np.stack([40 + 3 * xx, 60 + 2.5 * yy, 200 - 1.5 * (xx + yy)], axis=2)
    img[(yy - 40) ** 2 + (xx - 22) ** 2 < 120] *= 0.4
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def mask() -> np.ndarray:
    m = np.zeros((SIZE, SIZE), np.uint8)
    m[12:40, 20:52] = 255
    return m


def make_hint(img: np.ndarray, m: np.ndarray) -> torch.Tensor:
    """diffusers' docs' ``make_inpaint_condition``."""
    x = img.astype(np.float32) / 255.0
    x[m.astype(np.float32) / 255.0 > 0.5] = -1.0
    return torch.from_numpy(x.transpose(2, 0, 1)[None].copy())


def cases() -> list[dict]:
    base = dict(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, steps=8, cfg=7.0, width=SIZE, height=SIZE,
                sampler="Euler", controlnet="controlnet")
    return [dict(base, name="inpaint/txt2img", seed=101, preprocessor="inpaint", scale=1.0),
            dict(base, name="inpaint/img2img mask", seed=102, preprocessor="inpaint", scale=1.0, strength=0.75),
            dict(base, name="inpaint_only/txt2img", seed=103, preprocessor="inpaint_only", scale=1.0),
            dict(base, name="inpaint_only/weight 0.5", seed=104, preprocessor="inpaint_only", scale=0.5)]


def _comps(pipe):
    return {k: v for k, v in pipe.components.items() if k != "controlnet"}


def run_txt2img(pipe, net, case, hint) -> np.ndarray:
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    p = StableDiffusionControlNetPipeline(**{**_comps(pipe), "scheduler": sched}, controlnet=net)
    p.set_progress_bar_config(disable=True)
    out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=hint,
            num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=SIZE, width=SIZE,
            generator=torch.Generator("cpu").manual_seed(case["seed"]), controlnet_conditioning_scale=case["scale"],
            output_type="np")
    return (out.images * 255).round().astype(np.uint8)


def run_img2img_mask(pipe, net, case, img, m, hint) -> np.ndarray:
    from PIL import Image

    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    p = StableDiffusionControlNetInpaintPipeline(**{**_comps(pipe), "scheduler": sched}, controlnet=net)
    p.set_progress_bar_config(disable=True)
    out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=Image.fromarray(img),
            mask_image=Image.fromarray(m), control_image=hint, strength=case["strength"],
            num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=SIZE, width=SIZE,
            generator=torch.Generator("cpu").manual_seed(case["seed"]), controlnet_conditioning_scale=case["scale"],
            output_type="np")
    return (out.images * 255).round().astype(np.uint8)


def run_inpaint_only(pipe, net, case, img, m, hint, restore: bool = True) -> np.ndarray:
    """The extension's inpaint_only: the hint to the net; after the UNet, on every row and step, x0 predicted from
    the noise at the DDPM x_t (the scaled input) and the rounded timestep, the picture's latent put back outside the
    max-pooled mask, the noise recomputed and mixed at the weight; the decoded image blended with the picture."""
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(case["steps"])
    ac = sched.alphas_cumprod.double()
    sqrt_recip, sqrt_recipm1 = torch.sqrt(1.0 / ac).float(), torch.sqrt(1.0 / ac - 1).float()
    w = max(0.0, min(1.0, case["scale"]))
    with torch.no_grad():
        pe, npe = pipe.encode_prompt(case["prompt"], "cpu", 1, True, negative_prompt=case["negative_prompt"])
        hidden = torch.cat([npe, pe])
        g = torch.Generator("cpu").manual_seed(case["seed"])
        latents = torch.randn((1, 4, SIZE // 8, SIZE // 8), generator=g) * sched.init_noise_sigma
        cond = hint.repeat(2, 1, 1, 1)
        raw = torch.from_numpy(img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0)
        origin = pipe.vae.encode(raw * 2 - 1).latent_dist.mean * pipe.vae.config.scaling_factor
        mpix = torch.from_numpy(m.astype(np.float32)[None, None] / 255.0)
        mlat = torch.nn.functional.max_pool2d(mpix, (10, 10), stride=(8, 8), padding=1)
        for t in sched.timesteps:
            x_in = sched.scale_model_input(torch.cat([latents] * 2), t)
            down, mid = net(x_in, t, encoder_hidden_states=hidden, controlnet_cond=cond,
                            conditioning_scale=case["scale"], guess_mode=False, return_dict=False)
            h = pipe.unet(x_in, t, encoder_hidden_states=hidden, down_block_additional_residuals=down,
                          mid_block_additional_residual=mid, return_dict=False)[0]
            if restore:
                ti = int(torch.round(t.float()).long())
                x0_prd = sqrt_recip[ti] * x_in - sqrt_recipm1[ti] * h
                x0 = x0_prd * mlat + origin * (1 - mlat)
                eps = (sqrt_recip[ti] * x_in - x0) / sqrt_recipm1[ti]
                h = eps * w + h * (1 - w)
            u, c = h.chunk(2)
            latents = sched.step(u + case["cfg"] * (c - u), t, latents).prev_sample
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    x = (image / 2 + 0.5).clamp(0, 1)[0].numpy()  # CHW in [0, 1], as the extension's post-processors see it
    if restore:
        k = 7  # control_net_inpaint_blur_sigma
        mm = m.astype(np.float32) / 255.0
        mm = cv2.dilate(mm, np.ones((k, k), dtype=np.uint8))
        mm = cv2.blur(mm, (k, k))[None]
        r = img.astype(np.float32).transpose(2, 0, 1) / 255.0
        x = np.clip(mm * np.clip(x, 0, 1) + (1 - mm) * r, 0, 1)
    return (x.transpose(1, 2, 0)[None] * 255).round().astype(np.uint8)


def extension_map(rgba: np.ndarray, w: int, h: int, mode: str) -> np.ndarray:
    """The extension's ``detectmap_proc`` of an inpaint map (``scripts/controlnet.py``): float32, its
    ``high_quality_resize`` (the interpolation picked from the picture's colours, the alpha resized with it, then
    ``> 127`` -> 255) and its three resize modes, with OpenCV as the extension calls it."""
    x = rgba.astype(np.float32)

    def hq(a: np.ndarray, size: tuple[int, int]) -> np.ndarray:
        mask, a = a[:, :, 3], a[:, :, :3]
        if a.shape[0] != size[1] or a.shape[1] != size[0]:
            smaller = size[0] * size[1] < a.shape[0] * a.shape[1]
            colours = len(np.unique(a.reshape(-1, 3), axis=0))
            assert not (colours == 2 and a.min() < 16 and a.max() > 240)  # (the binary branch: not this picture)
            interp = cv2.INTER_NEAREST if 2 < colours < 200 else cv2.INTER_AREA if smaller else cv2.INTER_CUBIC
            a = cv2.resize(a, size, interpolation=interp)
            mask = cv2.resize(mask, size, interpolation=interp)
        mask = ((mask > 127).astype(np.float32) * 255.0)[:, :, None].clip(0, 255).astype(np.uint8)
        return np.concatenate([a, mask], axis=2)

    if mode == "Just Resize":
        return hq(x, (w, h))
    oh, ow = x.shape[:2]
    k0, k1 = h / oh, w / ow
    if mode == "Resize and Fill":
        k = min(k0, k1)
        borders = np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]], axis=0)
        colour = np.median(borders, axis=0).astype(x.dtype)
        colour[3] = 255
        out = np.tile(colour[None, None], [h, w, 1])
        small = hq(x, (int(np.round(ow * k)), int(np.round(oh * k))))
        nh, nw = small.shape[:2]
        ph, pw = max(0, (h - nh) // 2), max(0, (w - nw) // 2)
        out[ph:ph + nh, pw:pw + nw] = small
        return out
    k = max(k0, k1)
    big = hq(x, (int(np.round(ow * k)), int(np.round(oh * k))))
    nh, nw = big.shape[:2]
    ph, pw = max(0, (nh - h) // 2), max(0, (nw - w) // 2)
    return big[ph:ph + h, pw:pw + w]


MAP_CASES = [(96, 80, "Just Resize"), (40, 48, "Just Resize"), (96, 80, "Crop and Resize"), (40, 56, "Crop and Resize"),
             (96, 64, "Resize and Fill"), (48, 32, "Resize and Fill")]


def write_maps(folder: Path) -> None:
    """``inpaint_maps.npz``: the extension's resized maps of the picture and mask (float32 RGB and uint8 alpha)."""
    rgba = np.concatenate([picture(), mask()[:, :, None]], axis=2)
    maps = {f"{w}x{h}/{mode}": extension_map(rgba, w, h, mode) for w, h, mode in MAP_CASES}
    np.savez_compressed(folder / "inpaint_maps.npz", **maps)


def main() -> None:
    torch.set_num_threads(1)
    folder = G.OUT / "tiny-sd15-controlnet"
    G.write_tokenizer = M._tokenizer_from(folder)
    pipe = G.build("sd15")
    nets = {name: C.make_controlnet(pipe.unet, 40 + i) for i, name in enumerate(C.CONTROLNETS)}
    M.check_nets(pipe, nets, "sd15", folder)
    img, m = picture(), mask()
    hint = make_hint(img, m)
    refs: dict[str, np.ndarray] = {"picture": img, "mask": m}
    all_cases = cases()
    for case in all_cases:
        net = nets[case["controlnet"]]
        if case["preprocessor"] == "inpaint_only":
            refs[case["name"]] = run_inpaint_only(pipe, net, case, img, m, hint)
        elif "strength" in case:
            refs[case["name"]] = run_img2img_mask(pipe, net, case, img, m, hint)
        else:
            refs[case["name"]] = run_txt2img(pipe, net, case, hint)
        print(case["name"], "std", round(float(refs[case["name"]].std()), 1))
    # the loop is diffusers' algorithm: without the restore it gives the pipeline's image
    first = all_cases[0]
    loop = run_inpaint_only(pipe, nets["controlnet"], first, img, m, hint, restore=False)
    d = int(np.abs(loop.astype(int) - refs[first["name"]].astype(int)).max())
    print("loop without the restore against diffusers' pipeline: max diff", d)
    assert d <= 2, d
    # the -1 matters: the hint without it (the plain picture) moves the image
    plain = run_txt2img(pipe, nets["controlnet"], first, make_hint(img, np.zeros_like(m)))
    d = int(np.abs(plain.astype(int) - refs[first["name"]].astype(int)).max())
    print("hint without the mask against with: max diff", d)
    assert d > 10, d
    # the restore matters
    only = all_cases[2]
    d = int(np.abs(run_inpaint_only(pipe, nets["controlnet"], only, img, m, hint, restore=False).astype(int)
                   - refs[only["name"]].astype(int)).max())
    print("inpaint_only without its restore and blend: max diff", d)
    assert d > 10, d
    (folder / "inpaint.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(folder / "inpaint.npz", **refs)
    write_maps(folder)


if __name__ == "__main__":
    main()
