"""Samplers against k-diffusion, ComfyUI and diffusers on the exact denoiser of Gaussian data.

Deterministic samplers must match within 1e-5 relative (the issue's bar); the
references and these runs are both float64, and every sampler agrees to
round-off (<= 3e-13), so the bar here is 1e-9, tight enough to catch a wrong
coefficient anywhere. Stochastic samplers match when given the same per-step
noise (the k-th noise call returns the k-th array of a fixed list) and must ask
for noise with the same (sigma, sigma_next).
"""

from __future__ import annotations

import numpy as np
import pytest
from _sampler_refs import GaussianFlow, GaussianVE, ListNoise, load, noise_list, rel_err, start_noise

from sdrt import samplers as S

TOL = 1e-9
KD = ["euler", "euler_ancestral", "heun", "dpm_2", "dpm_2_ancestral", "lms", "dpmpp_2s_ancestral", "dpmpp_sde",
      "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_2m_sde_heun", "dpmpp_3m_sde"]
COMFY_ONLY = ["ddpm", "lcm", "ipndm", "deis", "uni_pc", "uni_pc_bh2"]
STOCHASTIC = {"euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde", "dpmpp_2m_sde",
              "dpmpp_2m_sde_heun", "dpmpp_3m_sde", "ddpm", "lcm"}
FLOW = ["euler", "heun", "euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde", "dpmpp_2m",
        "dpmpp_2m_sde", "dpmpp_3m_sde", "lcm", "ipndm"]
SIGMAS = ["karras10", "normal8"]


def run(name: str, model, x: np.ndarray, sigmas: np.ndarray, **kwargs):
    noise = ListNoise(noise_list(64)) if name in STOCHASTIC else None
    if noise is not None:
        kwargs["noise_sampler"] = noise
    out = S.get_sampler(name)(model, x.copy(), sigmas, **kwargs)
    calls = np.array(noise.calls, dtype=np.float64).reshape(-1, 2) if noise else np.zeros((0, 2))
    return out, calls


def check(ref: dict, key: str, calls_key: str, out: np.ndarray, calls: np.ndarray) -> float:
    err = rel_err(out, ref[key])
    assert err <= TOL, f"{key}: relative error {err:.3g}"
    assert calls.shape == ref[calls_key].shape, f"{key}: {len(calls)} noise calls, reference made {len(ref[calls_key])}"
    np.testing.assert_allclose(calls, ref[calls_key], rtol=1e-9)
    return err


@pytest.mark.parametrize("sched", SIGMAS)
@pytest.mark.parametrize("name", KD)
def test_matches_k_diffusion(name, sched):
    ref = load("samplers")
    sigmas = ref[f"sigmas_{sched}"]
    options = {"denoise_last": False} if name == "lms" else {}  # k-diffusion's lms has no final denoise
    out, calls = run(name, GaussianVE(), start_noise() * sigmas[0], sigmas, **options)
    check(ref, f"kd_{name}_{sched}", f"kdcalls_{name}_{sched}", out, calls)


# k-diffusion's samplers that take eta and s_noise, at the (eta, s_noise) of scripts/gen_sampler_refs.py's
# ETA_CASES (samplers_eta.npz): eta 0 and 1 alone cannot tell eta * std from eta * variance, nor s_noise 1 a
# dropped s_noise.
ETA = ["euler_ancestral", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde", "dpmpp_2m_sde", "dpmpp_2m_sde_heun",
       "dpmpp_3m_sde"]
ETA_CASES = [(0.5, 1.0), (0.5, 0.7), (0.25, 1.3), (1.0, 0.8)]


@pytest.mark.parametrize("eta,s_noise", ETA_CASES)
@pytest.mark.parametrize("name", ETA)
def test_eta_and_s_noise_match_k_diffusion(name, eta, s_noise):
    ref = load("samplers_eta")
    sigmas = ref["sigmas_karras10"]
    out, calls = run(name, GaussianVE(), start_noise() * sigmas[0], sigmas, eta=eta, s_noise=s_noise)
    key = f"{name}_eta{eta:g}_snoise{s_noise:g}_karras10"
    check(ref, f"kd_{key}", f"kdcalls_{key}", out, calls)


