"""Model-free ControlNet preprocessors against OpenCV (fixtures from scripts/gen_control_refs.py) and A1111's geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import InputError
from sdrt.pipelines.controlmaps import (
    _resample,
    canny,
    control_tensor,
    invert,
    processor_input,
    resize_control,
    scribble,
    threshold,
    to_rgb,
)

REFS = Path(__file__).resolve().parents[1] / "data" / "control" / "control_refs.npz"


def _refs() -> dict[str, np.ndarray]:
    with np.load(REFS) as z:
        return {k: z[k] for k in z.files}


def _canny_cases():
    return sorted(k for k in _refs() if k.startswith("canny/"))


@pytest.mark.parametrize("key", _canny_cases())
def test_canny_equals_opencv(key):
    """Tolerance: none. Every pixel equals cv2.Canny's (OpenCV 5.0, grey and colour, L1 and L2, swapped thresholds)."""
    refs = _refs()
    _, name, lo, hi, l2 = key.split("/")
    ours = canny(refs[f"image/{name}"], float(lo), float(hi), l2_gradient=bool(int(l2)))
    assert ours.dtype == np.uint8 and ours.shape == refs[key].shape
    assert np.array_equal(ours, refs[key])


def test_canny_cases_are_not_all_empty():
    refs = _refs()
    assert sum(int((refs[k] > 0).sum() > 100) for k in _canny_cases()) >= 20


@pytest.mark.parametrize("key", sorted(k for k in _refs() if k.startswith("resize/")))
def test_resamplers_match_opencv(key):
    """Nearest and area: exact. Bicubic (the wheel's IPP): within 1 level on at most 0.01 % of values (measured: 0
    and 1 of 90000; tests/pipelines/test_cvresize.py has the bit-exact cases)."""
    refs = _refs()
    _, name, kind, size = key.split("/")
    w, h = (int(v) for v in size.split("x"))
    ours = _resample(refs[f"image/{name}"], w, h, kind).astype(int)
    diff = np.abs(ours - refs[key])
    if kind in ("nearest", "area"):
        assert diff.max() == 0
    else:
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.0001


def test_threshold_and_scribble():
    img = np.full((4, 5, 3), 255, np.uint8)
    img[1, 1] = (0, 0, 0)         # a dark stroke
    img[2, 3] = (200, 100, 200)   # one channel below the threshold
    t = threshold(img, 127)
    assert t.shape == (4, 5, 3) and t[0, 0].tolist() == [255] * 3 and t[2, 3].tolist() == [0] * 3
    s = scribble(img, 127)
    assert s[1, 1].tolist() == [255] * 3 and s[0, 0].tolist() == [0] * 3 and s[2, 3].tolist() == [0] * 3
    with pytest.raises(InputError):
        threshold(img, 300)


def _stripes(h, w):
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx + yy) % 256], -1)
    return img.astype(np.uint8)


def test_just_resize_is_the_whole_image_at_the_output_size():
    img = _stripes(30, 40)
    out = resize_control(img, 80, 50, "Just Resize")
    assert out.shape == (50, 80, 3)


def test_crop_and_resize_fills_the_frame_and_crops_the_centre():
    img = np.zeros((100, 200, 3), np.uint8)  # wide: 2:1
    img[:, :50] = 255  # the left quarter white
    out = resize_control(img, 64, 64, "crop and resize")  # k = max(0.64, 0.32): 128x64, crop 32 each side
    assert out.shape == (64, 64, 3)
    # columns 0..31 of the 128-wide resize are the white quarter; the crop starts at column 32
    assert out[:, :1].max() <= 10 and out[:, -1].max() <= 10


def test_resize_and_fill_pastes_the_centre_on_the_median_border_colour():
    img = np.full((50, 100, 3), 200, np.uint8)
    img[20:30, 40:60] = 10
    out = resize_control(img, 64, 64, "Resize and Fill")  # k = min(1.28, 0.64): 64x32, pad 16 rows
    assert out.shape == (64, 64, 3)
    assert (out[:16] == 200).all() and (out[48:] == 200).all()
    assert out[16:48].min() < 100


def test_binary_maps_stay_binary():
    img = canny(_refs()["image/shapes"], 50, 150)
    out = resize_control(img, 200, 160, "Just Resize")
    assert set(np.unique(out).tolist()) <= {0, 255}
    assert (out > 0).mean() > 0.005


