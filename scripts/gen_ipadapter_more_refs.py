"""IP-Adapter references for the ViT-bigG/14 adapters and Full Face: diffusers' ``load_ip_adapter``.

Next to ``gen_ipadapter_refs.py``'s files in ``tests/data/ipadapter/`` (whose tiny ViT-H-like ``image_encoder/`` and
``clip_vision.onnx`` this reuses) this writes:

- ``image_encoder_g/``: a second tiny ``CLIPVisionModelWithProjection`` of another width and depth (40 wide, 3
  layers, 20-wide ``image_embeds``), standing in for h94's ``sdxl_models/image_encoder`` (OpenCLIP ViT-bigG/14:
  1664 wide, 48 layers, 1280-wide ``image_embeds``), random weights;
- ``clip_vision_g.onnx``: its architecture exported as ``make_shipped_graphs.py`` exports the shipped
  ``clip_vision_g`` (that Spec, the tiny config), weight-free;
- ``ip-adapter_tiny_vit-G.safetensors`` (tiny-sd15's UNet, as h94's ``models/ip-adapter_sd15_vit-G``) and
  ``ip-adapter_tiny_sdxl_vit-G.safetensors`` (tiny-sdxl's, as ``sdxl_models/ip-adapter_sdxl``): base adapters in
  h94's layout whose ``image_proj.proj`` reads the tiny bigG encoder's 20-wide ``image_embeds``;
- ``ip-adapter-full-face_tiny.safetensors``: h94's ``ip-adapter-full-face_sd15`` layout (``image_proj.proj.0``
  Linear, ``proj.2`` Linear, ``proj.3`` LayerNorm: IP-Adapter's ``MLPProjModel``) for tiny-sd15, reading the tiny
  ViT-H-like encoder's 32-wide penultimate hidden states, float16 as h94 ships it;
- ``more_refs.npz`` / ``more_refs.json``: diffusers' images for the cases below, and Full Face's projection of the IP
  image's hidden states (``full_hidden`` -> ``full_tokens``, diffusers' ``IPAdapterFullImageProjection``).

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_ipadapter_more_refs.py
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
#: the tiny stand-in for ViT-bigG/14: another width, depth and projection than gen_ipadapter_refs.VISION's
VISION_G = dict(hidden_size=40, intermediate_size=56, num_attention_heads=4, num_hidden_layers=3, image_size=32,
                patch_size=8, projection_dim=20, hidden_act="gelu", layer_norm_eps=1e-5)
G_CASES = [
    dict(name="vitg/sd15/Euler/0.6", prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=7.0,
         seed=51, scale=0.6, sampler="Euler"),
]
G_XL_CASES = [
    dict(name="vitg/sdxl/Euler/0.8", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=6.0,
         seed=52, scale=0.8, sampler="Euler"),
]
FULL_CASES = [
    dict(name="fullface/Euler/0.6", prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=7.0,
         seed=53, scale=0.6, sampler="Euler"),
    dict(name="fullface/Euler/1.0", prompt="a photo of a red cat", negative_prompt="", steps=3, cfg=5.0,
         seed=54, scale=1.0, sampler="Euler"),
]


def full_face_adapter(unet, image_dim: int, seed: int) -> dict[str, torch.Tensor]:
    """h94's Full Face layout: ``image_proj.proj.{0,2}`` Linear, ``proj.3`` LayerNorm, and the ``ip_adapter.*``
    layers."""
    g = torch.Generator().manual_seed(seed)
    cross = unet.config.cross_attention_dim
    sd = {"image_proj.proj.0.weight": torch.randn(image_dim, image_dim, generator=g) / image_dim ** 0.5,
          "image_proj.proj.0.bias": torch.randn(image_dim, generator=g) * 0.1,
          "image_proj.proj.2.weight": torch.randn(cross, image_dim, generator=g) / image_dim ** 0.5,
          "image_proj.proj.2.bias": torch.randn(cross, generator=g) * 0.1,
          "image_proj.proj.3.weight": 1 + torch.randn(cross, generator=g) * 0.1,
          "image_proj.proj.3.bias": torch.randn(cross, generator=g) * 0.1}
    sd.update({k: v for k, v in gi.adapter(unet, image_dim, seed + 100).items() if k.startswith("ip_adapter.")})
    return {k: v.half() for k, v in sd.items()}  # as h94 ships them (float16)


def run(pipe, weight_name: str, encoder: str, cases: list[dict], refs: dict, image: np.ndarray) -> None:
    from PIL import Image

    pipe.load_ip_adapter(str(OUT), subfolder="", weight_name=weight_name, image_encoder_folder=str(OUT / encoder),
                         low_cpu_mem_usage=False)
    for case in cases:
        pipe.set_ip_adapter_scale(case["scale"])
        sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)
        out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"] or None,
                ip_adapter_image=Image.fromarray(image), num_inference_steps=case["steps"], guidance_scale=case["cfg"],
                height=64, width=64, generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        refs[case["name"]] = (out.images * 255).round().astype(np.uint8)
        print(case["name"], float(refs[case["name"]].std()), flush=True)


def main() -> None:
    import make_shipped_graphs as msg
    from PIL import Image
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.set_num_threads(1)
    torch.manual_seed(6)
    enc = CLIPVisionModelWithProjection(CLIPVisionConfig(**VISION_G)).eval()
    gp.scale_weights(enc, 16)
    enc.save_pretrained(OUT / "image_encoder_g", safe_serialization=True)
    _, prog = msg.export_program(msg.SPECS["clip_vision_g"], {**VISION_G, "num_channels": 3}, fake=True)
    proto, _ = msg.weight_free(prog, "clip_vision_g_tiny", "scripts/gen_ipadapter_more_refs.py VISION_G")
    (OUT / "clip_vision_g.onnx").write_bytes(proto.SerializeToString())

    image = gi.ip_image()
    refs: dict[str, np.ndarray] = {}
    pipe = gp.build("sd15")
    save_file(gi.adapter(pipe.unet, VISION_G["projection_dim"], 17), str(OUT / "ip-adapter_tiny_vit-G.safetensors"))
    run(pipe, "ip-adapter_tiny_vit-G.safetensors", "image_encoder_g", G_CASES, refs, image)
    xl = gp.build("sdxl")
    save_file(gi.adapter(xl.unet, VISION_G["projection_dim"], 18),
              str(OUT / "ip-adapter_tiny_sdxl_vit-G.safetensors"))
    run(xl, "ip-adapter_tiny_sdxl_vit-G.safetensors", "image_encoder_g", G_XL_CASES, refs, image)

    pipe = gp.build("sd15")
    save_file(full_face_adapter(pipe.unet, gi.VISION["hidden_size"], 19),
              str(OUT / "ip-adapter-full-face_tiny.safetensors"))
    run(pipe, "ip-adapter-full-face_tiny.safetensors", "image_encoder", FULL_CASES, refs, image)
    from diffusers.models.embeddings import IPAdapterFullImageProjection

    proj = pipe.unet.encoder_hid_proj.image_projection_layers[0]
    assert isinstance(proj, IPAdapterFullImageProjection), type(proj)
    px = pipe.feature_extractor(Image.fromarray(image), return_tensors="pt").pixel_values
    with torch.no_grad():
        hidden = pipe.image_encoder(px, output_hidden_states=True).hidden_states[-2]
        refs["full_hidden"] = hidden.numpy()
        refs["full_tokens"] = proj(hidden).numpy()
    np.savez_compressed(OUT / "more_refs.npz", **refs)
    (OUT / "more_refs.json").write_text(json.dumps(G_CASES + G_XL_CASES + FULL_CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
