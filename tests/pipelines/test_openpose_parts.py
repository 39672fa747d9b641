"""``openpose_hand``, ``openpose_face``, ``openpose_faceonly`` and ``openpose_full`` (OpenPose's hand and face
models, hand_pose_model.pth and facenet.pth) against the extension's code.

References: scripts/ref_openpose_parts.py ran controlnet_aux 0.0.10's OpenposeDetector with Body, Hand and Face
(sd-webui-controlnet's body.py, hand.py, face.py, model.py, handDetect and faceDetect) on the full-size seeded
files that openpose_helpers writes here (the same bytes, from fixed seeds); tests/data/openpose/parts_refs.npz
holds its image, keypoints, boxes, peaks, the four maps and the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openpose_helpers import make_face_weights, make_hand_weights, make_weights, write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import annotators, openposebody, openposeface, openposehand, openposeparts, posemaps, preprocessors  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "openpose"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "parts_refs.npz")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/openpose."""
    root = tmp_path_factory.mktemp("openpose")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose"
    folder.mkdir(parents=True)
    write_pth(folder / openposebody.BODY_FILE, make_weights())
    write_pth(folder / openposehand.HAND_FILE, make_hand_weights())
    write_pth(folder / openposeface.FACE_FILE, make_face_weights())
    return root


@pytest.fixture(scope="module")
def found(models, refs):
    """The people sdrt finds on OpenVINO with hands and face (one run of the three networks for every test)."""
    register("openvino")
    det = preprocessors.openpose_parts("openpose_full", models, "openvino")  # kept: compiled once for the module
    assert isinstance(det, openposeparts.OpenPoseParts) and det.drawn == (True, True, True)
    return openposeparts.detect(refs["image"], det.body, det.hand, det.face)


def _file(models, name):
    return dict((f.name, f) for f in annotators.find("openpose_full", models, "models"))[name]


def _points(points, n):
    out = np.full((n, 2), np.nan)
    for i, p in enumerate(points or []):
        if p is not None:
            out[i] = p
    return out


def test_keypoints_equal_the_extension(found, refs):
    """Body, hands and face keypoints as the extension's: the same people, the hand's 21 points and the face's
    variable number of points (float32 fractions, bit for bit; missing hand points at -1 pixel)."""
    assert len(found) == len(refs["body"]) >= 3
    assert sorted(refs["hand_boxes"][:, 4].tolist()) == [0, 1] and len(refs["face_boxes"]) >= 3  # both hands
    for i, person in enumerate(found):
        np.testing.assert_array_equal(_points(person.body, 18), refs["body"][i])
        for part, key in ((person.left_hand, "left"), (person.right_hand, "right")):
            want = refs[key][i]
            if np.isnan(want).all():
                assert part is None, (i, key)
            else:
                assert all(isinstance(v, np.float32) for p in part for v in p)
                np.testing.assert_array_equal(_points(part, 21).astype(np.float32), want)
        n = int(refs["face_n"][i])
        if n < 0:
            assert person.face is None, i
        else:
            assert len(person.face) == n
            np.testing.assert_array_equal(_points(person.face, 71).astype(np.float32), refs["face"][i])


def test_hand_peaks_equal_the_extension(models, refs):
    """The hand network's keypoints in each box: 21 per box, (0, 0) where nothing passes, and the seeded file's
    three sunk keypoints among them."""
    register("openvino")
    bgr = np.ascontiguousarray(refs["image"][:, :, ::-1])
    net = preprocessors.openpose_parts("openpose_hand", models, "openvino").hand  # kept: compiled already
    assert isinstance(net, openposehand.HandNet)
    for (_, x, y, side, _), want in zip(refs["hand_boxes"], refs["hand_peaks"]):
        got = net.peaks(bgr[y:y + side, x:x + side])
        np.testing.assert_array_equal(got, want)
        assert 3 <= int((want == 0).all(1).sum()) < 21


@pytest.mark.parametrize("name,body,hands,face", [("openpose_hand", True, True, False),
                                                  ("openpose_face", True, False, True),
                                                  ("openpose_faceonly", False, False, True),
                                                  ("openpose_full", True, True, True)])
