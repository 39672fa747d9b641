"""The folder's discretization against diffusers' schedulers (tests/data/pipelines/schedules.json).

The table holds diffusers' timesteps, sigmas and init_noise_sigma for Euler, Euler a, DPM++ 2M Karras
and DDIM, for 1, 7 and 20 steps, under every timestep_spacing and steps_offset, SD 1.5's release config
(timestep_spacing unset: each scheduler's own default applies), SDXL's with log-linear interpolation
and a linear-beta config.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import DATA, assert_matches_diffusers

from sdrt.errors import ModelError
from sdrt.pipelines.scheduling import FolderSchedule

ROWS = json.loads((DATA / "schedules.json").read_text())
#: zero terminal SNR (rescale_betas_zero_snr, v-prediction), every spacing (scripts/gen_zsnr_refs.py)
ZSNR = json.loads((DATA / "zsnr_schedules.json").read_text())


def _plan(ms: FolderSchedule, sampler: str, steps: int):
    if sampler in ("Euler", "Euler a"):
        return ms.euler_plan(steps, ancestral=sampler == "Euler a")
    if sampler == "DPM++ 2M Karras":
        return ms.dpm_plan(steps, karras=True)
    return ms.ddim_plan(steps)


def _check_plan(row: dict, sigma_rtol: float = 2e-6, noise_sigma: bool = True) -> FolderSchedule:
    """The row's sampler planned on its config against diffusers' timesteps, sigmas and init_noise_sigma; the
    schedule."""
    ms = FolderSchedule.from_config(row["config"])
    plan = _plan(ms, row["sampler"], row["steps"])
    np.testing.assert_allclose(plan.timesteps, row["timesteps"], rtol=0, atol=1e-3)
    if row["sigmas"]:
        np.testing.assert_allclose(plan.sigmas, row["sigmas"], rtol=sigma_rtol, atol=1e-7)
    if noise_sigma:
        assert plan.init_noise_sigma == pytest.approx(row["init_noise_sigma"], rel=1e-6)
    return ms


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}:{r['sampler']}:{r['steps']}" for i, r in enumerate(ROWS)])
def test_plan_matches_diffusers(row: dict) -> None:
    _check_plan(row)


@pytest.mark.parametrize("row", ZSNR, ids=[f"{r['config']['timestep_spacing']}:{r['sampler']}:{r['steps']}"
                                         for r in ZSNR])
def test_zero_terminal_snr_plan_matches_diffusers(row: dict) -> None:
    ms = _check_plan(row)  # sigma_max 4096: diffusers' Euler and DPM-Solver set the last alphas_cumprod to 2**-24
    for t, want in row["alphas_cumprod"].items():
        if row["sampler"] == "DDIM" and t == "999":
            assert want == 0.0 and ms.alphas_cumprod_f32[999] == np.float32(2.0**-24)  # DDIM keeps the zero
            assert ms.ddim_ac[999] == 0.0 and ms.ddim_alpha(999) == 0.0  # and DDIMLoop reads it
        else:
            assert ms.alphas_cumprod_f32[int(t)] == pytest.approx(want, rel=1e-6, abs=1e-10)


def test_table_covers_every_spacing_and_the_release_configs() -> None:
    spacings = {r["config"].get("timestep_spacing") for r in ROWS}
    assert spacings == {"leading", "linspace", "trailing", None}
    assert {r["sampler"] for r in ROWS} == {"Euler", "Euler a", "DPM++ 2M Karras", "DDIM"}


def test_unset_spacing_takes_each_schedulers_default() -> None:
    ms = FolderSchedule.from_config({"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
                                     "steps_offset": 1})
    assert ms.euler_plan(4).timesteps[0] == 999.0  # Euler: linspace
    assert ms.ddim_plan(4).timesteps == [751.0, 501.0, 251.0, 1.0]  # DDIM: leading + steps_offset


def test_diffusers_use_default_values_counts_as_unset() -> None:
    cfg = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
           "timestep_spacing": "leading", "_use_default_values": ["timestep_spacing"]}
    assert FolderSchedule.from_config(cfg).euler_plan(4).timesteps[0] == 999.0


@pytest.mark.parametrize(("config", "message"), [
    ({"prediction_type": "x_start"}, "prediction_type 'x_start'"),  # 'sample' is x0 (test_x0_prediction.py)
    ({"timestep_spacing": "sideways"}, "timestep_spacing 'sideways'"),
    ({"beta_schedule": "cubic"}, "beta_schedule 'cubic'"),
    ({"trained_betas": [0.1, 0.2]}, "trained_betas has 2 values"),
    ({"interpolation_type": "cubic"}, "interpolation_type 'cubic'"),
])
def test_bad_scheduler_configs_raise_model_errors(config: dict, message: str) -> None:
    with pytest.raises(ModelError, match=message) as info:
        FolderSchedule.from_config(config, "x/scheduler").euler_plan(4)
    assert "x/scheduler" in str(info.value)


def test_squaredcos_and_linear_betas_build() -> None:
    for kind in ("squaredcos_cap_v2", "linear"):
        ms = FolderSchedule.from_config({"beta_schedule": kind})
        assert np.all(np.diff(ms.sigmas) > 0)
        assert ms.dpm_plan(5).sigmas[-1] == 0.0


ZTSNR = json.loads((DATA / "ztsnr_schedules.json").read_text())


def test_zero_terminal_snr_alphas_match_diffusers() -> None:
    """``rescale_betas_zero_snr`` (ZTSNR-trained models such as NoobAI-XL v-pred): diffusers' rescaled betas, with the
    last alphas_cumprod set to 2**-24 as its Euler and DPM-Solver schedulers set it."""
    ms = FolderSchedule.from_config(ZTSNR["rows"][0]["config"])
    np.testing.assert_allclose(ms.alphas_cumprod_f32, ZTSNR["alphas_cumprod"], rtol=1e-4, atol=1e-12)
    assert ms.alphas_cumprod_f32[-1] == np.float32(2.0**-24)


def test_a_zero_terminal_snr_schedule_written_as_trained_betas() -> None:
    """A ZTSNR model whose scheduler config lists its betas (the last one 1, alpha 0) with rescale_betas_zero_snr:
    diffusers' alphas again; without the flag its samplers would divide by alpha 0, so it is refused saying so."""
    ac = np.asarray(ZTSNR["alphas_cumprod"], np.float64)
    ac[-1] = 0.0  # diffusers' Euler set it to 2**-24; the schedule itself ends at 0
    betas = 1 - ac / np.concatenate([[1.0], ac[:-1]])
    cfg = {k: v for k, v in ZTSNR["rows"][0]["config"].items() if not k.startswith("beta_")}
    ms = FolderSchedule.from_config({**cfg, "trained_betas": betas.tolist()})
    assert betas[-1] == 1.0 and ms.alphas_cumprod_f32[-1] == np.float32(2.0**-24)
    np.testing.assert_allclose(ms.alphas_cumprod_f32, ZTSNR["alphas_cumprod"], rtol=1e-4, atol=1e-12)
    with pytest.raises(ModelError, match="its last beta is 1: a zero-terminal-SNR schedule") as info:
        FolderSchedule.from_config({**cfg, "rescale_betas_zero_snr": False, "trained_betas": betas.tolist()})
    assert "rescale_betas_zero_snr: true" in str(info.value)


