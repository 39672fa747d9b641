"""A1111's inpainting_fill 0 ("fill") when an upscaler_for_img2img enlarges the picture: A1111's img2img init
(modules/processing.py, StableDiffusionProcessingImg2Img.init) resizes the picture to the size first, through the
upscaler, then fills it (masking.fill) where the mask fitted the same way repaints. Under Crop and Resize the fill's
colours are then the cropped picture's. The fill itself is checked pixel for pixel against A1111's own in
test_serve_fill_a1111.py; here the order: the reference is that fill applied to A1111's geometry computed in numpy
and Pillow (the crop, then the fill), which filling first and cropping after would miss by far. The last test sends
a request and checks that the picture its run starts from is A1111's filled one (tests/serve/data/a1111_fill.npz). The fill
is the pipeline's masked_content="fill" (tests/pipelines/test_masked_fill.py)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from serve_helpers import png_b64 as _b64

Image = pytest.importorskip("PIL.Image", reason="the request's pictures are PNGs")


def _crop_and_resize(arr: np.ndarray, width: int, height: int) -> np.ndarray:
    """A1111's resize_image mode 1 for a picture taller than the size's ratio: Lanczos to the width, the middle
    rows kept."""
    src_h = arr.shape[0] * width // arr.shape[1]
    big = np.asarray(Image.fromarray(arr).resize((width, src_h), Image.LANCZOS))
    top = src_h // 2 - height // 2
    return big[top:top + height]


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    picture = np.full((40, 20, 3), 250, np.uint8)  # 20 wide, 40 high: Crop and Resize to 64x64 keeps rows 10 to 30
    picture[10:30, :, 0] = 20 + 4 * np.arange(20)[:, None]  # the kept rows darker: the whole picture's mean is not
    picture[10:30, :, 1:] = 40                              # theirs
    mask = np.zeros((40, 20), np.uint8)
    mask[22:30] = 255  # eight rows down to the crop's edge: uncropped, the pale rows below would fill them
    return picture, mask


def test_fill_takes_the_colour_of_the_fitted_picture(demo_pipe) -> None:
    from sdrt.pipelines import validate
    from sdrt.pipelines.maskedcontent import fill
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.config import Limits

    picture, mask = _picture_and_mask()
    body = {"init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 0, "inpainting_fill": 0,
            "resize_mode": 1, "denoising_strength": 0.5}
    kwargs: dict = {"width": 64, "height": 64}
    _img2img(body, kwargs, Limits(), [], upscaler="Lanczos")
    assert kwargs["masked_content"] == "fill"  # the pipeline fills, after it fitted the picture
    np.testing.assert_array_equal(kwargs["init_image"], picture)  # nothing filled before the fit
    try:
        sent, _ = demo_pipe._fit_init(validate("x", **kwargs))  # the picture the run starts from
    finally:
        demo_pipe._paste = None
    assert sent.shape == (64, 64, 3) and kwargs["init_upscaler"] == "Lanczos"

    # A1111: the picture and the mask cropped and resized, then the whole picture replaced by masking.fill's
    fitted = _crop_and_resize(picture, 64, 64)
    fitted_mask = _crop_and_resize(mask, 64, 64)
    want = fill(fitted, fitted_mask).astype(np.int16)
    repaint = fitted_mask >= 128
    # the other order, filled at the picture's own size then cropped, takes the pale rows' colours (below the crop)
    wrong = _crop_and_resize(fill(picture, mask), 64, 64).astype(np.int16)
    assert np.abs(wrong - want)[repaint].max() > 40
    assert len(np.unique(sent[repaint], axis=0)) > 10  # no single colour: spread from the surroundings
    # sdrt's Lanczos upscaler and Pillow's LANCZOS differ by a few levels at most
    np.testing.assert_allclose(sent.astype(np.int16), want, atol=4)


def test_a_request_fills_after_the_upscaler(server) -> None:
    """Through the server: the worker fits and fills, the run fits nothing more and names its upscaler."""
    import json

    import httpx

    picture, mask = _picture_and_mask()
    body = {"prompt": "a red circle", "steps": 2, "seed": 1, "cfg_scale": 1, "width": 64, "height": 64,
            "init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 0, "resize_mode": 1,
            "denoising_strength": 0.5, "override_settings": {"upscaler_for_img2img": "Lanczos"}}
    with httpx.Client(base_url=server, timeout=300) as client:
        fill = client.post("/sdapi/v1/img2img", json={**body, "inpainting_fill": 0})
        original = client.post("/sdapi/v1/img2img", json={**body, "inpainting_fill": 1})
    assert fill.status_code == 200 and original.status_code == 200, fill.text
    info = json.loads(fill.json()["info"])
    assert info["sdrt_not_honoured"] == [] and "Init upscaler: Lanczos" in info["infotexts"][0]
    assert fill.json()["images"] != original.json()["images"]


def test_a_request_starts_from_a1111s_filled_picture(server) -> None:
    """Through the server, no upscaler, the picture at the size: inpainting_fill 0 on a picture runs as
    inpainting_fill 1 (the picture kept as sent) on A1111's own fill of it, the same seed giving the same image
    (but for the overlay's rim); the unfilled picture gives another."""
    from pathlib import Path

    import httpx

    with np.load(Path(__file__).parent / "data" / "a1111_fill.npz") as data:
        picture, mask, filled = (data[f"request_64/{k}"] for k in ("picture", "mask", "filled"))
    body = {"prompt": "a red circle", "steps": 2, "seed": 3, "cfg_scale": 1, "width": 64, "height": 64,
            "mask": _b64(mask), "mask_blur": 0, "resize_mode": 0, "denoising_strength": 0.6}
    with httpx.Client(base_url=server, timeout=300) as client:
        fill = client.post("/sdapi/v1/img2img", json={**body, "init_images": [_b64(picture)], "inpainting_fill": 0})
        a1111 = client.post("/sdapi/v1/img2img", json={**body, "init_images": [_b64(filled)], "inpainting_fill": 1})
        plain = client.post("/sdapi/v1/img2img", json={**body, "init_images": [_b64(picture)], "inpainting_fill": 1})
    for r in (fill, a1111, plain):
        assert r.status_code == 200, r.text
    pixels = {k: [np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")) for b in r.json()["images"]]
              for k, r in (("fill", fill), ("a1111", a1111), ("plain", plain))}
    # the PNGs' infotexts differ (Masked content), and so does A1111's overlay on the mask's grey rim below 128: it
    # pastes back the picture as sent (unfilled) there, through the doubled mask; elsewhere the same pixels
    same = (mask >= 128) | (mask == 0)
    assert same.mean() > 0.9
    np.testing.assert_array_equal(pixels["fill"][0][same], pixels["a1111"][0][same])
    np.testing.assert_array_equal(pixels["fill"][0][mask == 0], picture[mask == 0])
    assert np.abs(pixels["fill"][0].astype(int) - pixels["plain"][0].astype(int)).max() > 0
