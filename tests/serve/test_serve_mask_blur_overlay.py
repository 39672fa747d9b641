"""A1111's mask rules through /sdapi/v1/img2img (processing.py, StableDiffusionProcessingImg2Img.init): the mask
read as create_binary_mask reads it (an alpha mask rounded unless mask_round is false), inverted, blurred with
OpenCV's Gaussian along x by mask_blur_x then along y by mask_blur_y (mask_blur sets both; 4 each by default): the
pipeline's mask_blur (sdrt.pipelines.maskblur, checked against OpenCV in tests/pipelines/test_mask_blur.py); and
the whole-picture overlay (the pipeline's mask_overlay): the answer equals the picture wherever the fitted blurred
mask is black, and writes A1111's ``Mask blur`` field."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from serve_helpers import png_b64 as _b64

Image = pytest.importorskip("PIL.Image", reason="the request's pictures are PNGs")


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(8)
    yy, xx = np.mgrid[0:64, 0:64]
    picture = np.clip(np.stack([xx * 3, yy * 3, 220 - xx - yy], -1) + rng.integers(0, 25, (64, 64, 3)), 0,
                      255).astype(np.uint8)
    mask = np.zeros((64, 64), np.uint8)
    mask[20:41, 13:37] = 255
    return picture, mask


def _parsed(body: dict, upscaler: str | None = None) -> tuple[dict, list]:
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.config import Limits

    kwargs: dict = {"width": 64, "height": 64}
    notes: list = []
    _img2img(body, kwargs, Limits(), notes, upscaler=upscaler)
    return kwargs, notes


def test_the_blur_fields_reach_the_pipeline() -> None:
    from sdrt.pipelines.maskblur import blur

    picture, mask = _picture_and_mask()
    body = {"init_images": [_b64(picture)], "mask": _b64(mask), "resize_mode": 0}
    kwargs, notes = _parsed({**body, "mask_blur_x": 6, "mask_blur_y": 2}, upscaler="Lanczos")
    assert kwargs["mask_blur"] == (6, 2) and notes == []  # the pipeline blurs, then fits (with the picture)
    np.testing.assert_array_equal(kwargs["mask"], mask)
    assert kwargs["mask_overlay"] is True
    assert _parsed(body, upscaler="Lanczos")[0]["mask_blur"] == (4, 4)  # A1111's default
    assert _parsed({**body, "mask_blur": 3, "mask_blur_x": 9}, upscaler="Lanczos")[0]["mask_blur"] == (3, 3)
    assert "mask_blur" not in _parsed({**body, "mask_blur": 0}, upscaler="Lanczos")[0]
    # the picture fitted here (no upscaler): the mask blurred here by the same code, at its own size
    kwargs, _ = _parsed({**body, "mask_blur_x": 6, "mask_blur_y": 2})
    assert "mask_blur" not in kwargs
    np.testing.assert_array_equal(kwargs["mask"], blur(mask, 6, 2))


def test_an_alpha_mask_is_rounded() -> None:
    """create_binary_mask: an RGBA mask with transparency is its alpha, rounded (above 128: 255) unless
    mask_round is false."""
    picture, _ = _picture_and_mask()
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[10:30, 10:30, 3] = 200
    rgba[40:50, 40:50, 3] = 100
    rgba[5, 5, 3] = 128
    body = {"init_images": [_b64(picture)], "mask": _b64(rgba), "mask_blur": 0}
    kwargs, notes = _parsed(body)
    assert set(np.unique(kwargs["mask"])) == {0, 255} and notes == []
    assert kwargs["mask"][20, 20] == 255 and kwargs["mask"][45, 45] == 0 and kwargs["mask"][5, 5] == 0
    kwargs, notes = _parsed({**body, "mask_round": False})
    assert kwargs["mask"][20, 20] == 200 and kwargs["mask"][45, 45] == 100
    assert any(n.startswith("mask_round: false") for n in notes), notes


def _decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def test_a_request_keeps_the_picture_outside_the_blurred_mask(server) -> None:
    import httpx

    from sdrt.pipelines.maskblur import blur

    picture, mask = _picture_and_mask()
    body = {"prompt": "a red circle", "steps": 2, "seed": 2, "cfg_scale": 1, "width": 64, "height": 64,
            "init_images": [_b64(picture)], "mask": _b64(mask), "denoising_strength": 0.8, "inpainting_fill": 1}
    with httpx.Client(base_url=server, timeout=300) as client:
        default = client.post("/sdapi/v1/img2img", json=body)
        apart = client.post("/sdapi/v1/img2img", json={**body, "mask_blur_x": 5, "mask_blur_y": 1})
    for r in (default, apart):
        assert r.status_code == 200, r.text
    info = json.loads(default.json()["info"])
    assert info["sdrt_not_honoured"] == []
    assert "Mask blur: 4" in info["infotexts"][0]
    assert "Mask blur" not in json.loads(apart.json()["info"])["infotexts"][0]  # A1111 writes none when they differ
    for r, (bx, by) in ((default, (4, 4)), (apart, (5, 1))):
        image = _decode(r.json()["images"][0])
        blurred = blur(mask, bx, by)
        np.testing.assert_array_equal(image[blurred == 0], picture[blurred == 0])  # the overlay: the picture
        assert (image[blurred >= 128] != picture[blurred >= 128]).any()
    assert default.json()["images"] != apart.json()["images"]
