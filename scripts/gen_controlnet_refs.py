"""Build tiny ControlNet model folders (SD 1.x and SDXL) with diffusers, export them to ONNX, save references.

    /work/refvenv/bin/python scripts/gen_controlnet_refs.py      # tests/data/pipelines/tiny-{sd15,sdxl}-controlnet

Each folder is a whole tiny pipeline made by ``gen_pipeline_refs.build`` (the same tiny SD 1.x / SDXL
configs and random weights as tiny-sd15 and tiny-sdxl), plus two ControlNets made from its UNet with
``ControlNetModel.from_unet``. ControlNet's zero convolutions (``controlnet_down_blocks``,
``controlnet_mid_block``, the conditioning embedding's ``conv_out``) start at zero, which would make a
test unable to fail; here they are re-drawn at random so every residual is non-zero. The conditioning
embedding's ``conv_out`` is drawn ``COND_GAIN`` times larger, so that the control image itself moves the
image by tens of levels (drawn at the plain scale, two different control images gave images 2 levels
apart: a pipeline that fed the wrong image would have passed); the script checks that it does.

The layout is the one diffusers' community ONNX/TensorRT ControlNet scripts use, with the part split:

- ``controlnet/model.onnx`` (and ``controlnet_2/``): inputs ``sample``, ``timestep``,
  ``encoder_hidden_states``, ``controlnet_cond`` (the control image, RGB in [0, 1], NCHW at the output
  size), ``conditioning_scale`` (a float scalar), and for SDXL ``text_embeds`` and ``time_ids``;
  outputs ``down_block_res_samples_0..N`` and ``mid_block_res_sample``, already multiplied by the scale;
- ``unet/model.onnx``: the UNet's usual inputs plus ``down_block_additional_residual_0..N`` and
  ``mid_block_additional_residual`` (zeros for a step without ControlNet), output ``out_sample``.

References: diffusers' ``StableDiffusionControlNetPipeline`` / ``StableDiffusionXLControlNetPipeline``
(guess mode off) with ``torch.Generator("cpu").manual_seed(seed)`` and Euler: two conditioning scales,
a ``control_guidance_start``/``end`` window, and two ControlNets at once (``MultiControlNetModel``).
``refs.json`` lists the cases, ``refs.npz`` the uint8 images and control images. ``parts.npz`` holds
fixed feeds and the torch outputs of each exported part, to check every backend part by part. Each case
is also replayed with the exported ControlNets and UNet on onnxruntime (``replay_with_onnx``); the
script fails if that image is more than 2 levels from diffusers'.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]  # as gen_pipeline_refs: the venv's one does not load

import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    ControlNetModel,
    EulerDiscreteScheduler,
    StableDiffusionControlNetPipeline,
    StableDiffusionXLControlNetPipeline,
)
from PIL import Image  # noqa: E402

SIZE = G.SIZE
CONTROLNETS = ("controlnet", "controlnet_2")
#: the conditioning embedding's output drawn this much larger, so that the control image matters
COND_GAIN = 20.0


def control_edges() -> np.ndarray:
    """White one-pixel outlines of a rectangle and a circle on black, like a canny map."""
    img = np.zeros((SIZE, SIZE), np.uint8)
    img[14, 10:50] = img[42, 10:50] = 255
    img[14:43, 10] = img[14:43, 49] = 255
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    r = np.sqrt((yy - 46.0) ** 2 + (xx - 40.0) ** 2)
    img[np.abs(r - 11) < 0.6] = 255
    return np.repeat(img[:, :, None], 3, axis=2)


def control_scribble() -> np.ndarray:
    """A filled diagonal band and a blob, white on black, like a scribble map."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    img = ((np.abs(yy - xx) < 5) | ((yy - 16) ** 2 + (xx - 48) ** 2 < 64)).astype(np.uint8) * 255
    return np.repeat(img[:, :, None], 3, axis=2)


def make_controlnet(unet, seed: int) -> ControlNetModel:
    net = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 8, 8, 8)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            zero = name.startswith(("controlnet_down_blocks", "controlnet_mid_block", "controlnet_cond_embedding"))
            if not zero:
                continue
            gain = COND_GAIN if name.startswith("controlnet_cond_embedding.conv_out") else 1.0
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5 * gain)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05 * gain)
    for name, p in net.named_parameters():
        if name.startswith(("controlnet_down_blocks", "controlnet_mid_block")):
            assert float(p.detach().abs().max()) > 0, f"{name} is still zero"
    return net