@pytest.mark.parametrize("s_churn,s_noise", [(2.0, 0.7), (0.5, 1.3)])
@pytest.mark.parametrize("name", ["euler", "heun", "dpm_2"])
def test_churn_with_s_noise_matches_k_diffusion(name, s_churn, s_noise):
    """Karras' churn with s_noise other than 1; k-diffusion's randn_like draws were the same noise list."""
    ref = load("samplers_eta")
    sigmas = ref["sigmas_karras10"]
    noise = ListNoise(noise_list(64))
    out = S.get_sampler(name)(GaussianVE(), start_noise() * sigmas[0], sigmas, s_churn=s_churn, s_noise=s_noise,
                              noise_sampler=noise)
    key = f"{name}_churn{s_churn:g}_snoise{s_noise:g}_karras10"
    assert len(noise.calls) == int(ref[f"kddraws_{key}"])
    err = rel_err(out, ref[f"kd_{key}"])
    assert err <= TOL, f"{key}: relative error {err:.3g}"


def test_eta_cases_cover_every_sampler_with_eta():
    """Every registered sampler that takes eta and s_noise (bar the DDIM family, checked against diffusers, and
    dpm_fast/dpm_adaptive, whose eta cases are in test_samplers_dpm) has reference cases here."""
    import inspect

    takes = {n for n in S.available_samplers()
             if {"eta", "s_noise"} <= set(inspect.signature(S.get_sampler(n)).parameters)}
    assert takes - {"ddim", "ddpm", "lcm", "dpm_fast", "dpm_adaptive"} <= set(ETA), takes - set(ETA)
    ref = load("samplers_eta")
    assert all(f"kd_{n}_eta{e:g}_snoise{s:g}_karras10" in ref for n in ETA for e, s in ETA_CASES)


@pytest.mark.parametrize("sched", SIGMAS)
@pytest.mark.parametrize("name", KD + COMFY_ONLY)
def test_matches_comfyui(name, sched):
    ref = load("samplers")
    sigmas = ref[f"sigmas_{sched}"]
    out, calls = run(name, GaussianVE(), start_noise() * sigmas[0], sigmas)
    check(ref, f"comfy_{name}_{sched}", f"comfycalls_{name}_{sched}", out, calls)


@pytest.mark.parametrize("name", FLOW)
def test_matches_comfyui_on_a_flow_model(name):
    ref = load("samplers")
    sigmas = ref["sigmas_flow8"]
    model = GaussianFlow(S.sd3_schedule(3.0))
    out, calls = run(name, model, start_noise() * sigmas[0], sigmas)
    check(ref, f"comfyflow_{name}_flow8", f"comfyflowcalls_{name}_flow8", out, calls)


def test_ddim_equals_comfyui_ddim_which_is_euler():
    ref = load("samplers")
    sigmas = ref["sigmas_karras10"]
    out = S.ddim(GaussianVE(), start_noise() * sigmas[0], sigmas)
    assert rel_err(out, ref["comfy_euler_karras10"]) <= TOL


def test_ddim_matches_diffusers_ddim_scheduler():
    ref = load("samplers")
    ms = S.DiscreteSchedule("eps")
    timesteps = ref["diffusers_ddim_timesteps"]
    final_alpha = float(ref["diffusers_ddim_final_alpha"])
    sigmas = np.append(ms.sigmas[timesteps], np.sqrt((1 - final_alpha) / final_alpha))
    x = start_noise() * np.sqrt(1 + sigmas[0] ** 2)  # diffusers starts from unit-variance VP noise
    out = S.ddim(GaussianVE(), x, sigmas) * np.sqrt(final_alpha)
    # diffusers keeps alphas_cumprod in float32 (its betas are float32): 1.7e-7 apart, within the 1e-5 bar.
    assert rel_err(out, ref["diffusers_ddim_final"]) <= 1e-5


