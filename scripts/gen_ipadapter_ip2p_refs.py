"""IP-Adapter on InstructPix2Pix: diffusers' ``StableDiffusionInstructPix2PixPipeline`` (``gen_ip2p_refs.build()``,
the model of ``tests/data/pipelines/tiny-sd15-ip2p``) with ``tests/data/ipadapter``'s tiny adapter and image encoder
loaded (``load_ip_adapter``). Its three CFG row blocks (text + picture, negative + picture, negative + no picture)
get the image embeds [picture, zeros, zeros]. Writes ``tests/data/ipadapter/ip2p_refs.npz`` (the image, the case
in ``case``).

    PYTHONPATH=scripts:scripts/_tvblock:core/src /work/refvenv/bin/python scripts/gen_ipadapter_ip2p_refs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_ip2p_refs as g2  # noqa: E402
import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import StableDiffusionInstructPix2PixPipeline  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IPA = ROOT / "tests" / "data" / "ipadapter"
CASE = dict(prompt="turn it into a watercolor painting", negative_prompt="blurry", steps=4, cfg=6.0, image_cfg=1.5,
            seed=9, scale=0.8, sampler="Euler")


def main() -> None:
    torch.set_num_threads(1)
    pipe = g2.build()
    pipe.load_ip_adapter(str(IPA), subfolder="", weight_name="ip-adapter_tiny.safetensors",
                         image_encoder_folder=str(IPA / "image_encoder"))
    pipe.set_ip_adapter_scale(CASE["scale"])
    refs = np.load(IPA / "refs.npz")
    picture = np.load(g2.FOLDER / "refs.npz")["init_image"]
    sched = gp.SCHEDULERS[CASE["sampler"]](pipe.scheduler.config)
    p = StableDiffusionInstructPix2PixPipeline(**{**pipe.components, "scheduler": sched})
    p.set_progress_bar_config(disable=True)
    out = p(prompt=CASE["prompt"], negative_prompt=CASE["negative_prompt"], image=Image.fromarray(picture),
            ip_adapter_image=Image.fromarray(refs["ip_image"]), num_inference_steps=CASE["steps"],
            guidance_scale=CASE["cfg"], image_guidance_scale=CASE["image_cfg"],
            generator=torch.Generator("cpu").manual_seed(CASE["seed"]), output_type="np")
    image = (out.images * 255).round().astype(np.uint8)
    print(image.shape, float(image.std()))
    np.savez_compressed(IPA / "ip2p_refs.npz", image=image, case=np.array(json.dumps(CASE)))


if __name__ == "__main__":
    main()
