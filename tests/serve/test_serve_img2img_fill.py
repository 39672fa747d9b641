"""A1111's inpainting_fill 0 ("fill") when an upscaler_for_img2img enlarges the picture: A1111's img2img init
(modules/processing.py, StableDiffusionProcessingImg2Img.init) resizes the picture to the size first, through the
upscaler, then fills it (masking.fill) where the mask fitted the same way repaints. Under Crop and Resize the fill's
colour is then the cropped picture's. sdrt fills with the mean colour of the rest (docs/serve.md); the reference
below is that rule applied, in numpy and Pillow, to A1111's geometry, not sdrt's output."""

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
    mask[20:25] = 255  # five rows inside the crop
    return picture, mask


@pytest.fixture(scope="module")
def pipe():
    from backend_helpers import register

    from sdrt import pipelines

    register("openvino")
    with pipelines.load(pipelines.DEMO_MODEL, backend="openvino") as p:
        yield p


def test_fill_takes_the_colour_of_the_fitted_picture(pipe) -> None:
    from sdrt.serve.a1111 import _img2img
    from sdrt.serve.config import Limits
    from sdrt.serve.jobs import _fill_after_fit

    picture, mask = _picture_and_mask()
    body = {"init_images": [_b64(picture)], "mask": _b64(mask), "mask_blur": 0, "inpainting_fill": 0,
            "resize_mode": 1, "denoising_strength": 0.5}
    kwargs: dict = {"width": 64, "height": 64}
    _img2img(body, kwargs, Limits(), [], upscaler="Lanczos")
    assert kwargs.pop("_fill_after_fit") is True  # the worker fills, after its pipeline fitted the picture
    np.testing.assert_array_equal(kwargs["init_image"], picture)  # nothing filled before the fit
    _fill_after_fit(pipe, kwargs)
    sent = kwargs["init_image"]
    assert sent.shape == (64, 64, 3) and kwargs["init_upscaler"] == "Lanczos"

    # A1111: the picture and the mask cropped and resized, then the masked area filled from the rest of the picture
    fitted = _crop_and_resize(picture, 64, 64).astype(np.float64)
    repaint = _crop_and_resize(mask, 64, 64) >= 128
    colour = fitted[~repaint].mean(axis=0)
    whole = picture[mask < 128].mean(axis=0)
    assert abs(colour - whole).max() > 20  # the picture's own mean would be another colour
    np.testing.assert_array_equal(np.all(sent == sent[repaint][0], axis=-1), repaint)  # one colour, where it repaints
    np.testing.assert_allclose(sent[repaint][0], colour, atol=1.5)
    np.testing.assert_allclose(sent[~repaint], fitted[~repaint], atol=4)  # the rest: the fitted picture


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
