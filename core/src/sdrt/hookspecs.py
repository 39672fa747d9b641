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
    """Register samplers and schedules.

    Call ``register(name, function, kind="sampler")`` for a sampler with
    k-diffusion's signature ``(model, x, sigmas, *, extra_args=None, callback=None, ...)``,
    or ``register(name, function, kind="schedule")`` for a function that returns sigmas.
    """
