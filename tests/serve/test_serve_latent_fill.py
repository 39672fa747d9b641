"""A1111's inpainting_fill 2 ("latent noise") and 3 ("latent nothing"): as A1111's img2img init
(modules/processing.py) the picture is first filled as for 0 (masking.fill), VAE-encoded, and then the latent where
A1111's latent mask repaints becomes the seed's noise (2) or zeros (3): the pipeline's masked_content. The latent
mask is written here from A1111's rule (the mask as RGB resized by Pillow's default filter to the latent grid,
/ 255, rounded); the run's start is checked against ``init_latent * (1 - latmask)`` for 3, the init latent being
the one fill 0's run starts from (the same filled picture)."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from serve_helpers import png_b64 as _b64

Image = pytest.importorskip("PIL.Image", reason="the request's pictures are PNGs")


def _picture_and_mask() -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:64, 0:64]
    picture = np.stack([xx * 4, yy * 4, 255 - xx * 2], -1).astype(np.uint8)
    mask = np.zeros((64, 64), np.uint8)
    mask[19:45, 11:41] = 255  # off the 8-pixel grid
    return picture, mask


def a1111_latmask(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """processing.py: latent_mask.convert('RGB').resize((w, h)), channel 0 / 255, np.around."""
    small = np.asarray(Image.fromarray(mask).convert("RGB").resize((w, h)), np.float32)[..., 0] / 255
    return np.around(small)


BODY = {"prompt": "a red circle", "steps": 2, "seed": 5, "cfg_scale": 1, "width": 64, "height": 64,
        "mask_blur": 0, "resize_mode": 0, "denoising_strength": 0.6}


def _parsed(fill: int) -> tuple[dict, list]:
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.config import Limits

    picture, mask = _picture_and_mask()
    body = {**BODY, "init_images": [_b64(picture)], "mask": _b64(mask), "inpainting_fill": fill}
    kwargs: dict = {"width": 64, "height": 64}
    notes: list = []
    _img2img(body, kwargs, Limits(), notes)
    return kwargs, notes


def test_fill_2_and_3_map_to_masked_content() -> None:
    picture, mask = _picture_and_mask()
    for fill, content in ((0, "fill"), (2, "latent noise"), (3, "latent nothing")):
        kwargs, notes = _parsed(fill)
        assert notes == [] and kwargs["masked_content"] == content
        # the pipeline fills the picture for every value but "original", as A1111 for every fill but 1, before the
        # VAE encodes it (tests/pipelines/test_masked_fill.py)
        np.testing.assert_array_equal(kwargs["init_image"], picture)
    assert "masked_content" not in _parsed(1)[0]


def _start(demo_pipe, monkeypatch, kwargs: dict) -> tuple[np.ndarray, np.ndarray]:
    from loop_helpers import recorded_start

    return recorded_start(demo_pipe, monkeypatch, BODY["prompt"], 5, **kwargs)


def test_fill_3_starts_from_a1111s_latent(demo_pipe, monkeypatch) -> None:
    """The request's arguments run: fill 3 starts from fill 0's latent (the same filled picture, encoded) times
    1 - A1111's latent mask; fill 2 adds the run's noise there."""
    _, mask = _picture_and_mask()
    noise, filled = _start(demo_pipe, monkeypatch, _parsed(0)[0])
    lat = a1111_latmask(mask, *filled.shape[2:])[None, None]
    _, nothing = _start(demo_pipe, monkeypatch, _parsed(3)[0])
    np.testing.assert_allclose(nothing, filled * (1 - lat), rtol=0, atol=1e-6)
    _, noisy = _start(demo_pipe, monkeypatch, _parsed(2)[0])
    np.testing.assert_allclose(noisy, filled * (1 - lat) + noise * lat, rtol=0, atol=1e-6)


def test_requests_with_fill_2_and_3(server) -> None:
    import httpx

    picture, mask = _picture_and_mask()
    body = {**BODY, "init_images": [_b64(picture)], "mask": _b64(mask)}
    with httpx.Client(base_url=server, timeout=300) as client:
        got = {fill: client.post("/sdapi/v1/img2img", json={**body, "inpainting_fill": fill}) for fill in (0, 2, 3)}
    for r in got.values():
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["info"])["sdrt_not_honoured"] == []
    # the pixels (the PNGs' infotexts differ anyway): fill 2 and 3 change the image, against 0 (the same filled
    # picture, its latent kept) and each other
    pixels = {fill: np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"),
                               np.int16) for fill, r in got.items()}
    for a, b in ((0, 2), (0, 3), (2, 3)):
        assert np.abs(pixels[a] - pixels[b]).max() > 10, (a, b)
    assert "Masked content: latent nothing" in json.loads(got[3].json()["info"])["infotexts"][0]
