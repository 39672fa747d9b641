"""sdrt demo: the embedded decoder runs on the chosen backend and writes a real PNG."""

from __future__ import annotations

import zlib

import numpy as np

from sdrt.cli import main
from sdrt.demo import build_decoder


def test_demo_writes_png_that_matches_onnxruntime(registry, tmp_path, capsys):
    import onnxruntime as ort

    out = tmp_path / "demo.png"
    assert main(["demo", "-o", str(out), "--backend", "reference", "--seed", "7"]) == 0
    assert "backend reference on reference:CPU" in capsys.readouterr().out
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (64, 64)
    idat_len = int.from_bytes(data[33:37], "big")
    raw = np.frombuffer(zlib.decompress(data[41:41 + idat_len]), np.uint8).reshape(64, 1 + 64 * 3)
    pixels = raw[:, 1:].reshape(64, 64, 3)

    model = build_decoder(32)
    latent = np.random.default_rng(7).standard_normal((1, 4, 32, 32)).astype(np.float32)
    image = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"latent": latent})[0]
    expected = ((image[0].transpose(1, 2, 0) + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= 1


def test_demo_takes_seeds_as_generate_does(registry, tmp_path, capsys):
    """-1 is a random seed (A1111); another negative seed is seed + 2**64, as torch's manual_seed takes it."""
    out = tmp_path / "demo.png"
    assert main(["demo", "-o", str(out), "--backend", "reference", "--seed=-1"]) == 0
    seed = int(capsys.readouterr().out.split("(seed ")[1].split(")")[0])
    assert 0 <= seed < 2**32
    assert main(["demo", "-o", str(out), "--backend", "reference", "--seed=-5"]) == 0
    assert "(seed -5)" in capsys.readouterr().out
    assert main(["demo", "-o", str(out), "--backend", "reference", f"--seed={2**64}"]) == 1
    err = capsys.readouterr().err
    assert "seed 18446744073709551616 is out of range. Where: --seed." in err and "Traceback" not in err
