"""A1111's "Inpaint area: Only masked" through /sdapi/v1/img2img: ``inpaint_full_res`` (0/1 or a bool; Easy Diffusion
sends 0) and ``inpaint_full_res_padding`` (A1111's default 32) run as the pipeline's ``inpaint_area="only masked"``
(its images against diffusers' padding_mask_crop: tests/pipelines/test_only_masked.py). Here: the request's fields
reach it (the picture at its own size, the blurred mask, the padding), the answer is the picture's size with A1111's
infotext fields and nothing named as not honoured, inpainting_fill 0 fills the fitted cut-out (A1111's order: crop,
fit, then masking.fill), and a blank mask runs as A1111's img2img fallback, named."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="the request's pictures are PNGs")


def _b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


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
    np.testing.assert_array_equal(kwargs["mask"], mask_array(Image.fromarray(mask), 4, False))  # blurred, own size
    assert "resize_mode" not in kwargs and "_fill_after_fit" not in kwargs
    kwargs = {"width": 64, "height": 64}
    _img2img({**body, "inpaint_full_res": True, "inpaint_full_res_padding": None}, kwargs, Limits(), notes)
    assert kwargs["inpaint_padding"] == 32  # A1111's default
    kwargs = {"width": 64, "height": 64}
    _img2img({**body, "inpaint_full_res": 0}, kwargs, Limits(), notes)  # Easy Diffusion's
    assert "inpaint_area" not in kwargs and kwargs["mask"].shape == (64, 64) and notes == []


@pytest.fixture(scope="module")
def pipe():
    from backend_helpers import register

    from sdrt import pipelines

    register("openvino")
    with pipelines.load(pipelines.DEMO_MODEL, backend="openvino") as p:
        yield p


def test_fill_0_fills_the_fitted_cut_out(pipe) -> None:
    """The worker's fill (jobs.Worker._run sets it on the pipeline) runs on the cut-out once fitted, from its own
    colours, as A1111's img2img init does; filling the whole picture first and cutting after gives other colours."""
    from sdrt.pipelines import validate
    from sdrt.pipelines.onlymasked import prepare
    from sdrt.serve.b64images import fill_masked

    picture, mask = _picture_and_mask()
    s = validate("x", init_image=picture, mask=mask, inpaint_area="only masked", inpaint_padding=4, width=64,
                 height=64)
    pipe._init_fill = fill_masked
    try:
        init, _ = pipe._fit_init(s)
    finally:
        pipe._init_fill = pipe._paste = None
    cut, cut_mask, _ = prepare(picture, mask, 64, 64, 4)
    np.testing.assert_array_equal(init, fill_masked(cut, cut_mask))
    wrong, _, _ = prepare(fill_masked(picture, mask), mask, 64, 64, 4)
    assert np.abs(wrong.astype(int) - init.astype(int)).max() > 10


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
    from PIL import ImageFilter

    blurred = np.asarray(Image.fromarray(mask).filter(ImageFilter.GaussianBlur(2)))
    changed = np.any(image != picture, axis=-1)
    assert changed.any() and not changed[blurred == 0].any()  # the picture kept wherever the mask is black
    assert filled.json()["images"] != only.json()["images"]
    notes = json.loads(blank.json()["info"])["sdrt_not_honoured"]
    assert any(n.startswith("inpaint_full_res: the mask is blank") for n in notes), notes
    assert "Inpaint area" not in json.loads(blank.json()["info"])["infotexts"][0]
    assert bad.status_code in (400, 422) and "inpaint_full_res_padding" in bad.text, bad.text
