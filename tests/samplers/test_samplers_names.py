"""Names users know (A1111/Forge labels, ComfyUI names) and plugin-registered samplers and schedules."""

from __future__ import annotations

import numpy as np
import pytest
from _sampler_refs import GaussianVE, start_noise

from sdrt import hookimpl
from sdrt import samplers as S
from sdrt.errors import SamplerError
from sdrt.samplers import SamplerChoice


@pytest.mark.parametrize(("label", "expected"), [
    ("Euler a", SamplerChoice("euler_ancestral", "normal")),
    ("Euler", SamplerChoice("euler", "normal")),
    ("DPM++ 2M Karras", SamplerChoice("dpmpp_2m", "karras")),
    ("DPM++ 2M", SamplerChoice("dpmpp_2m", "karras")),  # A1111's Automatic schedule for it
    ("DPM++ 2M SDE Exponential", SamplerChoice("dpmpp_2m_sde", "exponential")),
    ("DPM++ 2M SDE Heun Karras", SamplerChoice("dpmpp_2m_sde", "karras", False, {"solver_type": "heun"})),
    ("DPM++ SDE Karras", SamplerChoice("dpmpp_sde", "karras")),
    ("DPM++ 2S a Karras", SamplerChoice("dpmpp_2s_ancestral", "karras")),
    ("DPM++ 3M SDE", SamplerChoice("dpmpp_3m_sde", "exponential", True)),
    ("DPM2 a Karras", SamplerChoice("dpm_2_ancestral", "karras", True)),
    ("DPM2", SamplerChoice("dpm_2", "karras", True)),
    ("LMS Karras", SamplerChoice("lms", "karras")),
    ("Heun", SamplerChoice("heun", "normal")),
    ("DDIM", SamplerChoice("ddim", "ddim_uniform")),
    ("UniPC", SamplerChoice("uni_pc", "normal", True)),
    ("Euler a SGM Uniform", SamplerChoice("euler_ancestral", "sgm_uniform")),
    ("Euler Align Your Steps", SamplerChoice("euler", "align_your_steps")),
    ("euler a karras", SamplerChoice("euler_ancestral", "karras")),  # case and spacing do not matter
    ("DPM fast", SamplerChoice("dpm_fast", "normal", False, {"eta": 1.0})),  # A1111's k-diffusion eta, 1
    ("DPM adaptive", SamplerChoice("dpm_adaptive", "normal", False, {"eta": 1.0})),
    ("DPM adaptive Karras", SamplerChoice("dpm_adaptive", "karras", False, {"eta": 1.0})),
    ("PLMS", SamplerChoice("plms", "ddim_uniform")),  # A1111's timesteps 1, 1 + 1000 // steps, ...
])
def test_a1111_labels(label, expected):
    assert S.resolve(label) == expected


def test_a1111_label_with_a_separate_schedule_type():
    assert S.resolve("DPM++ 2M", "Karras") == SamplerChoice("dpmpp_2m", "karras")
    assert S.resolve("Euler a", "Automatic") == SamplerChoice("euler_ancestral", "normal")
    assert S.resolve("DPM++ SDE", "KL Optimal") == SamplerChoice("dpmpp_sde", "kl_optimal")
    assert S.resolve("Euler", "Beta") == SamplerChoice("euler", "beta")


def test_a_schedule_against_the_labels_own_is_refused():
    """A1111 lets the label's suffix win in silence ("DPM++ 2M Karras" + Exponential runs Karras); sdrt refuses."""
    with pytest.raises(SamplerError) as info:
        S.resolve("DPM++ 2M Karras", "exponential")
    assert info.value.where == "schedule"
    assert "pass {@sampler} 'DPM++ 2M' with {@schedule} 'exponential'" in info.value.fix
    assert S.resolve("DPM++ 2M Karras", "Karras") == S.resolve("DPM++ 2M Karras", "karras")  # the same one: fine
    assert S.resolve("DPM++ 2M Karras", "Automatic") == SamplerChoice("dpmpp_2m", "karras")


