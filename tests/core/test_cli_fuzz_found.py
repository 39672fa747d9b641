"""Defects tests/fuzz/test_fuzz_cli.py and test_fuzz_pictures.py found, each pinned by a hand-written case: every
one was a traceback (or a misleading line) where the command owes one line naming the flag."""

from __future__ import annotations

import pytest

from sdrt.cli import main


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("args, flag", [
    (["cache", "list", "--backend=--"], "'--'"),
    (["generate", "a fox", "--steps=--", "--dry-run"], "--steps"),
    (["generate", "a fox", "--sampler=--", "--dry-run"], "--sampler"),
    (["generate", "a fox", "--lora=--", "--dry-run"], "--lora"),
])
def test_an_option_given_the_value_dashdash_is_that_value_not_an_empty_list(tmp_path, capsys, args, flag):
    """``--backend=--``: Python 3.11's argparse took the ``--`` for the end of the options and gave the option an
    empty list, a TypeError traceback in ``sdrt cache``; now ``--`` is the value, refused in the flag's words."""
    if args[0] == "cache":
        args = [*args, "--cache-dir", str(tmp_path / "cache")]
    rc = main(args) if args[0] != "generate" else _exit(args)
    assert rc in (1, 2)
    line = _one_error(capsys)
    assert flag in line, line


def _exit(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exc:  # argparse's refusal
        return int(exc.code)


DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("flag, words", [
    ("--mask-blur", "--mask-blur must be an integer"), ("--resize-mode", "unknown resize mode"),
    ("--control-resize", "unknown resize mode"), ("--control-mode", "is not a ControlNet control mode"),
    ("--preview-size", "--preview-size must be a whole number"), ("--preview-every", "--preview-every must be a whole"),
])
def test_a_superscript_digit_is_refused_in_the_flags_words_not_a_traceback(registry, tmp_path, capsys, flag, words):
    """``--mask-blur ²``: ``"²".isdigit()`` is True and ``int("²")`` a ValueError, a traceback from each flag that
    read its number with ``isdigit``; ``isdecimal`` is what ``int`` reads (Arabic-Indic digits too)."""
    from PIL import Image

    picture = tmp_path / "in.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(picture)
    (tmp_path / "previews").mkdir()
    args = ["generate", str(DATA / "pipelines" / "tiny-sd15-controlnet"), "a fox", "--init-image", str(picture),
            "--mask", str(picture), "--control-image", str(picture), "--preview-dir", str(tmp_path / "previews"),
            flag, "²", "--dry-run", "--backend", "reference"]
    assert main(args) == 1
    line = _one_error(capsys)
    assert words in line and f"Where: {flag}." in line, line


@pytest.mark.parametrize("flag", ["--init-image", "--mask", "--control-image", "IMAGE"])
def test_a_picture_that_cannot_be_read_is_named_by_its_flag(registry, tmp_path, capsys, flag):
    """A broken picture said "cannot read the init image as an image ... Where: /x/in.png": the file, never the flag
    that gave it (nor, in the API, the argument); now "Where: --init-image /x/in.png"."""
    from PIL import Image

    good = tmp_path / "good.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(good)
    bad = tmp_path / "bad.png"
    bad.write_bytes(good.read_bytes()[:40])
    if flag == "IMAGE":
        args = ["upscale", str(bad), "-m", str(DATA / "upscalers" / "compact_x4.safetensors"), "-o",
                str(tmp_path / "o.png")]
    else:
        args = ["generate", str(DATA / "pipelines" / "tiny-sd15-controlnet"), "a fox",
                *(["--init-image", str(good)] if flag == "--mask" else []), flag, str(bad), "--dry-run"]
    assert main([*args, "--backend", "reference"]) == 1
    line = _one_error(capsys)
    assert f"Where: {flag} {bad}." in line, line


def test_the_api_names_the_argument_of_a_picture_that_cannot_be_read(tmp_path):
    from PIL import Image

    from sdrt import pipelines
    from sdrt.errors import InputError

    good = tmp_path / "good.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(good)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a picture")
    for kwargs, where in (({"init_image": bad}, "init_image"), ({"init_image": good, "mask": bad}, "mask")):
        with pytest.raises(InputError) as info:
            pipelines.validate("a fox", **kwargs)
        assert f"Where: {where} {bad}." in str(info.value), str(info.value)


