"""A1111's "Inpaint area: Only masked" through /sdapi/v1/img2img: ``inpaint_full_res`` (0/1 or a bool; Easy Diffusion
sends 0) and ``inpaint_full_res_padding`` (A1111's default 32) run as the pipeline's ``inpaint_area="only masked"``
(its images against diffusers' padding_mask_crop: tests/pipelines/test_only_masked.py). Here: the request's fields
reach it (the picture at its own size, the blurred mask, the padding), the answer is the picture's size with A1111's
infotext fields and nothing named as not honoured, inpainting_fill 0, 2 and 3 are the pipeline's masked_content
(which fills the fitted cut-out: tests/pipelines/test_masked_fill.py), and a blank mask runs as A1111's img2img
fallback, named."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from serve_helpers import png_b64 as _b64

Image = pytest.importorskip("PIL.Image", reason="the request's pictures are PNGs")


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:80, 0:96]
    picture = np.stack([x * 2, y * 3, 255 - x - y], axis=-1) + rng.integers(0, 20, (80, 96, 3))
    mask = np.zeros((80, 96), np.uint8)
    mask[30:44, 52:70] = 255
    return np.clip(picture, 0, 255).astype(np.uint8), mask


def _decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def test_the_fields_reach_the_pipeline() -> None:
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.b64images import mask_array
    from sdrt.serve.config import Limits

    picture, mask = _picture_and_mask()
    body = {"init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 4, "inpaint_full_res": 1,
            "inpaint_full_res_padding": 8, "resize_mode": 1, "denoising_strength": 0.6}
    kwargs: dict = {"width": 64, "height": 64}
    notes: list[str] = []
    _img2img(body, kwargs, Limits(), notes)
    assert notes == []
    assert (kwargs["inpaint_area"], kwargs["inpaint_padding"]) == ("only masked", 8)
    np.testing.assert_array_equal(kwargs["init_image"], picture)  # its own size: the pipeline cuts it
    np.testing.assert_array_equal(kwargs["mask"], mask_array(Image.fromarray(mask)))  # its own size
    assert kwargs["mask_blur"] == (4, 4)  # the pipeline blurs it there (sdrt.pipelines.maskblur)
    assert "resize_mode" not in kwargs and "masked_content" not in kwargs
    assert "mask_overlay" not in kwargs  # only masked pastes back anyway
    kwargs = {"width": 64, "height": 64}
    _img2img({**body, "inpaint_full_res": True, "inpaint_full_res_padding": None}, kwargs, Limits(), notes)
    assert kwargs["inpaint_padding"] == 32  # A1111's default
    kwargs = {"width": 64, "height": 64}
    _img2img({**body, "inpaint_full_res": 0}, kwargs, Limits(), notes)  # Easy Diffusion's
    assert "inpaint_area" not in kwargs and kwargs["mask"].shape == (64, 64) and notes == []


def test_fill_0_is_the_pipelines_fill(demo_pipe) -> None:
    """inpainting_fill 0, 2 and 3 are the pipeline's masked_content, which fills the cut-out once fitted, as A1111's
    img2img init does (tests/pipelines/test_masked_fill.py checks the order)."""
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.config import Limits

    picture, mask = _picture_and_mask()
    body = {"init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 0, "inpaint_full_res": 1}
    for fill, content in ((0, "fill"), (2, "latent noise"), (3, "latent nothing")):
        kwargs: dict = {"width": 64, "height": 64}
        _img2img({**body, "inpainting_fill": fill}, kwargs, Limits(), [])
        assert kwargs["masked_content"] == content
        np.testing.assert_array_equal(kwargs["init_image"], picture)


def test_a_request_runs_only_the_masked_area(server) -> None:
    import httpx

    picture, mask = _picture_and_mask()
    body = {"prompt": "a red circle", "steps": 2, "seed": 1, "cfg_scale": 1, "width": 64, "height": 64,
            "init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 2, "denoising_strength": 0.9,
            "inpaint_full_res": 1, "inpaint_full_res_padding": 6, "inpainting_fill": 1}
    with httpx.Client(base_url=server, timeout=300) as client:
        only = client.post("/sdapi/v1/img2img", json=body)
        filled = client.post("/sdapi/v1/img2img", json={**body, "inpainting_fill": 0})
        blank = client.post("/sdapi/v1/img2img", json={**body, "mask": _b64(np.zeros_like(mask))})
        bad = client.post("/sdapi/v1/img2img", json={**body, "inpaint_full_res_padding": -1})
    for r in (only, filled, blank):
        assert r.status_code == 200, r.text
    info = json.loads(only.json()["info"])
    assert info["sdrt_not_honoured"] == []
    assert "Size: 64x64" in info["infotexts"][0]
    assert "Inpaint area: Only masked, Masked area padding: 6" in info["infotexts"][0]
    image = _decode(only.json()["images"][0])
    assert image.shape == picture.shape  # pasted back into the picture, at its size
    from sdrt.pipelines.maskblur import blur

    blurred = blur(mask, 2, 2)  # A1111's blur (OpenCV's), at the picture's size
    changed = np.any(image != picture, axis=-1)
    assert changed.any() and not changed[blurred == 0].any()  # the picture kept wherever the mask is black
    assert filled.json()["images"] != only.json()["images"]
    notes = json.loads(blank.json()["info"])["sdrt_not_honoured"]
    assert any(n.startswith("inpaint_full_res: the mask is blank") for n in notes), notes
    assert "Inpaint area" not in json.loads(blank.json()["info"])["infotexts"][0]
    assert bad.status_code in (400, 422) and "inpaint_full_res_padding" in bad.text, bad.text
