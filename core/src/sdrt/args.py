"""The API's arguments that take one item or several: a string is one item, never the letters it iterates as
(``devices="CPU"`` is one device, not 'C', 'P', 'U'; ``extra_args="--no-deps"`` one pip argument)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def one_or_many(value: Any, one: type | tuple[type, ...] = (str, os.PathLike)) -> Iterable[Any] | Any:
    """``[value]`` when ``value`` is one item (an instance of ``one``: a string or a path by default), else ``value``
    as it is (an iterable of items, or None)."""
    return [value] if isinstance(value, one) else value
