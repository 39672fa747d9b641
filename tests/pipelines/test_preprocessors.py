"""sd-webui-controlnet's model-free preprocessors beyond canny, against OpenCV (scripts/gen_preproc_refs.py).

Each reference case holds the image the extension's map function read (after its ``resize_image_with_pad``)
and the map it made with OpenCV. Two checks per case: the map alone, on that same input, and the whole chain
from the original image with sdrt's own processor resize. Blurs, recolor, area resizes and remap are OpenCV's
arithmetic; the float32 Gaussian (lineart_standard, scribble_xdog) and bicubic taps (color, the processor's
enlarging) add in another order, so a value on a whole level can land one level apart (or flip a thresholded
pixel): the tolerances allow that on a few pixels per thousand, measured: none on these references. The
references were made with OpenCV 5.0.0 (the file's ``versions``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt.errors import InputError
from sdrt.pipelines import colormaps, linemaps, shufflemap, tilemaps
from sdrt.pipelines.controlmaps import ControlImageError
from sdrt.pipelines.gaussian import gaussian_blur, kernel_size, reflect101
from sdrt.pipelines.preprocessors import NAMES, SPECS, WITH_MODELS, check_thresholds, preprocess, threshold_fields

REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "preproc_refs.npz")
MAPS = sorted(k[4:] for k in REFS.files if k.startswith("map/"))


def _input(case: str) -> np.ndarray:
    key = f"input/{case}"
    while key not in REFS.files:
        key = str(REFS[f"same/{key[6:]}"]) if key.startswith("input/") else key
    return REFS[key]


def _ref(case: str) -> np.ndarray:
    m = REFS[f"map/{case}"]
    return np.repeat(m[:, :, None], 3, axis=2) if m.ndim == 2 else m


def _value(case: str) -> float | None:
    parts = case.split("/")
    return float(parts[3]) if len(parts) > 3 else None


def _map_alone(case: str) -> np.ndarray:
    """sdrt's map function on the very input the extension's read."""
    name, _, res = case.split("/")[:3]
    given, v = _input(case), _value(case)
    if name == "tile_resample":
        return tilemaps.tile_resample(given, v)
    if name == "blur_gaussian":
        return tilemaps.blur_gaussian(given, v)
    if name == "shuffle":
        return shufflemap.content_shuffle(given, int(v))
    if name == "color":
        return colormaps.color_grid(given, int(res))
    if name == "recolor_luminance":
        return colormaps.recolor_luminance(given, v)
    if name == "recolor_intensity":
        return colormaps.recolor_intensity(given, v)
    made = linemaps.lineart_standard(given) if name == "lineart_standard" else linemaps.scribble_xdog(given, v)
    h, w = REFS[f"map/{case}"].shape[:2]
    return made[:h, :w]  # made on the padded input, cropped as the extension's remove_pad


#: (largest level difference, share of pixels that differ) allowed for the map alone. Measured (OpenCV 5.0): every
#: map equal to OpenCV's. The float32 blurs of lineart_standard / scribble_xdog / shuffle's sums may land a value
#: on the other side of a whole level on other inputs: one level (a flipped pixel for xdog) in a few per thousand.
ALONE = {"blur_gaussian": (0, 0), "recolor_luminance": (0, 0), "recolor_intensity": (0, 0),
         "lineart_standard": (1, 0.005), "scribble_xdog": (255, 0.005), "shuffle": (1, 0.005),
         "tile_resample": (0, 0), "color": (1, 0.005)}


def _whole_level_ties(gamma: float) -> set[int]:
    """The output levels n where the recolor curve 255 (v / 255) ** gamma lands within three float32 ulps of n for
    some input level v: there the extension's own float32 power truncates to n on one CPU and to n - 1 on another
    (numpy's float32 power is SIMD code on an AVX-512 CPU and libm on an AVX2 one; at gamma 0.45 level 128 gives
    186.99999 exactly, the references' 186, and 187.0 through libm's correctly rounded powf)."""
    exact = 255.0 * (np.arange(256) / 255.0) ** float(np.float32(gamma))
    near = np.rint(exact)
    ulp = np.spacing(near.astype(np.float32)).astype(np.float64)
    return {int(n) for n, e, u in zip(near, exact, ulp) if 0 < abs(e - n) <= 3 * u}


def _level_diff(case: str, ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|ours - ref| per pixel; for the recolor maps, a pixel one level apart at a whole-level tie counts as equal
    (the extension's own output moves there between CPUs), and nothing else is forgiven."""
    d = np.abs(ours.astype(int) - ref)
    if case.startswith("recolor_"):
        ties = _whole_level_ties(_value(case))
        tie = (d == 1) & np.isin(np.maximum(ours.astype(int), ref), sorted(ties))
        d = np.where(tie, 0, d)
    return d


