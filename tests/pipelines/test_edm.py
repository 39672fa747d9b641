"""EDM-trained SDXL models (Playground v2.5, CosXL) against diffusers' EDM schedulers.

``scripts/make_edm_refs.py`` captured diffusers' preconditioning (c_in, c_noise, c_skip / c_out), its EDM schedulers'
sigmas and timesteps, and the images of tiny-sdxl run as Playground v2.5 (``EDMDPMSolverMultistepScheduler``, a VAE
config with ``latents_mean`` / ``latents_std``) and as CosXL (``EDMEulerScheduler``, v-prediction, sigma_data 1).
Here a copy of the tiny-sdxl ONNX folder gets the same scheduler and VAE configs; every image must match with
test_pipelines_diffusers.py's tolerance. tests/checkpoint/test_edm_files.py runs the same models as a diffusers folder
of safetensors, as single files with their EDM keys, and through ``sdrt generate``.
"""

from __future__ import annotations

import numpy as np
import pytest
from edm_helpers import COMMON, DATA, REFS, SPEC, case_kwargs, edm_copy, ref_name
from pipeline_helpers import assert_matches_diffusers, register

from sdrt import pipelines
from sdrt.errors import ModelError
from sdrt.pipelines.scheduling import model_sampling
from sdrt.samplers import EDMSchedule, available_samplers, get_sigmas


# ---------------------------------------------------------------- the model sampling
@pytest.mark.parametrize("row", SPEC["preconditioning"],
                         ids=[f"{r['prediction_type']}:{r['sigma']}" for r in SPEC["preconditioning"]])
