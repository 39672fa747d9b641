"""Several IP-Adapters of different kinds and image encoders in one run, against diffusers.

``scripts/gen_ipadapter_mixed_refs.py`` ran diffusers' ``load_ip_adapter`` with lists on tiny-sd15: a ViT-bigG/14
base adapter (the tiny bigG stand-in's ``image_embeds``) and a Full Face adapter (the tiny ViT-H stand-in's penultimate
hidden states, and a zero picture's for the negative), each adapter's embeds made by diffusers' ``encode_image`` with
its own encoder (a diffusers pipeline holds one), with and without step windows. sdrt runs them as two encoder parts,
each encoder once.
"""

from __future__ import annotations

import json

import numpy as np
from pipeline_helpers import assert_matches_diffusers
from test_ipadapter import FOLDER, IPA, REFS
from test_ipadapter_more import tiny_encoder_graphs  # noqa: F401

from sdrt import pipelines
from sdrt.pipelines import IPAdapter

MIXED = np.load(IPA / "mixed_refs.npz")
CASES = {c["name"]: c for c in json.loads((IPA / "mixed_refs.json").read_text())}
PICTURES = {"a": REFS["ip_image"], "b": np.load(IPA / "multi_refs.npz")["picture_b"]}
ENCODERS = {"ip-adapter_tiny_vit-G.safetensors": "image_encoder_g", "ip-adapter-full-face_tiny.safetensors":
            "image_encoder"}


def adapters(case: dict) -> list[IPAdapter]:
    return [IPAdapter(IPA / f, image=PICTURES[pic], scale=scale, image_encoder=IPA / ENCODERS[f], start=start,
                      end=end, window=case["window"]) for f, pic, scale, start, end in case["adapters"]]


def kw(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler="Euler", seed=case["seed"], width=64, height=64)


def test_a_vit_bigg_and_a_full_face_adapter_run_together_as_diffusers(tiny_encoder_graphs):  # noqa: F811
    """Both cases within 1 level of diffusers; the plan: two encoder parts (the bigG one on the picture alone, the
    ViT-H one on the picture and Full Face's zero picture), the UNet fed 4 tokens of the first adapter and 17 of the
    second; the infotext has an entry per unit with its window (the bigG module by the published widths:
    tests/checkpoint/test_ipadapter_files.py)."""
    with pipelines.load(FOLDER, backend="reference") as pipe:
        for name, case in CASES.items():
            gen = pipe.generate("a photo of a red cat", "blurry", ip_adapter=adapters(case), **kw(case))
            assert_matches_diffusers(gen.images, MIXED[name])
            assert sorted(p.path.name for p in pipe._ip_encoders.values()) == ["clip_vision.onnx",
                                                                                "clip_vision_g.onnx"]
        case = CASES["mixed/sd15/vitg+fullface"]
        rp = pipe.plan("a photo of a red cat", "blurry", ip_adapter=adapters(case), **kw(case))
        only_g = pipe.generate("a photo of a red cat", "blurry", ip_adapter=adapters(case)[:1], **kw(case)).images
    encoders = {p.part: p.signatures for p in rp.parts if p.role == "image_encoder"}
    assert encoders == {"image_encoder": [((("pixel_values", (1, 3, 32, 32), "float32"),), 1)],
                        "image_encoder_2": [((("pixel_values", (2, 3, 32, 32), "float32"),), 1)]}, encoders
    unet = next(p for p in rp.parts if p.part == "unet")
    feeds = dict((n, s) for n, s, _ in unet.signatures[0][0])
    assert feeds["ip_adapter_1_key"] == (2, 4, 16) and feeds["ip_adapter_1_key_1"] == (2, 17, 16), feeds
    # the Full Face adapter did something: the bigG one alone is another picture
    assert np.abs(only_g[0].astype(int) - MIXED["mixed/sd15/vitg+fullface"][0].astype(int)).max() > 20
    from sdrt.pipelines.png import format_parameters

    info = format_parameters(gen.prompt, gen.negative_prompt, gen.settings[0])
    assert ('Model: ip-adapter_tiny_vit-G, Weight: 0.8, Resize Mode: Crop and Resize, Processor Res: 512, Guidance '
            'Start: 0, Guidance End: 0.5,') in info, info
    assert ('ControlNet 1: "Module: ip-adapter_clip_sd15, Model: ip-adapter-full-face_tiny, Weight: 0.6, Resize Mode: '
            'Crop and Resize, Processor Res: 512, Guidance Start: 0.3, Guidance End: 1,') in info, info