def test_the_recolor_ties_are_the_levels_the_cpus_disagree_on():
    """The one tie at gamma 0.45 is level 187 (input 128); gamma 1 and 1.8 have none, so those stay exact."""
    assert _whole_level_ties(0.45) == {187}
    assert _whole_level_ties(1.0) == set() and _whole_level_ties(1.8) == set()


@pytest.mark.parametrize("case", MAPS)
def test_each_map_alone_equals_opencv(case: str) -> None:
    ours, ref = _map_alone(case), _ref(case)
    assert ours.shape == ref.shape and ours.dtype == np.uint8
    d = _level_diff(case, ours, ref)
    most, share = ALONE[case.split("/")[0]]
    assert d.max() <= most and (d > 0).mean() <= share, (int(d.max()), float((d > 0).mean()))


#: the whole chain from the original image (sdrt's processor resize too); measured as the map alone
CHAIN = {**ALONE, "blur_gaussian": (1, 0.005)}


@pytest.mark.parametrize("case", MAPS)
def test_each_map_from_the_original_image(case: str) -> None:
    name, image, res = case.split("/")[:3]
    v = _value(case)
    resolution = None if res == "own" else int(res)
    seed = int(v) if name == "shuffle" else None
    low = None if name in ("shuffle", "lineart_standard", "color") else v
    ours = preprocess(REFS[f"image/{image}"], name, low, None, resolution, seed)
    ref = _ref(case)
    assert ours.shape == ref.shape
    d = _level_diff(case, ours, ref)
    most, share = CHAIN[name]
    assert d.max() <= most and (d > 0).mean() <= share, (int(d.max()), float((d > 0).mean()))


def test_the_references_cover_every_new_preprocessor() -> None:
    from sdrt.pipelines.preprocessors import WITH_MODELS

    # dw_openpose_full runs a model: its references are tests/data/control/dwpose_refs.npz (test_dwpose.py)
    # inpaint / inpaint_only make the RGBA hint of the inpaint net: tests/pipelines/test_inpaint_controlnet.py
    # tile_colorfix / +sharp: the image as it is, and a colour fix while sampling: tests/pipelines/test_colorfix.py
    # the reference modules make no map (the picture as it is guides the UNet): tests/pipelines/test_refonly.py
    new = set(NAMES) - {"none", "canny", "scribble", "threshold", "invert", "inpaint", "inpaint_only",
                        "tile_colorfix", "tile_colorfix+sharp", "reference_only", "reference_adain",
                        "reference_adain+attn"} - set(WITH_MODELS)
    assert {c.split("/")[0] for c in MAPS} == new
    # the cases exercise what they are meant to: a thick stroke whose XDoG difference wraps past 255 in the
    # extension's uint8 product, a lineart median from real strokes and one with none above 8 (divisor 16)
    lines = _input("scribble_xdog/lines/own/32").astype(np.float32)
    d = np.min(gaussian_blur(lines, 5.0) - gaussian_blur(lines, 0.5), axis=2)
    assert (d >= 128).sum() > 20
    assert _ref("lineart_standard/lines/own").max() > 127 and _ref("lineart_standard/photo/own").max() < 127


def test_gaussian_kernel_size_and_borders_as_opencv() -> None:
    assert kernel_size(9.0, True) == 55 and kernel_size(6.0, False) == 49 and kernel_size(0.5, False) == 5
    assert reflect101(4, 3, 3).tolist() == [3, 2, 1, 0, 1, 2, 3, 2, 1, 0]  # gfedcb|abcd|cba, reflected again
    assert reflect101(1, 2, 2).tolist() == [0] * 5
    flat = np.full((5, 7, 3), 77, np.uint8)
    assert np.array_equal(gaussian_blur(flat, 30.0), flat)  # a kernel far longer than the image: still flat


