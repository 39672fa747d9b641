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


@pytest.mark.parametrize("how", ["same", "symlink"])
def test_generate_refuses_previews_writing_over_an_input_image(tmp_path, capsys, how):
    """``--preview-dir`` writes preview-R-NNN.png: a step's preview taken as the next run's --init-image (or a link
    there to an input) was written over by the run's own first preview."""
    source = _image(tmp_path / ("preview-1-001.png" if how == "same" else "kept.png"))
    before = source.read_bytes()
    if how == "symlink":
        os.symlink(source, tmp_path / "preview-1-002.png")
    assert main(["generate", "a fox", "--init-image", str(source), "--strength", "1", "--steps", "2",
                 "--preview-dir", str(tmp_path), "-o", str(tmp_path / "out.png")]) == 1
    err = capsys.readouterr().err
    assert "--preview-dir" in err and "--init-image" in err and "destroy" in err and len(err.splitlines()) == 1, err
    assert source.read_bytes() == before and not (tmp_path / "out.png").exists()
