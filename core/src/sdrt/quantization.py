"""Weight-only quantization: ``quantize(graph, "int8" | "int4" | "fp8")`` and its inverse, ``dequantize``.

The result is standard ONNX: each quantized weight is an initializer of the small
type feeding one ``DequantizeLinear`` whose output replaces the float weight.
Activations stay float32; only the stored weights shrink.

- ``int8``: symmetric, one float32 scale per output channel (``axis`` of the
  output channel; opset 19, the first DequantizeLinear that onnx.reference runs). 4x smaller than float32.
- ``int4``: symmetric, one scale per block of ``block_size`` (32 to 128) values
  along the reduction axis (``block_size``, INT4; opset 21), the one of a few clip
  ratios with the least squared error. About 7x smaller.
- ``fp8``: float8 e4m3fn with one scale per output channel (opset 19).

Scales are rounded to float16-representable values, so a block-32 int4 or int8
weight converts exactly to ggml's Q4_0 / Q8_0 blocks (fp16 scale per 32 values).

Which weights are quantized: the constant weight (input 1) of ``MatMul``, ``Gemm``
and ``Conv``, and a 2-D weight that a ``Transpose`` hands to ``MatMul`` (a linear layer's [out, in] weight as
sdrt's shipped weight-free graphs take a checkpoint's). What stays float32, and why:

- embeddings (``Gather`` tables: position and token embeddings), norms, biases:
  they are not matmul weights, are small, and errors there shift every token or
  every channel at once;
- the first and last layers (``KEEP_LAYERS``: ``conv_in``, patch/position
  embedders, the timestep embedding MLP, ``conv_out``, the final ``proj_out`` /
  ``norm_out``): they touch the latent directly, so their error is not averaged
  out by later layers, and they are a negligible share of the bytes;
- weights read by anything but a matmul-like op, or (int4) whose reduction
  axis is not a multiple of the block: OpenVINO's ONNX reader and ggml's blocks
  both need whole blocks.

Graphs below the opset a scheme needs are converted with onnx's version converter
(the weights are not touched by it). ``dequantize`` folds every constant
``DequantizeLinear`` back into a float32 initializer: what a backend that cannot
run quantized weights natively does at load.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ModelError, SdrtError

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from .graph import Graph
    from .weights import Weights

log = logging.getLogger("sdrt.quantization")

#: metadata key recording the scheme on the written graph
QUANT_KEY = "sdrt.quantization"
SCHEMES = ("int8", "int4", "fp8")
ALIASES = {"int8": "int8", "i8": "int8", "q8": "int8", "int4": "int4", "i4": "int4", "q4": "int4",
           "fp8": "fp8", "float8": "fp8", "f8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8"}
#: opset each scheme needs in the default domain
MIN_OPSET = {"int8": 19, "int4": 21, "fp8": 19}
#: layer-name patterns (``re.search`` on the weight's and the consumer node's names, '/' read as '.')
KEEP_LAYERS: tuple[str, ...] = (
    r"(^|\.)conv_in(\.|$)", r"(^|\.)conv_out(\.|$)", r"(^|\.)conv_norm_out(\.|$)",
    r"time_embedding", r"time_embed(\.|$)", r"timestep_embedder", r"time_text_embed", r"add_embedding",
    r"(^|\.)x_embedder(\.|$)", r"(^|\.)pos_embed(\.|$)", r"(^|\.)patch_embed", r"(^|\.)context_embedder(\.|$)",
    r"^\.?(unet\.|transformer\.|model\.)?proj_out(\.|$)", r"^\.?(unet\.|transformer\.|model\.)?norm_out(\.|$)",
    r"(^|\.)(token|position)_embedding", r"(^|\.)embed_tokens", r"(^|\.)shared(\.|$)",
)
_OPS = {"MatMul", "Gemm", "Conv"}


@dataclass(frozen=True)
class _Target:
    name: str
    op: str
    axis: int  # output-channel axis of the weight
    red: int  # reduction axis (int4 blocks run along it)


def scheme_of(to: str, where: str = "sdrt.quantization.quantize", arg: str = "to") -> str:
    """The canonical scheme name of ``to`` (``"int8"``, ``"int4"``, ``"fp8"``), or a one-line error."""
    name = ALIASES.get(str(to).lower().strip())
    if name is None:
        opts = [f"{arg} {v}" if arg.startswith("--") else f"{arg}='{v}'" for v in SCHEMES]
        raise SdrtError(f"unknown weight quantization {to!r}", where=where,
                        fix=f"pass {opts[0]}, {opts[1]} or {opts[2]}")
    return name


def _norm(name: str) -> str:
    return name.replace("/", ".").replace("::", ".").lstrip(".")


def _targets(graph: Graph, scheme: str, block_size: int, keep: list[re.Pattern[str]]
             ) -> tuple[dict[str, _Target], dict[str, list[str]]]:
    """Weights to quantize, and the others by reason (``plan``)."""
    g = graph.model.graph
    infos = graph.initializer_info()
    readers_of: dict[str, list[tuple[Any, int]]] = {}  # every tensor's readers (a Transpose's output's too)
    for node in g.node:
        for i, x in enumerate(node.input):
            readers_of.setdefault(x, []).append((node, i))
    uses = {x: r for x, r in readers_of.items() if x in infos}
    outputs = {o.name for o in g.output}
    chosen: dict[str, _Target] = {}
    kept: dict[str, list[str]] = {}

    def skip(reason: str, name: str) -> None:
        kept.setdefault(reason, []).append(name)

    for name, info in infos.items():
        readers = uses.get(name, [])
        if not readers or name in outputs:
            continue
        if info.dtype != "float32":
            if info.dtype in ("float16", "bfloat16", "float64") and any(n.op_type in _OPS and i == 1 for n, i in readers):
                skip(f"stored as {info.dtype} (quantize reads float32 weights: a float32 export)", name)
            continue
        if len(info.shape) == 2 and all(_linear_transpose(n, readers_of) for n, _ in readers):
            # a linear weight in torch's [out, in] layout, transposed in the graph for a MatMul (sdrt's shipped
            # weight-free graphs bind checkpoints so): its output channels are axis 0, its reduction axis 1
            if any(p.search(s) for p in keep for s in [_norm(name)] + [_norm(n.name) for n, _ in readers]):
                skip("first/last layer or embedding (KEEP_LAYERS)", name)
            elif scheme == "int4" and info.shape[1] % block_size:
                skip(f"reduction axis not a multiple of the block ({block_size})", name)
            else:
                chosen[name] = _Target(name, "MatMul", 0, 1)
            continue
        weights_of = [(n, i) for n, i in readers if n.op_type in _OPS and i == 1]
        if len(weights_of) != len(readers):
            if weights_of:
                skip("read by a non-matmul op too", name)
            continue
        node = weights_of[0][0]
        names = [_norm(name)] + [_norm(n.name) for n, _ in readers]
        if any(p.search(s) for p in keep for s in names):
            skip("first/last layer or embedding (KEEP_LAYERS)", name)
            continue
        shape = info.shape
        op = node.op_type
        if op == "Conv" and len(shape) >= 3:
            axis, red = 0, 1
        elif op == "Gemm" and len(shape) == 2:
            trans = any(a.name == "transB" and a.i for a in node.attribute)
            if any(n.op_type != "Gemm" or any(a.name == "transB" and bool(a.i) != trans for a in n.attribute)
                   for n, _ in readers):
                skip("read by Gemms with different layouts", name)
                continue
            axis, red = (0, 1) if trans else (1, 0)
        elif op == "MatMul" and len(shape) == 2 and all(n.op_type == "MatMul" for n, _ in readers):
            axis, red = 1, 0
        else:
            skip("not a 2-D matmul or a conv weight", name)
            continue
        if any(n.op_type != op for n, _ in readers):
            skip("read by different ops", name)
            continue
        if scheme == "int4" and shape[red] % block_size:
            skip(f"reduction axis not a multiple of the block ({block_size})", name)
            continue
        chosen[name] = _Target(name, op, axis, red)
    return chosen, kept


def _linear_transpose(node: Any, readers_of: dict[str, list[tuple[Any, int]]]) -> bool:
    """Whether ``node`` is a 2-D ``Transpose`` whose output only MatMuls read, as their weight (input 1)."""
    if node.op_type != "Transpose":
        return False
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
    after = readers_of.get(node.output[0], [])
    return perm == [1, 0] and bool(after) and all(n.op_type == "MatMul" and i == 1 for n, i in after)


def plan(graph: Graph, to: str = "int8", *, block_size: int = 32,
         keep_layers: Iterable[str] | None = None) -> dict[str, list[str]]:
    """What ``quantize`` would do: ``{"quantized": [...], reason: [...]}`` by initializer name."""
    scheme = scheme_of(to)
    keep = [re.compile(p) for p in (KEEP_LAYERS if keep_layers is None else keep_layers)]
    chosen, kept = _targets(graph, scheme, _block(block_size), keep)
    return {"quantized": sorted(chosen), **{k: sorted(v) for k, v in kept.items()}}


#: the int4 block sizes (16 for narrow layers such as the tiny test models'; 32, the default, is ggml's Q4_0 block)
BLOCK_SIZES = (16, 32, 64, 128)


def _block(block_size: int) -> int:
    if not isinstance(block_size, int) or block_size not in BLOCK_SIZES:  # parse()'s set: 256 was let through
        raise SdrtError(f"{{@block_size}} {block_size!r} is not supported", where="block_size",
                        fix="pass {@block_size=}" + ", ".join(map(str, BLOCK_SIZES[:-1])) + f" or {BLOCK_SIZES[-1]}")
    return block_size


def _fp16_exact(scale: np.ndarray) -> np.ndarray:
    """Scales rounded to float16 values (kept as float32), so ggml's fp16-scaled blocks hold them exactly."""
    s = np.clip(scale, 2.0 ** -24, 65504.0).astype(np.float16).astype(np.float32)
    return np.where(s == 0, np.float32(2.0 ** -24), s)