def test_maps_equal_the_extension(found, refs, name, body, hands, face):
    h, w = refs["image"].shape[:2]
    made = posemaps.draw(found, h, w, body=body, hands=hands, face=face)
    want = refs[f"map_{name}"]
    assert want.any()
    assert np.array_equal(made, want), int((made != want).any(-1).sum())


def test_json_equals_the_extension(found, refs):
    """openpose_full's JSON as the extension's json_pose_callback receives it, value for value."""
    h, w = refs["image"].shape[:2]
    want = json.loads(str(refs["json"]))
    got = json.loads(json.dumps(posemaps.to_json(found, h, w)))
    assert got == want


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_networks_equal_torch(models, refs, backend):
    """Both graphs on each backend against torch's modules on a 64x64 input (the full pipeline runs the hand
    network at 184 to 736 pixels, too slow for the reference backend)."""
    register(backend)
    x = refs["net_in"]
    for cls, file, key in ((openposehand.HandNet, openposehand.HAND_FILE, "hand_net"),
                           (openposeface.FaceNet, openposeface.FACE_FILE, "face_net")):
        with cls(_file(models, file), backend=backend) as net:
            got = net.run(x)
        want = refs[key]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-4 * float(np.abs(want).max()), rtol=1e-4)


def test_bilinear_and_label_equal_torch_and_skimage(refs):
    """The primitives: torch's F.interpolate(bilinear, align_corners=True) shrinking and growing to within a
    float32 rounding or two (torch's compiled kernel contracts its sums into FMAs in an order not reproduced here;
    the face keypoints above are the extension's all the same), skimage's label(connectivity=2) numbering bit for
    bit."""
    a = refs["bil_in"]
    for key, size in (("bil_29", (29, 37)), ("bil_53", (53, 53))):
        got, want = openposeface.bilinear_corners(a, *size), refs[key]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=4 * float(np.spacing(np.float32(np.abs(want).max()))))
        assert np.mean(got == want) > 0.4
    labels, n = openposehand.label8(refs["blobs"])
    assert np.array_equal(labels, refs["labels"]) and n == refs["labels"].max() > 5


def test_boxes_follow_the_extension():
    """handDetect's and faceDetect's arithmetic on hand-made keypoints: centre past the wrist, width from the
    longer arm segment, clipping to the image and the 20-pixel floor; the face box from nose, eyes and ears."""
    kp = [None] * 18
    kp[2], kp[3], kp[4] = (50.0, 40.0), (50.0, 70.0), (50.0, 100.0)  # right arm straight down
    assert openposehand.hand_boxes(kp, 200, 200) == [(int(50 - 22.5), int(109.9 - 22.5), 45, False)]
    assert openposehand.hand_boxes(kp, 120, 200) == [(27, 87, 32, False)]  # clipped at the bottom
    kp[5], kp[6], kp[7] = (10.0, 10.0), (12.0, 12.0), (13.0, 13.0)
    assert [b[3] for b in openposehand.hand_boxes(kp, 200, 200)] == [False]  # the left one under 20 pixels
    face = [None] * 18
    face[0], face[14] = (60.0, 50.0), (66.0, 46.0)
    assert openposeface.face_box(face, 200, 200) == (42, 32, 36)
    face[17] = (90.0, 50.0)
    assert openposeface.face_box(face, 200, 200) == (15, 5, 90)
    assert openposeface.face_box([None] * 18, 200, 200) is None


