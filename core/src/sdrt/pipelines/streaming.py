"""Block-group streaming: a denoiser larger than the memory budget runs as sequential groups of its nodes.

``split(graph, max_weight_bytes=...)`` cuts a shape-pinned graph along its topological order (ONNX keeps
nodes topologically sorted) into groups whose weights each stay under the cap. The cuts are computed
from the graph alone: at every node boundary the live activations are the tensors produced before it
and consumed after it (graph inputs and outputs count; initializers and ``Constant`` outputs do not, a
``Constant`` node is copied into each group that reads it). Within the window a group may end in, the
cut goes where the fewest live tensors cross (then the fewest bytes), so a transformer splits between
its blocks (hidden states, text states, the time embedding and the rotary table cross) and a UNet
where its skip connections allow, with no model-specific names.

``StreamedSession`` runs a part that way: per call, each group is compiled with ``sdrt.load`` on the
part's backend and device, run, and closed (its memory handed back) before the next group loads. Its
weights come from the graph's mapped files (``Graph.derive`` keeps external initializers as references)
or from the part's ``Weights`` references, never a full copy of the model. With ``share=True`` groups
whose structure is identical (Flux's double and single blocks, SD3's joint blocks) are built with
canonical tensor names, compiled once, and the next block's weights are swapped in with
``Session.update_weights``; whether that is cheaper than compiling again depends on the backend
(docs/memory.md has the figures).

While a group loads and computes, the next group's weight bytes are read ahead into the page cache on a background
thread (``sdrt.weights.pages.Prefetcher``: ``posix_fadvise(WILLNEED)`` on their file ranges; during the last group,
the first group's, for the next call), so its load finds them there instead of waiting on the disk. Those pages
are the kernel's page cache, not this process's resident memory, until the next group's load reads them, as
it would without the prefetch: the budget is unchanged. ``prefetch=False`` turns it off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import __version__
from ..errors import ModelError

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..graph import Graph
    from ..tensors import TensorInfo
    from ..weights import Weights

log = logging.getLogger("sdrt.pipelines.streaming")

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1,
             "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "int4": 1,
             "uint4": 1}


@dataclass
class Group:
    """Nodes ``start:end`` of the graph (topological order), what they read and write, and their weights."""

    start: int
    end: int
    inputs: list[str]
    outputs: list[str]
    initializers: list[str]
    weight_bytes: int
    #: Constant nodes (by index) copied in because the group reads their output
    constants: list[int] = field(default_factory=list)


def _node_reads(node: Any) -> list[str]:
    """Every name a node reads, including the outer-scope names its subgraphs use."""
    names = [n for n in node.input if n]
    for a in node.attribute:
        subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
        for g in subs:
            inner = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
            names += [x for n in g.node for x in _node_reads(n) if x not in inner]
    return names


def _nbytes(info: TensorInfo | None) -> int:
    if info is None:
        return 0
    size = _ITEMSIZE.get(info.dtype, 4)
    for d in info.shape:
        size *= d if isinstance(d, int) and d > 0 else 1
    return size


@dataclass
class _Analysis:
    nodes: list[Any]
    inits: dict[str, int]  # initializer -> bytes
    constants: dict[str, int]  # Constant output -> node index
    reads: list[list[str]]
    node_weight: list[int]  # bytes of the initializers first read by each node
    live_count: list[int]  # per boundary b in 0..n: tensors crossing between node b-1 and node b
    live_bytes: list[int]
    producer: dict[str, int]
    last_use: dict[str, int]
    node_inits: list[list[str]]  # the initializers each node reads, directly or through an alias
    vinfo: dict[str, Any]  # every value's TensorInfo (Graph.value_infos), read once


def analyse(graph: Graph) -> _Analysis:
    """Live tensors at every node boundary and the weight bytes each node brings in (see the module doc)."""
    g = graph.model.graph
    nodes = list(g.node)
    n = len(nodes)
    infos = graph.initializer_info()
    inits = {name: _nbytes(info) for name, info in infos.items()}
    # Constant nodes, and Identity nodes that alias a weight (an exporter's shared tensors), are copied into
    # each group that reads them instead of crossing every boundary as an activation
    constants = {o: i for i, node in enumerate(nodes)
                 if node.op_type == "Constant" or (node.op_type == "Identity" and node.input[0] in inits)
                 for o in node.output}
    vinfo = graph.value_infos()
    producer: dict[str, int] = {v.name: -1 for v in g.input if v.name not in inits}
    reads = []
    last_use: dict[str, int] = {}
    seen: set[str] = set()
    node_weight = []
    node_inits: list[list[str]] = []
    for i, node in enumerate(nodes):
        r = _node_reads(node)
        reads.append(r)
        node_inits.append([x for name in r for x in ([name] if name in inits else
                                                      [y for y in nodes[constants[name]].input if y in inits]
                                                      if name in constants else [])])
        w = 0
        for name in r:
            if name in inits:
                if name not in seen and not (node.op_type == "Identity" and node.output[0] in constants):
                    seen.add(name)
                    w += inits[name]
            elif name in constants:
                c = nodes[constants[name]]
                for x in c.input:  # the weight an Identity aliases counts where it is read
                    if x in inits and x not in seen:
                        seen.add(x)
                        w += inits[x]
            else:
                last_use[name] = i
        node_weight.append(w)
        for o in node.output:
            if o:
                producer[o] = i
    for o in g.output:
        last_use[o.name] = n
    diff_c = [0] * (n + 2)
    diff_b = [0] * (n + 2)
    for name, last in last_use.items():
        p = producer.get(name)
        if p is None:
            continue
        # crosses boundaries p+1 .. last (boundary b sits before node b)
        size = _nbytes(vinfo.get(name))
        diff_c[p + 1] += 1
        diff_c[last + 1] -= 1
        diff_b[p + 1] += size
        diff_b[last + 1] -= size
    live_count, live_bytes = [], []
    c = b = 0
    for i in range(n + 1):
        c += diff_c[i]
        b += diff_b[i]
        live_count.append(c)
        live_bytes.append(b)
    return _Analysis(nodes, inits, constants, reads, node_weight, live_count, live_bytes, producer, last_use,
                     node_inits, vinfo)


def _attention_scores(a: _Analysis, producer: int, last: int) -> bool:
    """Whether a tensor is an attention score matrix (the MatMul/Add/Mul into a Softmax, or the Softmax's output
    into the next MatMul): the backends run softmax(Q K^T) V fused (OpenVINO's SDPA, ggml's flash attention), so
    the [heads, tokens, tokens] matrix the ONNX graph writes out is never held whole."""
    made, read = a.nodes[producer].op_type, a.nodes[last].op_type if last < len(a.nodes) else ""
    return made == "Softmax" or (read == "Softmax" and made in ("MatMul", "Add", "Mul", "Div"))


#: the name ``activation_peaks``'s whole-graph figure is kept under beside a pinned graph (``graph.pinned_store``):
#: bump its version when what it counts changes (sdrt's version is part of it too, so an upgrade counts afresh)
PEAK_FACT = f"activation peak v1 (sdrt {__version__})"


def activation_peaks(graph: Graph, groups: list[Group] | None = None) -> list[int]:
    """The most activation bytes alive at once: at each node boundary, the tensors made before it and read after
    it (graph inputs and outputs too; attention scores not: ``_attention_scores``), at the graph's float32 sizes.
    One figure for the whole graph, or one per group (its boundaries only: the tensors a streamed run keeps for
    later groups count too). The graph must be shape-pinned (``Graph.with_shapes``); unknown shapes count 0."""
    a = analyse(graph)
    vinfo = a.vinfo
    n = len(a.nodes)
    diff = [0] * (n + 2)
    for name, last in a.last_use.items():
        p = a.producer.get(name)
        if p is None or (p >= 0 and _attention_scores(a, p, last)):
            continue
        size = _nbytes(vinfo.get(name))
        diff[p + 1] += size
        diff[last + 1] -= size
    live, b = [], 0
    for i in range(n + 1):
        b += diff[i]
        live.append(b)
    spans = [(0, n)] if groups is None else [(g.start, g.end) for g in groups]
    return [max(live[start:end + 1], default=0) for start, end in spans]


def split(graph: Graph, *, max_weight_bytes: int | None = None, groups: int | None = None) -> list[Group]:
    """Cut ``graph`` (shape-pinned, so every intermediate has a type) into sequential groups.

    ``max_weight_bytes``: the most weight bytes one group may hold; ``groups``: aim at this many groups of
    equal weight instead. A single node heavier than the cap makes a group of its own (it cannot be cut).
    """
    a = analyse(graph)
    n = len(a.nodes)
    total = sum(a.node_weight)
    if groups is not None:
        if groups < 1:
            raise ValueError("groups must be >= 1")
        cap = max(total // groups + 1, 1)
    elif max_weight_bytes is not None:
        cap = max(int(max_weight_bytes), 1)
    else:
        raise ValueError("give max_weight_bytes or groups")
    cuts = [0]
    s = 0
    while s < n:
        seen: set[str] = set()
        held = [0]  # held[k]: the weight bytes of nodes s .. s+k-1 (a weight read twice counts once)
        e = s  # the furthest boundary whose group stays under the cap (at least one node)
        while e < n:
            new = {x for x in a.node_inits[e] if x not in seen}
            add = sum(a.inits[x] for x in new)
            if e > s and held[-1] + add > cap:
                break
            seen |= new
            held.append(held[-1] + add)
            e += 1
        if e == n:
            cuts.append(n)
            break
        # candidates: the last half of the window by weight (so groups are not needlessly small)
        window = [b for b in range(s + 1, e + 1) if held[b - s] >= held[-1] / 2] or [e]
        best = min(window, key=lambda b: (a.live_count[b], a.live_bytes[b], b))  # ties: the earliest, so
        # identical blocks get identical cuts (a later tie sits inside the next block)
        cuts.append(best)
        s = best
    return [_group(a, cuts[k], cuts[k + 1]) for k in range(len(cuts) - 1)]


def _group(a: _Analysis, start: int, end: int) -> Group:
    inputs: dict[str, None] = {}
    inits: dict[str, None] = {}
    consts: dict[int, None] = {}
    for i in range(start, end):
        for name in a.reads[i]:
            if name in a.inits:
                inits[name] = None
            elif name in a.constants:
                c = a.constants[name]
                if c < start:
                    consts[c] = None
                    inits.update((x, None) for x in a.reads[c] if x in a.inits)  # an aliased weight
            elif a.producer.get(name, -1) < start:
                inputs[name] = None
    outputs = [o for i in range(start, end) for o in a.nodes[i].output
               if o and a.last_use.get(o, -1) >= end and o not in a.constants]
    return Group(start, end, list(inputs), outputs, list(inits), sum(a.inits[x] for x in inits), sorted(consts))


# ---------------------------------------------------------------------------- group graphs
def group_model(graph: Graph, group: Group, *, canonical: bool = False) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The ONNX model of one group (initializers copied as they are: external ones stay references).

    ``canonical``: tensors renamed by position (inputs ``i0..``, weights ``w0..``, outputs ``o0..``,
    the rest ``t0..``) and node names dropped, so identical blocks give byte-identical models. Returns the
    model and ``{original name: name in the model}`` for the inputs, outputs and initializers."""
    import onnx

    src = graph.model
    g = src.graph
    vinfo = {v.name: v for v in list(g.input) + list(g.value_info) + list(g.output)}
    nodes = [g.node[i] for i in group.constants] + [g.node[i] for i in range(group.start, group.end)]
    names: dict[str, str] = {}
    if canonical:
        for k, x in enumerate(group.inputs):
            names[x] = f"i{k}"
        for k, x in enumerate(group.initializers):
            names[x] = f"w{k}"
        for k, x in enumerate(group.outputs):
            names[x] = f"o{k}"
        t = 0
        for node in nodes:
            for o in node.output:
                if o and o not in names:
                    names[o] = f"t{t}"
                    t += 1
    else:
        names = {x: x for x in [*group.inputs, *group.outputs, *group.initializers]}

    def rn(x: str) -> str:
        return names.get(x, x) if x else x

    m = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(m, f, getattr(src, f))
    m.opset_import.extend(src.opset_import)
    m.metadata_props.extend(src.metadata_props)
    m.functions.extend(src.functions)
    out = m.graph
    out.name = "group" if canonical else f"{g.name or 'graph'}[{group.start}:{group.end}]"
    for k, node in enumerate(nodes):
        new = out.node.add()
        new.CopyFrom(node)
        if canonical:
            new.name = f"n{k}"
            del new.input[:]
            new.input.extend(rn(x) for x in node.input)
            del new.output[:]
            new.output.extend(rn(x) for x in node.output)
            if any(a.HasField("g") or len(a.graphs) for a in node.attribute):
                raise ModelError("a node with a subgraph cannot be renamed for sharing", where=node.name,
                                 fix="stream without sharing")
    init_set = set(group.initializers)
    for t in g.initializer:
        if t.name in init_set:
            new_t = out.initializer.add()
            new_t.CopyFrom(t)
            new_t.name = rn(t.name)
    for x in group.inputs:
        out.input.append(_typed(vinfo.get(x), x, rn(x), graph))
    for x in group.outputs:
        out.output.append(_typed(vinfo.get(x), x, rn(x), graph))
    if not canonical:
        inside = {o for node in nodes for o in node.output} - set(group.outputs)
        out.value_info.extend(v for name, v in vinfo.items() if name in inside)
    return m, names


