"""References for ControlNet's control modes and guess mode on the tiny ControlNet folders (SD 1.x and SDXL).

    /work/refvenv/bin/python scripts/gen_controlnet_mode_refs.py   # tests/data/pipelines/tiny-*-controlnet/modes.*

The folders stay as ``gen_controlnet_refs.py`` made them: this script rebuilds the same torch models
(``gen_pipeline_refs.build`` and ``gen_controlnet_refs.make_controlnet`` are seeded), checks them against the
torch outputs stored in ``parts.npz``, and writes ``modes.json`` (the cases) and ``modes.npz`` (uint8 images).

- diffusers' guess mode: ``StableDiffusionControlNetPipeline`` / ``StableDiffusionXLControlNetPipeline`` with
  ``guess_mode=True`` (one net, and two nets through ``MultiControlNetModel``), Euler, 8 steps, CFG 7.
- sd-webui-controlnet's control modes (``scripts/hook.py``, ``UnetHook.forward``): a step-by-step loop here
  around diffusers' ``UNet2DConditionModel`` and ``ControlNetModel`` (run at ``conditioning_scale=1``) with
  diffusers' ``EulerDiscreteScheduler``, the same prompt encoding, noise and VAE as the pipeline. Each unit's
  outputs (down residuals, then mid) are, as the extension computes them:

  - ``soft_injection`` (any mode but "Balanced"): multiplied by ``weight * 0.825 ** (12 - i)``, the list of 13
    zipped with the outputs from the first (SDXL: the list cut to 10 first); "Balanced": by ``weight``;
  - ``cfg_injection`` ("ControlNet is more important"): multiplied by the cond mark first (0 for the rows of
    the negative prompt, 1 for the prompt's), the net having run on every row;
  - a unit is off while ``step / steps`` is outside ``[start, end]`` (the extension's rule; the cases' windows
    pick the same steps as diffusers' rule, which sdrt uses);
  - the units' outputs are summed and given to the UNet.

  The loop run with every unit "Balanced" must give the diffusers pipeline's image of the same case (checked
  here: within 2 levels), so the loop itself is diffusers' algorithm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]  # as gen_pipeline_refs: the venv's one does not load

import gen_controlnet_refs as C  # noqa: E402
import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import EulerDiscreteScheduler  # noqa: E402

SIZE = G.SIZE
MODES = ("Balanced", "My prompt is more important", "ControlNet is more important")


def cases_for(kind: str) -> list[dict]:
    base = dict(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, steps=8, cfg=7.0, width=SIZE, height=SIZE,
                sampler="Euler")
    one = dict(controlnets=["controlnet"], control_images=["edges"], scale=[1.0], start=[0.0], end=[1.0])
    return [
        dict(base, name="guess mode", seed=101, guess_mode=True, control_mode=["Balanced"], **one),
        dict(base, name="guess mode/two nets", seed=103, guess_mode=True, controlnets=["controlnet", "controlnet_2"],
             control_images=["edges", "scribble"], scale=[0.9, 0.6], start=[0.0, 0.1], end=[1.0, 0.8],
             control_mode=["Balanced", "Balanced"]),
        dict(base, name="My prompt is more important", seed=101, guess_mode=False, control_mode=[MODES[1]], **one),
        dict(base, name="ControlNet is more important", seed=101, guess_mode=False, control_mode=[MODES[2]], **one),
        dict(base, name="ControlNet is more important/weight 0.7 from 0.25", seed=102, guess_mode=False,
             controlnets=["controlnet_2"], control_images=["scribble"], scale=[0.7], start=[0.25], end=[1.0],
             control_mode=[MODES[2]]),
        dict(base, name="two units/Balanced + ControlNet is more important", seed=103, guess_mode=False,
             controlnets=["controlnet", "controlnet_2"], control_images=["edges", "scribble"], scale=[0.9, 0.6],
             start=[0.0, 0.25], end=[1.0, 1.0], control_mode=[MODES[0], MODES[2]]),
        dict(base, name="two units/My prompt is more important + Balanced", seed=104, guess_mode=False,
             controlnets=["controlnet", "controlnet_2"], control_images=["edges", "scribble"], scale=[1.0, 0.5],
             start=[0.0, 0.0], end=[1.0, 1.0], control_mode=[MODES[1], MODES[0]]),
    ]


def run_diffusers(pipe, nets, case: dict, images) -> np.ndarray:
    """diffusers' own pipeline (guess mode as asked)."""
    return _pipeline_case(pipe, nets, case, images, guess_mode=case["guess_mode"])


