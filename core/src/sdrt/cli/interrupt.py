"""Ctrl-C that CPython drops is not lost.

A SIGINT whose handler runs while Python is inside a weakref callback or a ``__del__`` (the import system's
module-lock callbacks run during every lazy import) raises its KeyboardInterrupt there, where CPython prints
"Exception ignored in: ..." and goes on: the run carried on sampling as if the key had not been pressed. While a
command runs, ``watch()`` puts a handler in place that also notes the press; ``check()``, called at each
sampling step and before the images are written, raises the KeyboardInterrupt that was swallowed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_pressed = False


def _handler(signum: int, frame: Any) -> None:
    global _pressed
    _pressed = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Note each Ctrl-C while the block runs (main thread, and only where Ctrl-C raises KeyboardInterrupt now:
    an ignored SIGINT, as under ``nohup``, stays ignored)."""
    global _pressed
    _pressed = False
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _pressed = False


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed and its KeyboardInterrupt did not reach the command."""
    global _pressed
    if _pressed:
        _pressed = False
        raise KeyboardInterrupt