@pytest.mark.parametrize("flag", ["--init-image", "--mask", "--control-image", "--vae", "--text-encoder"])
@pytest.mark.parametrize("special", ["devnull", "fifo"])
def test_a_device_or_fifo_given_as_a_file_is_said_to_be_one_not_missing(registry, tmp_path, capsys, flag, special):
    """``--init-image /dev/null`` (or a FIFO) said "the init image file does not exist", which it does; now it is
    named for what it is, as --refiner and MODEL already said it."""
    import os

    from PIL import Image

    path = os.devnull
    if special == "fifo":
        path = str(tmp_path / "pipe.png")
        os.mkfifo(path)
    good = tmp_path / "good.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(good)
    extra = ["--init-image", str(good)] if flag == "--mask" else []
    args = ["generate", str(DATA / "pipelines" / "tiny-sd15-controlnet"), "a fox", *extra, flag, path, "--dry-run",
            "--backend", "reference"]
    assert main(args) == 1
    line = _one_error(capsys)
    kind = "a character device" if special == "devnull" else "a FIFO (named pipe)"
    assert f"{path} is {kind}" in line and "does not exist" not in line and flag in line, line


def test_a_truncated_jpeg_is_said_to_be_incomplete_not_the_wrong_format(tmp_path):
    """A JPEG cut short is Pillow's "Truncated File Read" (a PNG's is "image file is truncated"): the fix said "use a
    PNG or JPEG file" of a JPEG; now, as for a PNG, that the file is incomplete."""
    import io

    from PIL import Image

    from sdrt import pipelines
    from sdrt.errors import InputError

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (90, 30, 200)).save(buf, "JPEG")
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(InputError) as info:
        pipelines.validate("a fox", init_image=cut)
    assert "the file is incomplete" in str(info.value), str(info.value)


def test_pillows_warning_on_a_damaged_picture_is_one_log_line_naming_the_flag(registry, tmp_path, capsys, caplog):
    """A JPEG whose EXIF block is cut short is read (as viewers read it), and Pillow warns "Corrupt EXIF data": that
    was a Python warning, two lines on stderr (Pillow's file and line, then its source) for each of the three reads of
    a run; now one log line, naming --init-image and the file, once."""
    import io
    import logging
    import warnings

    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (90, 30, 200)).save(buf, "JPEG", exif=exif.tobytes()[:14])  # the EXIF cut short
    path = tmp_path / "damaged.jpg"
    path.write_bytes(buf.getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Python warning out of the run fails it
        with caplog.at_level(logging.WARNING, logger="sdrt"):
            rc = main(["generate", "a fox", "--init-image", str(path), "--strength", "1", "--steps", "1", "--backend",
                       "reference", "-o", str(tmp_path / "out.png")])
    assert rc == 0, capsys.readouterr().err
    said = [r.getMessage() for r in caplog.records if "Corrupt EXIF data" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"--init-image {path}: "), said


@pytest.mark.parametrize("fmt, suffix", [("GIF", ".gif"), ("PNG", ".png"), ("WEBP", ".webp")])
def test_an_animated_picture_is_its_first_frame_and_the_run_says_so(tmp_path, caplog, fmt, suffix):
    """An animated GIF, APNG or WebP is read as its first frame (as A1111 and diffusers' load_image read it), and
    that is said in one log line: the other frames were dropped without a word."""
    import logging

    import numpy as np
    from PIL import Image

    from sdrt.pipelines.images import to_rgb

    frames = [Image.new("RGB", (16, 16), c) for c in ((0, 200, 0), (200, 0, 0), (0, 0, 200))]
    path = tmp_path / f"anim{suffix}"
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], duration=50, loop=0, lossless=True)
    with caplog.at_level(logging.WARNING, logger="sdrt"):
        rgb = to_rgb(path)
    assert np.abs(rgb.astype(int) - [0, 200, 0]).max() <= 2  # the first frame
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"init_image {path}: an animation of 3 frames: its first frame is used"], said


