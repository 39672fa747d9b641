"""Revision references: sd-webui-controlnet's ``revision_clipvision`` / ``revision_ignore_prompt`` written in torch
around diffusers' tiny SDXL pipeline (tests/data/pipelines/tiny-sdxl's weights, ``gen_pipeline_refs.build("sdxl")``).

The extension (``annotator/clipvision``, ``scripts/hook.py`` ``UnetHook.forward``), as read, not copied:

- the picture ``cv2.resize``d to the encoder's size with ``INTER_AREA``, then transformers' ``CLIPImageProcessor``
  (the extension's arguments: resize and centre crop to that size, OpenAI CLIP's mean and std), through
  ``CLIPVisionModelWithProjection``: ``image_embeds``;
- ``q_sample`` of ``AbstractLowScaleModel`` (linear betas, sqrt-spaced from 1e-4 to 2e-2, 1000 steps) at
  ``k = int(threshold_a * 1000)`` clipped to 0..999, the noise ``randn_like`` (here from a CPU generator seeded with
  the case's seed, one draw a unit in order);
- at step ``i`` of ``n`` (on while ``start <= i / n <= end``): the pooled text of the conditional rows replaced by
  ``sum(weight * embeds)`` over the units on, the unconditional rows' by zeros; the text context of all rows zeros
  when a unit is ``revision_ignore_prompt`` or both prompts are empty.

Here the pipeline gets ``prompt_embeds`` / ``pooled_prompt_embeds`` (and the negative ones) by hand, and
``callback_on_step_end`` sets the next step's (``prompt_embeds``, ``add_text_embeds``: CFG's ``[uncond, cond]``).

Writes ``tests/data/revision/``: ``clip_vision/clip_g.pth`` (a tiny ``CLIPVisionModelWithProjection``, 40 wide, 3
layers, 32-wide ``image_embeds`` = tiny-sdxl's pooled width, random weights, saved as the extension's ``clip_g.pth``
is: ``torch.save`` of the state dict), ``clip_vision_g.onnx`` (that architecture exported as
``make_shipped_graphs.py`` exports the shipped ``clip_vision_g``, weight-free), ``refs.npz`` / ``refs.json``.
Also checks once that the full-size ViT-bigG/14 (the extension's ``config_clip_g``) has the names and shapes the
shipped ``clip_vision_g`` graph binds.

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_revision_refs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "revision"
VISION = dict(hidden_size=40, intermediate_size=56, num_attention_heads=4, num_hidden_layers=3, image_size=32,
              patch_size=8, projection_dim=32, hidden_act="gelu", layer_norm_eps=1e-5)
#: the extension's config_clip_g (annotator/clipvision): OpenCLIP ViT-bigG/14
CLIP_G = dict(hidden_size=1664, intermediate_size=8192, num_attention_heads=16, num_hidden_layers=48, image_size=224,
              patch_size=14, projection_dim=1280, hidden_act="gelu", layer_norm_eps=1e-5)
CASES = [
    dict(name="clipvision/1.0", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=6.0, seed=61,
         sampler="Euler", units=[dict(module="revision_clipvision", weight=1.0, noise=0.0, image=0)]),
    dict(name="ignore/0.7/noise0.3", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=6.0,
         seed=62, sampler="Euler", units=[dict(module="revision_ignore_prompt", weight=0.7, noise=0.3, image=0)]),
    dict(name="two/window", prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=5.0, seed=63,
         sampler="Euler", units=[dict(module="revision_clipvision", weight=0.6, noise=0.1, image=0),
                                 dict(module="revision_clipvision", weight=1.5, noise=0.0, image=1, start=0.0,
                                      end=0.5)]),
    dict(name="empty-prompts", prompt="", negative_prompt="", steps=3, cfg=6.0, seed=64, sampler="Euler",
         units=[dict(module="revision_clipvision", weight=1.0, noise=0.0, image=1)]),
    # with tiny-sdxl-controlnet's ControlNet (gen_controlnet_refs' seed): the net reads the changed text_embeds and
    # the zeroed context, as the extension's (revision's change comes before its ControlNets)
    dict(name="ignore+controlnet", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=6.0,
         seed=65, sampler="Euler", units=[dict(module="revision_ignore_prompt", weight=1.0, noise=0.0, image=0)],
         control_scale=0.8),
]


def pictures() -> list[np.ndarray]:
    """Two non-square pictures (48x40, 30x52), so INTER_AREA both shrinks and enlarges."""
    y, x = np.mgrid[0:40, 0:48]
    a = np.stack([(x * 5) % 256, (y * 7 + x * 2) % 256, ((x - 24) ** 2 + (y - 20) ** 2) % 256], -1)
    y, x = np.mgrid[0:52, 0:30]
    b = np.stack([(y * 9 + 40) % 256, (x * x + y) % 256, (x * 11 + y * 3) % 256], -1)
    return [a.astype(np.uint8), b.astype(np.uint8)]


def embeds(enc, rgb: np.ndarray) -> torch.Tensor:
    import cv2
    from transformers import CLIPImageProcessor

    size = enc.config.image_size
    proc = CLIPImageProcessor(crop_size=size, do_center_crop=True, do_convert_rgb=True, do_normalize=True,
                              do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                              image_std=[0.26862954, 0.26130258, 0.27577711], resample=3, size=size)
    small = cv2.resize(rgb, (size, size), interpolation=cv2.INTER_AREA)
    px = proc(images=small, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return enc(pixel_values=px).image_embeds


def q_sample(x: torch.Tensor, noise_aug: float, noise: torch.Tensor) -> torch.Tensor:
    betas = torch.linspace(1e-4 ** 0.5, 2e-2 ** 0.5, 1000, dtype=torch.float64) ** 2
    ac = np.cumprod(1.0 - betas.numpy(), axis=0)
    sa = torch.tensor(np.sqrt(ac), dtype=torch.float32)
    s1 = torch.tensor(np.sqrt(1.0 - ac), dtype=torch.float32)
    k = int(min(max(int(noise_aug * 1000), 0), 999))
    return sa[k] * x + s1[k] * noise


def run(pipe, enc, case: dict, images: list[np.ndarray], net=None, edges=None) -> np.ndarray:
    n = case["steps"]
    with torch.no_grad():
        pe, npe, pooled, npooled = pipe.encode_prompt(case["prompt"], device="cpu", num_images_per_prompt=1,
                                                      do_classifier_free_guidance=True,
                                                      negative_prompt=case["negative_prompt"] or None)
    g = torch.Generator().manual_seed(case["seed"])
    units = []
    for u in case["units"]:
        e = embeds(enc, images[u["image"]])
        noise = torch.randn(e.shape, generator=g)
        units.append((u, q_sample(e, u["noise"], noise)))
    ignore = any(u["module"] == "revision_ignore_prompt" for u, _ in units)
    empty = case["prompt"] == "" and case["negative_prompt"] == ""

    def tensors(i: int):
        on = [(u, e) for u, e in units if u.get("start", 0.0) <= i / n <= u.get("end", 1.0)]
        if not on:
            return torch.cat([npe, pe]), torch.cat([npooled, pooled])
        y = 0
        for u, e in on:
            y = y + e * u["weight"]
        ctx = torch.cat([npe, pe])
        if ignore or empty:
            ctx = torch.zeros_like(ctx)
        return ctx, torch.cat([torch.zeros_like(y), y])

    ctx0, y0 = tensors(0)

    def step_end(p, i, t, kw):
        ctx, y = tensors(i + 1)
        return {"prompt_embeds": ctx, "add_text_embeds": y}

    from PIL import Image

    sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
    extra = {}
    if net is not None:
        from diffusers import StableDiffusionXLControlNetPipeline

        p = StableDiffusionXLControlNetPipeline(**{**pipe.components, "scheduler": sched}, controlnet=net)
        extra = dict(image=Image.fromarray(edges), controlnet_conditioning_scale=case["control_scale"])
    else:
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
    p.set_progress_bar_config(disable=True)
    out = p(**extra, prompt_embeds=ctx0[1:], negative_prompt_embeds=ctx0[:1], pooled_prompt_embeds=y0[1:],
            negative_pooled_prompt_embeds=y0[:1], num_inference_steps=n, guidance_scale=case["cfg"], height=64,
            width=64, generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
            callback_on_step_end=step_end, callback_on_step_end_tensor_inputs=["prompt_embeds", "add_text_embeds"])
    return (out.images * 255).round().astype(np.uint8)


def check_full_size() -> None:
    """The extension's ViT-bigG/14 (transformers' names, as clip_g.pth holds them) has every tensor the shipped
    clip_vision_g graph binds, at its shape."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    from sdrt.checkpoint.graphs import shipped_graph
    from sdrt.graph import Graph

    with torch.device("meta"):
        full = CLIPVisionModelWithProjection(CLIPVisionConfig(**CLIP_G))
    shapes = {k: tuple(v.shape) for k, v in full.state_dict().items()}
    graph = Graph.load(shipped_graph("clip_vision_g"))
    info = graph.initializer_info()
    names = sorted(graph.external_refs)
    bad = [k for k in names if k not in shapes or tuple(int(d) for d in info[k].shape) != shapes[k]]
    assert not bad, bad[:5]
    print(f"full-size ViT-bigG/14: {len(names)} graph weights, all in the model at their shapes")


