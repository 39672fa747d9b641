"""``sdrt generate --control-processor-res N|none`` and ``--control-pixel-perfect``: the CLI's units run their
preprocessors where the Python API's ``ControlNet(processor_res=..., pixel_perfect=...)`` runs them (the same images,
compared as arrays), at 512 by default (sd-webui-controlnet's slider, and sdrt serve's), with the infotext saying what
ran; each refusal is one line naming the flag; ``--dry-run`` with a model-backed preprocessor neither compiles nor
runs its network (the map's size is worked out: the map is resized to the output size anyway).

The fast preprocessors (canny, lineart_standard) and TEED (``softedge_teed``: 58,910 parameters, the seeded
``7_model.pth`` softedge_helpers writes) on the tiny SD 1.5 ControlNet folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import DATA, fast_backend  # noqa: E402
from softedge_helpers import write_teed  # noqa: E402

from sdrt.pipelines import preprocessors  # noqa: E402
from sdrt.pipelines.controlnet import ControlNet  # noqa: E402

MODEL = DATA / "tiny-sd15-controlnet"
KW = dict(steps=1, seed=3, sampler="Euler", cfg=7.0, width=64, height=64)
FLAGS = ["--steps", "1", "--seed", "3", "--sampler", "Euler", "--cfg", "7", "--width", "64", "--height", "64"]


def _photo(h: int = 48, w: int = 80, seed: int = 1) -> np.ndarray:
    """A picture with edges at every scale: noise, a bright box and a ramp (48x80: its shorter side is 48)."""
    rng = np.random.default_rng(seed)
    a = (rng.random((h, w, 3)) * 90).astype(np.uint8)
    a[h // 5:h * 3 // 5, w // 4:w * 3 // 4] = 240
    a[:, :, 2] = np.linspace(0, 255, w, dtype=np.float32).astype(np.uint8)[None]
    return a


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("clires")
    photo, other = root / "photo.png", root / "other.png"
    Image.fromarray(_photo()).save(photo)
    Image.fromarray(_photo(56, 40, 2)).save(other)
    strip = root / "strip16.png"  # 16x128: at 2048 it is 2048x16384 for a network, above MAX_NET_PIXELS
    Image.fromarray(np.zeros((16, 128, 3), np.uint8)).save(strip)
    line = root / "line.png"  # 1x300: a side of 19200 at 64, 153600 at 512 (above MAX_SIDE)
    Image.fromarray(np.full((1, 300, 3), 200, np.uint8)).save(line)
    return {"photo": photo, "other": other, "strip": strip, "line": line, "teed": write_teed(root / "TEED"),
            "backend": fast_backend()}


@pytest.fixture(scope="module")
def pipe(files):
    from sdrt import pipelines

    with pipelines.load(MODEL, backend=files["backend"]) as p:
        yield p


def _cli(files, tmp_path, capsys, *flags: str, name: str = "out.png") -> tuple[np.ndarray, str]:
    """The CLI's image and its ControlNet infotext (every unit's, one per line)."""
    from PIL import Image

    from sdrt.cli import main

    out = tmp_path / name
    rc = main(["generate", str(MODEL), "a house", *FLAGS, "--backend", files["backend"], *flags, "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    with Image.open(out) as im:
        text = im.text["parameters"]
        image = np.asarray(im.convert("RGB"))
    return image, "\n".join(line for line in text.replace(", ControlNet", "\nControlNet").split("\n")
                            if line.startswith("ControlNet"))


def _api(pipe, *units: ControlNet):
    gen = pipe.generate("a house", controlnets=list(units), **KW)
    return gen.images[0], gen.settings[0]


def _unit(files, image="photo", **kw) -> ControlNet:
    from PIL import Image

    with Image.open(files[image]) as im:
        rgb = np.asarray(im.convert("RGB"))
    return ControlNet("controlnet", rgb, **kw)


@pytest.mark.parametrize("pre", ["canny", "lineart_standard"])
def test_the_flag_makes_the_apis_image_at_that_resolution(pipe, files, tmp_path, capsys, pre):
    """--control-processor-res 96 gives the API's image at processor_res=96, pixel for pixel, and says 96; another
    resolution gives another image (the flag reaches the map)."""
    got, info = _cli(files, tmp_path, capsys, "--control-image", str(files["photo"]), "--control-preprocessor", pre,
                     "--control-processor-res", "96")
    want, settings = _api(pipe, _unit(files, preprocessor=pre, processor_res=96))
    assert np.array_equal(got, want)
    assert f"Module: {pre}, Model: controlnet, Weight: 1, Resize Mode: Crop and Resize, Processor Res: 96" in info
    assert "Pixel Perfect: False" in info and "Processor Res: 96" in settings["ControlNet 0"]
    other, _ = _api(pipe, _unit(files, preprocessor=pre, processor_res=48))
    assert not np.array_equal(other, got)


def test_the_default_is_512_and_none_is_the_images_own_size(pipe, files, tmp_path, capsys):
    """Without the flag a unit's canny runs at 512 (the extension's default; the API's None would be the image's own
    48): the API's image at processor_res=512, infotext 512; ``none`` is the API's processor_res=None, and its infotext
    says the image's shorter side, 48 (what ran), not the output's 64."""
    got, info = _cli(files, tmp_path, capsys, "--control-image", str(files["photo"]), "--control-preprocessor", "canny")
    want, _ = _api(pipe, _unit(files, preprocessor="canny", processor_res=512))
    assert np.array_equal(got, want) and "Processor Res: 512," in info
    own, info = _cli(files, tmp_path, capsys, "--control-image", str(files["photo"]), "--control-preprocessor", "canny",
                     "--control-processor-res", "None")
    want, settings = _api(pipe, _unit(files, preprocessor="canny"))
    assert np.array_equal(own, want) and "Processor Res: 48," in info
    assert "Processor Res: 48," in settings["ControlNet 0"]  # the API writes what ran, as the CLI
    assert int(np.abs(own.astype(int) - got).max()) > 3  # 512 is not the image's own size here
    _, settings = _api(pipe, _unit(files))  # a preprocessor that reads no resolution: the output's short side
    assert "Module: none, Model: controlnet, Weight: 1, Resize Mode: Crop and Resize, Processor Res: 64," in \
        settings["ControlNet 0"]


def test_pixel_perfect_once_and_per_unit(pipe, files, tmp_path, capsys):
    """--control-pixel-perfect is the API's pixel_perfect=True (48x80 covering 64x64: 64); per unit (on, off) with
    --control-processor-res given once, the resolution is the second unit's only, as the API runs them."""
    got, info = _cli(files, tmp_path, capsys, "--control-image", str(files["photo"]), "--control-preprocessor", "canny",
                     "--control-pixel-perfect")
    want, _ = _api(pipe, _unit(files, preprocessor="canny", pixel_perfect=True))
    assert np.array_equal(got, want)
    assert "Processor Res: 64," in info and "Pixel Perfect: True" in info
    got, info = _cli(files, tmp_path, capsys, "--control-image", str(files["photo"]), "--control-image",
                     str(files["other"]), "--controlnet", "controlnet", "--controlnet", "controlnet",
                     "--control-preprocessor", "canny", "--control-scale", "0.6", "--control-pixel-perfect", "on",
                     "--control-pixel-perfect", "off", "--control-processor-res", "80")
    want, _ = _api(pipe, _unit(files, preprocessor="canny", scale=0.6, pixel_perfect=True),
                   _unit(files, "other", preprocessor="canny", scale=0.6, processor_res=80))
    assert np.array_equal(got, want)
    lines = info.split("\n")
    assert "Processor Res: 64," in lines[0] and "Pixel Perfect: True" in lines[0], info
    assert "Processor Res: 80," in lines[1] and "Pixel Perfect: False" in lines[1], info