def test_tile_resample_keeps_small_rates_and_refuses_rates_that_leave_nothing() -> None:
    img = REFS["image/photo"]
    assert tilemaps.tile_resample(img, 1.09) is not None and np.array_equal(tilemaps.tile_resample(img, 1.09), img)
    assert tilemaps.tile_resample(img, 2).shape == (58, 45, 3)
    with pytest.raises(ControlImageError, match="leaves nothing"):
        tilemaps.tile_resample(img, 200)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "none" and n not in WITH_MODELS])  # test_dwpose.py, test_openpose_body.py
@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 9, 3), (9, 1), (70, 3, 4)])
def test_tiny_and_odd_images_make_a_map_or_say_why(name: str, shape: tuple[int, ...]) -> None:
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    try:
        made = preprocess(img, name)
    except InputError as exc:
        assert name in ("color", "tile_resample") and "\n" not in str(exc)
        return
    assert made.dtype == np.uint8 and made.ndim == 3 and made.shape[2] == 3 and np.isfinite(made).all()


def test_color_grid_needs_a_64_pixel_cell() -> None:
    with pytest.raises(ControlImageError, match="no 64-pixel cell"):
        colormaps.color_grid(REFS["image/photo"], 32)
    grid = colormaps.color_grid(REFS["image/photo"], 128)
    assert grid.shape == (166, 128, 3) and len(np.unique(grid.reshape(-1, 3), axis=0)) <= 4  # 2x2 cells


def test_shuffle_is_seeded_as_the_extension_seeds_numpy() -> None:
    img = REFS["image/photo"]
    a, b = shufflemap.content_shuffle(img, 7), shufflemap.content_shuffle(img, 7)
    assert np.array_equal(a, b) and not np.array_equal(a, shufflemap.content_shuffle(img, 8))
    # set_numpy_seed: (seed + subseed) & 0xFFFFFFFF, the subseed being the seed when there is none
    assert shufflemap.numpy_seed(42) == 84 and shufflemap.numpy_seed(42, -1) == 84
    assert shufflemap.numpy_seed(42, 5) == 47 and shufflemap.numpy_seed(2**32 - 1, 2**32 - 1) == 2**32 - 2


@pytest.mark.parametrize("name, low, high, words", [
    ("tile_resample", -1, None, "the down sampling rate, must be a number >= 0, got -1"),
    ("tile_resample", "2", None, "the down sampling rate, must be a finite number, got '2'"),
    ("blur_gaussian", 0, None, "the blur's sigma, must be a number above 0, up to 256, got 0"),
    ("recolor_luminance", 300, None, "the gamma correction, must be a number from 0 to 256, got 300"),
    ("scribble_xdog", float("nan"), None, "the XDoG threshold, must be a finite number"),
    ("lineart_standard", 3, None, "the lineart_standard preprocessor reads no low threshold"),
    ("tile_resample", 2, 5, "the tile_resample preprocessor reads no high threshold"),
])
def test_bad_thresholds_are_refused_in_the_callers_words(name, low, high, words) -> None:
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        check_thresholds(name, low, high, "controlnets[0]")
    assert "controlnets[0]" in str(info.value) and "\n" not in str(info.value)


def test_infotext_thresholds_follow_the_sliders() -> None:
    assert threshold_fields("tile_resample", None, None) == [("Threshold A", "1")]
    assert threshold_fields("blur_gaussian", 2.5, None) == [("Threshold A", "2.5")]
    assert threshold_fields("shuffle", None, None) == [] and threshold_fields("canny", 50, None)[1][1] == "200"
    assert all(SPECS[n].resolution in (None, "pad", "scale", "own") for n in NAMES)


# ------------------------------------------------------------------ through the pipeline and the CLI
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


def _photo() -> np.ndarray:
    from pipeline_helpers import DATA

    z = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")
    return np.ascontiguousarray(np.kron(z["scribble"], np.ones((2, 2, 1), np.uint8)))  # 128x128


