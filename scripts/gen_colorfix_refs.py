"""References for sd-webui-controlnet's ``tile_colorfix`` / ``tile_colorfix+sharp`` on tiny-sd15-controlnet.

    /work/refvenv/bin/python scripts/gen_colorfix_refs.py   # tests/data/pipelines/tiny-sd15-controlnet/colorfix.*

The folder stays as ``gen_controlnet_refs.py`` made it: the torch models are rebuilt (seeded) and checked against
``parts.npz`` as ``gen_controlnet_mode_refs.py`` does. The extension's colour fix (``scripts/hook.py``, the end of
its UNet forward) is written here in torch around diffusers' UNet, ControlNetModel, scheduler and VAE:

- the map is the picture as it is (the modules' preprocessor is ``identity``), the net's hint ``rgb / 255``;
- the picture VAE-encoded (the posterior's mean; the extension samples it) times the scaling factor;
- after every UNet call, on both CFG rows and every step (the unit's window gates the net only):
  ``x0 = (x_t - sqrt(1 - a) eps) / sqrt(a)`` at the scaled input ``x_t`` and ``a = alphas_cumprod[round(t)]``,
  ``x0 - blur(x0, k) + blur(origin, k)`` with ``blur`` the replicate-padded ``(2k+1)`` box mean and ``k`` the
  ``Variation`` (``int(threshold_a)``); ``+sharp``: on the uncond row ``x0`` becomes
  ``d * blur(x0, k) + (1 - d) * x0``, ``d = Sharpness * 0.01``; the noise recomputed from ``x0`` and mixed with
  the UNet's at the weight clipped to [0, 1];
- the net runs at the unit's weight while ``not (i / n < start or (i + 1) / n > end)`` (the rule sdrt's
  ``window="diffusers"`` uses) and at 0 otherwise;
- samplers: diffusers' ``EulerDiscreteScheduler`` (sdrt's "Euler": fractional timesteps, rounded by the fix) and
  ``DDIMScheduler`` (sdrt's "DDIM": whole timesteps, the input unscaled).

The same loop without the colour fix gives diffusers' ``StableDiffusionControlNetPipeline``'s image (checked here,
within 2 levels), so the loop is diffusers' algorithm; the colour fix moves each image by more than 10 levels,
a blur one wider moves the first case by more than 3 (checked).

``colorfix.json`` lists the cases, ``colorfix.npz`` holds the picture and the uint8 images.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_controlnet_mode_refs as M  # noqa: E402
import gen_controlnet_refs as C  # noqa: E402
import gen_inpaint_controlnet_refs as I  # noqa: E402
import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from diffusers import DDIMScheduler, EulerDiscreteScheduler, StableDiffusionControlNetPipeline  # noqa: E402

SIZE = G.SIZE
SCHEDULERS = {"Euler": EulerDiscreteScheduler, "DDIM": DDIMScheduler}


def cases() -> list[dict]:
    base = dict(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, steps=8, cfg=7.0, width=SIZE, height=SIZE,
                controlnet="controlnet", scale=1.0, start=0.0, end=1.0, low=None, high=None)
    return [dict(base, name="tile_colorfix/Euler", seed=201, sampler="Euler", preprocessor="tile_colorfix"),
            dict(base, name="tile_colorfix/variation 3 weight 0.6 window", seed=202, sampler="Euler",
                 preprocessor="tile_colorfix", low=3.0, scale=0.6, start=0.25, end=0.75),
            dict(base, name="tile_colorfix/DDIM variation 5", seed=203, sampler="DDIM", preprocessor="tile_colorfix",
                 low=5.0),
            dict(base, name="tile_colorfix+sharp/variation 3 sharpness 2", seed=204, sampler="Euler",
                 preprocessor="tile_colorfix+sharp", low=3.0, high=2.0),
            dict(base, name="tile_colorfix+sharp/DDIM defaults", seed=205, sampler="DDIM",
                 preprocessor="tile_colorfix+sharp")]


def blur(x: torch.Tensor, k: int) -> torch.Tensor:
    """The extension's blur: edges replicated by k, a (2k+1) box mean with stride 1."""
    return F.avg_pool2d(F.pad(x, (k, k, k, k), mode="replicate"), (2 * k + 1, 2 * k + 1), stride=(1, 1))


