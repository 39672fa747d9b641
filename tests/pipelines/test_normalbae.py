"""The ``normal_bae`` preprocessor (Bae et al.'s scannet.pt) against the extension's code.

References: scripts/ref_normalbae.py ran controlnet_aux 0.0.10's ``NNET`` (the extension's annotator/normalbae
network and gen-efficientnet encoder) inside the extension's ``resize_image_with_pad`` / ``NormalBaeDetector``
steps / crop, on the seeded files normalbae_helpers writes here (the same bytes, from a fixed seed): the narrow
one and, once, the full-size B5 one; tests/data/normalbae/normalbae_refs.npz holds what they made.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from normalbae_helpers import make_weights, write_file  # noqa: E402
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import normalbae  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "normalbae"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "normalbae_refs.npz")


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """sd-webui-controlnet's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/normal_bae."""
    root = tmp_path_factory.mktemp("normalbae")
    return write_file(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "normal_bae")


def _padded(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    return np.pad(image, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")


def _close_maps(made: np.ndarray, want: np.ndarray, most: int) -> None:
    """Equal but for ``most`` values one level apart (``* 255`` truncated: float32 noise moves a value sitting on a
    level's edge)."""
    d = np.abs(made.astype(np.int16) - want)
    assert made.shape == want.shape and made.dtype == np.uint8
    assert d.max() <= 1 and int((d > 0).sum()) <= most, (int(d.max()), int((d > 0).sum()))


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_normal_map_equals_the_extension(refs, pth, backend):
    """The narrow network's unit normals within float32 noise of torch's (measured: 5e-6), and the map at the
    image's own size equal but for a few values a level apart (measured: 0 to 2 of 18900)."""
    register(backend)
    image = refs["image"]
    with normalbae.NormalBae(pth, backend=backend) as det:
        assert len(det.config.stages[3]) == 2 and det.config.head == 320
        normals = det.normals(_padded(image))
        made = det(image)
        at96 = det(refs["pad_96"])[:123, :96]
    np.testing.assert_allclose(normals, refs["net_own"], atol=5e-5)
    assert refs["map_own"].std(axis=(0, 1)).min() > 5  # the map varies: the random network is not flat
    _close_maps(made, refs["map_own"], 8)
    _close_maps(at96, refs["map_96"], 8)


def test_full_size_scannet_pt(refs, tmp_path):
    """The full-size file (B5's 39 blocks, 72.6 M values, names under ``model`` with DataParallel's ``module.``, as
    the published checkpoint keeps them) makes the extension's map of a 64 x 48 image on the reference backend."""
    register("reference")
    pth = write_file(tmp_path, tiny=False)
    with normalbae.NormalBae(pth, backend="reference") as det:
        assert det.config == normalbae.B5 and sum(map(len, det.config.stages)) == 39
        normals = det.normals(_padded(refs["full_image"]))
        made = det(refs["full_image"])
    np.testing.assert_allclose(normals, refs["full_net"], atol=5e-5)
    assert refs["full_map"].std(axis=(0, 1)).min() > 5
    _close_maps(made, refs["full_map"], 8)


def test_at_processor_resolutions(refs, pth):
    """preprocess() at a resolution (scaled, padded to 64, cropped) as the extension's at 64 (area, shrinking) and
    96 (bicubic, enlarging: sdrt's bicubic and OpenCV's differ by a level on a few values, the map not further than
    float32 noise here); without a resolution the image is padded as at its own size."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["image"]
    for res, shape in ((64, (82, 64, 3)), (96, (123, 96, 3))):
        made = preprocessors.preprocess(image, "normal_bae", resolution=res, models=pth, backend="openvino")
        assert made.shape == shape
        _close_maps(made, refs[f"map_{res}"], 8)
    made = preprocessors.preprocess(image, "normal_bae", resolution=None, models=pth, backend="openvino")
    _close_maps(made, refs["map_own"], 8)


def test_to_map_is_the_extensions_arithmetic():
    """((n + 1) * 0.5).clip(0, 1) * 255, clipped, truncated; x, y, z stay R, G, B (no flips)."""
    n = np.array([[[-1.0, 1.0, 0.0, 2.0, 0.999]], [[0.0, -0.5, 0.5, -3.0, -1.0]],
                  [[1.0, 0.0, -1.0, 0.0, 0.2]]], np.float32)
    m = normalbae.to_map(n)
    assert m.shape == (1, 5, 3)
    assert m[0].tolist() == [[0, 127, 255], [255, 63, 127], [127, 191, 0], [255, 0, 127], [254, 0, 153]]


def test_same_padding_is_tensorflows():
    """A stride-2 conv pads the extra row/column at the bottom/right (TF "same"), none at stride 1 beyond k // 2."""
    assert normalbae._same(64, 3, 2) == (0, 1, 32)
    assert normalbae._same(64, 5, 2) == (1, 2, 32)
    assert normalbae._same(65, 3, 2) == (1, 1, 33)
    assert normalbae._same(32, 5, 1) == (2, 2, 32)


def test_files_and_errors(tmp_path, pth):
    arrays = make_weights()
    arrays.pop("decoder.out_conv_res1.6.bias")
    with pytest.raises(ModelError, match="is not Bae et al.'s surface normal model") as e:
        normalbae.NormalBae(write_pth(tmp_path / "cut.pt", arrays, key="model"))
    assert "\n" not in str(e.value) and "decoder.out_conv_res1.6.bias" in str(e.value)
    arrays = make_weights()
    arrays["decoder.up2._net.0.weight"] = arrays["decoder.up2._net.0.weight"][:256]
    with pytest.raises(ModelError, match=r"decoder.up2._net.0.weight is \(256, 80, 3, 3\)"):
        normalbae.NormalBae(write_pth(tmp_path / "other.pt", arrays, key="model"))
    from mlsd_helpers import write_file as write_mlsd

    with pytest.raises(ModelError, match="scannet.pt") as e:  # another annotator's file
        normalbae.NormalBae(write_mlsd(tmp_path / "mlsd"))
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        normalbae.NormalBae(tmp_path / "junk.pt")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4)])
def test_tiny_and_odd_images_make_a_map(pth, shape):
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "normal_bae", models=pth, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "normal_bae", models=pth, backend="openvino")


def test_normal_bae_in_a_controlnet_run_and_on_the_command_line(refs, pth, tmp_path, capsys):
    """A unit with normal_bae gives the image of a unit fed its map by hand; it reads no thresholds; the CLI's
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
        parse_units([ControlNet("controlnet", image, preprocessor="normal_bae", low=0.5, preprocessor_models=pth)])
    with pytest.raises(InputError, match="normal_bae preprocessor needs scannet.pt"):
        parse_units([ControlNet("controlnet", image, preprocessor="normal_bae")])
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="normal_bae", processor_res=64, preprocessor_models=pth)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "normal_bae", resolution=64, models=pth, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: normal_bae, Model: controlnet")
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "normal_bae"]
    root = pth.parents[5]  # the A1111 root: <root>/extensions/sd-webui-controlnet/annotator/downloads/normal_bae
    assert main([*args, "--control-preprocessor-models", str(root), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: normal_bae, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "scannet.pt" in err, err
