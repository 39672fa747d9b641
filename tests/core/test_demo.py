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
