"""How the server stops a running generation: the one place to change when the pipeline gains
``pipe.interrupt()`` (or a callback whose ``False`` stops the run).

Today the step callback raises a server-private exception, which unwinds ``Pipeline.generate``
at the end of the current step; the pipeline object stays usable for the next job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class JobStopped(Exception):
    """Raised from the step callback to end a run early (never leaves the serve package)."""


def generate_until_stopped(pipe: Any, should_stop: Callable[[], bool],
                           on_step: Callable[[int, int, np.ndarray], None], prompt: str, negative: str,
                           **kwargs: Any) -> Any:
    """``pipe.generate(prompt, negative, **kwargs)``, ended at the next step once ``should_stop()``
    is true; returns the ``Generation``, or None when it was stopped."""

    def callback(step: int, total: int, latents: np.ndarray) -> None:
        on_step(step, total, latents)
        if should_stop():
            raise JobStopped

    if should_stop():
        return None
    try:
        return pipe.generate(prompt, negative, callback=callback, **kwargs)
    except JobStopped:
        return None


__all__ = ["JobStopped", "generate_until_stopped"]
