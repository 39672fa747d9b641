"""``resolve_weights``: a graph plus optional ``Weights`` -> the final array of every initializer."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .blocks import BlockMatrix

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph
    from .store import Weights


def resolve_weights(graph: Graph, weights: Weights | None = None, *, blocks: Iterable[str] = ()) -> dict[str, np.ndarray]:
    """Every initializer of ``graph``, by name, mapped to the array a backend compiles with.

    This is the one place where a graph's weights are put together; backends call
    it in ``compile`` and never merge weights themselves:

    - the graph's own data: inline initializers decoded, external ones mapped from disk;
    - a stripped graph (``sdrt strip``): its initializers mapped from its ``.safetensors`` file;
    - ``weights`` (names after its key mapping) override both. They are checked against the
      graph first: one ``WeightsError`` lists every missing, unexpected and mismatched tensor.

    Initializer names are ONNX names whatever they look like, so torch's anonymous
    ``onnx::MatMul_1234`` weights (a Linear's weight, stored transposed) resolve like any
    other: from the graph, from a stripped graph's file, or from weights that name them.
    A graph whose external data is absent, with no weights naming those tensors, raises a
    ``ModelError`` naming the tensor and the file it looked for.

    ``blocks``: the ggml block types the backend runs as stored (``Backend.weight_blocks``): matmul weights a
    GGUF file holds in one of them come as ``BlockMatrix`` (``sdrt.weights.blocks``), not as float32 arrays.
    """
    given = bind(weights, graph, blocks) if weights is not None else {}
    names = graph.initializer_names
    own = graph.initializer_arrays([n for n in names if n not in given])
    return {name: _array(given[name]) if name in given else own[name] for name in names}


def check_fits(graph: Graph, weights: Any) -> None:
    """What ``resolve_weights`` refuses about ``weights`` (names, dtypes, shapes), raised now with nothing read: a
    compile cache hit resolves no weight, and its key counts only the tensors the graph names, so a file that fits
    nothing of the graph hit the graph's own entry and ran the graph's own weights in silence."""
    from .store import Weights

    if isinstance(weights, Weights):
        weights.fits(graph)


def keyable(weights: Any) -> bool:
    """Whether a compile cache key can name ``weights`` without reading them: None or sdrt's ``Weights`` (each
    tensor's origin known); any other object with a ``bind(graph)`` is only known by resolving it."""
    from .store import Weights

    return weights is None or isinstance(weights, Weights)


def bind(weights: Any, graph: Graph, blocks: Iterable[str] = ()) -> dict[str, Any]:
    """``weights.bind(graph)``, with the block types a backend keeps (``Weights.bind(..., blocks=)``) when
    ``weights`` is sdrt's ``Weights``; any other object with a ``bind(graph)`` is called as it is."""
    from .store import Weights

    blocks = frozenset(blocks)
    if blocks and isinstance(weights, Weights):
        return weights.bind(graph, blocks=blocks)
    return weights.bind(graph)


def _array(value: Any) -> Any:
    return value if isinstance(value, BlockMatrix) else np.asarray(value)


def as_arrays(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: array}`` of bound weights, each an ndarray except a ``BlockMatrix`` (kept for its backend)."""
    return {name: _array(v) for name, v in values.items()}


def _file_position(arr: np.ndarray) -> tuple[int, int, int] | None:
    """(device, inode, byte offset) of a C-contiguous array over a read-only file mapping (``np.memmap`` mode "r",
    how sdrt maps .safetensors and external-data tensors), else None."""
    from .pages import mapped_region

    region = mapped_region(arr)
    if region is None or region[0].mode != "r":
        return None
    try:
        st = os.stat(region[0].filename)
    except OSError:
        return None
    return st.st_dev, st.st_ino, region[1]


def same_values(old: np.ndarray | None, new: Any) -> bool:
    """Whether ``new`` holds exactly the values of ``old`` (same shape and dtype); compares a few
    leading values first, so a changed weight costs little. Backends use it in ``_update_weights``
    to skip weights a caller passes again unchanged (a pipeline rebinds whole parts)."""
    if old is None:
        return False
    if isinstance(old, BlockMatrix) or isinstance(new, BlockMatrix):
        return isinstance(old, BlockMatrix) and old.same(new)
    new = np.asarray(new)
    if new is old:
        return True
    if new.shape != old.shape or new.dtype != old.dtype:
        return False
    here = _file_position(old)
    if here is not None and here == _file_position(new):  # one region of one read-only file, mapped twice:
        return True  # the same bytes, without reading them (a rebound part's unchanged weights, 3.4 GB for a UNet)
    a, b = old.reshape(-1), new.reshape(-1)
    return bool(np.array_equal(a[:256], b[:256]) and np.array_equal(a, b))