# ---------------------------------------------------------------- export
class _ControlNet(torch.nn.Module):
    def __init__(self, net: ControlNetModel, xl: bool) -> None:
        super().__init__()
        self.net, self.xl = net, xl

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale,
                text_embeds=None, time_ids=None):
        added = {"text_embeds": text_embeds, "time_ids": time_ids} if self.xl else None
        down, mid = self.net(sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale,
                             added_cond_kwargs=added, guess_mode=False, return_dict=False)
        return (*down, mid)


class _UnetWithResiduals(torch.nn.Module):
    def __init__(self, unet, xl: bool, n_down: int) -> None:
        super().__init__()
        self.unet, self.xl, self.n_down = unet, xl, n_down

    def forward(self, sample, timestep, encoder_hidden_states, *rest):
        if self.xl:
            text_embeds, time_ids, *res = rest
            added = {"text_embeds": text_embeds, "time_ids": time_ids}
        else:
            res, added = list(rest), None
        down, mid = tuple(res[: self.n_down]), res[self.n_down]
        return self.unet(sample, timestep, encoder_hidden_states, added_cond_kwargs=added,
                         down_block_additional_residuals=down, mid_block_additional_residual=mid,
                         return_dict=False)[0]


def _feeds(pipe, xl: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    lat = SIZE // 8
    feeds = {"sample": torch.randn(2, 4, lat, lat, generator=g),
             "timestep": torch.tensor(601.0) if xl else torch.tensor([601.0, 601.0]),
             "encoder_hidden_states": torch.randn(2, 77, pipe.unet.config.cross_attention_dim, generator=g)}
    if xl:
        feeds["text_embeds"] = torch.randn(2, 32, generator=g)
        feeds["time_ids"] = torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * 2)
    return feeds


def export_controlnets(pipe, nets: list[ControlNetModel], kind: str, out: Path) -> dict[str, np.ndarray]:
    xl = kind == "sdxl"
    batch = {0: "batch"}
    seq = {0: "batch", 1: "sequence"}
    feeds = _feeds(pipe, xl)
    cond = torch.from_numpy(control_edges()).permute(2, 0, 1)[None].float().div(255).repeat(2, 1, 1, 1)
    scale = torch.tensor(0.8)
    parts: dict[str, np.ndarray] = {f"feed/{k}": v.numpy() for k, v in feeds.items()}
    parts["feed/controlnet_cond"] = cond.numpy()
    parts["feed/conditioning_scale"] = scale.numpy()
    extra = ["text_embeds", "time_ids"] if xl else []
    residuals = None
    for name, net in zip(CONTROLNETS, nets):
        wrapper = _ControlNet(net, xl)
        args = (feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"], cond, scale,
                *[feeds[k] for k in extra])
        with torch.no_grad():
            outs = wrapper(*args)
        n_down = len(outs) - 1
        out_names = [f"down_block_res_samples_{i}" for i in range(n_down)] + ["mid_block_res_sample"]
        in_names = ["sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale", *extra]
        dyn = {"sample": batch, "encoder_hidden_states": seq, "controlnet_cond": batch,
               **{k: batch for k in extra}, **{k: batch for k in out_names}}
        if not xl:
            dyn["timestep"] = batch
        G._export(wrapper, args, out / name / "model.onnx", in_names, out_names, dyn, external=True)
        net.save_config(out / name)
        for n, o in zip(out_names, outs):
            parts[f"{name}/{n}"] = o.numpy()
        if residuals is None:
            residuals = outs
    # the UNet that takes the residuals
    n_down = len(residuals) - 1
    res_names = [f"down_block_additional_residual_{i}" for i in range(n_down)] + ["mid_block_additional_residual"]
    wrapper = _UnetWithResiduals(pipe.unet, xl, n_down)
    args = (feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"], *[feeds[k] for k in extra],
            *residuals)
    in_names = ["sample", "timestep", "encoder_hidden_states", *extra, *res_names]
    dyn = {"sample": batch, "encoder_hidden_states": seq, "out_sample": batch, **{k: batch for k in extra},
           **{k: batch for k in res_names}}
    if not xl:
        dyn["timestep"] = batch
    (out / "unet" / "model.onnx_data").unlink(missing_ok=True)  # onnx appends to an existing data file
    G._export(wrapper, args, out / "unet" / "model.onnx", in_names, ["out_sample"], dyn, external=True)
    with torch.no_grad():
        parts["unet/out_sample"] = wrapper(*args).numpy()
        # the same UNet with zero residuals is the plain UNet
        zeros = [torch.zeros_like(r) for r in residuals]
        plain = wrapper(*args[: len(args) - len(residuals)], *zeros)
        extra_kw = ({"added_cond_kwargs": {"text_embeds": feeds["text_embeds"], "time_ids": feeds["time_ids"]}}
                    if xl else {})
        direct = pipe.unet(feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"], return_dict=False,
                           **extra_kw)[0]
        assert torch.allclose(plain, direct, atol=1e-5)
    for i, r in enumerate(residuals[:-1]):
        parts[f"unet/feed/down_block_additional_residual_{i}"] = r.numpy()
    parts["unet/feed/mid_block_additional_residual"] = residuals[-1].numpy()
    return parts


