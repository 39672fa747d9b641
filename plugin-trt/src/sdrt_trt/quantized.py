"""Weight-only quantized graphs on TensorRT-RTX: which ``DequantizeLinear`` weights its ONNX parser and builder take
as they are stored, per target, and the float32 fallback (``sdrt.quantization.dequantize``) for the rest.

What TensorRT-RTX 1.7 does with weight-only ``DequantizeLinear`` on a constant weight (AOT builds of the tiny SD 1.5
UNet, every target; docs/trt.md):

- int8 per channel, on MatMul, Gemm and Conv weights: parsed and built for every target (sm75 to sm121);
- int4 in blocks along the reduction axis, on MatMul and Gemm weights: parsed and built from sm80 on; the builder
  refuses int4 for sm75 ("HW-specific datatypes: int4") and the parser rejects blocked int4 on Conv weights;
- fp8 (e4m3fn) per channel, on MatMul, Gemm and Conv weights: built from sm89 (Ada) on; the builder refuses it
  for sm75, sm80 and sm86 ("HW-specific datatypes: fp8_e4m3").

The backend's ``quantized_weights`` declares the ops (what ``sdrt.load`` keeps before a device is known);
``for_target`` then folds what the chosen target cannot build.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .targets import cc_of

if TYPE_CHECKING:  # pragma: no cover
    from sdrt.graph import Graph

log = logging.getLogger("sdrt.trt")

#: the lowest compute capability whose engines hold each stored weight type
MIN_CC: dict[str, tuple[int, int]] = {"int8": (7, 5), "int4": (8, 0), "float8_e4m3fn": (8, 9)}


def keeps(info: dict[str, Any], target: str) -> bool:
    """Whether an engine for ``target`` holds this quantized weight as it is stored."""
    need = MIN_CC.get(info["dtype"])
    return need is not None and cc_of(target) >= need


def for_target(graph: Graph, target: str) -> Graph:
    """``graph`` with every quantized weight that ``target`` cannot hold dequantized to float32."""
    from sdrt import quantization

    found = quantization.quantized_weights(graph)
    if not found or all(keeps(q, target) for q in found.values()):
        return graph
    folded = sorted({q["dtype"] for q in found.values() if not keeps(q, target)})
    log.info("%s: TensorRT-RTX engines for %s hold no %s weights; dequantizing them to float32", graph.name, target,
             ", ".join(folded))
    return quantization.dequantize(graph, keep=lambda _name, q: keeps(q, target))