def _typed(v: Any, name: str, new: str, graph: Graph) -> Any:
    import onnx

    if v is None or not v.type.tensor_type.elem_type:
        raise ModelError(f"the tensor {name!r} has no inferred type, so the graph cannot be cut there",
                         where=graph.name, fix="pin the input shapes (Graph.with_shapes) before splitting")
    out = onnx.ValueInfoProto()
    out.CopyFrom(v)
    out.name = new
    return out


def group_graph(graph: Graph, group: Group, *, canonical: bool = False) -> tuple[Graph, dict[str, str]]:
    """``group_model`` as a ``Graph`` that keeps the mapped weights mapped (canonical names are remapped)."""
    from ..graph import Graph as _Graph

    model, names = group_model(graph, group, canonical=canonical)
    ext = {names.get(k, k): v for k, v in graph.external_refs.items() if k in set(group.initializers)}
    return _Graph(model, graph.path, base_dir=graph.base_dir, external=ext, label=graph.label), names


def _sub_weights(weights: Weights | None, names: Mapping[str, str], wanted: Iterable[str]) -> Weights | None:
    """The part's own weights for one group's initializers, as lazy references under the group's names."""
    if weights is None:
        return None
    from ..weights import Weights as _Weights

    refs = {}
    for x in wanted:
        if x in weights:
            ref = weights.ref(x)
            refs[names.get(x, x)] = replace(ref, name=names.get(x, x))
    return _Weights(refs, dtype=weights.dtype, sources=weights.sources) if refs else None


