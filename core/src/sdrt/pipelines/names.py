"""A1111's infotext labels for a resolved sampler (``("DPM++ 2M", "Karras")``), and how option values are spelled."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..samplers.names import A1111_SAMPLERS, A1111_SCHEDULES

#: preferred A1111 label of each schedule (A1111_SCHEDULES maps several labels to one schedule)
_SCHEDULE_LABELS = {"normal": "Uniform", "ddim_uniform": "DDIM"}


def sampler_labels(choice: Any) -> tuple[str, str]:
    """(sampler label, schedule label) as A1111 writes them in ``Sampler:`` and ``Schedule type:``."""
    sampler = choice.sampler
    for label, (name, _default, _discard, options) in A1111_SAMPLERS.items():
        if name == choice.sampler and options == choice.options:
            sampler = label
            break
    schedule = _SCHEDULE_LABELS.get(choice.schedule)
    if schedule is None:
        schedule = next((k for k, v in A1111_SCHEDULES.items() if v == choice.schedule), choice.schedule)
    return sampler, schedule


def spelled(value: str, sep: str = " ") -> str:
    """An option value's words in lower case joined by ``sep``, ``_`` and ``-`` read as spaces: how
    ``strength_rule`` ("A1111_fix steps") and ``masked_content`` ("latent-noise") are matched to their names."""
    return sep.join(value.strip().lower().replace("_", " ").replace("-", " ").split())


def one_of(value: Any, choices: tuple[str, ...], name: str) -> str:
    """The argument ``name``'s ``value`` as one of ``choices`` (spelled in any case, ``_`` or ``-`` for a space:
    :func:`spelled`); else an ``InputError`` naming it and the choices."""
    if isinstance(value, str):
        key = spelled(value)
        if key in choices:
            return key
    raise InputError(f"unknown {{@{name}}} {str(value)[:40]!r}", where=name,
                     fix=f"use one of {', '.join(repr(c) for c in choices)}")
