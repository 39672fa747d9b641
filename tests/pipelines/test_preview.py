"""Live previews: the latent-to-RGB projection, and TAESD decoders against diffusers' AutoencoderTiny."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import register

from sdrt.errors import InputError
from sdrt.pipelines.preview import LATENT_RGB, TaesdPreview, fit_latent_rgb, latent_rgb, project, to_uint8

DATA = Path(__file__).resolve().parents[1] / "data" / "preview"
FOLDERS = ["tiny-taesd", "tiny-taesd-16ch"]


def test_factors_are_comfyuis():
    # spot values of comfy/latent_formats.py (SD15, SDXL, SD3, Flux): first and last rows, and the biases
    f, b = latent_rgb("sd1")
    assert f[0].tolist() == pytest.approx([0.3512, 0.2297, 0.3227]) and b.tolist() == [0, 0, 0]
    f, b = latent_rgb("sdxl")
    assert f[3].tolist() == pytest.approx([-0.3165, -0.2492, -0.2188])
    assert b.tolist() == pytest.approx([0.1084, -0.0175, -0.0011])
    f, b = latent_rgb("sd3")
    assert f.shape == (16, 3) and f[15].tolist() == pytest.approx([-0.1448, -0.1463, -0.1189])
    f, b = latent_rgb("flux")
    assert f[0].tolist() == pytest.approx([-0.0346, 0.0244, 0.0681])
    assert b.tolist() == pytest.approx([-0.0329, -0.0718, -0.0851])
    assert latent_rgb("sd2")[0] is latent_rgb("sd1")[0]
    assert set(LATENT_RGB) == {"sd1", "sdxl", "sd3", "flux"}


@pytest.mark.parametrize("fmt,channels", [("sd1", 4), ("sdxl", 4), ("sd3", 16), ("flux", 16)])
def test_projection_is_comfyuis_linear_preview(fmt, channels):
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((1, channels, 12, 20)).astype(np.float32) * 2
    out = project(x, fmt)
    assert out.shape == (12, 20, 3) and out.dtype == np.uint8
    f, b = LATENT_RGB[fmt]
    # torch.nn.functional.linear(x.movedim(1, -1), W.T, bias), then ((v + 1) / 2).clamp(0, 1) * 255 -> uint8
    v = np.einsum("chw,cr->hwr", x[0].astype(np.float64), np.array(f)) + np.array(b)
    want = (np.clip((v + 1) / 2, 0, 1) * 255).astype(np.uint8)
    assert np.abs(out.astype(int) - want).max() <= 1 and (out != want).mean() < 0.01
    big = project(x[0], fmt, upscale=8)
    assert big.shape == (96, 160, 3) and np.array_equal(big[::8, ::8], out)


def test_projection_rejects_wrong_inputs():
    with pytest.raises(InputError):
        project(np.zeros((16, 4, 4), np.float32), "sdxl")
    with pytest.raises(InputError):
        project(np.zeros((2, 4, 4, 4), np.float32), "sd1")
    with pytest.raises(InputError):
        project(np.zeros((4, 4, 4), np.float32), "kandinsky")
    with pytest.raises(InputError):
        TaesdPreview(DATA / "missing.onnx")


def test_to_uint8_truncates_like_comfyui():
    assert to_uint8(np.array([[[-2.0, 0.0, 1.0]]], np.float32)).tolist() == [[[0, 127, 255]]]


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_taesd_preview_equals_diffusers_autoencoder_tiny(folder, backend):
    register(backend)
    refs = np.load(DATA / folder / "refs.npz")
    with TaesdPreview(DATA / folder / "vae_decoder", backend=backend) as prev:
        for i in (0, 1):
            latent = refs[f"latent_{i}"]
            got = prev(latent)
            want = refs[f"preview_{i}"]
            assert got.shape == want.shape == (latent.shape[2] * 8, latent.shape[3] * 8, 3)
            diff = np.abs(got.astype(int) - want)
            # the same float32 decode through other kernels: a value on a truncation boundary may move by one
            assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (folder, backend, i, diff.max())
    assert prev.scaling_factor == (1.0 if folder == "tiny-taesd" else pytest.approx(0.3611))


def test_fit_recovers_known_factors_and_projects_with_them():
    rng = np.random.default_rng(5)
    f_true = rng.standard_normal((4, 3)).astype(np.float32) * 0.2
    b_true = np.array([0.1, -0.05, 0.02], np.float32)
    z = rng.standard_normal((6, 4, 8, 8)).astype(np.float32)
    # images whose 8x8 cells are exactly the linear map of the latent pixel (in [-1, 1] -> 0..255)
    v = np.einsum("nchw,cr->nhwr", z, f_true) + b_true
    images = np.clip(np.rint((v + 1) * 127.5), 0, 255).astype(np.uint8).repeat(8, axis=1).repeat(8, axis=2)
    f, b = fit_latent_rgb(z, images)
    assert np.abs(f - f_true).max() < 0.01 and np.abs(b - b_true).max() < 0.01
    out = project(z[0], factors=f, bias=b)
    assert np.abs(out.astype(int) - images[0, ::8, ::8]).max() <= 3
    with pytest.raises(InputError):
        fit_latent_rgb(z, images[:, :60])
    with pytest.raises(InputError):
        project(z[0])
