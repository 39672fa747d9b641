"""randn against torch.randn(shape, generator=torch.Generator().manual_seed(seed)), from committed torch output."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from _sampler_refs import load

from sdrt.errors import SamplerError
from sdrt.samplers import TorchGenerator, TorchNoiseSampler, randn


def _cases():
    d = load("randn")
    seeds = [int(s) for s in d["seeds"]]
    shapes = [tuple(int(v) for v in s.split(",")) for s in d["shapes"]]
    return d, seeds, shapes


def test_randn_matches_torch_bit_for_bit_over_all_recorded_seeds_and_shapes():
    d, seeds, shapes = _cases()
    checked = 0
    failures = []
    for si, hi, hashed, pos in d["cases"]:
        seed, shape = seeds[si], shapes[hi]
        ours = randn(seed, shape).reshape(-1)
        assert ours.dtype == np.float32
        if hashed:
            ok = (np.array_equal(ours[:16].view(np.uint32), d["heads"][pos].view(np.uint32))
                  and np.array_equal(ours[-16:].view(np.uint32), d["tails"][pos].view(np.uint32))
                  and hashlib.sha256(ours.astype("<f4").tobytes()).digest() == d["sha256"][pos].tobytes())
        else:
            ok = np.array_equal(ours.view(np.uint32), d["full"][pos:pos + ours.size].view(np.uint32))
        checked += 1
        if not ok:
            failures.append((seed, shape))
    assert checked == len(d["cases"]) >= 600
    assert not failures, f"{len(failures)} of {checked} differ, e.g. {failures[:5]}"


def test_seeds_near_zero_and_2_64_include_the_edges():
    _, seeds, _ = _cases()
    assert {0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1, -1, -(2**63)} <= set(seeds)


def test_seed_uses_low_32_bits_like_torch():
    assert np.array_equal(randn(5, (40,)), randn(5 + 2**32, (40,)))
    assert np.array_equal(randn(-1, (40,)), randn(2**64 - 1, (40,)))


def test_successive_draws_from_one_generator_match_torch():
    d = load("randn")
    g = TorchGenerator(2024)
    ours = np.concatenate([g.randn(s).reshape(-1) for s in [(2, 4, 6, 6), (5,), (2, 4, 6, 6)]])
    assert np.array_equal(ours.view(np.uint32), d["seq"].view(np.uint32))


def test_noise_sampler_is_comfyui_default_seed_plus_one():
    x = np.zeros((2, 4, 6, 6), np.float32)
    ns = TorchNoiseSampler(x, 2023)
    assert np.array_equal(ns(1.0, 0.5), randn(2024, x.shape))
    second = ns(0.5, 0.1)
    g = TorchGenerator(2024)
    g.randn(x.shape)
    assert np.array_equal(second, g.randn(x.shape))
    assert TorchNoiseSampler(x.astype(np.float64), 1)(1.0, 0.5).dtype == np.float64


def test_scalar_kernel_agrees_on_the_double_path_and_within_a_few_ulp_elsewhere():
    d, seeds, shapes = _cases()
    small = [(si, hi, pos) for si, hi, hashed, pos in d["cases"] if not hashed and np.prod(shapes[hi]) < 16]
    for si, hi, pos in small[:50]:
        ours = randn(seeds[si], shapes[hi], kernel="scalar").reshape(-1)
        assert np.array_equal(ours, d["full"][pos:pos + ours.size])
    a, b = randn(3, (4096,)), randn(3, (4096,), kernel="scalar")
    # Both kernels approximate the same Box-Muller values; they differ only in the last bits.
    assert np.abs(a - b).max() < 1e-5
    assert not np.array_equal(a, b)


def test_scalar_kernel_against_torch_default_capability_build():
    """torch with ATEN_CPU_CAPABILITY=default (no AVX2) uses libm; kernel="scalar" is within 1e-5 of it."""
    d = load("randn_default_capability")
    for seed, values in zip(d["seeds"], d["values"]):
        ours = randn(int(seed), (1, 4, 16, 16), kernel="scalar").reshape(-1)
        assert np.abs(ours - values).max() < 1e-5
        assert np.mean(ours == values) > 0.95
        # and the AVX2 kernel (the default) is not what that build gives
        assert not np.array_equal(randn(int(seed), (1, 4, 16, 16)).reshape(-1), values)


def test_randn_dtype_and_empty_shapes():
    assert randn(1, (3, 0)).shape == (3, 0)
    assert randn(1, ()).shape == ()
    assert randn(1, 20, dtype=np.float16).dtype == np.float16


@pytest.mark.parametrize("shape", [(-1, 3), ("a",), (2.5,)])
def test_bad_shape_is_a_sampler_error(shape):
    with pytest.raises(SamplerError, match="bad noise shape"):
        randn(0, shape)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_out_of_range_seed_is_a_sampler_error(seed):
    with pytest.raises(SamplerError, match="out of range"):
        randn(seed, (4,))


@pytest.mark.parametrize("seed", ["a", 1.5, None, True])
def test_a_seed_that_is_not_an_integer_is_an_input_error(seed):
    from sdrt.errors import InputError
    from sdrt.samplers import randn_cuda

    for draw in (randn, randn_cuda):
        with pytest.raises(InputError, match=r"the seed must be an integer, got .* Where: seed\."):
            draw(seed, (1, 4))


def test_unknown_kernel_is_a_sampler_error():
    with pytest.raises(SamplerError, match="unknown randn kernel"):
        randn(0, (4,), kernel="neon")
