"""A1111's inpainting_fill 0 ("fill") when the picture is fitted later by the worker's pipeline (an
upscaler_for_img2img, or resize_mode 3): A1111 fits the picture and the mask with the resize mode, then fills the
fitted picture where the fitted mask repaints. The request's picture is kept at its own size then, and the fill must
land on the same pixels of it: a mask sent at the picture's size is that geometry itself. The fitted mask (cropped or
filled by the mode) was stretched back onto the whole picture, moving and growing the filled area."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="the request's pictures are PNGs")


def _b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("resize_mode", [1, 2])
def test_fill_lands_on_the_masked_pixels_of_a_picture_fitted_later(resize_mode) -> None:
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.config import Limits

    picture = np.zeros((40, 20, 3), np.uint8)  # 20 wide, 40 high: cropped or filled to 64x64
    picture[..., 0] = np.arange(40)[:, None] * 6 + 3  # every row another red: none is the fill's mean colour
    mask = np.zeros((40, 20), np.uint8)
    mask[20:25] = 255  # five rows inside the crop (rows 10 to 30)
    body = {"init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 0, "inpainting_fill": 0,
            "resize_mode": resize_mode, "denoising_strength": 0.5}
    kwargs: dict = {"width": 64, "height": 64}
    notes: list[str] = []
    _img2img(body, kwargs, Limits(), notes, upscaler="Lanczos")
    sent = kwargs["init_image"]
    assert sent.shape == (40, 20, 3) and kwargs["init_upscaler"] == "Lanczos"
    filled = np.any(sent != picture, axis=-1)
    np.testing.assert_array_equal(filled, mask >= 128)  # the masked rows, and only they
