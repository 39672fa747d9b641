"""The T2I-Adapter style adapter (sd-webui-controlnet's ``t2ia_style_clipvision``) against the extension's algorithm
written in torch around diffusers' tiny SD 1.x pipeline (``scripts/gen_style_adapter_refs.py``).

``tests/data/styleadapter``: a tiny QuickGELU ``CLIPVisionModelWithProjection`` saved as the extension's
``clip_vitl.pth``, its architecture exported as the shipped ``clip_vision_l`` is (standing in for it), a tiny style
adapter in TencentARC's key layout, and the reference images.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines import ControlNet

STY = DATA.parent / "styleadapter"
REFS = np.load(STY / "refs.npz")
ALL = json.loads((STY / "refs.json").read_text())
CASES = [c for c in ALL if "control_scale" not in c]
CN_CASES = [c for c in ALL if "control_scale" in c]
SD15 = DATA / "tiny-sd15"
ADAPTER = STY / "t2iadapter_style_tiny.pth"
ENCODER = STY / "clip_vision" / "clip_vitl.pth"


@pytest.fixture
def tiny_vitl(monkeypatch):
    """sdrt's shipped ViT-L/14 graph replaced by the tiny encoder's, exported the same way."""
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    monkeypatch.setattr(graphs, "shipped_graph",
                        lambda name: STY / "clip_vision_l.onnx" if name == "clip_vision_l" else real(name))


def units(case: dict, models: object = ENCODER) -> list[ControlNet]:
    return [ControlNet(ADAPTER, REFS[f"image{u['image']}"], u["weight"], u.get("start", 0.0), u.get("end", 1.0),
                       preprocessor="t2ia_style_clipvision", window="a1111", preprocessor_models=models)
            for u in case["units"]]


def kwargs(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=64, height=64)


def test_adapter_tokens_are_the_torch_modules():
    from sdrt.pipelines.styleadapter import StyleAdapterFile

    ad = StyleAdapterFile(ADAPTER, "controlnets[0]")
    assert (ad.tokens, ad.width, ad.context, ad.layers) == (8, 40, 32, 2)
    assert np.abs(ad(REFS["hidden0"]) - REFS["tokens0"]).max() < 1e-4


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_style_adapter_matches_the_extensions_algorithm(tiny_vitl, backend):
    """One unit; two units, one with a window (the extension's rule) and an empty negative prompt: within 1 level."""
    register(backend)
    with pipelines.load(SD15, backend=backend) as pipe:
        for case in CASES:
            got = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case),
                                **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])
        if backend == "reference":
            case = CASES[0]
            plain = pipe.generate(case["prompt"], case["negative_prompt"], **kwargs(case)).images[0]
            assert np.abs(plain.astype(int) - REFS[case["name"]][0].astype(int)).max() > 20
            info = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case),
                                 **kwargs(case)).settings[0]
            assert "Module: t2ia_style_clipvision, Model: t2iadapter_style_tiny, Weight: 1," in info["ControlNet 0"]


@pytest.mark.parametrize("backend", ["reference", "openvino"])
def test_style_adapter_with_a_controlnet_which_reads_the_lengthened_context(tiny_vitl, backend):
    """tiny-sd15-controlnet's net beside the style unit: the net reads the context with the adapter's tokens, as the
    extension's (and diffusers' ControlNet pipeline given the lengthened prompt_embeds)."""
    register(backend)
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        for case in CN_CASES:
            got = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[
                *units(case), ControlNet("controlnet", REFS["edges"], case["control_scale"])], **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])


def test_refusals_in_one_line(tiny_vitl):
    register("reference")
    case = CASES[0]
    with pipelines.load(DATA / "tiny-sdxl", backend="reference") as pipe, pytest.raises(InputError) as exc:
        pipe.generate("a cat", controlnets=units(case), steps=2, width=64, height=64)
    assert "SDXL" in exc.value.what and exc.value.where == "controlnets[0]"
    with pytest.raises(InputError, match="clip_vitl.pth"):
        pipelines.controlnet.parse_units([ControlNet(ADAPTER, REFS["image0"], preprocessor="t2ia_style_clipvision")])


