"""HED and PiDiNet soft edges (softedge_hed, softedge_hedsafe, scribble_hed, softedge_pidinet, softedge_pidisafe,
scribble_pidinet) against the extension's code.

References: scripts/ref_softedge.py ran controlnet_aux 0.0.10's ControlNetHED_Apache2 and pidinet() (the
extension's networks; PiDiNet's pixel-difference convs unconverted) on the full-size seeded files that
softedge_helpers writes here, with the extension's resize_image_with_pad, apply_hed / apply_pidinet, safe_step,
remove_pad and scribble post-processing around them; tests/data/softedge/refs.npz holds the padded inputs, the raw
soft edges and the six maps per case.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import register  # noqa: E402
from softedge_helpers import hed_weights, pidi_weights, write_hed, write_pidi, write_teed  # noqa: E402

from sdrt.errors import InputError, ModelError  # noqa: E402
from sdrt.pipelines import hedmaps, pidimaps, preprocessors, teedmaps  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "softedge"
KINDS = {"softedge_hed": "soft", "softedge_hedsafe": "safe", "scribble_hed": "scribble",
         "softedge_pidinet": "soft", "softedge_pidisafe": "safe", "scribble_pidinet": "scribble"}


@pytest.fixture(scope="module")
def refs():
    return np.load(DATA / "refs.npz")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The extension's layout: <models>/extensions/sd-webui-controlnet/annotator/downloads/{hed,pidinet}."""
    root = tmp_path_factory.mktemp("softedge")
    down = root / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads"
    return {"root": root, "hed": write_hed(down / "hed"), "pidinet": write_pidi(down / "pidinet"),
            "teed": write_teed(down / "TEED")}


def _close(made: np.ndarray, want: np.ndarray, share: float) -> None:
    """Equal but for a few pixels (a float a hair apart truncates to the next level, or crosses a threshold)."""
    assert made.shape == want.shape and made.dtype == want.dtype
    off = made.astype(int) != want.astype(int)
    assert off.mean() <= share, f"{int(off.sum())} of {off.size} pixels differ"


class _EdgeOnce:
    """A network whose ``map`` reuses the edge it made of the same image (the three kinds of a case run it once)."""

    def __init__(self, net) -> None:
        self.net, self.edges = net, {}

    def edge(self, rgb: np.ndarray) -> np.ndarray:
        key = rgb.tobytes()
        if key not in self.edges:
            self.edges[key] = self.net.edge(rgb)
        return self.edges[key]

    def map(self, rgb: np.ndarray, safe: bool = False) -> np.ndarray:
        return hedmaps.edge_to_uint8(self.edge(rgb), safe)


def _cases(backend: str) -> tuple[str, ...]:
    # the reference backend (onnx's evaluator) runs dilated, depthwise and transposed convs slowly: the 64x64 case
    return ("40",) if backend == "reference" else ("40", "72", "96")


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_networks_and_maps_equal_the_extension(refs, files, backend):
    """The raw soft edges (HED: the sigmoid of the five projections' mean; PiDiNet: its last output) equal torch's
    to float32 rounding, and each of the six maps of the same padded input equals the extension's but for a
    pixel's rounding in a thousand (safe and scribble: a level crossed)."""
    register(backend)
    with hedmaps.HED(files["hed"], backend=backend) as hed, pidimaps.PiDiNet(files["pidinet"], backend=backend) as pidi:
        nets = {"hed": _EdgeOnce(hed), "pidi": _EdgeOnce(pidi)}
        for case in _cases(backend):
            x = refs[f"input/{case}"]
            np.testing.assert_allclose(nets["hed"].edge(x), refs[f"hed_edge/{case}"], atol=2e-5)
            np.testing.assert_allclose(nets["pidi"].edge(x), refs[f"pidi_edge/{case}"], atol=2e-5)
            size = refs[f"map/softedge_hed/{case}"].shape
            for name, kind in KINDS.items():
                net = nets["hed" if "hed" in name else "pidi"]
                made = hedmaps.detect(x, net, kind, size)
                assert np.array_equal(made[:, :, 0], made[:, :, 2])
                _close(made[:, :, 0], refs[f"map/{name}/{case}"], 0.002 if kind != "scribble" else 0.004)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
def test_teed_equals_the_extension(refs, files, backend):
    """TEED's soft edge (the sigmoid of its four outputs' mean) equals torch's to float32 rounding; its maps at Safe
    Steps 0, 2 (the default) and 5 equal the extension's but for a pixel's rounding in a thousand."""
    register(backend)
    with teedmaps.TEED(files["teed"], backend=backend) as net:
        for case in _cases(backend):
            x = refs[f"input/{case}"]
            edge = net.edge(x)
            np.testing.assert_allclose(edge, refs[f"teed_edge/{case}"], atol=5e-5)  # its fused output reaches +-30
            size = refs[f"map/softedge_teed_2/{case}"].shape
            for steps in (0, 2, 5):
                made = teedmaps.detect(x, net, steps, size)
                _close(made[:, :, 1], refs[f"map/softedge_teed_{steps}/{case}"], 0.002)


