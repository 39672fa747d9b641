"""The ``openpose`` preprocessor (OpenPose's body model, body_pose_model.pth) against the extension's code.

References: scripts/ref_openpose_body.py ran controlnet_aux 0.0.10's OpenposeDetector (sd-webui-controlnet's
body.py, model.py and draw_poses) on the full-size seeded file that openpose_helpers writes here (the same
bytes, built from a fixed seed); tests/data/openpose/body_refs.npz holds its image, map, candidate and subset.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openpose_helpers import make_weights, write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import openposebody, posemaps, preprocessors  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "openpose"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "body_refs.npz")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/openpose."""
    root = tmp_path_factory.mktemp("openpose")
    folder = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose"
    folder.mkdir(parents=True)
    write_pth(folder / openposebody.BODY_FILE, make_weights())
    return root


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml", "openvino-bf16"])
def test_openpose_map_equals_the_extension(refs, models, backend, monkeypatch):
    """Candidates (peaks: positions and ids), people (subset) and the map equal the extension's, pixel for pixel;
    the seeded network finds hundreds of peaks and over twenty people, so peaks, limb scoring, merging and
    dropping all run. "openvino-bf16": with bf16 as the default precision (as on CPUs with AVX-512-BF16 or AMX)
    the network still compiles in float32, as the extension runs it (at bf16, hundreds of map pixels moved)."""
    if backend == "openvino-bf16":
        backend = "openvino"
        monkeypatch.setenv("SDRT_PRECISION", "bf16")
    register(backend)
    with openposebody.OpenPoseBody(openposebody.find_file(models), backend=backend) as det:
        cand, subset = det.body(refs["image"])
        people = det.people(refs["image"])
    assert len(refs["candidate"]) > 100 and len(refs["subset"]) > 10
    np.testing.assert_array_equal(cand[:, [0, 1, 3]], refs["candidate"][:, [0, 1, 3]])
    np.testing.assert_allclose(cand[:, 2], refs["candidate"][:, 2], atol=1e-4)
    np.testing.assert_array_equal(subset[:, :18], refs["subset"][:, :18])
    np.testing.assert_array_equal(subset[:, 19], refs["subset"][:, 19])
    np.testing.assert_allclose(subset[:, 18], refs["subset"][:, 18], atol=1e-3)  # total scores (heatmap values)
    h, w = refs["image"].shape[:2]
    made = posemaps.draw(people, h, w, hands=False, face=False)
    assert np.array_equal(made, refs["map"]), int((made != refs["map"]).any(-1).sum())


def test_preprocess_runs_at_a_resolution_and_json(refs, models):
    register("openvino")
    image = refs["image"]
    out = preprocessors.preprocess(image, "openpose", resolution=None, models=models, backend="openvino")
    assert np.array_equal(out, refs["map"])
    made, pose = preprocessors.pose_detect(image, preprocessors.openpose_body(models, "openvino"))
    assert np.array_equal(made, refs["map"]) and pose["canvas_width"] == image.shape[1]
    back, hh, ww = posemaps.from_json(pose)
    assert np.array_equal(posemaps.draw(back, hh, ww, hands=False, face=False), refs["map"])
    at = preprocessors.preprocess(image, "openpose", resolution=128, models=models, backend="openvino")
    assert at.shape == (168, 128, 3) and at.any()


def test_files_and_errors(tmp_path, models):
    with pytest.raises(InputError) as e:
        openposebody.find_file(tmp_path, what="--control-pose-models")
    assert "no body_pose_model.pth in" in str(e.value) and "\n" not in str(e.value)
    assert openposebody.find_file(models).parent.name == "openpose"
    bad = write_pth(tmp_path / "body_pose_model.pth", {"conv1_1.weight": np.zeros((64, 3, 3, 3), np.float32)})
    with pytest.raises(ModelError, match="not OpenPose's body model"):
        openposebody.OpenPoseBody(bad)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        openposebody.OpenPoseBody(tmp_path / "junk.pth")
    assert "\n" not in str(e.value)


def test_units_and_refused_modules():
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InputError, match="openpose preprocessor needs body_pose_model.pth"):
        parse_units([ControlNet("controlnet", img, preprocessor="openpose")])
    for name in ("openpose_hand", "openpose_face", "openpose_full"):  # no longer refused: they need their files
        with pytest.raises(InputError, match=f"{name} preprocessor needs OpenPose's body_pose_model.pth and"):
            parse_units([ControlNet("controlnet", img, preprocessor=name)])


def test_resizes_and_gaussian_equal_opencv_and_scipy(refs):
    """The primitives bit for bit: OpenCV 5's INTER_LANCZOS4 on float32 (x8 as body.py, and an odd size that
    leaves columns to its scalar loop), on uint8, INTER_AREA on float32, scipy's gaussian_filter(sigma=3)."""
    a = refs["lz_in"][None]
    assert np.array_equal(openposebody.lanczos4(a, 152, 184)[0], refs["lz_out"])
    assert np.array_equal(openposebody.lanczos4(a, 37, 61)[0], refs["lz_odd_out"])
    assert np.array_equal(openposebody.lanczos4(refs["lz8_in"], 34, 49), refs["lz8_out"])
    assert np.array_equal(openposebody._area_float(refs["area_in"][None], 117, 150)[0], refs["area_out"])
    assert np.array_equal(openposebody.gaussian3(refs["gauss_in"][None])[0], refs["gauss_out"])


@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 9, 3), (9, 1), (70, 3, 4), (2100, 1, 3)])
def test_tiny_and_odd_images_make_a_map(models, shape):
    """Grown from one pixel (Lanczos on uint8), 2-D and RGBA images, and one too narrow to scale (a black map)."""
    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "openpose", models=models, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "openpose", models=models, backend="openvino")


def test_lanczos_identity_and_gaussian_constant():
    """Two properties that hold whatever OpenCV / scipy do: a constant plane stays (nearly) constant through
    Lanczos-4 and exactly through the normalised gaussian's reflect edges up to rounding."""
    a = np.full((2, 5, 7), 3.0, np.float32)
    np.testing.assert_allclose(openposebody.lanczos4(a, 56, 40), 3.0, rtol=1e-6)
    np.testing.assert_allclose(openposebody.gaussian3(np.full((1, 30, 40), 2.0)), 2.0, rtol=1e-12)


def test_openpose_in_a_controlnet_run_and_on_the_command_line(refs, models, tmp_path, capsys):
    """A unit with openpose gives the image of a unit fed its map by hand; the CLI's --control-pose-models runs it
    and writes the module in the infotext; without the file, one line naming the flag."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines.controlnet import ControlNet

    image = refs["image"]
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="openpose", processor_res=152, pose_models=models)
        gen = pipe.generate("a dancer", controlnets=[unit], **kw)
        by_hand = pipe("a dancer", controlnets=[("controlnet", preprocessors.preprocess(
            image, "openpose", resolution=152, models=models, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: openpose, Model: controlnet")
    png, out = tmp_path / "dancers.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a dancer", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "openpose"]
    assert main([*args, "--control-pose-models", str(models), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: openpose, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "body_pose_model.pth" in err, err
    for flag in ("--control-pose-models", "--control-preprocessor-models"):  # each named as given
        assert main([*args, flag, str(tmp_path), "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"no body_pose_model.pth in {tmp_path}" in err and f"Where: {flag}." in err, err
    assert main([*args, "--control-pose-models", str(tmp_path), "--control-preprocessor-models", str(tmp_path),
                 "-o", str(out)]) == 1
    assert "both --control-preprocessor-models and --control-pose-models" in capsys.readouterr().err
