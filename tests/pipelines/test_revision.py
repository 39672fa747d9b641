"""Revision (sd-webui-controlnet's ``revision_clipvision`` / ``revision_ignore_prompt``) against the extension's
algorithm written in torch around diffusers' tiny SDXL pipeline (``scripts/gen_revision_refs.py``).

``tests/data/revision``: a tiny ``CLIPVisionModelWithProjection`` saved as the extension's ``clip_g.pth`` (its
``image_embeds`` as wide as tiny-sdxl's pooled text), its architecture exported as the shipped ``clip_vision_g`` is
(``clip_vision_g.onnx``, standing in for it), and the reference images.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import InputError, ModelError
from sdrt.pipelines import ControlNet

REV = DATA.parent / "revision"
REFS = np.load(REV / "refs.npz")
ALL = json.loads((REV / "refs.json").read_text())
CASES = [c for c in ALL if "control_scale" not in c]
CN_CASES = [c for c in ALL if "control_scale" in c]
XL = DATA / "tiny-sdxl"
ENCODER = REV / "clip_vision" / "clip_g.pth"


@pytest.fixture
def tiny_bigg(monkeypatch):
    """sdrt's shipped ViT-bigG/14 and ViT-H/14 graphs replaced by the tiny encoders', exported the same way."""
    from sdrt.checkpoint import graphs

    real = graphs.shipped_graph
    tiny = {"clip_vision_g": REV / "clip_vision_g.onnx", "clip_vision_h": DATA.parent / "ipadapter" / "clip_vision.onnx"}
    monkeypatch.setattr(graphs, "shipped_graph", lambda name: tiny.get(name) or real(name))


def units(case: dict, models: object = ENCODER) -> list[ControlNet]:
    return [ControlNet(None, REFS[f"image{u['image']}"], u["weight"], u.get("start", 0.0), u.get("end", 1.0),
                       preprocessor=u["module"], low=u["noise"] or None, window="a1111", preprocessor_models=models)
            for u in case["units"]]


def kwargs(case: dict) -> dict:
    return dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=64, height=64)


def test_pixels_and_embeds_are_the_extensions(tiny_bigg):
    """The picture squashed with INTER_AREA (no crop) and normalized, through the tiny encoder bound from the .pth:
    the embeds the torch reference got."""
    from sdrt.checkpoint.ipadapter import open_image_encoder
    from sdrt.pipelines.ipadapter import encoder_part
    from sdrt.pipelines.revision import noise_levels, pixels

    register("reference")
    enc = open_image_encoder(ENCODER)
    assert (enc.label, enc.embed_dim, enc.image_size) == ("ViT-bigG/14", 32, 32)
    with pipelines.load(XL, backend="reference") as pipe:
        out = encoder_part(pipe, enc).run({"pixel_values": pixels(REFS["image0"], 32)})
    assert np.abs(out["image_embeds"] - REFS["embeds0"]).max() < 1e-4
    assert noise_levels(None) == noise_levels(0.0) and abs(float(noise_levels(0.0)[1]) - 0.01) < 1e-6
    a, b = noise_levels(1.0)  # clipped to step 999
    assert a < 0.08 and b > 0.99


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_revision_matches_the_extensions_algorithm(tiny_bigg, backend):
    """One unit; ignore_prompt with noise augmentation; two units, one with a window (the extension's rule); both
    prompts empty (the context zeroed): within 1 level of the torch reference."""
    register(backend)
    with pipelines.load(XL, backend=backend) as pipe:
        for case in CASES:
            got = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case),
                                **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])
        case = CASES[0]
        if backend == "reference":
            plain = pipe.generate(case["prompt"], case["negative_prompt"], **kwargs(case)).images[0]
            assert np.abs(plain.astype(int) - REFS[case["name"]][0].astype(int)).max() > 20
            info = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case),
                                 **kwargs(case)).settings[0]
            assert "Module: revision_clipvision, Model: None, Weight: 1," in info["ControlNet 0"]


@pytest.mark.parametrize("backend", ["reference", "openvino"])
def test_revision_with_a_controlnet_which_reads_what_it_changed(tiny_bigg, backend):
    """tiny-sdxl-controlnet's net beside a revision_ignore_prompt unit: the net reads the changed text_embeds and the
    zeroed context (the extension changes them before its ControlNets run)."""
    register(backend)
    with pipelines.load(DATA / "tiny-sdxl-controlnet", backend=backend) as pipe:
        for case in CN_CASES:
            got = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[
                *units(case), ControlNet("controlnet", REFS["edges"], case["control_scale"])], **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])


def test_encoder_layouts_comfyui_file_and_transformers_folder(tiny_bigg, tmp_path):
    """The extension's layout (annotator/downloads/clip_vision/clip_g.pth under an A1111 root), ComfyUI's
    models/clip_vision/clip_vision_g.safetensors, and a transformers folder (config.json + model.safetensors)."""
    import shutil

    from safetensors.numpy import save_file

    from sdrt.weights import Weights

    register("reference")
    a1111 = tmp_path / "a1111"
    (a1111 / "extensions/sd-webui-controlnet/annotator/downloads/clip_vision").mkdir(parents=True)
    shutil.copy(ENCODER, a1111 / "extensions/sd-webui-controlnet/annotator/downloads/clip_vision/clip_g.pth")
    w = Weights.open(ENCODER)
    arrays = {k: np.ascontiguousarray(w.get_array(k)) for k in w.shapes()}
    comfy = tmp_path / "ComfyUI" / "models"
    (comfy / "clip_vision").mkdir(parents=True)
    save_file(arrays, str(comfy / "clip_vision" / "clip_vision_g.safetensors"))
    folder = tmp_path / "image_encoder"
    folder.mkdir()
    save_file(arrays, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"hidden_size": 40, "num_hidden_layers": 3, "projection_dim": 32,
                                                    "image_size": 32, "model_type": "clip_vision_model"}))
    case = CASES[0]
    with pipelines.load(XL, backend="reference") as pipe:
        for models in (a1111, comfy, folder):
            got = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case, models),
                                **kwargs(case)).images
            assert_matches_diffusers(got, REFS[case["name"]])


def test_refusals_in_one_line(tiny_bigg, tmp_path):
    register("reference")
    case = CASES[0]
    sd15 = DATA / "tiny-sd15"
    with pipelines.load(sd15, backend="reference") as pipe, pytest.raises(InputError) as exc:
        pipe.generate("a cat", controlnets=units(case), steps=2, width=64, height=64)
    assert "SD 1.x" in exc.value.what and exc.value.where == "controlnets[0]"
    with pytest.raises(InputError, match="uses no ControlNet model"):
        pipelines.controlnet.parse_units([ControlNet("controlnet", REFS["image0"], preprocessor="revision_clipvision",
                                                     preprocessor_models=ENCODER)])
    with pytest.raises(InputError, match="noise augmentation"):
        pipelines.controlnet.parse_units([ControlNet(None, REFS["image0"], preprocessor="revision_clipvision",
                                                     low=1.5, preprocessor_models=ENCODER)])
    with pytest.raises(InputError, match="clip_g.pth"):
        pipelines.controlnet.parse_units([ControlNet(None, REFS["image0"], preprocessor="revision_clipvision")])
    with pipelines.load(XL, backend="reference") as pipe:
        with pytest.raises(InputError, match="control mode"):
            pipe.generate("a cat", controlnets=[ControlNet(None, REFS["image0"], preprocessor="revision_clipvision",
                                                           control_mode=1, preprocessor_models=ENCODER)],
                          steps=2, width=64, height=64)
        vith = DATA.parent / "ipadapter" / "image_encoder"  # 24-wide embeds: not the pooled width
        with pytest.raises(ModelError) as exc:
            pipe.generate("a cat", controlnets=[ControlNet(None, REFS["image0"], preprocessor="revision_clipvision",
                                                           preprocessor_models=vith)], steps=2, width=64, height=64)
        assert "24-wide image embeds" in exc.value.what and "pooled text vector (text_embeds) is 32" in exc.value.what
        assert exc.value.where == "controlnets[0] preprocessor_models"
        vitl = DATA.parent / "styleadapter" / "clip_vision" / "clip_vitl.pth"  # another size: ViT-bigG/14 is asked for
        with pytest.raises(ModelError) as exc:
            pipe.generate("a cat", controlnets=[ControlNet(None, REFS["image0"], preprocessor="revision_clipvision",
                                                           preprocessor_models=vitl)], steps=2, width=64, height=64)
        assert "of another size" in exc.value.what and exc.value.where == "controlnets[0] preprocessor_models"
        assert "clip_g.pth" in exc.value.fix and "ViT-H" not in exc.value.fix


def test_cli_revision_unit_is_the_apis(tiny_bigg, tmp_path, capsys):
    """``--control-preprocessor revision_ignore_prompt`` with no --controlnet, the encoder from
    --control-preprocessor-models (an A1111 root: the extension's layout under it), the noise as --control-threshold-a;
    an SD 1.x model refused in the flag's words."""
    import shutil

    from PIL import Image

    from sdrt.cli import main

    register("reference")
    case = CASES[1]
    a1111 = tmp_path / "a1111"
    (a1111 / "extensions/sd-webui-controlnet/annotator/downloads/clip_vision").mkdir(parents=True)
    shutil.copy(ENCODER, a1111 / "extensions/sd-webui-controlnet/annotator/downloads/clip_vision/clip_g.pth")
    Image.fromarray(REFS["image0"]).save(tmp_path / "pic.png")
    flags = ["--control-image", str(tmp_path / "pic.png"), "--control-preprocessor", "revision_ignore_prompt",
             "--control-preprocessor-models", str(a1111), "--control-scale", "0.7", "--control-threshold-a", "0.3",
             "--steps", str(case["steps"]), "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler",
             "Euler", "--width", "64", "--height", "64", "--backend", "reference"]
    out = tmp_path / "out.png"
    rc = main(["generate", str(XL), case["prompt"], "--negative", case["negative_prompt"], *flags, "-o",
               str(out)])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as im:
        got = np.asarray(im.convert("RGB"))
        text = im.text["parameters"]
    assert_matches_diffusers([got], REFS[case["name"]])
    assert "Module: revision_ignore_prompt, Model: None, Weight: 0.7" in text and "Threshold A: 0.3" in text
    capsys.readouterr()
    rc = main(["generate", str(DATA / "tiny-sd15"), "a cat", *flags, "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "SD 1.x" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


def test_the_plan_counts_the_encoder_as_an_image_encoder_not_beside_the_unet(tiny_bigg):
    """The revision encoder runs once a job, before the steps: the run plan and the memory plan say it is an image
    encoder (as an IP-Adapter's), not a ControlNet held beside the UNet at every step."""
    register("reference")
    case = CASES[0]
    with pipelines.load(XL, backend="reference") as pipe:
        rp = pipe.plan(case["prompt"], case["negative_prompt"], controlnets=units(case), **kwargs(case))
    enc = next(p for p in rp.parts if p.part.endswith("encoder") and "text" not in p.part)
    assert (enc.role, enc.calls) == ("image_encoder", 1)
    assert {p.part: p.role for p in rp.memory.parts}[enc.part] == "image_encoder"
    assert enc.part not in rp._beside.get("unet", [])


def test_revision_acts_in_both_passes_of_the_hires_fix_on_every_batch_row(tiny_bigg, monkeypatch):
    """Batch 2 with CFG and the hires fix (at scale 1: tiny-sdxl's UNet is fixed at 64x64): at every UNet call of both
    passes the conditional rows' text_embeds are the unit's noised embeds times its weight, the unconditional rows' zeros; the embeds are drawn once
    a job (the same in both passes, seeded by the job's seed). With CFG 1 every row is conditional."""
    from sdrt.pipelines import revision

    register("reference")
    seen = []
    real = revision.hook

    def spy(prep, state, *, batch, text_input):
        run = real(prep, state, batch=batch, text_input=text_input)

        def wrapped(feeds):
            out = run(feeds)
            seen.append((feeds["sample"].shape, prep.embeds[0] * np.float32(prep.units[0].scale), out))
            return out
        return wrapped

    monkeypatch.setattr(revision, "hook", spy)
    case = CASES[0]
    with pipelines.load(XL, backend="reference") as pipe:
        pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case), batch=2,
                      hires_scale=1, hires_steps=2, hires_denoise=1.0, **kwargs(case))
    seen = seen[len(seen) - case["steps"] - 2:]  # the job's (the plan's dry run comes first): one call a step, both passes
    want = seen[0][1]
    assert np.abs(want).max() > 0
    for shape, y, out in seen:
        assert shape[0] == 4 and np.array_equal(y, want)
        assert np.all(out["text_embeds"][:2] == 0) and np.allclose(out["text_embeds"][2:], np.repeat(want, 2, 0))
    seen.clear()  # CFG 1: no unconditional rows, every row conditional
    with pipelines.load(XL, backend="reference") as pipe:
        pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case), batch=2,
                      **{**kwargs(case), "cfg": 1.0})
    for shape, _y, out in seen[len(seen) - case["steps"]:]:
        assert shape[0] == 2 and np.allclose(out["text_embeds"], np.repeat(want, 2, 0))


