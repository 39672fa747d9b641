"""ONNX graph (+ resolved weights) -> ``openvino.Model``, and the list of ops OpenVINO cannot convert.

The arrays come from ``sdrt.resolve_weights`` (every initializer, final
values). They are bound without serializing them into the ONNX model: each
floating-point initializer becomes a graph input before OpenVINO's ONNX
frontend reads the (small) graph, and that ``Parameter`` is then replaced by an
``ov.op.Constant`` over the array. Every float initializer therefore ends up as
one named ``Constant`` in the ``ov.Model``; ``constants()`` finds them by name,
which is what ``Session._update_weights`` swaps later without reading the ONNX
model again. Non-float initializers (shapes, axes, indices) stay initializers.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sdrt.errors import ModelError, UnsupportedGraph, WeightsError
from sdrt.weights.pages import private_map

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import openvino as ov

    from sdrt.graph import Graph

log = logging.getLogger("sdrt.openvino.convert")

_RAW_CONST = {"bfloat16": ("bf16", np.uint16), "float8_e4m3fn": ("f8e4m3", np.uint8),
              "float8_e5m2": ("f8e5m2", np.uint8)}
#: ml_dtypes' 4-bit integers, which OpenVINO holds packed (``i4``, ``u4``)
_PACKED_CONST = {"int4": "i4", "uint4": "u4"}
_FLOAT_KINDS = {"float16", "float32", "float64", "bfloat16"}


def graph_bytes(model: onnx.ModelProto, where: str) -> bytes:
    try:
        return model.SerializeToString()
    except ValueError as exc:  # protobuf's 2 GiB limit
        raise ModelError(f"the ONNX model is too large to serialize in memory ({exc})", where=where,
                         fix="save the graph without its weights (sdrt strips them) and pass the weights separately") \
            from exc


def promote(graph: Graph, arrays: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of the graph's model whose float initializers named in ``arrays`` are graph inputs instead.

    Returns the new model and the arrays to bind as constants afterwards. Non-float
    initializers (shapes, axes, indices) stay initializers, with the new values.
    """
    from onnx import helper, numpy_helper

    by_name = {t.name: t for t in graph.model.graph.initializer}
    unknown = sorted(set(arrays) - set(by_name))
    if unknown:
        raise WeightsError(f"weights name tensors the graph has no initializer for: {', '.join(unknown[:10])}",
                           where="Weights.bind", fix="check the key mapping of the weights against the graph")
    out = graph.model_without(arrays)
    promoted: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        init = by_name[name]
        want = helper.tensor_dtype_to_np_dtype(init.data_type)
        arr = np.asarray(value)
        if tuple(arr.shape) != tuple(init.dims):
            raise WeightsError(f"weight {name!r} has shape {tuple(arr.shape)}, the graph expects {tuple(init.dims)}",
                               where=f"initializer {name!r}", fix="use weights exported from the same model")
        if arr.dtype != want:
            arr = arr.astype(want)
        if want.name in _FLOAT_KINDS:
            out.graph.input.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
            promoted[name] = arr
        else:
            out.graph.initializer.append(numpy_helper.from_array(arr, name))
    return out, promoted


@dataclass
class Converted:
    """An ``ov.Model`` and the weights bound into it."""

    model: ov.Model
    #: float initializer name -> the ``Constant`` node that holds it (what ``update_weights`` swaps)
    consts: dict[str, Any] = field(default_factory=dict)
    #: non-float initializers (shapes, axes, indices) baked in with these values
    fixed: dict[str, np.ndarray] = field(default_factory=dict)
    #: the copy-on-write maps of weight files the constants share (``private_map``): their pages leave the
    #: resident set once the model is compiled (``sdrt.weights.pages.release``)
    maps: list[np.ndarray] = field(default_factory=list)


def read(core: ov.Core, graph: Graph, arrays: Mapping[str, np.ndarray]) -> Converted:
    """Convert ``graph`` with ``arrays`` bound as constants; raise ``UnsupportedGraph`` for unknown ops."""
    from .masks import guard_additive_masks

    model = graph.model
    promoted: dict[str, np.ndarray] = {}
    if arrays:
        model, promoted = promote(graph, arrays)
    model = guard_additive_masks(model, promoted, copy=not arrays)  # promote's model is a copy already
    source = graph_bytes(model, graph.name)
    try:
        ov_model = core.read_model(source)
    except RuntimeError as exc:
        raise _conversion_error(graph, model, source, exc) from exc
    maps: list[np.ndarray] = []
    consts = bind_parameters(ov_model, promoted, maps) if promoted else {}
    fixed = {n: np.asarray(a) for n, a in arrays.items() if n not in promoted}
    return Converted(ov_model, consts, fixed, maps)


