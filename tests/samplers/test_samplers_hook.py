"""Built-in samplers and schedules come through register_samplers, into the one table plugins use."""

from __future__ import annotations

import numpy as np
import pytest

import sdrt
from sdrt.errors import SamplerError
from sdrt.samplers import builtin, get_sampler, get_schedule, get_sigmas, k_samplers
from sdrt.samplers.registry import available_samplers, available_schedules


def test_builtins_are_a_plugin_in_the_registry(registry):
    record = registry.plugins["samplers"]
    assert record.ok and record.distribution == "sdrt"
    assert registry.samplers["euler"] == ("sampler", k_samplers.euler)
    assert set(record.samplers) == set(builtin.BUILTIN_SAMPLERS) | set(builtin.BUILTIN_SCHEDULES)
    assert available_samplers() == sorted(builtin.BUILTIN_SAMPLERS)
    assert available_schedules() == sorted(builtin.BUILTIN_SCHEDULES)


def test_a_plugin_replaces_a_builtin_of_the_same_name_and_adds_new_ones(registry, inline_plugin):
    def my_euler(model, x, sigmas, *, extra_args=None, callback=None, disable=None):
        return x

    def two_steps(steps, model_sampling):
        return np.array([model_sampling.sigma_max, 0.0])

    class Plugin:
        @sdrt.hookimpl
        def register_samplers(self, register):
            register("euler", my_euler)
            register("two_steps", two_steps, kind="schedule")

    inline_plugin(Plugin(), "mine")
    assert get_sampler("euler") is my_euler and get_schedule("two_steps") is two_steps
    assert "two_steps" in available_schedules()
    ms = sdrt.samplers.DiscreteSchedule("eps")
    np.testing.assert_array_equal(get_sigmas("two_steps", 5, ms), [ms.sigma_max, 0.0])


def test_there_is_no_second_table(registry):
    """With the built-in plugin gone, the built-in names are gone too: lookups read the registry only."""
    registry.unregister_plugin("samplers")
    with pytest.raises(SamplerError, match="unknown sampler 'euler'"):
        get_sampler("euler")