@pytest.mark.parametrize("flags, words", [
    (["--refiner-switch-at", "nan"], "--refiner-switch-at without --refiner"),
    (["--refiner-switch-at", "0.5"], "--refiner-switch-at without --refiner"),
    (["--refiner", str(DATA / "pipelines" / "tiny-sdxl-refiner"), "--refiner-switch-at", "0"],
     "--refiner-switch-at must be above 0"),
])
def test_plan_refuses_a_refiner_switch_it_would_not_use(capsys, flags, words):
    """``sdrt plan MODEL --refiner-switch-at X`` without --refiner planned as if it were not given, whatever X (nan
    too), and ``--refiner-switch-at 0`` with one was read as not given (the default 0.8); generate refuses both."""
    assert main(["plan", str(DATA / "pipelines" / "tiny-sdxl"), *flags]) == 1
    line = _one_error(capsys)
    assert words in line, line


def _unblock(fifo: str) -> None:
    """Open ``fifo`` for writing, and close it, whenever a reader waits on it: a command that opens it for reading
    gets an empty file, not a wait forever (what it then says fails the test; it does not hang it)."""
    import os
    import threading
    import time

    def run() -> None:
        while os.path.exists(fifo):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader yet
                pass
            time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()


@pytest.mark.parametrize("command", ["quantize", "strip", "run"])
@pytest.mark.parametrize("special", ["zero", "fifo"])
def test_a_device_or_fifo_as_the_model_is_refused_before_it_is_read(tmp_path, capsys, command, special):
    """``sdrt quantize /dev/zero`` read the device until memory ran out (the OOM killer ended it, or a MemoryError
    traceback under a limit); a FIFO waited for a writer forever. Both are named for what they are, at once."""
    import os
    import resource

    path = "/dev/zero"
    if special == "fifo":
        path = str(tmp_path / "pipe.onnx")
        os.mkfifo(path)
        _unblock(path)
    extra = {"quantize": ["--to", "int8"], "strip": [], "run": ["--backend", "reference"]}[command]
    out = str(tmp_path / ("out.npz" if command == "run" else "out.onnx"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)  # /dev/zero read whole: a MemoryError at 4 GiB more
    with open("/proc/self/statm") as f:
        limit = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + (4 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (min(limit, hard) if hard != resource.RLIM_INFINITY else limit, hard))
    try:
        rc = main([command, path, *extra, "-o", out])
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert rc == 1
    line = _one_error(capsys)
    kind = "a character device" if special == "zero" else "a FIFO (named pipe)"
    assert f"is {kind}" in line, line


@pytest.mark.parametrize("arg", ["init_image", "mask"])
def test_a_lazily_opened_broken_pillow_image_is_refused_naming_the_argument(registry, tmp_path, arg):
    """An app that passes ``Image.open(path)`` of a broken file: Pillow decodes it only when sdrt converts it, and its
    OSError ("image file is truncated", "broken data stream") came out of generate() as it was, a traceback."""
    from PIL import Image

    from sdrt import pipelines
    from sdrt.errors import InputError

    good = tmp_path / "good.png"
    Image.new("RGB", (64, 64), (90, 30, 200)).save(good)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:80])
    kwargs = {"init_image": Image.open(cut)} if arg == "init_image" else {
        "init_image": Image.open(good), "mask": Image.open(cut)}
    with pipelines.load(pipelines.DEMO_MODEL, backend="reference") as pipe:
        with pytest.raises(InputError) as info:
            pipe.generate("a fox", steps=1, strength=1.0, **kwargs)
    text = str(info.value)
    assert text.startswith("cannot decode the") and f"Where: {arg}." in text and "incomplete" in text, text