def test_maps_span_levels(refs):
    """The seeded networks draw maps worth comparing: soft maps of many levels, safe maps of three, scribbles with
    both colours in good measure."""
    for name, kind in [*KINDS.items(), ("softedge_teed_0", "soft"), ("softedge_teed_2", "safe")]:
        m = refs[f"map/{name}/72"]
        levels = np.unique(m)
        if kind == "soft":
            assert len(levels) > 200 if "teed" not in name else len(levels) > 150
        elif kind == "safe":
            assert list(levels) == [0, 127, 255]
        else:
            assert list(levels) == [0, 255] and 0.1 < (m == 255).mean() < 0.8


def test_pixel_difference_folding():
    """PiDiNet's convert_pdc: a folded kernel convolved with a patch gives the pixel-difference sum the paper
    defines (cd: sum w_i (x_i - x_c); ad: sum w_i (x_i - the next x clockwise); rd: sum w_i (x_outer_i - x_inner_i))."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1, 1, 3, 3)).astype(np.float64)
    p5 = rng.standard_normal((5, 5))
    p3 = p5[1:4, 1:4]
    wf = w.reshape(9)
    x = p3.reshape(9)
    cd = sum(wf[i] * (x[i] - x[4]) for i in range(9))
    assert np.isclose((pidimaps.fold("cd", w)[0, 0] * p3).sum(), cd)
    nxt = [1, 2, 5, 0, 4, 8, 3, 6, 7]  # the next pixel clockwise around the centre
    ad = sum(wf[i] * (x[i] - x[nxt[i]]) for i in range(9))
    assert np.isclose((pidimaps.fold("ad", w)[0, 0] * p3).sum(), ad)
    outer = [(0, 0), (0, 2), (0, 4), (2, 0), (2, 4), (4, 0), (4, 2), (4, 4)]
    inner = [(1, 1), (1, 2), (1, 3), (2, 1), (2, 3), (3, 1), (3, 2), (3, 3)]
    rd = sum(wf[i + 1] * (p5[outer[i]] - p5[inner[i]]) for i in range(8))
    assert np.isclose((pidimaps.fold("rd", w)[0, 0] * p5).sum(), rd)
    assert np.array_equal(pidimaps.fold("cv", w), w.astype(np.float32))
    folded = pidimaps.convert({k[len("module."):]: v for k, v in pidi_weights().items()})
    assert folded["block1_2.conv1.weight"].shape == (60, 1, 5, 5) and folded["block1_3.conv1.weight"].shape == (60, 1, 3, 3)


def test_opencv_float_linear_resize(refs):
    """cv2.resize(float32, INTER_LINEAR) enlarging x2 .. x16, as HED's projections are resized."""
    for f in (2, 4, 8, 16):
        a = refs[f"lin_in/{f}"]
        np.testing.assert_allclose(hedmaps.linear_float(a, 4 * f, 5 * f), refs[f"lin_out/{f}"], rtol=0, atol=2e-6)


def test_wrong_files_are_one_line_errors(tmp_path, files):
    """PiDiNet's file passed as HED's and the other way round, a truncated file and a non-torch file: one line
    naming the file and what to download."""
    with pytest.raises(ModelError) as e:
        hedmaps.HED(files["pidinet"])
    msg = str(e.value)
    assert "is not lllyasviel's ControlNetHED" in msg and "ControlNetHED.pth" in msg and "\n" not in msg
    with pytest.raises(ModelError) as e:
        pidimaps.PiDiNet(files["hed"])
    assert "is not PiDiNet's table5_pidinet" in str(e.value) and "table5_pidinet.pth" in str(e.value)
    with pytest.raises(ModelError, match="is not TEED's 7_model.pth"):
        teedmaps.TEED(files["hed"])
    cut = tmp_path / "ControlNetHED.pth"
    cut.write_bytes(files["hed"].read_bytes()[:200000])
    with pytest.raises((ModelError, InputError)) as e:
        hedmaps.HED(cut)
    assert "\n" not in str(e.value) and str(cut) in str(e.value)
    junk = tmp_path / "table5_pidinet.pth"
    junk.write_bytes(b"not a torch file")
    with pytest.raises((ModelError, InputError)) as e:
        pidimaps.PiDiNet(junk)
    assert "\n" not in str(e.value)
    bad = hed_weights()
    bad["block3.convs.1.weight"] = bad["block3.convs.1.weight"][:128]
    from openpose_helpers import write_pth

    with pytest.raises(ModelError, match=r"block3.convs.1.weight is \(128, 256, 3, 3\)"):
        hedmaps.HED(write_pth(tmp_path / "odd.pth", bad))