#: int4 clip ratios tried per block (1.0: the block's largest value maps to 7)
_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


def quantize_array(w: np.ndarray, scheme: str, axis: int, red: int, block_size: int = 32
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(quantized values, float32 scales) of one weight, as ``DequantizeLinear`` takes them."""
    import ml_dtypes

    w = np.asarray(w, np.float32)
    if scheme in ("int8", "fp8"):
        other = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w), axis=other) if other else np.abs(w)
        top = 127.0 if scheme == "int8" else 448.0
        scale = _fp16_exact(amax / top)
        shape = [1] * w.ndim
        shape[axis] = -1
        x = w / scale.reshape(shape)
        if scheme == "int8":
            return np.clip(np.rint(x), -127, 127).astype(np.int8), scale
        return np.clip(x, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn), scale
    # int4: blocks of block_size along the reduction axis; the last block may be short
    n = w.shape[red]
    nb = -(-n // block_size)
    pad = nb * block_size - n
    wp = np.moveaxis(w, red, 0)
    if pad:
        wp = np.concatenate([wp, np.zeros((pad,) + wp.shape[1:], np.float32)], axis=0)
    blocks = wp.reshape((nb, block_size) + wp.shape[1:])
    amax = np.max(np.abs(blocks), axis=1)  # (nb, ...)
    # each block's scale: the clip ratio (of its largest value) with the least squared error
    best = err = None
    for ratio in _CLIP_RATIOS:
        s = _fp16_exact(amax * ratio / 7.0)
        e = np.sum((np.clip(np.rint(blocks / s[:, None]), -8, 7) * s[:, None] - blocks) ** 2, axis=1)
        if best is None:
            best, err = s, e
        else:
            better = e < err
            best, err = np.where(better, s, best), np.where(better, e, err)
    scale = best
    q = np.clip(np.rint(blocks / scale[:, None]), -8, 7).reshape((nb * block_size,) + wp.shape[1:])[:n]
    return np.moveaxis(q, 0, red).astype(ml_dtypes.int4), np.moveaxis(scale, 0, red).astype(np.float32)


def dequantize_array(q: np.ndarray, scale: np.ndarray, axis: int, block_size: int = 0,
                     zero_point: np.ndarray | None = None) -> np.ndarray:
    """float32 values of a ``DequantizeLinear`` (per-tensor, per-axis or blocked), as the ONNX spec defines: one new
    array, computed in place (a whole model's weights are folded so on ggml)."""
    x = np.asarray(q).astype(np.float32)
    s = np.asarray(scale, np.float32)
    z = None if zero_point is None else np.asarray(zero_point).astype(np.float32)
    axis = axis % x.ndim if x.ndim else 0
    if s.ndim == 0 or s.size == 1 and x.ndim == 0:
        s = s.reshape(())
        z = None if z is None else z.reshape(())
    elif block_size:
        s = np.repeat(s, block_size, axis=axis).take(range(x.shape[axis]), axis=axis)
        if z is not None:
            z = np.repeat(z, block_size, axis=axis).take(range(x.shape[axis]), axis=axis)
    else:
        shape = [1] * x.ndim
        shape[axis] = -1
        s = s.reshape(shape)
        z = None if z is None else z.reshape(shape)
    if z is not None:
        x -= z
    x *= s
    return x


def quantize(graph: Graph, to: str = "int8", *, block_size: int = 32,
             keep_layers: Iterable[str] | None = None) -> Graph:
    """A copy of ``graph`` whose matmul and conv weights are stored as ``to`` (``"int8"``, ``"int4"``,
    ``"fp8"``), each feeding a ``DequantizeLinear``. ``keep_layers`` replaces ``KEEP_LAYERS``."""
    from onnx import helper, numpy_helper

    from .graph import Graph as _Graph
    from .graph.protos import copy_model

    scheme = scheme_of(to)
    block_size = _block(block_size)
    if any(p.key == QUANT_KEY for p in graph.model.metadata_props):
        raise ModelError("this graph is already quantized", where=graph.name,
                         fix="quantize the float32 model, or use it as it is")
    keep = [re.compile(p) for p in (KEEP_LAYERS if keep_layers is None else keep_layers)]
    chosen, _ = _targets(graph, scheme, block_size, keep)
    model = _at_opset(graph, MIN_OPSET[scheme])
    arrays = graph.initializer_arrays()
    m = copy_model(model, initializers=False)
    m.ir_version = max(m.ir_version, {"int8": 7, "fp8": 9, "int4": 10}[scheme])
    nodes = []
    before = after = 0
    for t in model.graph.initializer:
        arr = np.asarray(arrays[t.name])
        tgt = chosen.get(t.name)
        if tgt is None:
            m.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(arr), t.name))
            continue
        q, scale = quantize_array(arr, scheme, tgt.axis, tgt.red, block_size)
        qn, sn = f"{t.name}_quantized", f"{t.name}_scale"
        m.graph.initializer.extend([numpy_helper.from_array(q, qn), numpy_helper.from_array(scale, sn)])
        kw: dict[str, int] = {"axis": tgt.red if scheme == "int4" else tgt.axis}
        if scheme == "int4":
            kw["block_size"] = block_size
        nodes.append(helper.make_node("DequantizeLinear", [qn, sn], [t.name], name=f"{t.name}_dequantize", **kw))
        before += arr.nbytes
        after += (q.size + 1) // 2 if scheme == "int4" else q.size
        after += scale.nbytes
    del m.graph.node[:]
    m.graph.node.extend(nodes + list(model.graph.node))
    # the quantized names stop being graph inputs with defaults
    keep_inputs = [v for v in model.graph.input if v.name not in chosen]
    del m.graph.input[:]
    m.graph.input.extend(keep_inputs)
    m.metadata_props.append(_prop(QUANT_KEY, scheme + (f" block_size={block_size}" if scheme == "int4" else "")))
    log.info("%s: %d weights quantized to %s (%.1f MB -> %.1f MB)", graph.name, len(chosen), scheme,
             before / 1e6, after / 1e6)
    return _Graph(m, graph.path, base_dir=graph.base_dir, label=graph.label)


