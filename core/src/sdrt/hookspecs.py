"""Every extension point of sdrt, and nothing else.

A plugin module (named by an entry point in the group ``sdrt``) implements some
of these with ``@sdrt.hookimpl``. Each hook receives a ``register`` callback::

    from sdrt import hookimpl

    @hookimpl
    def register_backends(register):
        register(MyBackend())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("sdrt")
hookimpl = pluggy.HookimplMarker("sdrt")


@hookspec
def register_backends(register: Callable[[Any], None]) -> None:
    """Register backends: call ``register(backend)`` once per ``sdrt.Backend`` instance."""


@hookspec
def register_samplers(register: Callable[..., None]) -> None:
    """Register samplers and schedules; the built-in ones come through this hook too.

    - ``register(name, sampler, kind="sampler")``: ``sampler(model, x, sigmas, *,
      extra_args=None, callback=None, disable=None, **options) -> np.ndarray``, k-diffusion's
      signature: ``model(x, sigma, **extra_args)`` returns the denoised estimate, ``sigmas``
      runs from high to low and ends in 0, and the result is the final latent.
    - ``register(name, schedule, kind="schedule")``: ``schedule(steps, model_sampling,
      **options) -> np.ndarray``: ``steps + 1`` float64 sigmas, descending, the last one 0;
      ``model_sampling`` (a ``DiscreteSchedule`` or ``FlowSchedule``) gives ``sigma_min``,
      ``sigma_max`` and the model's own sigma table.

    A name registered again (by a later plugin) replaces the earlier entry.
    """
