"""Half-precision graphs: ``to_half(graph)`` rewrites float32 compute to float16 or bfloat16.

Backends that take precision from the graph's own types (TensorRT-RTX builds
strongly typed networks; MIGraphX and Core ML can too) run the result as it is.
The rewrite is a plain ONNX-to-ONNX transform, so every backend can run it.

What stays float32, and why (the usual failure modes of Stable Diffusion at fp16):

- normalizations (``LayerNormalization``, ``GroupNormalization``,
  ``InstanceNormalization``, ``BatchNormalization``) and the pieces of a
  decomposed one (``ReduceMean``, ``ReduceSum``, ``Pow``, ``Sqrt``,
  ``Reciprocal``): a variance of activations above 256 overflows fp16;
- ``Softmax`` / ``LogSoftmax``: the accumulation of attention weights;
- ``Sin`` / ``Cos`` and the elementwise chain that feeds them (the timestep
  embedding: ``sin(999 * f)`` at fp16's spacing of 0.5 is noise), and ``Range``;
- nodes whose name matches ``keep_nodes``; by default the VAE's and UNet's last
  layers (``conv_norm_out``, ``conv_act``, ``conv_out``), which write the image
  and the noise prediction;
- ops outside the default ONNX domain, random ops, and the float-only inputs of
  ``Resize`` and ``Upsample`` (their scales).

Everything else (Conv, MatMul, Gemm, attention's matmuls, activations, the
residual adds) runs in the half type, with ``Cast`` nodes at each boundary.
Float32 initializers feeding half nodes are stored in the half type, finite
values clipped to its range. Graph inputs and outputs keep float32 by default
(``keep_io_types``), so callers feed and read the same arrays as before.

The precision vocabulary lives here too: ``PRECISIONS`` names every precision a
backend may offer (``fp32``, ``fp16``, ``bf16``, ``int8``, ``int4``, ``fp8``) with
the aliases users write (``f32``, ``float32``, ``half``, ``bfloat16``, ...), and
``precision_name`` turns a user's value into the canonical name, or one
``PrecisionError`` listing the names a backend accepts. Every backend's
``precision=`` option goes through it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import ModelError, SdrtError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import onnx

    from .graph import Graph

log = logging.getLogger("sdrt.precision")

#: op types computed in float32 whatever the target type (see the module docstring)
KEEP_FLOAT32_OPS: frozenset[str] = frozenset({
    "LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization",
    "RMSNormalization", "LpNormalization", "MeanVarianceNormalization",
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp",
    "Pow", "Sqrt", "Reciprocal",
    "Softmax", "LogSoftmax",
    "Sin", "Cos", "Range",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
})
#: node-name patterns (``re.search``) kept in float32: the last layers of SD's VAE decoder and UNet
KEEP_NODES: tuple[str, ...] = (r"conv_norm_out", r"conv_act", r"conv_out",)
#: ops whose input precision matters; the elementwise chain feeding them stays float32 too
_PRECISE_INPUT_OPS = frozenset({"Sin", "Cos"})
#: ops that may be pulled into float32 upstream of ``_PRECISE_INPUT_OPS``
_CHAIN_OPS = frozenset({"Mul", "Add", "Sub", "Div", "Neg", "Exp", "Cast", "Unsqueeze", "Squeeze", "Reshape",
                        "Expand", "Concat", "Slice", "Gather", "Transpose", "Flatten", "Identity"})
#: inputs that the ONNX spec types as float32 whatever the data type: op -> input positions
_FLOAT_ONLY_INPUTS: dict[str, frozenset[int]] = {"Resize": frozenset({1, 2}), "Upsample": frozenset({1})}
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
#: metadata key recording the transform on the written graph
PRECISION_KEY = "sdrt.precision"

#: canonical precision name -> its aliases (lower case); the one table of precision names in sdrt
PRECISIONS: dict[str, tuple[str, ...]] = {
    "fp32": ("f32", "float32", "float", "single", "full"),
    "fp16": ("f16", "float16", "half"),
    "bf16": ("bfloat16", "brain_float16"),
    "int8": ("i8", "qint8", "w8a8"),
    "int4": ("i4", "qint4", "w4"),
    "fp8": ("f8", "float8", "float8_e4m3fn", "e4m3", "fp8_e4m3"),
}
_ALIASES = {alias: name for name, aliases in PRECISIONS.items() for alias in (name, *aliases)}
#: every accepted spelling -> its canonical name (``"float16"`` -> ``"fp16"``)
ALIASES: dict[str, str] = _ALIASES
#: canonical precision -> numpy / ONNX dtype name of the half types
_HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


class PrecisionError(SdrtError):
    """A precision value that is not one of the names a backend accepts."""


def precision_name(value: object, accepted: Iterable[str] = tuple(PRECISIONS), *,
                   where: str = "precision=") -> str:
    """The canonical name (``"fp16"``) of ``value`` (``"half"``, ``"float16"``, ``"FP16"``), checked against
    ``accepted``; raises one ``PrecisionError`` listing the accepted names and their aliases."""
    allowed = list(accepted)
    name = _ALIASES.get(str(value).strip().lower()) if isinstance(value, str) else None
    if name is None or name not in allowed:
        spelled = "; ".join(f"{n} ({', '.join(PRECISIONS[n][:3])})" for n in allowed)
        known = "" if name is None else f" ({name} is a precision this backend does not offer)"
        raise PrecisionError(f"precision {value!r} is not one this backend accepts{known}", where=where,
                             fix=f"pass one of: {spelled}")
    return name


HALF_TYPES = {alias: _HALF_DTYPES[name] for alias, name in _ALIASES.items() if name in _HALF_DTYPES}


def to_half(graph: Graph, dtype: str = "float16", *, keep_float32: Iterable[str] | None = None,
            keep_nodes: Iterable[str] | None = None, keep_io_types: bool = True) -> Graph:
    """A copy of ``graph`` computing in ``dtype`` (``"float16"`` or ``"bfloat16"``) where that is safe.

    ``keep_float32`` replaces the op types kept in float32 (default ``KEEP_FLOAT32_OPS``);
    ``keep_nodes`` replaces the node-name regexes kept in float32 (default ``KEEP_NODES``).
    With ``keep_io_types`` (the default) inputs and outputs stay float32. Initializers
    that only float32 nodes read keep their float32 data. Raises ``ModelError`` for
    graphs it cannot convert (control flow, unknown value types).
    """
    name = HALF_TYPES.get(str(dtype).lower())
    if name is None:
        raise SdrtError(f"cannot convert a graph to {dtype!r}", where="sdrt.precision.to_half",
                        fix="pass dtype='float16' or dtype='bfloat16'")
    ops = frozenset(KEEP_FLOAT32_OPS if keep_float32 is None else keep_float32)
    patterns = [re.compile(p) for p in (KEEP_NODES if keep_nodes is None else keep_nodes)]
    rewrite = _Rewrite(graph, name, ops, patterns, keep_io_types)
    model = rewrite.run()
    from .graph import Graph

    # converted initializers now hold their data inline; the others may stay mapped from their file
    external = {k: v for k, v in graph.external_refs.items() if k not in rewrite.converted}
    return Graph(model, graph.path, base_dir=graph.base_dir, external=external, label=graph.label)


def plan(graph: Graph, *, keep_float32: Iterable[str] | None = None,
         keep_nodes: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Which nodes ``to_half`` keeps in float32, by reason: ``{"op Softmax": [node names], ...}``."""
    ops = frozenset(KEEP_FLOAT32_OPS if keep_float32 is None else keep_float32)
    patterns = [re.compile(p) for p in (KEEP_NODES if keep_nodes is None else keep_nodes)]
    rw = _Rewrite(graph, "float16", ops, patterns, True)
    out: dict[str, list[str]] = {}
    for i, reason in sorted(rw.fp32_reasons().items()):
        node = rw.nodes[i]
        out.setdefault(reason, []).append(node.name or f"#{i} {node.op_type}")
    return out