def test_edm_preconditioning_matches_diffusers(row: dict) -> None:
    """c_in x, c_noise = 0.25 ln sigma (the UNet's timestep) and c_skip x + c_out F, as diffusers' EDM schedulers."""
    ms = EDMSchedule({"epsilon": "eps", "v_prediction": "v"}[row["prediction_type"]], sigma_data=row["sigma_data"],
                     sigma_max=200.0)
    x, out, sigma = np.asarray(row["x"]), np.asarray(row["output"]), row["sigma"]
    np.testing.assert_allclose(ms.scale_input(x, sigma), row["scaled"], rtol=1e-12)
    assert float(ms.timestep(sigma)) == pytest.approx(row["timestep"], rel=1e-12)
    assert float(ms.sigma(ms.timestep(sigma))) == pytest.approx(sigma, rel=1e-12)
    np.testing.assert_allclose(ms.denoised(x, sigma, out), row["denoised"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("row", SPEC["schedules"], ids=[f"{r['sampler']}:{r['steps']}" for r in SPEC["schedules"]])
def test_edm_schedules_match_diffusers(row: dict) -> None:
    """The folder's EDM scheduler config gives diffusers' sigmas through sdrt's own schedules (karras, exponential)
    over the config's range, and c_noise of each is the timestep diffusers feeds the UNet."""
    from sdrt.samplers import resolve

    ms = model_sampling(row["config"])
    assert isinstance(ms, EDMSchedule)
    sigmas = get_sigmas(resolve(row["sampler"]).schedule, row["steps"], ms)
    np.testing.assert_allclose(sigmas, row["sigmas"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(ms.timestep(sigmas[:-1]), row["timesteps"], rtol=1e-5, atol=1e-6)


def test_edm_scheduler_configs_are_checked() -> None:
    base = SPEC["playground"]["scheduler"]
    ms = model_sampling(base)
    assert (ms.prediction, ms.sigma_min, ms.sigma_max, ms.sigma_data, ms.kind) == ("eps", 0.002, 80.0, 0.5, "edm")
    assert model_sampling(SPEC["cosxl"]["scheduler"]).prediction == "v"
    for bad, msg in (({"sigma_min": 90.0}, "sigma_min 90 is not below its sigma_max 80"),
                     ({"sigma_data": 0}, "sigma_data is 0, not a number above 0"),
                     ({"sigma_max": "80"}, "sigma_max is '80', not a number above 0"),
                     ({"prediction_type": "sample"}, "prediction_type 'sample' is not supported")):
        with pytest.raises(ModelError, match=msg) as e:
            model_sampling({**base, **bad}, "scheduler_config.json")
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------- images
def _image_params():
    for case in SPEC["cases"]:
        for backend in ("reference", "openvino", "ggml"):  # ggml compiles slowly: the first case only
            if backend != "ggml" or case is SPEC["cases"][0]:
                yield pytest.param(case, backend, id=f"{ref_name(case)}:{backend}")


@pytest.mark.parametrize(("case", "backend"), list(_image_params()))
def test_edm_image_matches_diffusers(case: dict, backend: str, tmp_path) -> None:
    """Playground v2.5 (txt2img with DPM++ 2M Karras and Euler Karras, img2img at 0.6) and CosXL (Euler
    Exponential) on tiny-sdxl, against diffusers' EDM schedulers and VAE latent stats."""
    register(backend)
    folder = edm_copy(case["model"], tmp_path / case["model"])
    with pipelines.load(folder, backend=backend) as pipe:
        assert pipe.folder.family == "sdxl"
        assert isinstance(pipe.schedule, EDMSchedule)
        got = pipe(COMMON["prompt"], COMMON["negative_prompt"], **case_kwargs(case))
    assert_matches_diffusers(got, REFS[ref_name(case)])


@pytest.fixture(scope="module")
def playground_pipe(tmp_path_factory):
    register("reference")
    folder = edm_copy("playground", tmp_path_factory.mktemp("edm") / "playground")
    with pipelines.load(folder, backend="reference") as pipe:
        yield pipe


#: the samplers that add no noise of their own: at 8 steps each lands near DPM++ 2M Karras's image
DETERMINISTIC = {"ddim", "deis", "dpm_2", "dpm_adaptive", "dpm_fast", "dpmpp_2m", "euler", "heun", "ipndm", "lms", "plms",
                 "uni_pc", "uni_pc_bh2"}


@pytest.mark.parametrize("sampler", available_samplers())
def test_every_sampler_runs_on_an_edm_model(sampler: str, playground_pipe) -> None:
    """Each of sdrt's samplers on Playground v2.5's model sampling (Karras sigmas over its 0.002..80): a finite image;
    those without noise of their own within 45 levels (mean) of diffusers' DPM++ 2M Karras image (at 8 steps they
    differ from it by 0 to 22, DPM fast by 36; the ancestral and SDE ones by about 60)."""
    gen = playground_pipe.generate(COMMON["prompt"], COMMON["negative_prompt"], steps=8, cfg=COMMON["cfg"],
                                   sampler=sampler, schedule="karras", seed=COMMON["seed"], width=64, height=64)
    got = np.stack(gen.images).astype(np.float64)
    assert got.shape == (1, 64, 64, 3) and got.std() > 10
    if sampler in DETERMINISTIC:
        want = REFS["playground/txt2img/DPM++ 2M Karras"].astype(np.float64)
        assert np.abs(got - want).mean() < 45, np.abs(got - want).mean()


def test_the_vae_latent_stats_scale_both_ways(playground_pipe) -> None:
    """latents_mean / latents_std: the encoder's latent is normalized, ``(z - mean) * 0.5 / std``, and the decoder gets
    ``x * std / 0.5 + mean`` (diffusers' SDXL pipelines); the preview maps them to SDXL's usual space."""
    fam = playground_pipe.family
    mean, std = (np.asarray(SPEC["playground"]["vae"][k], np.float32).reshape(1, 4, 1, 1)
                 for k in ("latents_mean", "latents_std"))
    z = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(fam.to_model_latents(z), (z - mean) * 0.5 / std, rtol=1e-6)
    np.testing.assert_allclose(fam.to_vae_latents(fam.to_model_latents(z)), z, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fam.preview_latents(z[0]), fam.to_vae_latents(z)[0] * np.float32(0.13025), rtol=1e-6)


def test_broken_latent_stats_are_named(tmp_path) -> None:
    register("reference")
    for vae, msg in (({"latents_mean": [0.0, 1.0, 2.0]}, "latents_mean is .* not 4 finite numbers"),
                     ({"latents_std": [1.0, 0.0, 1.0, 1.0]}, "latents_std is .* not 4 finite numbers above 0")):
        folder = edm_copy("playground", tmp_path / f"bad{len(msg)}", **vae)
        with pytest.raises(ModelError, match=msg) as e:
            with pipelines.load(folder, backend="reference") as pipe:
                pipe("x", steps=1, width=64, height=64)
        assert "\n" not in str(e.value) and "vae_decoder" in str(e.value)


def test_plan_says_the_edm_model_sampling(playground_pipe) -> None:
    plan = playground_pipe.plan("a red cat", steps=4, width=64, height=64)
    assert "model sampling edm eps (sigma 0.002..80, sigma_data 0.5)" in plan.format()


def test_an_integer_timestep_input_is_refused_for_edm() -> None:
    """c_noise (0.25 ln sigma, -1.55 at sigma 0.002) passes as a float: a UNet exported with an int64 timestep would
    get it rounded (-2, 0, 1), so the Denoiser refuses it for an EDM model and still rounds for a DDPM one."""
    from sdrt.backend import TensorInfo
    from sdrt.samplers import Denoiser, DiscreteSchedule

    class Session:
        path = "unet/model.onnx"

        def __init__(self, dtype: str) -> None:
            self.inputs = [TensorInfo("sample", "float32", ("batch", 4, "h", "w")),
                           TensorInfo("timestep", dtype, ("batch",)),
                           TensorInfo("encoder_hidden_states", "float32", ("batch", 77, 2048))]

    ms = model_sampling(SPEC["playground"]["scheduler"])
    assert Denoiser(Session("float32"), ms)._timestep(float(ms.timestep(0.002)), 2).tolist() == \
        pytest.approx([0.25 * np.log(0.002)] * 2)
    with pytest.raises(ModelError, match="timestep input is int64, and an EDM-trained model .* float timestep") as e:
        Denoiser(Session("int64"), ms)
    assert "\n" not in str(e.value) and "unet/model.onnx" in str(e.value)
    assert Denoiser(Session("int64"), DiscreteSchedule())._timestep(17.6, 1).tolist() == [18]


def test_an_sdxl_refiner_does_not_continue_an_edm_model(playground_pipe) -> None:
    """The SDXL refiner reads SDXL's latents at SDXL's sigmas: after Playground v2.5 it would refine noise."""
    from sdrt.errors import InputError

    with pytest.raises(InputError, match=r"this model \(playground\) is EDM-trained and the refiner "
                                         r"\(tiny-sdxl-refiner\) is not") as e:
        playground_pipe("a cat", steps=2, width=64, height=64, refiner=DATA / "tiny-sdxl-refiner")
    assert "\n" not in str(e.value)


def test_inpainting_previews_and_sde_samplers_run_on_an_edm_model(playground_pipe) -> None:
    """The toolbox on an EDM model: inpainting (the KLoop blend re-noises the kept area at each EDM sigma) with a live
    preview every step (the normalized latents mapped to SDXL's space first), batch 2 with an SDE sampler: they run
    (the tiny random VAE does not reconstruct its input, so the kept area is not compared with the init image)."""
    from edm_helpers import init_image

    mask = np.zeros((64, 64), np.uint8)
    mask[12:44, 16:52] = 255
    seen = []
    gen = playground_pipe.generate("a cat", "blurry", steps=4, seed=1, width=64, height=64, init_image=init_image(),
                                   mask=mask, callback=lambda i, t, x: seen.append(playground_pipe.preview()) or True)
    assert gen.images[0].shape == (64, 64, 3) and gen.images[0].std() > 10
    assert len(seen) == 4 and seen[-1].shape == (8, 8, 3)
    gen = playground_pipe.generate("a cat", steps=3, seed=1, width=64, height=64, batch=2, sampler="DPM++ 2M SDE Karras")
    assert len(gen.images) == 2 and gen.images[0].tobytes() != gen.images[1].tobytes()
