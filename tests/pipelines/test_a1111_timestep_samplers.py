"""A1111's img2img cut for DDIM and PLMS (sdrt.pipelines.compvis) against A1111's own ``CompVisSampler.sample_img2img``
with its ``ddim`` and ``plms`` (tests/pipelines/data/a1111_timestep_steps.json, scripts/gen_a1111_timestep_refs.py):
the timestep the latent is noised to, the timestep of every model call, and the factor the latent ends scaled by
with a prediction of 0, for img2img with ``img2img_fix_steps`` off and on and for the hires pass; then DDIM
img2img end to end against diffusers' ``DDIMScheduler`` and UNet stepped over A1111's timesteps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import InputError, SdrtError
from sdrt.pipelines import compvis
from sdrt.pipelines.hires import parse, second_pass_steps
from sdrt.pipelines.strength import schedule
from sdrt.samplers import resolve

TABLE = json.loads((Path(__file__).resolve().parent / "data" / "a1111_timestep_steps.json").read_text())


@pytest.fixture(scope="module")
def ms():
    register("reference")
    pipe = pipelines.load(DATA / "tiny-sd15", backend="reference")
    return pipe.schedule  # SD 1.x's scaled-linear schedule, as A1111's alphas_cumprod


def _length_start(row: dict) -> tuple[int, int]:
    if row["hires"] is not None:
        return second_pass_steps(parse(2, row["hires"], row["strength"], None), row["steps"])[0], \
            second_pass_steps(parse(2, row["hires"], row["strength"], None), row["steps"])[0] - row["hires"]
    length, start = schedule(row["steps"], row["strength"], "a1111-fix-steps" if row["fix"] else "a1111")
    return length, start


class _Zero:
    """A model whose noise prediction is 0, recording the timestep of each call."""

    def __init__(self, ms) -> None:
        self.ms, self.calls = ms, []

    def predict(self, x, t, **kw):  # DDIMLoop: (latent, timestep) -> eps
        self.calls.append(int(round(t)))
        return np.zeros_like(x)

    def __call__(self, x, sigma, **kw):  # KLoop: (latent, sigma) -> denoised; eps 0 is the latent itself
        self.calls.append(int(np.abs(self.ms.sigmas_f32 - np.float32(sigma)).argmin()))
        return x


@pytest.mark.parametrize("sampler", ["DDIM", "PLMS"])
def test_the_cut_is_a1111s(ms, sampler: str) -> None:
    checked = 0
    for row in (r for r in TABLE if r["sampler"] == sampler):
        length, start = _length_start(row)
        choice = resolve(sampler)
        if "error" in row:  # A1111's range() of step 0: a schedule past 1000 steps
            with pytest.raises(InputError, match="1000 steps at most"):
                compvis.loop(ms, choice, length, start, seed=1, generator=None)
            continue
        loop = compvis.loop(ms, choice, length, start, seed=1, generator=None)
        assert loop is not None
        model = _Zero(ms)
        image = np.ones((1, 4, 2, 2), np.float32)
        x = loop.start(np.zeros_like(image), image)
        xi = np.float32(np.sqrt(ms.alphas_cumprod_f32[row["noise_t"]]))
        assert x.reshape(-1)[0] * (1 if sampler == "DDIM" else np.sqrt(ms.alphas_cumprod_f32[loop.first_t])) == \
            pytest.approx(xi, rel=1e-6), row
        out = loop.run(model, x)
        assert model.calls == row["calls"], row
        assert float(out.reshape(-1)[0]) / xi == pytest.approx(row["scale"], rel=2e-5), row
        assert loop.steps == max(len(row["calls"]) - (sampler == "PLMS" and len(row["calls"]) > 0), 0)
        checked += 1
    assert checked > 200


class _Linear:
    """A model whose noise prediction is ``0.2 x + 0.001 t`` (x the latent as A1111's solver keeps it, t the UNet's
    input time), recording t."""

    def __init__(self, ms) -> None:
        self.ms, self.calls = ms, []

    def __call__(self, x, sigma, **kw):  # KLoop: (latent, sigma) -> denoised
        sigma = float(sigma)
        t = float(self.ms.timestep(sigma))
        self.calls.append(t)
        eps = 0.2 * (x / np.sqrt(1 + sigma * sigma)) + 0.001 * t
        return (x - sigma * eps).astype(np.float32)


def test_unipc_is_a1111s(ms) -> None:
    """A1111's UniPC img2img: its own solver (order 3, time_uniform, bh1) run by scripts/gen_a1111_timestep_refs.py on
    a linear model; sdrt's UniPC on the sigmas of the same points gives its calls' input times and its result."""
    checked = 0
    for row in (r for r in TABLE if r["sampler"] == "UniPC"):
        length, start = _length_start(row)
        if "error" in row or row["out"] is None:  # a schedule past 1000 steps; fewer solver steps than its order
            # (A1111's error rows: range() of step 0, or t_enc 0, whose empty timesteps its unipc indexes)
            with pytest.raises(SdrtError, match="1000 steps at most|fewer than its order|at least 4 steps" if "error"
                               in row else "fewer than its order|at least 4 steps in the hires pass"):
                compvis.loop(ms, resolve("UniPC"), length, start, seed=1, generator=None,
                             where="hires_denoise" if row["hires"] else "strength")
            continue
        loop = compvis.loop(ms, resolve("UniPC"), length, start, seed=1, generator=None)
        model = _Linear(ms)
        image = np.ones((1, 4, 2, 2), np.float32)
        out = loop.run(model, loop.start(np.zeros_like(image), image))
        np.testing.assert_allclose(model.calls, row["calls"], atol=0.05, err_msg=str(row))
        assert float(out.reshape(-1)[0]) == pytest.approx(row["out"], rel=2e-4, abs=2e-5), row
        checked += 1
    assert checked > 120


def test_other_samplers_and_schedules_keep_the_sigma_cut(ms) -> None:
    """Only A1111's DDIM, PLMS and UniPC labels (their own schedule) cut this way; Euler, "DDIM Karras" do not."""
    for name, schedule_name in (("Euler", None), ("DDIM", "karras"), ("LMS", None), ("DPM++ 2M", None)):
        assert compvis.loop(ms, resolve(name, schedule_name), 20, 9, seed=1, generator=None) is None


