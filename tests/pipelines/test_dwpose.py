"""DWPose (dw_openpose_full) against sd-webui-controlnet's / controlnet_aux's own code run with OpenCV and
onnxruntime (scripts/gen_dwpose_refs.py -> tests/data/control/dwpose_refs.npz), on stand-in ONNX files with the
real files' signatures (tests/pipelines/dwpose_graphs.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import dwpose_graphs  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError  # noqa: E402
from sdrt.pipelines import controlmaps, posedetect, posemaps, preprocessors  # noqa: E402

REFS = Path(__file__).parents[1] / "data" / "control" / "dwpose_refs.npz"
CASES = ["stripes_256", "stripes_160", "checks_192"]


@pytest.fixture(scope="module")
def refs():
    return np.load(REFS)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dwpose")
    dwpose_graphs.write(folder)
    return folder


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_dwpose_maps_equal_the_extension(refs, models, backend):
    register(backend)
    with posedetect.DWPose(models / "yolox_l.onnx", models / "dw-ll_ucoco_384.onnx", backend=backend) as dw:
        for key in CASES:
            inp = refs[f"input/{key}"]
            ref = refs[f"map/ort/{key}"]
            assert (ref == refs[f"map/cv2/{key}"]).all()  # the extension's cv2.dnn path drew the same map
            boxes = dw.detect(inp)
            np.testing.assert_allclose(boxes, refs[f"boxes/ort/{key}"], atol=1e-3)
            info = dw(inp)
            assert info.shape == refs[f"keypoints/ort/{key}"].shape
            got = posemaps.draw(posemaps.people_from_keypoints(info), *inp.shape[:2])[:ref.shape[0], :ref.shape[1]]
            assert (got != ref).any(2).sum() == 0, key


def test_dw_openpose_full_from_the_raw_image(refs, models):
    """The whole chain: sdrt's own processor resize (bicubic / area, edges to 64), DWPose, the map cropped back."""
    register("reference")
    for key in CASES:
        name, res = key.rsplit("_", 1)
        ref = refs[f"map/ort/{key}"]
        got = preprocessors.preprocess(refs[f"image/{name}"], "dw_openpose_full", resolution=int(res),
                                       models=models, backend="reference")
        assert got.shape == ref.shape
        assert (got != ref).any(2).sum() == 0, key


def test_render_json_equals_the_extension(refs):
    pose = json.loads(bytes(refs["json/render"]).decode())
    people, h, w = posemaps.from_json(pose)
    got = posemaps.draw(people, h, w)
    assert (got == refs["map/render"]).all()


def test_json_round_trip(refs, models):
    register("reference")
    with posedetect.DWPose(models / "yolox_l.onnx", models / "dw-ll_ucoco_384.onnx", backend="reference") as dw:
        inp = refs["input/stripes_256"]
        people = posemaps.people_from_keypoints(dw(inp))
    doc = json.loads(json.dumps(posemaps.to_json(people, *inp.shape[:2])))
    back, h, w = posemaps.from_json(doc)
    assert (posemaps.draw(back, h, w) == posemaps.draw(people, h, w)).all()
    assert len(doc["people"]) == 2 and doc["people"][0]["hand_right_keypoints_2d"] is None


@pytest.mark.parametrize("field, value", [("pose_keypoints_2d", 1e300), ("pose_keypoints_2d", -1e300),
                                          ("pose_keypoints_2d", 10 ** 400), ("face_keypoints_2d", 10 ** 400),
                                          ("canvas_width", 10 ** 400)],
                         ids=["body-1e300", "body--1e300", "body-400-digits", "face-400-digits", "canvas-400-digits"])
def test_json_numbers_out_of_range_are_one_error_on_the_field(field, value):
    """A keypoint of 1e300 overflowed the limb's length (OverflowError drawing it) and an integer of 400 digits
    (JSON reads it as one) could not be made a float (OverflowError reading it): a 500 in serve's
    render_openpose_json. Each is one InputError naming the field."""
    body = [10.0, 10.0, 1.0] * 18
    pose = {"people": [{"pose_keypoints_2d": body}], "canvas_width": 64, "canvas_height": 64}
    if field == "canvas_width":
        pose[field] = value
    else:
        pose["people"][0][field] = [value, 5, 1] + [20.0, 20.0, 1.0] * (17 if field == "pose_keypoints_2d" else 67)
    with pytest.raises(InputError) as info:
        people, h, w = posemaps.from_json(pose, "body[0]")
        posemaps.draw(people, h, w)
    assert info.value.where.endswith(field)