def test_shuffle_in_the_pipeline_is_seeded_from_the_run_as_the_extension_seeds_numpy() -> None:
    """A unit's shuffle map is made with numpy seed (seed + subseed) & 0xFFFFFFFF (subseed = seed without a
    variation seed): the image equals a run fed that map by hand; ``seed=`` on the unit overrides it."""
    from pipeline_helpers import DATA, fast_backend

    from sdrt import pipelines
    from sdrt.pipelines.controlmaps import resize_control
    from sdrt.pipelines.controlnet import ControlNet

    photo = _photo()
    kw = dict(steps=2, sampler="Euler", seed=5)
    hand = resize_control(shufflemap.content_shuffle(photo, shufflemap.numpy_seed(5)), 64, 64)
    mine = resize_control(shufflemap.content_shuffle(photo, 77), 64, 64)
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        auto = pipe(PROMPT, controlnets=[ControlNet("controlnet", photo, preprocessor="shuffle")], **kw)[0]
        by_hand = pipe(PROMPT, controlnets=[("controlnet", hand)], **kw)[0]
        seeded = pipe(PROMPT, controlnets=[ControlNet("controlnet", photo, preprocessor="shuffle", seed=77)], **kw)[0]
        by_hand_77 = pipe(PROMPT, controlnets=[("controlnet", mine)], **kw)[0]
        gen = pipe.generate(PROMPT, controlnets=[ControlNet("controlnet", photo, 0.5, preprocessor="tile_resample",
                                                            low=2)], **kw)
        with pytest.raises(InputError, match=r"controlnets\[0\] low, the blur's sigma, must be a number above 0"):
            pipe(PROMPT, controlnets=[ControlNet("controlnet", photo, preprocessor="blur_gaussian", low=0)], **kw)
        with pytest.raises(InputError, match=r"controlnets\[0\] seed must be a whole number"):
            pipe(PROMPT, controlnets=[ControlNet("controlnet", photo, preprocessor="shuffle", seed=-1)], **kw)
    assert np.array_equal(auto, by_hand) and np.array_equal(seeded, by_hand_77) and not np.array_equal(auto, seeded)
    info = gen.settings[0]["ControlNet 0"]
    assert info.startswith("Module: tile_resample, Model: controlnet, Weight: 0.5,") and "Threshold A: 2," in info