def run_colorfix(pipe, net, case: dict, img: np.ndarray, fix: bool = True, k_shift: int = 0) -> np.ndarray:
    sched = SCHEDULERS[case["sampler"]].from_config(pipe.scheduler.config)
    sched.set_timesteps(case["steps"])
    ac = sched.alphas_cumprod.double()
    sqrt_recip, sqrt_recipm1 = torch.sqrt(1.0 / ac).float(), torch.sqrt(1.0 / ac - 1).float()
    k = int(8.0 if case["low"] is None else case["low"]) + k_shift
    sharp = case["preprocessor"].endswith("+sharp")
    detail = (1.0 if case["high"] is None else case["high"]) * 0.01
    w = max(0.0, min(1.0, case["scale"]))
    n = case["steps"]
    with torch.no_grad():
        pe, npe = pipe.encode_prompt(case["prompt"], "cpu", 1, True, negative_prompt=case["negative_prompt"])
        hidden = torch.cat([npe, pe])
        mark = torch.tensor([0.0, 1.0])[:, None, None, None]  # rows [uncond, cond]: the cond mark
        g = torch.Generator("cpu").manual_seed(case["seed"])
        latents = torch.randn((1, 4, SIZE // 8, SIZE // 8), generator=g) * sched.init_noise_sigma
        hint = torch.from_numpy(img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0)
        cond = hint.repeat(2, 1, 1, 1)
        origin = pipe.vae.encode(hint * 2 - 1).latent_dist.mean * pipe.vae.config.scaling_factor
        for i, t in enumerate(sched.timesteps):
            on = not (i / n < case["start"] or (i + 1) / n > case["end"])
            x_in = sched.scale_model_input(torch.cat([latents] * 2), t)
            down, mid = net(x_in, t, encoder_hidden_states=hidden, controlnet_cond=cond,
                            conditioning_scale=case["scale"] if on else 0.0, guess_mode=False, return_dict=False)
            h = pipe.unet(x_in, t, encoder_hidden_states=hidden, down_block_additional_residuals=down,
                          mid_block_additional_residual=mid, return_dict=False)[0]
            if fix:
                ti = int(torch.round(t.float()).long())
                x0_prd = sqrt_recip[ti] * x_in - sqrt_recipm1[ti] * h
                x0 = x0_prd - blur(x0_prd, k) + blur(origin, k)
                if sharp:
                    neg = detail * blur(x0, k) + (1 - detail) * x0
                    x0 = mark * x0 + (1 - mark) * neg
                eps = (sqrt_recip[ti] * x_in - x0) / sqrt_recipm1[ti]
                h = eps * w + h * (1 - w)
            u, c = h.chunk(2)
            latents = sched.step(u + case["cfg"] * (c - u), t, latents).prev_sample
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    x = (image / 2 + 0.5).clamp(0, 1)[0].numpy()
    return (x.transpose(1, 2, 0)[None] * 255).round().astype(np.uint8)


def run_pipeline(pipe, net, case: dict, img: np.ndarray) -> np.ndarray:
    """diffusers' own pipeline (no colour fix), the picture as the control image."""
    comps = {k: v for k, v in pipe.components.items() if k != "controlnet"}
    p = StableDiffusionControlNetPipeline(**{**comps, "scheduler": SCHEDULERS[case["sampler"]].from_config(
        pipe.scheduler.config)}, controlnet=net)
    p.set_progress_bar_config(disable=True)
    hint = torch.from_numpy(img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0)
    out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=hint,
            num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=SIZE, width=SIZE,
            generator=torch.Generator("cpu").manual_seed(case["seed"]), controlnet_conditioning_scale=case["scale"],
            control_guidance_start=case["start"], control_guidance_end=case["end"], output_type="np")
    return (out.images * 255).round().astype(np.uint8)


def _diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(int) - b.astype(int)).max())


def main() -> None:
    torch.set_num_threads(1)
    folder = G.OUT / "tiny-sd15-controlnet"
    G.write_tokenizer = M._tokenizer_from(folder)
    pipe = G.build("sd15")
    nets = {name: C.make_controlnet(pipe.unet, 40 + i) for i, name in enumerate(C.CONTROLNETS)}
    M.check_nets(pipe, nets, "sd15", folder)
    img = I.picture()
    refs: dict[str, np.ndarray] = {"picture": img}
    all_cases = cases()
    for case in all_cases:
        net = nets[case["controlnet"]]
        refs[case["name"]] = run_colorfix(pipe, net, case, img)
        plain = run_colorfix(pipe, net, case, img, fix=False)
        d_pipe = _diff(plain, run_pipeline(pipe, net, case, img))
        d_fix = _diff(plain, refs[case["name"]])
        print(case["name"], "| loop without the fix against diffusers' pipeline:", d_pipe, "| the fix moves it:", d_fix)
        assert d_pipe <= 2, d_pipe
        assert d_fix > 10, d_fix
    first = all_cases[0]
    d = _diff(run_colorfix(pipe, nets["controlnet"], first, img, k_shift=1), refs[first["name"]])
    print("a blur one wider:", d)
    assert d > 3, d
    (folder / "colorfix.json").write_text(json.dumps(all_cases, indent=1) + "\n")
    np.savez_compressed(folder / "colorfix.npz", **refs)


if __name__ == "__main__":
    main()
