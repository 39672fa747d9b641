"""sd-webui-controlnet's ``tile_colorfix`` / ``tile_colorfix+sharp`` (sdrt.pipelines.colorfix).

References (``scripts/gen_colorfix_refs.py``, tiny-sd15-controlnet): the extension's colour fix written in torch
around diffusers' UNet, ControlNetModel, VAE and its Euler and DDIM schedulers (the loop without the fix is
diffusers' ControlNet pipeline's image, 0 levels apart); within 1 level on each backend (measured: 0 or 1). The
pipelines compile in float32 (as test_inpaint_controlnet: a dense picture on the tiny net moves by 10 to 50 levels
in OpenVINO's bf16 or ggml's fp16).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, register

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines import colorfix
from sdrt.pipelines.controlnet import ControlNet, check_no_control_mask, parse_units

FOLDER = DATA / "tiny-sd15-controlnet"
BACKENDS = ["reference", "openvino", "ggml"]


def _cases() -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((FOLDER / "colorfix.json").read_text())}


def _run(pipe, case: dict, z, **over) -> np.ndarray:
    unit = dict(scale=case["scale"], start=case["start"], end=case["end"], preprocessor=case["preprocessor"],
                low=case["low"], high=case["high"])
    unit.update({k: over.pop(k) for k in list(over) if k in unit})
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"])
    kw.update(over)
    return pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[
        ControlNet(case["controlnet"], z["picture"], **unit)], **kw).images[0]


def _diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(int) - b.astype(int)).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_colorfix_equals_references(backend: str) -> None:
    register(backend)
    z = np.load(FOLDER / "colorfix.npz")
    options = {} if backend == "reference" else {"precision": "fp32"}
    with pipelines.load(FOLDER, backend=backend, **options) as pipe:
        worst = {name: _diff(_run(pipe, case, z), z[name][0]) for name, case in _cases().items()}
    assert all(m <= 1 for m in worst.values()), worst


def test_colorfix_has_teeth(monkeypatch) -> None:
    """The colour fix off (tile_resample's map alone), its blur one wider, the sharpening off, the weight not
    mixing: each moves the image off the reference."""
    z = np.load(FOLDER / "colorfix.npz")
    cases = _cases()
    first, sharp, weak = (cases["tile_colorfix/Euler"], cases["tile_colorfix+sharp/variation 3 sharpness 2"],
                          cases["tile_colorfix/variation 3 weight 0.6 window"])
    backend = fast_backend()
    with pipelines.load(FOLDER, backend=backend, **({} if backend == "reference" else {"precision": "fp32"})) as pipe:
        assert _diff(_run(pipe, first, z), z[first["name"]][0]) <= 1
        assert _diff(_run(pipe, first, z, preprocessor="tile_resample"), z[first["name"]][0]) > 10
        assert _diff(_run(pipe, first, z, low=9.0), z[first["name"]][0]) > 3
        assert _diff(_run(pipe, sharp, z, high=0.0), z[sharp["name"]][0]) > 3
        assert _diff(_run(pipe, weak, z, scale=1.0), z[weak["name"]][0]) > 3
        # a blur with mirrored edges instead of replicated ones is caught too
        real = colorfix.blur

        def mirrored(x: np.ndarray, k: int) -> np.ndarray:
            x = np.asarray(x, np.float32)
            kk = min(k, x.shape[-1] - 1)
            p = np.pad(x, ((0, 0), (0, 0), (kk, kk), (kk, kk)), mode="reflect")
            return real(p, k)[:, :, kk:kk + x.shape[2], kk:kk + x.shape[3]]

        monkeypatch.setattr(colorfix, "blur", mirrored)
        assert _diff(_run(pipe, first, z), z[first["name"]][0]) > 3


def test_blur_is_the_extensions() -> None:
    """The replicate-padded (2k+1) box mean, k past the latent's size included, against a plain loop."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 7)).astype(np.float32)
    for k in (0, 1, 3, 8):
        p = np.pad(x, ((0, 0), (0, 0), (k, k), (k, k)), mode="edge")
        want = np.zeros_like(x)
        for i in range(5):
            for j in range(7):
                want[:, :, i, j] = p[:, :, i:i + 2 * k + 1, j:j + 2 * k + 1].mean(axis=(2, 3))
        got = colorfix.blur(x, k)
        assert got.shape == x.shape and got.dtype == np.float32
        assert np.abs(got - want).max() < 1e-5, k
    assert colorfix.radius(None) == 8 and colorfix.radius(3.0) == 3 and colorfix.radius(8.0, hires=True) == 16
    assert colorfix.cond_marks(4, 2)[:, 0, 0, 0].tolist() == [0, 0, 1, 1]
    assert colorfix.cond_marks(3, 1)[:, 0, 0, 0].tolist() == [1, 0, 0]
    assert colorfix.cond_marks(2, 2)[:, 0, 0, 0].tolist() == [1, 1]


def test_fix_eps_keeps_the_high_frequencies_and_takes_the_pictures_low_ones() -> None:
    rng = np.random.default_rng(1)
    ac = np.linspace(0.99, 0.01, 1000)
    x, eps, origin = (rng.standard_normal((2, 4, 8, 8)).astype(np.float32) for _ in range(3))
    out = colorfix.fix_eps(eps, x, 499.6, ac, origin[:1], 3, 1.0)
    a = ac[500]
    x0 = (x - np.sqrt(1 - a) * out) / np.sqrt(a)
    x0_before = (x - np.sqrt(1 - a) * eps) / np.sqrt(a)
    want = x0_before - colorfix.blur(x0_before, 3) + colorfix.blur(origin[:1], 3)
    assert np.allclose(x0, want, atol=1e-4)
    assert np.array_equal(colorfix.fix_eps(eps, x, 499.6, ac, origin[:1], 3, 0.0), eps)  # weight 0: as it was
    half = colorfix.fix_eps(eps, x, 499.6, ac, origin[:1], 3, 0.5)
    assert np.allclose(half, (out + eps) / 2, atol=1e-5)
    marks = colorfix.cond_marks(2, 1)
    sharp = colorfix.fix_eps(eps, x, 499.6, ac, origin[:1], 3, 1.0, 2.0, marks)
    assert np.allclose(sharp[1], out[1], atol=1e-6) and not np.allclose(sharp[0], out[0], atol=1e-3)


def test_sliders_and_nets_refused_in_one_line() -> None:
    z = np.load(FOLDER / "colorfix.npz")
    pic = z["picture"]
    for kw, words in (({"low": 8.5}, "the colour fix's variation, must be a whole number"),
                      ({"low": -1}, "the colour fix's variation, must be a whole number from 0 to 256"),
                      ({"high": 1.0}, "the tile_colorfix preprocessor reads no high threshold")):
        with pytest.raises(InputError, match=words):
            parse_units([ControlNet("controlnet", pic, preprocessor="tile_colorfix", **kw)])
    with pytest.raises(InputError, match="the sharpness, must be a number from 0 to 100"):
        parse_units([ControlNet("controlnet", pic, preprocessor="tile_colorfix+sharp", high=101)])
    unit = parse_units([ControlNet("controlnet", pic, preprocessor="tile_colorfix+sharp", low=3, high=2)])[0]
    assert (unit.low, unit.high) == (3.0, 2.0)
    with pytest.raises(InputError, match="noise prediction while sampling, and this is a Flux ControlNet"):
        check_no_control_mask(unit, "controlnets[0]", "a Flux ControlNet")
    check_no_control_mask(unit, "controlnets[0]", "a SD 1.x ControlNet", sd=True)
    # the map is the picture as it is (the extension's identity), whatever the sliders
    from sdrt.pipelines.preprocessors import preprocess

    assert np.array_equal(preprocess(pic, "tile_colorfix+sharp", 3, 2), pic)
    assert np.array_equal(preprocess(pic[:40], "tile_colorfix", None, None, 512), pic[:40])


def test_batch_rows_are_marked_as_cfg_stacks_them() -> None:
    """A batch of two: each image is the image its seed makes alone (the uncond half of the batched call is the
    first, the one +sharp blurs)."""
    z = np.load(FOLDER / "colorfix.npz")
    case = _cases()["tile_colorfix+sharp/variation 3 sharpness 2"]
    backend = fast_backend()
    with pipelines.load(FOLDER, backend=backend, **({} if backend == "reference" else {"precision": "fp32"})) as pipe:
        unit = ControlNet("controlnet", z["picture"], preprocessor=case["preprocessor"], low=case["low"],
                          high=case["high"])
        both = pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit], steps=case["steps"],
                             cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], batch=2).images
    assert _diff(both[0], z[case["name"]][0]) <= 1


