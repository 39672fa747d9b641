"""mask_overlay (A1111's whole-picture overlay): each image of the run composited under the fitted init image as
A1111's processing.py makes it: ``mask_for_overlay`` is the fitted (blurred) grey mask doubled and clipped to 255,
the overlay image the fitted picture, taken before any fill, pasted on a transparent RGBa canvas through the
inverted overlay mask, and ``apply_overlay`` alpha-composites it over the image. Written here in Pillow from that
code path; the run's own images come from the same seed without the overlay."""

from __future__ import annotations

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="A1111's overlay is a Pillow composite")


def a1111_overlay(image: np.ndarray, picture: np.ndarray, fitted_mask: np.ndarray) -> np.ndarray:
    """processing.py: mask_for_overlay = clip(mask * 2); image_masked (RGBa) pasted with its inverse; the image
    converted to RGBA, alpha_composite(image_masked.convert('RGBA')), then RGB."""
    from PIL import ImageOps

    doubled = Image.fromarray(np.clip(fitted_mask.astype(np.float32) * 2, 0, 255).astype(np.uint8))
    masked = Image.new("RGBa", (picture.shape[1], picture.shape[0]))
    masked.paste(Image.fromarray(picture).convert("RGBA").convert("RGBa"), mask=ImageOps.invert(doubled.convert("L")))
    out = Image.fromarray(image).convert("RGBA")
    out.alpha_composite(masked.convert("RGBA"))
    return np.asarray(out.convert("RGB"))


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[0:48, 0:40]
    picture = np.clip(np.stack([xx * 5, yy * 4, 200 - xx - yy], -1) + rng.integers(0, 30, (48, 40, 3)), 0,
                      255).astype(np.uint8)
    mask = np.zeros((48, 40), np.uint8)
    mask[14:33, 9:27] = 255
    return picture, mask


@pytest.mark.parametrize("content", ["original", "fill"])
def test_the_overlay_is_a1111s(demo_pipe, content) -> None:
    """A blurred mask, the picture fitted from 40x48 to 64x64, a batch of 2: each image is A1111's composite of
    the run's image and the fitted picture (not the filled one); where the overlay mask is black, the picture."""
    from sdrt.pipelines.images import fit_array
    from sdrt.pipelines.maskblur import blur

    picture, mask = _picture_and_mask()
    common = dict(init_image=picture, mask=mask, mask_blur=3, strength=0.7, steps=2, cfg=1, seed=4, width=64,
                  height=64, batch=2, masked_content=content)
    plain = demo_pipe.generate("a red circle", **common)
    over = demo_pipe.generate("a red circle", mask_overlay=True, **common)
    fitted = fit_array(picture, 64, 64, "Just Resize")
    fitted_mask = fit_array(blur(mask, 3, 3), 64, 64, "Just Resize", "mask", "mask")
    assert 0 < fitted_mask.min() or ((fitted_mask > 0) & (fitted_mask < 255)).any()  # grey levels: a soft edge
    for got, run in zip(over.images, plain.images):
        np.testing.assert_array_equal(got, a1111_overlay(run, fitted, fitted_mask))
        kept = fitted_mask == 0
        np.testing.assert_array_equal(got[kept], fitted[kept])  # unmasked: the original, byte for byte
        assert (run[kept] != fitted[kept]).any()  # which the run alone is not
        repaint = fitted_mask >= 128  # doubled: 255, the run's own pixels
        np.testing.assert_array_equal(got[repaint], run[repaint])
    assert over.settings[0]["Mask overlay"] is True and "Mask overlay" not in plain.settings[0]


def test_the_cli_flag_and_refusals(demo_pipe, tmp_path, capsys) -> None:
    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.errors import InputError
    from sdrt.pipelines import validate

    picture, mask = _picture_and_mask()
    init, m, out = tmp_path / "init.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(picture).save(init)
    Image.fromarray(mask).save(m)
    assert main(["generate", str(pipelines.DEMO_MODEL), "a red circle", "--init-image", str(init), "--mask", str(m),
                 "--mask-overlay", "--strength", "0.7", "--steps", "2", "--seed", "4", "--cfg", "1", "--width", "64",
                 "--height", "64", "--backend", "openvino", "-o", str(out)]) == 0
    capsys.readouterr()
    want = demo_pipe.generate("a red circle", init_image=picture, mask=mask, mask_overlay=True, strength=0.7, steps=2,
                         cfg=1, seed=4, width=64, height=64).images[0]
    with Image.open(out) as img:
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), want)
        assert "Mask overlay: True" in img.text["parameters"]
    with pytest.raises(InputError, match="mask_overlay acts on a mask, and no mask was given"):
        validate("x", init_image=picture, mask_overlay=True)
    with pytest.raises(InputError, match="mask_overlay must be True or False"):
        validate("x", init_image=picture, mask=mask, mask_overlay="yes")
    assert validate("x", init_image=picture, mask=mask).mask_overlay is False  # diffusers' default
