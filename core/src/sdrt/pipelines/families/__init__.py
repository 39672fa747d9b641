"""Model families: one module each, chosen from ``model_index.json``'s ``_class_name`` or from the parts.

``register(cls)`` adds a family (a subclass of :class:`Family`); ``detect`` picks the one for a folder:
first by ``_class_name``, then by asking each family, newest first, whether the folder's parts fit it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import ModelError
from .base import Encoder, Family, ModelCall

__all__ = ["Encoder", "Family", "ModelCall", "by_name", "detect", "register", "registered"]

_FAMILIES: dict[str, type[Family]] = {}


def register(family: type[Family]) -> type[Family]:
    """Add (or replace) a family; usable as a class decorator."""
    if not family.name or not family.parts or not any(r == "denoiser" for r in family.parts.values()):
        raise ModelError(f"family {family.__name__} declares no name or no denoiser part", where=family.__module__,
                         fix="set name, label and parts (one part with the role 'denoiser')")
    _FAMILIES[family.name] = family
    return family


def registered() -> dict[str, type[Family]]:
    if not _FAMILIES:
        from .chroma import Chroma
        from .flux import Flux
        from .sd1 import SD1
        from .sd2 import SD2
        from .sd3 import SD3
        from .sdxl import SDXL
        from .sdxl_refiner import SDXLRefiner

        for fam in (SD1, SD2, SDXL, SDXLRefiner, SD3, Flux, Chroma):
            register(fam)
    return dict(_FAMILIES)


def by_name(name: str) -> type[Family]:
    families = registered()
    if name not in families:
        raise ModelError(f"unknown model family {name!r}", where="family",
                         fix=f"use one of {', '.join(families)}")
    return families[name]


def detect(index: Mapping[str, Any], parts: set[str], configs: Mapping[str, Mapping[str, Any]],
           root: Path) -> type[Family] | None:
    """The family of a folder: by ``_class_name`` when it names one whose parts fit, else from the parts."""
    families = list(registered().values())
    name = str(index.get("_class_name", ""))
    for fam in families:
        if name in fam.class_names:  # SD 1.x's class names also cover SD 2.x folders: a subclass that fits wins,
            # unless it has class names of its own that are not this one (an ORTFluxPipeline folder missing its T5
            # has Chroma's parts, and is a Flux folder missing a part)
            better = [f for f in families if issubclass(f, fam) and f is not fam and f.matches(parts, configs, root)
                      and (not f.class_names or name in f.class_names)]
            return better[0] if better else fam
    for fam in reversed(families):
        if fam.matches(parts, configs, root):
            return fam
    return None