def _prop(key: str, value: str) -> Any:
    from onnx import StringStringEntryProto

    return StringStringEntryProto(key=key, value=value)


def _at_opset(graph: Graph, need: int) -> onnx.ModelProto:
    """``graph.model`` at default-domain opset >= ``need`` (converted without its initializers' data)."""
    if graph.opset >= need:
        return graph.model
    from onnx import version_converter

    from .graph.protos import skeleton

    try:
        conv = version_converter.convert_version(skeleton(graph.model), need)
    except Exception as exc:  # noqa: BLE001 - the converter raises several unrelated types
        raise ModelError(f"cannot convert the graph from opset {graph.opset} to {need}: {str(exc)[:200]}",
                         where=graph.name, fix="re-export the model at opset 21, or use to='int8'") from exc
    # the skeleton's initializers carry no data: put the original ones back
    declared = {v.name for v in graph.model.graph.input}
    inputs = [v for v in conv.graph.input if v.name in declared]
    del conv.graph.input[:]
    conv.graph.input.extend(inputs)
    del conv.graph.initializer[:]
    conv.graph.initializer.extend(graph.model.graph.initializer)
    return conv


#: ops that hold or compute quantized weights as other tools write them (onnxruntime's QOperator and dynamic
#: quantization, its 4-bit MatMulNBits)
_QUANTIZED_OPS = {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "MatMulNBits", "DynamicQuantizeLinear",
                  "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}


def quantized_elsewhere(graph: Graph) -> str | None:
    """How ``graph`` is already quantized by another tool, in words (``"2 weights stored for DequantizeLinear"``,
    ``"QLinearConv nodes"``), or None for a float graph."""
    ops = sorted({n.op_type for n in graph.model.graph.node if n.op_type in _QUANTIZED_OPS})
    stored = quantized_weights(graph)
    what = [f"{len(stored)} weight(s) stored quantized behind DequantizeLinear"] if stored else []
    return "; ".join(what + ([f"{', '.join(ops)} nodes"] if ops else [])) or None


def scheme_of_graph(graph: Graph) -> str | None:
    """The quantization recorded on ``graph`` (``"int4 block_size=32"``...), or None."""
    for p in graph.model.metadata_props:
        if p.key == QUANT_KEY:
            return p.value
    return None


def quantized_weights(graph: Graph) -> dict[str, dict[str, Any]]:
    """``{float weight name: {"values", "scale", "zero_point", "axis", "block_size", "dtype", "node"}}`` for every
    ``DequantizeLinear`` of the graph whose inputs are all initializers."""
    infos = graph.initializer_info()
    out: dict[str, dict[str, Any]] = {}
    for node in graph.model.graph.node:
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        ins = [x for x in node.input if x]
        if not ins or any(x not in infos for x in ins):
            continue
        at = {a.name: a.i for a in node.attribute}
        out[node.output[0]] = {"values": ins[0], "scale": ins[1], "zero_point": ins[2] if len(ins) > 2 else None,
                               "axis": int(at.get("axis", 1)), "block_size": int(at.get("block_size", 0)),
                               "dtype": infos[ins[0]].dtype, "node": node.name, "ops": frozenset()}
    if out:
        readers: dict[str, set[str]] = {}
        for node in graph.model.graph.node:
            for x in node.input:
                if x in out:
                    readers.setdefault(x, set()).add(node.op_type)
        outputs = {o.name for o in graph.model.graph.output}
        for name, q in out.items():  # a graph output reads it too: no op may take it as it is
            q["ops"] = frozenset(readers.get(name, ())) | ({"(graph output)"} if name in outputs else set())
    return out


class Requantizer:
    """Float weights bound onto a session of a graph sdrt quantized (``sdrt.load(quantize=...)``): a pipeline binds
    a part's weights by their float names (a LoRA merged into a UNet block, a checkpoint). Each weight the graph holds
    quantized is quantized again as the graph holds it (scheme, axis, block size) and bound as its values and scale;
    a weight whose float tensor is the one the graph was quantized from (the same bytes of the same file) keeps the
    graph's own values, so an update that changes a few weights quantizes only those."""

    def __init__(self, graph: Graph, source: Weights) -> None:
        from .weights import Weights

        own = Weights.from_graph(graph)
        #: float name -> (info, the graph's values ref, its scale ref) for each weight it holds quantized
        self.held = {n: (i, own.ref(i["values"]), own.ref(i["scale"])) for n, i in quantized_weights(graph).items()
                     if i["zero_point"] is None and i["values"] in own and i["scale"] in own}
        #: float name -> where the float tensor the graph was quantized from lies (``TensorRef.origin``)
        self.origins = {n: source.ref(n).origin for n in self.held if n in source}

    def __call__(self, weights: Any) -> Any:
        from .weights import TensorRef, Weights

        names = [n for n in weights if n in self.held]
        if not names:
            return weights
        refs = {n: weights.ref(n) for n in weights if n not in self.held}
        fresh = 0
        for n in names:
            info, values, scale = self.held[n]
            ref = weights.ref(n)
            if tuple(ref.shape) != tuple(values.shape):
                from .errors import WeightsError

                raise WeightsError(f"weight {n!r} has shape {list(ref.shape)}, and the quantized graph holds it as "
                                   f"{list(values.shape)}", where=ref.source,
                                   fix="bind weights made for this model (a checkpoint or LoRA of its family)")
            origin = ref.origin
            if origin is not None and origin == self.origins.get(n) and weights.dtype is None:
                refs[info["values"]], refs[info["scale"]] = values, scale
                continue
            fresh += 1
            pair = functools.cache(lambda n=n, info=info: _requantize(weights[n], info))  # made once, for both
            refs[info["values"]] = TensorRef(info["values"], values.dtype, values.shape, "<requantized>",
                                             lambda pair=pair: pair()[0])
            refs[info["scale"]] = TensorRef(info["scale"], scale.dtype, scale.shape, "<requantized>",
                                            lambda pair=pair: pair()[1])
        log.info("binding %d float weights onto a quantized graph: %d quantized again", len(names), fresh)
        return Weights(refs, sources=getattr(weights, "sources", ()))


def _requantize(w: np.ndarray, info: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``w`` quantized as the ``DequantizeLinear`` ``info`` (``quantized_weights``) reads its values."""
    kind = {"int8": "int8", "int4": "int4", "float8_e4m3fn": "fp8"}.get(str(info["dtype"]))
    if kind is None:
        raise ModelError(f"a {info['dtype']} weight cannot be quantized again", where=str(info["node"]),
                         fix="bind weights onto the float model, or quantize with sdrt (int8, int4, fp8)")
    w = np.asarray(w, np.float32)
    axis = int(info["axis"]) % max(w.ndim, 1)  # int8/fp8: the channels' axis; int4: the blocks' (the other unused)
    return quantize_array(w, kind, axis=axis, red=axis, block_size=int(info["block_size"]) or 32)


def dequantize(graph: Graph, keep: Callable[[str, dict[str, Any]], bool] | Iterable[str] | None = None) -> Graph:
    """A copy of ``graph`` with each constant ``DequantizeLinear`` folded into a float32 initializer
    (what a backend without native quantized weights runs). ``keep`` leaves some quantized: the float
    weight names to keep, or ``keep(name, info)`` -> True for each one to keep (``info`` as
    ``quantized_weights`` gives it). A graph with nothing to fold is returned as is."""
    from onnx import numpy_helper

    from .graph import Graph as _Graph
    from .graph.protos import copy_model

    found = quantized_weights(graph)
    if keep is not None:
        test = keep if callable(keep) else (lambda name, _q, names=frozenset(keep): name in names)
        found = {k: q for k, q in found.items() if not test(k, q)}
    if not found:
        return graph
    counts: dict[str, int] = {}
    for node in graph.model.graph.node:
        for x in node.input:
            counts[x] = counts.get(x, 0) + 1
    feeds: dict[str, int] = {}
    for q in found.values():
        for x in (q["values"], q["scale"], q["zero_point"]):
            if x:
                feeds[x] = feeds.get(x, 0) + 1
    arrays = graph.initializer_arrays()
    m = copy_model(graph.model, initializers=False)
    outputs = {o.name for o in graph.model.graph.output}
    # an initializer only the folded nodes read goes; one that anything else reads (a kept node) stays
    drop = {x for x, n in feeds.items() if counts.get(x, 0) <= n and x not in outputs}
    for t in graph.model.graph.initializer:
        if t.name not in drop:
            m.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(np.asarray(arrays[t.name])),
                                                               t.name))
    for name, q in found.items():
        w = dequantize_array(arrays[q["values"]], arrays[q["scale"]], q["axis"], q["block_size"],
                             arrays[q["zero_point"]] if q["zero_point"] else None)
        m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), name))
    folded = set(found)
    nodes = [n for n in graph.model.graph.node if not (n.op_type == "DequantizeLinear" and n.output[0] in folded)]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    if keep is not None and len(found) < len(quantized_weights(graph)):
        log.info("%s: %d quantized weights dequantized to float32 at load, the others kept", graph.name, len(found))
    else:
        log.info("%s: %d quantized weights dequantized to float32 at load", graph.name, len(found))
    return _Graph(m, graph.path, base_dir=graph.base_dir, label=graph.label)


def save(graph: Graph, path: Any) -> Any:
    """Write a (quantized) graph: one ``.onnx`` below 2 GB, else ``.onnx`` plus ``<name>_data`` beside it."""
    from pathlib import Path

    import onnx

    path = Path(path)
    total = sum(len(t.raw_data) for t in graph.model.graph.initializer)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if total < (1 << 31) - (64 << 20):
            return graph.save(path)
        from .cache.paths import replace_mode

        mode = replace_mode(path)  # refuses a read-only file
        replace_mode(path.with_name(f"{path.name}_data"))
        tmp = path.with_name(f".{path.name}.tmp")
        onnx.save_model(graph.model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{path.name}_data", size_threshold=1024)
        tmp.chmod(mode)
        tmp.replace(path)
        return path
    except OSError as exc:
        raise ModelError(f"cannot write the quantized graph ({exc.strerror or exc})", where=str(path),
                         fix="check free disk space and permissions") from exc


__all__ = ["KEEP_LAYERS", "SCHEMES", "dequantize", "dequantize_array", "describe", "for_backend", "native_spec",
           "plan", "quantize", "quantize_array", "quantized_weights", "runs_natively", "save", "scheme_of",
           "scheme_of_graph"]


# -- at load -------------------------------------------------------------------

#: the ``Backend`` class attribute naming the stored weight types it runs natively: element type names
#: (``"int8"``, ``"int4"``, ``"float8_e4m3fn"``), as a set (any weight of that type) or a mapping from the type to
#: the op types that may read such a weight (``{"int4": {"MatMul", "Gemm"}}``: int4 conv weights are dequantized);
#: a backend without it gets float32 weights (``dequantize``)
NATIVE_ATTR = "quantized_weights"
_TYPE_OF = {"int8": "int8", "int4": "int4", "fp8": "float8_e4m3fn"}
#: an optional ``Backend`` class attribute: what else decides it (a target, a deployment OS), for ``sdrt info``
NOTE_ATTR = "quantized_weights_note"


def native_spec(backend: Any) -> dict[str, frozenset[str] | None]:
    """``{weight type: op types that may read it natively, or None for any}`` of ``backend``."""
    decl = getattr(backend, NATIVE_ATTR, None) or ()
    if isinstance(decl, Mapping):
        return {str(t): (None if ops is None else frozenset(ops)) for t, ops in decl.items()}
    return {str(t): None for t in decl}


def native_types(backend: Any) -> frozenset[str]:
    """The quantized weight types ``backend`` runs as they are stored (for some ops at least)."""
    return frozenset(native_spec(backend))


def runs_natively(backend: Any, info: Mapping[str, Any]) -> bool:
    """Whether ``backend`` runs one quantized weight (``quantized_weights(graph)[name]``) as it is stored."""
    spec = native_spec(backend)
    if info["dtype"] not in spec:
        return False
    ops = spec[info["dtype"]]
    return ops is None or bool(info.get("ops")) and set(info["ops"]) <= ops


def describe(backend: Any) -> str:
    """One line for ``sdrt info``: which quantized weights run natively and which are dequantized at load."""
    spec = native_spec(backend)
    parts = []
    for scheme in SCHEMES:
        t = _TYPE_OF[scheme]
        if t not in spec:
            parts.append(f"{scheme} dequantized to float32 at load")
        elif spec[t] is None or spec[t] >= _OPS:  # every op ``quantize`` writes quantized weights for
            parts.append(f"{scheme} native")
        else:
            parts.append(f"{scheme} native on {'/'.join(sorted(spec[t]))} weights (others dequantized at load)")
    note = getattr(backend, NOTE_ATTR, None)
    return "; ".join(parts) + (f" ({note})" if note else "")


def for_backend(graph: Graph, backend: Any) -> Graph:
    """``graph`` as ``backend`` takes it: each quantized weight that it cannot run as stored (its type, or the op
    reading it) is dequantized to float32; the others stay quantized."""
    found = quantized_weights(graph)
    if not found:
        return graph
    keep = {name for name, q in found.items() if runs_natively(backend, q)}
    if len(keep) == len(found):
        return graph
    rest = sorted({f"{q['dtype']} on {'/'.join(sorted(q['ops']))}" for n, q in found.items() if n not in keep})
    log.info("%s: backend %s runs no %s weights natively; dequantizing %d of %d at load", graph.name,
             getattr(backend, "name", backend), ", ".join(rest), len(found) - len(keep), len(found))
    return dequantize(graph, keep=keep)


def parse(spec: str, where: str = "sdrt.load(quantize=...)") -> tuple[str, int]:
    """``"int8"``, ``"int4"``, ``"int4-64"`` (block size), ``"fp8"`` -> (scheme, block_size)."""
    text = str(spec).lower().strip()
    block = 32
    if "-" in text and text.rsplit("-", 1)[1].isdigit():
        text, b = text.rsplit("-", 1)
        block = int(b)
    scheme = scheme_of(text, where, "quantize")
    if block not in BLOCK_SIZES:
        raise SdrtError(f"block size {block} in {spec!r} is not supported", where=where,
                        fix="use " + ", ".join(f"int4-{b}" for b in BLOCK_SIZES[:-1]) + f" or int4-{BLOCK_SIZES[-1]}")
    return scheme, block


def _graph_key(graph: Graph) -> str:
    from .cache import make_key

    parts: list[bytes | str] = []
    if graph.external_refs:
        for name, ref in sorted(graph.external_refs.items()):
            parts.append(f"{name}:{ref!r}")
            if ref is not None:
                st = ref.path.stat()
                parts.append(f"{st.st_size}:{st.st_mtime_ns}")
        from .graph.protos import copy_model

        m = copy_model(graph.model, initializers=False)
        m.graph.initializer.extend(t for t in graph.model.graph.initializer if t.name not in graph.external_refs)
        parts.append(m.SerializeToString())
    else:
        parts.append(graph.model.SerializeToString())
    return make_key(parts)


def cached(graph: Graph, spec: str, weights: Weights | None = None) -> Graph:
    """``quantize(graph, spec)``, written once under the cache (``cache_dir("quantized")``) and read back
    from there on later loads of the same graph with the same setting. ``weights`` (a checkpoint bound onto the
    graph: a single file on sdrt's shipped graphs) are bound into the graph first, and only on a miss: the entry
    is keyed by the graph without its initializers and the weights' identity (their files, offsets and stamps,
    ``sdrt.cache.identity``), so that a hit reads no tensor and a full-size model is never serialized whole (a
    protobuf stops at 2 GB: the 3.4 GB UNet of a full-size SD 1.5 checkpoint failed there)."""
    from . import __version__
    from .cache import cache_dir, make_key
    from .graph import Graph as _Graph

    scheme, block = parse(spec)
    if weights is None:
        ident = _graph_key(graph)
    else:
        from .cache.identity import graph_identity, weights_identity

        ident = f"bound|{graph_identity(graph)}|{weights_identity(graph, weights)}"
    key = make_key(["quantized", __version__, ident, scheme, str(block), repr(KEEP_LAYERS)])
    folder = cache_dir("quantized") / key[:32]
    path = folder / "model.onnx"
    if path.is_file():
        try:
            log.info("%s: quantized weights (%s) from the cache %s", graph.name, spec, folder)
            return _Graph.load(path)
        except SdrtError as exc:  # a damaged entry is rebuilt, never trusted
            log.warning("%s: the cached quantized graph is unreadable (%s); quantizing again", folder, exc)
    if weights is not None:
        from .graph.protos import with_arrays
        from .weights import resolve_weights

        graph = _Graph(with_arrays(graph.model, resolve_weights(graph, weights)), graph.path, base_dir=graph.base_dir,
                       label=graph.label)
    q = quantize(graph, scheme, block_size=block)
    try:
        save(q, path)
    except SdrtError as exc:  # a read-only cache costs time, not the load
        log.warning("cannot cache the quantized graph (%s)", exc)
        return q
    try:  # the graph every later load reads: the same compile-cache key from this first load on
        return _Graph.load(path)
    except SdrtError as exc:
        log.warning("%s: the quantized graph just written is unreadable (%s)", folder, exc)
        return q
