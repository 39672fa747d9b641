"""Several IP-Adapters of different kinds and encoders in one run: diffusers' references.

diffusers' ``load_ip_adapter`` with lists on the tiny SD 1.x pipeline of ``gen_pipeline_refs.build``: a ViT-bigG/14
base adapter (``ip-adapter_tiny_vit-G``: ``image_embeds`` of the tiny bigG stand-in, ``image_encoder_g/``) and a Full
Face adapter (``ip-adapter-full-face_tiny``: the penultimate hidden states of the tiny ViT-H stand-in,
``image_encoder/``), as ``ip-adapter_sd15_vit-G`` and ``ip-adapter-full-face_sd15`` would run together. A diffusers
pipeline holds one image encoder, so each adapter's embeds are made by diffusers' own ``encode_image`` with that
adapter's encoder set as the pipeline's (``output_hidden_states`` as diffusers decides it for the adapter's
projection: the picture's and a zero picture's hidden states for Full Face, ``image_embeds`` and zeros for the base
adapter) and given as ``ip_adapter_image_embeds=[...]`` (negative first, as diffusers reads them). Windows as in
``gen_ipadapter_multi_refs.py``: ``callback_on_step_end`` sets the next step's scales, 0 outside a window.

Writes ``mixed_refs.npz`` and ``mixed_refs.json`` in ``tests/data/ipadapter/``.

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_ipadapter_mixed_refs.py
"""

from __future__ import annotations

import json
import sys

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_ipadapter_multi_refs as gm  # noqa: E402
import gen_ipadapter_refs as gi  # noqa: E402
import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

OUT = gi.OUT
G, FULL = "ip-adapter_tiny_vit-G.safetensors", "ip-adapter-full-face_tiny.safetensors"
ENCODERS = {G: "image_encoder_g", FULL: "image_encoder"}
#: each case: the adapters (file, picture "a"/"b", scale, start, end) and the window rule
CASES = [
    dict(name="mixed/sd15/vitg+fullface", family="sd15", steps=4, cfg=7.0, seed=61, window="diffusers",
         adapters=[(G, "a", 0.7, 0.0, 1.0), (FULL, "b", 0.6, 0.0, 1.0)]),
    dict(name="mixed/sd15/vitg+fullface/window/a1111", family="sd15", steps=5, cfg=7.0, seed=62, window="a1111",
         adapters=[(G, "a", 0.8, 0.0, 0.5), (FULL, "b", 0.6, 0.3, 1.0)]),
]


def main() -> None:
    from PIL import Image
    from transformers import CLIPVisionModelWithProjection

    torch.set_num_threads(1)
    pictures = {"a": gi.ip_image(), "b": gm.picture_b()}
    encoders = {f: CLIPVisionModelWithProjection.from_pretrained(OUT / e).eval() for f, e in ENCODERS.items()}
    refs: dict[str, np.ndarray] = {}
    pipe = gp.build("sd15")
    files = [G, FULL]
    # the feature extractor (32 px, both tiny encoders' size) and the first encoder come with the load
    pipe.load_ip_adapter([str(OUT)] * 2, subfolder=[""] * 2, weight_name=files,
                         image_encoder_folder=str(OUT / "image_encoder"), low_cpu_mem_usage=False)
    layers = pipe.unet.encoder_hid_proj.image_projection_layers
    for case in CASES:
        assert [a[0] for a in case["adapters"]] == files
        embeds = []
        for (f, pic, *_), layer in zip(case["adapters"], layers):
            from diffusers.models.embeddings import ImageProjection

            pipe.image_encoder = encoders[f]
            hidden = not isinstance(layer, ImageProjection)  # diffusers' own choice, per projection
            with torch.no_grad():
                pos, neg = pipe.encode_image(Image.fromarray(pictures[pic]), "cpu", 1, hidden)
            embeds.append(torch.cat([neg[None], pos[None]]))  # what prepare_ip_adapter_image_embeds chunks
        n = case["steps"]
        table = [[a[2] if gm.on(case["window"], a[3], a[4], i, n) else 0.0 for a in case["adapters"]]
                 for i in range(n)]
        case["scales_per_step"] = table

        def step_end(p, i, t, kw, n: int = n, table: list[list[float]] = table):  # noqa: ANN001
            if i + 1 < n:
                p.set_ip_adapter_scale(table[i + 1])
            return kw

        pipe.set_ip_adapter_scale(table[0])
        sched = gp.SCHEDULERS["Euler"](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)
        out = p(prompt="a photo of a red cat", negative_prompt="blurry", ip_adapter_image_embeds=embeds,
                num_inference_steps=n, guidance_scale=case["cfg"], height=64, width=64, callback_on_step_end=step_end,
                generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        refs[case["name"]] = (out.images * 255).round().astype(np.uint8)
        print(case["name"], table, [tuple(e.shape) for e in embeds], float(refs[case["name"]].std()), flush=True)
    np.savez_compressed(OUT / "mixed_refs.npz", **refs)
    (OUT / "mixed_refs.json").write_text(json.dumps(CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