@pytest.mark.parametrize(("name", "schedule", "expected"), [
    ("euler", "normal", SamplerChoice("euler", "normal")),
    ("dpmpp_2m", "karras", SamplerChoice("dpmpp_2m", "karras")),
    ("dpmpp_2m_sde_gpu", "exponential", SamplerChoice("dpmpp_2m_sde", "exponential")),
    ("dpm_2", "karras", SamplerChoice("dpm_2", "karras", True)),
    ("uni_pc_bh2", "sgm_uniform", SamplerChoice("uni_pc_bh2", "sgm_uniform", True)),
    ("ddim", "ddim_uniform", SamplerChoice("ddim", "ddim_uniform")),
    ("lcm", "simple", SamplerChoice("lcm", "simple")),
    ("deis", "beta", SamplerChoice("deis", "beta")),
    ("dpm_fast", "karras", SamplerChoice("dpm_fast", "karras")),  # ComfyUI's: eta 0
    ("dpm_adaptive", "normal", SamplerChoice("dpm_adaptive", "normal")),
])
def test_comfyui_names(name, schedule, expected):
    assert S.resolve(name, schedule) == expected


def test_every_builtin_sampler_resolves_by_its_comfyui_name():
    for name in S.available_samplers():
        assert S.resolve(name).sampler == name


@pytest.mark.parametrize("name", ["Eular a", "DPM++ 2M Karass", "dpmpp_9m", "", "Euler a Karras Karras"])
def test_unknown_sampler_name_lists_the_valid_ones(name):
    with pytest.raises(SamplerError) as info:
        S.resolve(name)
    text = str(info.value)
    assert "Euler a" in text and "DPM++ 2M" in text and "dpmpp_2m" in text and "karras" in text


@pytest.mark.parametrize(("name", "nearest"), [
    ("Restart", "Heun Karras"), ("DDIM CFG++", "DDIM"), ("Euler a CFG++", "Euler a"),
    ("restart karras", "Heun Karras"), ("euler_cfg_pp", "euler"), ("res_multistep", "dpmpp_2m"),
    ("heunpp2", "heun"), ("ipndm_v", "ipndm"), ("gradient_estimation", "euler"), ("er_sde", "dpmpp_2m_sde"),
    ("seeds_2", "dpmpp_sde"), ("seeds_3", "dpmpp_3m_sde"), ("sa_solver", "dpmpp_2m_sde"),
])
def test_a_sampler_sdrt_lacks_is_named_with_the_nearest_ones(name, nearest):
    with pytest.raises(SamplerError) as info:
        S.resolve(name)
    assert f"the sampler {name!r} is not available in sdrt" in info.value.what
    assert info.value.where == "sampler"
    assert info.value.fix.startswith("use the nearest sdrt has: ") and nearest in info.value.fix.split(".")[0]
    assert "dpmpp_2m" in info.value.fix and "DPM++ 2M" in info.value.fix  # and every name
    for near in info.value.fix.split(".")[0].removeprefix("use the nearest sdrt has: ").split(", "):
        S.resolve(near)  # each suggestion runs


def test_every_unavailable_name_is_unknown_to_sdrt_and_its_nearest_ones_resolve():
    from sdrt.samplers.names import UNAVAILABLE

    for name, (_why, nearest) in UNAVAILABLE.items():
        assert name not in S.available_samplers()
        for near in nearest:
            S.resolve(near)


def test_a_plugin_sampler_of_an_unavailable_name_is_used(inline_plugin):
    class Plugin:
        @staticmethod
        @hookimpl
        def register_samplers(register):
            register("er_sde", lambda model, x, sigmas, **kw: x)

    inline_plugin(Plugin(), "er-sde")
    assert S.resolve("er_sde", "karras") == SamplerChoice("er_sde", "karras")


@pytest.mark.parametrize(("name", "closest"), [("Eular a", "'Euler a'"), ("DPM++ 2M Karass", "'DPM++ 2M Karras'"),
                                               ("dpmpp_9m", "'dpmpp_2m'"), ("DPM fats", "'DPM fast'")])
