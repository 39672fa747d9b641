"""Constant folding and dead-node removal for ``Graph.fold_constants``.

What counts as constant:

- outputs of ``Constant`` nodes;
- ``Shape`` and ``Size`` of a value whose shape is static (after ``with_shapes``);
- initializers that are integer/bool shape-like tensors (at most ``SMALL_BYTES``)
  or scalars, and, with ``fold_weights=True``, every initializer;
- outputs of any deterministic default-domain node whose inputs are all constant.

Weights are not folded by default so that ``Weights.bind`` still finds every
weight under its own name afterwards. Initializers that folding consumed and
the new ones it created are recorded in the model's metadata
(``FOLDED_KEY``) so that binding can tell them apart from real mistakes.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ModelError
from . import onnxfile
from .arith import numpy_fold
from .protos import SMALL_BYTES, apply_inferred, copy_model, infer

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from .graph import Graph

log = logging.getLogger("sdrt.graph.fold")

FOLDED_KEY = "sdrt.folded"
NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                    "Bernoulli", "Dropout"}
#: ops whose output can be far larger than their inputs: folded only when inference knows the output size
EXPANDING = {"ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot", "EyeLike",
             "Einsum", "MatMul", "Gemm", "Conv", "ConvTranspose", "Col2Im", "CenterCropPad"}


def folded_record(model: onnx.ModelProto) -> dict[str, list[str]]:
    """``{"removed": [...], "added": [...]}``: initializer names that folding consumed and created."""
    for p in model.metadata_props:
        if p.key == FOLDED_KEY:
            try:
                rec = json.loads(p.value)
                return {"removed": list(rec.get("removed", [])), "added": list(rec.get("added", []))}
            except (ValueError, AttributeError, TypeError):
                break
    return {"removed": [], "added": []}


def fold_constants(graph: Graph, *, max_bytes: int = 1 << 20, fold_weights: bool = False,
                   inferred: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """``inferred``: ``protos.infer`` of ``graph.model`` as it is, where the caller has it (``with_shapes``), so the
    first pass does not infer it again."""
    model = copy_model(graph.model)
    before = {t.name for t in model.graph.initializer}
    view = graph.derive(model)
    last = None
    for _ in range(16):
        folded, last = _fold_pass(model, view, max_bytes, fold_weights, inferred)
        inferred = None
        pruned = _prune(model)
        if not folded and not pruned:
            break
        last = None  # the model changed since that inference
    try:
        apply_inferred(model, last if last is not None else infer(model, graph.name))
    except ModelError as exc:  # keep what inference gave before; folding itself succeeded
        log.debug("shape inference after folding failed: %s", exc)
        _drop_stale_value_info(model)
    _record(model, graph.model, before, created=True)
    log.info("%s: folded to %d nodes (was %d)", graph.name, len(model.graph.node), len(graph.model.graph.node))
    return model


def keep_outputs(graph: Graph, names: tuple[str, ...] | list[str]) -> onnx.ModelProto:
    """A copy of the graph's model with only the outputs ``names`` (in the graph's order), less the nodes and
    initializers only the others read; the initializers dropped are recorded as folding records its own
    (``FOLDED_KEY``), so that weights for the whole graph still bind. Nothing is evaluated: the value types a
    pinned graph carries stay as they are (``Graph.with_shapes``, then this: no inference again)."""
    model = copy_model(graph.model)
    wanted = set(names)
    kept = [o for o in model.graph.output if o.name in wanted]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    before = {t.name for t in model.graph.initializer}
    _prune(model)
    _drop_stale_value_info(model)
    _record(model, graph.model, before, created=False)
    return model


def _drop_stale_value_info(model: onnx.ModelProto) -> None:
    """Keep only the value_info of values the model still has."""
    names = _all_value_names(model)
    keep = [v for v in model.graph.value_info if v.name in names]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)


def _record(model: onnx.ModelProto, source: onnx.ModelProto, before: set[str], *, created: bool) -> None:
    """Write into ``model``'s metadata (``FOLDED_KEY``) the initializers it lost against ``before`` (its names when
    copied from ``source``), and, where ``created``, the ones it gained, on top of what ``source`` recorded."""
    after = {t.name for t in model.graph.initializer}
    rec = folded_record(source)
    removed = sorted((set(rec["removed"]) | (before - after)) - after)
    added = sorted((set(rec["added"]) | ((after - before) if created else set())) & after)
    props = [p for p in model.metadata_props if p.key != FOLDED_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    if removed or added:
        entry = model.metadata_props.add()
        entry.key, entry.value = FOLDED_KEY, json.dumps({"removed": removed, "added": added})


def _all_value_names(model: onnx.ModelProto) -> set[str]:
    names = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        names.update(n.output)
    return names


def _is_const_init(t: Any, overridable: set[str], fold_weights: bool) -> bool:
    if t.name in overridable:
        return False
    if fold_weights:
        return True
    size = int(np.prod([int(d) for d in t.dims])) if len(t.dims) else 1
    if size <= 1:
        return True
    nbytes = onnxfile.nbytes_of(t.data_type, t.dims)
    kind = onnxfile.np_dtype(t.data_type).kind if nbytes is not None else "O"
    return kind in "iub" and nbytes is not None and nbytes <= SMALL_BYTES


def _fold_pass(model: onnx.ModelProto, view: Graph, max_bytes: int, fold_weights: bool,
               inferred: onnx.ModelProto | None = None) -> tuple[bool, onnx.ModelProto | None]:
    """One pass in node order; returns whether it folded anything, and the inference it read (None: it failed)."""
    from onnx import numpy_helper

    g = model.graph
    # ir_version >= 4: an initializer that is also a graph input is a default the caller may override
    overridable = {i.name for i in g.input} if model.ir_version >= 4 else set()
    inits = {t.name: t for t in g.initializer}
    refs = view.external_refs  # (view.has_data would build the set of every initializer's name per call)
    const_names = {n for n, t in inits.items() if _is_const_init(t, overridable, fold_weights)
                   and (n not in refs or refs[n] is not None)}
    cache: dict[str, np.ndarray] = {}

    def value(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = np.asarray(view.tensor_array(inits[name]))
        return cache[name]

    try:
        inferred = inferred if inferred is not None else infer(model, view.name)
        shapes = {v.name: v for v in inferred.graph.value_info}
    except ModelError:
        inferred, shapes = None, {}
    shapes.update({v.name: v for v in g.input})
    opsets = list(model.opset_import)
    partial: dict[str, list[int | None]] = {}  # Shape outputs with some dims known
    keep: list[Any] = []
    new_inits: list[Any] = []
    changed = False
    for node in g.node:
        outs = _try_fold(node, const_names, value, shapes, opsets, model.ir_version, max_bytes, partial)
        if outs is None:
            keep.append(node)
            continue
        changed = True
        for name, arr in outs.items():
            cache[name] = arr
            const_names.add(name)
            new_inits.append(numpy_helper.from_array(arr, name))
    if changed:
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(new_inits)
    return changed, inferred


def _try_fold(node: Any, const_names: set[str], value: Any, shapes: dict[str, Any], opsets: list[Any],
              ir_version: int, max_bytes: int, partial: dict[str, list[int | None]]) -> dict[str, np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC:
        return None
    if any(a.HasField("g") or len(a.graphs) for a in node.attribute):
        return None
    if node.op_type in ("Shape", "Size") and node.input and node.input[0] not in const_names:
        dims = _known_dims(shapes.get(node.input[0]))
        if dims is None:
            return None
        if node.op_type == "Shape":
            attrs = {a.name: a.i for a in node.attribute}
            dims = dims[slice(attrs.get("start", 0), attrs["end"] if "end" in attrs else None)]
        if any(d is None for d in dims):
            if node.op_type == "Shape":
                partial[node.output[0]] = dims
            return None
        if node.op_type == "Size":
            return {node.output[0]: np.array(int(np.prod(dims)), dtype=np.int64)}
        return {node.output[0]: np.array(dims, dtype=np.int64)}
    if node.op_type in ("Gather", "Slice") and node.input and node.input[0] in partial:
        return _fold_partial_shape(node, partial[node.input[0]], const_names, value)
    names = [n for n in node.input if n]
    if not all(n in const_names for n in names):
        return None
    feeds = {n: value(n) for n in dict.fromkeys(names)}
    in_bytes = sum(a.nbytes for a in feeds.values())
    # check the size before computing: a hostile or huge ConstantOfShape must not be materialized
    limit = max(max_bytes, 4 * in_bytes)
    for out in node.output:
        vi = shapes.get(out)
        dims = _static_dims(vi)
        if dims is not None and (onnxfile.nbytes_of(vi.type.tensor_type.elem_type, dims) or 0) > limit:
            return None
        if dims is None and node.op_type in EXPANDING:
            return None
    try:
        results = _evaluate(node, feeds, opsets, ir_version)
    except Exception as exc:  # noqa: BLE001 - an op the evaluator cannot do is simply not folded
        log.debug("not folding %s (%s): %s", node.name, node.op_type, exc)
        return None
    if any(not isinstance(r, np.ndarray) for r in results.values()):
        return None
    if sum(r.nbytes for r in results.values()) > limit:
        return None
    return results


def _known_dims(vi: Any) -> list[int | None] | None:
    """Dims of a value, None for each unknown one; None when even the rank is unknown."""
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def _fold_partial_shape(node: Any, dims: list[int | None], const_names: set[str], value: Any
                        ) -> dict[str, np.ndarray] | None:
    """Gather/Slice of a Shape whose picked dims are all known: the exporter's
    ``Shape -> Gather(1)`` on a tensor pinned only in that dim."""
    rest = [n for n in node.input[1:] if n]
    if not all(n in const_names for n in rest):
        return None
    try:
        if node.op_type == "Gather":
            if any(a.name == "axis" and a.i != 0 for a in node.attribute):
                return None
            idx = np.asarray(value(node.input[1]))
            if idx.dtype.kind not in "iu" or idx.ndim > 1:
                return None
            picked = [dims[int(i)] for i in idx.reshape(-1)]
            out = np.array(picked, dtype=object).reshape(idx.shape)
        else:
            args = [np.asarray(value(n)).reshape(-1) if n else None for n in node.input[1:]]
            args += [None] * (4 - len(args))
            if args[0] is None or args[1] is None or len(args[0]) != 1 or (args[2] is not None and list(args[2]) not in ([0], [-1])):
                return None
            step = int(args[3][0]) if args[3] is not None and len(args[3]) else 1
            picked = dims[slice(int(args[0][0]), int(args[1][0]), step)]
            out = np.array(picked, dtype=object)
    except (IndexError, ValueError, TypeError, OverflowError):
        return None
    if any(d is None for d in out.reshape(-1)):
        return None
    return {node.output[0]: out.astype(np.int64)}


def _static_dims(vi: Any) -> list[int] | None:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return dims


def _evaluate(node: Any, feeds: dict[str, np.ndarray], opsets: list[Any], ir_version: int) -> dict[str, np.ndarray]:
    opset = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 0)
    known = numpy_fold(node, [feeds[n] if n else None for n in node.input], opset)
    if known is not None:
        return dict(zip(node.output, known))
    from onnx import helper
    from onnx.reference import ReferenceEvaluator  # imported only here: 12 MiB and 0.3 s of a process

    from ..refops import REFERENCE_FIXES

    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    m = helper.make_model(helper.make_graph([node], "fold", inputs, outputs), opset_imports=opsets,
                          ir_version=ir_version)
    out_names = [o for o in node.output if o]
    with np.errstate(all="ignore"):  # the graph's own arithmetic (T5's log of a 0 position, cast after): as a
        res = ReferenceEvaluator(m, new_ops=REFERENCE_FIXES).run(out_names, feeds)  # runtime computes it, without
        # numpy's warnings on stderr
    return {n: np.asarray(r) if isinstance(r, np.ndarray) or np.isscalar(r) else r for n, r in zip(out_names, res)}


def _prune(model: onnx.ModelProto) -> bool:
    """Remove nodes whose outputs nothing uses, then initializers nothing reads."""
    g = model.graph
    used = {o.name for o in g.output}
    kept: list[Any] = []
    for node in reversed(list(g.node)):
        if any(o in used for o in node.output if o):
            kept.append(node)
            used.update(node.input)
            used.update(_subgraph_refs(node))
    kept.reverse()
    changed = len(kept) != len(g.node)
    if changed:
        del g.node[:]
        g.node.extend(kept)
    dead = [t.name for t in g.initializer if t.name not in used]
    if dead:
        deadset = set(dead)
        keep_inits = [t for t in g.initializer if t.name not in deadset]
        keep_inputs = [i for i in g.input if i.name not in deadset]
        del g.initializer[:]
        g.initializer.extend(keep_inits)
        del g.input[:]
        g.input.extend(keep_inputs)
        changed = True
    return changed


def _subgraph_refs(node: Any) -> set[str]:
    refs: set[str] = set()
    for a in node.attribute:
        subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
        for sg in subs:
            for n in sg.node:
                refs.update(n.input)
                refs.update(_subgraph_refs(n))
    return refs
