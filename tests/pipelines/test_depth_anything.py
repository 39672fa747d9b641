"""The ``depth_anything`` / ``depth_anything_v2`` preprocessors (Depth Anything V1 and V2) against transformers.

References: scripts/ref_depth_anything.py loaded the seeded files that depthanything_helpers writes (the original
repos' names and shapes) into transformers 5.24's DepthAnythingForDepthEstimation through its own name mapping,
and ran the extension's steps around it with OpenCV and torch; tests/data/depthanything/refs.npz holds the image,
the network inputs, predictions and maps, and OpenCV's / torch's resizes of small random arrays.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from depthanything_helpers import TINY, VITL, make_weights  # noqa: E402
from depthanything_helpers import test_image as make_image  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import annotators, preprocessors  # noqa: E402
from sdrt.pipelines import depthanything as da  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "depthanything"
SMALL = 140  # the reference's quick lower bound (the extension's is 518)
NAMES = {1: "depth_anything", 2: "depth_anything_v2"}


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "refs.npz")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The narrow seeded file at V1's name in the extension's layout, and V2's name in ComfyUI's."""
    root = tmp_path_factory.mktemp("depthanything")
    weights = make_weights(TINY)
    v1 = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "depth_anything"
    v1.mkdir(parents=True)
    write_pth(v1 / "depth_anything_vitl14.pth", weights)
    v2 = root / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "depth-anything" / "Depth-Anything-V2-Large"
    v2.mkdir(parents=True)
    write_pth(v2 / "depth_anything_v2_vitl.pth", weights)
    return root


