"""The numpy Brownian tree: determinism and the statistics of Brownian motion.

It is not torchsde's BrownianTree bit for bit (see sdrt.samplers.noise); the
stochastic samplers are compared with the references given the same noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _sampler_refs import GaussianVE, start_noise

from sdrt import samplers as S
from sdrt.errors import SamplerError

N = 20000


def test_same_seed_same_path_whatever_the_query_order():
    a = S.brownian_interval((N,), 0.0, 10.0, seed=7, dtype=np.float64)
    b = S.brownian_interval((N,), 0.0, 10.0, seed=7, dtype=np.float64)
    first = [a(1.0, 2.5), a(0.3, 9.1), a(4.0, 4.2)]
    second = [b(4.0, 4.2), b(0.3, 9.1), b(1.0, 2.5)][::-1]
    for x, y in zip(first, second):
        assert np.array_equal(x, y)


def test_different_seeds_are_uncorrelated():
    a = S.brownian_interval((N,), 0.0, 1.0, seed=1, dtype=np.float64)(0.0, 1.0)
    b = S.brownian_interval((N,), 0.0, 1.0, seed=2, dtype=np.float64)(0.0, 1.0)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05


def test_increments_add_up():
    w = S.brownian_interval((N,), 0.0, 14.6, seed=3, dtype=np.float64)
    np.testing.assert_allclose(w(0.1, 5.0) + w(5.0, 11.0), w(0.1, 11.0), atol=1e-9)
    np.testing.assert_allclose(w(2.0, 1.0), -w(1.0, 2.0))


@pytest.mark.parametrize(("s", "t"), [(0.0, 14.6), (0.03, 0.05), (1.0, 1.3), (3.0, 9.0), (0.5, 0.5000004)])
def test_increment_is_normal_with_variance_t_minus_s(s, t):
    w = S.brownian_interval((N,), 0.0, 14.6, seed=11, dtype=np.float64)(s, t) / math.sqrt(t - s)
    assert abs(w.mean()) < 0.05
    assert abs(w.var() - 1.0) < 0.05
    # fourth moment of a standard normal is 3
    assert abs(np.mean(w**4) - 3.0) < 0.3


def test_disjoint_increments_are_independent():
    w = S.brownian_interval((N,), 0.0, 14.6, seed=5, dtype=np.float64)
    a, b, c = w(0.2, 1.7), w(1.7, 6.0), w(6.0, 6.1)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05
    assert abs(np.corrcoef(b, c)[0, 1]) < 0.05


def test_noise_sampler_gives_unit_normals_consistent_across_substeps():
    x = np.zeros((N,), np.float64)
    ns = S.BrownianTreeNoiseSampler(x, 0.03, 14.6, seed=9)
    n = ns(14.6, 3.0)
    assert abs(n.std() - 1.0) < 0.05
    # dpmpp_sde asks for (sigma, sigma_mid) and then (sigma, sigma_next) on the same path:
    full = ns(3.0, 1.0) * math.sqrt(2.0)
    part = ns(3.0, 2.0) * 1.0 + ns(2.0, 1.0) * 1.0
    np.testing.assert_allclose(full, part, atol=1e-9)


def test_sde_samplers_are_deterministic_for_a_seed():
    sigmas = S.karras(8, 0.03, 14.6)
    x = start_noise() * sigmas[0]
    for sampler in (S.dpmpp_sde, S.dpmpp_2m_sde, S.dpmpp_3m_sde):
        a = sampler(GaussianVE(), x, sigmas, extra_args={"seed": 42})
        b = sampler(GaussianVE(), x, sigmas, extra_args={"seed": 42})
        c = sampler(GaussianVE(), x, sigmas, extra_args={"seed": 43})
        assert np.array_equal(a, b)
        assert not np.allclose(a, c)


def test_sde_sampler_reaches_the_data_distribution():
    """With exact denoising and enough steps, samples of N(mu, 0.25) come out with that mean and std."""
    shape = (1, 4, 64, 64)
    mu = np.full(shape, 0.7)
    model = GaussianVE(mu)
    sigmas = S.karras(30, 0.0292, 14.6)
    x = S.randn(3, shape).astype(np.float64) * sigmas[0]
    out = S.dpmpp_2m_sde(model, x, sigmas, extra_args={"seed": 3})
    assert abs(out.mean() - 0.7) < 0.03
    assert abs(out.std() - 0.5) < 0.03


def test_empty_interval_is_a_sampler_error():
    with pytest.raises(SamplerError, match="t0 < t1"):
        S.brownian_interval((4,), 1.0, 1.0, seed=0)


@pytest.mark.parametrize("name", ["dpmpp_sde", "dpmpp_2m_sde", "dpmpp_3m_sde"])
def test_sde_samplers_run_one_step(name):
    """One step (``sdrt generate --steps 1 --sampler "DPM++ SDE Karras"``, as SDXL Turbo/Lightning are run) has a
    single positive sigma, so the Brownian tree's range [sigma_min, sigma_max] was a point: 'Brownian interval needs
    t0 < t1 ... Where: sdrt.samplers.brownian_interval'. Its one step goes to 0 and draws no noise: it gives the
    model's denoised estimate, as k-diffusion's last step does."""
    sampler = getattr(S, name)
    model = GaussianVE()
    sigmas = np.array([14.6, 0.0])
    x = start_noise() * sigmas[0]
    out = sampler(model, x, sigmas, extra_args={"seed": 1})
    np.testing.assert_allclose(out, model(x, 14.6), rtol=1e-6, atol=1e-9)
