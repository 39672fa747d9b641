"""``sdrt generate`` refuses --width/--height that are not multiples of 16 on an SD3/Flux/Chroma model before the
model loads, when its family is known from the file (a diffusers folder's model_index.json, a single file's
header): it was refused only after the load."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_open_single_file import flux_shapes, sparse_safetensors

import sdrt.pipelines
from sdrt.cli import main

PIPES = Path(__file__).resolve().parent.parent / "data" / "pipelines"


@pytest.fixture
def no_load(monkeypatch):
    def load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(sdrt.pipelines, "load", load)


@pytest.mark.parametrize("flag, other", [("--width", "--height"), ("--height", "--width")])
def test_a_flux_folder_refuses_a_size_not_a_multiple_of_16_before_loading(no_load, capsys, flag, other):
    rc = main(["generate", str(PIPES / "tiny-flux-dev"), "a cat", flag, "72", other, "64", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 1 and err == (f"error: {flag} 72 is not a multiple of 16, which Flux.1 needs (VAE 8 x patch 2). "
                               f"Where: {flag}. What to do: use 64 or 80.\n"), err


def test_a_flux_single_file_refuses_it_from_its_header(tmp_path, no_load, capsys):
    f = sparse_safetensors(tmp_path / "flux1-dev.safetensors", flux_shapes(prefix="model.diffusion_model."))
    assert main(["generate", str(f), "a cat", "--width", "1000", "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "--width 1000 is not a multiple of 16, which Flux.1 dev needs" in err and "use 992 or 1008" in err, err


def test_an_sd1_folder_is_not_held_to_it(capsys):
    """SD 1.x takes multiples of 8: 72 reaches the pipeline (whose tiny UNet makes 64x64 only)."""
    assert main(["generate", str(PIPES / "tiny-sd15"), "a cat", "--width", "72", "--height", "64", "--dry-run"]) == 1
    assert "multiple of 16" not in capsys.readouterr().err