def test_a_mistyped_name_gets_the_closest_known_ones(name, closest):
    with pytest.raises(SamplerError) as info:
        S.resolve(name)
    assert info.value.what.startswith(f"unknown sampler {name!r} (the closest known: {closest}")


def test_unknown_schedule_name_is_a_sampler_error():
    with pytest.raises(SamplerError, match="unknown schedule 'Karass'"):
        S.resolve("euler", "Karass")


@pytest.mark.parametrize(("name", "closest"), [("karas", "'Karras'"), ("simpel", "'Simple'"),
                                               ("sgm_unifrm", "'sgm_uniform'"), ("exponental", "'Exponential'")])
def test_a_mistyped_schedule_gets_the_closest_known_ones(name, closest):
    """As a mistyped sampler does: an A1111 label for a label-like name, a ComfyUI name for one with "_"."""
    with pytest.raises(SamplerError) as info:
        S.resolve("euler", name)
    assert info.value.what.startswith(f"unknown schedule {name!r} (the closest known: {closest}"), info.value.what


def test_get_sampler_unknown_lists_the_valid_ones():
    with pytest.raises(SamplerError) as info:
        S.get_sampler("euler_b")
    assert "euler_ancestral" in str(info.value)


def test_choice_drives_a_full_run():
    choice = S.resolve("DPM++ 2M SDE Heun Karras")
    ms = S.DiscreteSchedule()
    sigmas = S.get_sigmas(choice.schedule, 8, ms, discard_penultimate=choice.discard_penultimate)
    model = GaussianVE()
    x = start_noise() * sigmas[0]
    out = S.get_sampler(choice.sampler)(model, x, sigmas, extra_args={"seed": 5}, **choice.options)
    ref = S.dpmpp_2m_sde(model, x, sigmas, extra_args={"seed": 5}, solver_type="heun")
    assert np.array_equal(out, ref)


class _Plugin:
    @staticmethod
    @hookimpl
    def register_samplers(register):
        def halfway(model, x, sigmas, *, extra_args=None, callback=None):
            """Jump to the denoised estimate at each step (a test sampler)."""
            for i in range(len(sigmas) - 1):
                x = model(x, float(sigmas[i]), **(extra_args or {}))
            return x

        def two_step(steps, model_sampling):
            return np.array([model_sampling.sigma_max, model_sampling.sigma_min, 0.0])

        register("halfway", halfway)
        register("two_step", two_step, kind="schedule")


def test_plugin_registered_sampler_and_schedule_are_found(inline_plugin):
    inline_plugin(_Plugin(), "sampler-plugin")
    assert "halfway" in S.available_samplers()
    assert "two_step" in S.available_schedules()
    ms = S.DiscreteSchedule()
    sigmas = S.get_sigmas("two_step", 30, ms)
    assert np.array_equal(sigmas, [ms.sigma_max, ms.sigma_min, 0.0])
    model = GaussianVE()
    out = S.get_sampler("halfway")(model, start_noise(), sigmas)
    assert model.calls == 2 and out.shape == start_noise().shape
    assert S.resolve("halfway", "two_step") == SamplerChoice("halfway", "two_step")


def test_plugin_samplers_disappear_when_the_plugin_is_unregistered(registry, inline_plugin):
    inline_plugin(_Plugin(), "sampler-plugin")
    assert "halfway" in S.available_samplers()
    registry.unregister_plugin("sampler-plugin")
    assert "halfway" not in S.available_samplers()
    with pytest.raises(SamplerError):
        S.get_sampler("halfway")


def test_plugin_can_replace_a_builtin_name(inline_plugin):
    class Override:
        @staticmethod
        @hookimpl
        def register_samplers(register):
            register("euler", lambda model, x, sigmas, **kw: x * 0)

    inline_plugin(Override(), "override")
    assert np.all(S.get_sampler("euler")(GaussianVE(), start_noise(), [1.0, 0.0]) == 0)