class _Rewrite:
    """One conversion: classify the nodes, pick each value's type, insert the casts."""

    def __init__(self, graph: Graph, half: str, ops: frozenset[str], patterns: list[re.Pattern[str]],
                 keep_io: bool) -> None:
        from onnx import TensorProto

        self.graph = graph
        self.where = f"to_half({graph.name})"
        self.half = TensorProto.FLOAT16 if half == "float16" else TensorProto.BFLOAT16
        self.half_name = half
        self.ops, self.patterns, self.keep_io = ops, patterns, keep_io
        self.nodes = list(graph.model.graph.node)
        bad = sorted({n.op_type for n in self.nodes if n.op_type in _CONTROL_FLOW})
        if bad:
            raise ModelError(f"to_half does not convert graphs with control flow ({', '.join(bad)})",
                             where=self.where, fix="run this graph in float32, or convert it with your exporter")
        self.types = self._types()
        #: initializers stored in the half type by ``run``
        self.converted: set[str] = set()

    # -- analysis ------------------------------------------------------
    def _types(self) -> dict[str, int]:
        """ONNX element type of every value: initializers, inputs, inferred intermediates."""
        from onnx import shape_inference

        from .graph.protos import skeleton

        g = self.graph.model.graph
        try:
            inferred = shape_inference.infer_shapes(skeleton(self.graph.model), strict_mode=False)
        except Exception as exc:  # noqa: BLE001 - onnx raises several unrelated types here
            raise ModelError(f"type inference failed: {str(exc).strip()[:300]}", where=self.where,
                             fix="check the graph with onnx.checker, or re-export it") from exc
        types: dict[str, int] = {}
        for v in list(inferred.graph.value_info) + list(g.input) + list(g.output) + list(g.value_info):
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                types[v.name] = v.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
        for n in self.nodes:  # Constant outputs: straight from the attribute
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value" and a.HasField("t"):
                        types[n.output[0]] = a.t.data_type
        return types

    def _is_f32(self, value: str) -> bool:
        from onnx import TensorProto

        return bool(value) and self.types.get(value) == TensorProto.FLOAT

    def fp32_reasons(self) -> dict[int, str]:
        """Index of every node kept in float32 -> why."""
        reasons: dict[int, str] = {}
        for i, n in enumerate(self.nodes):
            if n.domain not in ("", "ai.onnx"):
                reasons[i] = f"domain {n.domain}"
            elif n.op_type in self.ops:
                reasons[i] = f"op {n.op_type}"
            elif n.name and any(p.search(n.name) for p in self.patterns):
                reasons[i] = "name " + next(p.pattern for p in self.patterns if p.search(n.name))
        producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for v in n.input:
                consumers.setdefault(v, []).append(i)
        outputs = {o.name for o in self.graph.model.graph.output}
        stack = [i for i, n in enumerate(self.nodes) if n.op_type in _PRECISE_INPUT_OPS and i in reasons]
        while stack:  # pull the elementwise chain feeding Sin/Cos into float32
            i = stack.pop()
            for v in self.nodes[i].input:
                j = producer.get(v)
                if j is None or j in reasons or self.nodes[j].op_type not in _CHAIN_OPS:
                    continue
                outs = [o for o in self.nodes[j].output if o]
                if any(o in outputs for o in outs) or not all(
                        c in reasons for o in outs for c in consumers.get(o, [])):
                    continue
                reasons[j] = "feeds Sin/Cos"
                stack.append(j)
        return reasons

    # -- rewrite -------------------------------------------------------
    def run(self) -> onnx.ModelProto:
        from onnx import TensorProto, helper

        from .graph.protos import copy_model

        src = self.graph.model.graph
        fp32 = self.fp32_reasons()
        half_nodes = {i for i in range(len(self.nodes)) if i not in fp32}

        def wants(i: int, pos: int, value: str) -> int | None:
            """The type node ``i`` wants for its input ``pos`` when that value is float32 now."""
            if not self._is_f32(value):
                return None
            n = self.nodes[i]
            if i in fp32 or pos in _FLOAT_ONLY_INPUTS.get(n.op_type, ()):
                return TensorProto.FLOAT
            return self.half

        # who wants each float32 value in which type
        demand: dict[str, set[int]] = {}
        for i, n in enumerate(self.nodes):
            for pos, v in enumerate(n.input):
                w = wants(i, pos, v)
                if w is not None:
                    demand.setdefault(v, set()).add(w)
        graph_outputs = [o.name for o in src.output]
        for o in graph_outputs:
            if self._is_f32(o):
                demand.setdefault(o, set()).add(TensorProto.FLOAT if self.keep_io else self.half)

        # the type each float32 value is produced in
        produced: dict[str, int] = {}
        inits = {t.name for t in src.initializer}
        inputs = {i.name for i in src.input if i.name not in inits}
        for i, n in enumerate(self.nodes):
            flexible = n.op_type == "Constant"
            for o in n.output:
                if not self._is_f32(o):
                    continue
                if flexible:
                    produced[o] = self.half if self.half in demand.get(o, ()) else TensorProto.FLOAT
                else:
                    produced[o] = self.half if i in half_nodes else TensorProto.FLOAT
        for name in inits:
            if self._is_f32(name):
                produced[name] = self.half if self.half in demand.get(name, ()) else TensorProto.FLOAT
        for name in inputs:
            if self._is_f32(name):
                produced[name] = TensorProto.FLOAT if self.keep_io else self.half

        # the model: initializers converted, nodes with retyped attributes, casts where types differ
        m = copy_model(self.graph.model, initializers=False, value_info=False)
        del m.graph.node[:]
        for t in src.initializer:
            if produced.get(t.name) == self.half:
                m.graph.initializer.append(self._half_tensor(t))
                self.converted.add(t.name)
            else:
                m.graph.initializer.append(t)

        casts: dict[tuple[str, int], str] = {}
        cast_nodes: list[Any] = []

        def cast(value: str, to: int) -> str:
            key = (value, to)
            if key not in casts:
                suffix = "fp32" if to == TensorProto.FLOAT else self.half_name
                out = f"{value}__{suffix}"
                casts[key] = out
                cast_nodes.append(helper.make_node("Cast", [value], [out], name=f"{out}/Cast", to=to))
            return casts[key]

        # a graph output produced in the other type is written under a new name, then cast to its declared type
        out_type = TensorProto.FLOAT if self.keep_io else self.half
        renamed: dict[str, str] = {}
        for o in graph_outputs:
            if o in produced and produced[o] != out_type and o not in inputs | inits:
                renamed[o] = f"{o}__{'fp32' if produced[o] == TensorProto.FLOAT else self.half_name}"

        out_nodes: list[Any] = []
        for i, n in enumerate(self.nodes):
            new = type(n)()
            new.CopyFrom(n)
            for pos, v in enumerate(n.input):
                w = wants(i, pos, v)
                src_name = renamed.get(v, v)
                if w is not None and produced.get(v, TensorProto.FLOAT) != w:
                    new.input[pos] = cast(src_name, w)
                else:
                    new.input[pos] = src_name
            for k, o in enumerate(n.output):
                if o in renamed:
                    new.output[k] = renamed[o]
            if i in half_nodes or n.op_type == "Constant":
                self._retype_attributes(new, produced)
            # a cast reads a graph input, an initializer or an earlier node's output: placing it just
            # before its first reader keeps the node list topologically sorted
            out_nodes.extend(cast_nodes)
            cast_nodes.clear()
            out_nodes.append(new)
        m.graph.node.extend(out_nodes)
        for o, half_name in renamed.items():
            m.graph.node.append(helper.make_node("Cast", [half_name], [o], name=f"{o}/Cast", to=out_type))
        if not self.keep_io:
            for v in list(m.graph.input) + list(m.graph.output):
                if v.name in produced:
                    v.type.tensor_type.elem_type = self.half
        del m.graph.value_info[:]
        entry = m.metadata_props.add()
        entry.key, entry.value = PRECISION_KEY, f"{self.half_name};fp32_nodes={len(fp32)}"
        log.info("%s: %d of %d nodes in %s, %d kept in float32, %d initializers converted, %d casts",
                 self.graph.name, len(half_nodes), len(self.nodes), self.half_name, len(fp32), len(self.converted),
                 len(casts) + len(renamed))
        return m

    def _retype_attributes(self, node: Any, produced: dict[str, int]) -> None:
        """Attributes that fix a float32 output type: Cast's ``to``, ConstantOfShape's and Constant's value."""
        from onnx import TensorProto

        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT and self._is_f32(node.output[0]):
                a.i = self.half
            elif node.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(self._half_tensor(a.t))
            elif (node.op_type == "Constant" and a.name == "value" and a.t.data_type == TensorProto.FLOAT
                  and produced.get(node.output[0]) == self.half):
                a.t.CopyFrom(self._half_tensor(a.t))

    def _half_tensor(self, t: Any) -> Any:
        from onnx import numpy_helper

        arr = half_array(self._array(t), self.half_name)
        out = numpy_helper.from_array(arr, t.name)
        return out

    def _array(self, t: Any) -> np.ndarray:
        return self.graph.tensor_array(t)  # decoded, or mapped from a stripped graph's weights file


def half_array(arr: np.ndarray, dtype: str = "float16") -> np.ndarray:
    """``arr`` in ``dtype`` (``float16``/``bfloat16``), finite values clipped to its range (as ``to_half`` stores
    initializers). Backends use it to convert new weights for a half graph."""
    import numpy as np

    name = HALF_TYPES.get(str(dtype).lower(), str(dtype))
    if name == "bfloat16":
        import ml_dtypes

        return np.asarray(arr, dtype=np.float32).astype(ml_dtypes.bfloat16)
    limit = float(np.finfo(np.float16).max)
    a = np.asarray(arr, dtype=np.float32)
    finite = np.isfinite(a)
    if a.size and (np.abs(a[finite]) > limit).any():
        a = np.where(finite, np.clip(a, -limit, limit), a)
    return a.astype(np.float16)


__all__ = ["HALF_TYPES", "KEEP_FLOAT32_OPS", "KEEP_NODES", "PRECISIONS", "PRECISION_KEY", "PrecisionError", "half_array",
           "plan", "precision_name", "to_half"]
