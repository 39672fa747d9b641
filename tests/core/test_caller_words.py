"""Each caller reads its own words (issue: a newcomer's hunt): a LoRA, ControlNet or embedding given as the model
names the way in of the caller that gave it (a flag on the command line, a call in the API, a prompt tag in a served
request), never the other callers' in the same line."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from sdrt.cli import main
from sdrt.errors import SdrtError

DATA = Path(__file__).resolve().parents[1] / "data"
LORA = DATA / "ckpt" / "sd1" / "lora_kohya.safetensors"
pytestmark = pytest.mark.usefixtures("registry")


def _write(path: Path, tensors: dict[str, tuple[int, ...]]) -> Path:
    from safetensors.numpy import save_file

    save_file({k: np.zeros(s, np.float32) for k, s in tensors.items()}, str(path))
    return path


@pytest.fixture()
def not_models(tmp_path) -> dict[str, Path]:
    cn = _write(tmp_path / "canny.safetensors", {"controlnet_cond_embedding.conv_in.weight": (16, 3, 3, 3)})
    emb = _write(tmp_path / "easyneg.safetensors", {"emb_params": (2, 768)})
    return {"lora": LORA, "controlnet": cn, "embedding": emb}


CLI = {"lora": "--lora FILE:WEIGHT", "controlnet": "--controlnet FILE --control-image PNG",
       "embedding": "--embedding FILE"}
API = {"lora": "pipe.set_loras([(FILE, WEIGHT)])", "controlnet": "controlnets=[(FILE, image)]",
       "embedding": "pipe.add_embedding(FILE)"}


@pytest.mark.parametrize("kind", ["lora", "controlnet", "embedding"])
def test_a_file_that_is_no_model_names_the_cli_flag_alone(kind, not_models, capsys):
    assert main(["generate", str(not_models[kind]), "a cat", "--backend", "reference"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"not a checkpoint: pass it with {CLI[kind]})" in err, err
    assert "in the API" not in err and "set_loras" not in err and "add_embedding" not in err and "controlnets=" not in err


@pytest.mark.parametrize("kind", ["lora", "controlnet", "embedding"])
def test_a_file_that_is_no_model_names_the_api_call_alone(kind, not_models):
    from sdrt import pipelines

    with pytest.raises(SdrtError) as e:
        pipelines.load(not_models[kind], backend="reference")
    msg = str(e.value)
    assert API[kind] in msg and "--" not in msg.split("Where:")[0], msg


def test_a_lora_given_as_a_controlnet_says_where_it_goes_not_that_it_is_no_checkpoint():
    from sdrt.checkpoint.controlnet import open_controlnet

    with pytest.raises(SdrtError) as e:
        open_controlnet(LORA)
    msg = str(e.value)
    assert "kohya LoRA (not a ControlNet: pass it with pipe.set_loras([(FILE, WEIGHT)]))" in msg, msg


def test_a_warning_naming_a_path_is_one_line_with_its_control_characters_escaped(tmp_path):
    """A warning printed a file name raw: its newline broke the line, an escape sequence reached the terminal (the
    command's errors and "wrote" lines escape them, sdrt.errors.printable)."""
    import subprocess
    import sys

    embs = tmp_path / "embs"
    embs.mkdir()
    (embs / "bad\nname\x1b[31m.safetensors").write_bytes(b"garbage")
    proc = subprocess.run([sys.executable, "-m", "sdrt", "generate", "a cat", "--embedding-dir", str(embs),
                           "--backend", "reference", "--steps", "1", "-o", str(tmp_path / "o.png")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, env={**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1"})
    warned = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")]
    assert warned and "bad\\nname\\x1b[31m.safetensors" in warned[0], proc.stderr
    assert "\x1b" not in proc.stderr and not any(ln.startswith("name") for ln in proc.stderr.splitlines())


@pytest.mark.parametrize("words", [["a cat", "on a mat"], ["cat", "dog"]])
def test_an_unquoted_prompt_read_as_a_model_says_to_quote_it(words, tmp_path, monkeypatch, capsys):
    """``sdrt generate "a cat" "on a mat"``: the first argument is MODEL; it said "the model folder does not exist.
    Where: a cat", as if the prompt were a path."""
    monkeypatch.chdir(tmp_path)
    assert main(["generate", *words, "--backend", "reference", "-o", "x.png"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"there is no model file or folder {words[0]!r}" in err, err
    assert f'quote it whole, sdrt generate "{words[0]} {words[1]}"' in err and "Where: MODEL." in err, err


@pytest.mark.parametrize("model", [5, None, ["a.safetensors"]])
def test_load_names_its_own_argument_for_a_model_that_is_no_path(model):
    from sdrt import pipelines
    from sdrt.errors import InputError

    with pytest.raises(InputError) as e:
        pipelines.load(model, backend="reference")
    assert e.value.where == "model" and str(e.value).startswith("model must be a path"), str(e.value)


def test_a_lora_or_controlnet_given_as_a_vae_or_text_encoder_says_where_it_goes(not_models, capsys):
    """It said "lora.safetensors is kohya LoRA (not a checkpoint: ...), not a VAE"."""
    ckpt = DATA / "ckpt" / "sd1" / "ldm.safetensors"
    for flag, kind, said in (("--vae", "lora", "(not a VAE: pass it with --lora FILE:WEIGHT)"),
                             ("--text-encoder", "controlnet",
                              "(not a text encoder: pass it with --controlnet FILE --control-image PNG)")):
        assert main(["generate", str(ckpt), "a cat", flag, str(not_models[kind]), "--backend", "reference"]) == 1
        err = capsys.readouterr().err.strip()
        assert said in err and "not a checkpoint" not in err, err


def test_a_lora_given_as_an_embedding_says_what_it_is_in_the_callers_words():
    from sdrt.checkpoint import load_embedding
    from sdrt.errors import WeightsError

    with pytest.raises(WeightsError) as e:
        load_embedding(LORA)
    assert "it looks like kohya LoRA (not an embedding: pass it with pipe.set_loras([(FILE, WEIGHT)]))" in str(e.value)


def test_sdrt_run_names_the_option_at_fault(affine_path, tmp_path, capsys):
    """ "Where: sdrt run." / "Where: sdrt -o." named the command, not the option."""
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    assert main(["run", str(affine_path), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "r.npz")]) == 1
    err = capsys.readouterr().err
    assert "bad --input" in err and "Where: --input." in err, err
    assert main(["run", str(affine_path), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "names a folder" in err and "Where: -o." in err, err


@pytest.mark.parametrize(("argv", "said"), [
    (["generate", "a cat", "--steps", "2.5"], "argument --steps: invalid int value: '2.5'. Where: sdrt generate."),
    (["generate"], "the following arguments are required: [MODEL] PROMPT. Where: sdrt generate."),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["info", "extra"], "unrecognized arguments: extra. Where: sdrt info.")])
def test_an_argument_argparse_refuses_is_one_line_in_the_usual_form(argv, said, capsys):
    """argparse printed its usage and then "sdrt generate: error: ..." on a second line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and said in err and "usage:" not in err, err
    assert "What to do: see `sdrt" in err


def test_a_mistyped_backend_names_the_closest_installed_one(capsys):
    """--backend referenc said "install the plugin that provides it" for a backend that is installed."""
    assert main(["generate", "a cat", "--backend", "referenc"]) == 1
    err = capsys.readouterr().err
    assert "no backend named 'referenc' (the closest installed: 'reference')" in err, err
    assert "What to do: pass --backend reference." in err and "sdrt install" not in err, err


def test_a_guidance_rescale_with_no_cfg_pass_is_said_and_not_written_as_run(caplog):
    """--guidance-rescale 0.7 --cfg 1: no CFG to rescale (diffusers rescales only under CFG); it ran silently and
    the PNG said "CFG Rescale: 0.7"."""
    from sdrt import pipelines

    demo_pipe = pipelines.load(pipelines.DEMO_MODEL, backend="reference")
    with caplog.at_level(logging.WARNING, logger="sdrt"):
        gen = demo_pipe.generate("a cat", steps=1, seed=1, cfg=1, guidance_rescale=0.7)
    said = [r.getMessage() for r in caplog.records if "guidance_rescale 0.7 is not used" in r.getMessage()]
    assert len(said) == 1 and "cfg 1 runs one pass" in said[0], [r.getMessage() for r in caplog.records]
    assert "CFG Rescale" not in gen.settings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sdrt"):
        gen = demo_pipe.generate("a cat", steps=1, seed=1, cfg=7, guidance_rescale=0.7)
    assert gen.settings[0]["CFG Rescale"] == 0.7 and not [r for r in caplog.records if "not used" in r.getMessage()]


def test_save_image_with_its_arguments_swapped_or_a_bad_image_names_the_argument(tmp_path):
    """save_image(image, path) was os.fspath's TypeError; a list image was named "write_png"."""
    from sdrt.pipelines.png import PngError
    from sdrt.pipelines.save import save_image

    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(PngError) as e:
        save_image(img, tmp_path / "x.png")  # type: ignore[arg-type]
    assert e.value.where == "path" and "the path comes first" in str(e.value), str(e.value)
    with pytest.raises(PngError) as e:
        save_image(tmp_path / "x.png", [[0, 1]])
    assert e.value.where == "image", str(e.value)
    assert not list(tmp_path.iterdir())


def test_a_lora_folder_with_no_lora_in_it_is_refused_naming_the_flag_before_the_model_loads(tmp_path, capsys,
                                                                                            monkeypatch):
    from sdrt import pipelines

    monkeypatch.setattr(pipelines, "load", lambda *a, **k: pytest.fail("the model loaded"))
    (tmp_path / "empty").mkdir()
    assert main(["generate", "a cat", "--lora", str(tmp_path / "empty"), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --lora: cannot open empty: the folder holds no .safetensors files"), err


def test_vae_tile_on_a_fixed_size_vae_speaks_the_flag_on_the_command_line(capsys):
    """It began "vae_tile=64 needs ..." (the API's words) after "error:" on the command line."""
    assert main(["generate", "a cat", "--vae-tile", "64", "--backend", "reference", "--steps", "1"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: --vae-tile 64 needs a VAE with dynamic height and width") and "vae_tile" not in err


def test_a_lora_with_two_scales_says_it_takes_one(tmp_path, capsys):
    """--lora FILE:1.5:2 said "the LoRA file does not exist. Where: --lora FILE:1.5" (it read "FILE:1.5" as the file)."""
    lora = tmp_path / "ink.safetensors"
    lora.write_bytes(LORA.read_bytes())
    assert main(["generate", "a cat", "--lora", f"{lora}:1.5:2", "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "--lora takes one scale, FILE:SCALE" in err and f"write --lora {lora}:1.5" in err, err
    assert "does not exist" not in err


def test_a_hires_upscaler_file_that_is_not_there_is_said_missing_not_unknown(capsys):
    assert main(["generate", "a cat", "--hires-scale", "2", "--hires-upscaler", "4x-nope.pth", "--backend",
                 "reference"]) == 1
    err = capsys.readouterr().err
    assert "the hires upscaler file '4x-nope.pth' does not exist. Where: --hires-upscaler." in err, err


def test_the_lines_strip_prints_escape_a_newline_in_a_file_name(affine_path, tmp_path, capsys):
    """``sdrt strip`` (and quantize, upscale, selftest, cache) printed their output paths raw, as "wrote" lines
    no longer do: a newline in a name broke the line."""
    out = tmp_path / "two\nlines.onnx"
    assert main(["strip", str(affine_path), "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("graph:   ") and "two\\nlines.onnx" in lines[0], lines
    assert lines[1].startswith("weights: ") and lines[2].startswith("original: "), lines


def _esrgan(path: Path) -> Path:
    return _write(path, {"body.0.weight": (64, 3, 3, 3), "body.0.bias": (64,), "body.1.weight": (64,),
                         "body.2.weight": (64, 64, 3, 3)})


def test_an_upscaler_given_as_the_model_says_where_it_goes_per_caller(tmp_path, capsys):
    """It said "--hires-upscaler FILE, or `sdrt upscale`" to every caller, then "which sdrt does not run"."""
    from sdrt import pipelines

    esr = _esrgan(tmp_path / "4x-esr.safetensors")
    assert main(["generate", str(esr), "a cat", "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert "(not an image generator: pass it as the hires upscaler, --hires-upscaler FILE" in err, err
    assert "hires_upscaler=" not in err and "does not run" not in err, err
    with pytest.raises(SdrtError) as e:
        pipelines.load(esr, backend="reference")
    assert "generate(..., hires_upscaler=FILE)" in str(e.value) and "--hires-upscaler" not in str(e.value)


def test_an_upscaler_chosen_as_a_served_vae_is_said_in_the_requests_words(tmp_path):
    from sdrt.serve.errors import ApiError
    from sdrt.serve.modules import ModuleEntry, check_vae_file

    esr = _esrgan(tmp_path / "4x-esr.safetensors")
    with pytest.raises(ApiError) as e:
        check_vae_file(ModuleEntry(esr.name, esr, "vae"), "sd_vae")
    msg = e.value.message
    assert "hr_upscaler" in msg and "{@" not in msg and "--hires-upscaler" not in msg, msg
