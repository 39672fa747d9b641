"""How the server stops a running generation: through the pipeline's own stop.

The step callback returns ``False`` once the job should stop; the pipeline then ends the run at the end of
the current step with ``sdrt.errors.Interrupted`` (see ``Pipeline.generate``), and the pipeline object
stays usable for the next job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import Interrupted, SdrtError

log = logging.getLogger("sdrt.serve")


def generate_until_stopped(pipe: Any, should_stop: Callable[[], bool],
                           on_step: Callable[[int, int, np.ndarray], None], prompt: str, negative: str,
                           wants_partial: Callable[[], bool] = lambda: True, **kwargs: Any) -> tuple[Any, bool]:
    """``pipe.generate(prompt, negative, **kwargs)``, ended at the next step once ``should_stop()`` is true.

    Returns ``(generation, stopped)``. A stopped run gives what it had made, as A1111 answers an interrupt or a
    skip: its batch decoded from the last step's denoised estimate (``Interrupted.partial``), unless
    ``wants_partial()`` is false then (a client that left, a server stopping: nobody reads it); None before
    its first step."""

    def callback(step: int, total: int, latents: np.ndarray) -> bool:
        on_step(step, total, latents)
        return not should_stop()

    if should_stop():
        return None, True
    try:
        return pipe.generate(prompt, negative, callback=callback, **kwargs), False
    except Interrupted as stop:
        if not wants_partial():
            return None, True
        try:
            return stop.partial(), True
        except SdrtError as exc:  # the stop stands; the finished runs' images are kept by the caller
            log.warning("the stopped run's partial images could not be decoded: %s", exc)
            return None, True


__all__ = ["generate_until_stopped"]
