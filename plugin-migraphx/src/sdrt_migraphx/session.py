"""``MIGraphXSession``: one compiled MIGraphX program, run with numpy feeds.

Weights are swapped by recompiling (``_update_weights``): a MIGraphX program
holds its weights as literals folded into the compiled graph, and its Python
API has no call that replaces a literal of a compiled program. The new weights
go through the same path as ``compile`` (the program cache first, then parse,
quantize and compile), so switching back to weights used before is a cache hit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from sdrt import Session
from sdrt.errors import UnsupportedGraph

from . import feeds as feeds_mod
from .errors import MIGraphXError, first_lines

log = logging.getLogger("sdrt.migraphx")

#: (arrays) -> (program, cache hit)
Compile = Callable[[Mapping[str, np.ndarray]], tuple[Any, bool]]


class MIGraphXSession(Session):
    def __init__(self, graph: Any, program: Any, arrays: Mapping[str, np.ndarray], compile_: Compile,
                 where: str) -> None:
        super().__init__(graph.inputs, graph.outputs, graph=graph)
        self._program: Any = program
        self._arrays = dict(arrays)
        self._compile = compile_
        self._where = where
        self._check_outputs()
        #: graph inputs that are run-time reduce axes, with the rank to wrap negative axes by
        self._axes_ranks = feeds_mod.runtime_axes(graph)
        #: graph inputs that are run-time reshape shapes, with the static data shape to resolve -1 and 0 by
        self._reshapes = feeds_mod.runtime_reshapes(graph)
        #: seconds the last update_weights took, and whether it was a cache hit
        self.last_update: tuple[float, bool] | None = None

    def _check_outputs(self) -> None:
        try:
            shapes = self._program.get_output_shapes()
        except Exception as exc:  # noqa: BLE001
            raise MIGraphXError(f"MIGraphX cannot describe the program's outputs: {first_lines(exc)}",
                                where=self._where, fix="delete the program cache folder and compile again") from exc
        if len(shapes) < len(self.outputs):  # MIGraphX leaves out optional outputs it does not compute
            missing = [o.name for o in self.outputs[len(shapes):]]
            raise UnsupportedGraph(
                f"MIGraphX computes {len(shapes)} of the graph's {len(self.outputs)} outputs",
                unsupported={"output MIGraphX does not compute": missing}, where=self._where,
                fix="drop these outputs from the graph (optional outputs such as BatchNormalization's running "
                    "mean in training mode, MaxPool's indices), or use another backend for it")
        if len(shapes) != len(self.outputs):
            raise MIGraphXError(
                f"the MIGraphX program has {len(shapes)} outputs where the graph declares {len(self.outputs)}",
                where=self._where, fix="delete the program cache folder and compile again; if it persists, "
                                       "report the model to sdrt")
        wrong = []
        for info, shape in zip(self.outputs, shapes):
            if shape.dynamic():  # sized at run time (Unique): nothing to compare yet
                continue
            lens = [int(d) for d in shape.lens()]
            if info.is_static and int(np.prod(lens)) != int(np.prod(info.shape)):  # {1} for a scalar is fine
                wrong.append(f"{info.name}: MIGraphX {lens}, graph {list(info.shape)}")
        if wrong:  # e.g. ceil-mode pooling whose last window starts in the padding, on MIGraphX 2.16
            raise MIGraphXError(
                f"MIGraphX computes outputs of another size than the graph declares ({'; '.join(wrong)})",
                where=self._where, fix="use another backend for this graph (the outputs would be wrong), and "
                                       "report the model to MIGraphX")

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # np.require keeps a 0-d array 0-d (np.ascontiguousarray makes it 1-d): MIGraphX takes a buffer
        # without dimensions as its scalar shape, and refuses a 1-element vector for a scalar parameter
        params = {name: np.require(arr, requirements="C")
                  for name, arr in feeds_mod.fix(feeds, self._axes_ranks, self._where, self._reshapes).items()}
        try:
            results = self._program.run(params)
        except Exception as exc:  # noqa: BLE001 - MIGraphX raises RuntimeError
            raise MIGraphXError(f"MIGraphX failed running the program: {first_lines(exc)}", where=self._where,
                                fix="check the feeds' shapes against session.inputs; try device 'ref'") from exc
        out: dict[str, np.ndarray] = {}
        for info, result in zip(self.outputs, results):
            arr = np.array(result)
            if arr.dtype.name != info.dtype and info.dtype in np.sctypeDict:
                arr = arr.astype(info.dtype)
            if info.is_static and arr.shape != tuple(info.shape) and arr.size == int(np.prod(info.shape)):
                arr = arr.reshape(info.shape)  # MIGraphX returns a scalar as {1}: give the graph's shape back
            out[info.name] = arr
        return out

    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        merged = {**self._arrays, **arrays}
        t0 = time.perf_counter()
        program, hit = self._compile(merged)
        elapsed = time.perf_counter() - t0
        self._program, self._arrays = program, merged
        self.last_update = (elapsed, hit)
        log.info("update_weights on %s: %d tensors, %s in %.2fs", self._where, len(arrays),
                 "loaded from the program cache" if hit else "recompiled", elapsed)

    def close(self) -> None:
        self._program = None
        self._arrays = {}
        super().close()