def _close_maps(made: np.ndarray, want: np.ndarray) -> None:
    """uint8 maps from float32 predictions that agree to ~1e-5: equal, or 1 level apart on a few pixels."""
    diff = np.abs(made.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (int(diff.max()), float((diff > 0).mean()))


def test_resizes_equal_opencv_and_torch(refs):
    """OpenCV's INTER_CUBIC on float64 (bit for bit, enlarging and shrinking), torch's bilinear
    (align_corners=False) and DINOv2's / transformers' bicubic position embeddings to float32 rounding."""
    assert np.array_equal(da.cubic(refs["cubic_in"], 45, 37), refs["cubic_up"])
    assert np.array_equal(da.cubic(refs["cubic_in"], 13, 11), refs["cubic_down"])
    np.testing.assert_allclose(da.bilinear(refs["bil_in"], 23, 31), refs["bil_up"], rtol=0, atol=3e-6)
    np.testing.assert_allclose(da.bilinear(refs["bil_in"], 5, 4), refs["bil_down"], rtol=0, atol=3e-6)
    pos = refs["pos_in"]
    np.testing.assert_allclose(da.pos_embed(pos, 10, 12)[:, 1:], refs["pos_dinov2"], rtol=0, atol=3e-5)
    np.testing.assert_allclose(da.pos_embed(pos, 10, 12, offset=0)[:, 1:], refs["pos_size"], rtol=0, atol=3e-5)
    assert np.array_equal(da.pos_embed(pos, 37, 37), pos)  # DINOv2 keeps its own grid as it is
    assert da.input_size(64, 80, SMALL) == refs["tiny_input"].shape[1:]
    assert da.input_size(64, 80) == (518, 644) and da.input_size(74, 78) == (518, 546)


def test_network_input_equals_the_extension(refs):
    """cvtColor(BGR2RGB) of the RGB image, /255, INTER_CUBIC to the multiple of 14, ImageNet's mean and std."""
    assert np.array_equal(da.prepare(refs["image"], SMALL)[0], refs["tiny_input"])


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_predictions_and_maps_equal_transformers(refs, tiny, backend):
    """V1 (the last four blocks into the head) and V2 (blocks 2, 5, 8, 11 of 12) from the same file: the
    predictions at the network's size, and the extension's maps at the image's size."""
    register(backend)
    image = refs["image"]
    for version in (1, 2):
        (path,) = annotators.find(NAMES[version], tiny, "models")
        with da.DepthAnything(path, version, backend=backend, size=SMALL) as det:
            pred = det.predict(image)
            made = det.map(image)
        want = refs[f"tiny_v{version}_pred"]
        assert want.max() > 1 and 0.2 < (want > 0).mean() < 0.9  # a map with structure, not a flat one
        np.testing.assert_allclose(pred, want, rtol=0, atol=1e-4 * float(want.max()))
        _close_maps(made, refs[f"tiny_v{version}_map"])
    # V1 and V2 differ (the blocks fed to the head), so the version is not ignored
    assert np.abs(refs["tiny_v1_pred"] - refs["tiny_v2_pred"]).max() > 0.1


def test_position_offset_is_dinov2s(refs, tiny):
    """offset=0 (transformers' own resize of the position embeddings) matches transformers unpatched; the
    extension's DINOv2 offset (0.1) moves the prediction by far more than the tolerance."""
    register("reference")
    with da.DepthAnything(annotators.find("depth_anything", tiny, "models")[0], 1, backend="reference", size=SMALL, offset=0) as det:
        pred = det.predict(refs["image"])
    want = refs["tiny_v1_own_pred"]
    np.testing.assert_allclose(pred, want, rtol=0, atol=1e-4 * float(want.max()))
    assert np.abs(want - refs["tiny_v1_pred"]).max() > 0.05


def test_full_size_vitl_at_518(refs, tmp_path):
    """The published ViT-L/14 shapes (335M weights), seeded, at the extension's 518: the map of a 74x78 image
    (network input 518x546) against transformers'. On OpenVINO: onnx's reference evaluator keeps every
    intermediate of a run (over 20 GB for ViT-L at this size)."""
    register("openvino")
    path = write_pth(tmp_path / "depth_anything_vitl14.pth", make_weights(VITL))
    image = refs["full_image"]
    assert np.array_equal(image, make_image(74, 78, seed=7))
    with da.DepthAnything(path, 1, backend="openvino") as det:
        assert det.config == da.Config(1024, 24, 4096, 37, 256, (256, 512, 1024, 1024))
        depth = det.depth(image)
    want = refs["full_depth"]
    np.testing.assert_allclose(depth, want, rtol=0, atol=1e-4 * float(want.max()))
    _close_maps(da.depth_map(depth), refs["full_map"])


def test_files_and_errors(tmp_path, tiny):
    """Both versions are found in the extension's, Forge's and ComfyUI's folders; missing, foreign, altered and
    unreadable files are one-line errors naming the file."""
    assert annotators.find("depth_anything", tiny, "m")[0].parent.name == "depth_anything"
    assert annotators.find("depth_anything_v2", tiny, "m")[0].parent.name == "Depth-Anything-V2-Large"
    forge = tmp_path / "forge" / "ControlNetPreprocessor" / "depth_anything_v2"
    forge.mkdir(parents=True)
    (forge / "depth_anything_v2_vitl.safetensors").write_bytes(b"x")
    (forge / "depth_anything_v2_vits.pth").write_bytes(b"x")
    assert annotators.find("depth_anything_v2", tmp_path / "forge", "m")[0].name == "depth_anything_v2_vitl.safetensors"
    comfy = tmp_path / "comfy" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "LiheYoung" / "Depth-Anything"
    (comfy / "checkpoints").mkdir(parents=True)
    (comfy / "checkpoints" / "depth_anything_vitb14.pth").write_bytes(b"x")  # another size, as ComfyUI offers
    assert annotators.find("depth_anything", tmp_path / "comfy", "m")[0].name == "depth_anything_vitb14.pth"
    with pytest.raises(InputError) as e:
        annotators.find("depth_anything", tmp_path / "forge", "--control-preprocessor-models")
    msg = str(e.value)
    assert "no depth_anything_vitl14.pth in" in msg and "--control-preprocessor-models" in msg and "\n" not in msg
    with pytest.raises(InputError, match="the depth_anything_v2 preprocessor needs depth_anything_v2_vitl"):
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_anything_v2")
    bad = write_pth(tmp_path / "body_pose_model.pth", {"conv1_1.weight": np.zeros((64, 3, 3, 3), np.float32)})
    with pytest.raises(ModelError, match="not a Depth Anything file"):
        da.DepthAnything(bad)
    weights = make_weights(TINY)
    weights["depth_head.scratch.layer2_rn.weight"] = np.zeros((32, 16, 3, 3), np.float32)
    altered = write_pth(tmp_path / "altered.pth", weights)
    with pytest.raises(ModelError, match="layer2_rn.weight is"):
        da.DepthAnything(altered)
    weights = make_weights(TINY)
    del weights["pretrained.blocks.11.ls2.gamma"]
    with pytest.raises(ModelError, match="1 of its .* tensors missing"):
        da.DepthAnything(write_pth(tmp_path / "missing.pth", weights))
    weights = {k: v for k, v in make_weights(TINY).items() if ".blocks.11." not in k}
    with pytest.raises(ModelError, match="11 blocks; Depth Anything V2's files have 12, 24 or 40"):
        da.DepthAnything(write_pth(tmp_path / "eleven.pth", weights), 2)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        da.DepthAnything(tmp_path / "junk.pth")
    assert "\n" not in str(e.value) and "junk.pth" in str(e.value)


def test_safetensors_file_and_flat_prediction(tmp_path):
    """The extension's V2 download is a .safetensors of the same tensors; the detector keeps the last two input
    sizes compiled (each holds the weights); a flat prediction is a black map (the extension divides 0 by 0)."""
    from safetensors.numpy import save_file

    register("ggml")
    path = tmp_path / "depth_anything_v2_vitl.safetensors"
    weights = make_weights(TINY)
    save_file(dict(weights), str(path))
    with da.DepthAnything(path, 2, backend="ggml", size=28) as det:
        assert det.config.depth == 12 and det.blocks == (2, 5, 8, 11)
        for h, w in ((20, 20), (20, 40), (20, 60), (20, 40)):  # three input sizes: the last two compiled kept
            det.predict(np.zeros((h, w, 3), np.uint8))
        assert list(det._sessions) == [(28, 84), (28, 56)]  # 28x28's closed, 28x56 used last
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0 / 0 on the way (NaN cast to uint8 is undefined)
        flat = da.depth_map(np.full((5, 7), 3.0, np.float32))
    assert flat.dtype == np.uint8 and not flat.any()


def test_preprocess_at_a_resolution(refs, tiny):
    """At processor resolution 96: the extension's resize_image_with_pad (INTER_CUBIC to 96x120, edges padded to
    128x128), the detector at 518, the map cropped back, as three channels. From OpenCV's padded image the maps
    are the extension's; through preprocess() sdrt's own uint8 INTER_CUBIC (controlmaps.processor_input, 1 level
    off the wheel's IPP bicubic on 0.2% of this image's values, 1.5% before float32 weights and rounding half to
    even) moves 0.7% of the map's pixels by 1 level (3-4% before)."""
    register("openvino")
    for version, key in ((1, "res96_v1_map"), (2, "res96_v2_map")):
        (path,) = annotators.find(NAMES[version], tiny, "models")
        with da.DepthAnything(path, version, backend="openvino") as det:
            _close_maps(det.map(refs["res96_input"])[:96, :120], refs[key])
        made = preprocessors.preprocess(refs["image"], NAMES[version], resolution=96, models=tiny,
                                        backend="openvino")
        assert made.shape == (96, 120, 3) and np.array_equal(made[..., 0], made[..., 2])
        diff = np.abs(made[..., 0].astype(int) - refs[key])
        assert diff.max() <= 1 and (diff > 0).mean() < 0.012, (int(diff.max()), float((diff > 0).mean()))
    own = preprocessors.preprocess(refs["image"], "depth_anything", models=tiny, backend="openvino")
    assert own.shape == (64, 80, 3) and own.any()


@pytest.mark.parametrize("shape", [(1, 1, 3), (30, 90), (50, 13, 4)])
def test_tiny_and_odd_images_make_a_map(tiny, shape):
    """A pixel, a 2-D strip and an RGBA sliver: resized up to 518 on the shorter side, back to their size; an
    image longer than 4:1 (its patches' attention would need gigabytes) is one line asking for a crop."""
    register("openvino")
    img = np.random.default_rng(5).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "depth_anything", models=tiny, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "depth_anything", models=tiny, backend="openvino")
    with pytest.raises(InputError, match="crop the control image to nearer a square") as e:
        preprocessors.preprocess(np.zeros((10, 41, 3), np.uint8), "depth_anything", models=tiny)
    assert "\n" not in str(e.value) and "10x41 control image is 518x2128" in str(e.value)