def test_files_and_errors(tmp_path, models):
    """The files in the extension's layout (and ComfyUI's); one line naming the flag and every file a module needs
    when one is missing; a file of the other network or no torch file at all: one line naming it."""
    with pytest.raises(InputError) as e:
        annotators.find("openpose_hand", tmp_path, "--control-preprocessor-models")
    assert "no body_pose_model.pth and hand_pose_model.pth in" in str(e.value) and "\n" not in str(e.value)
    assert [f.name for f in annotators.find("openpose_face", models, "m")] == ["body_pose_model.pth", "facenet.pth"]
    assert _file(models, openposeface.FACE_FILE).parent.name == "openpose"
    comfy = tmp_path / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    for f in annotators.find("openpose_full", models, "m"):
        (comfy / f.name).symlink_to(f)
    assert [f.parent for f in annotators.find("openpose_full", tmp_path, "m")] == [comfy] * 3
    (comfy / "facenet.pth").unlink()
    with pytest.raises(InputError, match="no body_pose_model.pth and hand_pose_model.pth and facenet.pth in"):
        preprocessors.preprocess(np.zeros((64, 64, 3), np.uint8), "openpose_full", models=tmp_path)
    hand = _file(models, openposehand.HAND_FILE)
    with pytest.raises(ModelError, match="not OpenPose's face model"):
        openposeface.FaceNet(hand)
    body = openposebody.find_file(models)
    with pytest.raises(ModelError, match="not OpenPose's hand model"):
        openposehand.HandNet(body)
    (tmp_path / "facenet.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        openposeface.FaceNet(tmp_path / "facenet.pth")
    assert "\n" not in str(e.value)


def test_preprocess_maps_and_json(refs, models):
    """preprocess() at the image's size makes the extension's map; pose_detect the map and JSON; the modules share
    their compiled networks (the body's with openpose too)."""
    register("openvino")
    image = refs["image"]
    out = preprocessors.preprocess(image, "openpose_faceonly", resolution=None, models=models, backend="openvino")
    assert np.array_equal(out, refs["map_openpose_faceonly"])
    before = preprocessors.keep_preprocessors(5)  # kept across uses (the default keeps the last use's nets)
    try:
        full = preprocessors.openpose_parts("openpose_full", models, "openvino")
        face = preprocessors.openpose_parts("openpose_face", models, "openvino")
        hand = preprocessors.openpose_parts("openpose_hand", models, "openvino")
        assert face.face is full.face and hand.hand is full.hand and hand.face is None and face.hand is None
        assert full.body is preprocessors.openpose_body(models, "openvino")
    finally:
        preprocessors.keep_preprocessors(before)
    with preprocessors.held():  # one use: its three networks stay together at the default bound
        full = preprocessors.openpose_parts("openpose_full", models, "openvino")
    assert {k for k, *_ in preprocessors.kept_detectors()} == {"openpose", "openpose_hand_model", "openpose_face_model"}
    assert preprocessors.openpose_parts("openpose_full", models, "openvino").hand is full.hand
    made, pose = preprocessors.pose_detect(image, full)
    assert np.array_equal(made, refs["map_openpose_full"])
    assert json.loads(json.dumps(pose)) == json.loads(str(refs["json"]))


def test_units_need_their_files():
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    img = np.zeros((8, 8, 3), np.uint8)
    for name, files in (("openpose_hand", "body_pose_model.pth and hand_pose_model.pth"),
                        ("openpose_faceonly", "body_pose_model.pth and facenet.pth")):
        with pytest.raises(InputError, match=f"preprocessor_models: the {name} preprocessor needs OpenPose's {files}"):
            parse_units([ControlNet("controlnet", img, preprocessor=name)])


def test_openpose_faceonly_in_a_controlnet_run_and_on_the_command_line(refs, models, tmp_path, capsys):
    """A unit with openpose_faceonly (preprocessor_models) gives the image of a unit fed the extension's map by
    hand (the tiny net makes 64x64: both maps are cropped and resized alike); the CLI's --control-preprocessor-models runs it and writes the module in the infotext; without the face
    file, one line naming the flag and the file."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines.controlnet import ControlNet

    image = refs["image"]
    kw = dict(steps=1, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="openpose_faceonly", processor_res=64,
                          preprocessor_models=models, pose_backend="openvino")
        gen = pipe.generate("a face", controlnets=[unit], **kw)
        made = preprocessors.preprocess(image, "openpose_faceonly", resolution=64, models=models, backend="openvino")
        assert made.shape == image.shape and made.any()  # found on the image padded to 64x128, as the extension pads
        by_hand = pipe("a face", controlnets=[("controlnet", made)], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: openpose_faceonly, Model: controlnet")
    png, out = tmp_path / "faces.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a face", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "openpose_faceonly",
            "--control-processor-res", "64"]  # as the unit above (the CLI's default 512: minutes of face crops)
    assert main([*args, "--control-preprocessor-models", str(models), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: openpose_faceonly, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    only_body = tmp_path / "body"
    only_body.mkdir()
    (only_body / "body_pose_model.pth").symlink_to(_file(models, openposebody.BODY_FILE))
    assert main([*args, "--control-preprocessor-models", str(only_body), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "facenet.pth" in err, err