def test_preprocess_finds_the_files_and_runs_at_a_resolution(refs, files, tmp_path):
    """preprocess() with the extension's layout (HED, TEED) and ComfyUI's (PiDiNet, under ckpts/lllyasviel/Annotators)
    makes the extension's maps of the photo: at 72 (a copy and the padding) and at 96 (OpenCV's cubic resize too)."""
    register("openvino")
    comfy = tmp_path / "ComfyUI"
    write_pidi(comfy / "custom_nodes" / "comfyui_controlnet_aux" / "ckpts" / "lllyasviel" / "Annotators")
    image = refs["image"]
    for res in (72, 96):
        for name in KINDS:
            where = comfy if "pidi" in name else files["root"]
            made = preprocessors.preprocess(image, name, resolution=res, models=where, backend="openvino")
            assert made.shape == (*refs[f"map/{name}/{res}"].shape, 3)
            _close(made[:, :, 0], refs[f"map/{name}/{res}"], 0.001)
        for steps in (0, 2, 5):
            made = preprocessors.preprocess(image, "softedge_teed", None if steps == 2 else steps, resolution=res,
                                            models=files["root"], backend="openvino")
            _close(made[:, :, 0], refs[f"map/softedge_teed_{steps}/{res}"], 0.001)


def test_sliders_and_files_are_checked(files):
    from sdrt.pipelines.controlnet import ControlNet, parse_units

    img = np.zeros((8, 8, 3), np.uint8)
    for name, words in (("softedge_hed", "ControlNetHED.pth"), ("scribble_pidinet", "table5_pidinet.pth"),
                        ("softedge_teed", "7_model.pth")):
        with pytest.raises(InputError, match=f"the {name} preprocessor needs {words}"):
            parse_units([ControlNet("controlnet", img, preprocessor=name)])
    for bad in (11, 2.5, -1):
        with pytest.raises(InputError, match="TEED's safe steps, must be a whole number from 0 to 10"):
            parse_units([ControlNet("controlnet", img, preprocessor="softedge_teed", low=bad,
                                    preprocessor_models=files["root"])])
    with pytest.raises(InputError, match="reads no low threshold"):
        parse_units([ControlNet("controlnet", img, preprocessor="softedge_hed", low=3,
                                preprocessor_models=files["root"])])
    register("openvino")
    for bad in (float("nan"), -1, 1e9):  # preprocess() itself: not a ValueError, nor a map at -1 or 1e9 steps
        with pytest.raises(InputError, match="TEED's safe steps, must be"):
            preprocessors.preprocess(img, "softedge_teed", bad, models=files["root"], backend="openvino")


@pytest.mark.parametrize("shape", [(1, 1, 3), (9, 1), (70, 3, 4), (5, 130, 3)])
def test_tiny_and_odd_images_make_a_map(files, shape):
    """One pixel, 2-D and RGBA images, a thin strip: each soft edge makes a map of the image's size (padded to 64
    for the networks, as the extension pads), at the image's own size and at a resolution."""
    register("openvino")
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    for name in ("softedge_hedsafe", "scribble_pidinet", "softedge_teed"):
        made = preprocessors.preprocess(img, name, models=files["root"], backend="openvino")
        assert made.dtype == np.uint8 and made.shape == (*shape[:2], 3)
    made = preprocessors.preprocess(img, "softedge_pidinet", resolution=64, models=files["root"], backend="openvino")
    assert made.shape[2] == 3 and min(made.shape[:2]) == 64
    with pytest.raises(InputError, match="not an 8-bit image"):
        preprocessors.preprocess(img.astype(np.float32), "softedge_hed", models=files["root"], backend="openvino")


def test_softedge_in_a_controlnet_run_and_on_the_command_line(refs, files, tmp_path, capsys):
    """A unit with softedge_hed gives the image of a unit fed its map by hand; the CLI's
    --control-preprocessor-models runs scribble_pidinet and writes the module in the infotext; without the file,
    one line naming the flag."""
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
        unit = ControlNet("controlnet", image, preprocessor="softedge_hed", processor_res=72,
                          preprocessor_models=files["root"])
        gen = pipe.generate("a photo", controlnets=[unit], **kw)
        by_hand = pipe("a photo", controlnets=[("controlnet", preprocessors.preprocess(
            image, "softedge_hed", resolution=72, models=files["root"], backend=backend))], **kw)[0]
    assert np.array_equal(gen.images[0], by_hand)
    assert gen.settings[0]["ControlNet 0"].startswith("Module: softedge_hed, Model: controlnet")
    png, out = tmp_path / "photo.png", tmp_path / "out.png"
    Image.fromarray(image).save(png)
    args = ["generate", str(PDATA / "tiny-sd15-controlnet"), "a photo", "--steps", "1", "--seed", "3",
            "--backend", backend, "--control-image", str(png), "--control-preprocessor", "scribble_pidinet"]
    assert main([*args, "--control-preprocessor-models", str(files["root"]), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    assert "Module: scribble_pidinet, Model: controlnet" in Image.open(out).text["parameters"]
    capsys.readouterr()
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--control-preprocessor-models" in err and "table5_pidinet.pth" in err, err
    assert main([*args, "--control-preprocessor-models", str(tmp_path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no table5_pidinet.pth in {tmp_path}" in err, err