# ---------------------------------------------------------------------------- running
class StreamedSession:
    """A part run group by group (see the module doc); quacks like the ``Session`` a part caches."""

    def __init__(self, graph: Graph, weights: Weights | None, *, max_weight_bytes: int | None = None,
                 groups: int | None = None, backend: str = "auto", device: Any = None, share: bool = False,
                 options: Mapping[str, Any] | None = None, prefetch: bool = True) -> None:
        if not graph.model.graph.value_info:  # not shape-inferred yet: every cut needs its tensors' types
            graph = graph.with_shapes()
        # shapes computed at run time (Shape -> Gather -> Concat -> Reshape) become constants, so no group
        # is handed a shape as an input (a backend that needs static shapes could not use it)
        graph = graph.fold_constants()
        self.graph = graph
        self.weights = weights
        self.backend, self.device, self.options = backend, device, dict(options or {})
        self.groups = split(graph, max_weight_bytes=max_weight_bytes, groups=groups)
        self.share = share
        self.inputs = graph.inputs
        self.outputs = graph.outputs
        #: seconds spent loading (compiling or swapping weights) and running, over all calls
        self.load_s = 0.0
        self.run_s = 0.0
        self._shared: dict[bytes, Any] = {}
        #: each group's weight bytes in files ({path: [(offset, length)]}), read ahead while the group before runs
        self.prefetch = prefetch
        self._ranges = [self._file_ranges(g) for g in self.groups] if prefetch else []
        from ..weights.pages import Prefetcher

        self._prefetcher = Prefetcher()
        #: groups that reused a compiled block with their weights swapped in (``share``)
        self.swaps = 0
        log.info("%s streams in %d group(s) of at most %.1f MiB of weights (%s)", graph.name, len(self.groups),
                 max(g.weight_bytes for g in self.groups) / 2**20,
                 ", ".join(f"{len(g.inputs)} in" for g in self.groups))

    def __repr__(self) -> str:
        return f"StreamedSession({self.graph.name!r}, {len(self.groups)} groups)"

    @property
    def peak_group_bytes(self) -> int:
        return max(g.weight_bytes for g in self.groups)

    def _file_ranges(self, group: Group) -> dict[str, list[tuple[int, int]]]:
        """Where the group's weights sit in files: the part's ``Weights`` references, else the graph's mapped data."""
        from ..weights.pages import file_ranges

        ext = self.graph.external_refs
        w = self.weights
        return file_ranges(w.ref(x) if w is not None and x in w else ext.get(x) for x in group.initializers)

    @property
    def prefetched_bytes(self) -> int:
        """Bytes read ahead so far (``prefetch``)."""
        return self._prefetcher.bytes

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the groups in turn; ``outputs``: return only these (``Session.run``'s), whose groups then copy out
        only what a later group reads or the caller wants."""
        from ..backend import check_outputs
        from ..runtime import load
        from .lowmem import give_back

        wanted = [o.name for o in self.outputs] if outputs is None else check_outputs(self.outputs, outputs)
        env: dict[str, np.ndarray] = dict(feeds)
        n = len(self.groups)
        if self.prefetch and n > 1:
            self._prefetcher.start(self._ranges[0])  # usually in the page cache already: read ahead last call
        for k, group in enumerate(self.groups):
            if self.prefetch and n > 1:  # the next group's weights come in while this one loads and runs
                self._prefetcher.start(self._ranges[(k + 1) % n])
            t0 = time.perf_counter()
            g, names = group_graph(self.graph, group, canonical=self.share)
            sub = _sub_weights(self.weights, names, group.initializers)
            if sub is not None and len(sub) < len(group.initializers):  # the rest (folded constants): the graph's
                from ..weights import Weights as _W

                own = _W.from_graph(g)
                sub = _W({n: sub.ref(n) if n in sub else own.ref(n) for n in own}, dtype=sub.dtype)
            sess: Any
            if self.share:
                from ..weights import Weights as _Weights

                key = _structure_key(g)  # the model without its weight bytes
                sess = self._shared.get(key)
                if sess is None:
                    self.close()  # one compiled block at a time: the last one goes first
                    give_back()
                    sess = load(g, weights=sub, backend=self.backend, device=self.device, **self.options)
                    self._shared = {key: sess}
                else:  # the same block: swap its weights in (the small and integer tensors are equal by the key)
                    own = _Weights.from_graph(g)  # references: nothing is read before the backend binds it
                    refs = {n: sub.ref(n) if sub is not None and n in sub else own.ref(n) for n in own}
                    sess.update_weights(_Weights(refs))  # every tensor (the check wants all); equal ones compare
                    self.swaps += 1
            else:
                sess = load(g, weights=sub, backend=self.backend, device=self.device, **self.options)
            t1 = time.perf_counter()
            needed = [names.get(x, x) for x in group.outputs
                      if x in wanted or any(x in later.inputs for later in self.groups[k + 1:])]
            try:
                out = sess.run({names.get(x, x): env[x] for x in group.inputs},
                               outputs=None if outputs is None else needed)
            finally:
                if not self.share:
                    sess.close()
            t2 = time.perf_counter()
            self.load_s += t1 - t0
            self.run_s += t2 - t1
            inv = {names.get(x, x): x for x in group.outputs}
            env.update({inv[name]: value for name, value in out.items() if name in inv})
            del sess, out, g
            for x in list(env):  # drop what no later group reads
                if x not in feeds and all(x not in later.inputs for later in self.groups[k + 1:]) \
                        and x not in wanted:
                    del env[x]
            if not self.share:
                give_back()
        return {name: env[name] for name in wanted}

    def update_weights(self, weights: Weights) -> None:
        """New weights for the later calls (each group binds its share when it loads)."""
        self.weights = weights

    def close(self) -> None:
        self._prefetcher.wait()
        for sess in self._shared.values():
            sess.close()
        self._shared.clear()


#: initializers a shared block swaps: floating tensors of at least this many elements (weights); smaller or
#: integer ones (shapes, axes, scalars) are part of the block's structure, since a backend may fold them in
SWAP_MIN_ELEMENTS = 1024
_FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16


def _swapped(t: Any) -> bool:
    return t.data_type in _FLOAT_TYPES and int(np.prod(list(t.dims), dtype=np.int64)) >= SWAP_MIN_ELEMENTS


def _structure_key(g: Graph) -> bytes:
    """The group's model without the bytes of its swappable weights: equal keys, identical blocks."""
    import onnx

    m = onnx.ModelProto()
    m.ir_version = g.model.ir_version
    m.opset_import.extend(g.model.opset_import)
    m.functions.extend(g.model.functions)
    src = g.model.graph
    m.graph.node.extend(src.node)
    m.graph.input.extend(src.input)
    m.graph.output.extend(src.output)
    for t in src.initializer:
        new = m.graph.initializer.add()
        if _swapped(t):
            new.name, new.data_type = t.name, t.data_type
            new.dims.extend(t.dims)
        else:
            new.CopyFrom(t)
            if t.name in g.external_refs:  # small but mapped: its bytes decide
                new.ClearField("external_data")
                new.raw_data = np.ascontiguousarray(g.tensor_array(t)).tobytes()
    return m.SerializeToString()