def test_files_written_anew_at_their_paths_are_read_anew(refs, tmp_path):
    """The compiled DWPose is kept between maps while its two files are the same version; a pose model written anew
    at its path (another download, a fixed file) is compiled anew, as the image encoder and upscaler are."""
    register("reference")
    dwpose_graphs.write(tmp_path, seed=0)
    img = refs["image/stripes"]
    first = preprocessors.preprocess(img, "dw_openpose_full", resolution=256, models=tmp_path, backend="reference")
    kept = preprocessors.dwpose(tmp_path, "reference")
    assert preprocessors.preprocess(img, "dw_openpose_full", resolution=256, models=tmp_path,
                                    backend="reference").tobytes() == first.tobytes()
    assert preprocessors.dwpose(tmp_path, "reference") is kept
    dwpose_graphs.pose_model(tmp_path / "dw-ll_ucoco_384.onnx", seed=5)
    again = preprocessors.preprocess(img, "dw_openpose_full", resolution=256, models=tmp_path, backend="reference")
    padded, (h, w) = controlmaps.processor_input(img, 256)
    with posedetect.DWPose(tmp_path / "yolox_l.onnx", tmp_path / "dw-ll_ucoco_384.onnx", backend="reference") as dw:
        want = preprocessors.pose_map(padded, dw)[:h, :w]
    assert not np.array_equal(want, first)
    assert np.array_equal(again, want)


def test_a_dwpose_per_backend_and_device_is_kept(refs, models):
    """serve with several devices runs a job per device at once: each worker's DWPose is its own and kept. One
    DWPose was kept in all, so a job on another device (or /controlnet/detect beside a job) closed the graphs a
    running job was using."""
    register("reference")
    register("openvino")
    img = refs["input/stripes_256"]
    a = preprocessors.dwpose(models, "reference")
    b = preprocessors.dwpose(models, "openvino")
    np.testing.assert_allclose(a(img), refs["keypoints/ort/stripes_256"], atol=1e-3)  # a is still open
    np.testing.assert_allclose(b(img), refs["keypoints/ort/stripes_256"], atol=1e-3)
    assert preprocessors.dwpose(models, "reference") is a and preprocessors.dwpose(models, "openvino") is b


def test_the_letterbox_of_a_photo_widens_only_the_rows_it_reads():
    """dw_openpose_full at the image's own size (processor_res unset) letterboxes the photo itself: the resize
    widened the whole picture to int64 first (a 12 MP photo: 426 MB at the peak); only the rows read now. The bytes
    are cv2's still (test_dwpose_maps_equal_the_extension)."""
    import tracemalloc

    img = np.random.default_rng(3).integers(0, 256, (3000, 4000, 3), dtype=np.uint8)
    tracemalloc.start()
    try:
        x, r = posedetect.letterbox(img)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.shape == (1, 3, 640, 640) and r == 0.16
    assert peak < 120e6, peak
    tracemalloc.start()  # each person's crop: the photo was made float32 whole for every box (144 MB each here)
    try:
        posedetect.crop(img, np.array([1000.0, 500.0, 1600.0, 2500.0]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 60e6, peak


def test_missing_files_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        posedetect.find_files(tmp_path, what="--control-pose-models")
    msg = str(e.value)
    assert "yolox_l.onnx" in msg and str(tmp_path) in msg and "\n" not in msg
    with pytest.raises(InputError, match="needs DWPose"):
        preprocessors.preprocess(np.zeros((64, 64, 3), np.uint8), "dw_openpose_full")


def test_layouts_found(tmp_path):
    sub = tmp_path / "extensions/sd-webui-controlnet/annotator/downloads/openpose"
    dwpose_graphs.write(sub)
    det, pose = posedetect.find_files(tmp_path)
    assert det.parent == sub and pose.name == "dw-ll_ucoco_384.onnx"


def test_unit_needs_pose_models():
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    with pytest.raises(InputError, match="controlnets.0. preprocessor_models: the dw_openpose_full preprocessor"):
        parse_units([ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), preprocessor="dw_openpose_full")])
    # the older name is named as the caller gave it, and both at once are refused
    with pytest.raises(InputError, match="controlnets.0. pose_models: no yolox_l.onnx"):
        parse_units([ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), preprocessor="dw_openpose_full",
                                pose_models="/nonexistent")])
    with pytest.raises(InputError, match="both preprocessor_models and pose_models"):
        parse_units([ControlNet("controlnet", np.zeros((8, 8, 3), np.uint8), preprocessor="dw_openpose_full",
                                pose_models="/a", preprocessor_models="/b")])


