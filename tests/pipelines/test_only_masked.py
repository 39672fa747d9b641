"""inpaint_area="only masked" (A1111's Inpaint area: Only masked; diffusers' padding_mask_crop) against diffusers.

The references (tests/data/pipelines/only_masked.*, scripts/gen_onlymasked_refs.py) are diffusers'
``StableDiffusionInpaintPipeline`` / ``StableDiffusionXLInpaintPipeline`` with ``padding_mask_crop`` on the tiny
models: a picture larger than the 64x64 run, the mask's padded box grown to a square (moved inside at a border; a
wide strip filled with bars), run, and pasted back with the mask as the overlay's alpha. Tolerance: the existing
inpainting cases' (pipeline_helpers.assert_matches_diffusers). The crop box is also checked alone against the one
diffusers' ``get_crop_region`` gave, and the arithmetic against A1111's documented examples.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, fast_backend, register

from sdrt import pipelines
from sdrt.errors import InputError
from sdrt.pipelines.onlymasked import crop_box

pytest.importorskip("PIL.Image", reason="the crop is fitted and pasted with Pillow")

CASES = json.loads((DATA / "only_masked.json").read_text())
REFS = np.load(DATA / "only_masked.npz")
#: the reference backend is slow: it runs one case of each kind of UNet
SHORT = {"sd15/blend/padded square", "sd15-inpaint/corner, moved inside"}
_PIPES: dict[tuple[str, str], pipelines.Pipeline] = {}


def _pipe(folder: str, backend: str) -> pipelines.Pipeline:
    if (folder, backend) not in _PIPES:
        _PIPES[(folder, backend)] = pipelines.load(DATA / folder, backend=backend)
    return _PIPES[(folder, backend)]


@pytest.fixture(scope="module", autouse=True)
def _close():
    yield
    for p in _PIPES.values():
        p.close()
    _PIPES.clear()


def _run(case: dict, backend: str, **extra):
    name = case["name"]
    return _pipe(case["folder"], backend).generate(
        case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"],
        seed=case["seed"], batch=case["batch"], width=case["width"], height=case["height"],
        init_image=REFS[f"{name}/picture"], mask=REFS[f"{name}/mask"], strength=case["strength"],
        inpaint_area="only masked", inpaint_padding=case["padding"], **extra)


def _params():
    for case in CASES:
        for backend in ("openvino", "reference"):
            if backend == "reference" and case["name"] not in SHORT:
                continue
            yield pytest.param(case, backend, id=f"{case['name']}:{backend}")


@pytest.mark.parametrize(("case", "backend"), list(_params()))
def test_matches_diffusers_padding_mask_crop(case: dict, backend: str) -> None:
    register(backend)
    gen = _run(case, backend)
    want = REFS[f"{case['name']}/image"]
    assert gen.images[0].shape == REFS[f"{case['name']}/picture"].shape  # the picture's size, not the run's
    assert_matches_diffusers(gen.images, want)
    assert gen.settings[0]["Inpaint area"] == "Only masked"
    assert gen.settings[0]["Masked area padding"] == case["padding"]
    assert gen.settings[0]["Size"] == f"{case['width']}x{case['height']}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_crop_box_is_diffusers(case: dict) -> None:
    mask = REFS[f"{case['name']}/mask"]
    assert list(crop_box(mask, case["width"], case["height"], case["padding"])) == case["crop"]


def test_crop_box_a1111_examples() -> None:
    """A1111's expand_crop_region docstring: a 128x32 mask area processed at 512x512 becomes 128x128; at a
    border the grown box moves inside; a box that no picture side can hold is cut to the picture."""
    mask = np.zeros((400, 600), np.uint8)
    mask[200:232, 100:228] = 255
    assert crop_box(mask, 512, 512, 0) == (100, 152, 228, 280)
    assert crop_box(mask, 512, 256, 0) == (100, 184, 228, 248)  # 2:1 already
    mask[:] = 0
    mask[100:110, 200:213] = 255
    assert crop_box(mask, 512, 512, 0) == (200, 99, 213, 112)  # 3 rows more: 1 above, 2 below (A1111's split)
    mask[:] = 0
    mask[0:10, 590:600] = 255
    assert crop_box(mask, 512, 512, 4) == (586, 0, 600, 14)  # padded, cut at the corner: 14x14
    assert crop_box(mask, 1024, 512, 4) == (572, 0, 600, 14)  # grown left only: the right edge holds
    mask[:] = 0
    mask[100:110, 0:600] = 255
    assert crop_box(mask, 512, 512, 8) == (0, 0, 600, 400)  # no square fits: the whole height
    assert crop_box(np.zeros((8, 8), np.uint8), 64, 64, 32) is None


def test_only_the_masked_box_changes() -> None:
    """The run's pixels land only in the crop box, and only where the mask is not black (the overlay keeps the
    picture elsewhere, byte for byte)."""
    case = CASES[0]
    gen = _run(case, fast_backend())
    picture, mask = REFS[f"{case['name']}/picture"], REFS[f"{case['name']}/mask"]
    changed = np.any(gen.images[0] != picture, axis=-1)
    assert changed.any()
    assert not changed[mask == 0].any()


def test_refusals() -> None:
    """An all-black mask, a mask of another size, and the options without what they act on: one-line errors
    naming the argument."""
    case = CASES[0]
    pipe = _pipe(case["folder"], fast_backend())
    picture = REFS[f"{case['name']}/picture"]
    with pytest.raises(InputError, match="all black") as e:
        pipe.generate("x", steps=1, init_image=picture, mask=np.zeros(picture.shape[:2], np.uint8),
                      inpaint_area="only masked", width=64, height=64)
    assert e.value.where == "mask"
    with pytest.raises(InputError, match="the init image's size|init image 96x80") as e:
        pipe.generate("x", steps=1, init_image=picture, mask=np.full((64, 64), 255, np.uint8),
                      inpaint_area="only masked", width=64, height=64)
    for kwargs, where in ((dict(inpaint_area="only masked"), "inpaint_area"),
                          (dict(inpaint_padding=8, mask=REFS[f"{case['name']}/mask"]), "inpaint_padding"),
                          (dict(inpaint_area="only masked", mask=REFS[f"{case['name']}/mask"], resize_mode=1),
                           "resize_mode"),
                          (dict(inpaint_area="most of it", mask=REFS[f"{case['name']}/mask"]), "inpaint_area"),
                          (dict(inpaint_area="only masked", inpaint_padding=-1, mask=REFS[f"{case['name']}/mask"]),
                           "inpaint_padding")):
        with pytest.raises(InputError) as e:
            pipelines.validate("x", init_image=picture, **kwargs)
        assert e.value.where == where, (kwargs, e.value)
    s = pipelines.validate("x", init_image=picture, mask=REFS[f"{case['name']}/mask"], inpaint_area="Only_Masked")
    assert (s.inpaint_area, s.inpaint_padding) == ("only masked", 32)  # A1111's default padding


def test_cli_only_masked_writes_the_picture_with_a1111s_fields(tmp_path, capsys) -> None:
    """``sdrt generate --inpaint-area only-masked --inpaint-padding 8``: the PNG is the picture's size, its
    parameters say A1111's two fields, and its pixels are the API's."""
    from PIL import Image

    from sdrt.cli import main
    from sdrt.pipelines.png import read_parameters

    case, backend = CASES[0], fast_backend()
    init, mask, out = tmp_path / "init.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(REFS[f"{case['name']}/picture"]).save(init)
    Image.fromarray(REFS[f"{case['name']}/mask"]).save(mask)
    rc = main(["generate", str(DATA / case["folder"]), case["prompt"], "--negative", case["negative_prompt"],
               "--init-image", str(init), "--mask", str(mask), "--inpaint-area", "only-masked", "--inpaint-padding",
               str(case["padding"]), "--steps", str(case["steps"]), "--sampler", case["sampler"], "--seed",
               str(case["seed"]), "--strength", str(case["strength"]), "--backend", backend, "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    with Image.open(out) as img:
        text = img.text["parameters"]
        pixels = np.asarray(img.convert("RGB"))
    assert pixels.shape == REFS[f"{case['name']}/picture"].shape
    assert "Size: 64x64, " in text and "Inpaint area: Only masked, Masked area padding: 8" in text, text
    assert read_parameters(out) == text
    assert np.array_equal(pixels, _run(case, backend).images[0])


@pytest.mark.parametrize(("extra", "message"), [
    (["--inpaint-area", "only-masked"], "--inpaint-area says which area a mask's run paints, and no mask was given. "
     "Where: --inpaint-area. What to do: pass --mask too, or leave --inpaint-area unset."),
    (["--mask", "m.png", "--inpaint-padding", "8"], "--inpaint-padding widens the area 'only masked' inpainting cuts "
     "out, and --inpaint-area is 'whole picture'. Where: --inpaint-padding. What to do: pass --inpaint-area 'only "
     "masked' too, or leave --inpaint-padding unset."),
    (["--mask", "m.png", "--inpaint-area", "some"], "unknown --inpaint-area 'some'. Where: --inpaint-area."),
])
def test_cli_refusals_are_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, message) -> None:
    from PIL import Image

    from sdrt.cli import main

    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save("init.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save("m.png")
    assert main(["generate", "/no/such/folder", "a cat", "--init-image", "init.png", *extra,
                 "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err


def test_a_stopped_runs_partial_images_are_pasted_back_too() -> None:
    """A run stopped by its callback gives its batch decoded from the last estimate (Interrupted.partial), put back
    into the picture as the finished images are."""
    from sdrt.errors import Interrupted

    case = CASES[0]
    picture = REFS[f"{case['name']}/picture"]
    pipe = _pipe(case["folder"], fast_backend())
    with pytest.raises(Interrupted) as stop:
        pipe.generate("a cat", steps=4, seed=1, init_image=picture, mask=REFS[f"{case['name']}/mask"],
                      inpaint_area="only masked", inpaint_padding=4, width=64, height=64,
                      callback=lambda step, total, latents: step < 2)
    partial = stop.value.partial()
    assert partial.images[0].shape == picture.shape
    assert np.array_equal(partial.images[0][REFS[f"{case['name']}/mask"] == 0],
                          picture[REFS[f"{case['name']}/mask"] == 0])


def test_the_paste_back_enlarges_through_the_init_upscaler_as_a1111() -> None:
    """A crop larger than the run is shrunk for it (no upscaler then), and each image is enlarged back to the crop by
    A1111's uncrop, ``resize_image(1, ...)`` with no upscaler name, which falls back to ``upscaler_for_img2img``: the
    init_upscaler ("Nearest" here) makes the pasted area, Lanczos without one; outside the box the picture stays."""
    rng = np.random.default_rng(5)
    picture = rng.integers(0, 256, (160, 176, 3), dtype=np.uint8)
    mask = np.zeros((160, 176), np.uint8)
    mask[20:140, 30:150] = 255  # a 120x120 box, padded: shrunk to 64x64 for the run
    pipe = _pipe(CASES[0]["folder"], fast_backend())
    kw = dict(steps=2, seed=3, init_image=picture, mask=mask, inpaint_area="only masked", inpaint_padding=4,
              width=64, height=64)
    plain = pipe.generate("a cat", **kw).images[0]
    nearest = pipe.generate("a cat", init_upscaler="Nearest", **kw).images[0]
    assert not np.array_equal(nearest[mask > 0], plain[mask > 0])
    assert np.array_equal(nearest[mask == 0], plain[mask == 0])
    blocks = nearest[20:140, 30:150].astype(int)  # Nearest's 1.9x: runs of equal neighbours, Lanczos' none
    assert (np.abs(np.diff(blocks, axis=1)).sum(-1) == 0).mean() > 0.3 > (
        np.abs(np.diff(plain[20:140, 30:150].astype(int), axis=1)).sum(-1) == 0).mean()
