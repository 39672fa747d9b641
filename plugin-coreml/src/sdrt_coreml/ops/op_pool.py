"""MaxPool and AveragePool with explicit or automatic padding."""

from __future__ import annotations

from typing import Any

from . import check, op
from ._common import Value, attrs, mb, rank, var
from .op_conv import _AUTO, pad_kwargs


@check("MaxPool", "AveragePool")
def check_pool(node: Any) -> str | None:
    a = attrs(node)
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", *_AUTO):
        return f"auto_pad={a['auto_pad']}"
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return "MaxPool with an Indices output"
    if any(d != 1 for d in a.get("dilations", [])):
        return "dilated pooling"
    return None


@op("MaxPool", "AveragePool")
def op_pool(lw: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = var(lw, inputs[0])
    a = attrs(node)
    spatial = rank(x) - 2
    kw: dict[str, Any] = {"x": x, "kernel_sizes": list(a["kernel_shape"]),
                          "strides": list(a.get("strides", [1] * spatial)), "ceil_mode": bool(a.get("ceil_mode", 0))}
    kw.update(pad_kwargs(a, spatial))
    if node.op_type == "AveragePool":
        return [mb().avg_pool(exclude_padding_from_average=not a.get("count_include_pad", 0), **kw)]
    return [mb().max_pool(**kw)]
