"""IP-Adapter references: diffusers' ``load_ip_adapter`` on the tiny SD 1.x of ``tests/data/pipelines/tiny-sd15``.

The pipeline is ``gen_pipeline_refs.build("sd15")`` (the same seeds, so the same weights as that ONNX folder). Next
to it this writes, in ``tests/data/ipadapter/``:

- ``image_encoder/``: a tiny ``CLIPVisionModelWithProjection`` (transformers' ``config.json`` + ``model.safetensors``,
  as h94/IP-Adapter's ``models/image_encoder/`` holds ViT-H/14), random weights;
- ``clip_vision.onnx``: that architecture exported with the dynamo exporter (initializers under transformers'
  parameter names, as ``make_shipped_graphs.py`` exports the full-size ``clip_vision_h``), weights stripped: the
  tests bind ``image_encoder/model.safetensors`` onto it, as sdrt binds a real encoder onto the shipped graph;
- ``ip-adapter_tiny.safetensors``: an adapter in h94's key layout (``image_proj.proj.*``, ``image_proj.norm.*``,
  ``ip_adapter.{1,3,...}.to_k_ip.weight``/``to_v_ip.weight`` by diffusers' attention-processor order), random;
- ``refs.npz`` / ``refs.json``: diffusers' images for the cases below (``ip_adapter_image`` through the pipeline's
  own CLIPImageProcessor, ``set_ip_adapter_scale``), and the IP image.

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_ipadapter_refs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "ipadapter"
VISION = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, image_size=32,
              patch_size=8, projection_dim=24, hidden_act="gelu", layer_norm_eps=1e-5)
#: SDXL: tests/data/pipelines/tiny-sdxl's pipeline (gen_pipeline_refs.build("sdxl")), its own adapter (64-wide text)
XL_CASES = [
    dict(name="sdxl/txt2img/Euler/0.7", prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=6.0,
         seed=21, scale=0.7, sampler="Euler"),
    dict(name="sdxl/txt2img/Euler/1.0/empty-negative", prompt="a photo of a red cat", negative_prompt="", steps=3,
         cfg=5.0, seed=22, scale=1.0, sampler="Euler"),
]
#: tests/data/pipelines/tiny-sd15-controlnet's ControlNet (gen_controlnet_refs: the same seed) and the IP-Adapter
#: together: diffusers' StableDiffusionControlNetPipeline with load_ip_adapter
CN_CASES = [
    dict(name="controlnet+ip/Euler/0.6", prompt="a photo of a red cat", negative_prompt="blurry", steps=3, cfg=7.0,
         seed=31, scale=0.6, sampler="Euler", control_scale=1.0),
]
CASES = [
    dict(name="txt2img/Euler/0.6", prompt="a photo of a red cat", negative_prompt="blurry", steps=4, cfg=7.0,
         seed=11, scale=0.6, sampler="Euler"),
    dict(name="txt2img/Euler/1.0", prompt="a photo of a red cat", negative_prompt="", steps=4, cfg=5.0,
         seed=12, scale=1.0, sampler="Euler"),
]


def ip_image() -> np.ndarray:
    """A non-square picture (48 wide, 40 high), so the encoder's resize and centre crop both act."""
    y, x = np.mgrid[0:40, 0:48]
    r = (x * 5) % 256
    g = (y * 7 + x * 2) % 256
    b = ((x - 24) ** 2 + (y - 20) ** 2) % 256
    return np.stack([r, g, b], -1).astype(np.uint8)


