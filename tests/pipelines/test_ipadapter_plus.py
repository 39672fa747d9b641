"""IP-Adapter Plus against diffusers' ``load_ip_adapter`` on the tiny SD 1.x and SDXL ONNX folders.

``scripts/gen_ipadapter_plus_refs.py`` wrote, in ``tests/data/ipadapter``, adapters in h94's Plus key layout
(``ip-adapter-plus_sd15.safetensors``'s: a Resampler under ``image_proj.``, 16 queries, 4 blocks, float16; random
weights) and diffusers' images: its pipelines encode the picture's penultimate hidden states and, for the negative
pass, a zero picture's; its ``IPAdapterPlusImageProjection`` makes the tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import assert_matches_diffusers, register
from test_ipadapter import DATA, FOLDER, IPA, REFS, kwargs, tiny_encoder_graph  # noqa: F401

from sdrt import pipelines
from sdrt.checkpoint.ipadapter import open_ip_adapter
from sdrt.errors import ModelError
from sdrt.pipelines import IPAdapter

PLUS = np.load(IPA / "plus_refs.npz")
ALL = json.loads((IPA / "plus_refs.json").read_text())
CASES = [c for c in ALL if not c["name"].startswith("plus/sdxl/")]
XL_CASES = [c for c in ALL if c["name"].startswith("plus/sdxl/")]


def unit(scale: float, adapter: str = "ip-adapter-plus_tiny.safetensors", encoder: object = IPA / "image_encoder"
         ) -> IPAdapter:
    return IPAdapter(IPA / adapter, image=REFS["ip_image"], scale=scale, image_encoder=encoder)


def test_the_resampler_is_diffusers_ip_adapter_plus_image_projection():
    ad = open_ip_adapter(IPA / "ip-adapter-plus_tiny.safetensors", base="sd1", text_width=32)
    assert (ad.kind, ad.tokens, ad.image_dim, ad.cross) == ("plus", 16, 32, 32)
    got = ad.project(PLUS["hidden"])
    assert got.shape == PLUS["tokens"].shape == (1, 16, 32)
    assert np.abs(got - PLUS["tokens"]).max() < 1e-4


def test_ip_adapter_plus_on_an_onnx_folder_matches_diffusers(tiny_encoder_graph):  # noqa: F811
    with pipelines.load(FOLDER, backend="reference") as pipe:
        for case in CASES:
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"]),
                                **kwargs(case)).images
            assert_matches_diffusers(got, PLUS[case["name"]])
        case = CASES[0]
        plain = pipe.generate(case["prompt"], case["negative_prompt"], **kwargs(case)).images[0]
    assert np.abs(plain.astype(int) - PLUS[case["name"]][0].astype(int)).max() > 20  # the adapter did something


def test_ip_adapter_plus_on_an_sdxl_folder_matches_diffusers(tiny_encoder_graph):  # noqa: F811
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl", backend="reference") as pipe:
        for case in XL_CASES:
            ip = unit(case["scale"], adapter="ip-adapter-plus_tiny_sdxl.safetensors")
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
            assert_matches_diffusers(got, PLUS[case["name"]])


def test_the_plan_encodes_the_picture_and_a_zero_picture_in_one_call(tiny_encoder_graph):  # noqa: F811
    case = CASES[0]
    with pipelines.load(FOLDER, backend="reference") as pipe:
        rp = pipe.plan(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"]), **kwargs(case))
    enc = next(p for p in rp.parts if p.part == "image_encoder")
    assert enc.signatures == [((("pixel_values", (2, 3, 32, 32), "float32"),), 1)]
    unet = next(p for p in rp.parts if p.part == "unet")
    assert ("ip_adapter_1_key", (2, 16, 16), "float32") in unet.signatures[0][0]


def test_an_encoder_without_hidden_states_is_refused_for_plus(monkeypatch, tmp_path):
    """An encoder graph giving image_embeds only (what the base adapter reads, as clip_vision_h did before) cannot
    feed a Plus adapter: one error naming the missing output, on the image_encoder argument."""
    import onnx

    from sdrt.checkpoint import graphs

    model = onnx.load(str(IPA / "clip_vision.onnx"), load_external_data=False)
    keep = [o for o in model.graph.output if o.name == "image_embeds"]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    onnx.save(model, str(tmp_path / "clip_vision.onnx"))
    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: tmp_path / "clip_vision.onnx" if name == "clip_vision_h"
                        else real(name))
    register("reference")
    with pipelines.load(FOLDER, backend="reference") as pipe:
        with pytest.raises(ModelError, match="gives no penultimate_hidden_states") as info:
            pipe.generate("a cat", ip_adapter=unit(1.0), **kwargs(CASES[0]))
    assert info.value.where == "image_encoder"
