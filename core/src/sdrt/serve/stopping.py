"""How the server stops a running generation: through the pipeline's own stop.

The step callback returns ``False`` once the job should stop; the pipeline then ends the run at the end of
the current step with ``sdrt.errors.Interrupted`` (see ``Pipeline.generate``), and the pipeline object
stays usable for the next job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import Interrupted


def generate_until_stopped(pipe: Any, should_stop: Callable[[], bool],
                           on_step: Callable[[int, int, np.ndarray], None], prompt: str, negative: str,
                           **kwargs: Any) -> Any:
    """``pipe.generate(prompt, negative, **kwargs)``, ended at the next step once ``should_stop()``
    is true; returns the ``Generation``, or None when it was stopped."""

    def callback(step: int, total: int, latents: np.ndarray) -> bool:
        on_step(step, total, latents)
        return not should_stop()

    if should_stop():
        return None
    try:
        return pipe.generate(prompt, negative, callback=callback, **kwargs)
    except Interrupted:
        return None


__all__ = ["generate_until_stopped"]
