"""mask_blur (A1111's img2img "Mask blur", mask_blur_x / mask_blur_y): sdrt.pipelines.maskblur against OpenCV's own
``cv2.GaussianBlur`` run as A1111's processing.py runs it (along x, then along y, each only when above 0), captured
by scripts/gen_mask_blur_refs.py (tests/pipelines/data/mask_blur.npz; the tests never import cv2); then the
pipeline blurs the mask at its own size before the fit, writes A1111's infotext field, and refuses bad values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data" / "mask_blur.npz"
CASES = ("box_1", "box_2", "box_4", "box_7", "box_16", "box_x6_y0", "box_x0_y3", "box_x2_y9", "border_5", "noise_3",
         "dots_11_5", "thin_64")


@pytest.fixture(scope="module")
def refs():
    with np.load(DATA) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("case", CASES)
def test_blur_is_opencvs(refs, case: str) -> None:
    """Exact: every pixel of every case equals OpenCV's."""
    from sdrt.pipelines.maskblur import blur

    mask, (bx, by), want = refs[f"{case}/mask"], refs[f"{case}/blur"], refs[f"{case}/blurred"]
    before = mask.copy()
    got = blur(mask, int(bx), int(by))
    np.testing.assert_array_equal(mask, before)
    assert got.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_the_references_are_not_pillows(refs) -> None:
    """What the fixture tells apart: Pillow's GaussianBlur (a box-blur approximation, serve's old blur) is off."""
    from PIL import Image, ImageFilter

    mask, want = refs["box_4/mask"], refs["box_4/blurred"]
    pillow = np.asarray(Image.fromarray(mask).filter(ImageFilter.GaussianBlur(4)))
    assert np.abs(pillow.astype(int) - want.astype(int)).max() > 3
    assert (refs["box_x6_y0/blurred"] != refs["box_x6_y0/mask"]).any()
    np.testing.assert_array_equal(refs["box_x6_y0/blurred"][:, 0], refs["box_x6_y0/mask"][:, 0])  # along x only


def test_kernels_sum_to_256() -> None:
    from sdrt.pipelines.maskblur import fixed_kernel, kernel_size

    assert [kernel_size(b) for b in (1, 4, 64)] == [7, 21, 321]
    for b in (1, 2, 3, 4, 9, 64):
        taps = fixed_kernel(kernel_size(b), b)
        assert taps.sum() == 256 and (taps == taps[::-1]).all()
        if b <= 4:  # wider kernels are ragged (error diffusion of taps near 1/256), as OpenCV's are
            assert (np.diff(taps[:len(taps) // 2 + 1]) >= 0).all()


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    picture = rng.integers(0, 255, (40, 48, 3)).astype(np.uint8)
    mask = np.zeros((40, 48), np.uint8)
    mask[11:27, 9:33] = 255
    return picture, mask


def test_the_pipeline_blurs_at_the_masks_size(demo_pipe) -> None:
    """The run's mask: the mask blurred at its own size, then fitted (A1111's order), binarized; only masked cuts
    the box of the blurred mask and pastes with it."""
    from sdrt.pipelines import validate
    from sdrt.pipelines.images import binarize, fit_array
    from sdrt.pipelines.maskblur import blur

    picture, mask = _picture_and_mask()
    s = validate("x", init_image=picture, mask=mask, width=64, height=64, mask_blur=(6, 2))
    _, run_mask = demo_pipe._fit_init(s)
    want = binarize(fit_array(blur(mask, 6, 2), 64, 64, "Just Resize", "mask", "mask"))
    np.testing.assert_array_equal(run_mask, want)
    plain = binarize(fit_array(mask, 64, 64, "Just Resize", "mask", "mask"))
    assert (run_mask != plain).any()
    s = validate("x", init_image=picture, mask=mask, width=64, height=64, mask_blur=5, inpaint_area="only masked",
                 inpaint_padding=0)
    try:
        demo_pipe._fit_init(s)
        paste = demo_pipe._paste
    finally:
        demo_pipe._paste = None
    np.testing.assert_array_equal(paste.overlay, blur(mask, 5, 5))  # the paste's alpha: the blurred mask
    x1, y1, x2, y2 = paste.box
    assert x1 < 9 and y1 < 11 and x2 > 33 and y2 > 27  # the box covers the blur


def test_infotext_and_cli(demo_pipe, tmp_path, capsys) -> None:
    from PIL import Image

    from sdrt import pipelines
    from sdrt.cli import main

    picture, mask = _picture_and_mask()
    common = dict(init_image=picture, mask=mask, strength=0.6, steps=2, cfg=1, seed=3, width=64, height=64)
    same = demo_pipe.generate("a red circle", mask_blur=4, **common)
    apart = demo_pipe.generate("a red circle", mask_blur=(4, 2), **common)
    none = demo_pipe.generate("a red circle", **common)
    assert same.settings[0]["Mask blur"] == 4  # A1111's field; it writes none when x and y differ, nor for 0
    assert "Mask blur" not in apart.settings[0] and "Mask blur" not in none.settings[0]
    init, m, out = tmp_path / "init.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(picture).save(init)
    Image.fromarray(mask).save(m)
    base = ["generate", str(pipelines.DEMO_MODEL), "a red circle", "--init-image", str(init), "--mask", str(m),
            "--strength", "0.6", "--steps", "2", "--seed", "3", "--cfg", "1", "--width", "64", "--height", "64",
            "--backend", "openvino", "-o", str(out)]
    assert main([*base, "--mask-blur", "4,2"]) == 0
    capsys.readouterr()
    with Image.open(out) as img:
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), apart.images[0])
    assert main([*base, "--mask-blur", "4"]) == 0
    capsys.readouterr()
    with Image.open(out) as img:
        assert "Mask blur: 4" in img.text["parameters"]
    assert main([*base, "--mask-blur", "soft"]) == 1
    err = capsys.readouterr().err
    assert "--mask-blur must be an integer" in err and err.count("\n") == 1, err


def test_refusals() -> None:
    from sdrt.errors import InputError
    from sdrt.pipelines import validate

    picture, mask = _picture_and_mask()
    for bad in (-1, 1.5, True, (1, 2, 3), "4", 10_000):
        with pytest.raises(InputError, match="mask_blur must be an integer from 0"):
            validate("x", init_image=picture, mask=mask, mask_blur=bad)
    with pytest.raises(InputError, match="mask_blur acts on a mask, and no mask was given"):
        validate("x", init_image=picture, mask_blur=4)
    with pytest.raises(InputError, match="pass mask_blur=.x, y. instead"):
        validate("x", init_image=picture, mask=mask, mask_blur_x=4)
    assert validate("x", init_image=picture, mask=mask).mask_blur == (0, 0)  # diffusers' default: none