@pytest.mark.parametrize("row", ZTSNR["rows"], ids=[f"{r['config']['timestep_spacing']}:{r['sampler']}:{r['steps']}"
                                                    for r in ZTSNR["rows"]])
def test_zero_terminal_snr_sdxl_rows_match_diffusers(row: dict) -> None:
    # the rescale subtracts the last sqrt(alphas_cumprod) from every one: float32 rounding of the cumulative product
    # (1 ulp) comes out up to 1e-4 relative at the noisy end, in diffusers and here alike; diffusers' DDIM keeps
    # alphas_cumprod[-1] = 0 (its init_noise_sigma is 1 anyway)
    _check_plan(row, sigma_rtol=1e-4, noise_sigma=row["sampler"] != "DDIM")


def _zero_snr_copy(tmp_path) -> Path:
    """A copy of tiny-sdxl whose scheduler is zero terminal SNR, v-prediction, trailing (scripts/make_ztsnr_refs.py)."""
    import shutil

    folder = tmp_path / "tiny-sdxl-ztsnr"
    shutil.copytree(DATA / "tiny-sdxl", folder)
    cfg_path = folder / "scheduler" / "scheduler_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(rescale_betas_zero_snr=True, prediction_type="v_prediction", timestep_spacing="trailing")
    cfg_path.write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("sampler", ["Euler", "DPM++ 2M Karras", "DDIM"])
