"""The ``seg_ufade20k`` preprocessor (UniFormer + UperNet, upernet_global_small.pth) against the extension's code.

References: scripts/ref_uniformer.py ran the extension's own segmentor (annotator/uniformer with its vendored mmcv /
mmseg: ``init_segmentor``, ``inference_segmentor``, ``show_result_pyplot`` with ``get_palette('ade')``) inside its
processor's ``resize_image_with_pad`` / crop, on the seeded files uniformer_helpers writes here (the same bytes,
from a fixed seed): the narrow one and, once, the full-size UniFormer-S one; tests/data/uniformer/uniformer_refs.npz
holds what they made. Measured: every map pixel equal on the reference backend, OpenVINO and ggml (a class tie
could flip a pixel; the tests allow 0.2 % of them), logits within 1.3e-5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402
from uniformer_helpers import make_weights, write_file  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import uniformerseg  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "uniformer"
#: the share of a map's pixels whose class may differ from the extension's (a tie between two classes' logits
#: broken the other way by float32 noise); measured: 0 on every backend
TIES = 0.002


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "uniformer_refs.npz")


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """sd-webui-controlnet's layout: <root>/extensions/sd-webui-controlnet/annotator/downloads/uniformer."""
    root = tmp_path_factory.mktemp("uniformer")
    return write_file(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "uniformer")


def _differing(made: np.ndarray, want: np.ndarray) -> float:
    assert made.shape == want.shape and made.dtype == np.uint8
    return float((made != want).any(axis=-1).mean())


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_seg_map_equals_the_extension(refs, pth, backend):
    """The narrow network's logits within float32 noise of torch's (measured: 8e-6 to 1.3e-5 of values up to
    12.6), and the map (the 60 x 44 image padded to 64 x 64, read by the network at 512 x 512) the extension's."""
    register(backend)
    image = refs["image"]
    with uniformerseg.UniformerSeg(pth, backend=backend) as det:
        assert det.config == uniformer_narrow()
        padded = np.pad(image, ((0, 4), (0, 20), (0, 0)), mode="edge")
        logits = det.logits(padded)
        labels = det.labels(padded)[:60, :44]
        made = det(image)
    assert logits.shape == (150, 128, 128)
    np.testing.assert_allclose(logits[:, ::8, ::8], refs["logits_44"], atol=1e-4)
    assert len(np.unique(refs["labels_44"])) >= 8  # the random network's map is not one class
    assert (labels != refs["labels_44"]).mean() <= TIES
    assert _differing(made, refs["map_44"]) <= TIES


def uniformer_narrow():
    from uniformer_helpers import narrow

    return narrow()


