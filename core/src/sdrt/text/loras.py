"""A1111's ``<lora:name:weight>`` prompt tags.

A1111 finds extra-network tags with ``<(\\w+):([^>]+)>`` and removes them from
the prompt before it is tokenized. For ``lora`` (and its old alias ``lyco``)
the arguments are ``name[:te_weight[:unet_weight]]``, also as ``te=``/``unet=``;
a missing text-encoder weight is 1.0 and a missing UNet weight is the text-encoder one.
:func:`extract_loras` returns the prompt without those tags and ``(name, weight)`` with the
text-encoder weight; :func:`extract_lora_tags` gives ``(name, te_weight, unet_weight)``, which the
pipeline applies (the UNet weight was dropped: ``<lora:x:1:0.3>`` ran the UNet at 1). Other tag types
(``<hypernet:...>``, which sdrt does not run) are removed from the text too, as A1111 removes them
(``sdrt.text.attention.unsupported_syntax`` names them, so the difference is said). A tag whose weight is not a number, or that names no
LoRA, is an ``InputError`` naming the tag (it was skipped with a warning, and the image made
without the LoRA the user asked for).
"""

from __future__ import annotations

import re

_TAG = re.compile(r"<(\w+):([^>]+)>")
_LORA_TYPES = {"lora", "lyco"}
_LORA_TAG = re.compile(r"<(?:lora|lyco):[^>]+>")


def has_lora_tag(*texts: object) -> bool:
    """Whether any of ``texts`` holds a ``<lora:...>`` or ``<lyco:...>`` tag (the LoRAs a job must load)."""
    return any(isinstance(t, str) and _LORA_TAG.search(t) is not None for t in texts)


def strip_tags(text: str) -> str:
    """``text`` without A1111's extra-network tags that are no LoRA (``<hypernet:x:1>``), as A1111 removes them."""
    return _TAG.sub(lambda m: m.group(0) if m.group(1) in _LORA_TYPES else "", text)


def extract_loras(text: str, where: str = "prompt") -> tuple[str, list[tuple[str, float]]]:
    """``("a cat <lora:ink:0.7>", ...)`` -> ``("a cat ", [("ink", 0.7)])``, in the order the tags appear.

    ``where`` names the argument that holds ``text`` in a bad tag's error (``prompt``, ``negative_prompt``)."""
    clean, tags = extract_lora_tags(text, where)
    return clean, [(name, te) for name, te, _ in tags]


def _weight(raw: str, tag: str, name: str, where: str) -> float:
    from ..errors import InputError

    try:
        return float(raw)
    except ValueError:
        raise InputError(f"the weight {raw!r} of {tag} is not a number", where=where,
                         fix=f"write a number, e.g. <lora:{name or 'NAME'}:0.8>") from None


def extract_lora_tags(text: str, where: str = "prompt") -> tuple[str, list[tuple[str, float, float]]]:
    """``("a cat <lora:ink:0.7:0.3>", ...)`` -> ``("a cat ", [("ink", 0.7, 0.3)])``: each tag's name, text-encoder
    weight and UNet (or transformer) weight, as A1111's ``extra_networks_lora`` reads them."""
    from ..errors import InputError

    found: list[tuple[str, float, float]] = []

    def take(m: re.Match[str]) -> str:
        if m.group(1) not in _LORA_TYPES:  # <hypernet:x:1>: A1111 removes every extra-network tag from the text
            return ""  # (and skips a type it lacks); left in, its words were encoded into the prompt
        items = m.group(2).split(":")
        positional = [i for i in items if "=" not in i]
        named = dict(i.split("=", 1) for i in items if "=" in i)
        name = positional[0] if positional else ""
        raw = named.get("te", positional[1] if len(positional) > 1 else "1.0")
        weight = _weight(raw, m.group(0), name, where)
        raw_unet = named.get("unet", positional[2] if len(positional) > 2 else None)
        unet = weight if raw_unet is None else _weight(raw_unet, m.group(0), name, where)
        if not name:
            raise InputError(f"{m.group(0)} names no LoRA", where=where,
                             fix="write the LoRA's file name without .safetensors, e.g. <lora:add_detail:0.8>")
        found.append((name, weight, unet))
        return ""

    return _TAG.sub(take, text), found
