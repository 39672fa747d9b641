"""The ``depth_zoe`` preprocessor (ZoeDepth's ZoeD_M12_N.pt) against the extension's code.

References: scripts/ref_zoe.py ran controlnet_aux 0.0.10's ZoeDepth (the extension's annotator/zoe/zoedepth code)
inside the extension's ``resize_image_with_pad`` / ``ZoeDetector.__call__`` steps / crop, on the seeded files
zoe_helpers writes here (the same bytes, from a fixed seed): the narrow one (tests/data/zoe/zoe_refs.npz) and, once,
the full-size BEiT-L/16-384 one (zoe_full_refs.npz).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openpose_helpers import write_pth  # noqa: E402
from pipeline_helpers import register  # noqa: E402
from zoe_helpers import make_weights, narrow, write_file  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import zoedepth  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "zoe"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "zoe_refs.npz")


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """sd-webui-controlnet's layout: <root>/extensions/sd-webui-controlnet/annotator/downloads/zoedepth."""
    root = tmp_path_factory.mktemp("zoe")
    return write_file(root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads" / "zoedepth")


def _padded(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    return np.pad(image, ((0, -h % 64), (0, -w % 64), (0, 0)), mode="edge")


def _close_maps(made: np.ndarray, want: np.ndarray, most: int) -> None:
    """Equal but for ``most`` values one level apart (float32 noise moves a value sitting on a level's edge)."""
    d = np.abs(made.astype(np.int16) - want)
    assert made.shape == want.shape and made.dtype == np.uint8
    assert d.max() <= 1 and int((d > 0).sum()) <= most, (int(d.max()), int((d > 0).sum()))


def _close_depth(raw: np.ndarray, want: np.ndarray, of_range: float = 5e-5) -> None:
    span = float(want.max() - want.min())
    assert raw.shape == want.shape and span > 1
    err = float(np.abs(raw - want).max()) / span
    assert err <= of_range, err


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_depth_and_map_equal_the_extension(refs, pth, backend):
    """The narrow network's flip-averaged metric depth within float32 noise of torch's, and the map at the image's
    own size within one level of the extension's (6 or 7 values of 22800). The picture is a long one (60 x 380,
    padded 64 x 384): the network reads 96 x 512, a 6 x 32 patch grid (BEiT's position bias resized both ways from its
    24 x 24), a third of the 90 x 70 image's 384 x 384, so the reference backend's run takes half the time;
    test_at_processor_resolutions checks the 90 x 70 image's depth and maps (the 24 x 24 grid as it is) on OpenVINO.
    Measured, of the depth's range: 3.6e-5 on OpenVINO, 6.7e-5 on ggml at a few pixels (99 % within 2.6e-6); torch's
    own float32 is 5.4e-5 from its float64 on this picture (1.8e-5 on the 90 x 70 one): the log-binomial's
    temperature, down to 0.0212, magnifies rounding where two bins compete. The bound is twice torch's own."""
    register(backend)
    image = refs["wide_image"]
    with zoedepth.ZoeDepth(pth, backend=backend) as det:
        assert det.config == narrow()
        assert zoedepth.net_size(64 + 2 * 16, 384 + 2 * 41) == (96, 512)
        raw = det.depth(_padded(image))
        made = det(image)
        assert list(det._sessions) == [(96, 512)]
    _close_depth(raw, refs["wide_raw"], 1e-4)
    assert refs["wide_map"].std() > 20  # the map varies: the random network is not flat
    _close_maps(made, refs["wide_map"], 8)


def test_at_processor_resolutions(refs, pth):
    """preprocess() at a resolution (scaled, padded to 64, cropped) as the extension's at 64 (area, shrinking: a
    128 x 64 padded image, 384 x 224 once ZoeDepth pads and resizes it) and 96 (bicubic, enlarging); without a resolution the
    image is padded as at its own size."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    image = refs["image"]
    for res, shape in ((64, (82, 64, 3)), (96, (123, 96, 3))):
        made = preprocessors.preprocess(image, "depth_zoe", resolution=res, models=pth, backend="openvino")
        assert made.shape == shape and (made[..., 0] == made[..., 2]).all()
        _close_maps(made[..., 0], refs[f"r{res}_map"], 8)
    made = preprocessors.preprocess(image, "depth_zoe", resolution=None, models=pth, backend="openvino")
    _close_maps(made[..., 0], refs["own_map"], 8)
    det = preprocessors.zoe(pth, "openvino")  # the kept detector (its 384 x 384 graph compiled just now)
    _close_depth(det.depth(_padded(image)), refs["own_raw"])


def test_the_extensions_steps():
    """MidasCore's "minimal" kept-aspect resize to multiples of 32 near 384 x 512, the pad of ``infer`` and the
    percentile map (2 % / 85 %, inverted, truncated)."""
    assert zoedepth.net_size(176, 176) == (384, 384)  # 384/176 nearer 1 than 512/176
    assert zoedepth.net_size(176, 112) == (384, 256)  # 512/112 = 4.57 is further from 1 than 384/176 = 2.18
    assert zoedepth.net_size(560, 750) == (384, 512)
    assert zoedepth.net_size(2100, 1000) == (1088, 512)  # 512/1000 nearer 1: 1075.2 rounds to 34 x 32
    d = np.linspace(0, 1, 101, dtype=np.float32).reshape(1, -1)
    m = zoedepth.depth_map(d)
    assert m[0, 0] == 255 and m[0, 2] == 255 and m[0, 85] == 0 and m[0, 100] == 0  # <= p2: white, >= p85: black
    assert m[0, 50] == int((1 - (0.5 - 0.02) / 0.83) * 255)
    assert zoedepth.depth_map(np.ones((4, 4), np.float32)).tolist() == [[0] * 4] * 4  # flat: 0/0, black


def test_relative_position_bias_as_timm():
    """timm's index layout ((dh + gh - 1) * (2gw - 1) + dw + gw - 1; class token rows last) and the table resized
    only when the grid is not the pretraining one."""
    idx = zoedepth.rel_pos_index(2, 3)
    assert idx.shape == (7, 7) and idx[0, 0] == 5 * 3 + 2 and idx[0, 3] == 15 and idx[3, 0] == 16
    assert idx[1, 1] == 1 * 5 + 2 and idx[1, 6] == (0 - 1 + 1) * 5 + (0 - 2 + 2)  # token (0,0) to (1,2)
    t = np.random.default_rng(0).standard_normal((3 * 3 + 3, 2)).astype(np.float32)
    np.testing.assert_array_equal(zoedepth.rel_pos_table(t, 2, 2, 2), t)
    big = zoedepth.rel_pos_table(t, 2, 2, 3)
    assert big.shape == (3 * 5 + 3, 2)
    np.testing.assert_array_equal(big[-3:], t[-3:])


def test_files_and_errors(tmp_path, pth):
    """Missing, altered, foreign and unreadable files are one-line errors naming the file; Forge's and ComfyUI's
    folders are found; no file is one line naming ZoeD_M12_N.pt and where to download it."""
    from sdrt.pipelines import annotators, preprocessors

    arrays = make_weights()
    arrays.pop("attractors.3._net.2.bias")
    with pytest.raises(ModelError, match="is not ZoeDepth's ZoeD_M12_N.pt") as e:
        zoedepth.ZoeDepth(write_pth(tmp_path / "cut.pt", arrays, key="model"))
    assert "\n" not in str(e.value) and "attractors.3._net.2.bias" in str(e.value)
    arrays = make_weights()
    arrays["conv2.weight"] = np.zeros((16, 8, 1, 1), np.float32)
    with pytest.raises(ModelError, match=r"conv2.weight is \(16, 8, 1, 1\)"):
        zoedepth.ZoeDepth(write_pth(tmp_path / "other.pt", arrays, key="model"))
    bare = write_pth(tmp_path / "bare.pt", make_weights())  # the state dict alone: the same names
    with zoedepth.ZoeDepth(bare) as det:
        assert det.config == narrow()
    from leres_helpers import write_file as write_leres

    with pytest.raises(ModelError, match="ZoeD_M12_N.pt") as e:  # another annotator's file
        zoedepth.ZoeDepth(write_leres(tmp_path / "leres"))
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        zoedepth.ZoeDepth(tmp_path / "junk.pt")
    assert "\n" not in str(e.value) and "junk.pt" in str(e.value)
    forge = tmp_path / "forge" / "models" / "ControlNetPreprocessor" / "zoedepth"
    forge.mkdir(parents=True)
    (forge / "ZoeD_M12_N.pt").write_bytes(b"x")
    assert annotators.find("depth_zoe", tmp_path / "forge" / "models", "m")[0] == forge / "ZoeD_M12_N.pt"
    comfy = tmp_path / "comfy" / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators"
    comfy.mkdir(parents=True)
    (comfy / "ZoeD_M12_N.pt").write_bytes(b"x")
    assert annotators.find("depth_zoe", tmp_path / "comfy", "m")[0] == comfy / "ZoeD_M12_N.pt"
    with pytest.raises(InputError, match="the depth_zoe preprocessor needs ZoeD_M12_N.pt"):
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_zoe")
    with pytest.raises(InputError) as e:
        preprocessors.preprocess(np.zeros((8, 8, 3), np.uint8), "depth_zoe", models=tmp_path / "nothing-here")
    assert "no ZoeD_M12_N.pt in" in str(e.value) and "lllyasviel/Annotators" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="reads no low threshold"):
        preprocessors.check_thresholds("depth_zoe", 5, None, "unit")


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4)])
def test_tiny_and_odd_images_make_a_map(pth, shape):
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "depth_zoe", models=pth, backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)


def test_a_long_picture_is_refused_before_its_network_is_built(pth):
    """ZoeDepth's "minimal" resize keeps the aspect: the side nearer its target goes to about 384 (or 512) and the
    other follows, so a long picture makes a long network input (a 512 x 8192 one: 384 x 5408, 8113 tokens, whose
    attention alone is 4.2 GB a block at full size and whose position index does not fit in one ONNX graph further
    on). Refused in one line naming the sizes, before anything is built or compiled."""
    from sdrt.pipelines import preprocessors

    register("openvino")
    img = np.zeros((512, 8192, 3), np.uint8)
    with pytest.raises(InputError) as e:
        preprocessors.preprocess(img, "depth_zoe", models=pth, backend="openvino")
    assert "\n" not in str(e.value) and "5408x384" in str(e.value) and "4:3" in str(e.value), str(e.value)
    with zoedepth.ZoeDepth(pth, backend="openvino") as det:
        with pytest.raises(InputError):
            det(img)
        assert det._sessions == {}


def test_another_size_compiles_with_one_other_kept(pth):
    """Each compiled size holds its own copy of the weights (1.4 GB at full size): a third size lets the least
    recently used go before it is built and compiled, not after, so no more than KEEP are ever held at once."""
    register("openvino")
    held = []
    with zoedepth.ZoeDepth(pth, backend="openvino") as det:
        build = det.build

        def counting(*size):
            held.append(len(det._sessions))
            return build(*size)

        det.build = counting
        for shape in ((64, 384, 3), (64, 256, 3), (64, 320, 3)):  # networks 96x512, 160x512, 128x512
            det(np.zeros(shape, np.uint8))
        assert len(det._sessions) == det.KEEP == 2
    assert held == [0, 1, 1], held


def test_the_detector_is_kept_counted_and_released(refs, pth):
    """The compiled detector is kept as the other preprocessors' are (kind ``depth_zoe``), a job's memory plan counts
    it (``preprocessor:depth_zoe``: the file's tensors as float32, 4 bytes each) and release() closes it."""
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
        preprocessors.preprocess(refs["image"], "depth_zoe", resolution=64, models=pth, backend="openvino")
        assert [k for k, *_ in preprocessors.kept_detectors()] == ["depth_zoe"]
        want = sum(4 * int(np.prod(s)) for s in Weights.open(pth).shapes().values())
        unit = ControlNet("controlnet", refs["image"], preprocessor="depth_zoe", processor_res=64,
                          preprocessor_models=pth)
        with pipelines.load(PDATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
            plan = pipe.plan("a room", controlnets=[unit], steps=2, seed=1, width=64, height=64).memory
        placed = plan.placement("preprocessor:depth_zoe")
        assert placed is not None and placed.role == "preprocessor" and placed.weight_bytes == want
        assert plan.footprints["preprocessor:depth_zoe"] == DETECTOR_FOOTPRINT
        assert preprocessors.release("depth_zoe") == 1 and preprocessors.kept_detectors() == []
    finally:
        preprocessors.keep_preprocessors(before)
        preprocessors.release()


def test_depth_zoe_in_a_controlnet_run_and_on_the_command_line(refs, pth, tmp_path, capsys):
    """A unit with depth_zoe gives the image of a unit fed its map by hand; the CLI's --control-preprocessor-models
    runs it from an A1111 root; without the file, one line naming the flag and the file."""
    from PIL import Image
    from pipeline_helpers import DATA as PDATA
    from pipeline_helpers import fast_backend

    from sdrt import pipelines
    from sdrt.cli import main
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    image = refs["image"]
    with pytest.raises(InputError, match="depth_zoe preprocessor needs ZoeD_M12_N.pt"):
        parse_units([ControlNet("controlnet", image, preprocessor="depth_zoe")])
    kw = dict(steps=2, sampler="Euler", seed=5)
    backend = fast_backend()
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend=backend) as pipe:
        unit = ControlNet("controlnet", image, preprocessor="depth_zoe", processor_res=64, preprocessor_models=pth)
        gen = pipe.generate("a room", controlnets=[unit], **kw)
        by_hand = pipe("a room", controlnets=[("controlnet", preprocessors.preprocess(
            image, "depth_zoe", resolution=64, models=pth, backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: depth_zoe, Model: controlnet")
    png, out = tmp_path / "room.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a room", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "depth_zoe",
            "--control-processor-res", "64"]
    root = pth.parents[5]  # the A1111 root: <root>/extensions/sd-webui-controlnet/annotator/downloads/zoedepth
    assert main([*args, "--control-preprocessor-models", str(root), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "Module: depth_zoe, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "ZoeD_M12_N.pt" in err, err


def test_full_size_zoed_m12_n(tmp_path):
    """The full-size file (BEiT-L/16-384's 24 blocks of width 1024 with 16 heads, DPT features 256, the metric head
    with 64 bins; 344.8 M values under ``model``, as the published checkpoint keeps them) makes the extension's depth
    and map of a 90 x 70 image on OpenVINO (measured: 1.5e-5 of the range, 5 of 6300 map values a level apart; ggml
    8.6e-6 and 2). A 1.4 GB file written and compiled, 80 s and 7.9 GB peak on two cores: set SDRT_ZOE_FULL=1."""
    import os

    if not os.environ.get("SDRT_ZOE_FULL"):
        pytest.skip("the full-size ZoeDepth check writes a 1.4 GB file; set SDRT_ZOE_FULL=1 to run it")
    full = DATA / "zoe_full_refs.npz"
    refs = np.load(full)
    register("openvino")
    pth = write_file(tmp_path, tiny=False)
    with zoedepth.ZoeDepth(pth, backend="openvino") as det:
        assert det.config == zoedepth.PUBLISHED
        raw = det.depth(_padded(refs["image"]))
        made = det(refs["image"])
    _close_depth(raw, refs["own_raw"])
    _close_maps(made, refs["own_map"], 8)
