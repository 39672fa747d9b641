"""The ``depth_leres`` preprocessor (LeReS's res101.pth) against the extension's code.

References: scripts/ref_leres.py ran controlnet_aux 0.0.10's LeReS network (the extension's annotator/leres code)
inside the extension's ``resize_image_with_pad`` / ``apply_leres`` steps / crop, on the seeded files leres_helpers
writes here (the same bytes, from a fixed seed): the narrow one and, once, the full-size ResNeXt-101 32x8d one;
tests/data/leres/leres_refs.npz holds what they made.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from leres_helpers import make_weights, narrow, write_file  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import leresdepth  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "leres"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "leres_refs.npz")


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """sd-webui-controlnet's layout: <root>/extensions/sd-webui-controlnet/annotator/downloads/leres."""
    root = tmp_path_factory.mktemp("leres")
    return write_file(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "leres")


def _padded(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    return np.pad(image, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")


def _close_maps(made: np.ndarray, want: np.ndarray, most: int) -> None:
    """Equal but for ``most`` values one level apart (float32 noise moves a value sitting on a 16-bit step)."""
    d = np.abs(made.astype(np.int16) - want)
    assert made.shape == want.shape and made.dtype == np.uint8
    assert d.max() <= 1 and int((d > 0).sum()) <= most, (int(d.max()), int((d > 0).sum()))


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_depth_map_equals_the_extension(refs, pth, backend):
    """The narrow network's depth within float32 noise of torch's (measured: 3e-6 of its range), and the map at the
    image's own size equal to the extension's (measured: equal on all three backends)."""
    register(backend)
    image = refs["image"]
    with leresdepth.LeresDepth(pth, backend=backend) as det:
        assert det.config == narrow()
        raw = det.depth(_padded(image))
        made = det(image)
        at96 = det(refs["pad_96"])[:123, :96]
    want = refs["raw_own"]
    np.testing.assert_allclose(raw, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert refs["map_own"].std() > 20  # the map varies: the random network is not flat
    _close_maps(made, refs["map_own"], 4)
    _close_maps(at96, refs["map_96"], 4)


def test_full_size_res101_pth(refs, tmp_path):
    """The full-size file (ResNeXt-101 32x8d's 3/4/23/3 bottlenecks of 32 groups and the LeReS decoder, 115.6 M
    values under ``depth_model`` with DataParallel's ``module.``, as the published checkpoint keeps them) makes the
    extension's map of a 64 x 48 image on OpenVINO (about 10 s; onnx's reference evaluator is far slower)."""
    register("openvino")
    pth = write_file(tmp_path, tiny=False)
    with leresdepth.LeresDepth(pth, backend="openvino") as det:
        assert det.config == leresdepth.PUBLISHED
        raw = det.depth(_padded(refs["full_image"]))
        made = det(refs["full_image"])
    want = refs["full_raw"]
    np.testing.assert_allclose(raw, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))
    assert refs["full_map"].std() > 20
    _close_maps(made, refs["full_map"], 4)


def test_at_processor_resolutions_and_thresholds(refs, pth):
    """preprocess() at a resolution (scaled, padded to 64, cropped) as the extension's at 64 (area, shrinking) and 96
    (bicubic, enlarging); Remove Near % and Remove Background % (low, high) as its thresholds; without a resolution
    the image is padded as at its own size."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["image"]
    for res, shape in ((64, (82, 64, 3)), (96, (123, 96, 3))):
        made = preprocessors.preprocess(image, "depth_leres", resolution=res, models=pth, backend="openvino")
        assert made.shape == shape and (made[..., 0] == made[..., 2]).all()
        _close_maps(made[..., 0], refs[f"map_{res}"], 8)
    made = preprocessors.preprocess(image, "depth_leres", 20, 30, resolution=64, models=pth, backend="openvino")
    _close_maps(made[..., 0], refs["map_64_thr"], 8)
    assert (made != preprocessors.preprocess(image, "depth_leres", resolution=64, models=pth,
                                             backend="openvino")).any()
    made = preprocessors.preprocess(image, "depth_leres", resolution=None, models=pth, backend="openvino")
    _close_maps(made[..., 0], refs["map_own"], 4)


def test_the_extensions_arithmetic():
    """16-bit min-max scaling (truncated), convertScaleAbs (rounded, ties to even: 32767 -> 127.498 -> 127, 65535
    -> 255), THRESH_TOZERO at the floored level (20 % -> 51: 51 goes, 52 stays), inversion between the two."""
    d = np.array([[0.0, 1.0, 0.5, 0.2, 0.201]], np.float32)
    assert leresdepth.to_uint8(d).tolist() == [[0, 255, 127, 51, 51]]
    assert leresdepth.to_uint8(np.full((2, 2), 3.0, np.float32)).tolist() == [[0, 0], [0, 0]]  # flat: all 0
    m = np.array([[0, 51, 52, 200, 255]], np.uint8)
    assert leresdepth._to_zero(m, 20).tolist() == [[0, 0, 52, 200, 255]]
    assert leresdepth._to_zero(m, 100).tolist() == [[0, 0, 0, 0, 0]]
    assert leresdepth._to_zero(m, 0.1).tolist() == [[0, 51, 52, 200, 255]]  # 0.255 floors to 0: only 0 goes
    assert leresdepth._to_zero(np.array([[77, 78]], np.uint8), 30.4).tolist() == [[0, 78]]  # 77.52 floors to 77
    depth = np.array([[0.0, 0.25, 0.5, 1.0]], np.float32)  # 0, 64, 127, 255
    assert leresdepth.depth_map(depth).tolist() == [[255, 191, 128, 0]]
    assert leresdepth.depth_map(depth, 30).tolist() == [[255, 255, 128, 0]]  # 64 <= 76 removed (0 -> 255)
    assert leresdepth.depth_map(depth, 0, 60).tolist() == [[255, 191, 0, 0]]  # 128 <= 153 removed after the inversion


def test_input_is_bgr_0_to_255_normalised():
    """``ToTensor`` of a float32 array keeps 0..255 and the channels are reversed: BGR, ``(x - mean) / std``."""
    rgb = np.array([[[255, 0, 10]]], np.uint8)
    x = leresdepth.prepare(rgb)[0, :, 0, 0]
    want = (np.array([10, 0, 255], np.float32) - leresdepth.MEAN) / leresdepth.STD
    np.testing.assert_array_equal(x, want)


def test_files_and_errors(tmp_path, pth):
    """Missing, altered, foreign and unreadable files are one-line errors naming the file; the extension's old
    annotator/leres folder and ComfyUI's ckpts/lllyasviel/Annotators are found."""
    from sdrt.pipelines import annotators, preprocessors

    arrays = make_weights()
    arrays.pop("module.depth_model.decoder_modules.outconv.adapt_conv.3.bias")
    with pytest.raises(ModelError, match="is not LeReS's depth model") as e:
        leresdepth.LeresDepth(write_pth(tmp_path / "cut.pth", arrays, key="depth_model"))
    assert "\n" not in str(e.value) and "outconv.adapt_conv.3.bias" in str(e.value)
    arrays = make_weights()
    arrays["module.depth_model.decoder_modules.ffm1.ftb2.conv1.weight"] = np.zeros((16, 8, 3, 3), np.float32)
    with pytest.raises(ModelError, match=r"ffm1.ftb2.conv1.weight is \(16, 8, 3, 3\)"):
        leresdepth.LeresDepth(write_pth(tmp_path / "other.pth", arrays, key="depth_model"))
    # the state dict alone, without the depth_model entry or module. prefixes: the same names once stripped
    bare = write_pth(tmp_path / "bare.pth", make_weights(prefix=""))
    with leresdepth.LeresDepth(bare) as det:
        assert det.config == narrow()
    from normalbae_helpers import write_file as write_normalbae

    with pytest.raises(ModelError, match="res101.pth") as e:  # another annotator's file
        leresdepth.LeresDepth(write_normalbae(tmp_path / "nb"))
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        leresdepth.LeresDepth(tmp_path / "junk.pth")
    assert "\n" not in str(e.value) and "junk.pth" in str(e.value)
    old = tmp_path / "a1111" / "extensions" / "sd-webui-controlnet" / "annotator" / "leres"
    old.mkdir(parents=True)
    (old / "res101.pth").write_bytes(b"x")
    new = tmp_path / "a1111" / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "leres"
    new.mkdir(parents=True)
    (new / "res101.pth").write_bytes(b"x")
    assert annotators.find("depth_leres", tmp_path / "a1111", "m")[0] == old / "res101.pth"  # read first, as there
    comfy = tmp_path / "comfy" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    (comfy / "res101.pth").write_bytes(b"x")
    assert annotators.find("depth_leres", tmp_path / "comfy", "m")[0] == comfy / "res101.pth"
    with pytest.raises(InputError, match="the depth_leres preprocessor needs res101.pth"):
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_leres")
    with pytest.raises(InputError) as e:
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_leres", models=tmp_path / "nothing-here")
    assert "no res101.pth in" in str(e.value) and "\n" not in str(e.value)
    for low, high in ((float("nan"), None), (101, None), (None, -1), (None, 1e9)):
        with pytest.raises(InputError, match="remove"):
            preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_leres", low, high, models=pth)
    with pytest.raises(InputError, match="multiples of 32"):
        with leresdepth.LeresDepth(pth) as det:
            det.depth(np.zeros((40, 64, 3), np.uint8))


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4)])
def test_tiny_and_odd_images_make_a_map(pth, shape):
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "depth_leres", models=pth, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "depth_leres", models=pth, backend="openvino")


