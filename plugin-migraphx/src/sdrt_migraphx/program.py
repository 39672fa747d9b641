"""Building a MIGraphX program from a graph and its weights: write, parse, quantize, compile.

MIGraphX parses ONNX files itself (``parse_onnx``), and a program holds its
weights as literals. The graph is written to a temporary folder with every
initializer in one external-data file (so models above protobuf's 2 GB limit
parse too); ``map_input_dims`` fixes every input to the static shape the core's
graph declares. Then ``quantize_fp16``/``quantize_bf16`` where asked, and
``program.compile`` for the target.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from sdrt.errors import SdrtError, UnsupportedGraph

from .errors import MIGraphXError, first_lines
from .options import Options

log = logging.getLogger("sdrt.migraphx")

#: initializers up to this size stay inside the .onnx file; larger ones go to the external-data file
INLINE_BYTES = 1024


def input_dims(graph: Any) -> dict[str, list[int]]:
    """``map_input_dims`` for MIGraphX: every input's static shape; raises ``UnsupportedGraph`` for dynamic ones."""
    dynamic = {info.name: str(info) for info in graph.inputs if not info.is_static}
    if dynamic:
        raise UnsupportedGraph(
            "MIGraphX compiles for static shapes and these inputs have dynamic dimensions",
            unsupported={"dynamic input": sorted(dynamic.values())}, where=graph.name,
            fix="fix the shapes first, e.g. graph.with_shapes(batch=1, height=64, width=64)")
    return {info.name: [int(d) for d in info.shape] for info in graph.inputs}  # type: ignore[arg-type]


def write_model(graph: Any, arrays: Mapping[str, np.ndarray], folder: Path) -> Path:
    """``folder/model.onnx`` (+ ``weights.bin``): the graph with ``arrays`` as its top-level initializers."""
    import onnx

    own = {t.name: t for t in graph.model.graph.initializer}
    model = graph.model_without(arrays.keys())
    offset = 0
    with open(folder / "weights.bin", "wb") as data:
        for name, arr in arrays.items():
            tensor = onnx.TensorProto(name=name)
            data_type = own[name].data_type if name in own else onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
            want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))
            value = np.ascontiguousarray(arr if arr.dtype == want else arr.astype(want))
            tensor.data_type = data_type
            tensor.dims.extend(int(d) for d in value.shape)
            raw = value.reshape(-1).view(np.uint8)
            if raw.size <= INLINE_BYTES:
                tensor.raw_data = raw.tobytes()
            else:  # MIGraphX reads external_data by position: location, offset, length
                tensor.data_location = onnx.TensorProto.EXTERNAL
                for key, val in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(raw.size))):
                    tensor.external_data.add(key=key, value=val)
                data.write(memoryview(raw))
                offset += raw.size
            model.graph.initializer.append(tensor)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


#: how MIGraphX's parser says that it does not handle a form of an op (rather than failing on it)
LIMITATION = re.compile(r"not supported|must be constant|non-constant|cannot handle|variable|dynamic|only \S+ "
                        r"inputs are supported|attribute required|Wrong number of inputs|must match", re.I)


def parse_error(message: str, graph: Any, where: str) -> SdrtError:
    """A parse failure as the user should see it.

    Where MIGraphX's parser says it does not handle the graph's form of an op
    (inputs that must be constants, attributes or modes it lacks), the graph is
    unsupported: ``UnsupportedGraph`` naming the op's nodes where the message
    names the op (``PARSE_TopK``, ``RotaryEmbedding:``). Anything else is a
    failure of MIGraphX on a graph it says it takes: ``MIGraphXError``.
    """
    if not LIMITATION.search(message):
        return MIGraphXError(f"MIGraphX could not parse the graph: {message}", where=where,
                             fix="check the op and attribute MIGraphX names; run with -vv for its log, or use "
                                 "another backend for this graph")
    words = {w.lower().replace("_", "") for w in re.findall(r"[A-Za-z_]+", message)}
    words |= {w[len("parse"):] for w in words if w.startswith("parse")}
    nodes: dict[str, list[str]] = {}
    for i, node in enumerate(graph.model.graph.node):
        if node.op_type.lower() in words:
            nodes.setdefault(node.op_type, []).append(node.name or f"#{i}")
    return UnsupportedGraph(f"MIGraphX's ONNX parser does not handle this graph ({message})", unsupported=nodes,
                            where=where, fix="give those inputs as constants (initializers) and use the attributes "
                                             "MIGraphX supports, or use another backend for this graph")


class Builder:
    """Compiles one graph for one MIGraphX target with fixed options; a session keeps it for update_weights."""

    def __init__(self, mod: ModuleType, graph: Any, target: str, options: Options, work_dir: Path | None) -> None:
        self.mod, self.graph, self.target, self.options = mod, graph, target, options
        self.work_dir = work_dir
        self.dims = input_dims(graph)
        self.timings: dict[str, float] = {}

    def build(self, arrays: Mapping[str, np.ndarray]) -> Any:
        mod, opts, where = self.mod, self.options, f"{self.graph.name} for MIGraphX's {self.target} target"
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="sdrt-migraphx-", dir=self.work_dir) as tmp:
            path = write_model(self.graph, arrays, Path(tmp))
            t1 = time.perf_counter()
            try:
                prog = mod.parse_onnx(str(path), map_input_dims=self.dims)
            except Exception as exc:  # noqa: BLE001 - MIGraphX raises RuntimeError for everything
                raise parse_error(first_lines(exc), self.graph, where) from exc
        t2 = time.perf_counter()
        try:
            if opts.precision == "fp16":
                mod.quantize_fp16(prog)
            elif opts.precision == "bf16":
                mod.quantize_bf16(prog)
            prog.compile(mod.get_target(self.target), offload_copy=True, fast_math=opts.fast_math,
                         exhaustive_tune=opts.exhaustive_tune)
        except Exception as exc:  # noqa: BLE001
            raise MIGraphXError(f"MIGraphX could not compile the graph at {opts.precision}: {first_lines(exc)}",
                                where=where, fix="try precision='fp32', or device 'ref' to tell a MIGraphX bug from "
                                                 "a model problem") from exc
        t3 = time.perf_counter()
        self.timings = {"write_s": t1 - t0, "parse_s": t2 - t1, "compile_s": t3 - t2}
        log.info("built %s: write %.2fs, parse %.2fs, quantize+compile %.2fs", where, t1 - t0, t2 - t1, t3 - t2)
        return prog
