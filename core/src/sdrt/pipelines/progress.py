"""A one-line progress bar over the sampling steps, drawn on a TTY only (the CLI's; the API has callbacks)."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


class ProgressBar:
    """``bar(step, total, latents)`` fits ``Pipeline.generate(callback=...)``; draws only if ``stream`` is a TTY."""

    def __init__(self, stream: IO[str] | None = None, *, width: int = 30, label: str = "") -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.label = label
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty())
        self._start: float | None = None
        self._drawn = False

    def __call__(self, step: int, total: int, latents: Any = None) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._start is None or step <= 1:
            self._start = now
        filled = self.width * step // max(total, 1)
        rate = (now - self._start) / max(step - 1, 1) if step > 1 else 0.0
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.label}[{bar}] {step}/{total}" + (f" {rate:.2f} s/step" if rate else ""))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
