"""Lowering: walk the static, folded ONNX graph once and build a MIL function.

Values are MIL ``Var``s (runtime tensors) or numpy arrays (constants).
Nodes whose inputs are all constants are evaluated at compile time with onnx's
reference ops; an initializer that a MIL op needs becomes one ``const`` named
after it (``package`` finds it again by value, to rewrite it in place). With ``feeds`` the graph inputs become MIL constants
too: every MIL op that has a ``value_inference`` then computes its result in
numpy while the program is built (``evaluate.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sdrt.errors import UnsupportedGraph
from sdrt.lowering import fold_node, node_inputs, producers_and_uses

from .ops import FOLD_ONLY, REGISTRY, load_all
from .ops import op_attention as attention
from .ops._common import mb, mil_array, unsupported

log = logging.getLogger("sdrt.coreml.lower")

#: graph input dtypes a Core ML model takes (int64 ids travel as int32)
_FP16_MAX = float(np.finfo(np.float16).max)
INPUT_DTYPES = {"float32": "fp32", "float16": "fp16", "int32": "int32", "int64": "int32"}


@dataclass
class Lowered:
    """What lowering produced."""

    program: Any
    n_ops: int = 0
    fused_attention: int = 0
    #: with feeds: output name -> value computed by MIL's value inference (None where it stopped)
    values: dict[str, np.ndarray | None] = field(default_factory=dict)
    #: with feeds: MIL op types that have no value inference and were reached
    no_value: dict[str, int] = field(default_factory=dict)
    #: quantized weights written as compressed constants (constexpr ops), by stored type
    compressed: dict[str, int] = field(default_factory=dict)


def mil_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name)
    if not base or base[0].isdigit():
        base = "w_" + base
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


class Lowering:
    """State while lowering one graph. Op functions receive it as ``lw``."""

    def __init__(self, model: Any, arrays: Mapping[str, np.ndarray], inputs: Sequence[Any], *, opset_mil: int,
                 sdpa: bool, feeds: Mapping[str, np.ndarray] | None = None,
                 oracle: Mapping[str, np.ndarray] | None = None, fp16: bool = False) -> None:
        load_all()
        self.model = model
        self.nodes = list(model.graph.node)
        self.inits = dict(arrays)
        self.inputs = list(inputs)
        self.output_names = [o.name for o in model.graph.output]
        self.opsets = {o.domain or "": int(o.version) for o in model.opset_import}
        self.opset = self.opsets.get("", 17)
        self.opset_mil = opset_mil
        self.sdpa = sdpa
        self.feeds = feeds
        self.oracle = oracle
        #: saturate float constants to float16's range: coremltools would cast -3.4e38 (a mask) to -inf
        self.fp16 = fp16
        self.values: dict[str, Any] = {}
        # a graph output is never an interior value: it counts two more reads
        self._producer, self._uses = producers_and_uses(self.nodes, self.output_names, output_uses=2)
        self._init_ids = {id(a): n for n, a in self.inits.items()}
        self._const_cache: dict[tuple[int, str], Any] = {}
        self._keep: list[np.ndarray] = []
        self._taken: set[str] = set()
        #: id of a weight ``DequantizeLinear`` made (float values) -> the stored values it came from
        self._quant: dict[int, Stored] = {}
        self.out = Lowered(program=None)

    # -- helpers the op functions use -------------------------------------------
    def const(self, arr: np.ndarray, source: np.ndarray | None = None) -> Any:
        """A MIL const for ``arr``; named after the initializer ``source`` (or ``arr``) when it is one."""
        src = source if source is not None else arr
        data = mil_array(arr)
        if self.fp16 and data.dtype == np.float32 and data.size and np.abs(data).max() > _FP16_MAX:
            data = np.clip(data, -_FP16_MAX, _FP16_MAX)
        key = (id(src), data.dtype.str)
        hit = self._const_cache.get(key)
        if hit is not None:
            return hit
        init = self._init_ids.get(id(src))
        stored = self._quant.get(id(src))
        v = None
        if stored is not None and data.shape == src.shape and data.dtype in (np.float16, np.float32):
            v = compressed(stored, data.dtype, self.opset_mil)
            if v is not None:
                self.out.compressed[stored.dtype] = self.out.compressed.get(stored.dtype, 0) + 1
        if v is None:
            v = mb().const(val=data, name=mil_name(init, self._taken)) if init is not None else mb().const(val=data)
        self._const_cache[key] = v
        self._keep.append(src)  # keeps id(src) unique while it is a cache key
        return v

    def constant(self, name: str) -> np.ndarray | None:
        v = self.values.get(name)
        return v if isinstance(v, np.ndarray) else None

    def sole_producer(self, name: str) -> Any:
        """The node producing ``name`` when ``name`` is used exactly once (an interior value)."""
        return self._producer.get(name) if self._uses.get(name, 0) == 1 else None

    def node_of(self, name: str) -> Any:
        """The node producing ``name`` (None for inputs and initializers)."""
        return self._producer.get(name)

    def n_uses(self, name: str) -> int:
        return self._uses.get(name, 0)

    def rank_of(self, name: str) -> int | None:
        v = self.values.get(name)
        return None if v is None else len(v.shape)

    # -- the walk ---------------------------------------------------------------
    def lower(self) -> Lowered:
        from coremltools.converters.mil.mil import Function, Program

        specs: dict[str, Any] = {}
        for info in self.inputs:
            if info.dtype not in INPUT_DTYPES:
                raise UnsupportedGraph(
                    f"graph input {info.name!r} has type {info.dtype}; Core ML models take float32, float16 and "
                    "int32/int64 tensors", unsupported={f"input of type {info.dtype}": [info.name]},
                    where="graph inputs", fix="run this graph on another backend (openvino, ggml, reference)")
            if self.feeds is None:
                dtype = {"fp32": _types().fp32, "fp16": _types().fp16, "int32": _types().int32}[INPUT_DTYPES[info.dtype]]
                specs[mil_name(info.name, self._taken)] = mb().placeholder(shape=tuple(info.shape), dtype=dtype)
        func = Function(specs, opset_version=_target_for(self.opset_mil))
        with func:
            placeholders = list(func.inputs.values())
            for i, info in enumerate(self.inputs):
                if self.feeds is None:
                    self.values[info.name] = placeholders[i]
                else:
                    self.values[info.name] = mb().const(val=mil_array(np.asarray(self.feeds[info.name])))
            for name, arr in self.inits.items():
                self.values.setdefault(name, arr)
            for node in self.nodes:
                self._lower_node(node)
            outs = []
            for name in self.output_names:
                if name not in self.values:
                    raise UnsupportedGraph(f"graph output {name!r} is not produced by any node", where="graph outputs",
                                           fix="check the model with onnx.checker.check_model")
                v = self.values[name]
                if isinstance(v, np.ndarray):
                    v = self.const(v)
                outs.append(mb().identity(x=v, name=mil_name(name, self._taken)))
            func.set_outputs(outs)
        prog = Program()
        prog.add_function("main", func)
        self.out.program = prog
        if self.feeds is not None:
            self.out.values = {n: (None if o.val is None else np.asarray(o.val)) for n, o in zip(self.output_names, outs)}
        return self.out

    def _stand_in(self, node: Any, ins: list[Any], outs: list[Any]) -> list[Any]:
        """With feeds: where a MIL op has no value inference, count it and, given an ``oracle``
        (reference values of the ONNX graph's intermediates), continue from the reference value."""
        known = all(v is None or isinstance(v, np.ndarray) or v.val is not None for v in ins)
        if not known:
            return outs
        fixed = []
        for name, v in zip(node.output, outs):
            if v is not None and not isinstance(v, np.ndarray) and v.val is None:
                for op in _ops_without_value(v):
                    self.out.no_value[op] = self.out.no_value.get(op, 0) + 1
                if self.oracle is not None and name in self.oracle:
                    ref = np.asarray(self.oracle[name])
                    if tuple(ref.shape) != tuple(int(d) for d in v.shape):
                        raise UnsupportedGraph(f"lowered {node.op_type} gives shape {tuple(v.shape)}, "
                                               f"onnx says {ref.shape}", where=f"node {node.name!r}",
                                               fix="report this as a bug of sdrt-coreml")
                    v = mb().const(val=mil_array(ref))
            fixed.append(v)
        return fixed

    def _lower_node(self, node: Any) -> None:
        ins = node_inputs(node, self.values)
        present = [v for v in ins if v is not None]
        if node.op_type == "DequantizeLinear" and all(isinstance(v, np.ndarray) for v in present):
            outs = [self._dequantize(node, ins)]
        elif all(isinstance(v, np.ndarray) for v in present):
            outs = fold_node(node, ins, self.opsets)
        elif node.op_type in FOLD_ONLY:
            raise unsupported(node, f"{node.op_type} on a runtime tensor (only constant inputs are supported)")
        else:
            fn = REGISTRY.get(node.op_type)
            if fn is None:
                raise unsupported(node, f"no lowering for {node.op_type}")
            try:
                m = attention.match(self, node) if self.sdpa else None
                if m is not None:
                    outs = [attention.lower(self, m)]
                    self.out.fused_attention += 1
                else:
                    outs = fn(self, node, ins)
            except UnsupportedGraph:
                raise
            except (ValueError, TypeError, AssertionError, NotImplementedError) as exc:
                # a lowering, or MIL's type inference, rejects what Core ML cannot express
                raise unsupported(node, str(exc).splitlines()[0][:300] if str(exc) else node.op_type) from exc
            self.out.n_ops += 1
            if self.feeds is not None:
                outs = self._stand_in(node, ins, outs)
        for name, v in zip(node.output, outs):
            if name:
                self.values[name] = v


    def _dequantize(self, node: Any, ins: list[Any]) -> np.ndarray:
        """A constant ``DequantizeLinear`` (a quantized weight): its float values, remembered with the stored ones
        so that ``const`` can write a compressed constant where a MIL op takes them as they are."""
        from sdrt.quantization import dequantize_array

        at = {a.name: a.i for a in node.attribute}
        q, scale = ins[0], ins[1]
        zero = ins[2] if len(ins) > 2 else None
        axis, block = int(at.get("axis", 1)), int(at.get("block_size", 0))
        out = dequantize_array(q, scale, axis, block, zero).astype(np.asarray(scale).dtype)
        if zero is None or not np.any(np.asarray(zero)):
            self._quant[id(out)] = Stored(np.asarray(q), np.asarray(scale), axis % max(q.ndim, 1), block)
            self._keep.append(out)
        return out


@dataclass
class Stored:
    """A weight as a ``DequantizeLinear`` stores it: symmetric values, scales, the scale axis, the block size."""

    values: np.ndarray
    scale: np.ndarray
    axis: int
    block: int

    @property
    def dtype(self) -> str:
        return self.values.dtype.name


def compressed(w: Stored, out: np.dtype, opset_mil: int) -> Any:
    """A MIL constexpr op that Core ML expands to ``w``'s float values (``out``: float16 or float32) when it loads
    the model, the stored values written to the weight file as they are; None where Core ML has no such op:

    - int8, one scale per output channel: ``constexpr_affine_dequantize`` (iOS16/macOS13), or from iOS18/macOS15
      ``constexpr_blockwise_shift_scale`` (with the scale shaped like the weight, 1 on every other axis);
    - int4 in blocks along one axis: ``constexpr_blockwise_shift_scale`` (iOS18/macOS15 only);
    - fp8: none (Core ML has no 8-bit float type).
    """
    from coremltools.converters.mil.mil import types

    q, s = w.values, w.scale
    if q.ndim < 1 or q.dtype.name not in ("int8", "int4"):
        return None
    scale = s.astype(out)
    if w.block:  # blocked: scale has q's rank, q.shape[axis] / block along the axis
        if opset_mil < 18 or scale.ndim != q.ndim or q.shape[w.axis] % w.block:
            return None
        data = q.astype(np.int8).astype(types.np_int4_dtype) if q.dtype.name == "int4" else q
        return mb().constexpr_blockwise_shift_scale(data=data, scale=scale)
    if q.dtype.name != "int8" or scale.ndim > 1 or (scale.ndim == 1 and scale.size != q.shape[w.axis]):
        return None
    if opset_mil >= 18:
        shape = [1] * q.ndim
        shape[w.axis] = scale.size
        return mb().constexpr_blockwise_shift_scale(data=q, scale=scale.reshape(shape))
    return mb().constexpr_affine_dequantize(quantized_data=q, zero_point=np.int8(0), scale=scale, axis=w.axis)


def _ops_without_value(v: Any) -> list[str]:
    """The MIL ops behind ``v`` whose inputs all had values but whose output has none."""
    seen, found, todo = set(), [], [v]
    while todo:
        cur = todo.pop()
        op = cur.op
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        inputs = [x for x in op.get_flattened_inputs()]
        missing = [x for x in inputs if x.val is None]
        if missing:
            todo.extend(missing)
        elif op.outputs[0].val is None:
            found.append(op.op_type)
    return found


def _types() -> Any:
    from coremltools.converters.mil.mil import types

    return types


def _target_for(opset_mil: int) -> Any:
    import coremltools as ct

    return {15: ct.target.iOS15, 16: ct.target.iOS16, 17: ct.target.iOS17, 18: ct.target.iOS18}[opset_mil]
