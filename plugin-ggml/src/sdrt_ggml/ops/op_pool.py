"""MaxPool and AveragePool (2-D) through ggml_pool_2d."""

from __future__ import annotations

from typing import Any

from . import check, op
from ._common import GTensor, Value, attrs, cont, ggml_lib


@check("MaxPool", "AveragePool")
def check_pool(node: Any) -> str | None:
    a = attrs(node)
    ks = a.get("kernel_shape", [])
    if len(ks) != 2:
        return f"{node.op_type} with {len(ks)} spatial dims (2 is supported)"
    if a.get("ceil_mode", 0):
        return f"{node.op_type} with ceil_mode=1"
    if any(d != 1 for d in a.get("dilations", [1, 1])):
        return f"{node.op_type} with dilations"
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"{node.op_type} with auto_pad={a.get('auto_pad')}"
    pads = a.get("pads", [0, 0, 0, 0])
    if pads[0] != pads[2] or pads[1] != pads[3]:
        return f"{node.op_type} with asymmetric pads"
    if node.op_type == "AveragePool" and any(pads) and not a.get("count_include_pad", 0):
        return "AveragePool with padding and count_include_pad=0"
    if len(node.output) > 1 and node.output[1]:
        return "MaxPool with an Indices output"
    return None


@op("MaxPool", "AveragePool")
def op_pool(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    x = inputs[0]
    assert isinstance(x, GTensor)
    a = attrs(node)
    kh, kw = a["kernel_shape"]
    sh, sw = a.get("strides", [1, 1])
    pads = a.get("pads", [0, 0, 0, 0])
    ph, pw = pads[0], pads[1]
    n, c, h, w = x.shape
    oh = (h + 2 * ph - kh) // sh + 1
    ow = (w + 2 * pw - kw) // sw + 1
    g = ggml_lib()
    kind = g.GGML_OP_POOL_MAX if node.op_type == "MaxPool" else g.GGML_OP_POOL_AVG
    x = cont(lowering, x)
    y = g.ggml_pool_2d(lowering.ctx, x.ptr, kind, kw, kh, sw, sh, float(pw), float(ph))
    return [GTensor(y, (n, c, oh, ow))]
