"""Defects a new user met in a fresh-eyes pass over the CLI and the API (each test failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdrt.cli import main
from sdrt.pipelines.png import PngError, write_png
from sdrt.pipelines.save import save_image

DATA = Path(__file__).resolve().parents[1] / "data"
UPSCALER = DATA / "upscalers" / "compact_x4.safetensors"


# -- WebP holds at most 16383 pixels a side: Pillow's ValueError was a traceback, after the whole run ----------
def test_upscale_to_a_webp_too_large_is_refused_before_the_run(tmp_path, capsys):
    image = tmp_path / "thin.png"
    write_png(image, np.zeros((4100, 1, 3), np.uint8))  # x4: 4x16400
    out = tmp_path / "up.webp"
    assert main(["upscale", str(image), "-m", str(UPSCALER), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "WebP" in err and "16383" in err and "4x16400" in err and "--output" in err
    assert not out.exists()


def test_generate_to_a_webp_too_large_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from sdrt import pipelines

    monkeypatch.setattr(pipelines, "load", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "wide.webp"
    args = ["generate", "a fox", "--width", "8192", "--height", "64", "--hires-scale", "2", "-o", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "16384x128" in err and ".png" in err
    assert not out.exists()


def test_save_image_says_the_webp_limit_in_one_line(tmp_path):
    with pytest.raises(PngError, match="at most 16383 pixels a side"):
        save_image(tmp_path / "x.webp", np.zeros((1, 16384, 3), np.uint8))
    assert not (tmp_path / "x.webp").exists()