def test_dw_openpose_full_in_a_controlnet_run_and_on_the_command_line(refs, models, tmp_path, capsys):
    """A unit with dw_openpose_full gives the image of a unit fed the extension's map by hand; the CLI's
    --control-pose-models runs it and writes the module in the infotext; without the files, one line."""
    from PIL import Image
    from pipeline_helpers import DATA, fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines.controlnet import ControlNet

    image, ref = refs["image/stripes"], refs["map/ort/stripes_256"]
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="dw_openpose_full", processor_res=256, pose_models=models)
        for old in preprocessors._DWPOSE.values():
            old.close()
        preprocessors._DWPOSE.clear()
        gen = pipe.generate("a dancer", controlnets=[unit], **kw)
        # no pose_backend: DWPose's graphs compiled on the pipeline's backend, not on "auto"'s choice
        assert [key[1] for key in preprocessors._DWPOSE] == [pipe.backend], list(preprocessors._DWPOSE)
        by_hand = pipe("a dancer", controlnets=[("controlnet", ref)], **kw)[0]
        photo = pipe("a dancer", controlnets=[("controlnet", image)], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand) and not np.array_equal(by_hand, photo)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: dw_openpose_full, Model: controlnet")
    png, out = tmp_path / "dancers.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(DATA / "tiny-sd15-controlnet"), "a dancer", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "dw_openpose_full"]
    assert main([*args, "--control-pose-models", str(models), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: dw_openpose_full, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err, err
    assert main([*args, "--control-pose-models", str(tmp_path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no yolox_l.onnx and dw-ll_ucoco_384.onnx in {tmp_path}" in err, err


def test_opencv_primitives_pixel_for_pixel(refs):
    """cv2.ellipse2Poly, fillConvexPoly, a thick cv2.line and a filled cv2.circle at the border, by OpenCV 5.0."""
    from sdrt.pipelines import cvdraw

    cases, counts, pts = refs["draw/ellipse_cases"], refs["draw/ellipse_counts"], refs["draw/ellipse_points"]
    starts = np.concatenate([[0], np.cumsum(counts)])
    for k, (cx, cy, ax, bx, ang) in enumerate(cases):
        poly = cvdraw.ellipse2poly((int(cx), int(cy)), (int(ax), int(bx)), int(ang), 0, 360, 1)
        assert np.array_equal(np.array(poly), pts[starts[k]:starts[k + 1]]), k
        canvas = np.zeros((48, 48, 3), np.uint8)
        cvdraw.fill_convex_poly(canvas, poly, [200, 100, 50])
        assert np.array_equal(canvas[..., 0], refs["draw/ellipse_fills"][k]), k
    for got, a in zip(refs["draw/big_ellipses"], (0, 17, 45, 133)):
        assert np.array_equal(np.array(cvdraw.ellipse2poly((0, 0), (100000, 70000), a, 0, 360, 1)), got), a
    for k, (x1, y1, x2, y2, t) in enumerate(refs["draw/line_cases"]):
        canvas = np.zeros((48, 48, 3), np.uint8)
        cvdraw.line(canvas, (int(x1), int(y1)), (int(x2), int(y2)), (255.0, 0, 0), int(t))
        cvdraw.circle(canvas, (int(x2) - 24, int(y1)), int(t) + 2, (255, 0, 0))
        assert np.array_equal(canvas[..., 0], refs["draw/lines"][k]), k


@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 9, 3), (9, 1), (70, 3, 4), (1, 700, 3), (700, 1)])
def test_tiny_and_odd_images_make_a_map(models, shape):
    register("reference")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "dw_openpose_full", models=models, backend="reference")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "dw_openpose_full", models=models, backend="reference")
