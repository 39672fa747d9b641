"""animal_openpose (RTMPose-m AP10K with DWPose's YOLOX) against the extension's own code.

References: scripts/ref_animal_openpose.py ran sd-webui-controlnet's annotator/openpose/animalpose.py (with its
cv_ox_det and cv_ox_pose, loaded from a copy outside this repository) through OpenCV's cv2.dnn, as the extension
does, on the stand-in ONNX files of tests/pipelines/animal_graphs.py (the published files' input and output names
and shapes), after the extension's resize_image_with_pad; tests/data/control/animal_refs.npz holds the padded
inputs, boxes, animals, maps and JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import animal_graphs  # noqa: E402
import dwpose_graphs  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import animalpose, preprocessors  # noqa: E402

REFS = Path(__file__).resolve().parents[1] / "data" / "control" / "animal_refs.npz"
CASES = ("stripes_256", "stripes_160", "checks_192", "checks_192_none")


@pytest.fixture(scope="module")
def refs():
    return np.load(REFS)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The extension's layout: both files in <root>/extensions/sd-webui-controlnet/annotator/downloads/openpose;
    a detector that sees no animal elsewhere."""
    root = tmp_path_factory.mktemp("animal")
    det, pose = animal_graphs.write(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose")
    none = root / "none"
    none.mkdir()
    animal_graphs.detector(none / "yolox_l.onnx", animal_graphs.NONE)
    return {"root": root, "det": det, "pose": pose, "none": none / "yolox_l.onnx"}


def _json(refs, key):
    return json.loads(bytes(refs[f"json/{key}"]))


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_animal_maps_equal_the_extension(refs, models, backend):
    """Boxes (classes 14-23 in class order; the duplicate, the person, the bird at 0.25 and the bus left out),
    keypoints (scores clipped to 0..1) and JSON equal the extension's to float32 rounding, the maps pixel for pixel;
    a detector that sees no animal gives none (a black map), not a pose of the whole image."""
    register(backend)
    for key in CASES:
        det = models["none"] if key.endswith("none") else models["det"]
        with animalpose.AnimalPose(det, models["pose"], backend=backend) as ap:
            x = refs[f"input/{key}"]
            np.testing.assert_allclose(ap.detect(x), refs[f"boxes/{key}"], atol=1e-4)
            animals = ap(x)
            np.testing.assert_allclose(animals, refs[f"animals/{key}"], atol=1e-4)
            want = refs[f"map/{key}"]
            made = animalpose.draw(animals, *x.shape[:2])[:want.shape[0], :want.shape[1]]
            assert np.array_equal(made, want)
            got, ref = animalpose.to_json(animals, *x.shape[:2]), _json(refs, key)
            assert got.keys() == ref.keys() and got["people"] == [] and len(got["animals"]) == len(ref["animals"])
            for a, b in zip(got["animals"], ref["animals"]):
                np.testing.assert_allclose(a, b, atol=1e-4)
    animals = refs["animals/stripes_256"]
    assert len(animals) == 3 and (animals[:, :, 2] == 1).any() and (animals[:, :, 2] < 1).any()
    assert len(refs["animals/checks_192_none"]) == 0 and not refs["map/checks_192_none"].any()


def test_drawing_alone_equals_the_extension(refs):
    """draw_animalposes on random animals, points outside the canvas among them: every limb, pixel for pixel."""
    for k in range(3):
        assert np.array_equal(animalpose.draw(refs[f"draw/points/{k}"], 150, 170), refs[f"draw/map/{k}"])


def test_animal_openpose_from_the_raw_image(refs, models):
    """preprocess() from the raw image (sdrt's resize and padding): the extension's maps at 256, 160 and 192."""
    register("openvino")
    for key in CASES[:3]:
        name, res = key.split("_")
        made = preprocessors.preprocess(refs[f"image/{name}"], "animal_openpose", resolution=int(res),
                                        models=models["root"], backend="openvino")
        assert np.array_equal(made, refs[f"map/{key}"])


def test_layouts_and_files(refs, models, tmp_path):
    """ComfyUI's layout (the detector in ckpts/yzd-v/DWPose, its ONNX pose model rtmpose-m_ap10k_256.onnx in
    ckpts/hr16/UnJIT-DWPose) and Forge's are found; missing or wrong files are one line naming them; DWPose's pose
    model given as the animal one (or the other way round) is refused naming its preprocessor."""
    ckpts = tmp_path / "ComfyUI" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts"
    det, pose = animal_graphs.write(ckpts / "yzd-v" / "DWPose", ckpts / "hr16" / "UnJIT-DWPose",
                                    pose_name="rtmpose-m_ap10k_256.onnx")
    assert preprocessors.model_files("animal_openpose", tmp_path / "ComfyUI", "models") == (det, pose)
    forge = tmp_path / "forge" / "models" / "ControlNetPreprocessor" / "openpose"
    fd, fp = animal_graphs.write(forge)
    assert preprocessors.model_files("animal_openpose", tmp_path / "forge" / "models", "m") == (fd, fp)
    assert preprocessors.model_files("animal_openpose", [fd, fp], "m") == (fd, fp)
    with pytest.raises(InputError) as e:
        preprocessors.model_files("animal_openpose", tmp_path / "ComfyUI" / "custom_nodes", "--control-preprocessor-models")
    msg = str(e.value)
    assert "\n" not in msg and "no yolox_l.onnx and rtmpose-m_simcc-ap10k" in msg and "hr16/UnJIT-DWPose" in msg, msg
    dw = tmp_path / "dw"
    dw_det, dw_pose = dwpose_graphs.write(dw)
    with pytest.raises(InputError, match="is the dw_openpose_full preprocessor's file, and animal_openpose needs"):
        preprocessors.model_files("animal_openpose", [dw_det, dw_pose], "models")
    with pytest.raises(InputError, match="is the animal_openpose preprocessor's file, and dw_openpose_full needs"):
        preprocessors.model_files("dw_openpose_full", [dw_det, fp], "models")
    register("openvino")
    with pytest.raises(ModelError) as e:  # DWPose's 384x288 pose model renamed as the animal one
        animalpose.AnimalPose(dw_det, dw_pose, backend="openvino")
    msg = str(e.value)
    assert "\n" not in msg and "is not the AP10K animal pose model" in msg and "qinglong_controlnet-lllite" in msg
    with pytest.raises(ModelError, match="is not a YOLOX COCO detector"):
        animalpose.AnimalPose(fp, fp, backend="openvino")
    cut = tmp_path / "cut" / animalpose.ANIMAL_FILE
    cut.parent.mkdir()
    cut.write_bytes(fp.read_bytes()[:3000])
    with pytest.raises(ModelError) as e:
        animalpose.AnimalPose(fd, cut, backend="openvino")
    assert "\n" not in str(e.value) and str(cut) in str(e.value)
    assert preprocessors.kind_of("animal_openpose") == "animal_openpose"
    d = preprocessors.detector("animal_openpose", models["root"])
    assert d.files == (models["det"], models["pose"]) and d.weight_bytes() == sum(f.stat().st_size for f in d.files)


def test_kept_and_released(models):
    """One compiled animal pose per backend and device, kept as DWPose's are (keep_preprocessors), released by
    the memory plan's release()."""
    register("openvino")
    before = preprocessors.keep_preprocessors(1)
    try:
        preprocessors.release()
        a = preprocessors.animal_pose(models["root"], "openvino")
        assert preprocessors.animal_pose(models["root"], "openvino") is a
        assert [k[0] for k in preprocessors.kept_detectors()] == ["animal_openpose"]
        assert preprocessors.release("animal_openpose") == 1 and preprocessors.kept_detectors() == []
    finally:
        preprocessors.keep_preprocessors(before)


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4), (1, 700, 3)])
def test_tiny_and_odd_images_make_a_map(models, shape):
    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "animal_openpose", models=models["root"], backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)


