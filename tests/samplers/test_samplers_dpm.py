"""dpm_fast and dpm_adaptive against k-diffusion's sample_dpm_fast / sample_dpm_adaptive (samplers_dpm.npz).

The references ran on the exact denoiser of Gaussian data in float64 over SD's sigma range (what A1111's
txt2img passes them), made by scripts/gen_sampler_refs.py --dpm-only. The final latents and every step of the
trajectory (the callback's sigma and x) must match to float64 round-off (the bar of test_samplers_reference:
1e-9 relative); with eta > 0 each step's noise is the k-th array of a fixed list and must be asked for with
the same (sigma, sigma_next). The adaptive runs must also accept and reject the same steps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _sampler_refs import GaussianVE, ListNoise, load, noise_list, rel_err, start_noise

from sdrt import samplers as S
from sdrt.errors import SamplerError
from sdrt.samplers.dpm_solver import fast_orders

TOL = 1e-9
FAST_CALLS = [1, 2, 3, 4, 5, 6, 10, 20]
ETA_CASES = [(1.0, 1.0), (0.5, 0.7)]
ADAPTIVE_CASES = {"default": {}, "order2": {"order": 2}, "rtol01": {"rtol": 0.1, "atol": 0.02},
                  "pid": {"pcoeff": 0.3, "icoeff": 0.9, "dcoeff": 0.2}, "eta1": {"eta": 1.0},
                  "eta05_snoise07": {"eta": 0.5, "s_noise": 0.7}}


def _run(name: str, sigmas: np.ndarray, **kw):
    ref = load("samplers_dpm")
    lo, hi = (float(v) for v in ref["range"])
    seen = []
    noise = ListNoise(noise_list(512)) if kw.get("eta") else None
    if noise is not None:
        kw["noise_sampler"] = noise
    model = GaussianVE()
    out = S.get_sampler(name)(model, start_noise() * hi, sigmas, callback=seen.append, sigma_min=lo, sigma_max=hi,
                              **kw)
    return out, seen, noise, model


def _check(key: str, out, seen, noise) -> None:
    ref = load("samplers_dpm")
    err = rel_err(out, ref[f"kd_{key}"])
    assert err <= TOL, f"{key}: relative error {err:.3g}"
    np.testing.assert_allclose([c["sigma"] for c in seen], ref[f"sigmas_{key}"], rtol=1e-12)
    traj = ref[f"traj_{key}"]
    assert len(seen) == len(traj)
    for k, (c, x) in enumerate(zip(seen, traj)):
        assert rel_err(c["x"], x) <= TOL, f"{key}: step {k}"
    if noise is not None:
        np.testing.assert_allclose(np.array(noise.calls).reshape(-1, 2), ref[f"calls_{key}"], rtol=1e-12)


@pytest.mark.parametrize("calls", FAST_CALLS)
def test_dpm_fast_matches_k_diffusion(calls):
    sigmas = np.linspace(14.0, 0.0, calls + 1)  # only its length counts when the range is given
    out, seen, noise, model = _run("dpm_fast", sigmas)
    _check(f"fast_{calls}", out, seen, noise)
    assert model.calls == calls  # the budget: exactly one model call per step asked for


@pytest.mark.parametrize("eta,s_noise", ETA_CASES)
@pytest.mark.parametrize("calls", FAST_CALLS)
def test_dpm_fast_with_eta_matches_k_diffusion(calls, eta, s_noise):
    out, seen, noise, _ = _run("dpm_fast", np.linspace(14.0, 0.0, calls + 1), eta=eta, s_noise=s_noise)
    _check(f"fast_{calls}_eta{eta:g}_snoise{s_noise:g}", out, seen, noise)


@pytest.mark.parametrize("case", ADAPTIVE_CASES)
def test_dpm_adaptive_matches_k_diffusion(case):
    out, seen, noise, model = _run("dpm_adaptive", np.array([14.0, 1.0, 0.0]), **ADAPTIVE_CASES[case])
    _check(f"adaptive_{case}", out, seen, noise)
    accepted, rejected, kd_calls = (int(v) for v in load("samplers_dpm")[f"info_adaptive_{case}"])
    assert (seen[-1]["n_accept"], seen[-1]["n_reject"]) == (accepted, rejected)
    # k-diffusion calls the model again at the start of a rejected step; sdrt reuses that call
    assert model.calls == kd_calls - rejected == seen[-1]["nfe"]


def test_the_range_defaults_to_the_sigmas_ends():
    """Without sigma_min/sigma_max: the first sigma and the smallest positive one (ComfyUI's rule)."""
    ref = load("samplers_dpm")
    lo, hi = (float(v) for v in ref["range"])
    sigmas = S.karras(10, lo, hi)
    x = start_noise() * hi
    for name in ("dpm_fast", "dpm_adaptive"):
        given = S.get_sampler(name)(GaussianVE(), x, sigmas, sigma_min=lo, sigma_max=hi)
        assert rel_err(S.get_sampler(name)(GaussianVE(), x, sigmas), given) <= TOL, name  # karras' ends: round-off
        assert rel_err(given, ref["kd_fast_10" if name == "dpm_fast" else "kd_adaptive_default"]) <= TOL


@pytest.mark.parametrize("calls", range(1, 40))
def test_fast_orders_spend_the_budget(calls):
    orders = fast_orders(calls)
    assert sum(orders) == calls and set(orders) <= {1, 2, 3}
    assert orders == sorted(orders, reverse=True)


def test_dpm_fast_progress_reaches_the_last_step():
    """The callback's i counts model calls (minus one): it ends on the last of len(sigmas) - 1 steps."""
    sigmas = S.karras(10, 0.03, 14.6)
    seen = []
    S.dpm_fast(GaussianVE(), start_noise() * sigmas[0], sigmas, callback=seen.append)
    assert [c["i"] for c in seen] == [2, 5, 8, 9]  # orders 3, 3, 3, 1


def test_dpm_adaptive_progress_is_monotone_and_ends_on_the_last_step():
    sigmas = S.karras(20, 0.03, 14.6)
    seen = []
    S.dpm_adaptive(GaussianVE(), start_noise() * sigmas[0], sigmas, callback=seen.append)
    steps = [c["i"] for c in seen]
    assert steps == sorted(steps) and 0 <= steps[0] and steps[-1] == 19
    assert all(c["sigma"] >= 0.03 - 1e-12 for c in seen)


def test_dpm_fast_eta_zero_draws_no_noise():
    sigmas = S.karras(6, 0.03, 14.6)

    def never(sigma, sigma_next):
        raise AssertionError("noise drawn at eta 0")

    for name in ("dpm_fast", "dpm_adaptive"):
        S.get_sampler(name)(GaussianVE(), start_noise() * sigmas[0], sigmas, noise_sampler=never)


def test_seeded_eta_is_repeatable_and_seed_dependent():
    sigmas = S.karras(9, 0.03, 14.6)
    x = start_noise() * sigmas[0]
    for name in ("dpm_fast", "dpm_adaptive"):
        fn = S.get_sampler(name)
        a = fn(GaussianVE(), x, sigmas, eta=1.0, extra_args={"seed": 3})
        assert np.array_equal(a, fn(GaussianVE(), x, sigmas, eta=1.0, extra_args={"seed": 3}))
        assert not np.array_equal(a, fn(GaussianVE(), x, sigmas, eta=1.0, extra_args={"seed": 4}))


def test_bad_arguments_are_one_clear_error():
    x = start_noise()
    with pytest.raises(SamplerError, match="order 4 is not 2 or 3"):
        S.dpm_adaptive(GaussianVE(), x, [1.0, 0.0], order=4)
    with pytest.raises(SamplerError, match="must be finite and above 0"):
        S.dpm_fast(GaussianVE(), x, [1.0, 0.5, 0.0], sigma_min=0.0)

    def nan_model(x, sigma, **kw):
        return np.full_like(x, math.nan)

    with pytest.raises(SamplerError, match="NaN"):
        S.dpm_adaptive(nan_model, x, [1.0, 0.5, 0.0])


def test_one_sigma_and_a_single_level_leave_x_alone():
    x = start_noise()
    for name in ("dpm_fast", "dpm_adaptive"):
        assert np.array_equal(S.get_sampler(name)(GaussianVE(), x, [1.0]), x)
        assert np.array_equal(S.get_sampler(name)(GaussianVE(), x, [1.0, 0.0]), x)  # sigma_min == sigma_max
