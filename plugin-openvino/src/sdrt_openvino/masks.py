"""Additive attention masks written so that OpenVINO keeps the bias they are added to.

transformers' encoders (T5 among them) turn a 0/1 ``attention_mask`` into an additive one as
``(1 - mask) * C`` with ``C`` the dtype's minimum (-3.4e38), and add it to a bias (T5's relative
position bias) before the scores. Whenever the bias is constant (T5's is, once the sequence length is
pinned), OpenVINO computes ``bias + (1 - m) * C`` as ``(bias + C) - m * C`` with ``bias + C`` folded into one
constant. In float32 that rounds to ``C``: the bias is lost, the sum is exactly ``C - C = 0`` at every kept
position (observed), and the tiny Chroma T5 encoder's output is 1.85 off onnxruntime (also at
``INFERENCE_PRECISION_HINT`` f32, with raw OpenVINO after ``model.reshape``; the same graph with a dynamic
sequence length is right).

``guard_additive_masks`` puts each such ``(1 - m) * C`` (``|C|`` at least 1e4, finite) behind
``Where(m == 1, 0, (1 - m) * C)``: the same value for every ``m`` (``(1 - 1) * C`` is 0), and a ``Where`` is
not a linear op, so nothing is re-associated across it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: the suffix of a guarded Mul's output (a second pass leaves it alone)
GUARDED = "__sdrt_unguarded"
#: the smallest |C| treated as a masking constant (float16's minimum is -65504; transformers' older -1e4)
BIG = 1e4


def _constants(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Small constant values by name (at most 16 elements): ``values`` (initializers bound later as constants),
    inline initializers and ``Constant`` nodes."""
    from onnx import TensorProto, numpy_helper

    out: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in values.items() if np.size(v) <= 16}
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL and int(np.prod(t.dims)) <= 16:
            out[t.name] = numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if int(np.prod(t.dims)) <= 16:
                out[n.output[0]] = numpy_helper.to_array(t)
    return out


def _matches(model: onnx.ModelProto, consts: Mapping[str, np.ndarray]) -> list[tuple[int, str, str, str]]:
    """(index of the Mul, the Sub's ``m`` input, the ``1`` constant's name, the ``C`` constant's name)."""
    subs = {n.output[0]: n for n in model.graph.node if n.op_type == "Sub" and len(n.input) == 2}
    found = []
    for i, n in enumerate(model.graph.node):
        if n.op_type != "Mul" or len(n.input) != 2 or n.output[0].endswith(GUARDED):
            continue
        for a, b in ((0, 1), (1, 0)):
            sub, c = subs.get(n.input[a]), consts.get(n.input[b])
            if sub is None or c is None or c.size != 1 or c.dtype.kind != "f":
                continue
            one = consts.get(sub.input[0])
            value = float(c.reshape(-1)[0])
            if one is None or one.size != 1 or float(one.reshape(-1)[0]) != 1.0:
                continue
            if np.isfinite(value) and abs(value) >= BIG:
                found.append((i, sub.input[1], sub.input[0], n.input[b]))
                break
    return found


def guard_additive_masks(model: onnx.ModelProto, values: Mapping[str, np.ndarray] | None = None, *,
                         copy: bool = True) -> onnx.ModelProto:
    """``model`` with each ``(1 - m) * C`` masking pattern behind a ``Where`` (see the module docstring).

    ``values``: the arrays of initializers that are graph inputs here and constants in OpenVINO
    (``convert.promote``'s). Returns ``model`` itself when it has no such pattern; otherwise a rewritten
    copy (``copy=False``: in place). Only the top-level graph is rewritten (encoders build masks there)."""
    from onnx import helper, numpy_helper

    consts = _constants(model, values or {})
    found = _matches(model, consts)
    if not found:
        return model
    if copy:
        import onnx

        out = onnx.ModelProto()
        out.CopyFrom(model)
        model = out
    nodes = list(model.graph.node)
    for k, (i, m, one, c) in reversed(list(enumerate(found))):
        mul = nodes[i]
        result, raw, keep, zero = mul.output[0], mul.output[0] + GUARDED, f"sdrt_mask_keep_{k}", \
            f"sdrt_mask_zero_{k}"
        mul.output[0] = raw
        model.graph.initializer.append(numpy_helper.from_array(np.zeros((), consts[c].dtype), zero))
        nodes[i + 1:i + 1] = [helper.make_node("Equal", [m, one], [keep], name=f"sdrt_mask_equal_{k}"),
                              helper.make_node("Where", [keep, zero, raw], [result], name=f"sdrt_mask_where_{k}")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model
