"""IP-Adapter (image prompts) against diffusers' ``load_ip_adapter`` on the tiny SD 1.x ONNX folder.

``scripts/gen_ipadapter_refs.py`` wrote ``tests/data/ipadapter``: a tiny CLIP image encoder (transformers' folder),
its architecture exported as sdrt's shipped ``clip_vision_h`` is (weight-free; it stands in for the shipped graph
here), an adapter in h94's key layout with random weights, and diffusers' images of ``StableDiffusionPipeline`` with
that adapter loaded (``ip_adapter_image`` through its own CLIPImageProcessor, ``set_ip_adapter_scale``). The UNet is
``tests/data/pipelines/tiny-sd15``'s (an Optimum-style export: anonymous weights, layers found by node names).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import ModelError
from sdrt.pipelines import IPAdapter
from sdrt.pipelines.ipadapter import clip_pixels

DATA = Path(__file__).resolve().parents[1] / "data"
IPA = DATA / "ipadapter"
FOLDER = DATA / "pipelines" / "tiny-sd15"
REFS = np.load(IPA / "refs.npz")
ALL = json.loads((IPA / "refs.json").read_text())
CASES = [c for c in ALL if not c["name"].startswith(("sdxl/", "controlnet+ip/"))]
CN_CASES = [c for c in ALL if c["name"].startswith("controlnet+ip/")]
XL_CASES = [c for c in ALL if c["name"].startswith("sdxl/")]


@pytest.fixture
def tiny_encoder_graph(monkeypatch):
    """sdrt's shipped ViT-H/14 graph replaced by the tiny encoder's, exported the same way."""
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: IPA / "clip_vision.onnx" if name == "clip_vision_h"
                        else real(name))
    register("reference")


def unit(scale: float, encoder: object = IPA / "image_encoder", adapter: str = "ip-adapter_tiny.safetensors"
         ) -> IPAdapter:
    return IPAdapter(IPA / adapter, image=REFS["ip_image"], scale=scale, image_encoder=encoder)


def kwargs(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=64, height=64)


def test_clip_pixels_are_transformers_clip_image_processor():
    got = clip_pixels(REFS["ip_image"], 32)  # 48x40 -> shorter side 32 (bicubic), centre crop, CLIP mean/std
    assert got.shape == REFS["pixel_values"].shape
    assert np.abs(got - REFS["pixel_values"]).max() < 1e-5


def test_ip_adapter_on_an_onnx_folder_matches_diffusers(tiny_encoder_graph):
    with pipelines.load(FOLDER, backend="reference") as pipe:
        for k, case in enumerate(CASES):  # the second finds image_encoder/ beside the adapter, as in h94's models/
            ip = unit(case["scale"], encoder=None if k else IPA / "image_encoder")
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])
            assert any(n.startswith("ip_adapter_") for n in pipe.unet.inputs)
        case = CASES[-1]
        plain = pipe.generate(case["prompt"], case["negative_prompt"], **kwargs(case)).images[0]
        assert not any(n.startswith("ip_adapter_") for n in pipe.unet.inputs)  # the file's own graph again
        zero = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(0.0), **kwargs(case)).images[0]
    assert np.abs(plain.astype(int) - REFS[case["name"]][0].astype(int)).max() > 20  # the adapter did something
    assert np.abs(plain.astype(int) - zero.astype(int)).max() <= 1  # scale 0: no image


def test_ip_adapter_on_an_sdxl_folder_matches_diffusers(tiny_encoder_graph):
    """tiny-sdxl (two text encoders, 1 and 2 transformer layers a block, an empty negative prompt as zeros) with
    an adapter of its 64-wide text: diffusers' StableDiffusionXLPipeline with load_ip_adapter."""
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl", backend="reference") as pipe:
        for case in XL_CASES:
            ip = unit(case["scale"], adapter="ip-adapter_tiny_sdxl.safetensors")
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=ip, **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])
        with pytest.raises(ModelError, match="32-wide text encoder .*, and the model is SDXL \\(64-wide text\\)"):
            pipe.generate("a cat", ip_adapter=unit(1.0), **kwargs(XL_CASES[0]))  # the SD 1.x one