def bind_parameters(ov_model: ov.Model, arrays: Mapping[str, np.ndarray],
                    maps: list[np.ndarray] | None = None) -> dict[str, Any]:
    """Replace the ``Parameter`` named after each weight with a ``Constant`` holding it; return those
    (the copy-on-write maps of files they share go to ``maps``)."""
    params: dict[str, Any] = {}
    for p in ov_model.get_parameters():
        params.update({n: p for n in p.output(0).get_names()})
        params[p.get_friendly_name()] = p
    consts = {}
    for name, arr in arrays.items():
        param = params.get(name)
        if param is None:  # OpenVINO dropped it: no op reads this weight
            continue
        const = make_constant(arr, name, maps)
        param.output(0).replace(const.output(0))
        ov_model.remove_parameter(param)
        consts[name] = const
    ov_model.validate_nodes_and_infer_types()
    return consts


def make_constant(arr: np.ndarray, name: str, maps: list[np.ndarray] | None = None) -> Any:
    """An ``ov.op.Constant`` over ``arr``: shared memory when numpy allows it (a read-only map of a file is
    mapped again copy-on-write, ``private_map``, and that map appended to ``maps``), else one copy."""
    import openvino as ov

    arr = np.ascontiguousarray(arr)
    cow = private_map(arr)
    if cow is not None:
        arr = cow
        if maps is not None:
            maps.append(cow)
    raw = _RAW_CONST.get(arr.dtype.name)
    packed = _PACKED_CONST.get(arr.dtype.name)
    if packed is not None:  # int4/uint4 (a quantized weight bound again): two values a byte, low nibble first; a copy
        nib = (arr.view(np.uint8) & 0x0F).reshape(-1)
        if nib.size % 2:
            nib = np.concatenate([nib, np.zeros(1, np.uint8)])
        tensor = ov.Tensor(nib[0::2] | (nib[1::2] << 4), list(arr.shape), getattr(ov.Type, packed))
        const = ov.op.Constant(tensor, shared_memory=False)
    elif raw is not None:  # ml_dtypes types that numpy-to-OpenVINO conversion does not know: pass the bits
        const = ov.op.Constant(ov.Tensor(arr.view(raw[1]), list(arr.shape), getattr(ov.Type, raw[0])))
    else:
        const = ov.op.Constant(arr, shared_memory=bool(arr.flags.writeable))
    const.set_friendly_name(name)
    const.output(0).set_names({name})
    return const


def constants(ov_model: ov.Model) -> dict[str, Any]:
    """Every ``Constant`` of ``ov_model`` by the ONNX tensor names on its output."""
    found: dict[str, Any] = {}
    for op in ov_model.get_ops():
        if op.get_type_name() == "Constant":
            for name in op.output(0).get_names():
                found[name] = op
    return found


def _conversion_error(graph: Graph, model: onnx.ModelProto, source: Any, exc: RuntimeError) -> Exception:
    text = str(exc)
    if "OpConversionFailure" in text or "wasn't fully converted" in text:
        unsupported = unsupported_ops(model, source, text)
        if unsupported:
            detail = _failure_detail(text)
            return UnsupportedGraph(
                "OpenVINO cannot convert every op of this graph" + (f" ({detail})" if detail else ""),
                unsupported=unsupported, where=graph.name,
                fix="use another backend for this graph (sdrt info lists them), or re-export the model "
                    "with ops that OpenVINO supports")
    dtype = re.search(r"Unsupported data type (\w+)", text)
    if dtype:
        return UnsupportedGraph(f"OpenVINO has no tensor type {dtype.group(1)}",
                                unsupported={f"{dtype.group(1)} tensors": _values_of_type(model, dtype.group(1))},
                                where=graph.name, fix="use another backend, or convert these tensors to a type "
                                "OpenVINO has (FLOAT8E4M3FN, FLOAT8E5M2, INT4, UINT4, ...)")
    return ModelError(f"OpenVINO could not read the ONNX graph: {first_line(text)}", where=graph.name,
                      fix="check the model with onnx.checker.check_model; if it is valid, report it to OpenVINO")


_SUMMARY = re.compile(r"-- (?:No conversion rule found for operations|Conversion is failed for): (.*)")
_VERSION = re.compile(r"-\d+$")