def test_cli_style_unit_is_the_apis(tiny_vitl, tmp_path, capsys):
    """``--controlnet ADAPTER.pth --control-preprocessor t2ia_style_clipvision --control-preprocessor-models DIR``:
    the reference's picture, the extension's infotext."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    case = CASES[0]
    Image.fromarray(REFS["image0"]).save(tmp_path / "pic.png")
    out = tmp_path / "out.png"
    rc = main(["generate", str(SD15), case["prompt"], "--negative", case["negative_prompt"], "--controlnet",
               str(ADAPTER), "--control-image", str(tmp_path / "pic.png"), "--control-preprocessor",
               "t2ia_style_clipvision", "--control-preprocessor-models", str(STY / "clip_vision"), "--steps",
               str(case["steps"]), "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", "Euler",
               "--width", "64", "--height", "64", "--backend", "reference", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as im:
        got = np.asarray(im.convert("RGB"))
        text = im.text["parameters"]
    assert_matches_diffusers([got], REFS[case["name"]])
    assert "Module: t2ia_style_clipvision, Model: t2iadapter_style_tiny" in text


def test_the_plan_counts_the_encoder_as_an_image_encoder_not_beside_the_unet(tiny_vitl):
    register("reference")
    case = CASES[0]
    with pipelines.load(SD15, backend="reference") as pipe:
        rp = pipe.plan(case["prompt"], case["negative_prompt"], controlnets=units(case), **kwargs(case))
    enc = next(p for p in rp.parts if p.part == "style_encoder")
    assert (enc.role, enc.calls) == ("image_encoder", 1)
    assert {p.part: p.role for p in rp.memory.parts}["style_encoder"] == "image_encoder"
    assert "style_encoder" not in rp._beside.get("unet", [])


def test_the_tokens_follow_every_chunk_of_a_long_prompt(tiny_vitl, monkeypatch):
    """A prompt of three 77-token chunks beside a one-chunk negative: every row's context is 3 * 77 + 8 tokens, the 8
    the adapter's tokens times the weight on the conditional rows (after all the chunks, as the extension appends them
    to A1111's context) and zeros on the unconditional ones."""
    from sdrt.pipelines import styleadapter

    register("reference")
    seen = []
    real = styleadapter.hook

    def spy(prep, state, *, batch, text_input):
        run = real(prep, state, batch=batch, text_input=text_input)

        def wrapped(feeds):
            out = run(feeds)
            seen.append((feeds[text_input], prep.tokens[0] * np.float32(prep.units[0].scale), out[text_input]))
            return out
        return wrapped

    monkeypatch.setattr(styleadapter, "hook", spy)
    case = CASES[0]
    with pipelines.load(SD15, backend="reference") as pipe:
        pipe.generate(" ".join(["a photo of a red cat on a mat"] * 14), "blurry", controlnets=units(case),
                      **kwargs(case))
    ctx, tokens, out = seen[-1]
    assert ctx.shape[:2] == (2, 3 * 77) and out.shape[:2] == (2, 3 * 77 + 8)
    assert np.array_equal(out[:, :231], ctx) and np.all(out[0, 231:] == 0)
    assert np.abs(tokens).max() > 0 and np.allclose(out[1, 231:], tokens[0])


def test_the_plan_counts_the_adapters_own_weights_and_the_run_releases_them_as_it_says(tiny_vitl):
    """The adapter's arrays (float32, held by numpy; the real t2iadapter_style_sd14v1.pth ~150 MB) are a part of the
    memory plan, ``style_adapter:<file>``, beside the style encoder; a plan that keeps them resident keeps them
    for the next job, one that releases them (a tight ``memory=``) drops them once the tokens are made."""
    from sdrt.pipelines.styleadapter import StyleAdapterFile

    register("reference")
    case = CASES[0]
    name = f"style_adapter:{ADAPTER.name}"
    held = sum(a.nbytes for a in StyleAdapterFile(ADAPTER, "x").a.values())
    with pipelines.load(SD15, backend="reference") as pipe:
        rp = pipe.plan(case["prompt"], case["negative_prompt"], controlnets=units(case), **kwargs(case))
        ad = rp.memory.placement(name)
        assert ad is not None and ad.role == "style_adapter" and ad.weight_bytes == held
        assert rp._beside[name] == ["style_encoder"]
        pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case), **kwargs(case))
        assert pipe.memory_plan().placement(name).placement == "resident"
        kept = list(pipe.__dict__["_style_adapters"].values())
        assert len(kept) == 1
        pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case), **kwargs(case))
        assert list(pipe.__dict__["_style_adapters"].values()) == kept  # the same arrays, not read again
    with pipelines.load(SD15, backend="reference", memory="1MB") as pipe:  # below the process: every part released
        pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case), **kwargs(case))
        assert pipe.memory_plan().placement(name).placement != "resident"
        assert not pipe.__dict__["_style_adapters"]