def test_ip_adapter_with_a_controlnet_matches_diffusers(tiny_encoder_graph):
    """tiny-sd15-controlnet's net and the adapter together: diffusers' StableDiffusionControlNetPipeline with
    load_ip_adapter (the UNet graph that takes residuals, given IP attention too)."""
    folder = DATA / "pipelines" / "tiny-sd15-controlnet"
    edges = np.load(folder / "refs.npz")["edges"]
    with pipelines.load(folder, backend="reference") as pipe:
        for case in CN_CASES:
            got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"]),
                                controlnets=[("controlnet", edges, case["control_scale"])], **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])


def test_generate_cli_ip_adapter_flags_match_diffusers(tiny_encoder_graph, tmp_path, capsys):
    from PIL import Image

    from sdrt.cli import main

    picture = tmp_path / "face.png"
    Image.fromarray(REFS["ip_image"]).save(picture)
    case, out = CASES[0], tmp_path / "out.png"
    rc = main(["generate", str(FOLDER), case["prompt"], "--negative", case["negative_prompt"], "--steps",
               str(case["steps"]), "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", case["sampler"],
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out),
               "--ip-adapter", str(IPA / "ip-adapter_tiny.safetensors"), "--ip-adapter-image", str(picture),
               "--ip-adapter-scale", str(case["scale"]), "--image-encoder", str(IPA / "image_encoder")])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as img:
        assert_matches_diffusers([np.asarray(img.convert("RGB"))], REFS[case["name"]])
        text = img.text["parameters"]
    # as sd-webui-controlnet records an IP-Adapter unit (JSON-quoted: the value holds commas)
    assert ('ControlNet 0: "Module: ip-adapter_clip_sd15, Model: ip-adapter_tiny, Weight: 0.6, Resize Mode: Crop and '
            'Resize, Processor Res: 512, Guidance Start: 0, Guidance End: 1, Pixel Perfect: False, Control Mode: '
            'Balanced"') in text, text


@pytest.mark.parametrize("flags, words", [
    (["--ip-adapter", str(IPA / "ip-adapter_tiny.safetensors")], "--ip-adapter needs --ip-adapter-image"),
    (["--ip-adapter-scale", "0.5"], "--ip-adapter-scale without --ip-adapter"),
    (["--ip-adapter", str(IPA / "image_encoder" / "model.safetensors"), "--ip-adapter-image", "PICTURE"],
     "is not an IP-Adapter"),
    (["--ip-adapter", str(IPA / "ip-adapter_tiny.safetensors"), "--ip-adapter-image", "PICTURE", "--image-encoder",
      str(IPA / "nowhere")], "pass --image-encoder"),
])
def test_generate_cli_ip_adapter_errors_speak_in_flags(tiny_encoder_graph, tmp_path, capsys, flags, words):
    from PIL import Image

    from sdrt.cli import main

    picture = tmp_path / "face.png"
    Image.fromarray(REFS["ip_image"]).save(picture)
    flags = [str(picture) if f == "PICTURE" else f for f in flags]
    rc = main(["generate", str(FOLDER), "a cat", "--steps", "1", "--backend", "reference", "-o",
               str(tmp_path / "o.png"), *flags])
    err = capsys.readouterr().err
    assert rc != 0
    assert words in err, err
    assert "Traceback" not in err and len([line for line in err.splitlines() if line.startswith("error")]) == 1, err


def test_low_memory_releases_the_image_encoder_after_encoding(tiny_encoder_graph):
    """With low_memory the encoder (ViT-H/14: 2.5 GB in float32, more than an SD 1.5 UNet in fp16) is closed once
    the picture is encoded, as the text encoders are, and the image is the same; it stayed compiled before."""
    case = CASES[0]
    with pipelines.load(FOLDER, backend="reference", low_memory=True) as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"]),
                            **kwargs(case)).images
        assert not next(iter(pipe.__dict__["_ip_encoders"].values())).sessions
        again = pipe.generate(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"]),
                              **kwargs(case)).images
    assert_matches_diffusers(got, REFS[case["name"]])
    assert np.array_equal(got[0], again[0])