def test_animal_openpose_in_a_controlnet_run_and_on_the_command_line(refs, models, tmp_path, capsys):
    """A unit with animal_openpose gives the image of a unit fed its map by hand; the CLI runs it from
    --control-preprocessor-models and names the module in the infotext; without the files, one line naming the flag."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    image = refs["image/stripes"]
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="animal_openpose", processor_res=256,
                          preprocessor_models=models["root"])
        gen = pipe.generate("a dog", controlnets=[unit], **kw)
        by_hand = pipe("a dog", controlnets=[("controlnet", refs["map/stripes_256"])], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: animal_openpose, Model: controlnet")
    with pytest.raises(InputError, match="the animal_openpose preprocessor needs the animal pose's yolox_l.onnx and"):
        parse_units([ControlNet("controlnet", image, preprocessor="animal_openpose")])
    png, out = tmp_path / "dog.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a dog", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "animal_openpose"]
    assert main([*args, "--control-preprocessor-models", str(models["root"]), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    assert "Module: animal_openpose, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "rtmpose-m_simcc-ap10k" in err, err


def test_the_plan_counts_the_animal_pose(refs, models):
    """A job's memory plan counts the two graphs (``preprocessor:animal_openpose``: the ONNX files' sizes)."""
    from pipeline_helpers import DATA as PDATA

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    register("openvino")
    unit = ControlNet("controlnet", refs["image/stripes"], preprocessor="animal_openpose", processor_res=128,
                      preprocessor_models=models["root"])
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
        plan = pipe.plan("a dog", controlnets=[unit], steps=2, seed=1, width=64, height=64, sampler="Euler").memory
    placed = plan.placement("preprocessor:animal_openpose")
    want = models["det"].stat().st_size + models["pose"].stat().st_size
    assert placed is not None and placed.role == "preprocessor" and placed.weight_bytes == want


def test_a_cut_short_pose_model_names_its_own_source(models, tmp_path):
    """A truncated AP10K file is one line naming it and where it comes from (the extension's
    bdsqlsz/qinglong_controlnet-lllite, or ComfyUI's hr16/UnJIT-DWPose), not DWPose's yzd-v/DWPose."""
    register("openvino")
    cut = tmp_path / animalpose.ANIMAL_FILE
    cut.write_bytes(models["pose"].read_bytes()[:3000])
    with pytest.raises(ModelError) as e:
        animalpose.AnimalPose(models["det"], cut, backend="openvino")
    msg = str(e.value)
    assert "\n" not in msg and str(cut) in msg and "qinglong_controlnet-lllite" in msg and "yzd-v" not in msg, msg
    cut_det = tmp_path / "yolox_l.onnx"  # the detector's is DWPose's
    cut_det.write_bytes(models["det"].read_bytes()[:3000])
    with pytest.raises(ModelError, match=r"download DWPose's yolox_l.onnx again \(yzd-v/DWPose\)"):
        animalpose.AnimalPose(cut_det, models["pose"], backend="openvino")


def test_two_files_given_in_either_order_under_comfyuis_name(tmp_path):
    """The two files given by path are taken by their names, ComfyUI's rtmpose-m_ap10k_256.onnx among them, in
    whichever order they come."""
    det, pose = animal_graphs.write(tmp_path, pose_name=animalpose.COMFY_FILE)
    assert preprocessors.model_files("animal_openpose", [pose, det], "models") == (det, pose)
    assert preprocessors.model_files("animal_openpose", [det, pose], "models") == (det, pose)


def test_the_missing_file_alone_is_named(tmp_path):
    """DWPose's users hold yolox_l.onnx already: a folder with it but no AP10K model names the AP10K file (and
    ComfyUI's name for it) as missing, not the detector beside it."""
    det, _ = dwpose_graphs.write(tmp_path / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "openpose")
    with pytest.raises(InputError) as e:
        preprocessors.model_files("animal_openpose", tmp_path, "--control-preprocessor-models")
    msg = str(e.value)
    assert "\n" not in msg and "--control-preprocessor-models" in msg, msg
    assert f"no {animalpose.ANIMAL_FILE} (or {animalpose.COMFY_FILE}) in" in msg and "no yolox_l.onnx" not in msg, msg