def test_a_model_backed_preprocessor_at_the_flags_resolution(pipe, files, tmp_path, capsys):
    """softedge_teed's network at --control-processor-res 72: the API's image, pixel for pixel."""
    got, info = _cli(files, tmp_path, capsys, "--control-image", str(files["photo"]), "--control-preprocessor",
                     "softedge_teed", "--control-preprocessor-models", str(files["teed"]),
                     "--control-processor-res", "72")
    want, _ = _api(pipe, _unit(files, preprocessor="softedge_teed", processor_res=72,
                               preprocessor_models=files["teed"]))
    assert np.array_equal(got, want) and "Module: softedge_teed" in info and "Processor Res: 72," in info
    other, _ = _api(pipe, _unit(files, preprocessor="softedge_teed", preprocessor_models=files["teed"]))
    assert not np.array_equal(other, got)


def test_dry_run_works_the_map_out_without_the_network(pipe, files, capsys):
    """A run plan (``--dry-run``, ``pipe.plan``) compiles and runs no preprocessor network: nothing is kept after it
    (a run keeps the last one), its line says the resolution, and the map it plans has the size the network's has; a
    resolution the network would refuse is refused by the plan too, in the flag's words."""
    from sdrt.cli import main
    from sdrt.pipelines import controlnet as cn
    from sdrt.pipelines.controlmaps import ControlImageError

    preprocessors.release()
    args = ["generate", str(MODEL), "a house", *FLAGS, "--backend", files["backend"], "--control-image",
            str(files["photo"]), "--control-preprocessor", "softedge_teed", "--control-preprocessor-models",
            str(files["teed"]), "--dry-run"]
    assert main([*args, "--control-processor-res", "72"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "preprocessor softedge_teed at 72" in out and "preprocessor:teed" in out, out
    assert preprocessors.kept_detectors() == []  # no network compiled for the plan
    unit = _unit(files, preprocessor="softedge_teed", processor_res=72, preprocessor_models=files["teed"])
    pipe.plan("a house", controlnets=[unit], **KW)
    assert preprocessors.kept_detectors() == []
    for res in (72, 100, None):  # the planned map's size is the made one's
        made = cn.detect(_unit(files, preprocessor="softedge_teed", processor_res=res,
                               preprocessor_models=files["teed"]), 64, 64, "controlnets[0]")
        token = cn.PLANNING.set(True)
        try:
            planned = cn.detect(_unit(files, preprocessor="softedge_teed", processor_res=res,
                                      preprocessor_models=files["teed"]), 64, 64, "controlnets[0]")
        finally:
            cn.PLANNING.reset(token)
        assert planned.shape == made.shape and planned.dtype == made.dtype, res
    strip = _unit(files, "strip", preprocessor="softedge_teed", processor_res=2048, preprocessor_models=files["teed"])
    preprocessors.release()
    with pytest.raises(ControlImageError, match="16384x2048") as exc:
        pipe.plan("a house", controlnets=[strip], **KW)
    assert exc.value.where == "controlnets[0] processor_res"
    assert preprocessors.kept_detectors() == []
    # pixel perfect makes 64 of the 1x300 line: 19200 pixels long on the way, refused by the plan in the flag's words
    assert main(["generate", str(MODEL), "a house", *FLAGS, "--backend", files["backend"], "--control-image",
                 str(files["line"]), "--control-preprocessor", "canny", "--control-pixel-perfect", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "19200 pixels long" in err and "Where: --control-pixel-perfect." in err, err


@pytest.mark.parametrize("flags, words", [
    (["--control-processor-res", "0"], "error: --control-processor-res must be a whole number of pixels from 1 to "
                                       "8192, or none (the image's own size), got '0'. Where: --control-processor-res. "
                                       "What to do: pass e.g. --control-processor-res 512"),
    (["--control-processor-res", "-3"], "error: --control-processor-res must be a whole number of pixels from 1 to "
                                        "8192, or none (the image's own size), got '-3'"),
    (["--control-processor-res", "abc"], "got 'abc'. Where: --control-processor-res."),
    (["--control-processor-res", "512.5"], "got '512.5'. Where: --control-processor-res."),
    (["--control-processor-res", "8193"], "from 1 to 8192, or none (the image's own size), got '8193'"),
    (["--control-preprocessor", "none", "--control-processor-res", "64"],
     "error: --control-processor-res: the none preprocessor reads no resolution. Where: --control-processor-res."),
    (["--control-preprocessor", "tile_resample", "--control-pixel-perfect"],
     "error: --control-pixel-perfect: the tile_resample preprocessor reads no resolution."),
    (["--control-processor-res", "64", "--control-pixel-perfect"],
     "error: --control-processor-res is given and every ControlNet whose preprocessor reads it is "
     "--control-pixel-perfect"),
    (["--control-processor-res", "64", "--control-processor-res", "96"],
     "error: 2 --control-processor-res values for 1 ControlNet(s). Where: --control-processor-res."),
])
def test_bad_values_are_one_line_errors_naming_the_flag(files, capsys, flags, words):
    from sdrt.cli import main

    pre = [] if "--control-preprocessor" in flags else ["--control-preprocessor", "canny"]
    rc = main(["generate", str(MODEL), "a house", "--steps", "1", "--backend", "nosuch", "--control-image",
               str(files["photo"]), *pre, *flags])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("error: ") and words in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit):  # a word that is no value of the flag is not taken as one: in one line too
        main(["generate", str(MODEL), "a house", "--control-image", str(files["photo"]), "--control-pixel-perfect",
              "maybe"])
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized arguments: maybe (--control-pixel-perfect takes on or off, or nothing "
                          "for on: 'maybe' is neither") and err.count("\n") == 1, err


def test_resolutions_a_network_or_a_side_cannot_take_are_refused_before_the_model_loads(files, capsys):
    """A 16x128 strip at 2048 would be 2048x16384 for TEED (MAX_NET_PIXELS: 2048x8192); a 1x300 line at the default
    512 would be 153600 pixels long on the way: one line each, naming the flag, before any model loads (--backend
    nosuch is never reached)."""
    from sdrt.cli import main

    base = ["generate", str(MODEL), "a house", "--steps", "1", "--backend", "nosuch"]
    rc = main([*base, "--control-image", str(files["strip"]), "--control-preprocessor", "softedge_teed",
               "--control-preprocessor-models", str(files["teed"]), "--control-processor-res", "2048"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --control-processor-res 2048: the control image at processor resolution 2048 would "
                          "be 16384x2048 for the preprocessor's network, above 16777216 pixels"), err
    assert "Where: --control-processor-res." in err
    rc = main([*base, "--control-image", str(files["line"]), "--control-preprocessor", "canny"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "153600 pixels long" in err, err
    assert err.startswith("error: the default --control-processor-res 512:") and "none: the image's own size" in err
    rc = main([*base, "--control-image", str(files["photo"]), "--control-image", str(files["strip"]),
               "--control-preprocessor", "softedge_teed", "--control-preprocessor-models", str(files["teed"]),
               "--control-processor-res", "64", "--control-processor-res", "2048"])
    err = capsys.readouterr().err
    assert rc == 1 and "Where: the 2nd --control-processor-res." in err, err  # the photo's 64 is fine: the strip's


@pytest.mark.parametrize("flag", [["--control-processor-res", "512"], ["--control-pixel-perfect"]])
def test_the_flags_need_a_control_image(capsys, flag):
    from sdrt.cli import main

    rc = main(["generate", "a cat", "--steps", "1", "--backend", "nosuch", *flag])
    err = capsys.readouterr().err
    assert rc == 1 and f"{flag[0]} needs a --control-image" in err and err.count("\n") == 1, err


def test_help_says_the_default():
    from sdrt.cli import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "generate" in a.choices)
    text = " ".join(sub.choices["generate"].format_help().split())
    assert "--control-processor-res N|none" in text and "default 512" in text and "--control-pixel-perfect" in text