def _pipeline_case(pipe, nets, case, images, guess_mode: bool) -> np.ndarray:
    from PIL import Image

    chosen = [nets[n] for n in case["controlnets"]]
    ctrl = [Image.fromarray(images[k]) for k in case["control_images"]]
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    comps = {k: v for k, v in pipe.components.items() if k != "controlnet"}
    single = len(chosen) == 1
    cls = C.StableDiffusionXLControlNetPipeline if isinstance(pipe, G.StableDiffusionXLPipeline) \
        else C.StableDiffusionControlNetPipeline
    p = cls(**{**comps, "scheduler": sched}, controlnet=chosen[0] if single else chosen)
    p.set_progress_bar_config(disable=True)
    pick = (lambda v: v[0]) if single else (lambda v: v)
    result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=pick(ctrl),
               num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=case["height"],
               width=case["width"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
               controlnet_conditioning_scale=pick(case["scale"]), control_guidance_start=pick(case["start"]),
               control_guidance_end=pick(case["end"]), guess_mode=guess_mode, output_type="np")
    return (result.images * 255).round().astype(np.uint8)


def run_extension(pipe, nets, case: dict, images) -> np.ndarray:
    """The extension's control modes, step by step around diffusers' UNet and ControlNetModel (module doc)."""
    xl = isinstance(pipe, G.StableDiffusionXLPipeline)
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(case["steps"])
    with torch.no_grad():
        if xl:
            pe, npe, pooled, npooled = pipe.encode_prompt(case["prompt"], negative_prompt=case["negative_prompt"],
                                                          do_classifier_free_guidance=True)
            time_ids = torch.tensor([[SIZE, SIZE, 0, 0, SIZE, SIZE]] * 2, dtype=torch.float32)
            added = {"text_embeds": torch.cat([npooled, pooled]), "time_ids": time_ids}
        else:
            pe, npe = pipe.encode_prompt(case["prompt"], "cpu", 1, True, negative_prompt=case["negative_prompt"])
            added = None
        hidden = torch.cat([npe, pe])
        cond_mark = torch.tensor([0.0, 1.0]).reshape(2, 1, 1, 1)  # rows [uncond, cond]
        g = torch.Generator("cpu").manual_seed(case["seed"])
        latents = torch.randn((1, 4, SIZE // 8, SIZE // 8), generator=g) * sched.init_noise_sigma
        hints = [torch.from_numpy(images[k]).permute(2, 0, 1)[None].float().div(255).repeat(2, 1, 1, 1)
                 for k in case["control_images"]]
        n = len(sched.timesteps)
        for i, t in enumerate(sched.timesteps):
            x_in = sched.scale_model_input(torch.cat([latents] * 2), t)
            total = None
            for name, hint, weight, start, end, mode in zip(case["controlnets"], hints, case["scale"], case["start"],
                                                            case["end"], case["control_mode"]):
                if i / n < start or i / n > end:  # the extension's guidance_stopped
                    continue
                down, mid = nets[name](x_in, t, encoder_hidden_states=hidden, controlnet_cond=hint,
                                       conditioning_scale=1.0, added_cond_kwargs=added, guess_mode=False,
                                       return_dict=False)
                control = [*down, mid]
                scales = [weight] * 13
                if mode == MODES[2]:  # cfg_injection
                    control = [c * cond_mark for c in control]
                if mode != MODES[0]:  # soft_injection
                    scales = [weight * (0.825 ** float(12 - j)) for j in range(13)]
                if xl:
                    scales = scales[:10]
                control = [c * s for c, s in zip(control, scales)]
                total = control if total is None else [a + b for a, b in zip(total, control)]
            if total is None:
                total = [torch.zeros_like(r) for r in _shapes(pipe, nets, x_in, t, hidden, added, hints[0])]
            noise = pipe.unet(x_in, t, encoder_hidden_states=hidden, added_cond_kwargs=added,
                              down_block_additional_residuals=tuple(total[:-1]),
                              mid_block_additional_residual=total[-1], return_dict=False)[0]
            u, c = noise.chunk(2)
            latents = sched.step(u + case["cfg"] * (c - u), t, latents).prev_sample
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    image = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    return (image * 255).round().astype(np.uint8)


def _shapes(pipe, nets, x_in, t, hidden, added, hint):
    net = next(iter(nets.values()))
    down, mid = net(x_in, t, encoder_hidden_states=hidden, controlnet_cond=hint, conditioning_scale=0.0,
                    added_cond_kwargs=added, return_dict=False)
    return [*down, mid]


def check_nets(pipe, nets, kind: str, folder: Path) -> None:
    """The rebuilt nets are the exported ones: their outputs on parts.npz's feeds equal the stored torch outputs."""
    z = np.load(folder / "parts.npz")
    xl = kind == "sdxl"
    feeds = {k[5:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("feed/")}
    added = {"text_embeds": feeds["text_embeds"], "time_ids": feeds["time_ids"]} if xl else None
    for name, net in nets.items():
        with torch.no_grad():
            down, mid = net(feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"],
                            feeds["controlnet_cond"], float(feeds["conditioning_scale"]), added_cond_kwargs=added,
                            return_dict=False)
        for j, r in enumerate([*down, mid]):
            key = f"{name}/down_block_res_samples_{j}" if j < len(down) else f"{name}/mid_block_res_sample"
            err = float(np.abs(r.numpy() - z[key]).max())
            assert err < 1e-5, f"{kind} {name} {key}: the rebuilt net is not the exported one ({err})"


def _tokenizer_from(folder: Path):
    """``gen_pipeline_refs.write_tokenizer`` without open_clip: the folder's own vocab.json and merges.txt (what
    that function wrote there), so ``build`` makes the same models."""
    import shutil

    def write(target: Path, pad: str):
        target.mkdir(parents=True, exist_ok=True)
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(folder / target.name / name, target / name)
        return G.write_tokenizer_configs(target, pad)

    return write


def main() -> None:
    torch.set_num_threads(1)
    images = {"edges": C.control_edges(), "scribble": C.control_scribble()}
    for kind in ("sd15", "sdxl"):
        folder = G.OUT / f"tiny-{kind}-controlnet"
        G.write_tokenizer = _tokenizer_from(folder)
        pipe = G.build(kind)
        nets = {name: C.make_controlnet(pipe.unet, 40 + i) for i, name in enumerate(C.CONTROLNETS)}
        check_nets(pipe, nets, kind, folder)
        old = np.load(folder / "refs.npz")
        old_cases = {c["name"]: c for c in json.loads((folder / "refs.json").read_text())}
        # the loop is diffusers' algorithm: all Balanced, it gives the pipeline's images
        for name in ("controlnet/scale 1.0", "controlnet/two nets"):
            case = dict(old_cases[name], control_mode=["Balanced"] * len(old_cases[name]["controlnets"]))
            if name == "controlnet/two nets":  # the extension's window rule differs at the end: full windows
                case = dict(case, end=[1.0, 1.0])
                want = _pipeline_case(pipe, nets, case, images, guess_mode=False)
            else:
                want = old[name]
            d = int(np.abs(run_extension(pipe, nets, case, images).astype(int) - want.astype(int)).max())
            print(kind, "loop, all Balanced, against diffusers' pipeline:", name, "max diff", d)
            assert d <= 2, (kind, name, d)
        refs: dict[str, np.ndarray] = {}
        cases = cases_for(kind)
        for case in cases:
            refs[case["name"]] = (run_diffusers if case["guess_mode"] else run_extension)(pipe, nets, case, images)
            balanced = (_pipeline_case(pipe, nets, case, images, guess_mode=False) if case["guess_mode"]
                        else run_extension(pipe, nets, dict(case, control_mode=["Balanced"] * len(case["scale"])),
                                           images))
            d = int(np.abs(refs[case["name"]].astype(int) - balanced.astype(int)).max())
            print(kind, case["name"], "std", round(float(refs[case["name"]].std()), 1),
                  "| against the same case all Balanced, guess mode off: max diff", d)
            assert d > 10, f"{kind} {case['name']}: the mode moves the image by {d} levels only"
        # the cfg injection matters: "My prompt" against "ControlNet is more important", the same unit
        d = int(np.abs(refs[MODES[1]].astype(int) - refs[MODES[2]].astype(int)).max())
        print(kind, "My prompt vs ControlNet is more important: max diff", d)
        assert d > 10
        d = int(np.abs(refs["guess mode"].astype(int) - refs[MODES[2]].astype(int)).max())
        print(kind, "guess mode vs ControlNet is more important: max diff", d)
        (folder / "modes.json").write_text(json.dumps(cases, indent=1) + "\n")
        np.savez_compressed(folder / "modes.npz", **refs)


if __name__ == "__main__":
    main()
