"""``--precision``: one flag, one check, for every command that compiles (``sdrt run``, ``sdrt generate``,
``sdrt serve``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import InputError

#: the spellings of float32 a backend without precisions (the reference one) computes in already
_FP32 = ("fp32", "f32", "float32", "float")


def add_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--precision", default=None,
                   help=f"compute precision of {what}, e.g. fp32 (default: the device's, as `sdrt info` shows it: "
                        "bf16 on CPUs with bf16 dot products, fp16 on GPUs; SDRT_PRECISION sets it too)")


def option(precision: str | None, backend: str = "auto", device: str | None = None) -> dict[str, Any]:
    """``{"precision": NAME}`` for the backend, or {}: a backend that computes in fp32 alone (the reference one)
    takes no precision option, so fp32 is dropped for it and any other precision refused in the command's words.
    Checked here, before any model loads, so that a refusal names the flag (the backend's own names
    ``sdrt.load``)."""
    if precision is None:
        return {}
    from ..runtime import select

    found, _ = select(backend, device)
    if found.precisions:
        from ..precision import precision_name

        return {"precision": precision_name(precision, found.precisions, where="--precision")}
    if precision.strip().lower() in _FP32:
        return {}
    raise InputError(f"the {found.name} backend computes in fp32 only, not {precision!r}",
                     where="--precision", fix="pass --precision fp32, leave it out, or pick another --backend")