def test_the_plan_lists_the_image_encoder_call(tiny_encoder_graph):
    """pipe.plan / --dry-run ran no encoder (zero embeds made up in place): its part and call were missing."""
    case = CASES[0]
    with pipelines.load(FOLDER, backend="reference") as pipe:
        rp = pipe.plan(case["prompt"], case["negative_prompt"], ip_adapter=unit(case["scale"]), **kwargs(case))
        assert "_ip_encoders" not in pipe.__dict__  # nothing compiled
    enc = next(p for p in rp.parts if p.part == "image_encoder")
    assert (enc.role, enc.calls, enc.signatures) == ("image_encoder", 1,
                                                     [((("pixel_values", (1, 3, 32, 32), "float32"),), 1)])
    unet = next(p for p in rp.parts if p.part == "unet")
    assert ("ip_adapter_1_key", (2, 4, 16), "float32") in unet.signatures[0][0]


def test_the_hires_fix_second_pass_keeps_the_adapter(tiny_encoder_graph):
    """As sd-webui-controlnet's IP-Adapter unit (hr_option "Both"): every UNet call of both passes, the second at
    its upscaled size, reads the image tokens (tiny-sdxl-dyn: a UNet of free size, tiny-sdxl's 64-wide text)."""
    ip = unit(0.7, adapter="ip-adapter_tiny_sdxl.safetensors")
    with pipelines.load(DATA / "pipelines" / "tiny-sdxl-dyn", backend="reference") as pipe:
        rp = pipe.plan("a red cat", "blurry", ip_adapter=ip, steps=2, sampler="Euler", seed=1, width=64, height=64,
                       hires_scale=1.5, hires_steps=2, hires_denoise=0.6)
    unet = next(p for p in rp.parts if p.part == "unet")
    sizes = {dict((n, s) for n, s, _ in sig)["sample"][2:]: count for sig, count in unet.signatures}
    assert sizes == {(8, 8): 2, (12, 12): 2}, sizes
    for sig, _ in unet.signatures:
        feeds = dict((n, s) for n, s, _ in sig)
        assert feeds["ip_adapter_1_key"][:2] == (2, 4), feeds  # the picture's and the zero embeds' rows


def test_ip_adapter_on_instruct_pix2pix_matches_diffusers(tiny_encoder_graph):
    """tiny-sd15-ip2p (an 8-channel UNet, three CFG row blocks) with the adapter: diffusers'
    StableDiffusionInstructPix2PixPipeline with load_ip_adapter (scripts/gen_ipadapter_ip2p_refs.py), whose row
    blocks get the picture's embeds, then zeros, then zeros."""
    refs = np.load(IPA / "ip2p_refs.npz")
    case = json.loads(str(refs["case"]))
    init = np.load(DATA / "pipelines" / "tiny-sd15-ip2p" / "refs.npz")["init_image"]
    with pipelines.load(DATA / "pipelines" / "tiny-sd15-ip2p", backend="reference") as pipe:
        got = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                            image_cfg=case["image_cfg"], sampler=case["sampler"], seed=case["seed"], init_image=init,
                            ip_adapter=unit(case["scale"])).images
    assert_matches_diffusers(got, refs["image"])


@pytest.mark.parametrize("encoder", [5, ["models/image_encoder"]])
def test_an_image_encoder_that_is_no_path_is_refused_when_checked(encoder):
    """It was accepted and became a TypeError traceback (Path(5)) when the job opened it."""
    from sdrt.errors import InputError
    from sdrt.pipelines.ipadapter import parse

    with pytest.raises(InputError, match="image encoder must be a folder or file path") as info:
        parse(IPAdapter(IPA / "ip-adapter_tiny.safetensors", image=REFS["ip_image"], image_encoder=encoder))
    assert info.value.where == "image_encoder"