def test_zero_terminal_snr_image_matches_diffusers(sampler: str, tmp_path) -> None:
    """tiny-sdxl with ``rescale_betas_zero_snr``, v-prediction and trailing spacing (its first step at sigma 4096)
    against diffusers' image (scripts/make_ztsnr_refs.py), with test_pipelines_diffusers.py's tolerance."""
    from pipeline_helpers import register

    from sdrt import pipelines

    register("reference")
    want = np.load(DATA / "ztsnr_refs.npz")[f"txt2img/{sampler}"]
    with pipelines.load(_zero_snr_copy(tmp_path), backend="reference") as pipe:
        got = pipe("a photo of a red cat sitting on a wooden table, sunset", "blurry, low quality", steps=8,
                   cfg=7.0, sampler=sampler, seed=1234, width=64, height=64)
    assert_matches_diffusers(got, want)


@pytest.mark.parametrize("kind,sampler", [("sdxl", "Euler"), ("sdxl", "DPM++ 2M Karras"), ("sdxl", "DDIM"),
                                          ("sd15", "Euler"), ("sd15", "Euler a")])
def test_guidance_rescale_matches_diffusers(kind: str, sampler: str, tmp_path) -> None:
    """``guidance_rescale=0.7`` against diffusers' ``guidance_rescale`` (scripts/make_rescale_refs.py): tiny-sdxl under
    the zero-terminal-SNR v-prediction schedule (where the rescale moves the image by up to 211 levels) and tiny-sd15
    (epsilon, 30 levels), with test_pipelines_diffusers.py's tolerance; the infotext says it."""
    from pipeline_helpers import register

    from sdrt import pipelines

    register("reference")
    folder = _zero_snr_copy(tmp_path) if kind == "sdxl" else DATA / "tiny-sd15"
    want = np.load(DATA / "rescale_refs.npz")[f"{kind}/{sampler}"]
    with pipelines.load(folder, backend="reference") as pipe:
        out = pipe.generate("a photo of a red cat sitting on a wooden table, sunset", "blurry, low quality", steps=8,
                            cfg=7.0, sampler=sampler, seed=1234, width=64, height=64, guidance_rescale=0.7)
    assert_matches_diffusers(out.images, want)
    assert out.settings[0]["CFG Rescale"] == 0.7


def test_guidance_rescale_refused_where_it_cannot_apply() -> None:
    from pipeline_helpers import register

    from sdrt import pipelines
    from sdrt.errors import InputError

    for bad in (-0.1, 1.5, float("nan"), "0.7", True):
        with pytest.raises(InputError, match="guidance_rescale must be a number from 0 to 1"):
            pipelines.validate("x", guidance_rescale=bad)
    register("reference")
    with pipelines.load(DATA / "tiny-flux-schnell", backend="reference") as pipe:
        with pytest.raises(InputError, match="guidance_rescale rescales an eps or v prediction"):
            pipe.plan("x", guidance_rescale=0.5)