def test_colorfix_on_the_command_line(tmp_path, capsys) -> None:
    """--control-preprocessor tile_colorfix+sharp with --control-threshold-a/-b gives the reference image and the
    extension's infotext (its two sliders as Threshold A and B)."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    z = np.load(FOLDER / "colorfix.npz")
    case = _cases()["tile_colorfix+sharp/variation 3 sharpness 2"]
    pic, out = tmp_path / "pic.png", tmp_path / "out.png"
    Image.fromarray(z["picture"]).save(pic)
    args = ["generate", str(FOLDER), case["prompt"], "-n", case["negative_prompt"], "--steps", str(case["steps"]),
            "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", case["sampler"], "--width", "64",
            "--height", "64", "--backend", "reference", "--control-image", str(pic),
            "--control-preprocessor", case["preprocessor"], "--control-threshold-a", "3",
            "--control-threshold-b", "2", "-o", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    image = np.asarray(Image.open(out).convert("RGB"))
    assert _diff(image, z[case["name"]][0]) <= 1
    text = Image.open(out).text["parameters"]
    assert 'ControlNet 0: "Module: tile_colorfix+sharp, Model: controlnet, Weight: 1,' in text, text
    assert "Threshold A: 3, Threshold B: 2," in text, text
    capsys.readouterr()
    bad = list(args)
    bad[bad.index("--control-threshold-a") + 1] = "8.5"
    assert main(bad) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-threshold-a" in err and "whole number" in err, err


def test_hook_doubles_the_blur_in_the_hires_pass_and_refuses_v_models() -> None:
    """The hook as the pipeline builds it: in the hires fix's second pass a unit that takes part in it blurs twice
    as wide (Variation 4 there is Variation 8 in a first pass), a "Low res only" unit does not (the extension
    still fixes it); a v-prediction model is refused in one line."""
    from types import SimpleNamespace

    z = np.load(FOLDER / "colorfix.npz")
    pic = z["picture"]
    rng = np.random.default_rng(2)
    feeds = {"sample": rng.standard_normal((2, 4, 8, 8)).astype(np.float32), "timestep": np.array([500.0, 500.0])}
    eps = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    with pipelines.load(FOLDER, backend=fast_backend()) as pipe:
        ms = pipe.family.model_sampling(64, 64)

        def fixed(low: float, hires: bool, hr_option: str = "Both") -> np.ndarray:
            unit = parse_units([ControlNet("controlnet", pic, preprocessor="tile_colorfix", low=low,
                                           hr_option=hr_option)])[0]
            unit.prepared = pic
            return pipe._colorfix_hook([unit], ms, 64, 64, 1, hires)(feeds, eps.copy())

        assert np.array_equal(fixed(4, True), fixed(8, False))
        assert np.array_equal(fixed(4, True, "Low res only"), fixed(4, False))
        assert not np.allclose(fixed(4, True), fixed(4, False), atol=1e-3)
        unit = parse_units([ControlNet("controlnet", pic, preprocessor="tile_colorfix")])[0]
        unit.prepared = pic
        with pytest.raises(InputError, match="tile_colorfix corrects the colours through the UNet's noise prediction, "
                                             "and this model predicts v"):
            pipe._colorfix_hook([unit], SimpleNamespace(prediction="v"), 64, 64, 1, False)


@pytest.mark.parametrize("module", ["tile_colorfix", "inpaint_only"])
def test_edm_model_is_refused_in_one_line(module: str, tmp_path) -> None:
    """An EDM-trained eps model (tiny-sdxl-controlnet with Playground v2.5's scheduler) has no DDPM alphas_cumprod to
    predict x0 with: the colour fix and inpaint_only's restore (the same x0 step) are refused in one line, not an
    AttributeError while sampling."""
    import shutil

    from edm_helpers import SPEC

    register("reference")
    folder = tmp_path / "playground-cn"
    shutil.copytree(DATA / "tiny-sdxl-controlnet", folder)
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(SPEC["playground"]["scheduler"]))
    pic = np.load(FOLDER / "colorfix.npz")["picture"]
    extra = {"control_mask": np.pad(np.full((32, 32), 255, np.uint8), 16)} if module == "inpaint_only" else {}
    with pipelines.load(folder, backend="reference") as pipe:
        with pytest.raises(InputError, match="not DDPM-trained") as exc:
            pipe.generate("a cat", steps=1, width=64, height=64,
                          controlnets=[ControlNet("controlnet", pic, preprocessor=module, **extra)])
    assert "\n" not in str(exc.value)


def test_a_folder_without_a_vae_encoder_says_the_unit_needs_it(tmp_path) -> None:
    """The colour fix VAE-encodes its picture, in txt2img too: a folder without vae_encoder is refused in one line
    whose hint names the colour-fix unit (not only an init image or mask, which this run does not have)."""
    import shutil

    from sdrt.errors import ModelNotFoundError

    register("reference")
    folder = tmp_path / "no-encoder"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("vae_encoder", "*.npz"))
    index = json.loads((folder / "model_index.json").read_text())
    index.pop("vae_encoder", None)
    (folder / "model_index.json").write_text(json.dumps(index))
    pic = np.load(FOLDER / "colorfix.npz")["picture"]
    with pipelines.load(folder, backend="reference") as pipe:
        with pytest.raises(ModelNotFoundError, match="no vae_encoder part") as exc:
            pipe.generate("a cat", steps=1, width=64, height=64,
                          controlnets=[ControlNet("controlnet", pic, preprocessor="tile_colorfix")])
    assert "tile_colorfix" in str(exc.value) and "\n" not in str(exc.value)