# ---------------------------------------------------------------- references
def cases_for(kind: str) -> list[dict]:
    base = dict(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, steps=8, cfg=7.0, width=SIZE, height=SIZE,
                sampler="Euler", guess_mode=False)
    return [
        dict(base, name="controlnet/scale 1.0", seed=101, controlnets=["controlnet"], control_images=["edges"],
             scale=[1.0], start=[0.0], end=[1.0]),
        dict(base, name="controlnet/scale 0.5", seed=101, controlnets=["controlnet"], control_images=["edges"],
             scale=[0.5], start=[0.0], end=[1.0]),
        dict(base, name="controlnet/window 0.25-0.75", seed=102, controlnets=["controlnet"],
             control_images=["edges"], scale=[1.0], start=[0.25], end=[0.75]),
        dict(base, name="controlnet/two nets", seed=103, controlnets=["controlnet", "controlnet_2"],
             control_images=["edges", "scribble"], scale=[0.9, 0.6], start=[0.0, 0.1], end=[1.0, 0.8]),
    ]


def run_case(pipe, nets: dict[str, ControlNetModel], case: dict, images: dict[str, np.ndarray]) -> np.ndarray:
    chosen = [nets[n] for n in case["controlnets"]]
    ctrl = [Image.fromarray(images[k]) for k in case["control_images"]]
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    comps = {k: v for k, v in pipe.components.items() if k not in ("controlnet",)}
    single = len(chosen) == 1
    if isinstance(pipe, G.StableDiffusionXLPipeline):
        p = StableDiffusionXLControlNetPipeline(**{**comps, "scheduler": sched},
                                                controlnet=chosen[0] if single else chosen)
    else:
        p = StableDiffusionControlNetPipeline(**{**comps, "scheduler": sched},
                                              controlnet=chosen[0] if single else chosen)
    p.set_progress_bar_config(disable=True)
    result = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=ctrl[0] if single else ctrl,
               num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=case["height"],
               width=case["width"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
               controlnet_conditioning_scale=case["scale"][0] if single else case["scale"],
               control_guidance_start=case["start"][0] if single else case["start"],
               control_guidance_end=case["end"][0] if single else case["end"], guess_mode=False, output_type="np")
    return (result.images * 255).round().astype(np.uint8)


