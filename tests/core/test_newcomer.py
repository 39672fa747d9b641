"""What a new user hit (issue 31): -o on things that are not regular files, output formats, forgotten
prompts, LoRA scales, errors in the caller's words, --embedding-dir, --help, the self-test's words.

Each case runs the way the user ran it: ``sdrt generate`` through ``sdrt.cli.main`` (or a child
process, where standard output matters). ``--backend nosuch`` marks the cases that must be refused
before any model loads: an unknown backend would be the error otherwise.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sdrt.cli import main
from sdrt.errors import InputError, SdrtError, WeightsError
from sdrt.pipelines.png import SIGNATURE, PngError, read_parameters, write_png

DATA = Path(__file__).resolve().parents[1] / "data"
PIPE = DATA / "pipelines" / "tiny-sd15"
LORA = DATA / "ckpt" / "pipe-sd15" / "tinylora.safetensors"
EMB = DATA / "ckpt" / "pipe-sd15" / "tinyemb.safetensors"
FAST = ["--steps", "1", "--sampler", "Euler", "--seed", "1"]
IMAGE = np.zeros((8, 8, 3), np.uint8)


def refused(capsys, args: list[str], *needles: str) -> str:
    assert main(["generate", *args]) == 1
    lines = capsys.readouterr().err.splitlines()
    err = lines[-1]  # one error line, after the backend line when a model had loaded
    assert err.startswith("error: ") and all(ln.startswith("backend ") for ln in lines[:-1]), lines
    for needle in needles:
        assert needle in err, err
    return err


# -- 1. -o ---------------------------------------------------------------------------------------------------------

def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _device(path: Path) -> Path:
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers, in tmp_path
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


@pytest.mark.parametrize("make,kind", [(Path.mkdir, "a folder"), (_fifo, "a FIFO"), (_socket, "a socket"),
                                       (_device, "a character device")])
def test_output_that_is_not_a_regular_file_is_refused_before_any_model_loads(tmp_path, capsys, make, kind):
    target = tmp_path / "out.png"
    make(target)
    before = os.lstat(target).st_mode
    refused(capsys, ["a red circle", *FAST, "--backend", "nosuch", "-o", str(target)], kind, "not a regular file",
            "Where: --output")
    assert os.lstat(target).st_mode == before  # still the same kind of thing: never replaced


def test_write_png_refuses_a_fifo_in_the_api_too(tmp_path):
    fifo = _fifo(tmp_path / "pipe.png")
    with pytest.raises(PngError, match="FIFO") as info:
        write_png(fifo, IMAGE)
    assert "Where: path" in str(info.value) and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_is_written_through_to_its_target_as_cp_does(tmp_path, registry, capsys):
    target = tmp_path / "target.png"
    target.write_bytes(b"old")
    link = tmp_path / "link.png"
    link.symlink_to(target.name)
    assert main(["generate", "a red circle", *FAST, "--backend", "reference", "-o", str(link)]) == 0
    out = capsys.readouterr().out
    assert link.is_symlink() and os.readlink(link) == "target.png"
    assert target.read_bytes().startswith(SIGNATURE) and "through the symlink" in out
    assert read_parameters(target).startswith("a red circle")


def test_a_dangling_symlink_is_refused(tmp_path, capsys):
    link = tmp_path / "link.png"
    link.symlink_to(tmp_path / "nowhere" / "x.png")
    refused(capsys, ["a red circle", *FAST, "--backend", "nosuch", "-o", str(link)], "dangling symlink")
    assert link.is_symlink()


@pytest.mark.parametrize("target_name", ["notes.txt", "photo.jpg"])
def test_a_symlink_to_a_file_of_another_kind_is_refused(tmp_path, capsys, target_name):
    """`-o link.png` where the link leads to notes.txt: the text file would have become a PNG."""
    target = tmp_path / target_name
    target.write_bytes(b"my notes")
    link = tmp_path / "link.png"
    link.symlink_to(target.name)
    refused(capsys, ["a red circle", *FAST, "--backend", "nosuch", "-o", str(link)],
            f"would replace that {target.suffix} file with a PNG image")
    assert target.read_bytes() == b"my notes" and link.is_symlink()


def test_output_dash_writes_the_png_to_standard_output(tmp_path):
    env = {**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1"}
    proc = subprocess.run([sys.executable, "-m", "sdrt", "generate", "a red circle", *FAST, "--backend", "reference",
                           "-o", "-"], capture_output=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.startswith(SIGNATURE) and read_parameters(proc.stdout).startswith("a red circle")
    assert b"backend reference on CPU" in proc.stderr and b"standard output" in proc.stderr
    assert not (tmp_path / "-").exists()


def test_output_dash_with_several_images_is_refused(capsys):
    refused(capsys, ["a red circle", *FAST, "--batch", "2", "--backend", "nosuch", "-o", "-"],
            "standard output", "2 images")


@pytest.mark.parametrize("value,needle", [("", "--output is given an empty value"), ("x.gif", "cannot write images as '.gif'")])
def test_empty_or_unknown_output_names_are_refused(tmp_path, capsys, value, needle):
    refused(capsys, ["a red circle", *FAST, "--backend", "nosuch", "-o", str(tmp_path / value) if value else ""],
            needle)


@pytest.mark.parametrize("suffix,magic", [(".jpg", b"\xff\xd8"), (".jpeg", b"\xff\xd8"), (".webp", b"RIFF")])
def test_jpeg_and_webp_follow_the_suffix_with_a1111_user_comment(tmp_path, registry, capsys, suffix, magic):
    pil = pytest.importorskip("PIL.Image", reason="JPEG/WebP output needs Pillow")
    out = tmp_path / f"x{suffix}"
    assert main(["generate", "a red circle, top left", *FAST, "--backend", "reference", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(magic)
    with pil.open(out) as img:  # read back by Pillow, not by sdrt: UserComment as A1111/piexif write it
        raw = img.getexif().get_ifd(0x8769)[0x9286]
        block = img.info["exif"]
    assert b"\x92\x86\x00\x07" in block  # typed UNDEFINED (7), as piexif, A1111's reader, needs it
    assert raw[:8] == b"UNICODE\0"
    text = raw[8:].decode("utf-16-be")
    assert text.startswith("a red circle, top left\nSteps: 1, Sampler: Euler") and "Seed: 1" in text


def test_jpeg_without_pillow_is_a_clear_error_before_any_model_loads(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "PIL", None)  # as when Pillow is not installed
    err = refused(capsys, ["a red circle", *FAST, "--backend", "nosuch", "-o", str(tmp_path / "x.jpg")],
                  "needs Pillow", "pip install pillow")
    assert "sdrt[images]" not in err


# -- 4. the other cases ----------------------------------------------------------------------------------------------

def test_a_model_folder_without_a_prompt_is_refused_not_used_as_the_prompt(tmp_path, capsys):
    refused(capsys, [str(PIPE), *FAST, "--backend", "nosuch", "-o", str(tmp_path / "x.png")],
            "is a model folder, and no prompt follows it", f'sdrt generate {PIPE} "')
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("scale,needle", [("xyz", "the LoRA scale 'xyz' is not a number"),
                                          ("nan", "must be a finite number"), ("inf", "must be a finite number"),
                                          ("1e30", "must be a finite number between -100 and 100")])
def test_a_bad_lora_scale_is_blamed_on_the_scale(tmp_path, capsys, scale, needle):
    err = refused(capsys, [str(PIPE), "a cat", *FAST, "--backend", "nosuch", "--lora", f"{LORA}:{scale}",
                           "-o", str(tmp_path / "x.png")], needle, "Where: --lora")
    assert "does not exist" not in err and "NaN" not in err.split("Where")[0].replace("nan", "")


@pytest.fixture
def tiny_pipe(registry):
    from sdrt import pipelines

    pipe = pipelines.load(PIPE, backend="reference")
    try:
        yield pipe
    finally:
        pipe.close()


@pytest.mark.parametrize("scale", [float("nan"), 1e30, "x"])
def test_set_loras_checks_the_scale_before_merging(tiny_pipe, scale):
    with pytest.raises(WeightsError, match="the scale of LoRA 'tinylora'") as info:
        tiny_pipe.set_loras([(LORA, scale)])
    assert "Where: loras" in str(info.value) and tiny_pipe.weights.loras == []


def test_a_prompt_lora_tag_with_an_absurd_scale_names_the_tag(tiny_pipe, tmp_path):
    tiny_pipe.weights.lora_dir = LORA.parent
    with pytest.raises(WeightsError, match="finite number") as info:
        tiny_pipe.generate("a cat <lora:tinylora:1e30>", steps=1, seed=1)
    assert "<lora:tinylora:1e+30> in prompt" in str(info.value)


def test_errors_render_argument_names_in_the_callers_words():
    err = InputError("a mask needs an init image", where="mask", fix="pass {@init_image=} too, or drop {@mask}")
    assert str(err) == "a mask needs an init image. Where: mask. What to do: pass init_image= too, or drop mask."
    cli = err.render({"init_image": "--init-image", "mask": "--mask"})
    assert cli == "a mask needs an init image. Where: --mask. What to do: pass --init-image too, or drop --mask."
    assert SdrtError("plain {braces} stay", fix="{x: 1}").render({"x": "--x"}) == \
        "plain {braces} stay. What to do: {x: 1}."


@pytest.mark.parametrize("args,flags,api", [
    (["--mask", "m.png"], ["Where: --mask", "pass --init-image too"], "init_image="),
    (["--strength", "0.5"], ["Where: --strength", "pass --init-image, or leave --strength unset"], "init_image="),
])
def test_cli_errors_speak_flags_and_api_errors_speak_arguments(capsys, args, flags, api):
    from sdrt.pipelines.pipeline import validate

    err = refused(capsys, ["a cat", *FAST, *args, "--backend", "nosuch"], *flags)
    assert api not in err
    with pytest.raises(InputError, match=api):
        validate("a cat", "", **{args[0][2:]: args[1] if args[0] == "--mask" else float(args[1])})


def test_a_lora_for_another_model_says_so_in_cli_words(tmp_path, registry, capsys):
    """tinylora is made for tiny-sd15, not for the demo model: no API arguments in the advice."""
    err = refused(capsys, ["a cat", *FAST, "--backend", "reference", "--lora", str(LORA), "-o", str(tmp_path / "x.png")],
                  "do not fit this SD 1.x model", "use a LoRA made for SD 1.x")
    assert "strict=False" not in err and "component=" not in err


def test_the_pillow_hint_names_a_command_that_works(monkeypatch, tmp_path):
    from sdrt.pipelines.images import to_rgb

    (tmp_path / "in.png").write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(InputError) as info:
        to_rgb(str(tmp_path / "in.png"))
    assert "pip install pillow" in str(info.value) and "pip install './core[images]'" in str(info.value)
    assert "sdrt[images]" not in str(info.value).replace("./core[images]", "")


def test_help_promises_one_folder_and_one_prompt(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "usage: sdrt generate [MODEL] PROMPT [options]" in out and "[[MODEL] PROMPT ...]" not in out


def test_a_broken_file_in_embedding_dir_is_skipped_unless_a_prompt_uses_it(tmp_path, registry, capsys, caplog):
    emb = tmp_path / "emb"
    emb.mkdir()
    (emb / "tinyemb.safetensors").write_bytes(EMB.read_bytes())
    (emb / "broken.safetensors").write_bytes(b"broken\n")
    base = [str(PIPE), *FAST, "--backend", "reference", "--embedding-dir", str(emb)]
    with caplog.at_level(logging.WARNING, logger="sdrt.cli"):
        assert main(["generate", base[0], "a cat, tinyemb", *base[1:], "-o", str(tmp_path / "a.png")]) == 0, \
            capsys.readouterr().err
    assert "skipping embedding" in caplog.text and "broken.safetensors" in caplog.text
    assert "TI hashes: " in read_parameters(tmp_path / "a.png")  # the good one is used
    refused(capsys, [base[0], "a cat, broken", *base[1:], "-o", str(tmp_path / "b.png")], "broken.safetensors",
            "safetensors")


def test_a_lora_tag_is_no_use_of_an_embedding_dir_file_of_that_name(tmp_path, registry, capsys, caplog):
    """One folder for LoRAs and embeddings (as many keep them): ``<lora:tinylora:0.6>`` applies the LoRA, and the
    LoRA file, which is no embedding, is skipped with a warning, not taken for a trigger word the prompt uses."""
    shared = tmp_path / "shared"
    shared.mkdir()
    for f in (EMB, LORA):
        (shared / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "a.png"
    with caplog.at_level(logging.WARNING, logger="sdrt.cli"):
        assert main(["generate", str(PIPE), "a cat <lora:tinylora:0.6>, tinyemb", *FAST, "--backend", "reference",
                     "--lora-dir", str(shared), "--embedding-dir", str(shared), "-o", str(out)]) == 0, \
            capsys.readouterr().err
    assert "skipping embedding" in caplog.text and "tinylora.safetensors" in caplog.text
    assert "--lora FILE:WEIGHT" in caplog.text and "set_loras" not in caplog.text, caplog.text  # the command's words
    text = read_parameters(out)
    assert "Lora hashes: " in text and "TI hashes: " in text, text


def test_the_self_test_says_what_unsupported_means():
    from sdrt.selftest.report import _figure

    text = _figure({"group": "conformance", "figures": {"totals": {"passed": 900, "failed": 0, "unsupported": 158,
                                                                   "skipped": 3, "xfail": 1}}})
    assert "158 unsupported (" in text and "not failures" in text and "refused up front" in text


@pytest.mark.parametrize("command", [["demo"], ["run", "model.onnx", "-i", "x=x.npy"]])
def test_demo_and_run_refuse_a_fifo_output_too(tmp_path, capsys, command):
    fifo = _fifo(tmp_path / "out.png" if command[0] == "demo" else tmp_path / "out.npz")
    assert main([*command, "--backend", "nosuch", "-o", str(fifo)]) == 1
    assert "is a FIFO (named pipe), not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_vae_tile_too_small_names_the_least_it_takes(capsys):
    """--vae-tile 4 said "use 32 or more", and 8 to 31 run: the least is 8 latent pixels, as vae_tile's own check."""
    assert main(["generate", "a cat", "--vae-tile", "4", "--backend", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "--vae-tile 4 is below 8 latent pixels" in err and "pass --vae-tile 8 or more" in err, err