def test_depth_anything_in_a_controlnet_run_and_on_the_command_line(refs, tiny, tmp_path, capsys):
    """A unit with depth_anything gives the image of a unit fed its map by hand; the CLI's
    --control-preprocessor-models runs it and writes the module in the infotext; without the file, one line."""
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
        unit = ControlNet("controlnet", image, preprocessor="depth_anything_v2", processor_res=64,
                          preprocessor_models=tiny)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "depth_anything_v2", resolution=64, models=tiny, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: depth_anything_v2, Model: controlnet")
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "depth_anything"]
    assert main([*args, "--control-preprocessor-models", str(tiny), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: depth_anything, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "--control-preprocessor-models", str(tmp_path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no depth_anything_vitl14.pth in {tmp_path}" in err, err


def test_another_preprocessors_file_by_path_is_refused(tmp_path):
    """Depth Anything V1's file given as V2's (or lineart_coarse's as lineart_realistic's) has the same tensors and
    would run with the other's layers or weights unnoticed: refused in one line naming the file and the argument."""
    for f in ("depth_anything_vitl14.pth", "depth_anything_v2_vitl.safetensors", "sk_model.pth", "sk_model2.pth"):
        (tmp_path / f).write_bytes(b"")
    cases = [("depth_anything_v2", "depth_anything_vitl14.pth", "depth_anything_v2_vitl"),
             ("depth_anything", "depth_anything_v2_vitl.safetensors", "depth_anything_vitl14.pth"),
             ("lineart_realistic", "sk_model2.pth", "sk_model.pth"), ("lineart_coarse", "sk_model.pth", "sk_model2.pth")]
    for name, f, want in cases:
        with pytest.raises(InputError, match=f"is the .* preprocessor's file, and {name} needs {want}") as e:
            preprocessors.model_files(name, tmp_path / f, "--control-preprocessor-models")
        assert e.value.where == "--control-preprocessor-models" and "\n" not in str(e.value)
    assert preprocessors.model_files("depth_anything", tmp_path / "depth_anything_vitl14.pth", "m")[0].name == \
        "depth_anything_vitl14.pth"
    renamed = tmp_path / "my_depth.pth"  # a file under a name of its own is taken as given
    renamed.write_bytes(b"")
    assert preprocessors.model_files("depth_anything_v2", renamed, "m") == (renamed,)
