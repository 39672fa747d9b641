"""``sdrt generate``: the embedded demo model, the PNG's A1111 parameters (read back with Pillow), errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, refs, register

from sdrt.cli import main
from sdrt.pipelines import DEMO_MODEL, load
from sdrt.pipelines.png import read_parameters


@pytest.fixture(autouse=True)
def _reference():
    register("reference")


def test_generate_with_the_embedded_model_writes_a1111_parameters(tmp_path: Path, capsys) -> None:
    Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")
    out = tmp_path / "cat.png"
    rc = main(["generate", "a red cat, sunset", "--negative", "blurry", "--steps", "3", "--seed", "42",
               "--sampler", "Euler a", "--backend", "reference", "-o", str(out)])
    assert rc == 0
    assert f"wrote {out} (seed 42)" in capsys.readouterr().out
    with Image.open(out) as img:
        text = img.text["parameters"]
        assert img.size == (64, 64)
        pixels = np.asarray(img.convert("RGB"))
    model_hash = load(DEMO_MODEL, backend="reference").model_hash
    assert text == ("a red cat, sunset\nNegative prompt: blurry\n"
                    "Steps: 3, Sampler: Euler a, Schedule type: Uniform, CFG scale: 7, Seed: 42, Size: 64x64, "
                    f"Model hash: {model_hash}, Model: demo-sd, RNG: CPU")  # A1111 reads no RNG field as GPU
    api = load(DEMO_MODEL, backend="reference")("a red cat, sunset", "blurry", steps=3, seed=42, sampler="Euler a")[0]
    assert np.array_equal(pixels, api)


def test_generate_folder_img2img_batch(tmp_path: Path, capsys) -> None:
    Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")
    init = tmp_path / "init.png"
    Image.fromarray(refs("tiny-sd15")["init_image"]).save(init)
    out = tmp_path / "out.png"
    rc = main(["generate", str(DATA / "tiny-sd15"), "a cat", "--init-image", str(init), "--strength", "0.5",
               "--steps", "2", "--batch", "2", "--seed", "1", "--cfg", "1", "--backend", "reference", "-o", str(out)])
    assert rc == 0
    written = sorted(p.name for p in tmp_path.glob("out-*.png"))
    assert written == ["out-1.png", "out-2.png"]
    with Image.open(tmp_path / "out-2.png") as img:
        assert "Denoising strength: 0.5" in img.text["parameters"] and "Batch pos: 1" in img.text["parameters"]


def test_a_model_name_with_a_comma_is_json_quoted_in_the_png(tmp_path: Path, capsys) -> None:
    """A1111 quotes a value holding a comma (infotext_utils.quote), so that its reader does not end the value there."""
    folder = tmp_path / "dreamshaper_8, pruned"
    shutil.copytree(DATA / "tiny-sd15", folder)
    out = tmp_path / "out.png"
    rc = main(["generate", str(folder), "a cat", "--steps", "1", "--seed", "3", "--backend", "reference",
               "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    line = read_parameters(out).splitlines()[-1]
    assert line.endswith(', Model: "dreamshaper_8, pruned", RNG: CPU'), line


@pytest.mark.parametrize(("args", "message"), [
    (["/no/such/folder", "a cat", "--width", "65"], "width 65 is not a multiple of 8"),
    (["/no/such/folder", "a cat", "--sampler", "Euler b"], "unknown sampler 'Euler b'"),
    (["/no/such/folder", "a cat", "--sampler", "Euler b"], "use one of the known names. A1111 labels: Euler, Euler a"),
    (["/no/such/folder", "a cat", "--sampler", "Restart"], "the sampler 'Restart' is not available in sdrt"),
    (["/no/such/folder", "a cat", "--sampler", "euler_cfg_pp"], "use the nearest sdrt has: euler. A1111 labels"),
    (["/no/such/folder", "a cat", "--init-image", "/no/such.png"], "the init image file does not exist"),
    (["/no/such/folder", "a cat"], "the model folder does not exist"),
    (["a", "b", "c"], "expected [MODEL] PROMPT, got 3 words"),
    (["a cat", "-o", "/no/such/dir/x.png"], "the output folder does not exist"),
    # before any model loads (the folder does not exist), in the command's words: a prompt byte that is not
    # UTF-8 (Python reads argv with surrogateescape) failed only when the infotext was written
    (["/no/such/folder", "caf\udce9 red circle", "-o", "a.png"],
     "the prompt is not UTF-8 text: byte 0xe9 at byte 3 (read as U+DCE9). Where: PROMPT."),
    (["/no/such/folder", "x", "--negative", "\udcff", "-o", "a.jpg"],
     "the negative prompt is not UTF-8 text: byte 0xff at byte 0 (read as U+DCFF). Where: --negative."),
    (["/no/such/folder", "x", "--steps", "100000000000"], "--steps 100000000000 is above the limit of 10000. Where: --steps"),
    (["/no/such/folder", "x", "--batch", "10000000000"], "--batch 10000000000 is above the limit of 256"),
    (["/no/such/folder", "x", "--batch-count", "10000000000"], "--batch-count 10000000000 is above the limit of 10000"),
    (["/no/such/folder", "x", "--cfg", "1e308"], "cfg must be a finite number from 0 to 100, got 1e+308. Where: --cfg"),
    (["/no/such/folder", "x", "--seed", str(2**64)], "seed 18446744073709551616 is out of range. Where: --seed"),
])
def test_errors_are_one_line_without_traceback(args: list[str], message: str, capsys) -> None:
    assert main(["generate", *args, "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_generate_writes_the_compile_cache_after_the_image(tmp_path: Path, capsys, monkeypatch) -> None:
    """The image is written first; then the command says it writes the compile cache, and returns once every
    part's entry is in place (the next run loads them)."""
    register("openvino")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SDRT_PRECISION", "bf16")  # a float32 compile stores as it compiles
    out = tmp_path / "cat.png"
    assert main(["generate", str(DATA / "tiny-sd15"), "a cat", "--steps", "1", "--seed", "3", "--backend",
                 "openvino", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert out.is_file() and "writing the compile cache for the next run" in captured.err
    entries = [p for p in (tmp_path / "cache" / "compiled" / "openvino").glob("*/model.blob")
               if not p.parent.name.startswith(".")]
    assert len(entries) >= 3


def test_no_compile_cache_message_when_the_cache_cannot_be_written(tmp_path: Path, capsys, monkeypatch) -> None:
    """'writing the compile cache for the next run' was printed with SDRT_CACHE_DIR naming a file (or a folder
    this user cannot write in); the store's one warning says why nothing is written."""
    register("openvino")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SDRT_CACHE_DIR", str(blocker))
    monkeypatch.setenv("SDRT_PRECISION", "bf16")  # stores deferred to the end of the run, as above
    out = tmp_path / "cat.png"
    assert main(["generate", str(DATA / "tiny-sd15"), "a cat", "--steps", "1", "--backend", "openvino",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and "writing the compile cache" not in err and blocker.read_text() == "not a folder"


# -- init images of any size (sdrt.pipelines.images.fit_image) -----------------------------------------------------
def _png(path: Path, w: int, h: int, gray: bool = False) -> Path:
    Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")
    rng = np.random.default_rng(w * h)
    pixels = rng.integers(0, 256, (h, w) if gray else (h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _fit_lines(caplog) -> list[str]:
    """The fit's line (``sdrt generate`` logs WARNING lines to stderr as ``WARNING sdrt.pipelines: ...``; under
    pytest its log capture holds them)."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("the init image is")]


def test_generate_fits_a_photo_of_any_size_and_says_so(tmp_path: Path, capsys, caplog) -> None:
    """A 100x70 photo (and its mask) on the fixed 64x64 tiny-sd15: it was refused ("not a multiple of 8 ... crop
    or resize it to 96x64"); now it is fitted to the model's size, in one line on stderr."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")
    init, mask, out = _png(tmp_path / "photo.png", 100, 70), _png(tmp_path / "mask.png", 100, 70, True), tmp_path / "o.png"
    rc = main(["generate", str(DATA / "tiny-sd15"), "a cat", "--init-image", str(init), "--mask", str(mask),
               "--steps", "2", "--seed", "1", "--backend", "reference", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert _fit_lines(caplog) == ["the init image is 100x70 and this model makes 64x64 images only: Just Resize "
                                  "fits it (stretched to the size), and the mask with it"]
    with Image.open(out) as img:
        assert img.size == (64, 64) and "Size: 64x64" in img.text["parameters"]


def test_generate_fits_the_photo_to_the_size_asked_with_the_resize_mode(tmp_path: Path, capsys, caplog) -> None:
    Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")
    init, out = _png(tmp_path / "photo.png", 300, 200), tmp_path / "o.png"
    rc = main(["generate", str(DATA / "tiny-sdxl-dyn"), "a cat", "--init-image", str(init), "--width", "64",
               "--height", "96", "--resize-mode", "crop and resize", "--steps", "2", "--seed", "1", "--backend",
               "reference", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert _fit_lines(caplog) == ["the init image is 300x200 and 64x96 was asked: Crop and Resize fits it (scaled to "
                                  "cover the size, the overflow cropped)"]
    with Image.open(out) as img:
        assert img.size == (64, 96) and "Size: 64x96" in img.text["parameters"]
        assert "Resize" not in img.text["parameters"]  # A1111's infotext records the size, not the mode


@pytest.mark.parametrize(("extra", "message"), [
    (["--resize-mode", "stretch"], "unknown resize mode 'stretch'. Where: --resize-mode. What to do: use one of "
                                   "'Just Resize', 'Crop and Resize', 'Resize and Fill', 'Just Resize (latent upscale)'"),
    (["--resize-mode", "7"], "unknown resize mode 7. Where: --resize-mode"),
])
def test_a_bad_resize_mode_is_one_line_before_the_model_loads(tmp_path: Path, capsys, extra, message) -> None:
    init, out = _png(tmp_path / "photo.png", 100, 70), tmp_path / "keep.png"
    out.write_bytes(b"not to be destroyed")
    assert main(["generate", "/no/such/folder", "a cat", "--init-image", str(init), *extra, "--backend",
                 "reference", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    assert out.read_bytes() == b"not to be destroyed"


def test_resize_mode_without_an_init_image_is_refused(capsys) -> None:
    assert main(["generate", "/no/such/folder", "a cat", "--resize-mode", "1", "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "--resize-mode fits an init image (and its mask) to the size, and none was given. Where: --resize-mode. " \
           "What to do: pass --init-image too, or leave --resize-mode unset." in err and err.count("\n") == 1


def test_a_photo_too_large_for_memory_at_its_own_size_names_the_size_to_ask(tmp_path: Path, capsys) -> None:
    """No --width/--height: the picture's own size, as diffusers keeps it; above the model's size and beyond the
    memory budget it fails before anything runs, in one line naming the flags to pass, and no file is written."""
    init, out = _png(tmp_path / "photo.png", 128, 64), tmp_path / "keep.png"
    out.write_bytes(b"not to be destroyed")
    assert main(["generate", str(DATA / "tiny-sdxl-dyn"), "a cat", "--init-image", str(init), "--memory", "4MB",
                 "--steps", "2", "--backend", "reference", "-o", str(out)]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("backend ")]
    assert len(err) == 1 and "the init image is 128x64, and with no width or height given it runs at 128x64" in err[0]
    assert "Where: --init-image. What to do: pass --width 88 and --height 48" in err[0], err
    assert out.read_bytes() == b"not to be destroyed"


def test_control_resize_takes_the_same_names_as_resize_mode(tmp_path: Path, capsys) -> None:
    """--control-resize took its three names in one spelling (argparse choices); it reads them as --resize-mode
    does, and a wrong one is refused in its own words before any model loads."""
    from sdrt.cli import build_parser
    from sdrt.cli.generate_toolbox import options

    image = _png(tmp_path / "edges.png", 64, 64)
    args = build_parser().parse_args(["generate", "a cat", "--control-image", str(image), "--control-resize",
                                      "resize_and_fill"])
    assert options(args)["controlnets"][0].resize == "Resize and Fill"
    assert main(["generate", "/no/such/folder", "a cat", "--control-image", str(image), "--control-resize", "fit",
                 "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "unknown resize mode 'fit'. Where: --control-resize. What to do: use one of 'Just Resize', 'Crop and " \
           "Resize', 'Resize and Fill' (or 0 to 2, A1111's numbers)" in err and err.count("\n") == 1, err


def test_a_phone_photo_with_no_size_names_the_size_to_ask(tmp_path: Path, capsys) -> None:
    """More than 4 times the model's pixels with no --width/--height: one line before the model loads anything."""
    init = _png(tmp_path / "photo.png", 192, 128)
    assert main(["generate", str(DATA / "tiny-sdxl-dyn"), "a cat", "--init-image", str(init), "--steps", "2",
                 "--backend", "reference", "-o", str(tmp_path / "o.png")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("backend ")]
    assert len(err) == 1 and "more than 4 times the pixels of this model's 64x64. Where: --init-image. What to do: " \
        "pass --width 80 and --height 56" in err[0], err
    assert not (tmp_path / "o.png").exists()
