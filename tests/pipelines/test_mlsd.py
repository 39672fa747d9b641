"""The ``mlsd`` preprocessor (M-LSD's mlsd_large_512_fp32.pth) against the extension's code.

References: scripts/ref_mlsd.py ran controlnet_aux 0.0.10's ``MobileV2_MLSD_Large`` and ``pred_lines`` (the
extension's annotator/mlsd) inside the extension's ``resize_image_with_pad`` / ``apply_mlsd`` / crop on the
full-size seeded file that mlsd_helpers writes here (the same bytes, from a fixed seed), and cv2.line on random
segments; tests/data/mlsd/mlsd_refs.npz holds what they made.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlsd_helpers import make_weights, write_file  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import cvdraw, mlsdmaps  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "mlsd"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "mlsd_refs.npz")


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/mlsd."""
    root = tmp_path_factory.mktemp("mlsd")
    return write_file(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "mlsd")


def _padded(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    return np.pad(image, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_mlsd_map_equals_the_extension(refs, pth, backend):
    """The network's centre and displacement channels within float32 noise of torch's, the lines within it, and
    the maps (default thresholds, and 0.3 / 4 which drop about a third of the lines) pixel for pixel."""
    register(backend)
    image = refs["image"]
    with mlsdmaps.MLSD(pth, backend=backend) as det:
        out = det.output(_padded(image))
        lines = det.lines(image)
        made = det(image)
        strict = det(image, 0.3, 4.0)
    np.testing.assert_allclose(out[7:12], refs["net_own"], atol=5e-4 * np.abs(refs["net_own"]).max())
    assert len(refs["lines_own"]) > 50
    np.testing.assert_allclose(lines, refs["lines_own"], atol=2e-3)
    assert (refs["map_own"] > 0).sum() > 300 and (refs["map_own_strict"] > 0).sum() < (refs["map_own"] > 0).sum()
    assert np.array_equal(made, refs["map_own"]), int((made != refs["map_own"]).sum())
    assert np.array_equal(strict, refs["map_own_strict"]), int((strict != refs["map_own_strict"]).sum())


def _rows(a: np.ndarray) -> np.ndarray:
    return a[np.lexsort(a.T[::-1])]


def test_decode_equals_pred_lines(refs):
    """The decoding alone on a made-up head output: the top 200 of over 200 local maxima (flat tops kept), their
    scores, and the lines that pass 0.96 / 3 (each threshold drops some). Equal scores (a flat top) come in
    torch.topk's order, which is its own; sdrt takes them by position, so those compare as sets (the map does not
    depend on the order)."""
    head = np.concatenate([np.zeros((7,) + refs["dec_head"].shape[1:], np.float32), refs["dec_head"]])
    lines = mlsdmaps.decode(head, 0.96, 3.0)
    assert 100 < len(refs["dec_lines"]) < 200
    assert len(mlsdmaps.decode(head, 0.1, 3.0)) > len(lines) and len(mlsdmaps.decode(head, 0.96, 0.1)) > len(lines)
    np.testing.assert_array_equal(_rows(lines), _rows(refs["dec_lines"]))
    order, scores = mlsdmaps.top_centres(head[7])
    w = head.shape[2]
    pts = np.stack([order // w, order % w], -1)
    np.testing.assert_allclose(scores, refs["dec_scores"], rtol=2e-7)  # sigmoid: one ulp apart at most
    assert (pts != refs["dec_pts"]).any(1).sum() <= 2  # here one flat top comes in the other order
    np.testing.assert_array_equal(_rows(pts), _rows(refs["dec_pts"]))
    assert np.all(np.diff(scores) <= 0)


def test_lines_are_cv2_lines(refs):
    """Each random segment (inside, crossing the edges, thousands of pixels out, near the 32-bit limits) drawn on
    its own small canvas equals cv2.line's, pixel for pixel."""
    segs, want = refs["cv_segments"], refs["cv_lines"]
    h, w = want.shape[1:]
    for (x0, y0, x1, y1), ref in zip(segs, want):
        made = mlsdmaps.draw_lines(np.array([[x0, y0, x1, y1]], np.float64), h, w)
        assert np.array_equal(made, ref), (x0, y0, x1, y1, int((made != ref).sum()))


def test_ends_opencv_refuses_stop_the_drawing():
    """NaN or a 32-bit overflow stops the drawing there, as the extension's try/except leaves its map; ends are
    truncated toward zero (int()), not floored."""
    lines = np.array([[0, 0, 9, 0], [0, 2, 9, 2], [np.nan, 4, 9, 4], [0, 6, 9, 6]], np.float64)
    m = mlsdmaps.draw_lines(lines, 8, 10)
    assert m[0].all() and m[2].all() and not m[4].any() and not m[6].any()
    m = mlsdmaps.draw_lines(np.array([[0, 1, 9, 1], [0, 3, 2.0 ** 31, 3], [0, 5, 9, 5]]), 8, 10)
    assert m[1].all() and not m[3].any() and not m[5].any()
    m = mlsdmaps.draw_lines(np.array([[-0.9, 0.9, 3.9, 0.5]]), 4, 6)
    assert m[0, :4].all() and not m[1:].any() and not m[0, 4:].any()


def test_at_processor_resolutions(refs, pth):
    """preprocess() at a resolution (scaled, padded to 64, cropped) equals the extension's at 64 (area, shrinking);
    at 96 (bicubic, enlarging) the map from OpenCV's own resized image is equal, and through sdrt's bicubic, which
    differs from the wheel's (IPP's) by one level on 32 of 36288 values here, 108 of 12096 pixels differ (the random
    network moves line ends across a pixel for that; 172 when sdrt's bicubic was 54 values off); without a
    resolution the image is padded as at its own size."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["image"]
    made = preprocessors.preprocess(image, "mlsd", resolution=64, models=pth, backend="openvino")
    assert made.shape == (84, 64, 3) and (made == made[:, :, :1]).all()
    assert np.array_equal(made[:, :, 0], refs["map_64"]), int((made[:, :, 0] != refs["map_64"]).sum())
    det = preprocessors.mlsd(pth, "openvino")
    assert np.array_equal(det(refs["pad_96"])[:126, :96], refs["map_96"])
    made = preprocessors.preprocess(image, "mlsd", resolution=96, models=pth, backend="openvino")
    assert made.shape == (126, 96, 3) and int((made[:, :, 0] != refs["map_96"]).sum()) <= 130
    made = preprocessors.preprocess(image, "mlsd", resolution=None, models=pth, backend="openvino")
    assert np.array_equal(made[:, :, 0], refs["map_own"])
    strict = preprocessors.preprocess(image, "mlsd", 0.3, 4.0, resolution=None, models=pth, backend="openvino")
    assert np.array_equal(strict[:, :, 0], refs["map_own_strict"])


def test_files_and_errors(tmp_path, pth):
    arrays = make_weights()
    arrays.pop("block23.conv3.bias")
    with pytest.raises(ModelError, match="is not M-LSD's large model") as e:
        mlsdmaps.MLSD(write_pth(tmp_path / "cut.pth", arrays))
    assert "\n" not in str(e.value) and "block23.conv3.bias" in str(e.value)
    arrays = make_weights()
    arrays["block23.conv3.weight"] = arrays["block23.conv3.weight"][:9]  # the tiny model's head is not this
    with pytest.raises(ModelError, match=r"block23.conv3.weight is \(9, 64, 1, 1\)"):
        mlsdmaps.MLSD(write_pth(tmp_path / "other.pth", arrays))
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        mlsdmaps.MLSD(tmp_path / "junk.pth")
    assert "\n" not in str(e.value)


def test_cvdraw_line_is_what_draw_lines_calls():
    """draw_lines draws through sdrt's cv2.line (white, one pixel): a diagonal is its 8-connected staircase."""
    m = mlsdmaps.draw_lines(np.array([[0, 0, 4, 2]], np.float64), 3, 5)
    ref = cvdraw.line(np.zeros((3, 5, 1), np.uint8), (0, 0), (4, 2), (255,))[:, :, 0]
    assert np.array_equal(m, ref) and int((m > 0).sum()) == 5


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4), (130, 200, 3)])
def test_tiny_and_odd_images_make_a_map(pth, shape):
    """One pixel, a 2-D and an RGBA image, one larger than 128 on both sides (a map of the padded 192x256)."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "mlsd", models=pth, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "mlsd", models=pth, backend="openvino")


def test_thresholds_and_units(pth):
    """The sliders: numbers >= 0 (the extension's sliders go 0.01..2 and 0.01..20; any such number works), one
    line naming the unit's field otherwise; a unit without the file names what to pass; the hires pass soft-injects
    an mlsd unit, as the extension does for canny and mlsd."""
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet, parse_units, residual_scales

    assert preprocessors.check_thresholds("mlsd", 0.01, 20.0, "u") == (0.01, 20.0)
    assert preprocessors.check_thresholds("mlsd", 5, 100, "u") == (5.0, 100.0)
    for low, high in ((-0.1, None), (None, float("nan"))):
        with pytest.raises(InputError) as e:
            preprocessors.check_thresholds("mlsd", low, high, "controlnets[0]")
        assert "\n" not in str(e.value) and "MLSD" in str(e.value)
    assert preprocessors.threshold_fields("mlsd", None, 4.0) == [("Threshold A", "0.1"), ("Threshold B", "4")]
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InputError, match="mlsd preprocessor needs mlsd_large_512_fp32.pth"):
        parse_units([ControlNet("controlnet", img, preprocessor="mlsd")])
    unit = ControlNet("controlnet", img, 0.8, preprocessor="mlsd", preprocessor_models=pth)
    assert residual_scales(unit, 13) is None
    assert np.allclose(residual_scales(unit, 13, hires=True), [0.8 * 0.825 ** (12 - i) for i in range(13)])


def test_mlsd_in_a_controlnet_run_and_on_the_command_line(refs, pth, tmp_path, capsys):
    """A unit with mlsd gives the image of a unit fed its map by hand; the CLI's --control-preprocessor-models runs
    it with the thresholds and writes them in the infotext; without the file, one line naming the flag."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet

    image = refs["image"]
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="mlsd", low=0.3, high=4.0, processor_res=64,
                          preprocessor_models=pth)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "mlsd", 0.3, 4.0, resolution=64, models=pth, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: mlsd, Model: controlnet")
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "mlsd"]
    root = pth.parents[5]  # the A1111 root: <root>/extensions/sd-webui-controlnet/annotator/downloads/mlsd/<file>
    assert main([*args, "--control-preprocessor-models", str(root), "--control-threshold-a", "0.2",
                 "-o", str(out)]) == 0, capsys.readouterr().err
    text = Image.open(out).text["parameters"]
    assert "Module: mlsd, Model: controlnet" in text and "Threshold A: 0.2, Threshold B: 0.1" in text, text
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "mlsd_large_512_fp32.pth" in err, err
    assert main([*args, "--control-preprocessor-models", str(tmp_path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no mlsd_large_512_fp32.pth in {tmp_path}" in err, err
