"""Bridges to the backend contract of the redesign (issue 12) while a core without it is installed.

``sdrt.resolve_weights`` and ``Session(..., graph=)`` are the contract; a core
released before them lacks both. Delete this module once sdrt 0.1 ships the
redesign everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def resolve_weights(graph: Any, weights: Any) -> dict[str, np.ndarray]:
    import sdrt

    resolve = getattr(sdrt, "resolve_weights", None)
    if resolve is not None:
        return dict(resolve(graph, weights))
    arrays = {k: np.asarray(v) for k, v in graph.initializer_arrays().items()}
    if weights is not None:
        arrays.update({k: np.asarray(v) for k, v in weights.bind(graph).items()})
    return arrays
