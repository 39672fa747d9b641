"""Tiny SD 1.x / SDXL pipelines with T2I-Adapters, and diffusers' images for them.

    PYTHONPATH=scripts:core/src /work/refvenv/bin/python scripts/gen_t2ia_refs.py

Writes ``tests/data/pipelines/tiny-{sd15,sdxl}-t2ia``: a whole tiny pipeline exported as ``gen_pipeline_refs`` does
(its text encoders, VAE and scheduler, the same seeds), with a UNet of the real block layout (SD 1.x: 4 levels, three
with cross-attention then ``DownBlock2D``; SDXL: ``DownBlock2D`` then two cross-attention levels; two resnets a level),
since a T2I-Adapter's features go at those levels; and random-weight adapters with the real key names, as people
download them:

- ``t2iadapter_canny_tiny.pth``: TencentARC's original ``Adapter`` keys (``conv_in``, ``body.N.block1``...), a
  1-channel map (SD 1.x, like ``t2iadapter_canny_sd14v1.pth``), saved with ``torch.save``;
- ``t2iadapter_color_tiny.pth``: the original light adapter's keys (``body.N.in_conv``, ``body.N.body.M``, ``out_conv``);
- ``t2i-adapter-tiny-sdxl/``: diffusers' ``T2IAdapter`` (``full_adapter_xl``) folder, ``config.json`` and
  ``diffusion_pytorch_model.safetensors``; and ``t2i-adapter_diffusers_xl_tiny.safetensors``, the same file alone.

References: ``StableDiffusionAdapterPipeline`` / ``StableDiffusionXLAdapterPipeline`` with Euler and
``torch.Generator("cpu").manual_seed(seed)`` (``refs.json``, ``refs.npz``). The script also checks that each adapter
moves the image (the reference with the adapter against the one without), and that sdrt's reading of the full-size
architectures (SD 1.5 v1 / v2 full adapters, the light one, SDXL's; original and diffusers names) accepts them:
``full_size.json`` lists their keys and shapes for the tests.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    EulerDiscreteScheduler,
    StableDiffusionAdapterPipeline,
    StableDiffusionXLAdapterPipeline,
    T2IAdapter,
    UNet2DConditionModel,
)
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

SIZE = G.SIZE


def sd_unet() -> UNet2DConditionModel:
    return UNet2DConditionModel(
        sample_size=SIZE // 8, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(4, 8, 16, 16),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, cross_attention_dim=32, norm_num_groups=4,
        attention_head_dim=(1, 1, 2, 2))


def xl_unet() -> UNet2DConditionModel:
    return UNet2DConditionModel(
        sample_size=SIZE // 8, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(4, 8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=64,
        norm_num_groups=4, attention_head_dim=(1, 2, 2), addition_embed_type="text_time", addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 32, use_linear_projection=True,
        transformer_layers_per_block=(1, 1, 2))


def adapter(kind: str, in_channels: int, seed: int) -> T2IAdapter:
    if kind == "light_adapter":
        a = T2IAdapter(in_channels=in_channels, channels=[4, 8, 16], num_res_blocks=4, downscale_factor=8,
                       adapter_type=kind)
    else:
        a = T2IAdapter(in_channels=in_channels, channels=[4, 8, 16, 16], num_res_blocks=2,
                       downscale_factor=16 if kind == "full_adapter_xl" else 8, adapter_type=kind)
    a.eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in a.named_parameters():  # features of O(1): they move the tiny UNet's image by tens of levels
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() ** 0.5 if p.ndim >= 2 else 20.0))
    return a


def original_keys(sd: dict, kind: str, rb: int) -> dict:
    """diffusers' T2IAdapter state dict -> TencentARC's original names (the inverse of diffusers' conversion)."""
    out = {}
    for k, v in sd.items():
        parts = k.split(".")
        assert parts[0] == "adapter", k
        if parts[1] == "conv_in":
            out[".".join(parts[1:])] = v
        elif kind == "light_adapter":
            i = parts[2]
            if parts[3] == "resnets":
                out[f"body.{i}.body.{parts[4]}.{'.'.join(parts[5:])}"] = v
            else:
                out[f"body.{i}.{'.'.join(parts[3:])}"] = v
        else:
            i = int(parts[2])
            if parts[3] == "resnets":
                out[f"body.{i * rb + int(parts[4])}.{'.'.join(parts[5:])}"] = v
            else:  # in_conv
                out[f"body.{i * rb}.{'.'.join(parts[3:])}"] = v
    return {k: v.contiguous() for k, v in out.items()}


def control_edges() -> np.ndarray:
    img = np.zeros((SIZE, SIZE), np.uint8)
    img[14, 10:50] = img[42, 10:50] = 255
    img[14:43, 10] = img[14:43, 49] = 255
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    r = np.sqrt((yy - 46.0) ** 2 + (xx - 40.0) ** 2)
    img[np.abs(r - 11) < 0.6] = 255
    return np.repeat(img[:, :, None], 3, axis=2)


def control_colors() -> np.ndarray:
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    img = np.stack([(xx * 4) % 256, (yy * 4) % 256, ((xx + yy) * 2) % 256], axis=2)
    return img.astype(np.uint8)


def build(kind: str):
    pipe = G.build(kind)
    pipe.unet = (sd_unet() if kind == "sd15" else xl_unet()).eval()
    G.scale_weights(pipe.unet, 3)
    return pipe


def run(pipe, adapter_model, case: dict, images: dict) -> np.ndarray:
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    comps = {k: v for k, v in pipe.components.items() if k in (
        "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet")}
    img = images[case["image"]]
    pil = Image.fromarray(img[:, :, 0], "L") if adapter_model.config.in_channels == 1 else Image.fromarray(img)
    kw = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=pil,
              num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=SIZE, width=SIZE,
              generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np",
              adapter_conditioning_scale=case["scale"])
    if "xl" in case["adapter"]:
        p = StableDiffusionXLAdapterPipeline(**comps, adapter=adapter_model, scheduler=sched,
                                             force_zeros_for_empty_prompt=True)
        kw["adapter_conditioning_factor"] = case["end"]
    else:
        assert case["end"] == 1.0
        p = StableDiffusionAdapterPipeline(**comps, adapter=adapter_model, scheduler=sched, safety_checker=None,
                                           feature_extractor=None, requires_safety_checker=False)
    p.set_progress_bar_config(disable=True)
    with torch.no_grad():
        res = p(**kw)
    return (res.images * 255).round().astype(np.uint8)


