"""MistoLine's Anyline (softedge_anyline) against the extension's code.

References: scripts/ref_anyline.py ran sd-webui-controlnet's PreprocessorAnyline steps (controlnet_aux 0.0.10's TED,
the extension's network, on the seeded full-size MTEED.pth anyline_helpers writes; the extension's
resize_image_with_pad, TEEDDetector, lineart_standard, get_intensity_mask, skimage's remove_small_objects and
combine_layers) with OpenCV; tests/data/anyline/refs.npz holds the padded inputs, the MTEED maps, the kept line
layers and the maps at Safe Steps 2, 0 and 5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anyline_helpers import write_mteed  # noqa: E402
from pipeline_helpers import register  # noqa: E402
from softedge_helpers import write_hed, write_teed  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import anylinemaps, preprocessors  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "anyline"


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "refs.npz")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The extension's layout: <root>/extensions/sd-webui-controlnet/annotator/downloads/TEED/MTEED.pth."""
    root = tmp_path_factory.mktemp("anyline")
    down = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads"
    return {"root": root, "mteed": write_mteed(down / "TEED"), "teed": write_teed(down / "TEED")}


def _close(made: np.ndarray, want: np.ndarray, share: float) -> None:
    assert made.shape == want.shape and made.dtype == want.dtype
    off = made.astype(int) != want.astype(int)
    assert off.mean() <= share, f"{int(off.sum())} of {off.size} pixels differ"


def test_components_equal_skimage(refs):
    """The numpy 4-connected components with the 12-pixel rule keep what skimage's remove_small_objects (36 over
    the three channels, 6-connected) keeps, on random masks holding components of exactly 12 pixels."""
    twelves = 0
    for k in range(6):
        m = refs[f"cc_in/{k}"]
        labels, sizes = anylinemaps.components(m)
        assert labels.shape == m.shape and sizes.sum() == m.sum() and (labels >= 0).sum() == m.sum()
        assert np.array_equal(anylinemaps.kept(m), refs[f"cc_out/{k}"])
        twelves += int((sizes == anylinemaps.MIN_PIXELS).sum())
    assert twelves >= 2  # the boundary skimage's versions disagree on is there
    snake = np.zeros((60, 60), bool)  # one component winding through every row: hooked in a few rounds
    snake[::2] = True
    snake[1::4, -1] = True
    snake[3::4, 0] = True
    assert len(anylinemaps.components(snake)[1]) == 1
    assert len(anylinemaps.components(np.zeros((3, 4), bool))[1]) == 0


def test_line_layer_equals_the_extension(refs):
    """lineart_standard's level-1 pixels in runs of 12 or more, on each case's padded input (no network)."""
    for case in ("64", "128", "small", "photo"):
        x = refs[f"input/{case}"]
        want = refs[f"layer/{case}"]
        made = anylinemaps.line_layer(x)[:want.shape[0], :want.shape[1]]
        assert np.array_equal(made, want)  # (sdrt's Gaussian is OpenCV's to ~1e-4: exact on these cases)
    assert refs["layer/128"].sum() > 300 and refs["layer/small"].sum() > 50  # runs kept, and specks dropped:
    level = __import__("sdrt.pipelines.linemaps", fromlist=["x"]).lineart_standard(refs["input/128"])[:, :, 0]
    assert (level == 1).sum() > anylinemaps.line_layer(refs["input/128"]).sum() + 30


def _cases(backend: str) -> tuple[str, ...]:
    return ("small",) if backend == "reference" else ("small", "64", "128", "photo")


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_anyline_equals_the_extension(refs, files, backend):
    """MTEED's map and Anyline's final map at Safe Steps 2, 0 and 5 equal the extension's but for a pixel's rounding
    in a thousand; the kept line pixels are level 1 even where MTEED drew a line."""
    register(backend)
    with anylinemaps.MTEED(files["mteed"], backend=backend) as net:
        for case in _cases(backend):
            x = refs[f"input/{case}"]
            size = refs[f"map/{case}/2"].shape[:2]
            for steps in (2, 0, 5):
                _close(net.map(x, steps)[:size[0], :size[1]], refs[f"mteed/{case}/{steps}"], 0.002)
                made = anylinemaps.detect(x, net, steps, size)
                assert np.array_equal(made[:, :, 0], made[:, :, 2])
                _close(made, refs[f"map/{case}/{steps}"], 0.001)
    layer, m = refs["layer/128"], refs["map/128/2"][:, :, 0]
    assert (m[layer] == 1).all() and (refs["mteed/128/2"][layer] > 0).any()


