"""Conv (1-D, 2-D, 3-D, grouped, dilated) with ONNX's explicit or automatic padding."""

from __future__ import annotations

from typing import Any

from . import check, op
from ._common import Value, attrs, mb, rank, shape, var

_AUTO = {"SAME_UPPER": "same", "SAME_LOWER": "same_lower", "VALID": "valid"}


@check("Conv")
def check_conv(node: Any) -> str | None:
    pad = attrs(node).get("auto_pad", "NOTSET")
    return None if pad in ("NOTSET", *_AUTO) else f"auto_pad={pad}"


def pad_kwargs(a: dict[str, Any], spatial: int) -> dict[str, Any]:
    """MIL's ``pad_type`` (and ``pad``) for an ONNX conv's or pool's ``auto_pad`` and ``pads``."""
    auto = a.get("auto_pad", "NOTSET")
    if auto in _AUTO:
        return {"pad_type": _AUTO[auto]}
    return {"pad_type": "custom", "pad": mil_pads(list(a.get("pads", [])), spatial)}


def mil_pads(onnx_pads: list[int], spatial: int) -> list[int]:
    """ONNX [b1, b2, ..., e1, e2, ...] -> MIL [b1, e1, b2, e2, ...]."""
    pads = list(onnx_pads) or [0] * (2 * spatial)
    return [p for i in range(spatial) for p in (pads[i], pads[i + spatial])]


@op("Conv")
def op_conv(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    a = attrs(node)
    xv = var(lw, x)
    spatial = rank(xv) - 2
    wv = var(lw, w, like=xv)
    kw: dict[str, Any] = {
        "x": xv, "weight": wv,
        "strides": list(a.get("strides", [1] * spatial)),
        "dilations": list(a.get("dilations", [1] * spatial)),
        "groups": int(a.get("group", 1)),
    }
    if len(shape(wv)) != spatial + 2:
        raise ValueError(f"weight of rank {len(shape(wv))} for a {spatial}-D conv")
    kw.update(pad_kwargs(a, spatial))
    if b is not None:
        kw["bias"] = var(lw, b, like=xv)
    return [mb().conv(**kw)]