def full_size() -> dict:
    """The full-size architectures' keys and shapes (random weights), checked against sdrt's reading of them."""
    from sdrt.pipelines.t2iadapter import AdapterNet

    made = {
        # TencentARC's sd14v1 / sd15v2 adapters: Adapter(cin=64 * c, channels=[320, 640, 1280, 1280], nums_rb=2,
        # ksize=1, sk=True, use_conv=False): diffusers' FullAdapter, in its original names
        "t2iadapter_canny_sd14v1.pth": ("full_adapter", 1, "original"),
        "t2iadapter_depth_sd14v1.pth": ("full_adapter", 3, "original"),
        "t2iadapter_sketch_sd15v2.pth": ("full_adapter", 1, "original"),
        "t2iadapter_color_sd14v1.pth": ("light_adapter", 3, "original"),
        "t2i-adapter-canny-sdxl-1.0/diffusion_pytorch_model.safetensors": ("full_adapter_xl", 1, "diffusers"),
        # TencentARC's SDXL adapters in the original names (the extension's Adapter(is_sdxl=True))
        "t2i-adapter_xl_canny.safetensors (original names)": ("full_adapter_xl", 1, "original"),
        "t2i-adapter_diffusers_xl_depth_midas.safetensors": ("full_adapter_xl", 3, "diffusers"),
        "t2iadapter_depth_sd15v2 (diffusers).safetensors": ("full_adapter", 3, "diffusers"),
    }
    out = {}
    work = Path(tempfile.mkdtemp())
    for name, (kind, cin, naming) in made.items():
        if kind == "light_adapter":
            a = T2IAdapter(in_channels=cin, channels=[320, 640, 1280], num_res_blocks=4, adapter_type=kind)
        else:
            a = T2IAdapter(in_channels=cin, channels=[320, 640, 1280, 1280], num_res_blocks=2,
                           downscale_factor=16 if kind == "full_adapter_xl" else 8, adapter_type=kind)
        sd = a.state_dict()
        if naming == "original":
            sd = original_keys(sd, kind, 2)
            path = work / "x.pth"
            torch.save(sd, path)
        else:
            path = work / "x.safetensors"
            save_file({k: v.half().contiguous() for k, v in sd.items()}, str(path))
        net = AdapterNet(path)
        lay = net.layout
        out[name] = {"kind": lay.kind, "in_channels": lay.in_channels, "channels": list(lay.channels),
                     "keys": {k: list(v.shape) for k, v in sd.items()}}
        print("full size", name, lay)
        path.unlink()
    return out