def unsupported_ops(model: onnx.ModelProto, source: Any, message: str = "") -> dict[str, list[str]]:
    """``{op_type: [node names]}`` for every op OpenVINO's ONNX frontend cannot convert.

    The frontend's partial conversion leaves such nodes as ``NotSupportedONNXNode``
    with their ONNX type; ops whose conversion failed (or that OpenVINO has no
    type for, such as sequences) are read from the summary of its error
    ``message``. Node names come from the ONNX graph (subgraphs and functions included).
    """
    from openvino.frontend import FrontEndManager

    bad: set[tuple[str, str]] = set()
    try:
        fe = FrontEndManager().load_by_framework("onnx")
        partial = fe.convert_partially(fe.load(io.BytesIO(source) if isinstance(source, bytes) else source))
        for op in partial.get_ordered_ops():
            if op.get_type_name() == "NotSupportedONNXNode":
                attrs = op.get_attributes()
                bad.add((str(attrs.get("ONNX_META_domain", "")), str(attrs.get("ONNX_META_type", "?"))))
    except RuntimeError as exc:  # the partial conversion itself can fail; the summary still names the ops
        log.debug("partial conversion failed: %s", first_line(str(exc)))
    for match in _SUMMARY.finditer(message):
        for item in match.group(1).split(","):
            item = _VERSION.sub("", item.strip())
            if not item:
                continue
            if item.startswith("util::"):  # OpenVINO's own markers: sequence or optional values
                bad.add(("", item))
            else:
                domain, _, op_type = item.rpartition(".")
                bad.add((domain, op_type))
    found: dict[str, list[str]] = {}
    nodes = _walk_nodes(model.graph) + [n for f in model.functions for n in _walk_function(f)]
    for domain, op_type in sorted(bad):
        key = f"{domain}.{op_type}" if domain not in ("", "ai.onnx") else op_type
        names = [name for d, t, name in nodes if t == op_type and (d in ("", "ai.onnx") or d == domain)]
        if op_type.startswith("util::"):
            key = "sequence/optional values (" + op_type + ")"
            names = [name for _, t, name in nodes if "Sequence" in t or "Optional" in t]
        found[key] = names or ["<unnamed>"]
    return found


def _walk_nodes(graph: onnx.GraphProto) -> list[tuple[str, str, str]]:
    nodes = []
    for i, node in enumerate(graph.node):
        nodes.append((node.domain, node.op_type, node.name or f"{node.op_type}_{i}"))
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                nodes.extend(_walk_nodes(sub))
    return nodes


def _values_of_type(model: onnx.ModelProto, type_name: str) -> list[str]:
    """Names of graph inputs, outputs, initializers and Cast targets of ONNX type ``type_name``."""
    from onnx import TensorProto

    code = TensorProto.DataType.Value(type_name) if type_name in TensorProto.DataType.keys() else None
    g = model.graph
    names = [v.name for v in list(g.input) + list(g.output) if v.type.tensor_type.elem_type == code]
    names += [t.name for t in g.initializer if t.data_type == code]
    names += [n.name or n.output[0] for n in g.node
              if n.op_type in ("Cast", "CastLike", "QuantizeLinear") and any(a.i == code for a in n.attribute)]
    return names or ["<unnamed>"]


def _walk_function(func: Any) -> list[tuple[str, str, str]]:
    return [(n.domain, n.op_type, n.name or f"{func.name}/{n.op_type}_{i}") for i, n in enumerate(func.node)]


def _failure_detail(text: str) -> str:
    """The first reason OpenVINO gives in its detailed log, if any."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        if ln.startswith("-- ") and "with a message" in ln:
            reason = next((x for x in lines[i + 1:] if x and not x.startswith(("While validating", "Check ",
                                                                              "FrontEnd API"))), "")
            return f"{ln[3:].split(' with a message')[0]}: {reason}"[:300]
    return ""


def first_line(text: str) -> str:  # noqa: D103
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Exception from")]
    return " ".join(lines[:3])[:500] if lines else text[:500]


#: inference precisions whose compiles get 16-bit weights (``half_weights``)
HALF_PRECISIONS = frozenset({"bf16", "f16"})


def half_weights(model: ov.Model) -> ov.Model:
    """A copy of ``model`` whose float32 weight constants are float16, each behind a ``Convert`` marked as
    decompression (what ``ovc``'s default ``compress_to_fp16`` does); ``model`` itself is left as it is
    (``update_weights`` swaps its constants).

    For a bf16 or fp16 compile only: the CPU plugin computes in 16 bits either way and keeps the marked float16
    constants as they are, so its blob (``CACHE_DIR`` / ``export_model``) holds 16-bit weights, half the
    float32 ones, and imports faster (0.4-0.8x the time on the full-size UNet). Constants outside float16's range stay float32
    (OpenVINO's own rule). The copy shares nothing it changes: the originals stay on their file maps.
    """
    from openvino._offline_transformations import compress_model_transformation

    half = model.clone()
    compress_model_transformation(half)
    return half
