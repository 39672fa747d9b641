"""Tiled VAE decode/encode: tiles of one size cover the image, seams blend, results stay close to whole images."""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_data import DATA

import sdrt
from sdrt.errors import InputError
from sdrt.graph import Graph
from sdrt.pipelines.tiling import decode_tiled, encode_tiled, ramp, starts, tiled


def test_tile_starts_cover_the_axis_with_one_tile_size():
    assert starts(100, 40, 10) == [0, 30, 60]
    assert starts(40, 64, 16) == [0]
    for size, tile, ov in [(100, 40, 10), (97, 32, 8), (64, 16, 4)]:
        s = starts(size, tile, ov)
        covered = np.zeros(size, bool)
        for a in s:
            covered[a:a + tile] = True
        assert covered.all() and s[-1] + tile == size


def test_ramps_sum_to_one_across_an_overlap():
    left, right = ramp(16, 4, True, False), ramp(16, 4, False, True)
    np.testing.assert_allclose(left[-4:] + right[:4], 1.0)
    assert ramp(16, 4, True, True).min() == 1.0


def test_a_pointwise_function_comes_back_exactly():
    x = np.random.default_rng(0).standard_normal((2, 4, 37, 53)).astype(np.float32)
    out = tiled(lambda t: t * 2.0, x, tile=16, overlap=4, scale=1.0, out_channels=4)
    np.testing.assert_allclose(out, x * 2.0, rtol=1e-6, atol=1e-6)


def test_an_upsampling_function_comes_back_exactly():
    x = np.random.default_rng(1).standard_normal((1, 4, 20, 28)).astype(np.float32)

    def up(t: np.ndarray) -> np.ndarray:
        return np.repeat(np.repeat(t[:, :3], 8, axis=2), 8, axis=3)

    np.testing.assert_allclose(decode_tiled(up, x, tile=8, overlap=2), up(x), rtol=1e-6, atol=1e-6)


def test_bad_overlap_is_refused():
    with pytest.raises(InputError):
        tiled(lambda t: t, np.zeros((1, 1, 32, 32), np.float32), tile=8, overlap=8, scale=1.0, out_channels=1)
    with pytest.raises(InputError):
        encode_tiled(lambda t: t, np.zeros((1, 3, 64, 64), np.float32), tile=60, overlap=8)


@pytest.mark.needs_backend("openvino")
def test_tiled_vae_decode_is_close_to_whole_decode_and_seamless():
    """The tiny SD 1.x VAE decoder (2 blocks: latents upsample 2x), exported with dynamic height and width."""
    graph = Graph.load(DATA / "sd1" / "vae_decoder" / "model.onnx")
    z = np.random.default_rng(2).standard_normal((1, 4, 24, 24)).astype(np.float32)
    with sdrt.load(graph.with_shapes({"latent_sample": (1, 4, 24, 24)}), backend="openvino") as whole, \
            sdrt.load(graph.with_shapes({"latent_sample": (1, 4, 16, 16)}), backend="openvino") as tile:
        full = whole.run({"latent_sample": z})["sample"]
        out = tiled(lambda t: tile.run({"latent_sample": t})["sample"], z, tile=16, overlap=8, scale=2.0,
                    out_channels=3)
    assert out.shape == full.shape == (1, 3, 48, 48)
    # GroupNorm sees a tile's statistics, so tiles differ a little from the whole image ...
    assert np.abs(out - full).mean() < 0.15 * np.abs(full).mean()
    # ... and no seam stands out: at the tile edges (x = 16 and 32) the step between neighbouring
    # columns is like the steps elsewhere
    steps = np.abs(np.diff(out, axis=3)).mean(axis=(0, 1, 2))
    for edge in (15, 31):
        assert steps[edge] < 2 * np.median(steps)
