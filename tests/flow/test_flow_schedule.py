"""sdrt.samplers.flowmatch against diffusers' FlowMatchEulerDiscreteScheduler (flow_schedules.json, refs.npz)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DATA, KINDS, cases, folder, refs

from sdrt.errors import SamplerError
from sdrt.samplers.flowmatch import (
    FlowMatchSchedule,
    calculate_shift,
    euler_step,
    flux_sigmas,
    img2img_timesteps,
    scale_noise,
)

ROWS = json.loads((DATA / "flow_schedules.json").read_text())


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}:{r['call']['num_inference_steps']}" for i, r in enumerate(ROWS)])
def test_timesteps_match_diffusers(row: dict) -> None:
    cfg = dict(row["config"])
    if cfg.get("use_dynamic_shifting"):
        cfg.update(base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15)
    sched = FlowMatchSchedule.from_config(cfg)
    call = row["call"]
    if "image_seq_len" in row:
        assert sched.mu_for(row["image_seq_len"]) == pytest.approx(row["mu"], rel=1e-12)
    sig = flux_sigmas(call["num_inference_steps"]) if "sigmas" in call else None
    if sig is not None:
        np.testing.assert_array_equal(sig, call["sigmas"])
    ts, sigmas = sched.timesteps(call["num_inference_steps"], sigmas=sig, mu=call.get("mu"))
    assert ts.dtype == np.float32 and sigmas.dtype == np.float32
    np.testing.assert_allclose(sigmas, row["sigmas"], rtol=0, atol=1e-7)
    np.testing.assert_allclose(ts, row["timesteps"], rtol=0, atol=1e-4)


def test_calculate_shift_matches_diffusers_endpoints() -> None:
    assert calculate_shift(256) == pytest.approx(0.5)
    assert calculate_shift(4096) == pytest.approx(1.15)
    with pytest.raises(SamplerError, match="image_seq_len"):
        calculate_shift(0)


@pytest.mark.parametrize("kind", KINDS)
def test_each_case_schedule_as_its_pipeline_ran_it(kind: str) -> None:
    """The folder's scheduler config, the case's size and steps -> the timesteps diffusers' pipeline walked."""
    config = json.loads((folder(kind) / "scheduler" / "scheduler_config.json").read_text())
    sched = FlowMatchSchedule.from_config(config)
    r = refs(kind)
    for case in cases(kind):
        name, steps = case["name"], case["steps"]
        h, w = (64, 64) if case["mode"] == "img2img" else (case["height"], case["width"])
        if kind == "sd3":
            ts, sig = sched.timesteps(steps)
        else:
            mu = sched.mu_for((h // 16) * (w // 16)) if sched.use_dynamic_shifting else None
            if mu is not None:
                assert mu == pytest.approx(float(r[f"{name}/scheduler/mu"]), rel=1e-12)
            ts, sig = sched.timesteps(steps, sigmas=flux_sigmas(steps), mu=mu)
        np.testing.assert_allclose(sig, r[f"{name}/scheduler/sigmas"], rtol=0, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(ts, r[f"{name}/scheduler/timesteps"], rtol=0, atol=1e-4, err_msg=name)
        if case["mode"] == "img2img":
            ts, sig, start = img2img_timesteps(ts, sig, steps, case["strength"])
            assert start == case["begin_index"], name
        calls_per_step = case["calls"] // len(ts)
        assert calls_per_step * len(ts) == case["calls"], name
        # the transformer saw these timesteps (SD3: t; Flux and Chroma: t / 1000), each step
        seen = [r[f"{name}/call{i * calls_per_step}/timestep"] for i in range(len(ts))]
        scale = 1.0 if kind == "sd3" else 1000.0
        for t, got in zip(ts, seen):
            np.testing.assert_allclose(got, np.float32(t) / np.float32(scale), rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_euler_steps_reproduce_diffusers_latents(kind: str) -> None:
    """Each recorded step: x_next = x + (sigma_next - sigma) * v, from the recorded transformer outputs and CFG."""
    r = refs(kind)
    for case in cases(kind):
        name = case["name"]
        sig = r[f"{name}/scheduler/sigmas"][case["begin_index"]:]
        lat = r[f"{name}/step_latents"]
        n = len(lat)
        per = case["calls"] // n
        x = r[f"{name}/call0/hidden_states"]
        for i in range(n):
            outs = [r[f"{name}/call{i * per + j}/out"] for j in range(per)]
            if kind == "sd3" and case["cfg"] > 1:  # one call on [negative, prompt] along the batch
                u, c = np.split(outs[0], 2)
                v = u + np.float32(case["cfg"]) * (c - u)
                x = x[: x.shape[0] // 2]
            elif per == 2:  # Flux true CFG and Chroma: cond call, then the negative
                c, u = outs
                v = u + np.float32(case["cfg"]) * (c - u)
            else:
                v = outs[0]
            x = euler_step(x, v, sig[i], sig[i + 1])
            np.testing.assert_allclose(x, lat[i], rtol=0, atol=2e-5, err_msg=f"{name} step {i}")
            if i + 1 < n:
                x = r[f"{name}/call{(i + 1) * per}/hidden_states"]


def test_scale_noise_and_bad_input() -> None:
    lat, noise = np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32)
    np.testing.assert_allclose(scale_noise(lat, noise, 0.25), 0.75)
    with pytest.raises(SamplerError, match="strength"):
        img2img_timesteps(np.zeros(3), np.zeros(4), 3, 1.5)
    with pytest.raises(SamplerError, match="mu"):
        FlowMatchSchedule(use_dynamic_shifting=True).timesteps(4)
    with pytest.raises(SamplerError, match="steps"):
        FlowMatchSchedule().timesteps(0)
    with pytest.raises(SamplerError, match="use_karras_sigmas"):
        FlowMatchSchedule.from_config({"use_karras_sigmas": True})
