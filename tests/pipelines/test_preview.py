"""Live previews: the latent-to-RGB projection, and TAESD decoders against diffusers' AutoencoderTiny."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import register

from sdrt.errors import InputError
from sdrt.pipelines.preview import (
    DEFAULT_PREVIEW_SIZE,
    LATENT_RGB,
    TaesdPreview,
    area_resize,
    fit_latent_rgb,
    latent_rgb,
    preview_latent_size,
    project,
    to_uint8,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "preview"
PIPES = Path(__file__).resolve().parents[1] / "data" / "pipelines"
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


# ------------------------------------------------------------------ the preview's size
def _exact_area(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Area resample on a common grid: repeat each pixel to the lcm, then average blocks (independent of weights)."""
    lh, lw = np.lcm(x.shape[1], h), np.lcm(x.shape[2], w)
    big = x.astype(np.float64).repeat(lh // x.shape[1], axis=1).repeat(lw // x.shape[2], axis=2)
    return big.reshape(x.shape[0], h, lh // h, w, lw // w).mean(axis=(2, 4))


@pytest.mark.parametrize("h,w", [(32, 48), (21, 32), (7, 5), (1, 1), (64, 96)])
def test_area_resize_averages_each_cell(h, w):
    x = np.random.default_rng(3).standard_normal((3, 64, 96)).astype(np.float32)
    got = area_resize(x, h, w)
    assert got.shape == (3, h, w) and got.dtype == np.float32
    assert np.abs(got - _exact_area(x, h, w)).max() < 1e-5


@pytest.mark.parametrize("size", [8, 40, 100, 256, 511, 512, 1000, None])
@pytest.mark.parametrize("h,w", [(64, 64), (64, 96), (128, 128), (8, 200), (1, 3)])
def test_preview_latent_size_bounds_the_longer_side(h, w, size):
    ph, pw = preview_latent_size(h, w, size)
    assert 1 <= ph <= h and 1 <= pw <= w
    if size is None or 8 * max(h, w) <= size:
        assert (ph, pw) == (h, w)
    else:
        assert size - 8 < 8 * max(ph, pw) <= size  # as large as the bound allows, to a latent pixel
        # the aspect kept: the shorter side within a latent pixel or two of its share of the longer
        assert abs(ph - pw * h / w) < 2 if h <= w else abs(pw - ph * w / h) < 2


def test_taesd_preview_size_is_bounded_and_full_on_request():
    register("reference")
    latent = np.random.default_rng(4).standard_normal((4, 64, 96)).astype(np.float32)
    with TaesdPreview(DATA / "tiny-taesd" / "vae_decoder", backend="reference") as prev:
        assert prev.preview_size == DEFAULT_PREVIEW_SIZE == 256
        assert prev(latent).shape == (168, 256, 3)  # 512x768 shrunk to fit 256: a 21x32 latent decoded
        prev.preview_size = 100
        assert prev(latent).shape == (64, 96, 3)
        prev.preview_size = None
        assert prev(latent).shape == (512, 768, 3)
    with TaesdPreview(DATA / "tiny-taesd" / "vae_decoder", backend="reference", preview_size=None) as prev:
        assert prev(latent[:, :8, :8]).shape == (64, 64, 3)


@pytest.mark.parametrize("backend", ["reference", "openvino", "ggml"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_reduced_preview_of_a_blocky_latent_is_diffusers_decode_of_the_small_one(folder, backend):
    # a latent repeated 2x2 area-downscales back to itself exactly: the preview bounded to the small
    # latent's image size is then diffusers' decode of the small latent (refs.npz)
    register(backend)
    refs = np.load(DATA / folder / "refs.npz")
    for i in (0, 1):
        small = refs[f"latent_{i}"]
        blocky = small.repeat(2, axis=2).repeat(2, axis=3)
        want = refs[f"preview_{i}"]
        with TaesdPreview(DATA / folder / "vae_decoder", backend=backend, preview_size=max(want.shape)) as prev:
            got = prev(blocky)
        assert got.shape == want.shape
        diff = np.abs(got.astype(int) - want)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (folder, backend, i, diff.max())


@pytest.mark.parametrize("bad", [0, -256, 7, 2.5, "256", True])
def test_bad_preview_size_is_one_line_naming_it(bad):
    with pytest.raises(InputError, match=r"^preview_size must be a whole number of pixels.*Where: preview_size\.") as e:
        TaesdPreview(DATA / "tiny-taesd" / "vae_decoder", preview_size=bad)
    assert "\n" not in str(e.value)
    from sdrt.pipelines.toolbox import split

    with pytest.raises(InputError, match="preview_size must be"):
        split({"preview_size": bad})
    decoder = str(DATA / "tiny-taesd" / "vae_decoder" / "model.onnx")
    assert split({})[1].preview_size == DEFAULT_PREVIEW_SIZE
    assert split({"preview": decoder, "preview_size": None})[1].preview_size is None
    for preview in (None, "approx", lambda latent: latent):  # no decoder whose size it could bound
        with pytest.raises(InputError, match="preview_size bounds a TAESD decoder's previews, and none is given"):
            split({"preview": preview, "preview_size": 128})


@pytest.mark.parametrize("flags, words", [(["--preview-size", "0", "--preview-dir", "."],
                                           "--preview-size must be a whole number"),
                                          (["--preview-size", "-3", "--preview-dir", "."],
                                           "--preview-size must be a whole number"),
                                          (["--preview-size", "big", "--preview-dir", "."],
                                           "--preview-size must be a whole number"),
                                          (["--preview-size", "full"], "--preview-size without --preview-dir"),
                                          (["--preview-decoder", "x.onnx"], "--preview-decoder without --preview-dir"),
                                          (["--preview-every", "0", "--preview-dir", "."], "--preview-every must be"),
                                          (["--preview-every", "x", "--preview-dir", "."], "--preview-every must be"),
                                          (["--preview-every", "2"], "--preview-every without --preview-dir"),
                                          (["--preview-size", "128", "--preview-dir", "."],
                                           "--preview-size bounds a TAESD decoder's")])
def test_cli_bad_preview_flags(flags, words, capsys):
    from sdrt.cli import main

    rc = main(["generate", str(PIPES / "tiny-sd15"), "a cat", "--dry-run", *flags])
    err = capsys.readouterr().err
    assert rc == 1 and words in err and "Traceback" not in err and err.count("\n") == 1, err


def test_cli_previews_every_n_steps_at_the_bounded_size(tmp_path, capsys):
    from sdrt.cli import main

    pil = pytest.importorskip("PIL.Image")
    register("reference")
    decoder = DATA / "tiny-taesd" / "vae_decoder" / "model.onnx"
    args = ["generate", str(PIPES / "tiny-sd15"), "a cat", "--steps", "5", "--sampler", "Euler", "--seed", "1",
            "--width", "64", "--height", "64", "--backend", "reference", "-o", str(tmp_path / "out.png"),
            "--preview-dir", str(tmp_path), "--preview-every", "2", "--preview-decoder", str(decoder)]
    assert main([*args, "--preview-size", "32"]) == 0, capsys.readouterr().err
    written = sorted(p.name for p in tmp_path.glob("preview-*.png"))
    assert written == ["preview-1-002.png", "preview-1-004.png", "preview-1-005.png"]  # every 2nd, and the last
    with pil.open(tmp_path / written[0]) as img:
        assert img.size == (32, 32)
    for p in tmp_path.glob("preview-*.png"):
        p.unlink()
    assert main([*args, "--preview-size", "full"]) == 0, capsys.readouterr().err
    with pil.open(tmp_path / "preview-1-002.png") as img:
        assert img.size == (64, 64)
