"""Costs of every node of an ONNX graph at given shapes: FLOPs, bytes read and written, weight bytes, op class.

``graph_costs(graph, shapes, precision)`` pins the shapes (``Graph.with_shapes``), infers every
intermediate, and walks the nodes. Counting rules, per node:

- **FLOPs** count a multiply-add as 2. Conv: ``2 * prod(out) * Cin/groups * prod(kernel)``; MatMul:
  ``2 * prod(out) * K``; Gemm: ``2 * M * N * K``; Softmax 5 per element (max, sub, exp, sum, div);
  normalisations 8 per element; elementwise ops 1 per output element; data movement 0.
- **Bytes read** are the sizes of the inputs (weights at the chosen precision, activations at the
  compute dtype); **bytes written** the size of the outputs. Views (Reshape, Squeeze, Unsqueeze,
  Flatten, Identity) and shape ops move nothing: 0 and 0.
- **Weight bytes**: initializers (and Constant outputs) that a node reads. Matrices and kernels of
  matmul/conv nodes (2-D and up) take the precision's size per element (``q4_0`` 18 bytes per 32);
  everything else (biases, norm scales, small constants) stays at the compute dtype.
- **Fused**: an elementwise node whose input comes from a conv, matmul, normalisation, attention or
  elementwise node, as that value's only reader, is an epilogue that compilers fuse (bias, activation,
  residual add): ``fused`` is set and the model charges it no memory traffic.
- **Timing class** (``NodeCost.time_class``): the op class, but ``dwconv`` for a grouped conv,
  ``conv1x1`` for a 1x1 conv (its kernel's shape says so), ``conv_large`` for a dense conv whose activations pass
  ``LARGE_CONV_BYTES`` (out of the cores' L2), ``matmul_narrow`` for a weight matmul over fewer than
  ``NARROW_ROWS`` rows, ``softmax`` for Softmax, ``groupnorm`` for Instance/GroupNormalization (a reduction over a whole
  map per group, unlike LayerNorm's rows), which run at their own efficiency, and ``int`` for integer work
  on integer values (token ids: positions, masks), which a runtime may run on the host at a cost per node.
- **Shapes are constants**: at pinned shapes a Shape (or Size) node's value is known, so the shape
  arithmetic that reads it (Gather, Concat, Cast ... of shapes) folds at compile time and costs nothing
  where the runtime compiles at pinned shapes; ``GraphCost.dynamic_shape_nodes`` counts it for a runtime
  that keeps a dynamic graph's dims dynamic (and so runs it every call).
- **Op class**: ``matmul`` (MatMul/Gemm with a weight operand), ``conv``, ``attention`` (MatMul of two
  activations, as QK^T and PV are, and Softmax), ``norm`` (Group/Instance/Layer/Batch/RMS
  normalisation and reductions), ``elementwise``, ``data`` (transposes, concats, slices, gathers,
  resizes, pads) and ``view`` (free).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import SdrtError

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph

CLASSES = ("matmul", "conv", "attention", "norm", "elementwise", "data", "view")

#: bytes per weight element of a matmul/conv matrix at each precision (block formats: bytes per block / block)
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "q8_0": 34 / 32,
                "q5_0": 22 / 32, "q4_0": 18 / 32, "q4_k": 144 / 256, "nf4": 0.5 + 2 / 64}
#: the shortest dot product a CPU kernel does at the cost of its length: one 512-bit vector of float32 (16 lanes); a
#: matmul of two activations with a shorter reduction (attention's QK^T over narrow heads) does one vector's work per
#: output (``NodeCost.kernel_flops``)
MIN_DOT = 16
#: bytes per activation element at each precision (the compute dtype; quantized formats compute in fp16)
ACT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 2, "int8": 2, "q8_0": 2, "q5_0": 2, "q4_0": 2, "q4_k": 2,
             "nf4": 2}
PRECISIONS = tuple(WEIGHT_BYTES)

VIEW_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant", "ConstantOfShape",
         "Range", "EyeLike"}
_DATA = {"Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Resize", "Upsample",
         "Expand", "Pad", "Tile", "DepthToSpace", "SpaceToDepth", "ScatterND", "ScatterElements", "Cast",
         "CastLike", "Trilu", "OneHot", "NonZero", "TopK"}
_NORM = {"GroupNormalization", "InstanceNormalization", "LayerNormalization", "BatchNormalization",
         "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "LpNormalization",
         "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare",
         "ReduceLogSumExp", "MeanVarianceNormalization"}
_NORM_FLOPS = 8
#: a dense conv wider than 1x1 whose activations (input and output, at the compute dtype) take more than this runs at
#: an efficiency of its own (``conv_large``): past the cores' L2 its arithmetic slows. OpenVINO's bf16 convs on
#: Sapphire Rapids (2 MiB of L2 a core): 2.8-3.0 TFLOP/s on the calibration's maps of 0.6-2 MiB, 2.0-2.6 on a VAE
#: decoder's of 4-64 MiB; fitted with one efficiency from the small ones, the SDXL VAE decoder came out at 0.57-0.61
#: of its time
LARGE_CONV_BYTES = 4 * 2**20
#: ... over more input channels than this: a narrower conv (a pixel's channels within one 64-byte line) is traffic
#: more than arithmetic at any size, and stays ``conv`` (fitted with it, the 16-channel calibration case at float32,
#: 8 MiB of maps, put OpenVINO's large float32 convs at half their speed)
NARROW_CONV_CHANNELS = 16
#: an elementwise node fuses into the node that writes its input when it is that value's only reader
_FUSES_INTO = {"conv", "matmul", "norm", "attention", "elementwise"}
_ACT_HEAVY = {"Erf": 8, "Exp": 4, "Log": 4, "Tanh": 8, "Sigmoid": 4, "Gelu": 10, "Softplus": 6, "Mish": 10,
              "HardSigmoid": 2, "HardSwish": 3, "Sin": 8, "Cos": 8, "Pow": 4, "Sqrt": 2, "Reciprocal": 1}


@dataclass
class NodeCost:
    """One node's cost at pinned shapes."""

    name: str
    op: str
    op_class: str
    flops: float
    bytes_read: float
    bytes_written: float
    weight_bytes: float
    fused: bool = False  # an elementwise epilogue of the node that writes its input: no trip to memory
    #: the timing class where it differs from ``op_class``: ``dwconv`` (a grouped conv: depthwise in
    #: MobileNets, few FLOPs per byte), ``softmax`` (exp-bound, unlike the attention matmuls)
    kind: str = ""
    #: images a conv processes (its input's first dim): a runtime may read the kernel once per image
    batch: int = 1
    #: the FLOPs as a CPU kernel does them where they differ from ``flops``: a matmul of two activations whose
    #: reduction is shorter than one vector (``MIN_DOT``: attention's QK^T over heads 1-8 wide) costs a full vector's
    #: work per output (OpenVINO ran attention with 2-, 4- and 8-wide heads at the same time per score); None: ``flops``
    kernel_flops: float | None = None
    #: an attention's softmax: its rows (one per query, head and image), each a fused attention kernel's fixed work (the
    #: row's max, sum and scaling, the output row's store), whatever the row's length; 0 for other nodes
    rows: int = 0
    #: a dense conv wider than 1x1 run as im2col + matmul (ggml's GPU backends): the unfolded input it writes and its
    #: matmul reads, N x Ho x Wo x Cin x kh x kw activations; 0 for other nodes
    im2col_bytes: float = 0.0
    #: a Transpose that splits heads before attention's matmuls or merges them after (``_head_transposes``): strides
    #: of the attention where the backend fuses it, a copy where it makes matmul operands dense (``model.copies_heads``)
    head: bool = False
    #: a conv's output pixels an image (Ho x Wo; 0 for other nodes): a runtime may route a conv on a small map so
    #: that its kernel is held as stored rather than transformed (``Factors.plain_conv_pixels``)
    pixels: int = 0
    #: a conv's output channels (0 for other nodes): a backend may keep a conv of few channels at float32 where it
    #: runs the others at a half precision (``model.half_convs``)
    channels: int = 0

    @property
    def timed_flops(self) -> float:
        return self.flops if self.kernel_flops is None else self.kernel_flops

    @property
    def time_class(self) -> str:
        return self.kind or self.op_class

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