def test_an_instruct_pix2pix_model_runs_one_step_without_a_strength(registry, tmp_path, capsys):
    """InstructPix2Pix without --strength runs every step from noise (diffusers'), so the default strength 0.75 is
    not its: --steps 1 was refused for "the default strength 0.75 of 1 step leaves no step to run" before the model
    was known. The refusal stays for a model that does use the default strength."""
    from PIL import Image

    picture = tmp_path / "in.png"
    Image.new("RGB", (64, 64), (90, 30, 200)).save(picture)
    base = ["a fox", "--init-image", str(picture), "--steps", "1", "--backend", "reference", "-o",
            str(tmp_path / "o.png")]
    assert main(["generate", str(DATA / "pipelines" / "tiny-sd15-ip2p"), *base]) == 0, capsys.readouterr().err
    assert main(["generate", *base]) == 1  # the demo model: img2img at the default 0.75
    assert "the default strength 0.75 of 1 step leaves no step to run. Where: --steps." in _one_error(capsys)
    from sdrt import pipelines

    with pipelines.load(DATA / "pipelines" / "tiny-sd15-ip2p", backend="reference") as pipe:  # the API alike
        assert pipe.generate("a fox", init_image=picture, steps=1, seed=1).images[0].shape == (64, 64, 3)


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_file_name_stdout_cannot_encode_is_escaped_not_a_traceback(registry, tmp_path, monkeypatch, capsys, encoding):
    """``-o $'\\xff.png'`` (a name of non-UTF-8 bytes, a surrogate in Python) with a strict stdout (a UTF-8 locale
    other than C.UTF-8, or PYTHONIOENCODING): the image was written, then "wrote ..." was a UnicodeEncodeError
    traceback and exit 1. Now the name is escaped on stdout, as stderr escapes it."""
    import io
    import sys

    name = "\udcff-out.png" if encoding == "utf-8" else "ü-out.png"
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding=encoding, errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    rc = main(["generate", "a fox", "--steps", "1", "--backend", "reference", "-o", str(tmp_path / name)])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err, err
    said = raw.getvalue().decode(encoding)
    assert said.startswith(f"wrote {tmp_path}/") and ("\\udcff-out.png" in said or "\\xfc-out.png" in said), said


#: a 16x16 PNG whose IDAT says 0 bytes, so that Pillow reads compressed data as the next chunk's header
BROKEN_PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00\x90\x91h6"
              b"\x00\x00\x00\x00IDATx\x9ccd``\x10`\xe0 \x1e\xb10\x08p00\x90\x80F5\x8cj\x18:\x1a\x00\xb7\xb8\n\x16\xa7"
              b"\xe9\x02r\x00\x00\x00\x00IEND\xaeB`\x82")


@pytest.mark.parametrize("flag", ["--init-image", "--control-image", "IMAGE"])
def test_a_png_pillow_calls_broken_is_refused_in_one_line(registry, tmp_path, capsys, flag):
    """Found by test_fuzz_pictures: Pillow raises SyntaxError("broken PNG file (chunk ...)") for a PNG whose chunk
    lengths lie, which the picture reader did not catch (OSError and ValueError only): a traceback."""
    path = tmp_path / "broken.png"
    path.write_bytes(BROKEN_PNG)
    if flag == "IMAGE":
        args = ["upscale", str(path), "-m", str(DATA / "upscalers" / "compact_x4.safetensors"), "-o",
                str(tmp_path / "o.png")]
    else:
        args = ["generate", str(DATA / "pipelines" / "tiny-sd15-controlnet"), "a fox", flag, str(path), "--dry-run"]
    assert main([*args, "--backend", "reference"]) == 1
    line = _one_error(capsys)
    assert "broken PNG file" in line and f"Where: {flag} {path}." in line, line


