"""masked_content="fill" (A1111's img2img "Masked content: fill", inpainting_fill 0): the pipeline fills its fitted
init image where the fitted mask repaints with A1111's ``masking.fill`` (its pixels: the fixture of
scripts/gen_a1111_fill_refs.py, run on A1111's own code, tests/serve/data/a1111_fill.npz), in A1111's order
(processing.py's img2img init): fit (through an init_upscaler), then fill; for "only masked" crop, fit, then fill.
"latent noise" and "latent nothing" fill first too, as A1111's init fills for every value but 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="the fill is Pillow's")

FILL_REFS = Path(__file__).parents[1] / "serve" / "data" / "a1111_fill.npz"


def _request_64() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with np.load(FILL_REFS) as data:
        return tuple(data[f"request_64/{k}"] for k in ("picture", "mask", "filled"))  # type: ignore[return-value]


def _fit(demo_pipe, **kwargs) -> np.ndarray:
    from sdrt.pipelines import validate

    s = validate("x", **kwargs)
    try:
        init, _ = demo_pipe._fit_init(s)
    finally:
        demo_pipe._paste = demo_pipe._init_source = None
    return init


@pytest.mark.parametrize("content", ["fill", "latent noise", "latent nothing"])
def test_the_run_starts_from_a1111s_filled_picture(demo_pipe, content) -> None:
    picture, mask, filled = _request_64()
    np.testing.assert_array_equal(_fit(demo_pipe, init_image=picture, mask=mask, masked_content=content, width=64,
                                       height=64), filled)
    np.testing.assert_array_equal(_fit(demo_pipe, init_image=picture, mask=mask, width=64, height=64), picture)


def _tall_picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    picture = np.full((40, 20, 3), 250, np.uint8)  # Crop and Resize to 64x64 keeps rows 10 to 30
    picture[10:30, :, 0] = 20 + 4 * np.arange(20)[:, None]  # the kept rows darker than the rest
    picture[10:30, :, 1:] = 40
    mask = np.zeros((40, 20), np.uint8)
    mask[22:30] = 255  # down to the crop's edge: filled before the crop, the pale rows below would fill them
    return picture, mask


def test_fill_comes_after_the_fit(demo_pipe) -> None:
    """A1111 fits the picture (through its upscaler_for_img2img), then fills it: the colours are the cropped
    picture's; filling first and cropping after takes the pale rows' colours."""
    from sdrt.pipelines.images import CROP_AND_RESIZE, fit_array
    from sdrt.pipelines.maskedcontent import fill

    picture, mask = _tall_picture_and_mask()
    common = dict(init_image=picture, mask=mask, resize_mode="Crop and Resize", width=64, height=64,
                  init_upscaler="Lanczos")
    got = _fit(demo_pipe, masked_content="fill", **common)
    fitted = demo_pipe.fit_init_image(picture, 64, 64, CROP_AND_RESIZE, "Lanczos")
    fitted_mask = fit_array(mask, 64, 64, CROP_AND_RESIZE, "mask", "mask")
    np.testing.assert_array_equal(got, fill(fitted, fitted_mask))
    wrong = demo_pipe.fit_init_image(fill(picture, mask), 64, 64, CROP_AND_RESIZE, "Lanczos")
    repaint = fitted_mask >= 128
    assert np.abs(wrong.astype(int) - got.astype(int))[repaint].max() > 40
    np.testing.assert_array_equal(got[~repaint & (fitted_mask == 0)], fitted[~repaint & (fitted_mask == 0)])


def test_only_masked_fills_the_fitted_cut_out(demo_pipe) -> None:
    """inpaint_area="only masked": the cut-out is filled once fitted, from its own colours, as A1111's init does;
    filling the whole picture first and cutting after gives other colours."""
    from sdrt.pipelines.maskedcontent import fill
    from sdrt.pipelines.onlymasked import prepare

    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:80, 0:96]
    picture = np.clip(np.stack([x * 2, y * 3, 255 - x - y], axis=-1) + rng.integers(0, 20, (80, 96, 3)), 0,
                      255).astype(np.uint8)
    mask = np.zeros((80, 96), np.uint8)
    mask[30:44, 52:70] = 255
    init = _fit(demo_pipe, init_image=picture, mask=mask, inpaint_area="only masked", inpaint_padding=4, width=64,
                height=64, masked_content="fill")
    cut, cut_mask, _ = prepare(picture, mask, 64, 64, 4)
    np.testing.assert_array_equal(init, fill(cut, cut_mask))
    wrong, _, _ = prepare(fill(picture, mask), mask, 64, 64, 4)
    assert np.abs(wrong.astype(int) - init.astype(int)).max() > 10


def test_latent_upscale_fills_the_picture_at_its_size(demo_pipe, monkeypatch) -> None:
    """Just Resize (latent upscale) VAE-encodes the picture at its own size: that picture is filled, with the
    mask at its size (the demo model's encoder takes 64x64 only: the fit alone is run, as if it took any)."""
    from sdrt.pipelines import validate
    from sdrt.pipelines.maskedcontent import fill

    picture, mask, _ = _request_64()
    small = np.ascontiguousarray(picture[::2, ::2])
    s = validate("x", init_image=small, mask=mask[::2, ::2], masked_content="fill", width=64, height=64,
                 resize_mode="Just Resize (latent upscale)")
    monkeypatch.setattr(demo_pipe, "latent_upscale_blocked", lambda w, h: None)
    try:
        demo_pipe._fit_init(s)
        source = demo_pipe._init_source
    finally:
        demo_pipe._paste = demo_pipe._init_source = None
    np.testing.assert_array_equal(source, fill(small, mask[::2, ::2]))


def test_infotext_images_and_cli(demo_pipe, tmp_path, capsys) -> None:
    from sdrt import pipelines
    from sdrt.cli import main

    picture, mask, _ = _request_64()
    common = dict(init_image=picture, mask=mask, strength=0.6, steps=2, cfg=1, seed=3)
    base = demo_pipe.generate("a red circle", **common)
    filled = demo_pipe.generate("a red circle", masked_content="Fill", **common)
    assert filled.settings[0]["Masked content"] == "fill" and "Masked content" not in base.settings[0]
    assert np.abs(filled.images[0].astype(int) - base.images[0].astype(int)).max() > 3  # measured: 9
    init, m, out = tmp_path / "init.png", tmp_path / "mask.png", tmp_path / "out.png"
    Image.fromarray(picture).save(init)
    Image.fromarray(mask).save(m)
    assert main(["generate", str(pipelines.DEMO_MODEL), "a red circle", "--init-image", str(init), "--mask", str(m),
                 "--masked-content", "fill", "--strength", "0.6", "--steps", "2", "--seed", "3", "--cfg", "1",
                 "--backend", "openvino", "-o", str(out)]) == 0
    capsys.readouterr()
    with Image.open(out) as img:
        assert "Masked content: fill" in img.text["parameters"]
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), filled.images[0])
