"""Where a run cuts or resizes a ControlNet unit's map, it does so as sd-webui-controlnet does:

- with ``inpaint_area="only masked"`` a unit's input image is cut to the area the run repaints (the picture's crop
  box), before its preprocessor (the extension's ``try_crop_image_with_a1111_mask``; ``inpaint_crop=False`` is its
  ``inpaint_crop_input_image`` off: the whole image);
- the hires fix's second pass gets the first pass's map (made once, pixel perfect for the first pass's size)
  resized to its size in the unit's resize mode (the extension's ``detectmap_proc`` at ``hr_y``, ``hr_x``), not a
  map made again.

The expected maps come from ``scripts/gen_cn_fidelity_refs.py`` (Pillow and OpenCV called as A1111 and the
extension call them; nothing of sdrt) -> ``tests/data/control/cn_fidelity_refs.npz``. The model is the tiny
SD 1.5 ControlNet folder (its nets take 64x64 control images only; the demo model's UNet takes no residuals), so the
second pass is driven through the pipeline's own hires hook (``_control`` at the second pass's size); the hires run
end to end is on Flux (tests/flow/test_flux_controlnet_img2img.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, fast_backend

from sdrt import pipelines
from sdrt.pipelines.controlnet import ControlNet
from sdrt.pipelines.families.base import ModelCall

REFS = np.load(Path(__file__).resolve().parents[1] / "data" / "control" / "cn_fidelity_refs.npz")
MODES = ("Just Resize", "Crop and Resize", "Resize and Fill")
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"
ONLY_MASKED = dict(init_image=REFS["picture"], mask=REFS["mask"], inpaint_area="only masked", inpaint_padding=8,
                   width=64, height=64)


@pytest.fixture(scope="module")
def pipe():
    with pipelines.load(DATA / "tiny-sd15-controlnet", backend=fast_backend()) as p:
        yield p


def _fed(control: np.ndarray) -> np.ndarray:
    """The HxWx3 uint8 map a unit's ``controlnet_cond`` (1x3xHxW in [0, 1]) holds."""
    return np.round(control[0].transpose(1, 2, 0) * 255).astype(np.uint8)


