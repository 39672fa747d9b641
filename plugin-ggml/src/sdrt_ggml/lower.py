"""Lowering: walk the ONNX nodes once and emit a ggml compute graph.

Values are either runtime tensors (``T``) in the compute context or numpy
constants. Nodes whose inputs are all constants are evaluated at compile time
(``fold``); constants that a ggml op needs become tensors in a separate weights
context, whose data the session wraps (the CPU: ``host_array``) or uploads once to a
backend buffer (other devices). Initializers remember which tensor
they went to so ``update_weights`` can rewrite them in place.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sdrt.errors import UnsupportedGraph
from sdrt.lowering import fold_node, node_inputs, producers_and_uses
from sdrt.weights.blocks import BlockMatrix
from sdrt.weights.pages import private_map, trim_heap
from sdrt.weights.pages import release as release_pages

from . import (
    quant,
    rewrites_dit,  # noqa: F401  (registers the RMSNorm and rotary-embedding rewrites)
    rewrites_epilogue,  # noqa: F401  (registers the conv and GEMM epilogue fusions)
)
from .layout_cache import Replay, Request
from .native import HOST_ALIGN, aligned_empty
from .ops import FOLD_ONLY, REGISTRY, load_all
from .ops._common import GTensor, HostValue, Value, ggml_lib, ne_merged, ne_of, unsupported, wide
from .ops.fold_wide import FOLDABLE, lower_folded
from .rewrites import OPTIONAL, REWRITES

log = logging.getLogger("sdrt.ggml.lower")

#: small integer and bool inputs are carried exactly in float32 tensors, through layout ops only
CARRIED = {"bool", "int8", "uint8", "int16", "uint16"}
#: ops that may read a value of more than four dims (``ops._common.wide``): they reshape or permute it, or
#: see it with the axes they treat alike merged (``ops._common.fold_shape``)
WIDE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Einsum", "Identity", "Concat"}
_INPUT_DTYPES = {"float32", "float16", "float64", "int64", "int32"} | CARRIED
#: ops that only move data: they accept carried integer tensors
LAYOUT_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile", "Concat", "Slice",
              "Split", "Identity", "Shape", "Size", "Cast", "Dropout", "Gather"}
_NP_TO_GGML = {"float32": "GGML_TYPE_F32", "float16": "GGML_TYPE_F16", "int32": "GGML_TYPE_I32"}


@functools.cache
def _no_op() -> Any:
    """A ggml custom-op callback that leaves its output as it is (kept alive for the process)."""

    def fill_nothing(_dst: Any, _ith: int, _nth: int, _userdata: Any) -> None:
        return None

    return ggml_lib().ggml_custom_op_t(fill_nothing)


#: a GGUF file's blocks are read in place when they are aligned so (GGUF aligns tensor data to 32 bytes)
BLOCK_ALIGN = 32


def host_array(data: np.ndarray, dtype: str, source: np.ndarray | None) -> np.ndarray:
    """``data`` as a C-contiguous ``dtype`` array this process owns, aligned for ggml's CPU buffers: kept as
    it is when it already is one and shares no memory with ``source`` (the initializer, which may be a
    read-only file mapping the caller keeps), else copied once into a fresh aligned array."""
    want = np.dtype(dtype)
    if (data.dtype == want and data.flags.c_contiguous and data.flags.writeable and data.nbytes
            and data.ctypes.data % HOST_ALIGN == 0 and (source is None or not np.may_share_memory(data, source))
            and source is not data):
        return data
    out = aligned_empty(data.shape, want)
    np.copyto(out, data, casting="unsafe")
    return out


#: the heap is trimmed (``sdrt.weights.pages.trim_heap``) each time this many bytes of weights were converted: the
#: temporaries of each converted weight (a bf16 panel's float32 copy and roundings) are freed between the weights kept,
#: and under glibc's mmap threshold the holes stayed resident until the session trimmed once at the end (forty 16 MiB
#: float32 matmul weights made bf16 peaked 443 MiB compiling, 379 with this; the SD 1.5 UNet 1675 either way, no
#: slower)
TRIM_EVERY_BYTES = 64 << 20

#: a weight kept as its file stores it is mapped from there (``Lowering.const``) from this size up; a smaller one is
#: copied (a map apiece would cost a page and a kernel mapping for a bias of a few kB)
MAP_MIN_BYTES = 64 << 10


@dataclass
class Binding:
    """An initializer uploaded to a weights tensor, through an optional transform."""

    name: str
    tensor: Any
    transform: Callable[[np.ndarray], np.ndarray] | None
    dtype: str


@dataclass
class Lowered:
    """What lowering produced: contexts, graph leaves and outputs, and the pending uploads."""

    ctx: Any
    wctx: Any
    inputs: dict[str, GTensor]
    outputs: dict[str, Value]
    pending: list[tuple[Any, np.ndarray]] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    folded_inits: set[str] = field(default_factory=set)
    #: scratch tensors created without an op (filled by set/cpy): the scheduler needs their backend
    scratch: list[Any] = field(default_factory=list)
    #: host-evaluated nodes, in order: (node, input refs) with refs ("const", array) / ("value", name)
    host_plan: list[tuple[Any, list[tuple[str, Any]]]] = field(default_factory=list)
    #: host values that ggml reads: name -> the input tensor they are copied into
    host_tensors: dict[str, GTensor] = field(default_factory=dict)
    #: graph inputs used as Gather indices: input name -> size of the gathered axis
    index_checks: dict[str, int] = field(default_factory=dict)
    n_ops: int = 0
    #: how many ggml tensors the compute context was sized for (the graph is sized from it)
    n_tensors: int = 0
    #: fused-kernel rewrites that matched ("attention": 2, ...)
    rewrite_hits: dict[str, int] = field(default_factory=dict)
    #: which implementation each op got, where there is a choice ("conv window": 12, ...)
    impl_hits: dict[str, int] = field(default_factory=dict)
    #: block weights (``BlockMatrix``: a GGUF file's, quant.py's) by type: kept as ggml blocks for mul_mat, or dequantized (other uses)
    blocks_kept: dict[str, int] = field(default_factory=dict)
    blocks_dequantized: dict[str, int] = field(default_factory=dict)
    #: the weights' layouts this lowering made for the compile cache, in order (``layout_cache.py``; host weights only)
    layouts: list[tuple[Request, np.ndarray]] = field(default_factory=list)


def ctypes_addr(p: Any) -> int:
    import ctypes

    return ctypes.cast(p, ctypes.c_void_p).value or 0


#: lowerings that take host values (H) as they are instead of as materialized tensors
_HOST_AWARE = {"GatherND", "Where"}


class Lowering:
    """State while lowering one graph. Op functions receive it as ``lowering``."""

    def __init__(
        self,
        nodes: Sequence[Any],
        initializers: Mapping[str, np.ndarray],
        input_infos: Sequence[tuple[str, tuple[int, ...], str]],
        output_names: Sequence[str],
        opsets: Mapping[str, int],
        *,
        options: Mapping[str, Any] | None = None,
        supports_flash_attn: bool = True,
        on_cpu: bool = True,
        host_weights: bool = False,
        device_backend: Any = None,
        replay: Replay | None = None,
    ) -> None:
        load_all()
        self.nodes = list(nodes)
        self.inits = dict(initializers)
        self.input_infos = list(input_infos)
        self.output_names = list(output_names)
        self.opsets = dict(opsets)
        self.options = dict(options or {})
        self.supports_flash_attn = supports_flash_attn
        #: CPU-only lowerings (the overlapping-window conv) are used only when this is true
        self.on_cpu = on_cpu
        #: the session keeps the weights in the arrays made here (``host_array``) instead of copying them
        #: into a ggml buffer
        self.host_weights = host_weights
        #: the ggml backend of a device that is not the CPU: rewrites that make an op the device may not take for
        #: every shape (flash attention) ask it, and lower the plain way where it says no
        self.device_backend = device_backend
        #: a compile cache entry's layouts (``layout_cache.Replay``), taken in place of making them
        self._replay = replay
        self.values: dict[str, Value] = {}
        self._producer, self._uses = producers_and_uses(self.nodes, self.output_names)
        wanted = self.options.get("rewrites", "all")
        self.rewrites_on = set(OPTIONAL) if wanted == "all" else set(wanted or ())
        self.rewrites_on.update(("gelu", "nan_guard"))  # needed for correctness
        self._rewrites = REWRITES
        self._init_ids = {id(a): n for n, a in self.inits.items()}
        self._const_cache: dict[tuple[int, str], GTensor] = {}
        self._keep: list[np.ndarray] = []
        self._converted = 0  # bytes of weights converted (``transform``) since the heap was last trimmed
        g = ggml_lib()
        n = len(self.nodes)
        # ggml tensors (ops and views) per ONNX node: a kxk conv built by row copies takes up to
        # 2 per kernel tap and padding strip (about 100 for 3x3); most other nodes take a handful
        heavy = sum(1 for nd in self.nodes if nd.op_type in ("Conv", "ConvTranspose"))
        self._n_tensors = 24 * n + 200 * heavy + 4 * len(self.inits) + 1024
        self.ctx = self._new_ctx(self._n_tensors * g.ggml_tensor_overhead() + (1 << 20))
        self.wctx = self._new_ctx((4 * n + len(self.inits) + 256) * g.ggml_tensor_overhead())
        self.out = Lowered(self.ctx, self.wctx, {}, {}, n_tensors=self._n_tensors)
        self.rewrite_hits = self.out.rewrite_hits
        #: native group norms by ONNX value name, for the rewrites that fuse the next ops into them
        self.gn_specs: dict[str, Any] = {}
        #: native convs and GEMMs by the address of their ggml tensor, for the epilogue fusions
        #: (rewrites_epilogue.py)
        self.conv_specs: dict[int, Any] = {}
        self.gemm_specs: dict[int, Any] = {}
        self.impl_hits = self.out.impl_hits
        #: GGUF block weights read as float32 by some op (``dequantized``), by the id of their BlockMatrix
        self._dequantized: dict[int, np.ndarray] = {}

    @staticmethod
    def _new_ctx(size: int) -> Any:
        g = ggml_lib()
        params = g.ggml_init_params(mem_size=int(size), mem_buffer=None, no_alloc=True)
        ctx = g.ggml_init(params)
        if not ctx:
            raise MemoryError(f"ggml_init failed for a context of {size} bytes")
        return ctx

    # -- constants -----------------------------------------------------------
    def const(self, arr: np.ndarray, *, transform: Callable[[np.ndarray], np.ndarray] | None = None,
              tag: str = "", dtype: str | None = None, ggml_type: str | None = None, store: bool = True,
              view: bool = False) -> GTensor:
        """A weights-buffer tensor holding ``transform(arr)`` (float data as float32). ``dtype``: the numpy
        type it is stored as; ``ggml_type``: the ggml type when it is not ``dtype``'s (``GGML_TYPE_BF16``
        stored as uint16 bit patterns, ``half.py``). ``store``: False for a layout the compile cache should not
        hold but remake at each load (layout_cache.py). ``view``: ``transform`` only reshapes (its result is a
        view of ``arr``'s bytes).

        A weight kept as its file stores it (no transform, or a ``view`` one; a float32 external-data tensor on a
        64-byte boundary, as ONNX aligns them) is mapped from that file copy-on-write (``private_map``), not
        copied: nothing is read while compiling, the pages count once, and no compile cache entry holds it."""
        key = (id(arr), tag)
        if key in self._const_cache:
            return self._const_cache[key]
        name = self._init_ids.get(id(arr))
        mapped = None
        if self.host_weights and (transform is None or view) and getattr(arr, "nbytes", 0) >= MAP_MIN_BYTES:
            shaped = transform(arr) if transform is not None else arr
            if dtype in (None, shaped.dtype.name) and shaped.dtype.kind == "f" and shaped.dtype.itemsize == 4:
                mapped = private_map(shaped, HOST_ALIGN)
        # a weight's layout (layout_cache.py): taken from a compile cache entry, or made and kept for one
        req = (Request.of(arr, tag, name, dtype) if self.host_weights and store and mapped is None
               and (transform is not None or name) else None)
        replayed = req is not None and self._replay is not None
        data = (mapped if mapped is not None else
                self._replay.take(req) if replayed else  # type: ignore[union-attr]
                transform(arr) if transform is not None else arr)
        if dtype is None:
            dtype = "int32" if data.dtype.kind in "iub" else "float32"
        if mapped is not None:
            self.used("weights mapped")
        else:
            data = (host_array(data, dtype, arr) if self.host_weights
                    else np.ascontiguousarray(data, dtype=np.dtype(dtype)))
        if req is not None and not replayed:
            self.out.layouts.append((req, data))
        if self.host_weights and not replayed and mapped is None:  # copied: the file pages read for it leave the
            release_pages([arr], quiet=True)  # RSS now, not after the whole graph (float32 SD 1.5 UNet: the peak
            # held the mapped 3.3 GB beside the copies)
        transform_ran = transform is not None and not replayed
        if transform_ran:  # its temporaries are freed now, between weights kept: give the holes back
            self._converted += data.nbytes
            if self._converted >= TRIM_EVERY_BYTES:
                trim_heap()
                self._converted = 0
        g = ggml_lib()
        ne = ne_of(data.shape)
        t = g.ggml_new_tensor_4d(self.wctx, getattr(g, ggml_type or _NP_TO_GGML[dtype]), *ne)
        if name is not None:
            g.ggml_set_name(t, name[:63].encode())
            self.out.bindings.append(Binding(name, t, transform, dtype))
        self.out.pending.append((t, data))
        self._keep.append(arr)  # keep id(arr) unique while cached
        value = GTensor(t, tuple(int(d) for d in data.shape), "int32" if dtype == "int32" else "float32")
        self._const_cache[key] = value
        return value

    def const_blocks(self, arr: Any, kind: str, rows: np.ndarray, k: int) -> GTensor:
        """A weights-buffer tensor of ggml block type ``kind`` (``"Q8_0"``...) holding ``rows`` (N rows of
        K values' blocks): ggml_mul_mat's first operand, shape (N, K). A GGUF file's blocks (``BlockMatrix``)
        are read where the file is mapped when they are aligned for ggml's CPU buffers (zero-copy: ggml never
        writes a weight, and ``update_weights`` of one lowers the graph again)."""
        key = (id(arr), f"blocks{kind}")
        if key in self._const_cache:
            return self._const_cache[key]
        g = ggml_lib()
        n = int(rows.shape[0])
        t = g.ggml_new_tensor_2d(self.wctx, getattr(g, f"GGML_TYPE_{kind}"), k, n)
        assert g.ggml_nbytes(t) == rows.nbytes, (kind, rows.shape)
        if isinstance(arr, BlockMatrix):
            name = self._init_ids.get(id(arr))
            if name is not None:
                g.ggml_set_name(t, name[:63].encode())
                self.out.folded_inits.add(name)  # no Binding: a changed value lowers the graph again
            self.out.blocks_kept[kind] = self.out.blocks_kept.get(kind, 0) + 1
            mapped = rows.flags.c_contiguous and rows.nbytes and rows.ctypes.data % BLOCK_ALIGN == 0
            data = rows if mapped or not self.host_weights else host_array(rows, rows.dtype.name, None)
            self.used("gguf_blocks_mapped" if mapped and self.host_weights else "gguf_blocks_copied")
        else:
            data = host_array(rows, rows.dtype.name, None) if self.host_weights else rows
        self.out.pending.append((t, data))
        self._keep.append(arr)
        self.used(f"mul_mat_{kind}")
        value = GTensor(t, (n, k))
        self._const_cache[key] = value
        return value

    def dequantized(self, bm: BlockMatrix) -> np.ndarray:
        """A GGUF block weight's float32 values, for an op other than a matmul on its blocks (once per weight;
        registered as the initializer, so the ops bind and fold it like any array)."""
        arr = self._dequantized.get(id(bm))
        if arr is None:
            arr = bm.dequantize()
            self._dequantized[id(bm)] = arr
            name = self._init_ids.get(id(bm))
            if name is not None:
                self._init_ids[id(arr)] = name
                self.out.folded_inits.add(name)  # a changed value lowers the graph again
            self.out.blocks_dequantized[bm.ggml_type] = self.out.blocks_dequantized.get(bm.ggml_type, 0) + 1
            self._keep.append(arr)
        return arr

    def _blocks_in(self, node: Any, ins: list[Any]) -> list[Any]:
        """``ins`` with every GGUF block weight dequantized except a MatMul's or Gemm's weight that ggml's
        quantized mul_mat takes as it is stored (a runtime float32 A, the reduction along the blocks)."""
        out = list(ins)
        for i, v in enumerate(ins):
            if isinstance(v, BlockMatrix) and not (i == 1 and self._mul_mat_blocks(node, ins)):
                out[i] = self.dequantized(v)
        return out

    def _transposed_blocks(self, node: Any, ins: list[Any]) -> bool:
        """A 2-D ``Transpose`` of a GGUF block weight (how torch's exporter writes ``x @ W.T``: the file's [out, in]
        weight, then a Transpose feeding the MatMul) is the same blocks read the other way: a flag on the
        ``BlockMatrix``, so the MatMul after it still takes the stored rows. Whether it was lowered so."""
        if node.op_type != "Transpose" or len(ins) != 1 or not isinstance(ins[0], BlockMatrix):
            return False
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if perm != [1, 0]:
            return False
        out = ins[0].T
        name = self._init_ids.get(id(ins[0]))
        if name is not None:
            self._init_ids[id(out)] = name
        self._keep.append(out)  # ids stay unique while the lowering runs
        self.values[node.output[0]] = out
        return True

    @staticmethod
    def _mul_mat_blocks(node: Any, ins: list[Any]) -> bool:
        a, b = ins[0], ins[1]
        if not isinstance(a, GTensor) or a.dtype != "float32" or wide(a) or a.rank < 2:
            return False
        if node.op_type == "MatMul":
            return len(a.shape) <= 4 and a.shape[-1] == b.shape[0] and quant.takes_blocks(b, 0)
        if node.op_type == "Gemm":
            at = {x.name: x for x in node.attribute}
            if at.get("transA") is not None and at["transA"].i:
                return False
            trans_b = at.get("transB") is not None and bool(at["transB"].i)
            return a.rank == 2 and quant.takes_blocks(b, 1 if trans_b else 0)
        return False

    def used(self, impl: str) -> None:
        self.impl_hits[impl] = self.impl_hits.get(impl, 0) + 1

    def scratch(self, ne: list[int], after: Any) -> Any:
        """An F32 tensor to be filled piecewise (ggml_set / ggml_cpy), once ``after`` is computed.

        A tensor with no producing op is a graph leaf, and ggml's graph allocator places
        every leaf before the first node: all the conv scratches of a graph would be live
        at once. On the CPU the
        scratch is instead the result of a no-op custom op that depends on ``after``, so
        the allocator places it when the graph gets there and frees it after its last use.
        """
        g = ggml_lib()
        if not self.on_cpu:
            t = g.ggml_new_tensor_4d(self.ctx, g.GGML_TYPE_F32, *ne)
            self.out.scratch.append(t)  # the scheduler needs to be told where a leaf lives
            return t
        args = (ctypes.POINTER(g.ggml_tensor) * 1)(after)
        return g.ggml_custom_4d(self.ctx, g.GGML_TYPE_F32, *ne, args, 1, _no_op(), 1, None)

    def producer(self, name: str) -> Any:
        """The node that produced ``name`` (None for inputs and initializers)."""
        return self._producer.get(name)

    def _only_nan_guards(self, node: Any) -> bool:
        """``node`` is an IsNaN whose every reader is a softmax NaN guard that cannot fire."""
        from .rewrites import guarded_softmax

        if node.op_type != "IsNaN" or node.output[0] in self.output_names:
            return False
        readers = [n for n in self.nodes if node.output[0] in n.input]
        return bool(readers) and all(guarded_softmax(self, n) is not None for n in readers)

    def n_uses(self, name: str) -> int:
        return self._uses.get(name, 0)

    def input_name_of(self, t: GTensor) -> str | None:
        """The graph input (or host value) that ``t`` is (not a view of it), if any."""
        for name, v in list(self.out.inputs.items()) + list(self.out.host_tensors.items()):
            if v.ptr is t.ptr or ctypes_addr(v.ptr) == ctypes_addr(t.ptr):
                return name
        return None

    def init_name(self, arr: Any) -> str | None:
        return self._init_ids.get(id(arr))

    # -- the walk ------------------------------------------------------------
    def lower(self) -> Lowered:
        g = ggml_lib()
        for name, arr in self.inits.items():
            self.values[name] = arr
        for name, shape, dtype in self.input_infos:
            if dtype not in _INPUT_DTYPES:
                raise UnsupportedGraph(
                    f"graph input {name!r} has type {dtype}; the ggml backend takes float and int32/int64 tensors",
                    unsupported={f"input of type {dtype}": [name]}, where="graph inputs",
                    fix="run this graph on another backend (reference, openvino)",
                )
            if 0 in tuple(shape):  # ggml aborts allocating an empty tensor (GGML_ASSERT in ggml-backend.cpp)
                raise UnsupportedGraph(
                    f"graph input {name!r} is empty (shape {tuple(shape)}); the ggml backend cannot hold a tensor "
                    "without elements", unsupported={"empty input": [name]}, where="graph inputs",
                    fix="run this graph on another backend (reference, openvino), or give the input at least one "
                        "element per dim")
            gtype = g.GGML_TYPE_I32 if dtype in ("int64", "int32") else g.GGML_TYPE_F32
            t = g.ggml_new_tensor_4d(self.ctx, gtype, *ne_merged(shape))  # more than 4 dims: see wide()
            g.ggml_set_name(t, name[:63].encode())
            g.ggml_set_input(t)
            kind = "int32" if gtype == g.GGML_TYPE_I32 else (dtype if dtype in CARRIED else "float32")
            v = GTensor(t, tuple(shape), kind)
            self.values[name] = v
            self.out.inputs[name] = v
        for node in self.nodes:
            self._lower_node(node)
        for name in self.output_names:
            if name not in self.values:
                raise UnsupportedGraph(
                    f"graph output {name!r} is not produced by any node",
                    where="graph outputs", fix="check the model with onnx.checker.check_model",
                )
            self.out.outputs[name] = self.values[name]
        if self.out.blocks_kept or self.out.blocks_dequantized:
            log.info("block weights: %s", "; ".join(
                [f"{n} {t} kept for ggml's quantized mul_mat" for t, n in sorted(self.out.blocks_kept.items())]
                + [f"{n} {t} dequantized to float32 (read by other ops)"
                   for t, n in sorted(self.out.blocks_dequantized.items())]))
        return self.out

    def _lower_node(self, node: Any) -> None:
        ins = node_inputs(node, self.values)
        if any(isinstance(v, BlockMatrix) for v in ins):
            if self._transposed_blocks(node, ins):
                return
            ins = self._blocks_in(node, ins)
        present = [v for v in ins if v is not None]
        if node.op_type in ("Shape", "Size") and isinstance(ins[0], HostValue):
            # a host value's shape is static: a constant, not run-time host work
            ins = [ins[0].example]
            present = ins
        elif node.op_type in ("Shape", "Size") and isinstance(ins[0], GTensor):
            # so is every ggml tensor's (an integer graph input's too: its shape is pinned), so that what is
            # computed from it (a ConstantOfShape, a Range of the sequence length) folds to constants
            ins = [np.broadcast_to(np.zeros((), np.int32), ins[0].shape)]
            present = ins
        if self._host_node(node, ins):
            return
        is_wide = node.op_type not in WIDE_OPS and any(isinstance(v, GTensor) and wide(v) for v in present)
        if is_wide and node.op_type not in FOLDABLE:
            raise unsupported(node, f"{node.op_type} on a tensor of more than 4 dimensions")
        if any(isinstance(v, HostValue) for v in present) and node.op_type not in _HOST_AWARE:
            ins = [self._materialize(v) if isinstance(v, HostValue) else v for v in ins]
            present = [v for v in ins if v is not None]
        if all(isinstance(v, np.ndarray) for v in present) and not node.domain.startswith("sdrt"):
            for v in present:
                name = self._init_ids.get(id(v))
                if name is not None:
                    self.out.folded_inits.add(name)
            # a quantized weight: ggml blocks where they hold it (quant.py), else its float32 values
            folded = quant.fold(node, ins) if node.op_type == "DequantizeLinear" else None
            outs = [folded] if folded is not None else fold_node(node, ins, self.opsets)  # type: ignore[arg-type]
        elif node.op_type in FOLD_ONLY and node.op_type not in REGISTRY:
            if not self._only_nan_guards(node):
                raise unsupported(node, f"{node.op_type} on a runtime tensor (only constant inputs are supported)")
            outs = [None]  # read only by Where guards that the nan_guard rewrite drops
        else:
            fn = REGISTRY.get(node.op_type)
            if fn is None:
                raise unsupported(node, f"no lowering for {node.op_type}")
            if node.op_type not in LAYOUT_OPS:
                odd = {v.dtype for v in present if isinstance(v, GTensor) and v.dtype in CARRIED}
                if odd:
                    raise unsupported(node, f"{node.op_type} on {', '.join(sorted(odd))} tensors")
            try:
                if is_wide:  # on a view with the axes it treats alike merged (ops/fold_wide.py)
                    outs = lower_folded(self, node, ins, fn)
                else:
                    outs = self._try_rewrites(node) or fn(self, node, ins)
            except UnsupportedGraph:
                raise
            except (ValueError, TypeError, AssertionError) as exc:
                # a lowering rejects what it cannot express (runtime shapes, dtypes, ranks...)
                raise unsupported(node, str(exc) or f"{node.op_type} with these inputs") from exc
            self.out.n_ops += 1
        for name, v in zip(node.output, outs):
            if name:
                self.values[name] = v

    def _host_capable(self, v: Value | None) -> bool:
        if isinstance(v, HostValue):
            return True
        return (isinstance(v, GTensor) and (v.dtype == "int32" or v.dtype in CARRIED)
                and self.input_name_of(v) in self.out.inputs)

    def _host_example(self, v: Any) -> Any:
        if isinstance(v, HostValue):
            return v.example
        if isinstance(v, GTensor):  # an integer graph input
            name = self.input_name_of(v)
            dtype = next(d for n, _, d in self.input_infos if n == name)
            return np.zeros(v.shape, dtype=np.dtype(dtype))
        return v

    def _host_node(self, node: Any, ins: list[Value | None]) -> bool:
        """Evaluate integer/bool work on integer graph inputs on the host at run time."""
        present = [v for v in ins if v is not None]
        if node.domain.startswith("sdrt") or not any(self._host_capable(v) for v in present):
            return False
        if not all(isinstance(v, np.ndarray) or self._host_capable(v) for v in present):
            return False
        try:
            examples = fold_node(node, [self._host_example(v) for v in ins], self.opsets)
        except Exception:  # noqa: BLE001 - not evaluable on the host: leave it to the lowering
            return False
        if any(e.dtype.kind not in "iub" for e in examples):
            return False  # float results (an embedding lookup) are ggml's job
        refs: list[tuple[str, Any]] = []
        for v in ins:
            if v is None:
                refs.append(("const", None))
            elif isinstance(v, np.ndarray):
                refs.append(("const", v))
                if self._init_ids.get(id(v)) is not None:
                    self.out.folded_inits.add(self._init_ids[id(v)])
            else:
                refs.append(("value", self.input_name_of(v) if isinstance(v, GTensor) else v.name))
        self.out.host_plan.append((node, refs))
        for name, e in zip(node.output, examples):
            if name:
                self.values[name] = HostValue(name, e)
        return True

    def host_map(self, h: HostValue, fn: Callable[[np.ndarray], np.ndarray], tag: str) -> HostValue:
        """A new host value ``fn(h)``, computed on the host before each run."""
        name = f"{h.name}::{tag}"

        class _Step:
            output = [name]

            def __call__(self, arr: np.ndarray) -> list[np.ndarray]:
                return [fn(arr)]

        self.out.host_plan.append((_Step(), [("value", h.name)]))
        return HostValue(name, fn(h.example))

    def _materialize(self, h: HostValue) -> GTensor:
        """The ggml input tensor a host value is copied into before each run."""
        if h.name in self.out.host_tensors:
            return self.out.host_tensors[h.name]
        g = ggml_lib()
        is_int = h.example.dtype.kind in "iub"
        t = g.ggml_new_tensor_4d(self.ctx, g.GGML_TYPE_I32 if is_int else g.GGML_TYPE_F32, *ne_of(h.example.shape))
        g.ggml_set_input(t)
        v = GTensor(t, tuple(int(d) for d in h.example.shape), "int32" if is_int else "float32")
        self.out.host_tensors[h.name] = v
        return v

    def _try_rewrites(self, node: Any) -> list[Value] | None:
        for name, matcher in self._rewrites.get(node.op_type, ()):
            if name in self.rewrites_on:
                outs = matcher(self, node)
                if outs is not None:
                    self.rewrite_hits[name] = self.rewrite_hits.get(name, 0) + 1
                    return outs
        return None


@dataclass
class LoweringSpec:
    """Everything one lowering reads: the session keeps it to lower again when a folded weight changes."""

    nodes: list[Any]
    initializers: dict[str, np.ndarray]
    input_infos: list[tuple[str, tuple[int, ...], str]]
    output_names: list[str]
    opsets: dict[str, int]
    options: dict[str, Any]
    supports_flash_attn: bool = True
    on_cpu: bool = True
    #: the weights stay in arrays the session wraps as CPU buffers (``Lowering.host_weights``)
    host_weights: bool = False
    #: the device's ggml backend where it is not the CPU (``Lowering.device_backend``)
    device_backend: Any = None


def lower_graph(spec: LoweringSpec, replay: Replay | None = None) -> Lowered:
    """Lower the graph ``spec`` describes; the contexts it returns are freed with ``free_lowered``. ``replay``: a
    compile cache entry's layouts, taken instead of made (all of them, or ``UnusableEntry``)."""
    lowering = Lowering(spec.nodes, spec.initializers, spec.input_infos, spec.output_names, spec.opsets,
                        options=spec.options, supports_flash_attn=spec.supports_flash_attn, on_cpu=spec.on_cpu,
                        host_weights=spec.host_weights, device_backend=spec.device_backend, replay=replay)
    try:
        out = lowering.lower()
        if replay is not None:
            replay.finish()
        return out
    except BaseException:
        free_lowered(lowering.out)
        raise


def free_lowered(lowered: Lowered) -> None:
    lib = ggml_lib()
    for ctx in (lowered.ctx, lowered.wctx):
        if ctx:
            lib.ggml_free(ctx)
    lowered.ctx = lowered.wctx = None