def test_ddim_img2img_matches_diffusers_on_a1111s_timesteps() -> None:
    """tiny-sd15 DDIM img2img under strength_rule a1111 (20 steps, strength 0.5: noised to 501, 9 steps at 451 ...
    51) against diffusers' DDIMScheduler.step and UNet over those timesteps (scripts/gen_a1111_timestep_refs.py's
    companion: scripts/gen_compvis_ddim_refs.py)."""
    ref = np.load(DATA / "tiny-sd15" / "compvis_ddim_refs.npz")
    cases = json.loads((DATA / "tiny-sd15" / "compvis_ddim_refs.json").read_text())
    for backend in ("reference", "openvino"):
        register(backend)
        with pipelines.load(DATA / "tiny-sd15", backend=backend) as pipe:
            for case in cases:
                got = pipe(case["prompt"], case["negative_prompt"], steps=case["steps"], cfg=case["cfg"],
                           sampler=case["sampler"], seed=case["seed"], init_image=ref["init_image"],
                           strength=case["strength"], strength_rule=case["rule"])
                assert_matches_diffusers(got, ref[case["name"]])


@pytest.mark.parametrize(("sampler", "second"), [("DDIM", 3), ("PLMS", 3), ("UniPC", 4), ("Euler", 5)])
def test_the_step_callbacks_total_counts_the_hires_steps_that_run(sampler: str, second: int) -> None:
    """A1111's DDIM and PLMS run hires_steps - 2 steps in the hires pass, its UniPC hires_steps - 1: the step
    callback's total says so, and its last call is step total of total (it said 9 and stopped at 7)."""
    register("openvino")
    seen: list[tuple[int, int]] = []
    with pipelines.load(DATA / "tiny-sd15-dyn", backend="openvino") as pipe:
        pipe.generate("a cat", steps=4, sampler=sampler, seed=1, width=64, height=64, hires_scale=2, hires_steps=5,
                      hires_denoise=0.5, callback=lambda step, total, latents: seen.append((step, total)))
    assert seen == [(i, 4 + second) for i in range(1, 4 + second + 1)]


def test_unipc_below_its_order_under_fixed_steps_asks_for_more_steps() -> None:
    """Under A1111's fixed img2img steps UniPC's solver takes steps - 1 whatever the strength: the refusal asks for
    more steps, not a higher strength (which changes nothing there)."""
    register("openvino")
    with pipelines.load(DATA / "tiny-sd15-dyn", backend="openvino") as pipe:
        image = np.zeros((64, 64, 3), np.uint8)
        with pytest.raises(InputError, match=r"as 2 steps of its solver \(steps less one") as exc:
            pipe.generate("a cat", steps=3, sampler="UniPC", seed=1, init_image=image, strength=0.9,
                          strength_rule="a1111-fix-steps")
        assert exc.value.where == "steps" and "steps=4 or more" in str(exc.value) and "\n" not in str(exc.value)
        assert "raise strength" not in str(exc.value)
        with pytest.raises(InputError, match="int\\(strength x steps\\)") as exc:  # the a1111 rule: the strength
            pipe.generate("a cat", steps=20, sampler="UniPC", seed=1, init_image=image, strength=0.1,
                          strength_rule="a1111")
        assert exc.value.where == "strength"