def odd_features() -> None:
    """diffusers' features of the tiny adapters at a size whose halvings are odd (80 x 48: the SD adapter's levels
    10x6, 5x3, 3x2, 2x1; the SDXL one's 5x3, 5x3, 3x2, 3x2), where the average pools round up (``ceil_mode``)."""
    folder = G.OUT / "tiny-sd15-t2ia"
    rng = np.random.default_rng(5)
    x = rng.random((1, 3, 48, 80)).astype(np.float32)
    out = {"input": x}
    for name, kind, cin, seed in (("t2iadapter_canny_tiny.pth", "full_adapter", 1, 11),
                                  ("t2iadapter_color_tiny.pth", "light_adapter", 3, 12)):
        a = adapter(kind, cin, seed)
        with torch.no_grad():
            feats = a(torch.from_numpy(x[:, :cin]))
        for k, f in enumerate(feats):
            out[f"{name}/{k}"] = f.numpy()
    a = T2IAdapter.from_pretrained(G.OUT / "tiny-sdxl-t2ia" / "t2i-adapter-tiny-sdxl")
    with torch.no_grad():
        feats = a(torch.from_numpy(x))
    for k, f in enumerate(feats):
        out[f"xl/{k}"] = f.numpy()
    np.savez_compressed(folder / "odd_features.npz", **out)


def main() -> None:
    torch.set_num_threads(1)
    images = {"edges": control_edges(), "colors": control_colors()}
    base = dict(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, steps=8, cfg=7.0, sampler="Euler", width=SIZE,
                height=SIZE)
    for kind in ("sd15", "sdxl"):
        pipe = build(kind)
        folder = G.OUT / f"tiny-{kind}-t2ia"
        G.export(pipe, kind, folder)
        adapters = {}
        if kind == "sd15":
            a = adapter("full_adapter", 1, 11)
            torch.save(original_keys(a.state_dict(), "full_adapter", 2), folder / "t2iadapter_canny_tiny.pth")
            adapters["t2iadapter_canny_tiny.pth"] = a
            b = adapter("light_adapter", 3, 12)
            torch.save(original_keys(b.state_dict(), "light_adapter", 4), folder / "t2iadapter_color_tiny.pth")
            adapters["t2iadapter_color_tiny.pth"] = b
            cases = [dict(base, name="canny/scale 1.0", seed=201, adapter="t2iadapter_canny_tiny.pth", image="edges",
                          scale=1.0, end=1.0),
                     dict(base, name="canny/scale 0.6", seed=201, adapter="t2iadapter_canny_tiny.pth", image="edges",
                          scale=0.6, end=1.0),
                     dict(base, name="color/scale 0.8", seed=202, adapter="t2iadapter_color_tiny.pth", image="colors",
                          scale=0.8, end=1.0)]
        else:
            a = adapter("full_adapter_xl", 3, 13)
            a.save_pretrained(folder / "t2i-adapter-tiny-sdxl", safe_serialization=True)
            shutil.copy(folder / "t2i-adapter-tiny-sdxl" / "diffusion_pytorch_model.safetensors",
                        folder / "t2i-adapter_diffusers_xl_tiny.safetensors")
            adapters["t2i-adapter-tiny-sdxl"] = a
            adapters["t2i-adapter_diffusers_xl_tiny.safetensors"] = a
            cases = [dict(base, name="xl/scale 0.9", seed=301, adapter="t2i-adapter-tiny-sdxl", image="colors",
                          scale=0.9, end=1.0),
                     dict(base, name="xl/factor 0.25", seed=301, adapter="t2i-adapter_diffusers_xl_tiny.safetensors",
                          image="colors", scale=0.9, end=0.25)]
        refs = dict(images)
        for case in cases:
            refs[case["name"]] = run(pipe, adapters[case["adapter"]], case, images)
            zero = run(pipe, adapters[case["adapter"]], dict(case, scale=0.0), images)
            moved = int(np.abs(zero.astype(int) - refs[case["name"]]).max())
            print(kind, case["name"], "std", round(float(refs[case["name"]].std()), 1), "| against no adapter", moved)
            assert moved > 20, f"{case['name']}: the adapter moves the image by {moved} levels only"
        np.savez_compressed(folder / "refs.npz", **refs)
        (folder / "refs.json").write_text(json.dumps(cases, indent=2) + "\n")
    (G.OUT / "tiny-sd15-t2ia" / "full_size.json").write_text(json.dumps(full_size()) + "\n")
    odd_features()


if __name__ == "__main__":
    main()