def main() -> None:
    import make_shipped_graphs as msg
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.set_num_threads(1)
    check_full_size()
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    enc = CLIPVisionModelWithProjection(CLIPVisionConfig(**VISION)).eval()
    gp.scale_weights(enc, 17)
    (OUT / "clip_vision").mkdir(exist_ok=True)
    torch.save({k: v.clone() for k, v in enc.state_dict().items()}, OUT / "clip_vision" / "clip_g.pth")
    _, prog = msg.export_program(msg.SPECS["clip_vision_g"], {**VISION, "num_channels": 3}, fake=True)
    proto, _ = msg.weight_free(prog, "clip_vision_g_tiny", "scripts/gen_revision_refs.py VISION")
    (OUT / "clip_vision_g.onnx").write_bytes(proto.SerializeToString())
    images = pictures()
    refs: dict[str, np.ndarray] = {f"image{k}": im for k, im in enumerate(images)}
    refs["embeds0"] = embeds(enc, images[0]).numpy()
    xl = gp.build("sdxl")
    import gen_controlnet_refs as gc

    net = gc.make_controlnet(xl.unet, 40 + gc.CONTROLNETS.index("controlnet"))  # tiny-sdxl-controlnet's
    refs["edges"] = gc.control_edges()
    for case in CASES:
        cn = "control_scale" in case
        refs[case["name"]] = run(xl, enc, case, images, net if cn else None, refs["edges"] if cn else None)
        print(case["name"], float(refs[case["name"]].std()), flush=True)
    np.savez_compressed(OUT / "refs.npz", **refs)
    (OUT / "refs.json").write_text(json.dumps(CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
