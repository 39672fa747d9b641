"""A1111's infotext labels for a resolved sampler: ``("DPM++ 2M", "Karras")``."""

from __future__ import annotations

from typing import Any

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
