"""ControlNet inpainting as sd-webui-controlnet does it (``inpaint`` / ``inpaint_global_harmonious``, ``inpaint_only``).

References (``scripts/gen_inpaint_controlnet_refs.py``, tiny-sd15-controlnet): diffusers' ``StableDiffusionControlNet
Pipeline`` with ``make_inpaint_condition``'s hint (txt2img), ``StableDiffusionControlNetInpaintPipeline`` (img2img
with the run's mask, the unit taking the init image and mask), and the extension's ``inpaint_only`` restore and
pixel blend written in torch around diffusers' models; within 1 level (measured: 0 or 1 on each backend). The
pipelines compile in float32: the tiny net's conditioning embedding is drawn 20 times larger (gen_controlnet_refs),
and on a dense picture (not a sparse edge map) OpenVINO's bf16 and ggml's fp16 defaults move the image by 10 to 50
levels, the plain ControlNet with the same picture as much.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend, register

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines import inpaintcn
from sdrt.pipelines.controlnet import ControlNet

FOLDER = DATA / "tiny-sd15-controlnet"
BACKENDS = ["reference", "openvino", "ggml"]


def _cases() -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((FOLDER / "inpaint.json").read_text())}


def _run(pipe, case: dict, z, **over) -> np.ndarray:
    kw = dict(steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], seed=case["seed"], width=case["width"],
              height=case["height"])
    pre = over.pop("preprocessor", case["preprocessor"])
    if "strength" in case:  # the unit takes the run's init image and mask, as the extension's unit without an image
        unit = ControlNet(case["controlnet"], None, case["scale"], preprocessor=pre)
        kw.update(init_image=z["picture"], mask=z["mask"], strength=case["strength"])
    else:
        unit = ControlNet(case["controlnet"], z["picture"], case["scale"], preprocessor=pre, control_mask=z["mask"])
    kw.update(over)
    return pipe.generate(case["prompt"], case["negative_prompt"], controlnets=[unit], **kw).images[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_inpaint_controlnet_equals_references(backend: str) -> None:
    register(backend)
    z = np.load(FOLDER / "inpaint.npz")
    worst = {}
    options = {} if backend == "reference" else {"precision": "fp32"}  # (the reference backend is float32)
    with pipelines.load(FOLDER, backend=backend, **options) as pipe:
        for name, case in _cases().items():
            d = np.abs(_run(pipe, case, z).astype(int) - z[name][0].astype(int))
            worst[name] = int(d.max())
    assert all(m <= 1 for m in worst.values()), worst


def test_inpaint_controlnet_has_teeth() -> None:
    """The mask left out of the hint, inpaint_only without its restore, the alias: each is checked."""
    z = np.load(FOLDER / "inpaint.npz")
    cases = _cases()
    with pipelines.load(FOLDER, backend=fast_backend()) as pipe:
        case = cases["inpaint/txt2img"]
        plain = pipe.generate(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                              seed=case["seed"], width=64, height=64,
                              controlnets=[ControlNet("controlnet", z["picture"], case["scale"])]).images[0]
        harmonious = _run(pipe, cases["inpaint_only/txt2img"], z, preprocessor="inpaint_global_harmonious")
        alias = _run(pipe, cases["inpaint/txt2img"], z, preprocessor="inpaint_global_harmonious")
        # a run with its own mask: inpaint_only runs as inpaint, as the extension's (its restore would move it)
        fallback = _run(pipe, cases["inpaint/img2img mask"], z, preprocessor="inpaint_only")
    assert np.abs(fallback.astype(int) - z["inpaint/img2img mask"][0]).max() <= 1
    assert np.abs(plain.astype(int) - z["inpaint/txt2img"][0]).max() > 10
    assert np.abs(harmonious.astype(int) - z["inpaint_only/txt2img"][0]).max() > 10
    assert np.abs(alias.astype(int) - z["inpaint/txt2img"][0]).max() <= 1


def test_hint_and_maps_follow_the_extension() -> None:
    rgb = np.full((16, 16, 3), 200, np.uint8)
    mask = np.zeros((16, 16), np.uint8)
    mask[4:8, 4:12] = 255
    a = inpaintcn.rgba(rgb, mask)
    h = inpaintcn.hint(a)
    assert h.shape == (1, 3, 16, 16) and h.dtype == np.float32
    assert (h[0, :, 4:8, 4:12] == -1).all() and np.allclose(h[0, :, :4], 200 / 255)
    assert np.allclose(inpaintcn.hint(inpaintcn.rgba(rgb, None)), 200 / 255)  # no mask: nothing masked
    big = inpaintcn.resize_map(a, 32, 32, "Just Resize")
    assert set(np.unique(big[:, :, 3])) == {0, 255} and big[8:16, 8:24, 3].all()
    filled = inpaintcn.resize_map(a, 32, 16, "Resize and Fill")  # the padding is masked, as the extension's
    assert (filled[:, :8, 3] == 255).all() and (filled[:, 24:, 3] == 255).all()
    lat = inpaintcn.latent_mask(big)
    assert lat.shape == (1, 1, 4, 4)


def test_inpaint_units_refused_in_one_line() -> None:
    z = np.load(FOLDER / "inpaint.npz")
    with pytest.raises(InputError, match="inpaint_only\\+lama preprocessor needs ControlNetLama.pth"):
        pipelines.controlnet.parse_units([ControlNet("controlnet", z["picture"], preprocessor="inpaint_only+lama")])
    with pytest.raises(InputError, match="no control image"):
        pipelines.controlnet.parse_units([ControlNet("controlnet", None, preprocessor="canny")])
    from sdrt.pipelines.controlnet import check_no_control_mask

    unit = ControlNet("controlnet", z["picture"], preprocessor="inpaint_only", control_mask=z["mask"])
    with pytest.raises(InputError, match="hint of an SD inpaint ControlNet .* and this is a Flux ControlNet"):
        check_no_control_mask(unit, "controlnets[0]", "a Flux ControlNet")
    check_no_control_mask(unit, "controlnets[0]", "a SD 1.x ControlNet", sd=True)  # an SD net reads its mask
    with pipelines.load(FOLDER, backend=fast_backend()) as pipe:
        with pytest.raises(InputError, match="init image and mask of an img2img run"):
            pipe.generate("x", steps=1, width=64, height=64,
                          controlnets=[ControlNet("controlnet", None, preprocessor="inpaint")])
        with pytest.raises(InputError, match="control mask is 8x8"):
            pipe.generate("x", steps=1, width=64, height=64, controlnets=[
                ControlNet("controlnet", z["picture"], preprocessor="inpaint", control_mask=np.zeros((8, 8), np.uint8))])


def test_inpaint_on_the_command_line(tmp_path, capsys) -> None:
    """--control-preprocessor inpaint_only with --control-mask gives the reference image and its infotext; a unit whose
    --control-image is the --init-image takes --mask (the extension's unit without an image); inpaint_only+lama
    without --control-preprocessor-models is one line naming the file it needs."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")  # float32, as the references
    z = np.load(FOLDER / "inpaint.npz")
    cases = _cases()
    pic, mask, out = tmp_path / "pic.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(z["picture"]).save(pic)
    Image.fromarray(z["mask"]).save(mask)

    def args(case: dict) -> list[str]:
        return ["generate", str(FOLDER), case["prompt"], "-n", case["negative_prompt"], "--steps", str(case["steps"]),
                "--cfg", str(case["cfg"]), "--seed", str(case["seed"]), "--sampler", "Euler", "--width", "64",
                "--height", "64", "--backend", "reference", "--control-image", str(pic),
                "--control-preprocessor", case["preprocessor"], "-o", str(out)]

    only = cases["inpaint_only/txt2img"]
    assert main([*args(only), "--control-mask", str(mask)]) == 0, capsys.readouterr().err
    image = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert np.abs(image - z[only["name"]][0]).max() <= 1
    assert 'ControlNet 0: "Module: inpaint_only, Model: controlnet' in Image.open(out).text["parameters"]
    i2i = cases["inpaint/img2img mask"]
    assert main([*args(i2i), "--init-image", str(pic), "--mask", str(mask), "--strength", "0.75"]) == 0, \
        capsys.readouterr().err
    image = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert np.abs(image - z[i2i["name"]][0]).max() <= 1
    capsys.readouterr()
    assert main([*args(only)[:-4], "--control-preprocessor", "inpaint_only+lama", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor inpaint_only+lama" in err and "ControlNetLama.pth" in err, err


def test_resized_maps_equal_the_extensions() -> None:
    """The RGBA map resized to the pass's size as the extension's detectmap_proc does (OpenCV, float32: scripts/
    gen_inpaint_controlnet_refs.py): the mask equal, the picture within half a level (sdrt resizes in uint8, the extension
    in float32), at six sizes and the three resize modes."""
    z = np.load(FOLDER / "inpaint.npz")
    want = np.load(FOLDER / "inpaint_maps.npz")
    a = inpaintcn.rgba(z["picture"], z["mask"])
    worst = {}
    for key in want.files:
        size, mode = key.split("/")
        w, h = (int(v) for v in size.split("x"))
        got = inpaintcn.resize_map(a, w, h, mode)
        ref = want[key]
        assert got.shape == ref.shape, key
        assert np.array_equal(got[:, :, 3], ref[:, :, 3].astype(np.uint8)), key
        worst[key] = float(np.abs(got[:, :, :3].astype(np.float32) - np.clip(ref[:, :, :3], 0, 255)).max())
    assert all(d <= 0.51 for d in worst.values()), worst  # measured: 0.5 (uint8 rounding), the mask equal


def test_a_thin_strip_resize_and_fill_is_one_pixel_high() -> None:
    """A 1x400 picture fitted in 64x64 is 0.16 pixels tall: one row on the fill, not a ZeroDivisionError from the
    resize (the inpaint map's resize and the plain control image's)."""
    from sdrt.pipelines.controlmaps import resize_control

    strip = np.full((1, 400, 3), 30, np.uint8)
    out = inpaintcn.resize_map(inpaintcn.rgba(strip, np.zeros((1, 400), np.uint8)), 64, 64, "Resize and Fill")
    assert out.shape == (64, 64, 4) and (out[31, :, 3] == 0).all() and (out[30, :, 3] == 255).all() and (out[0, :, 3] == 255).all()
    assert resize_control(strip, 64, 64, "Resize and Fill").shape == (64, 64, 3)
    assert resize_control(strip.transpose(1, 0, 2), 64, 64, "Resize and Fill").shape == (64, 64, 3)


def test_no_restore_or_blend_leaks_into_the_next_run() -> None:
    """A run after an inpaint_only run (its restore hook and blend) equals the same run on a fresh pipeline, and an
    inpaint_only run twice gives the same image (no map, latent or hook kept from the last run)."""
    z = np.load(FOLDER / "inpaint.npz")
    case = _cases()["inpaint_only/txt2img"]
    kw = dict(steps=2, cfg=case["cfg"], seed=case["seed"], width=64, height=64)
    with pipelines.load(FOLDER, backend=fast_backend()) as fresh:
        want = fresh.generate(case["prompt"], controlnets=[ControlNet("controlnet", z["picture"])], **kw).images[0]
    with pipelines.load(FOLDER, backend=fast_backend()) as pipe:
        unit = ControlNet("controlnet", z["picture"], preprocessor="inpaint_only", control_mask=z["mask"])
        first = pipe.generate(case["prompt"], controlnets=[unit], **kw).images[0]
        after = pipe.generate(case["prompt"], controlnets=[ControlNet("controlnet", z["picture"])], **kw).images[0]
        again = pipe.generate(case["prompt"], controlnets=[unit], **kw).images[0]
    assert np.array_equal(after, want)
    assert np.array_equal(again, first)