def test_control_tensor_is_rgb_in_unit_range():
    t = control_tensor(_stripes(8, 6))
    assert t.shape == (1, 3, 8, 6) and t.dtype == np.float32 and 0 <= t.min() and t.max() <= 1
    assert to_rgb(np.zeros((3, 3), np.uint8)).shape == (3, 3, 3)
    rgba = np.zeros((2, 2, 4), np.uint8)  # fully transparent over white
    assert (to_rgb(rgba) == 255).all()


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.float32), np.zeros((4, 4, 2), np.uint8), np.zeros((0, 3), np.uint8)])
def test_bad_images_raise_input_error(bad):
    with pytest.raises(InputError):
        canny(bad)


def test_bad_arguments_raise_input_error():
    img = _stripes(8, 8)
    with pytest.raises(InputError):
        resize_control(img, 8, 8, "Stretch")
    with pytest.raises(InputError):
        resize_control(img, 0, 8)
    with pytest.raises(InputError):
        canny(img, -1, 10)


@pytest.mark.parametrize("size", ["50x38", "200x155"])
def test_binary_maps_are_rebinarized_with_otsu_as_opencv_does(size):
    """A thick black-and-white map, shrunk (area) and enlarged (bicubic), then Otsu: equal to cv2's, every pixel."""
    refs = _refs()
    w, h = (int(v) for v in size.split("x"))
    ours = resize_control(refs["image/binary"], w, h, "Just Resize")
    assert np.array_equal(ours, refs[f"binary/{size}"])


# ------------------------------------------------------------------ the extension's processor resolution
def test_processor_input_scales_the_shorter_side_and_pads_to_64_with_the_edges():
    """sd-webui-controlnet's resize_image_with_pad: shorter side to the resolution (rounded), area averaging down,
    bicubic up (the resamplers checked against OpenCV above), bottom/right edges repeated to multiples of 64."""
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)
    up, (h, w) = processor_input(img, 128)
    assert (h, w) == (128, 154) and up.shape == (128, 192, 3)
    assert np.array_equal(up[:h, :w], _resample(img, 154, 128, "cubic"))
    assert np.array_equal(up[:, w:], np.repeat(up[:, w - 1:w], 192 - w, axis=1))
    down, (h, w) = processor_input(img, 40)
    assert (h, w) == (40, 48) and down.shape == (64, 64, 3)
    assert np.array_equal(down[:h, :w], _resample(img, 48, 40, "area"))
    assert np.array_equal(down[h:, :w], np.repeat(down[h - 1:h, :w], 64 - h, axis=0))
    same, (h, w) = processor_input(img, 80)
    assert (h, w) == (80, 96) and np.array_equal(same[:80, :96], img)


def test_invert_and_threshold_as_the_extension():
    img = np.array([[[0, 10, 200], [255, 255, 255]], [[130, 140, 150], [100, 200, 120]]], np.uint8)
    assert np.array_equal(invert(img), 255 - img)
    assert threshold(img, 127)[:, :, 0].tolist() == [[0, 255], [255, 0]]  # every channel above the level


def test_preprocess_at_a_resolution_and_pixel_perfect():
    from sdrt.pipelines.controlnet import ControlNet, preprocess, processor_resolution

    rng = np.random.default_rng(4)
    img = rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)
    padded, (h, w) = processor_input(img, 100)
    made = preprocess(img, "threshold", 90, None, 100)
    assert made.shape == (h, w, 3) and np.array_equal(made, threshold(padded, 90)[:h, :w])
    assert np.array_equal(preprocess(img, "invert", resolution=100), 255 - img)  # the extension's invert: no resize
    assert np.array_equal(preprocess(img, "canny", 50, 150), to_rgb(canny(img, 50, 150)))  # unset: the image's size
    # pixel perfect (the extension's pixel_perfect_resolution): the shorter side once resized to the output
    unit = ControlNet("net", img, pixel_perfect=True)
    assert processor_resolution(unit, 80, 96, 512, 768) == round(max(768 / 80, 512 / 96) * 80)
    unit.resize = "Resize and Fill"
    assert processor_resolution(unit, 80, 96, 512, 768) == round(min(768 / 80, 512 / 96) * 80)
    assert processor_resolution(ControlNet("net", img, processor_res=300), 80, 96, 64, 64) == 300


def test_a_strip_that_would_grow_past_max_side_on_the_way_is_refused():
    """Crop and Resize scales a 1x4000 strip by 2048 before cropping, the processor scales its short side: both
    would make millions of pixels of a line; a ControlImageError (an InputError) instead, before any allocation."""
    strip = np.zeros((1, 4000, 3), np.uint8)
    with pytest.raises(InputError, match="8192000 pixels long on the way"):
        resize_control(strip, 2048, 2048, "Crop and Resize")
    assert resize_control(strip, 2048, 2048, "Just Resize").shape == (2048, 2048, 3)
    with pytest.raises(InputError, match="at processor resolution 512 would be 2048000 pixels long"):
        processor_input(strip, 512)