def test_a_warning_about_the_control_image_names_its_flag(registry, tmp_path, caplog):
    """The run's warnings speak the command's words through the names main holds (caller_words); generate replaced
    that dict with a new one holding --control-image's, so a warning about a ControlNet's picture said
    "controlnets[0] /x/c.gif: an animation of 3 frames" on the command line (found by test_fuzz_pictures)."""
    import logging

    from PIL import Image

    frames = [Image.new("RGB", (64, 64), c) for c in ((0, 200, 0), (200, 0, 0))]
    path = tmp_path / "c.gif"
    frames[0].save(path, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    with caplog.at_level(logging.WARNING, logger="sdrt"):
        rc = main(["generate", str(DATA / "pipelines" / "tiny-sd15-controlnet"), "a fox", "--control-image", str(path),
                   "--steps", "1", "--backend", "reference", "-o", str(tmp_path / "o.png")])
    assert rc == 0
    said = [r.getMessage() for r in caplog.records if "an animation" in r.getMessage()]
    assert said and all(s.startswith(f"--control-image {path}: ") for s in said), said


def test_an_api_error_is_one_line_when_the_value_given_prints_on_several():
    """``validate("a fox", cfg=np.zeros((2, 2)))``: the message quotes the value's repr, which numpy writes on two
    lines, so str(exc) was two lines (the command escaped it; the API did not). Found by test_fuzz_validate_keywords."""
    import numpy as np

    from sdrt.errors import InputError
    from sdrt.pipelines import validate

    with pytest.raises(InputError) as info:
        validate("a fox", cfg=np.zeros((2, 2)))
    text = str(info.value)
    assert "\n" not in text and "[0., 0.]]" in text and "Where: cfg." in text, text


@pytest.mark.parametrize("keyword", ["rng", "subseed_strength", "preview", "refiner", "refiner_switch_by_steps"])
def test_an_array_where_a_setting_is_expected_is_refused_naming_it(keyword):
    """An array for rng=, subseed_strength=, preview=, refiner= or refiner_switch_by_steps= met a truth test
    (``value or default``, ``value == "approx"``): numpy's "truth value of an array is ambiguous" ValueError, a
    traceback from validate(). Found by test_fuzz_validate_keywords."""
    import numpy as np

    from sdrt.errors import InputError
    from sdrt.pipelines import validate

    with pytest.raises(InputError) as info:
        validate("a fox", **{keyword: np.zeros(3)})
    assert f"Where: {keyword}." in str(info.value), str(info.value)


@pytest.mark.parametrize("command", ["demo", "upscale", "strip", "quantize", "run"])
def test_dash_as_the_output_of_a_command_that_writes_files_is_refused(registry, tmp_path, monkeypatch, capsys, command):
    """``-o -`` is standard output in sdrt generate; demo wrote a file "-.png" in the current folder, upscale and
    quantize one named "-", strip "-.safetensors" beside it, without a word (found by test_fuzz_cli, whose runs left
    "-.png" in the checkout)."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    picture = tmp_path / "in.png"
    Image.new("RGB", (16, 16), (90, 30, 200)).save(picture)
    graph = str(DATA / "pipelines" / "tiny-sd15" / "vae_decoder" / "model.onnx")
    args = {"demo": ["demo", "--backend", "reference"],
            "upscale": ["upscale", str(picture), "-m", str(DATA / "upscalers" / "compact_x4.safetensors"), "--backend",
                        "reference"],
            "strip": ["strip", graph], "quantize": ["quantize", graph, "--to", "int8"],
            "run": ["run", graph, "--backend", "reference"]}[command]
    assert main([*args, "-o", "-"]) == 1
    line = _one_error(capsys)
    assert "-o - writes to standard output in sdrt generate only" in line and "Where: -o." in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.png"]
