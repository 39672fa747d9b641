"""A1111's ``<lora:name:weight>`` prompt tags.

A1111 finds extra-network tags with ``<(\\w+):([^>]+)>`` and removes them from
the prompt before it is tokenized. For ``lora`` (and its old alias ``lyco``)
the arguments are ``name[:te_weight[:unet_weight]]``, also as ``te=``/``unet=``;
a missing weight is 1.0. :func:`extract_loras` returns the prompt without those
tags and ``(name, weight)`` with the text-encoder weight (the UNet weight when
only ``unet=`` is given is not reported separately). Other tag types
(``<hypernet:...>``) stay in the text. A tag whose weight is not a number is
dropped from the text and skipped with a warning, as A1111 skips a network it
cannot activate.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("sdrt.text.loras")

_TAG = re.compile(r"<(\w+):([^>]+)>")
_LORA_TYPES = {"lora", "lyco"}


def extract_loras(text: str) -> tuple[str, list[tuple[str, float]]]:
    """``("a cat <lora:ink:0.7>", ...)`` -> ``("a cat ", [("ink", 0.7)])``, in the order the tags appear."""
    found: list[tuple[str, float]] = []

    def take(m: re.Match[str]) -> str:
        if m.group(1) not in _LORA_TYPES:
            return m.group(0)
        items = m.group(2).split(":")
        positional = [i for i in items if "=" not in i]
        named = dict(i.split("=", 1) for i in items if "=" in i)
        name = positional[0] if positional else ""
        raw = named.get("te", positional[1] if len(positional) > 1 else "1.0")
        try:
            weight = float(raw)
        except ValueError:
            log.warning("skipping %s: its weight %r is not a number", m.group(0), raw)
            return ""
        if not name:
            log.warning("skipping %s: it names no LoRA", m.group(0))
            return ""
        found.append((name, weight))
        return ""

    return _TAG.sub(take, text), found