def test_depth_leres_in_a_controlnet_run_and_on_the_command_line(refs, pth, tmp_path, capsys):
    """A unit with depth_leres gives the image of a unit fed its map by hand, its sliders as the infotext's
    Threshold A / B; the CLI's --control-preprocessor-models and --control-threshold-a/b run it; without the file,
    one line naming the flag and the file; a slider above 100 is refused naming it."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    image = refs["image"]
    with pytest.raises(InputError, match="remove near %, must be a number from 0 to 100"):
        parse_units([ControlNet("controlnet", image, preprocessor="depth_leres", low=150, preprocessor_models=pth)])
    with pytest.raises(InputError, match="depth_leres preprocessor needs res101.pth"):
        parse_units([ControlNet("controlnet", image, preprocessor="depth_leres")])
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="depth_leres", low=10, high=20, processor_res=64,
                          preprocessor_models=pth)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "depth_leres", 10, 20, resolution=64, models=pth, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    info = gen.settings[0]["ControlNet 0"]
    assert info.startswith("Module: depth_leres, Model: controlnet") and "Threshold A: 10" in info, info
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "depth_leres"]
    root = pth.parents[5]  # the A1111 root: <root>/extensions/sd-webui-controlnet/annotator/downloads/leres
    assert main([*args, "--control-preprocessor-models", str(root), "--control-threshold-a", "5",
                 "--control-threshold-b", "7", "-o", str(out)]) == 0, capsys.readouterr().err
    text = Image.open(out).text["parameters"]
    assert "Module: depth_leres, Model: controlnet" in text and "Threshold B: 7" in text, text
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "res101.pth" in err, err


def test_the_detector_is_kept_counted_and_released(refs, pth):
    """The compiled detector is kept as the other preprocessors' are (kind ``depth_leres``), a job's memory plan counts
    it (``preprocessor:depth_leres``: the file's tensors as float32, 4 bytes each) and release() closes it."""
    from pipeline_helpers import DATA as PDATA

    from sdrt import pipelines
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.budget import DETECTOR_FOOTPRINT
    from sdrt.pipelines.controlnet import ControlNet
    from sdrt.weights import Weights

    register("openvino")
    preprocessors.release()
    before = preprocessors.keep_preprocessors(1)
    try:
        preprocessors.preprocess(refs["image"], "depth_leres", resolution=64, models=pth, backend="openvino")
        assert [k for k, *_ in preprocessors.kept_detectors()] == ["depth_leres"]
        want = sum(4 * int(np.prod(s)) for s in Weights.open(pth).shapes().values())
        unit = ControlNet("controlnet", refs["image"], preprocessor="depth_leres", processor_res=64,
                          preprocessor_models=pth)
        with pipelines.load(PDATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
            plan = pipe.plan("a room", controlnets=[unit], steps=2, seed=1, width=64, height=64).memory
        placed = plan.placement("preprocessor:depth_leres")
        assert placed is not None and placed.role == "preprocessor" and placed.weight_bytes == want
        assert plan.footprints["preprocessor:depth_leres"] == DETECTOR_FOOTPRINT
        assert preprocessors.release("depth_leres") == 1 and preprocessors.kept_detectors() == []
    finally:
        preprocessors.keep_preprocessors(before)
        preprocessors.release()


@pytest.mark.parametrize("name", ["depth_leres", "depth_leres++"])
def test_an_image_at_its_own_size_is_bounded_as_at_a_resolution(tmp_path, name):
    """At its own size (no processor resolution: the API's and the CLI's ``none``) the network would read the whole
    image padded to 64: above MAX_NET_PIXELS it is one line naming the image's own size before any file is read
    (a 4097x4096 image is 4160x4096 padded), as at a processor resolution; the memory plan's map_size says the same."""
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlmaps import ControlImageError

    big = np.zeros((4097, 4096, 3), np.uint8)
    with pytest.raises(ControlImageError, match="at its own size would be 4096x4160") as e:
        preprocessors.preprocess(big, name, models=tmp_path / "not-read")
    assert "\n" not in str(e.value) and e.value.where.endswith("processor_res")
    with pytest.raises(ControlImageError, match="at its own size"):
        preprocessors.map_size(name, 4097, 4096, None)
    assert preprocessors.map_size(name, 4096, 4096, None) == (4096, 4096)  # 4096x4096: at the bound, allowed
