"""IP-Adapter Plus references: diffusers' ``load_ip_adapter`` with a tiny adapter in h94's Plus key layout.

Next to ``gen_ipadapter_refs.py``'s files in ``tests/data/ipadapter/`` (whose ``image_encoder/`` this reuses) this
writes:

- ``clip_vision.onnx`` again: the tiny encoder's architecture exported as the shipped ``clip_vision_h`` now is, with
  its ``penultimate_hidden_states`` output (weight-free);
- ``ip-adapter-plus_tiny.safetensors`` (tiny-sd15's UNet) and ``ip-adapter-plus_tiny_sdxl.safetensors``
  (tiny-sdxl's): h94's ``ip-adapter-plus_sd15.safetensors`` layout (``image_proj.latents``, ``proj_in``,
  ``layers.N.0.{norm1,norm2,to_q,to_kv,to_out}``, ``layers.N.1.{0,1,3}``, ``proj_out``, ``norm_out``; 16 queries,
  64 channels a head, 4 blocks as diffusers' loader reads them), random weights in float16 as h94's;
- ``plus_refs.npz`` / ``plus_refs.json``: diffusers' images (its ``encode_image(output_hidden_states=True)``:
  ``hidden_states[-2]`` of the picture, and of a zero picture for the negative pass) and the Resampler's own
  output for the IP image (``tokens``), a unit check of sdrt's numpy Resampler.

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_ipadapter_plus_refs.py
"""

from __future__ import annotations

import json
import sys

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_ipadapter_refs as gi  # noqa: E402
import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

OUT = gi.OUT
#: diffusers' loader builds 4 blocks (h94's depth) and reads 64 channels a head
HIDDEN, HEADS, DEPTH, QUERIES = 16, 2, 4, 16
CASES = [
    dict(name="plus/txt2img/Euler/0.6", prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=7.0,
         seed=41, scale=0.6, sampler="Euler"),
    dict(name="plus/txt2img/Euler/1.0", prompt="a photo of a red cat", negative_prompt="", steps=3, cfg=5.0,
         seed=42, scale=1.0, sampler="Euler"),
]
XL_CASES = [
    dict(name="plus/sdxl/txt2img/Euler/0.8", prompt="a photo of a red cat", negative_prompt="blurry", steps=3,
         cfg=6.0, seed=43, scale=0.8, sampler="Euler"),
]


def plus_adapter(unet, image_dim: int, seed: int) -> dict[str, torch.Tensor]:
    """h94's Plus layout: the Resampler under ``image_proj.`` and the base adapter's ``ip_adapter.*`` layers."""
    g = torch.Generator().manual_seed(seed)
    cross, inner = unet.config.cross_attention_dim, HEADS * 64

    def lin(o: int, i: int) -> torch.Tensor:
        return torch.randn(o, i, generator=g) / i ** 0.5

    def norm(name: str, width: int) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": 1 + torch.randn(width, generator=g) * 0.1,
                f"{name}.bias": torch.randn(width, generator=g) * 0.1}

    sd = {"image_proj.latents": torch.randn(1, QUERIES, HIDDEN, generator=g) / HIDDEN ** 0.5,
          "image_proj.proj_in.weight": lin(HIDDEN, image_dim), "image_proj.proj_in.bias": torch.randn(HIDDEN, generator=g) * 0.1,
          "image_proj.proj_out.weight": lin(cross, HIDDEN), "image_proj.proj_out.bias": torch.randn(cross, generator=g) * 0.1,
          **norm("image_proj.norm_out", cross)}
    for n in range(DEPTH):
        a, f = f"image_proj.layers.{n}.0", f"image_proj.layers.{n}.1"
        sd.update({**norm(f"{a}.norm1", HIDDEN), **norm(f"{a}.norm2", HIDDEN), f"{a}.to_q.weight": lin(inner, HIDDEN),
                   f"{a}.to_kv.weight": lin(2 * inner, HIDDEN), f"{a}.to_out.weight": lin(HIDDEN, inner) * 2,
                   **norm(f"{f}.0", HIDDEN), f"{f}.1.weight": lin(4 * HIDDEN, HIDDEN), f"{f}.3.weight": lin(HIDDEN, 4 * HIDDEN)})
    base = gi.adapter(unet, image_dim, seed + 100)
    sd.update({k: v for k, v in base.items() if k.startswith("ip_adapter.")})
    return {k: v.half() for k, v in sd.items()}  # as h94 ships them (float16)


def main() -> None:
    from PIL import Image
    from transformers import CLIPVisionModelWithProjection

    torch.set_num_threads(1)
    enc = CLIPVisionModelWithProjection.from_pretrained(OUT / "image_encoder").eval()
    gi.export_vision(enc, OUT / "clip_vision.onnx")
    image = gi.ip_image()
    refs: dict[str, np.ndarray] = {}
    pipe = gp.build("sd15")
    save_file(plus_adapter(pipe.unet, gi.VISION["hidden_size"], 9), str(OUT / "ip-adapter-plus_tiny.safetensors"))
    gi.run_cases(pipe, "ip-adapter-plus_tiny.safetensors", CASES, refs, image, low_cpu_mem_usage=False)
    px = pipe.feature_extractor(Image.fromarray(image), return_tensors="pt").pixel_values
    with torch.no_grad():
        hidden = pipe.image_encoder(px, output_hidden_states=True).hidden_states[-2]
        refs["hidden"] = hidden.numpy()
        refs["tokens"] = pipe.unet.encoder_hid_proj.image_projection_layers[0](hidden).numpy()
    xl = gp.build("sdxl")
    save_file(plus_adapter(xl.unet, gi.VISION["hidden_size"], 10), str(OUT / "ip-adapter-plus_tiny_sdxl.safetensors"))
    gi.run_cases(xl, "ip-adapter-plus_tiny_sdxl.safetensors", XL_CASES, refs, image, low_cpu_mem_usage=False)
    np.savez_compressed(OUT / "plus_refs.npz", **refs)
    (OUT / "plus_refs.json").write_text(json.dumps(CASES + XL_CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