def _canny(mode: str, **kw) -> ControlNet:
    return ControlNet("controlnet", REFS["control"], 1.0, 0.0, 1.0, "canny", mode, 50, 150, pixel_perfect=True, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_only_masked_units_map_is_the_extensions(pipe, mode: str) -> None:
    """The 128x84 control image fitted to the 96x80 picture in the unit's mode, cut to the picture's box (44, 13)
    to (78, 47), fitted to 64x64 with Resize and Fill, then canny (pixel perfect: at 64): equal to the extension's,
    byte for byte; without the cut (inpaint_crop=False) the map is the whole image's."""
    s, _, _ = pipe._prepare(PROMPT, "", dict(steps=2, controlnets=[_canny(mode)], **ONLY_MASKED))
    unit = s.toolbox.controlnets[0]
    assert unit.made_at == 64
    assert np.array_equal(_fed(unit.control), REFS[f"crop/{mode}/map"])
    s, _, _ = pipe._prepare(PROMPT, "", dict(steps=2, controlnets=[_canny(mode, inpaint_crop=False)], **ONLY_MASKED))
    assert not np.array_equal(_fed(s.toolbox.controlnets[0].control), REFS[f"crop/{mode}/map"])


def test_only_masked_run_feeds_its_units_the_cut_out(pipe) -> None:
    """End to end: an only-masked run with the canny unit gives the image of the same run fed the extension's map
    as it is (module none, not cut); with inpaint_crop=False it gives another (the net sees the whole image)."""
    kw = dict(steps=3, seed=5, sampler="Euler", cfg=7, **ONLY_MASKED)
    mode = "Crop and Resize"
    got = pipe.generate(PROMPT, controlnets=[_canny(mode)], **kw)
    given = ControlNet("controlnet", REFS[f"crop/{mode}/map"], resize=mode, inpaint_crop=False)  # fed as it is
    want = pipe.generate(PROMPT, controlnets=[given], **kw)
    whole = pipe.generate(PROMPT, controlnets=[_canny(mode, inpaint_crop=False)], **kw)
    assert got.images[0].shape == (80, 96, 3)  # pasted back into the picture
    assert np.array_equal(got.images[0], want.images[0])
    assert int(np.abs(whole.images[0].astype(int) - got.images[0]).max()) > 10
    assert got.settings[0]["Inpaint area"] == "Only masked"
    assert "Processor Res: 64" in got.settings[0]["ControlNet 0"]


@pytest.mark.parametrize("mode", MODES)
def test_hires_pass_resizes_the_first_pass_map(pipe, mode: str) -> None:
    """blur_gaussian, pixel perfect, on a 64x64 image: the first pass's map is made at 64 and fed as it is; the
    second pass (here 128x96) gets that map resized in the unit's mode as the extension's detectmap_proc resizes it
    (OpenCV's cubic; sdrt's resampler lands one level off on a few pixels), not a map made again at 128."""
    unit = ControlNet("controlnet", REFS["hires_image"], preprocessor="blur_gaussian", low=3.0, resize=mode,
                      pixel_perfect=True)
    s, _, _ = pipe._prepare(PROMPT, "", dict(steps=2, width=64, height=64, controlnets=[unit]))
    unit = s.toolbox.controlnets[0]
    assert np.array_equal(_fed(unit.control), REFS[f"hires/{mode}/64x64"])
    pipe._control(s, ModelCall(128, 96, 1, 7.0, None, None), 128, 96)  # the hires fix's second pass
    d = np.abs(_fed(unit.control).astype(int) - REFS[f"hires/{mode}/128x96"])
    assert d.max() <= 1 and (d > 0).mean() <= 0.005, (int(d.max()), float((d > 0).mean()))
    assert unit.made_at == 64  # the infotext's Processor Res: the one map's
    pipe._control(s, ModelCall(64, 64, 1, 7.0, None, None), 64, 64)  # the job's next image: the first map again
    assert np.array_equal(_fed(unit.control), REFS[f"hires/{mode}/64x64"])


def test_bad_inpaint_crop_is_refused() -> None:
    from sdrt.errors import InputError

    with pytest.raises(InputError, match=r"controlnets\[0\] inpaint_crop must be True or False, got 'no'"):
        pipelines.validate(PROMPT, controlnets=[_canny("Just Resize", inpaint_crop="no")])


def test_cli_only_masked_with_a_control_image(pipe, tmp_path: Path, capsys) -> None:
    """``sdrt generate --inpaint-area only-masked --control-image ...`` cuts the control image as the API does (the
    image equals the API's run fed the extension's map); ``--control-inpaint-crop off`` feeds the whole image; the
    flag without only-masked is refused, naming it."""
    from sdrt.cli import main
    from sdrt.pipelines.png import write_png

    pil = pytest.importorskip("PIL.Image")
    for name in ("picture", "mask", "control"):
        write_png(tmp_path / f"{name}.png", REFS[name])
    mode = "Crop and Resize"
    args = ["generate", str(DATA / "tiny-sd15-controlnet"), PROMPT, "--steps", "3", "--seed", "5", "--sampler",
            "Euler", "--cfg", "7", "--backend", fast_backend(), "--width", "64", "--height", "64",
            "--init-image", str(tmp_path / "picture.png"), "--mask", str(tmp_path / "mask.png"),
            "--inpaint-area", "only-masked", "--inpaint-padding", "8", "--control-image", str(tmp_path / "control.png"),
            "--control-preprocessor", "canny", "--control-threshold-a", "50", "--control-threshold-b", "150",
            "--control-resize", mode, "--control-processor-res", "none"]  # the API's processor_res=None (the CLI: 512)

    def run(*more: str) -> np.ndarray:
        out = tmp_path / "out.png"
        assert main([*args, "-o", str(out), *more]) == 0, capsys.readouterr().err
        with pil.open(out) as img:
            return np.asarray(img.convert("RGB"))

    given = ControlNet("controlnet", REFS[f"crop/{mode}/map"], resize=mode, inpaint_crop=False)
    kw = dict(steps=3, seed=5, sampler="Euler", cfg=7, **ONLY_MASKED)
    assert np.array_equal(run(), pipe.generate(PROMPT, controlnets=[given], **kw).images[0])
    whole = ControlNet("controlnet", REFS["control"], 1.0, 0.0, 1.0, "canny", mode, 50, 150, inpaint_crop=False)
    assert np.array_equal(run("--control-inpaint-crop", "off"), pipe.generate(PROMPT, controlnets=[whole], **kw).images[0])
    cut = [a for a in args if a not in ("--inpaint-area", "only-masked", "--inpaint-padding", "8")]
    assert main([*cut, "-o", str(tmp_path / "x.png"), "--control-inpaint-crop", "off"]) == 1
    err = capsys.readouterr().err
    assert "--control-inpaint-crop says whether an only-masked run cuts its control images" in err
    assert "Where: --control-inpaint-crop" in err, err


# ------------------------------------------------------------------ a black/white map resized (high_quality_resize)
SIZES = ((768, 640), (384, 384))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_canny_map_resized_as_the_extension(mode: str, size: tuple[int, int]) -> None:
    """A canny map made at processor resolution 512 (pixel perfect off) fitted to a 768x640 or 384x384 run: the
    extension's detectmap_proc / high_quality_resize, byte for byte: the map is black and white with one-pixel edges,
    so it is resized (cubic up, area down), suppressed to its ridges, thresholded at Otsu's level and thinned (pruned
    when enlarged). The unit's own map (the image through canny at 512, then resized to the run) is the same."""
    from sdrt.pipelines import controlnet as cn
    from sdrt.pipelines.controlmaps import resize_control

    w, h = size
    want = REFS[f"resize/{mode}/{w}x{h}"]
    got = resize_control(REFS["resize/detected"], w, h, mode)
    assert got.shape == (h, w, 3) and np.array_equal(got[:, :, 0], want), int((got[:, :, 0] != want).sum())
    assert set(np.unique(got)) == {0, 255}
    unit = cn.parse_units([ControlNet("controlnet", REFS["resize/image"], 1.0, 0.0, 1.0, "canny", mode, 50, 150,
                                      processor_res=512)])[0]
    fed = cn.prepare_image(unit, w, h, "controlnets[0]")
    assert np.array_equal(unit.detected[:, :, 0], REFS["resize/detected"])
    assert np.array_equal(fed[:, :, 0], want)


@pytest.mark.parametrize("mode", MODES)
def test_black_and_white_steps_on_opencvs_resized_map(mode: str) -> None:
    """The steps after the resize, on OpenCV's own cubic output (its INTER_CUBIC of 8-bit images runs through Intel
    IPP where the wheel has it, rounding of its own): the channels' mean, nake_nms, Otsu and lvmin_thin with prunings
    give the extension's map exactly."""
    from sdrt.pipelines.edgethin import binarize

    resampled = REFS[f"resize/{mode}/768x640/resampled"]
    got = binarize(np.repeat(resampled[:, :, None], 3, axis=2), True, True)[:, :, 0]
    h, w = got.shape
    want = REFS[f"resize/{mode}/768x640"]
    if mode == "Crop and Resize":  # 768x768, cut to 768x640
        got = got[(h - 640) // 2:(h - 640) // 2 + 640]
    elif mode == "Resize and Fill":  # 640x640 on the border's colour (black)
        got = np.pad(got, ((0, 0), ((768 - w) // 2, 768 - w - (768 - w) // 2)))
    assert np.array_equal(got, want)


def test_edge_thinning_pieces() -> None:
    """Small cases, their expected values as OpenCV 5.0 and the extension's functions give them (cv2.threshold with
    THRESH_OTSU, nake_nms, lvmin_thin): Otsu's level (the first best, a single class skipped), nake_nms keeping the
    maxima of any line, and a 3-pixel bar thinned to its spine with forks at its ends, which the prunings cut."""
    from sdrt.pipelines.edgethin import lvmin_thin, nake_nms, one_pixel_edges, otsu

    assert otsu(np.array([[0, 0, 255, 255]], np.uint8)) == 0
    assert otsu(np.full((4, 4), 7, np.uint8)) == 0
    assert otsu(np.array([[10, 10, 10, 200, 210]], np.uint8)) == 10
    assert np.array_equal(nake_nms(np.array([[9, 9, 9], [9, 3, 9], [9, 9, 9]], np.uint8)),
                          [[9, 9, 9], [9, 0, 9], [9, 9, 9]])
    cross = np.array([[0, 5, 0], [3, 9, 3], [0, 5, 0]], np.uint8)
    assert np.array_equal(nake_nms(cross), cross)
    bar = np.zeros((7, 12), np.uint8)
    bar[2:5, 1:11] = 255
    spine = np.zeros_like(bar)
    spine[3, 1:11] = 255
    spine[[2, 4, 2, 4], [1, 1, 10, 10]] = 255
    assert np.array_equal(lvmin_thin(bar.copy(), prunings=False), spine)
    pruned = np.zeros_like(bar)
    pruned[3, 1:9] = 255
    assert np.array_equal(lvmin_thin(bar.copy(), prunings=True), pruned)
    edges = np.zeros((9, 9, 3), np.uint8)
    edges[4, 1:8] = 255
    assert one_pixel_edges(edges) and not one_pixel_edges(np.repeat(bar[:, :, None], 3, axis=2))


@pytest.mark.parametrize("mode", MODES)
def test_hires_pass_resizes_a_canny_map_as_the_extension(pipe, mode: str) -> None:
    """A canny unit (pixel perfect) in the hires fix: the first pass's map made at 64, the second pass's (128x96 and
    96x96) that map through high_quality_resize's black-and-white path, byte for byte."""
    unit = ControlNet("controlnet", REFS["hires_image"], preprocessor="canny", low=50, high=150, resize=mode,
                      pixel_perfect=True)
    s, _, _ = pipe._prepare(PROMPT, "", dict(steps=2, width=64, height=64, controlnets=[unit]))
    unit = s.toolbox.controlnets[0]
    assert np.array_equal(_fed(unit.control), REFS[f"hires_canny/{mode}/64x64"])
    for w, h in ((128, 96), (96, 96)):
        pipe._control(s, ModelCall(w, h, 1, 7.0, None, None), w, h)
        assert np.array_equal(_fed(unit.control), REFS[f"hires_canny/{mode}/{w}x{h}"]), (w, h)


# ------------------------------------------------------------------ hr_option: the passes of the hires fix a unit is in
#: sd-webui-controlnet's ControlParams.disabled_by_hr_option (scripts/hook.py), read as a table: whether a unit with
#: each hr_option is off in the (first pass, second pass) of a hires-fix run; without the fix every unit is "Both"
EXTENSION_OFF = {"Both": (False, False), "Low res only": (False, True), "High res only": (True, False)}
HIRES = dict(hires_scale=1, hires_steps=2, hires_denoise=0.5, hires_upscaler="Lanczos")
EDGES = np.load(DATA / "tiny-sd15-controlnet" / "refs.npz")["edges"]


@pytest.mark.parametrize("option", list(EXTENSION_OFF))
def test_hr_option_puts_the_unit_on_its_passes_only(pipe, option: str) -> None:
    """A hires-fix run (hires_scale 1 with Lanczos: the tiny folder's UNet is fixed at 64x64, so the second pass runs
    at 64x64 too; sdrt's hires pass is then img2img of the first pass's image on A1111's steps: the last 2 of
    int(2 / 0.5) = 4) with the unit's hr_option equals the two passes composed from the API, each with the unit only
    where the extension's table has it on: a txt2img run with or without the unit, then img2img of its image with or
    without it. The options give three different pictures."""
    from sdrt.pipelines.controlnet import HR_OPTIONS

    assert tuple(EXTENSION_OFF) == HR_OPTIONS
    kw = dict(steps=3, seed=5, sampler="Euler", cfg=7, width=64, height=64)

    def unit(opt: str = "Both") -> ControlNet:
        return ControlNet("controlnet", EDGES, 1.0, 0.0, 1.0, hr_option=opt)

    got = pipe("a cat", controlnets=[unit(option)], **kw, **HIRES)[0]
    off_first, off_second = EXTENSION_OFF[option]
    first = pipe("a cat", controlnets=[] if off_first else [unit()], **kw)[0]
    want = pipe("a cat", init_image=first, controlnets=[] if off_second else [unit()], steps=4, strength=2.5 / 4,
                seed=5, sampler="Euler", cfg=7)[0]
    assert np.array_equal(got, want)
    if option != "Both":
        both = pipe("a cat", controlnets=[unit()], **kw, **HIRES)[0]
        assert int(np.abs(both.astype(int) - got).max()) > 10


def test_hr_option_checked() -> None:
    from sdrt.errors import InputError

    with pytest.raises(InputError, match=r"controlnets\[0\] hr_option 'High res only' picks a pass of the hires fix, "
                                         "and the run has no hires fix") as err:
        pipelines.validate(PROMPT, controlnets=[ControlNet("controlnet", EDGES, hr_option="high RES only")])
    assert err.value.where == "controlnets[0] hr_option"
    with pytest.raises(InputError, match=r"controlnets\[0\] hr_option 'Low res' is not a hires-fix option"):
        pipelines.validate(PROMPT, controlnets=[ControlNet("controlnet", EDGES, hr_option="Low res")], hires_scale=2)
    s = pipelines.validate(PROMPT, controlnets=[ControlNet("controlnet", EDGES, hr_option=2)], hires_scale=2)
    assert s.toolbox.controlnets[0].hr_option == "High res only"
    assert pipelines.validate(PROMPT, controlnets=[ControlNet("controlnet", EDGES)]).toolbox.controlnets[0].hr_option \
        == "Both"


def test_cli_control_hr_option(pipe, tmp_path: Path, capsys) -> None:
    """``sdrt generate --hires-scale 1 ... --control-hr-option "High res only"`` gives the API's run with that
    hr_option (composed from its passes in test_hr_option_puts_the_unit_on_its_passes_only); without --hires-scale,
    or with a name that is no option, it is refused in one line naming the flag."""
    from sdrt.cli import main
    from sdrt.pipelines.png import write_png

    pil = pytest.importorskip("PIL.Image")
    write_png(tmp_path / "edges.png", EDGES)
    args = ["generate", str(DATA / "tiny-sd15-controlnet"), "a cat", "--steps", "3", "--seed", "5", "--sampler",
            "Euler", "--cfg", "7", "--backend", fast_backend(), "--width", "64", "--height", "64",
            "--control-image", str(tmp_path / "edges.png"), "-o", str(tmp_path / "out.png")]
    hires = ["--hires-scale", "1", "--hires-steps", "2", "--hires-denoise", "0.5", "--hires-upscaler", "Lanczos"]
    assert main([*args, *hires, "--control-hr-option", "high res only"]) == 0, capsys.readouterr().err
    with pil.open(tmp_path / "out.png") as img:
        got = np.asarray(img.convert("RGB"))
    want = pipe("a cat", controlnets=[ControlNet("controlnet", EDGES, hr_option="High res only")], steps=3, seed=5,
                sampler="Euler", cfg=7, width=64, height=64, **HIRES)[0]
    assert np.array_equal(got, want)
    assert main([*args, "--control-hr-option", "Low res only"]) == 1
    err = capsys.readouterr().err
    assert "--control-hr-option picks a pass of the hires fix, and there is no --hires-scale" in err, err
    assert main([*args, *hires, "--control-hr-option", "hires"]) == 1
    err = capsys.readouterr().err
    assert "--control-hr-option 'hires' is not a hires-fix option" in err and err.count("\n") == 1, err