def replay_with_onnx(pipe, folder: Path, case: dict, images: dict[str, np.ndarray]) -> np.ndarray:
    """The case again, the ControlNets and UNet run from the exported ONNX files by onnxruntime.

    Everything else stays diffusers' (prompt encoding, initial noise, Euler steps, VAE), so a match shows
    that the exported parts and the algorithm docs/toolbox.md gives (CFG batch for both nets, the
    start/end window rule, residuals summed over nets) reproduce diffusers' images.
    """
    import onnxruntime as ort

    xl = isinstance(pipe, G.StableDiffusionXLPipeline)
    sess = {n: ort.InferenceSession(str(folder / n / "model.onnx"), providers=["CPUExecutionProvider"])
            for n in (*case["controlnets"], "unet")}
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(case["steps"])
    with torch.no_grad():
        if xl:
            pe, npe, pooled, npooled = pipe.encode_prompt(case["prompt"], negative_prompt=case["negative_prompt"],
                                                          do_classifier_free_guidance=True)
            extra = {"text_embeds": torch.cat([npooled, pooled]).numpy(),
                     "time_ids": np.array([[SIZE, SIZE, 0, 0, SIZE, SIZE]] * 2, np.float32)}
        else:
            pe, npe = pipe.encode_prompt(case["prompt"], "cpu", 1, True, negative_prompt=case["negative_prompt"])
            extra = {}
        hidden = torch.cat([npe, pe]).numpy()
        g = torch.Generator("cpu").manual_seed(case["seed"])
        lat = SIZE // 8
        latents = torch.randn((1, 4, lat, lat), generator=g) * sched.init_noise_sigma
        conds = [np.repeat(images[k].astype(np.float32).transpose(2, 0, 1)[None] / 255.0, 2, axis=0)
                 for k in case["control_images"]]
        n = len(sched.timesteps)
        for i, t in enumerate(sched.timesteps):
            x_in = sched.scale_model_input(torch.cat([latents] * 2), t).numpy()
            ts = np.array(float(t), np.float32) if xl else np.full((2,), float(t), np.float32)
            total = None
            for net, cond, scale, start, end in zip(case["controlnets"], conds, case["scale"], case["start"],
                                                    case["end"]):
                keep = 0.0 if (i / n < start or (i + 1) / n > end) else 1.0
                feeds = {"sample": x_in, "timestep": ts, "encoder_hidden_states": hidden,
                         "controlnet_cond": cond, "conditioning_scale": np.array(scale * keep, np.float32), **extra}
                outs = sess[net].run(None, feeds)
                total = outs if total is None else [a + b for a, b in zip(total, outs)]
            assert total is not None
            feeds = {"sample": x_in, "timestep": ts, "encoder_hidden_states": hidden, **extra}
            feeds.update({f"down_block_additional_residual_{j}": r for j, r in enumerate(total[:-1])})
            feeds["mid_block_additional_residual"] = total[-1]
            noise = torch.from_numpy(sess["unet"].run(None, feeds)[0])
            u, c = noise.chunk(2)
            latents = sched.step(u + case["cfg"] * (c - u), t, latents).prev_sample
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    image = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    return (image * 255).round().astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    images = {"edges": control_edges(), "scribble": control_scribble()}
    for kind in ("sd15", "sdxl"):
        pipe = G.build(kind)
        folder = G.OUT / f"tiny-{kind}-controlnet"
        G.export(pipe, kind, folder)
        nets = {name: make_controlnet(pipe.unet, 40 + i) for i, name in enumerate(CONTROLNETS)}
        parts = export_controlnets(pipe, [nets[n] for n in CONTROLNETS], kind, folder)
        np.savez_compressed(folder / "parts.npz", **parts)
        index = json.loads((folder / "model_index.json").read_text())
        index["controlnet"] = ["diffusers", "ControlNetModel"]
        (folder / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
        refs = dict(images)
        cases = cases_for(kind)
        for case in cases:
            refs[case["name"]] = run_case(pipe, nets, case, images)
            replay = replay_with_onnx(pipe, folder, case, images)
            diff = int(np.abs(replay.astype(int) - refs[case["name"]]).max())
            print(kind, case["name"], refs[case["name"]].shape, "std", round(float(refs[case["name"]].std()), 1),
                  "| ONNX-part replay max diff", diff)
            assert diff <= 2, f"{kind} {case['name']}: the ONNX parts give an image {diff} levels away"

        # the scale changes the image, so the references can tell a scale from another
        a, b = refs[cases[0]["name"]].astype(int), refs[cases[1]["name"]].astype(int)
        print(kind, "scale 1.0 vs 0.5: max diff", int(np.abs(a - b).max()))
        # and the control image changes it: the same case with the other image
        other = dict(cases[0], control_images=["scribble"])
        effect = int(np.abs(run_case(pipe, nets, other, images).astype(int) - a).max())
        print(kind, "edges vs scribble as the control image: max diff", effect)
        assert effect > 20, f"{kind}: the control image moves the image by {effect} levels only"
        (folder / "refs.json").write_text(json.dumps(cases, indent=1) + "\n")
        np.savez_compressed(folder / "refs.npz", **refs)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(kind, "folder size", size)


if __name__ == "__main__":
    main()