def test_a_hires_checkpoint_is_refused_without_advice_revision_refuses(tiny_bigg):
    """A hires checkpoint replaces the UNet whose pooled text a revision unit changes, in the second pass: refused in
    one line that says to leave one of them out, not to set hr_option 'Low res only' (which a revision unit has not:
    it acts in both passes, as the extension's)."""
    register("reference")
    with pipelines.load(XL, backend="reference") as pipe, pytest.raises(InputError) as exc:
        pipe.generate("a cat", controlnets=units(CASES[0]), hires_scale=1, hires_checkpoint=XL, steps=2, width=64,
                      height=64)
    assert "revision_clipvision" in exc.value.what and "Low res only" not in (exc.value.fix or "")
    assert exc.value.where == "hires_checkpoint"


def test_an_sdxl_refiner_checkpoint_runs_revision_as_the_extension_does(tiny_bigg, monkeypatch):
    """The SDXL refiner loaded as the model is SDXL to the extension (``is_sdxl``: its check passes and its hook
    replaces the first 1280 of the refiner's ``y``, its pooled text too): the conditional rows' text_embeds are the
    embeds times the weight, the unconditional rows' zeros, and the picture changes."""
    from sdrt.pipelines import revision

    register("reference")
    seen = []
    real = revision.hook

    def spy(prep, state, *, batch, text_input):
        run = real(prep, state, batch=batch, text_input=text_input)

        def wrapped(feeds):
            out = run(feeds)
            seen.append((prep.embeds[0] * np.float32(prep.units[0].scale), out))
            return out
        return wrapped

    monkeypatch.setattr(revision, "hook", spy)
    case = CASES[0]
    args = dict(init_image=REFS["image0"], strength=0.6, **kwargs(case))
    with pipelines.load(DATA / "tiny-sdxl-refiner", backend="reference") as pipe:
        plain = pipe.generate(case["prompt"], case["negative_prompt"], **args).images[0]
        got = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=units(case), **args).images[0]
    want, out = seen[-1]
    assert np.abs(want).max() > 0 and np.all(out["text_embeds"][0] == 0)
    assert np.allclose(out["text_embeds"][1], want[0])
    assert np.abs(plain.astype(int) - got.astype(int)).max() > 0