def test_the_cli_offers_every_preprocessor_by_the_extensions_name(tmp_path, capsys) -> None:
    from PIL import Image
    from pipeline_helpers import DATA, fast_backend

    from sdrt.cli import build_parser, main

    for name in NAMES:
        assert build_parser().parse_args(["generate", "m", "p", "--control-preprocessor", name]).control_preprocessor
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "m", "p", "--control-preprocessor", "lineart"])
    assert "lineart_standard" in capsys.readouterr().err  # argparse lists the choices
    png = tmp_path / "lines.png"
    Image.fromarray(_photo()).save(png)
    out = tmp_path / "out.png"
    rc = main(["generate", str(DATA / "tiny-sd15-controlnet"), "a cat", "--steps", "1", "--seed", "3",
               "--backend", fast_backend(), "--control-image", str(png), "--control-preprocessor",
               "lineart_standard", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "Module: lineart_standard, Model: controlnet" in Image.open(out).text["parameters"]
    # the sliders: --control-threshold-a / -b, the extension's threshold_a / threshold_b, checked in the flags' words
    rc = main(["generate", str(DATA / "tiny-sd15-controlnet"), "a cat", "--steps", "1", "--seed", "3",
               "--backend", fast_backend(), "--control-image", str(png), "--control-preprocessor", "tile_resample",
               "--control-threshold-a", "2.5", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "Module: tile_resample, Model: controlnet, Weight: 1, Resize Mode: Crop and Resize, Processor Res: 64, " \
           "Threshold A: 2.5, Guidance Start" in Image.open(out).text["parameters"]
    capsys.readouterr()
    for flags, words in (
            (["--control-preprocessor", "tile_resample", "--control-threshold-a", "-1"],
             "error: --control-threshold-a, the down sampling rate, must be a number >= 0, got -1. Where: "
             "--control-threshold-a. What to do: pass e.g. --control-threshold-a 1 (the extension's default)"),
            (["--control-preprocessor", "lineart_standard", "--control-threshold-a", "3"],
             "error: --control-threshold-a: the lineart_standard preprocessor reads no --control-threshold-a"),
            (["--control-preprocessor", "canny", "--control-threshold-b", "-5"],
             "error: --control-threshold-b, a canny threshold, must be a number >= 0, got -5")):
        rc = main(["generate", str(DATA / "tiny-sd15-controlnet"), "a cat", "--steps", "1", "--backend", "nosuch",
                   "--control-image", str(png), *flags, "-o", str(out)])
        err = capsys.readouterr().err
        assert rc == 1 and err.startswith(words) and err.count("\n") == 1, err
    rc = main(["generate", "a cat", "--steps", "1", "--backend", "nosuch", "--control-threshold-a", "2"])
    assert rc == 1 and "--control-threshold-a needs a --control-image" in capsys.readouterr().err


def test_one_finite_number_check_serves_every_preprocessor_and_unit_argument() -> None:
    """controlmaps.finite_number: ints and floats (Python's, numpy's) that are finite; not bools, strings, NaN,
    infinities, or an int too large for a float (that was an OverflowError/TypeError, not the caller's error)."""
    from sdrt.pipelines.controlmaps import finite_number
    from sdrt.pipelines.controlnet import _num

    for good in (0, 2.5, -3, np.int8(4), np.float32(1.5), np.uint64(2 ** 63)):
        assert finite_number(good), good
    for bad in (True, "1", None, float("nan"), float("-inf"), np.float64("inf"), 10 ** 400, [1]):
        assert not finite_number(bad), bad
    with pytest.raises(InputError, match=r"^scale must be a number from 0 to 2, got 1000"):
        _num(10 ** 400, "scale", 0, 2)
    image = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ControlImageError, match=r"^XDoG threshold 10000\d+ is not a number"):
        linemaps.scribble_xdog(image, 10 ** 400)


@pytest.mark.parametrize("name", sorted(set(WITH_MODELS) - {"depth_leres", "depth_leres++", "dw_openpose_full", "openpose",
                                                             "depth_anything", "depth_anything_v2", "animal_openpose",
                                                             "openpose_hand", "openpose_face", "openpose_faceonly",
                                                             "openpose_full", "instant_id_face_keypoints", "inpaint_only+lama"}))
# (leres: test_leres_depth.py; LaMa reads a masked picture at 256 (test_lama.py); the detectors that read the image at a size of their own are not bounded here)
def test_a_model_backed_map_at_the_images_own_size_is_bounded(tmp_path, name):
    """No processor resolution (the API's default): the network would read the whole image; above MAX_NET_PIXELS
    (a 6000x4000 photo through HED took ~13 GB) it is one line before any file is read, as at a resolution; the
    memory plan's map_size says the same."""
    from sdrt.pipelines import preprocessors
    from sdrt.pipelines.controlmaps import ControlImageError

    big = np.zeros((4097, 4096, 3), np.uint8)
    with pytest.raises(ControlImageError, match="at its own size") as e:
        preprocessors.preprocess(big, name, models=tmp_path / "not-read")
    assert "\n" not in str(e.value)
    with pytest.raises(ControlImageError, match="at its own size"):
        preprocessors.map_size(name, 4097, 4096, None)


def test_a_drawn_subseed_varies_the_noise_not_the_shuffle_map(monkeypatch) -> None:
    """sd-webui-controlnet's ``set_numpy_seed`` reads the subseed as sent: -1 (or none) counts as the seed whatever
    the variation strength (A1111 draws the subseed for the noise only), a given one counts at strength 0 too. The
    pipeline counted the drawn subseed (a new map each run of one seed)."""
    from pipeline_helpers import DATA, fast_backend

    from sdrt import pipelines
    from sdrt.pipelines import controlnet as cn
    from sdrt.pipelines.controlnet import ControlNet

    seeds = []
    made = cn.preprocess
    monkeypatch.setattr(cn, "preprocess", lambda *a: seeds.append(a[5]) or made(*a))
    kw = dict(steps=1, sampler="Euler", seed=5, width=64, height=64)
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as pipe:
        for extra, subseed in (({"subseed_strength": 0.5}, 5), ({"subseed": -1, "subseed_strength": 0.5}, 5),
                               ({"subseed": 9, "subseed_strength": 0.5}, 9), ({"subseed": 9}, 9)):
            seeds.clear()
            pipe(PROMPT, controlnets=[ControlNet("controlnet", _photo(), preprocessor="shuffle")], **kw, **extra)
            assert seeds and set(seeds) == {shufflemap.numpy_seed(5, subseed)}, extra  # (the dry run makes it too)