def test_at_processor_resolutions(refs, pth):
    """preprocess() at a resolution (scaled, padded to 64, cropped) as the extension's at 32 (area, shrinking),
    64 (bicubic, enlarging: 87 x 64, padded to 128 x 64, read at 1024 x 512) and 150 (205 x 150, padded to
    256 x 192, read at 683 x 512: the logits' two resizes have no whole ratio, so composing them is checked);
    without a resolution the image is padded as at its own size."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["image"]
    for res, shape in ((32, (44, 32, 3)), (64, (87, 64, 3)), (150, (205, 150, 3))):
        made = preprocessors.preprocess(image, "seg_ufade20k", resolution=res, models=pth, backend="openvino")
        assert made.shape == shape
        assert _differing(made, refs[f"map_{res}"]) <= TIES
    made = preprocessors.preprocess(image, "seg_ufade20k", resolution=None, models=pth, backend="openvino")
    assert _differing(made, refs["map_44"]) <= TIES


def test_full_size_upernet_global_small(refs, tmp_path):
    """The full-size file (UniFormer-S and its 512-channel UperNet: 51.5 M values, under ``state_dict`` beside
    mmcv's ``meta``, as the published checkpoint keeps them) makes the extension's map at processor resolution 64."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    pth = write_file(tmp_path, full=True)
    with uniformerseg.UniformerSeg(pth, backend="openvino") as det:
        assert det.config == uniformerseg.SMALL
        made = preprocessors._made(refs["image"], "seg_ufade20k", None, None, 64, None, pth, "openvino", None,
                                   "models")
    assert len(np.unique(refs["full_labels_64"])) >= 8
    assert _differing(made, refs["full_map_64"]) <= TIES


def test_the_published_layout():
    """UniFormer-S + UperNet's tensors as the extension's config builds them (scripts/ref_uniformer.py compares the
    names and shapes one by one): 380 read (num_batches_tracked and the auxiliary head's aside)."""
    shapes = uniformerseg.expected_shapes(uniformerseg.SMALL)
    assert len(shapes) == 380 and sum(int(np.prod(s)) for s in shapes.values()) == 50_759_894
    assert uniformerseg.config_of(shapes) == uniformerseg.SMALL
    assert shapes["decode_head.bottleneck.conv.weight"] == (512, 2560, 3, 3)
    assert shapes["backbone.blocks3.7.attn.qkv.weight"] == (960, 320)


def test_rescale_and_interpolation_matrices():
    """mmcv.imrescale's size (fit 2048 x 512, ``int(s * f + 0.5)``); PyTorch's bilinear (align_corners=False) and
    adaptive average pooling weights."""
    assert uniformerseg.net_size(64, 64) == (512, 512)
    assert uniformerseg.net_size(128, 64) == (1024, 512)
    assert uniformerseg.net_size(64, 320) == (410, 2048)  # 5:1: the long side fits 2048
    assert uniformerseg.net_size(600, 800) == (512, 683)
    m = uniformerseg.bilinear_matrix(2, 4)
    np.testing.assert_allclose(m, [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    np.testing.assert_allclose(uniformerseg.bilinear_matrix(4, 2), [[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
    p = uniformerseg.pool_matrix(16, 6)  # bins 0-3, 2-6, 5-8, 8-11, 10-14, 13-16
    assert [np.flatnonzero(r).tolist()[::len(np.flatnonzero(r)) - 1] for r in p] == [[0, 2], [2, 5], [5, 7], [8, 10],
                                                                                      [10, 13], [13, 15]]
    np.testing.assert_allclose(p.sum(1), 1)


def test_logits_resized_twice_then_argmax():
    """logits_to_labels (the two resizes of each axis composed into taps, in bands) is mmseg's: bilinear to the
    network's input size, then to the image's, argmax; here against the two resizes done one after the other in
    float64, on sizes with no whole ratio (17 -> 67 -> 40, 13 -> 51 -> 30), where a single resize differs."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((150, 17, 13)).astype(np.float32)
    b = uniformerseg.bilinear_matrix
    two = b(67, 40) @ (b(17, 67) @ logits.astype(np.float64) @ b(13, 51).T) @ b(51, 30).T
    top = np.sort(two, axis=0)
    clear = top[-1] - top[-2] > 1e-4  # not a tie float32 may break either way
    made = uniformerseg.logits_to_labels(logits, (67, 51), (40, 30), rows=7)
    assert made.shape == (40, 30) and clear.mean() > 0.95
    assert np.array_equal(made[clear], two.argmax(0)[clear])
    once = (b(17, 40) @ logits.astype(np.float64) @ b(13, 30).T).argmax(0)
    assert (once != made).mean() > 0.01  # (measured: 2.2 %)


def test_logits_to_labels_memory_is_bounded_on_a_wide_image():
    """The widest image the network reads (64:1, padded 64 x 32768 from 32 x 2048): the two resizes composed without
    a dense 32768 x 2048 float64 matrix (512 MiB) and in bands of a bounded number of pixels, not of 32 rows (32 x
    32768 x 150 float32: 629 MiB a temporary). Peak of numpy's allocations (tracemalloc) under 160 MiB (measured
    1827 MiB before). test_logits_resized_twice_then_argmax holds the classes."""
    import tracemalloc

    rng = np.random.default_rng(4)
    logits = rng.standard_normal((150, 8, 512)).astype(np.float32)
    tracemalloc.start()
    try:
        made = uniformerseg.logits_to_labels(logits, (32, 2048), (64, 32768))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert made.shape == (64, 32768) and peak < 160 * 2 ** 20, peak / 2 ** 20


def test_paint_is_ades_palette():
    from sdrt.pipelines.segpalette import ADE20K, paint

    assert ADE20K.shape == (150, 3) and ADE20K[0].tolist() == [120, 120, 120] and ADE20K[2].tolist() == [6, 230, 230]
    assert paint(np.array([[0, 149], [4, 2]])).tolist() == [[[120, 120, 120], [92, 0, 255]],
                                                            [[4, 200, 3], [6, 230, 230]]]


def test_files_and_errors(tmp_path, pth):
    from sdrt.pipelines import preprocessors

    arrays = make_weights()
    arrays.pop("decode_head.fpn_bottleneck.bn.running_var")
    with pytest.raises(ModelError, match="is not UniFormer's ADE20K segmentation model") as e:
        uniformerseg.UniformerSeg(write_pth(tmp_path / "cut.pth", arrays, key="state_dict"))
    assert "\n" not in str(e.value) and "decode_head.fpn_bottleneck.bn.running_var" in str(e.value)
    arrays = make_weights()
    arrays["decode_head.conv_seg.weight"] = arrays["decode_head.conv_seg.weight"][:19]  # a Cityscapes head
    with pytest.raises(ModelError, match=r"decode_head.conv_seg.weight is \(19, 32, 1, 1\)"):
        uniformerseg.UniformerSeg(write_pth(tmp_path / "city.pth", arrays, key="state_dict"))
    from normalbae_helpers import write_file as write_normalbae

    with pytest.raises(ModelError, match="upernet_global_small.pth") as e:  # another annotator's file
        uniformerseg.UniformerSeg(write_normalbae(tmp_path / "nb"))
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        uniformerseg.UniformerSeg(tmp_path / "junk.pth")
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="no upernet_global_small.pth in") as e:
        preprocessors.model_files("seg_ufade20k", tmp_path, "models")
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="is the normal_bae preprocessor's file"):
        preprocessors.model_files("seg_ufade20k", [tmp_path / "nb" / "scannet.pt"], "models")


def test_found_where_the_extension_and_comfyui_keep_it(tmp_path, pth):
    """The extension's old place (annotator/uniformer, read first) and downloads/uniformer; ComfyUI's
    ckpts/lllyasviel/Annotators."""
    import shutil

    from sdrt.pipelines import preprocessors

    root = pth.parents[5]
    assert preprocessors.model_files("seg_ufade20k", root, "m") == (pth,)
    old = root / "extensions" / "sd-webui-controlnet" / "annotator" / "uniformer"
    old.mkdir()
    shutil.copy(pth, old / pth.name)
    assert preprocessors.model_files("seg_ufade20k", root, "m") == (old / pth.name,)
    comfy = tmp_path / "comfy" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    shutil.copy(pth, comfy / pth.name)
    assert preprocessors.model_files("seg_ufade20k", tmp_path / "comfy", "m") == (comfy / pth.name,)


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4)])
def test_tiny_and_odd_images_make_a_map(pth, shape):
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "seg_ufade20k", models=pth, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    from sdrt.pipelines.segpalette import ADE20K

    assert {tuple(c) for c in made.reshape(-1, 3)} <= {tuple(c) for c in ADE20K}
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "seg_ufade20k", models=pth, backend="openvino")


def test_kept_and_counted_by_the_memory_plan(pth):
    """The compiled segmentor is kept as the other detectors are (one use: kept_detectors names it) and the run
    plan counts its weights as float32 (the narrow file's values x 4 bytes)."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    before = preprocessors.keep_preprocessors(1)
    try:
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "seg_ufade20k", models=pth, backend="openvino")
        assert preprocessors.kept_detectors()[0][0] == "seg_ufade20k"
        det = preprocessors.detector("seg_ufade20k", pth)
        assert det.kind == "seg_ufade20k" and det.files == (pth,)
        values = sum(int(a.size) for a in make_weights().values() if a.dtype == np.float32)
        ints = sum(int(a.size) for a in make_weights().values() if a.dtype != np.float32)
        assert det.weight_bytes() == 4 * (values + ints)
        assert preprocessors.release("seg_ufade20k") == 1
    finally:
        preprocessors.keep_preprocessors(before)


def test_seg_in_a_controlnet_run_and_on_the_command_line(refs, pth, tmp_path, capsys):
    """A unit with seg_ufade20k gives the image of a unit fed its map by hand; it reads no thresholds; the CLI's
    --control-preprocessor-models runs it; without the file, one line naming the flag and the file."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    image = refs["image"]
    with pytest.raises(InputError, match="reads no low threshold"):
        parse_units([ControlNet("controlnet", image, preprocessor="seg_ufade20k", low=0.5, preprocessor_models=pth)])
    with pytest.raises(InputError, match="seg_ufade20k preprocessor needs upernet_global_small.pth"):
        parse_units([ControlNet("controlnet", image, preprocessor="seg_ufade20k")])
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="seg_ufade20k", processor_res=32, preprocessor_models=pth)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "seg_ufade20k", resolution=32, models=pth, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: seg_ufade20k, Model: controlnet")
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "seg_ufade20k",
            "--control-processor-res", "32"]
    root = pth.parents[5]  # the A1111 root: <root>/extensions/sd-webui-controlnet/annotator/downloads/uniformer
    assert main([*args, "--control-preprocessor-models", str(root), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: seg_ufade20k, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "upernet_global_small.pth" in err, err


def test_a_long_thin_image_is_refused_in_one_line(pth, tmp_path):
    """UniFormer's four stages divide the side it reads by 32: an image more than about 64 times as long as it is wide
    is read (fitting 2048 x 512) below 32 pixels on its shorter side, which no stage can hold (mmseg's network fails
    on it; sdrt's would divide by zero). Refused in one line, by the run plan's map_size too, before any file is read;
    at 32 exactly it runs."""
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlmaps import ControlImageError
    from sdrt.pipelines.uniformerseg import net_size

    assert net_size(64, 4096) == (32, 2048) and net_size(64, 4224)[0] == 31
    for call in (lambda: preprocessors.preprocess(np.zeros((1, 200, 3), np.uint8), "seg_ufade20k", resolution=64,
                                                  models=tmp_path),
                 lambda: preprocessors.preprocess(np.zeros((64, 4224, 3), np.uint8), "seg_ufade20k", models=tmp_path),
                 lambda: preprocessors.map_size("seg_ufade20k", 1, 200, 64)):
        with pytest.raises(ControlImageError, match="at least 32 pixels") as e:
            call()
        assert "\n" not in str(e.value)
    register("openvino")
    made = preprocessors.preprocess(np.zeros((64, 4096, 3), np.uint8), "seg_ufade20k", models=pth, backend="openvino")
    assert made.shape == (64, 4096, 3)
