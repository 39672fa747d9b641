"""What a pipeline's sampling loop starts from, recorded for tests in more than one folder."""

from __future__ import annotations

import numpy as np


def recorded_start(pipe, monkeypatch, prompt: str, seed: int, **kwargs) -> tuple[np.ndarray, np.ndarray | None]:
    """(noise, image latent) the run's ``loop.start`` got for ``pipe.generate(prompt, steps=2, cfg=1, seed=seed,
    **kwargs)``: the last call (a dry run that plans the job's shapes comes first)."""
    seen = []
    make = type(pipe)._loop

    def recording(self, *a, **k):
        loop = make(self, *a, **k)
        start = loop.start

        def rec(noise, image=None):
            seen.append((noise.copy(), None if image is None else image.copy()))
            return start(noise, image)

        loop.start = rec
        return loop

    monkeypatch.setattr(type(pipe), "_loop", recording)
    try:
        pipe.generate(prompt, steps=2, cfg=1, seed=seed, **kwargs)
    finally:
        monkeypatch.undo()
    assert seen, "the run never started its sampling loop"
    return seen[-1]
