"""Gather: embedding lookups (ggml_get_rows) and constant-index selection (views)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import op
from ._common import GTensor, HostValue, Value, attrs, cont, ggml_lib, norm_axis, reshape
from .op_shape import slice_axis


def select(lowering: Any, x: GTensor, axis: int, idx: np.ndarray) -> GTensor:
    """``x`` indexed along ONNX ``axis`` by the constant ``idx``: a view for a run of consecutive indices."""
    flat = [int(i) + (x.shape[axis] if i < 0 else 0) for i in idx.reshape(-1)]
    g = ggml_lib()
    if flat and flat == list(range(flat[0], flat[0] + len(flat))):
        y = slice_axis(lowering, x, axis, flat[0], flat[0] + len(flat), 1)
    else:
        from ._common import gdim

        parts = [cont(lowering, slice_axis(lowering, x, axis, i, i + 1, 1)) for i in flat]
        y = parts[0]
        for p in parts[1:]:
            shape = list(y.shape)
            shape[axis] += 1
            y = GTensor(g.ggml_concat(lowering.ctx, y.ptr, p.ptr, gdim(axis, x.rank)), tuple(shape), y.dtype)
    out = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    return reshape(lowering, y, out)


@op("Gather")
def op_gather(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    data, idx = inputs
    axis = int(attrs(node).get("axis", 0))
    if isinstance(data, GTensor) and isinstance(idx, np.ndarray):
        return [select(lowering, data, norm_axis(axis, data.rank), idx)]
    assert isinstance(idx, GTensor)
    drank = np.ndim(data) if isinstance(data, np.ndarray) else data.rank
    if norm_axis(axis, drank) != 0:
        raise ValueError("Gather with runtime indices on an axis other than 0")
    if idx.dtype != "int32":
        raise ValueError("Gather with non-integer runtime indices")
    dshape = tuple(np.shape(data)) if isinstance(data, np.ndarray) else data.shape
    src = lowering.input_name_of(idx)
    if src is None:
        raise ValueError("Gather with computed runtime indices (only graph inputs can be indices)")
    lowering.out.index_checks[src] = min(dshape[0], lowering.out.index_checks.get(src, dshape[0]))
    row = math.prod(dshape[1:])
    if isinstance(data, np.ndarray):
        table = lowering.const(data, transform=lambda a: a.reshape(a.shape[0], -1), tag="rows", view=True)
    else:
        table = reshape(lowering, data, (dshape[0], row))
    flat = reshape(lowering, idx, (idx.size,))
    g = ggml_lib()
    y = GTensor(g.ggml_get_rows(lowering.ctx, table.ptr, flat.ptr), (idx.size, row))
    return [reshape(lowering, y, idx.shape + dshape[1:])]


@op("GatherND")
def op_gather_nd(lowering: Any, node: Any, inputs: list[Value]) -> list[Value]:
    """GatherND (batch_dims 0) as one row lookup: the leading index tuple is raveled to a row
    number (on the host for host-computed indices, e.g. CLIP's pooled-output position)."""
    data, idx = inputs
    if int(attrs(node).get("batch_dims", 0)) != 0:
        raise ValueError("GatherND with batch_dims")
    if not isinstance(data, GTensor):
        raise ValueError("GatherND on constant data with runtime indices")
    ishape = idx.example.shape if isinstance(idx, HostValue) else np.shape(idx)
    m = int(ishape[-1])
    lead = tuple(int(d) for d in data.shape[:m])

    def ravel(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64)
        a = np.where(a < 0, a + np.array(lead), a)
        return np.ravel_multi_index(tuple(np.moveaxis(a, -1, 0)), lead, mode="raise").astype(np.int64)

    if isinstance(idx, HostValue):
        flat: Value = lowering.host_map(idx, ravel, "ravel")
        rows = lowering._materialize(flat)
        lowering.out.index_checks[flat.name] = math.prod(lead)
    elif isinstance(idx, np.ndarray):
        rows = lowering.const(ravel(idx), dtype="int32")
    else:
        raise ValueError("GatherND with indices computed by ggml")
    rest = data.shape[m:]
    table = reshape(lowering, data, (math.prod(lead), math.prod(rest)))
    r = reshape(lowering, rows, (rows.size,))
    g = ggml_lib()
    y = GTensor(g.ggml_get_rows(lowering.ctx, table.ptr, r.ptr), (rows.size, math.prod(rest)))
    return [reshape(lowering, y, tuple(ishape[:-1]) + rest)]