def test_preprocess_finds_the_file_and_runs_at_a_resolution(refs, files, tmp_path):
    """preprocess() in the extension's layout and ComfyUI's (ckpts/TheMistoAI/MistoLine/Anyline) makes the
    extension's maps at 64 (area shrink) and 128 (cubic enlargement); the default Safe Steps is 2."""
    register("openvino")
    comfy = tmp_path / "ComfyUI"
    write_mteed(comfy / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "TheMistoAI" / "MistoLine" / "Anyline")
    for where in (files["root"], comfy):
        for res, steps in ((64, None), (128, 5)):
            made = preprocessors.preprocess(refs["image"], "softedge_anyline", steps, resolution=res, models=where,
                                            backend="openvino")
            _close(made, refs[f"map/{res}/{2 if steps is None else steps}"], 0.003)
    assert preprocessors.kind_of("softedge_anyline") == "mteed"
    det = preprocessors.detector("softedge_anyline", files["root"])
    assert det.files == (files["mteed"],) and det.weight_bytes() == 4 * 58910


def test_wrong_files_and_sliders_are_one_line_errors(tmp_path, files):
    """HED's file as MTEED, a truncated MTEED.pth, TEED's 7_model.pth given by path as Anyline's, no file, and
    Safe Steps out of range: one line each, naming the file or the argument and what to pass."""
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    hed = write_hed(tmp_path / "hed")
    with pytest.raises(ModelError) as e:
        anylinemaps.MTEED(hed)
    assert "is not MistoLine's MTEED.pth" in str(e.value) and "TheMistoAI/MistoLine" in str(e.value)
    assert "\n" not in str(e.value)
    cut = tmp_path / "MTEED.pth"
    cut.write_bytes(files["mteed"].read_bytes()[:100000])
    with pytest.raises((ModelError, InputError)) as e:
        anylinemaps.MTEED(cut)
    assert "\n" not in str(e.value) and str(cut) in str(e.value)
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InputError, match="is the softedge_teed preprocessor's file, and softedge_anyline needs "
                                         "MTEED.pth"):
        preprocessors.preprocess(img, "softedge_anyline", models=files["teed"], backend="openvino")
    with pytest.raises(InputError, match="the softedge_anyline preprocessor needs MTEED.pth"):
        parse_units([ControlNet("controlnet", img, preprocessor="softedge_anyline")])
    with pytest.raises(InputError, match=r"no MTEED.pth in .*TheMistoAI/MistoLine/Anyline"):
        preprocessors.preprocess(img, "softedge_anyline", models=tmp_path / "hed", backend="openvino")
    for bad in (11, 2.5, -1):
        with pytest.raises(InputError, match="Anyline's safe steps, must be a whole number from 0 to 10"):
            parse_units([ControlNet("controlnet", img, preprocessor="softedge_anyline", low=bad,
                                    preprocessor_models=files["root"])])
    register("openvino")
    for bad in (float("nan"), 1e9):
        with pytest.raises(InputError, match="Anyline's safe steps, must be"):
            preprocessors.preprocess(img, "softedge_anyline", bad, models=files["root"], backend="openvino")


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4)])
def test_tiny_and_odd_images_make_a_map(files, shape):
    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    made = preprocessors.preprocess(img, "softedge_anyline", models=files["root"], backend="openvino")
    assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)


def test_anyline_in_a_controlnet_run_and_on_the_command_line(refs, files, tmp_path, capsys):
    """A unit with softedge_anyline gives the image of a unit fed its map by hand; the CLI runs it from
    --control-preprocessor-models and names the module in the infotext; without the file, one line naming the flag."""
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
        unit = ControlNet("controlnet", image, preprocessor="softedge_anyline", processor_res=64,
                          preprocessor_models=files["root"])
        gen = pipe.generate("a photo", controlnets=[unit], **kw)
        by_hand = pipe("a photo", controlnets=[("controlnet", preprocessors.preprocess(
            image, "softedge_anyline", resolution=64, models=files["root"], backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: softedge_anyline, Model: controlnet")
    png, out = tmp_path / "line.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a photo", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "softedge_anyline"]
    assert main([*args, "--control-preprocessor-models", str(files["root"]), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    text = Image.open(out).text["parameters"]  # the CLI's default resolution: the extension's 1280 for Anyline
    assert "Module: softedge_anyline, Model: controlnet" in text and "Processor Res: 1280" in text, text
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "MTEED.pth" in err, err


def test_the_plan_counts_mteed(refs, files):
    """A job's memory plan counts MTEED as its own detector (``preprocessor:mteed``: TEED's tensors as float32)."""
    from pipeline_helpers import DATA as PDATA

    from sdrt import pipelines
    from sdrt.pipelines.controlnet import ControlNet

    register("openvino")
    unit = ControlNet("controlnet", refs["image"], preprocessor="softedge_anyline", processor_res=64,
                      preprocessor_models=files["root"])
    with pipelines.load(PDATA / "tiny-sd15-controlnet", backend="openvino") as pipe:
        plan = pipe.plan("a line", controlnets=[unit], steps=2, seed=1, width=64, height=64, sampler="Euler").memory
    placed = plan.placement("preprocessor:mteed")
    assert placed is not None and placed.role == "preprocessor" and placed.weight_bytes == 4 * 58910