def test_euler_ancestral_with_comfyui_seeded_cpu_noise_in_float32():
    # The reference ComfyUI snapshot (Oct 2025) seeds its CPU noise generator with the seed itself;
    # newer ComfyUI adds 1 on the CPU, which is TorchNoiseSampler's default (offset=1).
    ref = load("samplers")
    sigmas = ref["sigmas_karras10"]
    model = GaussianVE(GaussianVE().mu.astype(np.float32))
    x = start_noise().astype(np.float32) * sigmas.astype(np.float32)[0]
    noise = S.TorchNoiseSampler(x, 31337, offset=0)
    out = S.euler_ancestral(model, x, sigmas.astype(np.float32), noise_sampler=noise)
    assert out.dtype == np.float32
    assert rel_err(out, ref["comfy32_euler_ancestral_seed31337"]) <= 1e-5
    seeded = S.euler_ancestral(model, x, sigmas.astype(np.float32), extra_args={"seed": 31336})
    assert np.array_equal(seeded, out)  # extra_args seed s uses the generator seeded s + 1


def test_eta_zero_ancestral_is_the_ode_sampler():
    sigmas = S.karras(8, 0.03, 14.6)
    x = start_noise() * sigmas[0]
    # The noise stream is still consumed (as in k-diffusion) but scaled by sigma_up = 0.
    a = S.euler_ancestral(GaussianVE(), x, sigmas, eta=0.0, noise_sampler=lambda s, t: np.ones(x.shape))
    assert rel_err(a, S.euler(GaussianVE(), x, sigmas)) < 1e-12


def test_samplers_keep_float32():
    sigmas = S.karras(6, 0.03, 14.6)
    x = (start_noise() * sigmas[0]).astype(np.float32)
    model = GaussianVE(GaussianVE().mu.astype(np.float32))
    for name in S.available_samplers():
        out = S.get_sampler(name)(model, x, sigmas, extra_args={"seed": 1})
        assert out.dtype == np.float32, name
        assert np.all(np.isfinite(out)), name


def test_callback_sees_every_step():
    seen = []
    sigmas = S.karras(5, 0.03, 14.6)
    S.dpmpp_2m(GaussianVE(), start_noise() * sigmas[0], sigmas, callback=seen.append)
    assert [c["i"] for c in seen] == list(range(5))
    assert {"x", "sigma", "sigma_hat", "denoised"} <= set(seen[0])


def test_stochastic_ddim_matches_diffusers_given_the_same_variance_noise():
    ref = load("samplers")
    ms = S.DiscreteSchedule("eps")
    timesteps = ref["diffusers_ddim_timesteps"]
    final_alpha = float(ref["diffusers_ddim_final_alpha"])
    sigmas = np.append(ms.sigmas[timesteps], np.sqrt((1 - final_alpha) / final_alpha))
    x = start_noise() * np.sqrt(1 + sigmas[0] ** 2)
    noise = ListNoise(noise_list(64))
    out = S.ddim(GaussianVE(), x, sigmas, eta=0.7, noise_sampler=noise) * np.sqrt(final_alpha)
    assert len(noise.calls) == len(timesteps)
    assert rel_err(out, ref["diffusers_ddim_eta07_final"]) <= 1e-5


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 10, 20])
def test_plms_matches_diffusers_pndm_scheduler_at_every_step(steps):
    """diffusers' PNDMScheduler with skip_prk_steps (PLMS) on the eps-prediction model of the same Gaussian data
    (samplers_plms.npz): its sample after each transition is plms's x at the next step's start, and the last one
    plms's result."""
    ref = load("samplers_plms")
    ms = S.DiscreteSchedule("eps")
    timesteps = sorted(set(ref[f"timesteps_{steps}"].tolist()), reverse=True)  # PLMS repeats one
    final_alpha = float(ref[f"final_alpha_{steps}"])
    sigmas = np.append(ms.sigmas[timesteps], np.sqrt((1 - final_alpha) / final_alpha))
    x = start_noise() * np.sqrt(1 + sigmas[0] ** 2)  # diffusers starts from unit-variance VP noise
    model, seen = GaussianVE(), []
    out = S.plms(model, x, sigmas, callback=seen.append)
    states = [c["x"] for c in seen[1:]] + [out]
    traj = ref[f"traj_{steps}"]
    assert len(traj) == len(states) == steps
    for k, (state, expected) in enumerate(zip(states, traj)):
        # to VP form; diffusers keeps alphas_cumprod in float32 (its betas are float32), as for DDIM above
        err = rel_err(state / np.sqrt(1 + sigmas[k + 1] ** 2), expected)
        assert err <= 1e-5, f"after step {k + 1} of {steps}: relative error {err:.3g}"
    assert model.calls == steps + (steps > 1)  # one more call than steps: the first step's corrector
