"""No command writes over one of its own inputs, and none creates a missing output folder (as ``sdrt generate``
refuses it): ``sdrt upscale IN -o IN`` replaced the image it read, ``sdrt quantize -o /missing/x.onnx`` made the
folders. Every refusal comes before any work, in one line that names the flag."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from test_cli_outputs import relu_model  # the same tiny graph and input

from sdrt.cli import main
from sdrt.pipelines.png import write_png

UPSCALER = Path(__file__).resolve().parents[1] / "data" / "upscalers" / "compact_x4.safetensors"


def _image(path: Path) -> Path:
    write_png(path, np.full((8, 8, 3), 7, np.uint8))
    return path


def _as(tmp_path: Path, target: Path, how: str) -> Path:
    """``target`` itself, a symlink to it, or a hard link to it."""
    if how == "same":
        return target
    link = tmp_path / f"link-{how}{target.suffix}"
    (os.symlink if how == "symlink" else os.link)(target, link)
    return link


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_upscale_refuses_writing_over_its_image(tmp_path, capsys, how):
    image = _image(tmp_path / "in.png")
    before = image.read_bytes()
    out = _as(tmp_path, image, how)
    assert main(["upscale", str(image), "-m", str(UPSCALER), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-o" in err and "the same file as IMAGE" in err and "pass another -o" in err
    assert image.read_bytes() == before


@pytest.mark.parametrize("flag", ["--init-image", "--mask"])
def test_generate_refuses_writing_over_an_input_image(tmp_path, capsys, flag):
    image = _image(tmp_path / "in.png")
    before = image.read_bytes()
    extra = ["--init-image", str(_image(tmp_path / "init.png"))] if flag == "--mask" else []
    assert main(["generate", "a fox", flag, str(image), *extra, "-o", str(_as(tmp_path, image, "symlink"))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is the same file as {flag}" in err
    assert image.read_bytes() == before


@pytest.mark.parametrize("command", ["quantize", "strip"])
def test_quantize_and_strip_refuse_a_missing_output_folder(tmp_path, capsys, command):
    model = relu_model(tmp_path / "m.onnx")
    args = [command, str(model), "-o", str(tmp_path / "no" / "such" / "x.onnx")]
    assert main(args + (["--to", "int8"] if command == "quantize" else [])) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the folder of -o" in err and "does not exist" in err and "mkdir -p" in err
    assert not (tmp_path / "no").exists()


def test_quantize_refuses_a_hard_link_to_its_model(tmp_path, capsys):
    model = relu_model(tmp_path / "m.onnx")
    before = model.read_bytes()
    link = _as(tmp_path, model, "hardlink")
    assert main(["quantize", str(model), "--to", "int8", "-o", str(link)]) == 1
    assert "-o" in capsys.readouterr().err
    assert model.read_bytes() == before


def test_run_refuses_writing_over_an_input(tmp_path, capsys):
    model = relu_model(tmp_path / "m.onnx")
    feed = tmp_path / "x.npy"
    npz = tmp_path / "x.npz"
    os.link(feed, npz)  # an .npz name that is the .npy file read as -i
    assert main(["run", str(model), "-i", f"x={feed}", "-o", str(npz)]) == 1
    assert "is the same file as --input" in capsys.readouterr().err
    assert np.load(feed).tolist() == [-1, 2]


@pytest.mark.parametrize("command", ["quantize", "strip"])
def test_a_missing_model_is_named_as_missing_not_its_default_output_folder(tmp_path, capsys, command):
    args = [command, str(tmp_path / "nope" / "m.onnx")] + (["--to", "int8"] if command == "quantize" else [])
    assert main(args) == 1
    assert "the model file does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_generate_refuses_a_preview_dir_whose_previews_would_overwrite_an_input(registry, tmp_path, capsys, how):
    """--preview-dir writes preview-R-NNN.png: an input under such a name there (or a link to one) was overwritten
    by the first preview; --init-image previews/preview-1-001.png is refused before the model loads."""
    previews = tmp_path / "previews"
    previews.mkdir()
    image = _image(tmp_path / "init.png")
    before = image.read_bytes()
    if how == "same":
        image = previews / "preview-1-001.png"
        _image(image)
        before = image.read_bytes()
    else:
        (os.symlink if how == "symlink" else os.link)(image, previews / "preview-1-001.png")
    args = ["generate", "a fox", "--init-image", str(image), "--steps", "4", "--preview-dir", str(previews),
            "-o", str(tmp_path / "out.png"), "--backend", "reference"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--preview-dir" in err and "preview-1-001.png" in err and "--init-image" in err, err
    assert "Traceback" not in err and image.read_bytes() == before
