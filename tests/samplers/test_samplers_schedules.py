"""Schedules against k-diffusion, ComfyUI and diffusers (committed reference sigmas), within 1e-6."""

from __future__ import annotations

import numpy as np
import pytest
from _sampler_refs import load

from sdrt import samplers as S
from sdrt.errors import SamplerError

STEPS = [1, 2, 4, 10, 25]
MODELS = {
    "eps": S.DiscreteSchedule("eps"),
    "sd3": S.sd3_schedule(3.0),
    "flux": S.FlowSchedule(mu=1.15, multiplier=1.0, num_timesteps=10000),  # ComfyUI ModelSamplingFlux default
}
NAMES = ["karras", "exponential", "polyexponential", "kl_optimal", "normal", "simple", "ddim_uniform", "beta",
         "linear_quadratic", "sgm_uniform"]


def _close(ours: np.ndarray, ref: np.ndarray, rtol: float = 1e-6) -> None:
    assert ours.shape == ref.shape, (ours, ref)
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=1e-9)


def test_discrete_sigma_table_matches_comfyui():
    _close(MODELS["eps"].sigmas, load("schedules")["discrete_sigmas"])


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", NAMES)
def test_schedule_matches_reference(name, model):
    ref = load("schedules")
    for n in STEPS:
        ours = S.get_sigmas(name, n, MODELS[model])
        if name == "kl_optimal" and n == 1:
            # ComfyUI divides 0 by 0 here and returns [nan, 0]; we return [sigma_max, 0].
            assert np.isnan(ref[f"{name}_{model}_{n}"][0]) and ours[0] == pytest.approx(MODELS[model].sigma_max)
            continue
        _close(ours, ref[f"{name}_{model}_{n}"])
        assert ours.dtype == np.float64


@pytest.mark.parametrize("model_type", ["SD1", "SDXL"])
def test_align_your_steps_matches_comfyui_node(model_type):
    ref = load("schedules")
    for n in STEPS + [30]:
        _close(S.align_your_steps(n, model_type), ref[f"ays_{model_type}_{n}"])
    assert S.align_your_steps(10, model_type)[0] == pytest.approx(14.6146412293)


def test_align_your_steps_through_get_sigmas_and_unknown_table():
    assert np.array_equal(S.get_sigmas("align_your_steps", 10, MODELS["eps"], model_type="SDXL"),
                          S.align_your_steps(10, "SDXL"))
    with pytest.raises(SamplerError, match="no Align Your Steps table"):
        S.align_your_steps(10, "SD9")


@pytest.mark.parametrize("n", [4, 10, 28])
def test_sd3_normal_schedule_equals_diffusers_flow_match_euler(n):
    _close(S.get_sigmas("normal", n, S.sd3_schedule(3.0)), load("schedules")[f"diffusers_sd3_{n}"])


@pytest.mark.parametrize("size", [(512, 512), (1024, 1024), (768, 1344)])
def test_flux_shift_and_sigmas_equal_diffusers(size):
    ref = load("schedules")
    w, h = size
    mu = S.flux_mu(w, h)
    assert mu == pytest.approx(float(ref[f"diffusers_flux_mu_{w}x{h}"]), rel=1e-12)
    ms = S.flux_schedule(w, h)
    for n in (4, 10, 28):
        ours = np.append(ms.shifted(np.linspace(1.0, 1 / n, n)), 0.0)
        _close(ours, ref[f"diffusers_flux_{n}_{w}x{h}"])


def test_sigma_to_timestep_is_kdiffusion_log_sigma_interpolation():
    ref = load("schedules")
    ms = MODELS["eps"]
    np.testing.assert_allclose(ms.timestep(ref["t_probe_sigma"]), ref["t_probe_t"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ms.sigma(np.array([0.0, 0.5, 10.25, 500.7, 998.9, 999.0])), ref["t_probe_back"],
                               rtol=1e-6)
    assert ms.timestep(ms.sigma(123.0), quantize=True) == 123.0


def test_discard_penultimate_rule_for_dpm2_and_unipc():
    ms = MODELS["eps"]
    for sampler in ("dpm_2", "dpm_2_ancestral", "uni_pc", "uni_pc_bh2"):
        full = S.get_sigmas("karras", 11, ms)
        got = S.get_sigmas("karras", 10, ms, sampler=sampler)
        assert len(got) == 11
        assert np.array_equal(got, np.concatenate([full[:-2], full[-1:]]))
    assert len(S.get_sigmas("karras", 10, ms, sampler="euler")) == 11
    assert np.array_equal(S.get_sigmas("karras", 10, ms, sampler="dpmpp_3m_sde", discard_penultimate=True),
                          S.get_sigmas("karras", 10, ms, sampler="dpm_2"))


def test_every_schedule_is_decreasing_and_ends_in_zero():
    for name in S.available_schedules():
        for model in MODELS.values():
            sig = S.get_sigmas(name, 12, model)
            assert sig[-1] == 0.0 and np.all(np.diff(sig) <= 0), name


@pytest.mark.parametrize("steps", [0, -3, 2.5, True])
def test_bad_steps_is_a_sampler_error(steps):
    with pytest.raises(SamplerError, match="steps must be a positive int"):
        S.karras(steps, 0.03, 14.6)


def test_unknown_schedule_lists_the_valid_ones():
    with pytest.raises(SamplerError) as info:
        S.get_sigmas("karas", 10, MODELS["eps"])
    assert "karras" in str(info.value) and "exponential" in str(info.value)


def test_bad_model_sampling_arguments():
    with pytest.raises(SamplerError, match="prediction"):
        S.DiscreteSchedule("x_start")  # "x0" is diffusers' "sample" (test_samplers_denoisers.py)
    with pytest.raises(SamplerError, match="not positive"):
        S.flux_mu(0, 512)