def adapter(unet, image_dim: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cross = unet.config.cross_attention_dim
    sd = {"image_proj.proj.weight": torch.randn(4 * cross, image_dim, generator=g) / image_dim ** 0.5,
          "image_proj.proj.bias": torch.randn(4 * cross, generator=g) * 0.1,
          "image_proj.norm.weight": 1 + torch.randn(cross, generator=g) * 0.1,
          "image_proj.norm.bias": torch.randn(cross, generator=g) * 0.1}
    for k, name in enumerate(unet.attn_processors):
        if name.endswith("attn2.processor"):
            mod = unet.get_submodule(name[: -len(".processor")])
            width = mod.to_q.weight.shape[0]
            for lin in ("to_k_ip", "to_v_ip"):
                sd[f"ip_adapter.{k}.{lin}.weight"] = torch.randn(width, cross, generator=g) * 2 / cross ** 0.5
    return sd


def main() -> None:
    from PIL import Image
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    pipe = gp.build("sd15")
    import gen_controlnet_refs as gc

    net = gc.make_controlnet(pipe.unet, 40 + gc.CONTROLNETS.index("controlnet"))  # before the adapter's processors
    torch.manual_seed(5)
    enc = CLIPVisionModelWithProjection(CLIPVisionConfig(**VISION)).eval()
    gp.scale_weights(enc, 6)
    enc.save_pretrained(OUT / "image_encoder", safe_serialization=True)
    save_file(adapter(pipe.unet, VISION["projection_dim"], 7), str(OUT / "ip-adapter_tiny.safetensors"))
    export_vision(enc, OUT / "clip_vision.onnx")

    image = ip_image()
    refs: dict[str, np.ndarray] = {"ip_image": image}
    run_cases(pipe, "ip-adapter_tiny.safetensors", CASES, refs, image)
    from diffusers import StableDiffusionControlNetPipeline

    edges = gc.control_edges()
    for case in CN_CASES:
        pipe.set_ip_adapter_scale(case["scale"])
        sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
        p = StableDiffusionControlNetPipeline(**{**pipe.components, "scheduler": sched}, controlnet=net)
        p.set_progress_bar_config(disable=True)
        out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"], image=Image.fromarray(edges),
                ip_adapter_image=Image.fromarray(image), num_inference_steps=case["steps"], guidance_scale=case["cfg"],
                height=64, width=64, controlnet_conditioning_scale=case["control_scale"],
                generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        refs[case["name"]] = (out.images * 255).round().astype(np.uint8)
        print(case["name"], float(refs[case["name"]].std()))
    xl = gp.build("sdxl")
    save_file(adapter(xl.unet, VISION["projection_dim"], 8), str(OUT / "ip-adapter_tiny_sdxl.safetensors"))
    run_cases(xl, "ip-adapter_tiny_sdxl.safetensors", XL_CASES, refs, image)
    px = pipe.feature_extractor(Image.fromarray(image), return_tensors="pt").pixel_values
    refs["pixel_values"] = px.numpy()
    np.savez_compressed(OUT / "refs.npz", **refs)
    (OUT / "refs.json").write_text(json.dumps(CASES + XL_CASES + CN_CASES, indent=1) + "\n")


def run_cases(pipe, weight_name: str, cases: list[dict], refs: dict, image: np.ndarray, **load) -> None:
    from PIL import Image

    pipe.load_ip_adapter(str(OUT), subfolder="", weight_name=weight_name,
                         image_encoder_folder=str(OUT / "image_encoder"), **load)
    for case in cases:
        pipe.set_ip_adapter_scale(case["scale"])
        sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)
        # an empty negative prompt is none (sdrt's rule): SDXL's force_zeros_for_empty_prompt then zeros it
        out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"] or None,
                ip_adapter_image=Image.fromarray(image),
                num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=64, width=64,
                generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        refs[case["name"]] = (out.images * 255).round().astype(np.uint8)
        print(case["name"], float(refs[case["name"]].std()))


def export_vision(enc, path: Path) -> None:
    """The tiny encoder's architecture exported as ``make_shipped_graphs.py`` exports the shipped ``clip_vision_h``
    (its own Spec, the tiny config): weight-free, initializers under transformers' parameter names."""
    import make_shipped_graphs as msg

    spec = msg.SPECS["clip_vision_h"]
    cfg = {**VISION, "num_channels": 3}
    _, prog = msg.export_program(spec, cfg, fake=True)
    proto, _ = msg.weight_free(prog, "clip_vision_tiny", "scripts/gen_ipadapter_refs.py VISION")
    path.write_bytes(proto.SerializeToString())


if __name__ == "__main__":
    main()
