"""A1111's seeds: per-image generators, batches, variation seeds, resized seeds, ENSD, seed -1."""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.errors import SamplerError
from sdrt.samplers import (
    ImageNoise,
    batch_seeds,
    make_generator,
    randn,
    randn_cuda,
    randn_nv,
    resolve_seed,
    rng_infotext,
    seed_infotext,
    slerp,
)

SHAPE = (4, 16, 24)


@pytest.mark.parametrize("rng,draw", [("gpu", randn_cuda), ("cpu", randn), ("nv", randn_nv)])
def test_each_image_gets_its_own_generator(rng, draw):
    noise = ImageNoise(SHAPE, [10, 11, 12], rng=rng).first()
    assert noise.shape == (3, *SHAPE) and noise.dtype == np.float32
    for i, seed in enumerate([10, 11, 12]):
        assert np.array_equal(noise[i], draw(seed, SHAPE))


def test_batch_seeds_step_the_seed_or_the_variation_seed_as_a1111():
    assert batch_seeds(100, 7, 3) == ([100, 101, 102], [7, 8, 9])
    assert batch_seeds(100, 7, 3, subseed_strength=0.3) == ([100, 100, 100], [7, 8, 9])
    with pytest.raises(SamplerError):
        batch_seeds(1, 1, 0)


def test_seed_minus_one_is_random_and_in_a1111s_range():
    seeds = {resolve_seed(-1) for _ in range(20)}
    assert len(seeds) > 1 and all(0 <= s < 4294967294 for s in seeds)
    assert resolve_seed(None) >= 0
    assert resolve_seed(42) == 42


def test_later_draws_continue_each_generator():
    n = ImageNoise(SHAPE, [3, 4], rng="gpu")
    first, second = n.first(), n.next()
    for i, seed in enumerate([3, 4]):
        g = make_generator("gpu", seed)
        assert np.array_equal(first[i], g.randn(SHAPE))
        assert np.array_equal(second[i], g.randn(SHAPE))


def test_next_before_first_gives_the_initial_noise():
    assert np.array_equal(ImageNoise(SHAPE, [5], rng="cpu").next(), ImageNoise(SHAPE, [5], rng="cpu").first())


def test_eta_noise_seed_delta_reseeds_the_later_draws():
    n = ImageNoise(SHAPE, [3], rng="cpu", eta_noise_seed_delta=31337)
    n.first()
    assert np.array_equal(n.next()[0], randn(3 + 31337, SHAPE))


def test_variation_strength_zero_and_one():
    base = ImageNoise(SHAPE, [1], subseeds=[2], subseed_strength=0.0).first()[0]
    assert np.array_equal(base, randn_cuda(1, SHAPE))
    full = ImageNoise(SHAPE, [1], subseeds=[2], subseed_strength=1.0).first()[0]
    assert np.allclose(full, randn_cuda(2, SHAPE), atol=1e-5)


def test_slerp_is_a1111s_per_column_slerp():
    rng = np.random.default_rng(0)
    low, high = rng.standard_normal((2, *SHAPE)).astype(np.float32)
    out = slerp(0.25, low, high)
    # every (channel, column) vector along H is a great-circle mix of its own two vectors
    for c in range(SHAPE[0]):
        for x in range(SHAPE[2]):
            a, b = low[c, :, x].astype(np.float64), high[c, :, x].astype(np.float64)
            omega = np.arccos(np.dot(a / np.linalg.norm(a), b / np.linalg.norm(b)))
            want = (np.sin(0.75 * omega) * a + np.sin(0.25 * omega) * b) / np.sin(omega)
            assert np.allclose(out[c, :, x], want, atol=1e-5)


def test_slerp_of_nearly_equal_noises_uses_a1111s_linear_weights():
    low = np.ones(SHAPE, np.float32)
    high = low * 1.0001
    assert np.allclose(slerp(0.2, low, high), low * 0.2 + high * 0.8)
    with pytest.raises(SamplerError):
        slerp(0.5, low, high[:2])


def test_variation_noise_mixes_seed_and_subseed():
    n = ImageNoise(SHAPE, [1, 1], subseeds=[2, 3], subseed_strength=0.4, rng="nv").first()
    for i, sub in enumerate([2, 3]):
        assert np.allclose(n[i], slerp(0.4, randn_nv(1, SHAPE), randn_nv(sub, SHAPE)), atol=1e-6)
    assert not np.allclose(n[0], n[1])


def test_resize_seed_from_a_smaller_size_pastes_it_centred():
    shape = (4, 16, 16)
    n = ImageNoise(shape, [7], seed_resize_from=(64, 64), rng="cpu").first()[0]  # 8x8 latent noise
    small = randn(7, (4, 8, 8))
    g = make_generator("cpu", 7)
    full = g.randn(shape)
    full[:, 4:12, 4:12] = small
    assert np.array_equal(n, full)


def test_resize_seed_from_a_larger_size_crops_it_centred():
    shape = (4, 8, 8)
    n = ImageNoise(shape, [7], seed_resize_from=(128, 128), rng="gpu").first()[0]  # 16x16 latent noise
    big = randn_cuda(7, (4, 16, 16))
    assert np.array_equal(n, big[:, 4:12, 4:12])


def test_infotext_names_the_source_as_a1111():
    assert rng_infotext("gpu") == {}
    assert rng_infotext("CPU") == {"RNG": "CPU"}
    assert rng_infotext("nv") == {"RNG": "NV"}


@pytest.mark.parametrize("kwargs", [{"rng": "tpu"}, {"subseed_strength": 1.5}, {"seeds": []},
                                    {"shape": (4, 8)}, {"seed_resize_from": (4, 4)}])
def test_bad_arguments_raise_sampler_error(kwargs):
    args = {"shape": SHAPE, "seeds": [1]}
    args.update(kwargs)
    with pytest.raises(SamplerError):
        ImageNoise(args.pop("shape"), args.pop("seeds"), **args).first()


def test_seed_infotext_fields_as_a1111_writes_them():
    assert seed_infotext(5) == {"Seed": 5}
    assert seed_infotext(5, subseed=9, subseed_strength=0.25, seed_resize_from=(512, 768), rng="cpu") == {
        "Seed": 5, "Variation seed": 9, "Variation seed strength": 0.25, "Seed resize from": "512x768", "RNG": "CPU"}
    assert seed_infotext(5, subseed=9) == {"Seed": 5}  # no strength: no variation fields
    assert "ENSD" not in seed_infotext(5, eta_noise_seed_delta=31337)
    assert seed_infotext(5, eta_noise_seed_delta=31337, uses_eta_noise=True)["ENSD"] == 31337
    with pytest.raises(SamplerError):
        seed_infotext(5, subseed_strength=0.5)
