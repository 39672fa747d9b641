"""A full-size SD 1.5 diffusers folder and a full-size SD 1.5 ControlNet, random weights, for docs/memory.md's
ControlNet runs (``scripts/memory_bench.py controlnet``).

Needs torch and diffusers (/work/refvenv). Writes under OUT (a temp folder: 5.8 GB, keep it out of git):

- ``sd15/``: ``StableDiffusionPipeline.save_pretrained`` of ``make_sd15_full.build`` (SD 1.5's published UNet, VAE
  and CLIP-L configs; float32 safetensors), which sdrt binds onto its shipped weight-free graphs;
- ``controlnet/``: diffusers' ``ControlNetModel`` from lllyasviel/control_v11p_sd15_canny's config.json
  (``make_shipped_graphs.SD1_CONTROLNET``: 361M parameters, 1.45 GB in float32), weights drawn as
  ``gen_pipeline_refs.scale_weights`` draws them (the zero convolutions too, so the residuals are not zero);
- ``RealESRGAN_x4plus_random.safetensors``: an upscaler in Real-ESRGAN's RRDBNet layout at RealESRGAN_x4plus's size
  (64 features, 23 RRDB blocks, growth 32, x4: 16.7M parameters, 67 MB in float32), random weights at 1/sqrt(fan-in)
  scaled by 0.2 (so 23 residual blocks stay bounded), for the hires fix's model upscaler.

    PYTHONPATH=scripts/_tvblock:scripts /work/refvenv/bin/python scripts/make_sd15_controlnet_full.py --out /tmp/x

A ControlNet's residuals must match its UNet's channels (320/640/1280), so a full-size net needs the full-size UNet:
the tiny test UNet (8/16 channels) cannot take it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_sd15_full  # noqa: E402  (hides torchvision first)
import torch  # noqa: E402
from gen_pipeline_refs import scale_weights  # noqa: E402
from make_shipped_graphs import SD1_CONTROLNET  # noqa: E402


def rrdb_x4(seed: int = 11, nf: int = 64, nb: int = 23, gc: int = 32) -> dict[str, torch.Tensor]:
    """Real-ESRGAN's ``RRDBNet(num_in_ch=3, num_out_ch=3, num_feat=64, num_block=23, num_grow_ch=32, scale=4)``
    state dict names and shapes (xinntao/Real-ESRGAN, basicsr's rrdbnet_arch), random weights."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"conv_first": (nf, 3)}
    for b in range(nb):
        for r in range(1, 4):
            for c in range(1, 6):
                shapes[f"body.{b}.rdb{r}.conv{c}"] = (nf if c == 5 else gc, nf + (c - 1) * gc)
    shapes.update({"conv_body": (nf, nf), "conv_up1": (nf, nf), "conv_up2": (nf, nf), "conv_hr": (nf, nf),
                   "conv_last": (3, nf)})
    out = {}
    for name, (o, i) in shapes.items():
        out[f"{name}.weight"] = torch.randn((o, i, 3, 3), generator=g) * 0.2 / (9 * i) ** 0.5
        out[f"{name}.bias"] = torch.zeros(o)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    pipe = make_sd15_full.build(args.out / "_work")
    pipe.save_pretrained(args.out / "sd15", safe_serialization=True)
    del pipe
    print(f"sd15 written in {time.time() - t0:.0f} s", flush=True)
    from diffusers import ControlNetModel

    torch.manual_seed(0)
    net = ControlNetModel(**SD1_CONTROLNET).eval()
    scale_weights(net, 7)
    net.save_pretrained(args.out / "controlnet", safe_serialization=True)
    print(f"controlnet written in {time.time() - t0:.0f} s", flush=True)
    from safetensors.torch import save_file

    save_file(rrdb_x4(), str(args.out / "RealESRGAN_x4plus_random.safetensors"))


if __name__ == "__main__":
    main()