@dataclass
class GraphCost:
    """Every node's cost, and what a memory plan needs: the weights and the activations' peak."""

    name: str
    precision: str
    nodes: list[NodeCost]
    weight_bytes: float  # every initializer once, at the precision
    peak_activation_bytes: float  # largest sum of live activations over the node order
    io_bytes: float  # graph inputs and outputs
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # values whose shape inference could not tell (counted 0)
    #: the ops (``domain:op`` outside ONNX's own) of the nodes where shapes are first lost: their inputs' shapes are
    #: known and an output's is not (a custom op, control flow); every unknown value comes from them
    unknown_ops: list[str] = field(default_factory=list)
    #: nodes left uncosted that matter: a matmul, conv, attention or normalisation that reads or writes a value of
    #: unknown shape, or a custom-domain node whose output's shape is unknown (its work is anyone's guess); a mask or
    #: position-id computation whose dims inference loses (CLIP's, T5's position buckets) does not count
    uncosted_heavy: int = 0
    #: matmul and conv nodes inside If/Loop/Scan subgraphs: not costed (how often a loop runs is a runtime value)
    subgraph_heavy: int = 0
    #: weights that Gather nodes look rows up in (token-embedding tables): a runtime keeps them as stored,
    #: never repacked for a matmul, so memory counts them apart
    table_bytes: float = 0.0
    #: (bytes, offset in its file) of each lookup table left mapped from the model's files (``Graph.external_refs``:
    #: SDXL's second text encoder's 253 MB OpenCLIP token table, in its ``model.onnx_data``): a CPU runtime that runs
    #: from the mapped weights where their offset suits it (ggml: 64-byte aligned) touches only the rows it looks up, so
    #: the table never becomes resident (``sdrt.cost.model.MAPPED_TABLE_BACKENDS``)
    mapped_tables: tuple[tuple[float, int], ...] = ()
    #: the largest dense conv kernel wider than 1x1, and the largest other weight: what a runtime holds in
    #: flight while it transforms or repacks one tensor at compile time (a transient on top of the rest)
    largest_conv_bytes: float = 0.0
    largest_weight_bytes: float = 0.0
    #: the activations' peak where attention runs as one fused kernel (its scores and probabilities, from
    #: the QK^T matmul through the softmax, never held): what the CPU runtimes that fuse attention hold
    peak_activation_bytes_fused: float | None = None
    #: the same (attention fused) where elementwise nodes write into an input that dies at them
    #: (``_INPLACE``), as a runtime's allocator does
    peak_activation_bytes_inplace: float | None = None
    #: the graph's inputs and its outputs apart (``io_bytes`` is their sum)
    input_bytes: float = 0.0
    output_bytes: float = 0.0
    #: weights in tensors under ``SMALL_TENSOR_BYTES`` each, as float32 (the file's weights, whatever the precision):
    #: what a runtime allocates for them while compiling (copies, transformed kernels) comes from the C heap, which
    #: keeps it resident after it is freed
    small_weight_bytes: float = 0.0
    #: weights of matmuls whose output (past a bias) only elementwise nodes but adds read: an activation the runtime fuses
    #: into the matmul (OpenVINO prepares such a matmul's weights at the first run in a graph with dynamic dims)
    epilogue_weight_bytes: float = 0.0
    #: nodes of shape arithmetic (Shape and what folds from it at pinned shapes) in a graph whose inputs have
    #: dynamic dims: a runtime that compiles it as it is (dims left dynamic) runs them, and infers shapes, every call
    dynamic_shape_nodes: int = 0
    #: the graph's inputs have dynamic dims (pinned here)
    dynamic: bool = False
    #: bytes read and written to copy, from channels-last to planar, the outputs of convs over fewer than
    #: ``RELAYOUT_CHANNELS`` channels that a Reshape regroups across channels (torch's GroupNorm): a runtime
    #: that runs its convs channels-last copies them there (``_relayout_bytes``)
    relayout_bytes: float = 0.0
    #: the same for convs over 16 or fewer channels (a pixel's channels fill one cache line: a cheaper copy)
    relayout_narrow_bytes: float = 0.0
    #: the largest of those conv outputs (one copy's bytes, any width under ``RELAYOUT_CHANNELS``): what such a runtime
    #: holds at the peak beside the activations that liveness counts (the planar copy for the norm, and the norm's
    #: output copied back to channels-last for the next conv)
    largest_relayout_bytes: float = 0.0
    #: at a half precision (bf16, fp16): the float32 bytes, as the file holds them, of the matmul and conv weights that
    #: the precision halves (what a backend reads to make the half copy); 0 at other precisions
    half_source_bytes: float = 0.0
    #: every weight's bytes at the precision, in the order the graph's nodes first read it, and its kind: ``kernel`` (a
    #: dense conv kernel wider than 1x1), ``table`` (a lookup table) or ``weight``: a backend that converts its weights
    #: one at a time as it lowers the nodes (ggml) has one in flight at a time, on top of those read before it
    #: (``sdrt.cost.model.transient_bytes``)
    weight_order: tuple[tuple[float, str], ...] = ()
    #: beside ``weight_order``: for each kernel the output pixels an image of the largest map its convs write (0 for
    #: other weights, and for a kernel whose map is unknown)
    weight_order_pixels: tuple[int, ...] = ()
    #: at a half precision, ``peak_activation_bytes_inplace`` with the values of the graph's tail held float32
    #: (``float32_tail_values``: what a runtime that keeps the tail float32 holds); None: as ``peak_activation_bytes_inplace``
    peak_activation_bytes_tail: float | None = None
    #: the dense convs' im2col buffers (``NodeCost.im2col_bytes``): their sum (traffic) and the largest (memory: a runtime
    #: that convolves through im2col holds one at a time, beside the activations)
    im2col_bytes: float = 0.0
    largest_im2col_bytes: float = 0.0
    #: at a half precision, the activations that cross between the graph's float32 tail (``float32_tail_values``) and
    #: its half-precision body (``tail_crossings``): a runtime that keeps the tail float32 converts each of them with a
    #: node of its own every call (OpenVINO's runtime model of a text encoder that outputs every layer's hidden state at
    #: bf16: a ``Reorder`` before and after each residual add, 51 nodes against 39 at fp32); their count and the bytes
    #: the conversions read and write (float32 and half)
    tail_conversions: int = 0
    tail_conversion_bytes: float = 0.0

    def by_class(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for n in self.nodes:
            c = out.setdefault(n.op_class, {"nodes": 0, "flops": 0.0, "bytes": 0.0})
            c["nodes"] += 1
            c["flops"] += n.flops
            c["bytes"] += n.bytes
        return out

    @property
    def flops(self) -> float:
        return sum(n.flops for n in self.nodes)


def _prod(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def _elem_size(dtype: str, act: int) -> int:
    """Bytes of one element of an activation: floats at the compute dtype, others at their own size."""
    if dtype in ("float32", "float16", "bfloat16", "float64"):
        return act
    return {"int64": 8, "int32": 4, "bool": 1, "int8": 1, "uint8": 1, "int16": 2}.get(dtype, 4)


def graph_costs(graph: Graph, shapes: Mapping[str, Sequence[int] | int] | None = None, precision: str = "fp32",
                *, inferred: bool = False) -> GraphCost:
    """The cost of every node of ``graph`` with inputs pinned to ``shapes`` (see the module doc).
    ``inferred=True`` says ``graph`` came from ``with_shapes`` already (costing it at several precisions)."""
    if precision not in WEIGHT_BYTES:
        raise SdrtError(f"unknown precision {precision!r}", where="sdrt.cost.graph_costs(precision=...)",
                        fix=f"use one of: {', '.join(PRECISIONS)}")
    if not inferred:  # onnxruntime's contrib ops costed as the standard ops backends run
        graph = graph.without_contrib_ops()
    g = graph if inferred else graph.with_shapes(dict(shapes or {})) if shapes else graph.with_shapes()
    infos = g.value_infos()
    model = g.model
    act = ACT_BYTES[precision]
    inits = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    consts: dict[str, tuple[int, ...]] = {}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = tuple(int(d) for d in a.t.dims)

    # values whose rank inference could not tell: TensorInfo shows them as (), which is a scalar's shape
    no_rank = {v.name for v in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)
               if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")}

    def shape(name: str) -> tuple[int, ...] | None:
        if name in inits:
            return inits[name]
        if name in consts:
            return consts[name]
        info = infos.get(name)
        if info is None or name in no_rank or any(not isinstance(d, int) for d in info.shape):
            return None
        return tuple(info.shape)

    def dtype(name: str) -> str:
        info = infos.get(name)
        return info.dtype if info is not None else "float32"

    dyn = [str(i) for i in g.inputs if any(not isinstance(d, int) for d in i.shape)]
    if dyn:
        raise SdrtError(f"inputs of {graph.name} keep dynamic dims: {', '.join(dyn)}",
                        where="sdrt.cost.graph_costs", fix="pin every dynamic input's shape")
    unknown = [o for n in model.graph.node if n.op_type not in VIEW_OPS for o in n.output if o and shape(o) is None]
    lost = set(unknown)
    unknown_ops = sorted({(f"{n.domain}:" if n.domain not in ("", "ai.onnx") else "") + n.op_type
                          for n in model.graph.node if any(o in lost for o in n.output)
                          and not any(i in lost for i in n.input)})
    uncosted_heavy = sum(1 for n in model.graph.node if (
        (_op_class(n, inits, consts) in ("matmul", "conv", "attention", "norm") and any(v in lost for v in [*n.input, *n.output]))
        or (n.domain not in ("", "ai.onnx") and any(o in lost for o in n.output))))
    weight_elem: dict[str, float] = {}  # initializer -> bytes per element, as its heaviest user reads it
    origin: dict[str, set[str]] = {name: {name} for name in inits}  # constant value -> initializers it comes from
    for name in consts:
        origin[name] = set()
    nodes: list[NodeCost] = []
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            if i:
                readers[i] = readers.get(i, 0) + 1
    for o in model.graph.output:
        readers[o.name] = readers.get(o.name, 0) + 1
    # SiLU as torch exports it, Mul(x, Sigmoid(x)), is one kernel in the runtimes (ggml's group norm + SiLU,
    # OpenVINO's Swish in the norm's subgraph): x read by only its Sigmoid and that Mul counts as read once
    mul_operands = [set(m.input) for m in model.graph.node if m.op_type == "Mul"]  # once, not per Sigmoid
    heads = _head_transposes(model, set(inits) | set(consts))
    for n in model.graph.node:
        if n.op_type == "Sigmoid" and n.input and n.output and readers.get(n.input[0]) == 2 and any(
                n.input[0] in m and n.output[0] in m for m in mul_operands):
            readers[n.input[0]] = 1
    tail = float32_tail_values(model) if act < 4 else set()
    writer_class: dict[str, str] = {}
    shape_vals: set[str] = set()
    shape_nodes = 0
    for n in model.graph.node:
        ins = [i for i in n.input if i]
        out_shapes = [shape(o) or () for o in n.output if o]
        op = n.op_type
        if op in ("Shape", "Size") and ins and shape(ins[0]) is not None:  # static at pinned shapes: a constant
            for o in n.output:
                if o:
                    origin[o] = set()
                    consts.setdefault(o, shape(o) or ())
                    shape_vals.add(o)
            shape_nodes += 1
            continue
        if n.op_type != "Constant" and all(i in origin for i in ins):  # folds at compile time: free
            for o in n.output:
                if o:
                    origin[o] = set().union(*(origin[i] for i in ins)) if ins else set()
                    consts.setdefault(o, shape(o) or ())
            if any(i in shape_vals for i in ins):  # shape arithmetic: a runtime that keeps dims dynamic runs it
                shape_vals.update(o for o in n.output if o)
                shape_nodes += 1
            continue
        cls = _op_class(n, origin, {})
        if op == "Cast" and ins and n.output and dtype(ins[0]) == dtype(n.output[0]):
            cls = "view"  # a Cast to the type its input has (diffusers' exports hold dozens): every runtime drops it
        w_read = 0.0
        a_read = 0.0
        for idx, i in enumerate(ins):
            s = shape(i)
            if s is None:
                continue
            if i in inits or i in consts:
                quantizable = cls in ("matmul", "conv") and len(s) >= 2 and idx == 1
                per = WEIGHT_BYTES[precision] if quantizable else act
                for src in origin.get(i, ()):
                    weight_elem[src] = max(weight_elem.get(src, 0.0), per)
                if cls not in ("view",):
                    w_read += _prod(s) * per
            elif cls != "view":
                a_read += _prod(s) * _elem_size(dtype(i), act)
        if op in ("Gather", "GatherElements", "GatherND") and ins and ins[0] in origin:  # a lookup reads the rows taken
            w_read = min(w_read, _prod(out_shapes[0]) * act if out_shapes else 0.0)
        written = 0.0 if cls == "view" else sum(_prod(s) * _elem_size(dtype(o), act)
                                                  for o, s in zip([o for o in n.output if o], out_shapes))
        if op == "Slice":  # reads the region it takes (GEGLU's halves: half its input each), not the whole input
            a_read = min(a_read, written)
        flops = _flops(n, cls, [shape(i) for i in ins], out_shapes)
        fused = cls == "elementwise" and any(
            writer_class.get(i) in _FUSES_INTO and readers.get(i, 0) == 1 for i in ins if i not in origin)
        for o in n.output:
            writer_class[o] = cls
        w_at = _WEIGHT_AT.get(op, 1)
        kind = _time_kind(n, cls, shape(ins[w_at]) if len(ins) > w_at else None, out_shapes[0] if out_shapes else None)
        if cls != "view" and not kind and all(_integer(dtype(v)) for v in [o for o in n.output if o]
                                              + [i for i in ins if i not in origin]):
            kind = "int"  # integer work on integer values (token ids): a runtime may run it on the host
        elif (cls == "conv" and not kind and a_read + written > LARGE_CONV_BYTES and len(ins) > 1
              and (shape(ins[1]) or (0, 0))[1] > NARROW_CONV_CHANNELS):
            kind = "conv_large"
        in0 = shape(ins[0]) if ins else None
        batch = int(in0[0]) if cls == "conv" and in0 and len(in0) > 2 else 1
        kernel = None
        if cls == "attention" and op == "MatMul" and ins and shape(ins[0]) and 0 < shape(ins[0])[-1] < MIN_DOT:
            kernel = float(flops) * MIN_DOT / shape(ins[0])[-1]  # a reduction shorter than a vector: padded to one
        rows = _prod(out_shapes[0][:-1]) if cls == "attention" and op == "Softmax" and out_shapes and out_shapes[0] else 0
        w_shape = shape(ins[1]) if op == "Conv" and len(ins) > 1 else None
        im2col = 0.0
        if (w_shape and len(w_shape) > 2 and _prod(w_shape[2:]) > 1 and w_shape[0] and out_shapes and out_shapes[0]
                and next((a.i for a in n.attribute if a.name == "group"), 1) == 1):
            im2col = _prod(out_shapes[0]) / w_shape[0] * _prod(w_shape[1:]) * act
        nodes.append(NodeCost(n.name or f"{op}_{len(nodes)}", op, cls, float(flops), a_read + w_read, written,
                              w_read, fused, kind, batch, kernel, rows, float(im2col),
                              head=op == "Transpose" and bool(n.output) and n.output[0] in heads,
                              pixels=_prod(out_shapes[0][2:]) if cls == "conv" and out_shapes and len(out_shapes[0]) > 2
                              else 0,
                              channels=int(w_shape[0]) if cls == "conv" and w_shape and w_shape[0] else 0))
    sizes = {name: _prod(s) * weight_elem.get(name, act) for name, s in inits.items()}
    weight_bytes = sum(sizes.values())
    tables: set[str] = set()
    kernels: set[str] = set()
    kernel_px: dict[str, int] = {}
    for n in model.graph.node:
        ins = list(n.input)
        if n.op_type in ("Gather", "GatherND") and ins and ins[0] in origin:
            tables |= origin[ins[0]]
        elif (n.op_type == "Conv" and len(ins) > 1 and ins[1] in origin and len(inits.get(ins[1], ())) > 2
              and any(k > 1 for k in inits[ins[1]][2:])
              and next((a.i for a in n.attribute if a.name == "group"), 1) == 1):
            kernels |= origin[ins[1]]
            out_shape = shape(n.output[0]) if n.output and n.output[0] else None
            px = _prod(out_shape[2:]) if out_shape and len(out_shape) > 2 else 0
            for src in origin[ins[1]]:  # the largest map a kernel serves (0: unknown, counted as transformed)
                known = px > 0 and kernel_px.get(src, px) > 0
                kernel_px[src] = max(kernel_px.get(src, 0), px) if known else 0
    tables &= set(sizes)
    order: list[tuple[float, str]] = []
    order_px: list[int] = []
    seen: set[str] = set()
    for n in model.graph.node:
        for i in n.input:
            for src in sorted(origin.get(i, ())) if i else ():
                if src in sizes and src not in seen:
                    seen.add(src)
                    order.append((float(sizes[src]), "kernel" if src in kernels else "table" if src in tables
                                  else "weight"))
                    order_px.append(kernel_px.get(src, 0) if src in kernels else 0)
    # as float32, the weights as the file holds them: a tensor under 1 MiB there is read into the process (larger
    # ones are mapped, sdrt.graph.onnxfile.MAP_INLINE_MIN_BYTES), whatever precision the backend makes of it
    small = sum(4.0 * _prod(s) for s in inits.values() if 4 * _prod(s) < SMALL_TENSOR_BYTES)
    epilogue_w = _epilogue_weight_bytes(model, origin, {c.name: c for c in nodes})
    peak = _peak_activations(model, shape, dtype, act, set(inits) | set(consts))
    scores = _attention_scores(model, origin)
    peak_fused = _peak_activations(model, shape, dtype, act, set(inits) | set(consts), scores) if scores else peak
    peak_inplace = _peak_activations(model, shape, dtype, act, set(inits) | set(consts), scores, inplace=True)
    crossings = tail_crossings(model, tail, set(inits) | set(consts) | set(origin), dtype) if tail else set()
    peak_tail = _peak_activations(model, shape, dtype, act, set(inits) | set(consts), scores, inplace=True,
                                  wide=tail) if tail else peak_inplace
    ins_b, outs_b = (sum(_prod(shape(v.name) or ()) * _elem_size(dtype(v.name), act) for v in vs if v.name not in inits)
                     for vs in (model.graph.input, model.graph.output))
    io = ins_b + outs_b
    pinned = {i.name: tuple(i.shape) for i in g.inputs}
    dynamic = any(not isinstance(d, int) for i in graph.inputs for d in i.shape)
    relayout, relayout_narrow, relayout_largest = _relayout_bytes(model, shape, dtype, act)
    half = WEIGHT_BYTES[precision] if precision in ("bf16", "fp16") else None
    half_source = sum(4.0 * _prod(s) for name, s in inits.items() if half is not None and weight_elem.get(name) == half)
    return GraphCost(graph.name, precision, nodes, float(weight_bytes), float(peak), float(io), pinned, unknown,
                     unknown_ops=unknown_ops, uncosted_heavy=uncosted_heavy, subgraph_heavy=_subgraph_heavy(model.graph),
                     table_bytes=float(sum(sizes[t] for t in tables)), peak_activation_bytes_fused=float(peak_fused),
                     mapped_tables=tuple((float(sizes[t]), ref.offset) for t in sorted(tables)
                                         if (ref := g.external_refs.get(t)) is not None),
                     peak_activation_bytes_inplace=float(peak_inplace), input_bytes=float(ins_b),
                     output_bytes=float(outs_b), small_weight_bytes=float(small),
                     epilogue_weight_bytes=float(epilogue_w),
                     largest_conv_bytes=float(max((sizes[k] for k in kernels if k in sizes), default=0.0)),
                     im2col_bytes=float(sum(c.im2col_bytes for c in nodes)),
                     largest_im2col_bytes=float(max((c.im2col_bytes for c in nodes), default=0.0)),
                     # lookup tables apart: kept as stored, never transformed or repacked (``table_bytes``)
                     largest_weight_bytes=float(max((v for k, v in sizes.items() if k not in kernels and k not in tables),
                                                    default=0.0)),
                     dynamic_shape_nodes=shape_nodes if dynamic else 0, dynamic=dynamic,
                     relayout_bytes=float(relayout), relayout_narrow_bytes=float(relayout_narrow),
                     largest_relayout_bytes=float(relayout_largest), half_source_bytes=float(half_source),
                     weight_order=tuple(order), weight_order_pixels=tuple(order_px),
                     peak_activation_bytes_tail=float(peak_tail),
                     tail_conversions=len(crossings),
                     tail_conversion_bytes=float(sum(_prod(shape(v) or ()) * (4 + act) for v in crossings)))


#: convs with fewer output channels than this have their output copied to planar layout by a channels-last
#: runtime where a Reshape regroups channels: OpenVINO 2025's CPU plugin runs the VAE's convs channels-last and
#: copies a 32- or 64-channel output with its reference reorder (0.8 ms for 1 MiB, 6.3 ms for 4 MiB here), a
#: 128-channel or wider one with a fast one (0.03 ms for 2 MiB), which the conv's own traffic already covers
RELAYOUT_CHANNELS = 128


def _relayout_bytes(model: Any, shape: Any, dtype: Any, act: int) -> tuple[float, float, float]:
    """Bytes (read + written) of the layout copies a channels-last runtime makes before Reshapes that regroup
    a conv's output across channels (4-D ``N, C, H, W`` to a shape whose second dim is not ``C``: torch's
    GroupNorm), for convs with fewer than ``RELAYOUT_CHANNELS`` channels. The conv may reach the Reshape through
    elementwise nodes (a residual add, a scale: its epilogue). Returns (bytes of convs over 17 or more channels,
    of convs over 16 or fewer: a pixel's channels fill one 64-byte line, and the copy runs 2-2.5 x faster per
    byte here: 0.31 ms per MiB at 16 channels, 0.75-0.78 at 32 and 64), and the largest such output (one copy's
    bytes, not read + written: the memory a copy takes)."""
    writer = {o: n for n in model.graph.node for o in n.output if o}
    total, narrow, largest = 0.0, 0.0, 0.0
    for n in model.graph.node:
        if n.op_type != "Reshape" or not n.input or not n.output:
            continue
        src, out = shape(n.input[0]), shape(n.output[0])
        if src is None or out is None or len(src) != 4 or (len(out) > 1 and out[1] == src[1]):
            continue
        w, hops = writer.get(n.input[0]), 0
        while w is not None and w.op_type in ("Add", "Sub", "Mul", "Div") and hops < 3:
            w, hops = writer.get(w.input[0]), hops + 1
        if w is not None and w.op_type == "Conv" and src[1] < RELAYOUT_CHANNELS:
            b = 2 * _prod(src) * _elem_size(dtype(n.input[0]), act)
            largest = max(largest, b / 2)
            if src[1] <= 16:
                narrow += b
            else:
                total += b
    return total, narrow, largest


def _epilogue_weight_bytes(model: Any, origin: dict[str, set[str]], costs: dict[str, NodeCost]) -> float:
    """The weight bytes of matmuls with a weight operand whose output, past a bias (Add/Sub of a weight), only
    elementwise nodes (``_INPLACE``) other than adds read: a fused activation (a GELU, a ReLU, a scale), not a
    residual."""
    readers = _readers(model.graph.node)
    total = 0.0
    for k, n in enumerate(model.graph.node):
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2 or n.input[1] not in origin or n.input[0] in origin:
            continue
        v = n.output[0]
        rs = readers.get(v, [])
        if len(rs) == 1 and rs[0].op_type in ("Add", "Sub") and any(i in origin for i in rs[0].input if i != v):
            v = rs[0].output[0]  # a bias
            rs = readers.get(v, [])
        if rs and all(r.op_type in _INPLACE and r.op_type not in ("Add", "Sub") for r in rs):  # not a residual
            c = costs.get(n.name or f"{n.op_type}_{k}")
            total += c.weight_bytes if c is not None else 0.0
    return total


def _readers(nodes: Any) -> dict[str, list[Any]]:
    """The nodes that read each value, in node order."""
    readers: dict[str, list[Any]] = {}
    for n in nodes:
        for i in n.input:
            if i:
                readers.setdefault(i, []).append(n)
    return readers


def _integer(dtype: str) -> bool:
    return dtype == "bool" or dtype.startswith(("int", "uint"))


#: a weight matmul over fewer rows than this (a text encoder's 77 tokens, a UNet's cross-attention keys) runs at an
#: efficiency of its own (``matmul_narrow``): OpenVINO's bf16 (AMX) MLPs of 768 x 3072 reached 0.19-0.21 of the peak
#: at 32-77 rows, 0.29-0.37 at 128-154 and 0.41-0.44 from 256 rows up (Sapphire Rapids), where float32 ran alike at
#: every width from 32 rows; one matmul efficiency put CLIP's bf16 time at 0.40-0.45 of what it measured
NARROW_ROWS = 256


def _time_kind(n: Any, cls: str, kernel: tuple[int, ...] | None = None,
               out: tuple[int, ...] | None = None) -> str:
    if cls == "matmul" and out and len(out) >= 2 and 0 < _prod(out[:-1]) < NARROW_ROWS:
        return "matmul_narrow"
    if cls == "conv" and next((a.i for a in n.attribute if a.name == "group"), 1) > 1:
        return "dwconv"
    if n.op_type in ("Conv", "QLinearConv") and kernel is not None and len(kernel) > 2 and all(k == 1 for k in kernel[2:]):
        return "conv1x1"  # a plain GEMM: no Winograd, no kernel transform
    if n.op_type in ("Softmax", "LogSoftmax"):
        return "softmax"
    if n.op_type in ("InstanceNormalization", "GroupNormalization"):  # a reduction over a whole map per group
        return "groupnorm"
    return ""


def _op_class(n: Any, inits: Mapping[str, Any], consts: Mapping[str, Any]) -> str:
    op = n.op_type
    if n.domain not in ("", "ai.onnx"):
        if op in ("Attention", "MultiHeadAttention", "GroupQueryAttention"):
            return "attention"
        if "Norm" in op:
            return "norm"
        if op in ("MatMulNBits", "QMoE", "FusedMatMul"):
            return "matmul"
        if op in ("NhwcConv", "FusedConv", "QLinearConv"):
            return "conv"
        return "elementwise"
    if op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv"):
        return "conv"
    if op in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "Einsum"):
        operands = [n.input[0], n.input[3]] if op == "QLinearMatMul" and len(n.input) > 3 else n.input[:2]
        weights = [i for i in operands if i in inits or i in consts]
        return "matmul" if weights else "attention"
    if op in ("Softmax", "LogSoftmax", "Attention"):
        return "attention"
    if op in _NORM:
        return "norm"
    if op in VIEW_OPS:
        return "view"
    if op in _DATA:
        return "data"
    return "elementwise"


#: where an op's weight (its matmul matrix or conv kernel) sits among its inputs, where it is not the second
_WEIGHT_AT = {"QLinearConv": 3, "QLinearMatMul": 3}


def _flops(n: Any, cls: str, ins: list[tuple[int, ...] | None], outs: list[tuple[int, ...]]) -> float:
    op = n.op_type
    out = outs[0] if outs else ()
    w_at = _WEIGHT_AT.get(op, 1)
    if op in ("Conv", "ConvInteger", "QLinearConv", "FusedConv", "NhwcConv") and len(ins) > w_at and ins[w_at]:
        w = ins[w_at]  # (Cout, Cin/groups, k...); QLinearConv's comes after its input's scale and zero point
        return 2.0 * _prod(out) * _prod(w[1:])
    if op == "ConvTranspose" and ins[1] is not None and ins[0] is not None:
        w = ins[1]  # (Cin, Cout/groups, k...): every input element scatters into Cout/g * prod(k) outputs
        return 2.0 * _prod(ins[0]) * _prod(w[1:])
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul") and ins[0] is not None:
        k = ins[0][-1] if ins[0] else 1
        return 2.0 * _prod(out) * k
    if op == "MatMulNBits":  # com.microsoft: K and N are attributes (the weight is packed blocks)
        return 2.0 * _prod(out) * next((a.i for a in n.attribute if a.name == "K"), 0)
    if op in ("Gemm", "FusedMatMul") and ins[0]:
        trans_a = next((a.i for a in n.attribute if a.name == "transA"), 0)
        k = ins[0][-2] if trans_a and len(ins[0]) > 1 else ins[0][-1]
        return 2.0 * _prod(out) * k + (_prod(out) if op == "Gemm" and len(ins) > 2 else 0)
    if op == "Attention" and n.domain == "com.microsoft" and len(ins) > 1 and ins[0] and ins[1] and len(ins[0]) == 3:
        # packed QKV: input (B, S, Hin) @ weights (Hin, Hq + Hk + Hv), then QK^T and PV over S keys
        b, seq, hin = ins[0]
        sizes = next((list(a.ints) for a in n.attribute if a.name == "qkv_hidden_sizes"), None) or [ins[1][-1] // 3] * 3
        heads = next((a.i for a in n.attribute if a.name == "num_heads"), 1)
        return 2.0 * b * seq * hin * ins[1][-1] + 2.0 * b * seq * seq * (sizes[0] + sizes[2]) + 5.0 * b * heads * seq * seq
    if op == "MultiHeadAttention" and len(ins) > 2 and ins[0] and ins[1] and len(ins[0]) == 3 and len(ins[1]) == 3:
        b, seq, d = ins[0]  # separate query (B, S, D), key (B, L, D) and value: QK^T and PV over L keys
        heads = next((a.i for a in n.attribute if a.name == "num_heads"), 1)
        return 4.0 * b * seq * ins[1][1] * d + 5.0 * b * heads * seq * ins[1][1]
    if op == "Einsum" and all(ins):
        return _einsum_flops(n, ins, out)
    if op in ("Softmax", "LogSoftmax"):
        return 5.0 * _prod(out)
    if cls == "norm":
        src = ins[0] if ins and ins[0] is not None else out
        return float(_NORM_FLOPS * _prod(src)) if "Normalization" in op else float(_prod(src))
    if cls == "attention":  # Einsum of activations, com.microsoft.Attention: shapes say too little
        return 2.0 * _prod(out) * (ins[0][-1] if ins and ins[0] else 1)
    if cls == "elementwise":
        return float(_ACT_HEAVY.get(op, 1) * _prod(out))
    return 0.0


def _subgraph_heavy(graph: Any, inside: bool = False) -> int:
    """MatMul/Gemm/Conv (and their quantized and com.microsoft forms) in the subgraphs of ``graph``'s nodes."""
    from onnx import AttributeProto

    count = 0
    for n in graph.node:
        if inside and (n.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Attention")
                       or n.op_type.startswith(("QLinear", "MatMul", "FusedMatMul", "FusedConv"))):
            count += 1
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                count += _subgraph_heavy(a.g, True)
            elif a.type == AttributeProto.GRAPHS:
                count += sum(_subgraph_heavy(g, True) for g in a.graphs)
    return count


def _einsum_flops(n: Any, ins: list[Any], out: tuple[int, ...]) -> float:
    """An Einsum's multiply-adds, 2 per product of one size of every index letter (``bij,bjk->bik``: 2*b*i*j*k);
    an ellipsis's dims are read off the output (batch dims every operand shares)."""
    eq = next((a.s.decode() for a in n.attribute if a.name == "equation"), "").replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    if len(lhs) != len(ins):
        return 2.0 * _prod(out)
    sizes: dict[str, int] = {}
    ellipsis = 1
    for term, shape in zip(lhs, ins):
        letters = term.replace("...", "")
        if "..." in term:
            ellipsis = max(ellipsis, _prod(shape[:len(shape) - len(letters)]) if len(shape) >= len(letters) else 1)
            head, _, tail = term.partition("...")
            dims = list(shape[:len(head)]) + list(shape[len(shape) - len(tail):] if tail else [])
        else:
            dims = list(shape)
        for ch, d in zip(letters, dims):
            sizes[ch] = max(sizes.get(ch, 1), int(d))
    return 2.0 * ellipsis * _prod(list(sizes.values()))


#: what a head transpose passes through on its way to or from attention's matmuls: views, a no-op Cast, the scale
_HEAD_PATH = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Cast", "Mul", "Div"}


def _head_transposes(model: Any, constant: set[str]) -> set[str]:
    """The outputs of the Transposes that split heads before attention's matmuls (Q, K, V) and merge them after,
    reaching a matmul of two activations through views, transposes, a no-op Cast or the scale (a Mul or Div by a
    constant). A CPU runtime runs them as strides of its attention (OpenVINO's MHA and brgemm matmuls; sdrt-ggml's
    attention rewrite takes permuted views), not as copies: OpenVINO's profile of the SD 1.5 UNet runs 32 of its 160
    Transposes, those beside the 1x1 proj_in/proj_out, and none of the 128 head ones. ggml's GPU backends copy them
    (``model.copies_heads``)."""
    readers: dict[str, list[Any]] = {}
    writer: dict[str, Any] = {}
    const = set(constant)
    for n in model.graph.node:  # values that fold at compile time (shapes pinned): a weight's transpose is not a head's
        if n.op_type in ("Shape", "Size") or all(i in const for i in n.input if i):
            const.update(o for o in n.output if o)
        for i in n.input:
            if i:
                readers.setdefault(i, []).append(n)
        for o in n.output:
            if o:
                writer[o] = n

    def act_matmul(n: Any) -> bool:
        return n.op_type == "MatMul" and not any(i in const for i in n.input[:2])

    def passes(n: Any) -> bool:
        return n.op_type in _HEAD_PATH and (n.op_type not in ("Mul", "Div") or any(i in const for i in n.input))

    def down(v: str, depth: int) -> bool:
        rs = [r for r in readers.get(v, []) if r.op_type not in ("Shape", "Size")]
        return bool(rs) and all(act_matmul(r) or (depth < 4 and passes(r) and r.output and down(r.output[0], depth + 1))
                                for r in rs)

    def up(v: str, depth: int) -> bool:
        w = writer.get(v)
        if w is None:
            return False
        if act_matmul(w):
            return True
        return depth < 4 and w.op_type in _HEAD_PATH and w.op_type not in ("Mul", "Div") and bool(w.input) and up(
            w.input[0], depth + 1)

    return {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input and n.output
            and n.input[0] not in const and (down(n.output[0], 0) or up(n.input[0], 0))}


def _attention_scores(model: Any, origin: Mapping[str, Any]) -> set[str]:
    """The values inside attention: each Softmax's output when only matmuls of two activations read it, and
    its input back through elementwise nodes (scale, mask) to the QK^T matmul of two activations."""
    writer = {o: n for n in model.graph.node for o in n.output if o}
    readers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            if i:
                readers.setdefault(i, []).append(n)

    def act_matmul(n: Any) -> bool:
        return n.op_type == "MatMul" and not any(i in origin for i in n.input[:2])

    out: set[str] = set()
    for n in model.graph.node:
        if n.op_type != "Softmax" or not n.input or not n.output:
            continue
        if all(act_matmul(r) for r in readers.get(n.output[0], [])):
            out.add(n.output[0])
        chain, v = [], n.input[0]
        while v in writer and len(readers.get(v, [])) == 1:
            w = writer[v]
            chain.append(v)
            if act_matmul(w):
                out.update(chain)
                break
            if w.op_type not in ("Mul", "Div", "Add", "Sub", "Where", "Cast") or not w.input:
                break
            v = next((i for i in w.input if i and i not in origin), "")
    return out


#: a weight tensor under this size is "small" (``GraphCost.small_weight_bytes``): measured here, the compile
#: memory of 0.56 MiB kernels stayed resident after compiling (OpenVINO and ggml), that of 3.5-56 MiB kernels went
#: back (the C allocator maps large blocks apart and returns them when freed)
SMALL_TENSOR_BYTES = 2**20

#: the ops that OpenVINO's CPU plugin runs at a half inference precision wherever they are (its
#: ``Graph::EnforceInferencePrecision``: Convolution, FullyConnected, MatMul, Interpolate, RNNs, ROIPooling)
_HALF_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Resize", "Upsample", "LSTM", "GRU", "RNN", "MaxRoiPool"}


def float32_tail_values(model: Any) -> set[str]:
    """The values of a graph's tail: those written by a node from which an output is reached without passing a
    ``_HALF_OPS`` node. OpenVINO's CPU plugin at bf16 keeps them float32, for accuracy (it walks back from each
    output and stops at those ops), and runs the rest at bf16: a graph without such ops (a SiLU, a norm, a
    transpose) runs wholly in float32, the tail of a VAE decoder after its last conv (nothing but the output) at
    bf16 (its runtime model: the calibration's SiLU and GroupNorm cases all f32 layers, a 3x3 conv -> GroupNorm
    case its convs bf16 and its last norm f32)."""
    writer = {o: n for n in model.graph.node for o in n.output if o}
    tail: set[str] = set()
    todo = [o.name for o in model.graph.output]
    while todo:
        v = todo.pop()
        n = writer.get(v)
        if v in tail or n is None or n.op_type in _HALF_OPS:
            continue
        tail.add(v)
        todo.extend(i for i in n.input if i)
    return tail


def tail_crossings(model: Any, tail: set[str], constant: set[str], dtype: Any = None) -> set[str]:
    """The activations that cross between a graph's float32 tail (``tail``: ``float32_tail_values``) and its half body:
    a body value (written by a node outside the tail) that a tail node reads (half -> float32), and a tail value that a
    body node reads (float32 -> half), each once however many nodes read it across (one conversion feeds them all).
    Constants (``constant``: initializers and what folds from them), the graph's inputs (their conversion is the
    call's, ``GraphCost.io_bytes``) and integer values (never converted) do not cross. OpenVINO's CPU plugin at bf16
    runs such a conversion as a ``Reorder`` node of its own: in a text encoder whose outputs are every layer's hidden
    state (SDXL's), the residual stream is tail, and each layer converts it to bf16 for its norm and its
    projections' outputs back to float32 for the residual adds (12 ``Reorder`` nodes in the tiny SDXL text encoder's
    three layers)."""
    writer = {o: n for n in model.graph.node for o in n.output if o}
    inputs = {i.name for i in model.graph.input}
    integer = (lambda v: _integer(dtype(v))) if dtype is not None else (lambda v: False)

    def conv_epilogue(v: str) -> bool:  # v comes from a Conv, or through up to 3 elementwise nodes (its epilogue)
        for _ in range(4):
            w = writer.get(v)
            if w is None:
                return False
            if w.op_type in ("Conv", "ConvTranspose"):
                return True
            if _op_class(w, {}, {}) != "elementwise":
                return False
            v = next((i for i in w.input if i in writer and i not in constant), "")
        return False

    out: set[str] = set()
    for n in model.graph.node:
        outs = [o for o in n.output if o]
        if n.op_type in ("Shape", "Size") or (outs and all(integer(o) for o in outs)):
            continue  # reads a shape, or computes integers: nothing converted
        n_tail = any(o in tail for o in outs)
        for i in n.input:
            if not i or i not in writer or i in constant or i in inputs or integer(i) or (i in tail) == n_tail:
                continue
            if n_tail and _op_class(n, {}, {}) == "elementwise" and conv_epilogue(i):
                continue  # the conv runs this node as a post-op (a residual sum) and writes float32 itself
            if n_tail and n.op_type == "Reshape" and conv_epilogue(i):
                continue  # the conv's output copied to planar layout for a norm: that copy converts as it goes
            out.add(i)
    return out


#: elementwise ops that a runtime's allocator runs in place: the output takes the memory of an input of the
#: same size that no later node reads (ggml's graph allocator, OpenVINO's in-place edges)
_INPLACE = {"Add", "Sub", "Mul", "Div", "Sigmoid", "Tanh", "Relu", "Erf", "Clip", "Pow", "Sqrt", "Exp", "Neg",
            "Abs", "LeakyRelu", "HardSigmoid", "HardSwish", "Softplus", "Gelu", "Softmax"}


def _peak_activations(model: Any, shape: Any, dtype: Any, act: int, constant: set[str],
                      skip: set[str] | None = None, inplace: bool = False, wide: set[str] | frozenset[str] = frozenset()
                      ) -> float:
    """The largest total size of activations alive at once, running the nodes in file order. A value is
    alive from the node that writes it to the last node that reads it; views alias their input. ``skip``:
    values never held (inside a fused kernel). ``inplace``: an elementwise node (``_INPLACE``) whose input
    of the output's size dies at it writes into that input's memory (no graph input or output is reused),
    and SiLU as torch exports it (``Mul(x, Sigmoid(x))``) is one kernel (both CPU runtimes fuse it: ggml's
    group norm + SiLU, OpenVINO's Swish), so its sigmoid is never held. A Shape or Size node reads no data
    (its value is known once the shapes are), so it keeps nothing alive. ``wide``: values held float32 whatever
    ``act`` is (``float32_tail_values``)."""
    nodes = list(model.graph.node)
    if inplace:
        readers = _readers(nodes)
        skip = set(skip or ()) | {n.output[0] for n in nodes if n.op_type == "Sigmoid" and n.output and (
            rs := readers.get(n.output[0])) and all(r.op_type == "Mul" and n.input[0] in r.input for r in rs)}
    constant = constant | (skip or set())
    alias: dict[str, str] = {}
    for n in nodes:
        if n.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity") and n.input and n.output:
            src = n.input[0]
            alias[n.output[0]] = alias.get(src, src)
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for x in n.input:
            if x and n.op_type not in ("Shape", "Size"):
                last[alias.get(x, x)] = i
    outputs = {alias.get(o.name, o.name) for o in model.graph.output}
    for o in outputs:
        last[o] = len(nodes)
    size: dict[str, float] = {}
    live = 0.0
    for v in model.graph.input:
        if v.name not in constant and (s := shape(v.name)) is not None:
            size[v.name] = _prod(s) * _elem_size(dtype(v.name), act)
            live += size[v.name]
            last.setdefault(v.name, -1)
    peak = live
    graph_inputs = {v.name for v in model.graph.input}
    for i, n in enumerate(nodes):
        if n.op_type in VIEW_OPS:
            continue
        reused: set[str] = set()
        for o in n.output:
            if o and o not in alias and (s := shape(o)) is not None and o not in constant:
                size[o] = _prod(s) * _elem_size(dtype(o), 4 if o in wide else act)
                donor = next((x for x in (alias.get(x, x) for x in n.input if x) if inplace and n.op_type in _INPLACE
                              and o not in outputs and x in size and x not in graph_inputs and x not in outputs
                              and x not in reused and last.get(x) == i and size[x] == size[o]), None)
                if donor is not None:  # written into the donor's memory: the donor's bytes pass to the output
                    reused.add(donor)
                    live -= size.pop(donor)
                live += size[o]
                last.setdefault(o, i)
        peak = max(peak, live)
        for x in set(alias.get(x, x) for x in n.input if x):
            if last.get(x) == i and x in size and x not in outputs:
                live -= size.pop(x)
        for o in n.output:  # written but never read
            if o in size and last.get(o, i) <= i and o not in outputs:
                live -= size.pop(o)
    return peak
