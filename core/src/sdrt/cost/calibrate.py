"""Fit the cost model's factors on this machine: time the calibration cases on a backend, and their memory.

The cases (``CASE_SPECS``) are small graphs shaped like the parts that pipelines run: 3x3 convs from
32 to 1280 channels on 8-128 px maps, 1x1 and depthwise convs and MobileNet blocks, matmuls from 8
to 4096 rows (the weight-heavy ones past the last-level cache), attention at 1024-4096 tokens and
narrow heads, group and layer norms, SiLU, transposes, upsampling, one tiny node (the cost of a
call) and 400 tiny nodes (the cost of a node). None of them is a model that the accuracy check
runs. Each is compiled through ``sdrt.load`` at a pinned precision (fp32 by default) in a child
process (so that its peak resident memory can be read, and a crash costs nothing) and run
``repeats`` times after two warm-ups; a call under 5 ms is timed over a loop of calls. The kept
time is ``robust_ms``: the median over groups of three runs of each group's best (the machine may
be shared). Time is fitted over every case at once (``features``: FLOPs per timing class, traffic
per kind, nodes and the call, linear in the factors; non-negative least squares on relative errors);
memory as ``base + node_bytes x nodes`` through the cases with almost no data, then each phase's factors
(the child reads its peak after compiling, resets it and reads it after the runs) over the rest, the
dynamic-dims factors over the cases compiled with dims dynamic (``_fit_phases``). The CPU's memory bandwidth is measured too (a large numpy copy),
as the unit of the traffic terms. ``sdrt selftest --calibrate`` calls ``calibrate`` and stores the
result.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .devices import DeviceSpec, this_cpu
from .model import (
    DENSE_CONVS,
    OPTIONAL_CLASSES,
    TIME_CLASSES,
    Factors,
    activation_scale,
    conv_weight_bytes,
    copies_heads,
    half_convs,
    inflight_bytes,
    largest_weights,
    matmul_input_bytes,
    memory_nodes,
    past_cache,
    stream_candidate_bytes,
    streamed_bytes,
    timed_node,
)
from .nodes import graph_costs

log = logging.getLogger("sdrt.cost")


def _model(name: str, inputs: list[Any], nodes: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    from onnx import helper

    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="sdrt-calibrate")
    m.ir_version = 8
    return m


def _w(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float | None = None) -> Any:
    from onnx import numpy_helper

    fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    s = scale if scale is not None else 1.0 / np.sqrt(max(fan, 1))
    return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)


class _Chain:
    """A graph under construction: nodes, initializers and a running value."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.nodes, self.inits, self.n = rng, [], [], 0

    def name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def w(self, shape: tuple[int, ...], scale: float | None = None) -> str:
        name = self.name("w")
        self.inits.append(_w(name, shape, self.rng, scale))
        return name

    def op(self, op: str, ins: list[str], **attrs: Any) -> str:
        from onnx import helper

        out = self.name("v")
        self.nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out


#: the calibration cases, shaped like the parts that diffusion pipelines and the bench models run and, for
#: the weight-heavy ones, sized past the last-level cache: name -> (builder, its arguments)
CASE_SPECS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "call": ("add", (16,)),                          # one tiny node: the fixed cost of a call
    "runtime": ("runtime", (32, 8)),                 # one tiny node of every kind: the runtime's base memory
    "nodes": ("tiny_matmuls", (400, 77)),            # many tiny nodes: the fixed cost (time, memory) of a node, at a
    # text encoder's 77 rows: a runtime splits a node that large over its threads and pays their fork and join, where
    # it runs a node of 8 rows on one (OpenVINO's CPU plugin: 1.0 us a node at 8-32 rows, 3.4 at 77, bf16; fitted on
    # 8 rows, the tiny SDXL text encoders, 64 nodes of 77 rows, were predicted at 0.6-0.7 of their 0.3 ms)
    "node1": ("tiny_matmuls", (1, 77)),              # memory: one of them (what its op kind's code takes, apart)
    "nodes_dyn": ("tiny_matmuls", (100, 77)),        # ... in a graph whose dims stay dynamic (tokens)
    "conv3_320x32": ("conv", (320, 32, 3, 1, 3)),    # UNet level 1-2 resnets
    "conv3_640x16": ("conv", (640, 16, 3, 1, 3)),    # UNet deep levels: 44 MB of kernels
    "conv3_1280x8": ("conv", (1280, 8, 3, 1, 1)),    # the deepest, on a small map: one 59 MB kernel
    "conv3_1280x4": ("conv", (1280, 4, 3, 1, 2, 2)),  # the deepest at a small image, 2 CFG rows: kernel-bound
    "conv3_128x64": ("conv", (128, 64, 3, 1, 3)),    # VAE decoder mid channels
    "conv3_32x128": ("conv", (32, 128, 3, 1, 3)),    # few channels on a large map
    "conv3_512x64": ("conv", (512, 64, 3, 1, 3)),    # a VAE decoder's mid-block: 58 GFLOPs, the arithmetic's time
    # alone (the cases above are as much traffic as arithmetic; fitted from them, OpenVINO's bf16 convs came out at 0.90
    # of the AMX peak where its profiler shows 0.38-0.55 in the SDXL VAE decoder, predicted at 0.57-0.61 of its time)
    "conv1_256x56": ("conv", (256, 56, 1, 1, 4)),    # 1x1 convs (MobileNet expand / project, UNet proj_in)
    "conv1_640x32": ("conv", (640, 32, 1, 1, 3)),    # 1x1 convs at UNet widths
    "dw3_144x56": ("conv", (144, 56, 3, 144, 4)),    # depthwise 3x3
    "dw5_576x14": ("conv", (576, 14, 5, 576, 4)),    # depthwise 5x5 (MobileNetV3), few pixels
    "mm_1024x640": ("matmul", (1024, 640, 640, 4)),  # attention projections at 1024 tokens
    "mm_4096x320": ("matmul", (4096, 320, 320, 4)),  # at 4096 tokens
    "mm_77x768": ("mlp", (77, 768, 3072, 4)),        # CLIP's MLPs: 77 rows over 75 MB of weights
    "mm_8x4096": ("matmul", (8, 4096, 4096, 2)),     # 8 rows over 134 MB: streaming the weights
    "mm_1024x2560": ("mlp", (1024, 640, 2560, 2)),   # a UNet's feed-forward (640 -> 2560 -> 640 at 1024 tokens): FLOPs
    # per input element 4x the 640-wide cases' (a runtime converting float32 activations per matmul: ``matmul_convert_ms``)
    "mm_dyn": ("mlp", (77, 768, 3072, 4)),           # mm_77x768 with its tokens dynamic (memory: when weights repack)
    "mm_act_dyn": ("mlp_act", (77, 768, 3072, 4)),   # CLIP-like MLPs (a ReLU between), batch and tokens dynamic
    "conv3_dyn": ("conv", (640, 16, 3, 1, 3)),       # conv3_640x16 with batch and map dynamic (as torch exports)
    "heads": ("heads", (77, 64, 8, 6)),              # heads split and merged by shape arithmetic, dims dynamic
    "tokens": ("tokens", (77, 64, 3)),               # integer work on token ids (the pooled token's position)
    "embedding": ("embedding", (49408, 768, 77)),    # CLIP's token table (152 MB), looked up, then LayerNorm
    "invres_32x56": ("invres", (32, 192, 56, 3)),    # MobileNetV2 blocks: 1x1, ReLU6, dw 3x3, ReLU6, 1x1, add
    "attn_1024x40": ("attention", (8, 1024, 40, 2)),
    "attn_1024x8": ("attention", (8, 1024, 8, 2)),   # narrow heads: the softmax dominates
    "attn_4096x64": ("attention", (1, 4096, 64, 1)),
    "attn_2048x512": ("attention", (1, 2048, 512, 1)),  # a VAE's mid-block attention: one head of 512 channels, 8x
    # a UNet head's FLOPs per score (without it the fits charged scores, not FLOPs: the SDXL VAE's at 768 px, 9216
    # tokens, predicted 19 ms on OpenVINO's bf16 against 222 ms measured alone)
    "attn_sdpa": ("sdpa", (2, 4, 1024, 8, 2)),       # as torch exports it (heads by Reshape/Transpose, scale on Q and K)
    "attn_cross": ("sdpa", (2, 4, 1024, 8, 4, 77)),  # cross-attention: 1024 queries over 77 text tokens (every SD
    # UNet's attn2): short rows, where a fused attention's work per query row, not per score, is the time
    "attn_tiny": ("sdpa", (1, 2, 77, 16, 12)),       # ... twelve tiny ones, as a text encoder at test width: the fixed
    # cost of an attention (OpenVINO runs each as one fused subgraph, 12 us where a tiny matmul node takes 1-3)
    "layernorm": ("layernorm", (4096, 320, 4)),
    "groupnorm": ("groupnorm", (320, 64, 32, 3)),
    "silu": ("silu", (320, 64, 3)),
    "conv_gn_16x256": ("conv_gn", (16, 256, 8, 3)),  # VAE-like 3x3 conv -> GroupNorm, 16 channels at 2048 px / 8
    "conv_gn_64x64": ("conv_gn", (64, 64, 32, 3)),   # ... 64 channels (a channels-last runtime relayouts them)
    "resblock_dyn": ("resblock", (16, 512, 8, 1, 4)),  # memory: a VAE's last level, dims dynamic (16 MiB maps)
    "transpose": ("transpose", (320, 4096, 4)),
    "upsample": ("upsample", (128, 64, 2)),
    "activations": ("activations", (64, 512)),      # memory: a large activation, no weights
    "act_inner": ("act_inner", (64, 64, 4)),          # memory: large activations inside, small input and output
    "small_convs": ("conv", (128, 16, 3, 1, 40)),    # memory: 40 kernels of 0.56 MiB (what compiling them leaves)
    "small_mms": ("matmul", (77, 384, 384, 40)),     # memory: 40 matmul weights of 0.56 MiB
    "mm_big_dyn": ("matmul", (8, 2048, 2048, 40)),   # memory: 640 MiB of 16 MiB weights, tokens dynamic (a model's size)
    "mm_big": ("matmul", (8, 2048, 2048, 40)),       # ... static: a pinned model's weights, many of them, so the fit
    # tells the bytes per weight byte from the one weight in flight (every other case holds one to three large ones)
    "conv_big": ("conv", (640, 12, 3, 1, 40)),       # ... and forty 14 MiB 3x3 kernels (563 MiB), static, likewise,
    # on a map of 144 pixels: larger than a runtime's small-map routes take (``Factors.plain_conv_pixels``)
    "mm_stream": ("matmul", (8, 2048, 2048, 4)),     # 8 rows over weights twice the CPU's last-level cache (their
    # count set per machine: ``stream_count``), which every call reads from memory
    # (``Factors.stream_weight_bandwidth_efficiency``)
}
#: a ladder of weight sizes (MiB at the precision) that 8 rows read, each a case of its own (``cache_<size>``): how
#: large a part's weights may be and stay cached between calls (``effective_cache``); timed, but left out of the fits
LADDER_MIB = (16, 32, 64, 128, 256)
LADDER_CASES = frozenset(f"cache_{m}" for m in LADDER_MIB)
for _m in LADDER_MIB:
    CASE_SPECS[f"cache_{_m}"] = ("matmul", (8, 2048, 2048, 1))
#: cases whose count (the last of their arguments) is set per machine and precision: ``sized_count``
SIZED_CASES = frozenset({"mm_stream"}) | LADDER_CASES
#: a ladder size counts as cached where its time per weight byte is at most this share of ``mm_stream``'s
CACHED_SHARE = 0.8
#: the most float32 bytes of weights a sized case is built with, under protobuf's 2 GiB (a CPU with more last-level
#: cache than half of it at the precision goes without the stream term)
STREAM_MAX_BYTES = 2**31 - 64 * 2**20


def stream_count(cache_bytes: int, precision: str) -> int:
    """How many 2048 x 2048 weights ``mm_stream`` takes on a CPU with ``cache_bytes`` of last-level cache: their bytes
    at ``precision`` twice the cache; 0 (the case left out) where the cache is unknown or the weights would pass
    ``STREAM_MAX_BYTES`` as float32 (the case is one ONNX file)."""
    from .nodes import WEIGHT_BYTES

    if not cache_bytes:
        return 0
    each = 2048 * 2048
    n = -(-2 * cache_bytes // int(each * WEIGHT_BYTES.get(precision, 4)))
    return max(2, n) if n * each * 4 <= STREAM_MAX_BYTES else 0


def sized_count(case: str, cache_bytes: int, precision: str) -> int:
    """The count of a ``SIZED_CASES`` case here: ``stream_count`` for ``mm_stream``, a ladder size's weights at
    ``precision`` for ``cache_<MiB>``; 0 (left out) where the cache is unknown."""
    from .nodes import WEIGHT_BYTES

    if case == "mm_stream" or not cache_bytes:
        return stream_count(cache_bytes, precision)
    mib = int(case.removeprefix("cache_"))
    return max(1, round(mib * 2**20 / (2048 * 2048 * WEIGHT_BYTES.get(precision, 4))))


def effective_cache(rows: list[dict[str, Any]], reported: float) -> float:
    """The weight bytes that stay cached between calls, from the measured cases: the largest ladder size
    (``LADDER_CASES``) read at most ``CACHED_SHARE`` of ``mm_stream``'s time per byte, every smaller one too (half the
    smallest where none is; the ``reported`` cache where all are), at most ``reported``. Without the cases: ``reported``.
    On the Xeon's 480 MiB L3 (a VM's share of the host's) 64 MiB of bf16 weights read at 0.56 of the streaming time
    per byte and 320 MiB at 1.0."""
    by = {r["case"].removeprefix("cal_"): r for r in rows}
    stream = by.get("mm_stream")
    if not reported or stream is None or not stream.get("stream_bytes"):
        return float(reported or 0.0)
    per_byte = stream["robust_ms"] / stream["stream_bytes"]
    cached = 0.0
    for mib in LADDER_MIB:
        r = by.get(f"cache_{mib}")
        if r is None or not r.get("stream_bytes"):
            continue
        if r["robust_ms"] / r["stream_bytes"] > CACHED_SHARE * per_byte:
            return min(float(reported), cached or r["stream_bytes"] / 2)
        cached = float(r["stream_bytes"])
    return float(reported)


#: the arguments of cases whose ``CASE_SPECS`` changed, as a report that does not record them (``measured_args``) measured
#: them: the tiny matmuls ran over 8 rows until 2026-12-07
LEGACY_ARGS: dict[str, tuple[Any, ...]] = {"nodes": (400, 8), "node1": (1, 8), "nodes_dyn": (100, 8)}


def measured_args(row: dict[str, Any]) -> tuple[Any, ...] | None:
    """The arguments a stored measurement's case was built with: its ``args``, else ``LEGACY_ARGS`` (a report from
    before they were recorded), else None (the case as ``CASE_SPECS`` has it)."""
    args = row.get("args")
    return tuple(args) if args is not None else LEGACY_ARGS.get(row["case"].removeprefix("cal_"))


def build_case(case: str, count: int | None = None, args: tuple[Any, ...] | None = None
               ) -> tuple[Any, dict[str, np.ndarray]]:
    """The calibration graph ``case`` (a key of ``CASE_SPECS``), with ``count`` as its last argument where given (a
    ``SIZED_CASES`` case), or with ``args`` for its arguments (a stored measurement's, ``measured_args``); returns
    (model, feeds)."""
    from onnx import TensorProto, helper

    kind, spec_args = CASE_SPECS[case]
    args = spec_args if args is None else args
    if count is not None:
        args = (*args[:-1], count)
    rng = np.random.default_rng(7)
    f32 = TensorProto.FLOAT
    g = _Chain(rng)
    extra: dict[str, list[int]] = {}
    dynamic: dict[str, list[Any]] = {}  # inputs declared with named (dynamic) dims
    if kind == "add":
        (c,) = args
        shape = [1, c]
        x = g.op("Add", ["x", g.w((c,), 0.1)])
    elif kind == "tiny_matmuls":
        k, rows = args
        shape = [1, rows, 32]
        x = "x"
        for _ in range(k):
            x = g.op("MatMul", [x, g.w((32, 32))])
    elif kind == "conv":
        c, hw, ks, group, k, *batch = args
        shape = [batch[0] if batch else 1, c, hw, hw]
        x = "x"
        for _ in range(k):
            x = g.op("Conv", [x, g.w((c, c // group, ks, ks)), g.w((c,), 0.01)], pads=[ks // 2] * 4, group=group)
    elif kind == "invres":  # inverted residual blocks: the convs' epilogues as a backend fuses them
        from onnx import numpy_helper

        c, h, hw, k = args
        shape = [1, c, hw, hw]
        g.inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                    numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        x = "x"
        for _ in range(k):
            y = g.op("Clip", [g.op("Conv", [x, g.w((h, c, 1, 1)), g.w((h,), 0.01)]), "lo", "hi"])
            y = g.op("Clip", [g.op("Conv", [y, g.w((h, 1, 3, 3)), g.w((h,), 0.01)], pads=[1] * 4, group=h), "lo", "hi"])
            x = g.op("Add", [g.op("Conv", [y, g.w((c, h, 1, 1)), g.w((c,), 0.01)]), x])
    elif kind in ("matmul", "mlp", "mlp_act"):
        t, c, h, k = args
        shape = [1, t, c]
        x = "x"
        for _ in range(k):
            x = g.op("MatMul", [x, g.w((c, h))])
            if kind == "mlp_act":
                x = g.op("Relu", [x])
            if kind != "matmul":
                x = g.op("MatMul", [x, g.w((h, c))])
    elif kind == "attention":
        bh, sq, d, k = args
        shape = [bh, sq, d]
        extra = {"kt": [bh, d, sq], "v": [bh, sq, d]}
        from onnx import numpy_helper

        g.inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale"))
        x = "x"
        for _ in range(k):
            p = g.op("Softmax", [g.op("Mul", [g.op("MatMul", [x, "kt"]), "scale"])], axis=-1)
            x = g.op("MatMul", [p, "v"])
    elif kind == "sdpa":  # attention as torch exports scaled_dot_product_attention: heads split by a Reshape and
        # Transposes (K to (b, h, d, n)), the scale's square root on Q and on K, softmax, @ V, the heads merged back
        from onnx import numpy_helper

        b, h, sq, d, k, *kv = args  # kv: the keys' count where it differs from the queries' (cross-attention)
        skv = kv[0] if kv else sq
        shape = [b, sq, h * d]
        extra = {"kk": [b, skv, h * d], "v": [b, skv, h * d]}
        g.inits += [numpy_helper.from_array(np.array([b, sq, h, d], np.int64), "split"),
                    numpy_helper.from_array(np.array([b, skv, h, d], np.int64), "split_kv"),
                    numpy_helper.from_array(np.array([b, sq, h * d], np.int64), "merge"),
                    numpy_helper.from_array(np.array(d ** -0.25, np.float32), "rscale")]
        kt = g.op("Mul", [g.op("Transpose", [g.op("Reshape", ["kk", "split_kv"])], perm=[0, 2, 3, 1]), "rscale"])
        v = g.op("Transpose", [g.op("Reshape", ["v", "split_kv"])], perm=[0, 2, 1, 3])
        x = "x"
        for _ in range(k):
            q = g.op("Mul", [g.op("Transpose", [g.op("Reshape", [x, "split"])], perm=[0, 2, 1, 3]), "rscale"])
            o = g.op("MatMul", [g.op("Softmax", [g.op("MatMul", [q, kt])], axis=-1), v])
            x = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), "merge"])
    elif kind == "layernorm":
        t, c, k = args
        shape = [1, t, c]
        x = "x"
        for _ in range(k):
            x = g.op("LayerNormalization", [x, g.w((c,), 1.0), g.w((c,), 0.1)], axis=-1, epsilon=1e-5)
    elif kind in ("groupnorm", "conv_gn"):  # as torch exports it: Reshape -> InstanceNormalization -> Reshape ->
        # Mul -> Add; conv_gn: each after a 3x3 conv (a VAE's resnets: the norm regroups the conv's output)
        from onnx import numpy_helper

        c, hw, groups, k = args
        shape = [1, c, hw, hw]
        g.inits += [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "gshape"),
                    numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
                    numpy_helper.from_array(np.zeros(groups, np.float32), "zeros")]
        x = "x"
        for _ in range(k):  # unit scale and zero shift in the InstanceNormalization, as torch writes them
            if kind == "conv_gn":
                x = g.op("Conv", [x, g.w((c, c, 3, 3)), g.w((c,), 0.01)], pads=[1] * 4)
            r = g.op("Reshape", [x, "gshape"])
            n = g.op("InstanceNormalization", [r, "ones", "zeros"], epsilon=1e-6)
            back = g.op("Reshape", [n, g.op("Shape", [x])])
            x = g.op("Add", [g.op("Mul", [back, g.w((c, 1, 1), 1.0)]), g.w((c, 1, 1), 0.1)])
    elif kind == "resblock":  # a VAE decoder's last level: upsampled, a conv, then resnet blocks (GroupNorm, SiLU,
        # 3x3 conv, twice, and the residual add), pooled at the end (the maps live only inside the graph)
        from onnx import numpy_helper

        c, hw, groups, k, up = args
        shape = [1, c, hw // up, hw // up]
        g.inits += [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "gshape"),
                    numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
                    numpy_helper.from_array(np.zeros(groups, np.float32), "zeros"),
                    numpy_helper.from_array(np.array([1, 1, up, up], np.float32), "scales")]

        def conv(v: str) -> str:
            return g.op("Conv", [v, g.w((c, c, 3, 3)), g.w((c,), 0.01)], pads=[1] * 4)

        def norm_silu(v: str) -> str:
            n = g.op("InstanceNormalization", [g.op("Reshape", [v, "gshape"]), "ones", "zeros"], epsilon=1e-6)
            y = g.op("Add", [g.op("Mul", [g.op("Reshape", [n, g.op("Shape", [v])]), g.w((c, 1, 1), 1.0)]),
                             g.w((c, 1, 1), 0.1)])
            return g.op("Mul", [y, g.op("Sigmoid", [y])])

        x = conv(g.op("Resize", ["x", "", "scales"], mode="nearest", coordinate_transformation_mode="asymmetric",
                      nearest_mode="floor"))
        for _ in range(k):
            x = g.op("Add", [x, conv(norm_silu(conv(norm_silu(x))))])
        x = g.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
    elif kind == "silu":  # SiLU then a per-channel add, as a UNet's resnets do between convs
        c, hw, k = args
        shape = [1, c, hw, hw]
        x = "x"
        for _ in range(k):
            x = g.op("Add", [g.op("Mul", [x, g.op("Sigmoid", [x])]), g.w((c, 1, 1), 0.1)])
    elif kind == "transpose":
        c, n, k = args
        shape = [1, c, n]
        x = "x"
        for _ in range(k):  # the add keeps each copy real
            x = g.op("Add", [g.op("Transpose", [x], perm=[0, 2, 1]), g.w((1,), 0.1)])
    elif kind == "upsample":  # nearest 2x then a conv-free add, as the decoders' upsamplers do
        from onnx import numpy_helper

        c, hw, k = args
        shape = [1, c, hw, hw]
        g.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
        x = "x"
        for _ in range(k):
            x = g.op("Resize", [x, "", "scales"], mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
    elif kind == "embedding":  # a token-embedding lookup as CLIP's text encoders start: Gather, LayerNorm
        vocab, dim, tokens = args
        shape = [1, dim]  # unused float input, so that every case has an "x"
        extra = {"ids": [1, tokens]}
        e = g.op("Gather", [g.w((vocab, dim), 0.02), "ids"])
        x = g.op("Add", [g.op("LayerNormalization", [e, g.w((dim,), 1.0), g.w((dim,), 0.1)], axis=-1, epsilon=1e-5),
                         g.op("ReduceMean", ["x"], keepdims=1)])
    elif kind == "tokens":  # integer work on the token ids, as text encoders find the pooled token, then a lookup
        from onnx import numpy_helper

        tokens, dim, k = args
        shape = [tokens, dim]
        extra = {"ids": [1, tokens]}
        g.inits += [numpy_helper.from_array(np.array(3, np.int64), "eos"),
                    numpy_helper.from_array(np.array(2, np.int64), "two"),
                    numpy_helper.from_array(np.array(100, np.int64), "limit")]
        ids = "ids"
        for _ in range(k):
            hit = g.op("Cast", [g.op("Equal", [ids, "eos"])], to=TensorProto.INT64)
            y = g.op("Mul", [g.op("Add", [hit, ids]), "two"])
            ids = g.op("Where", [g.op("Less", [y, "limit"]), y, ids])
        pos = g.op("ArgMax", [ids], axis=-1, keepdims=0)
        x = g.op("Gather", ["x", pos], axis=0)  # the row of the token found
    elif kind == "heads":  # as torch exports a head split: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
        from onnx import numpy_helper

        tokens, dim, heads, k = args
        shape = [1, tokens, dim]
        g.inits += [numpy_helper.from_array(np.array(i, np.int64), f"i{i}") for i in range(3)]
        g.inits += [numpy_helper.from_array(np.array([heads], np.int64), "h"),
                    numpy_helper.from_array(np.array([dim // heads], np.int64), "d"),
                    numpy_helper.from_array(np.array([dim], np.int64), "c"),
                    numpy_helper.from_array(np.array([0], np.int64), "axis0")]
        x = "x"
        for _ in range(k):
            s = g.op("Shape", [x])
            b, t = (g.op("Unsqueeze", [g.op("Gather", [s, f"i{i}"], axis=0), "axis0"]) for i in range(2))
            y = g.op("Transpose", [g.op("Reshape", [x, g.op("Concat", [b, t, "h", "d"], axis=0)])], perm=[0, 2, 1, 3])
            y = g.op("Transpose", [g.op("Add", [y, g.w((1,), 0.1)])], perm=[0, 2, 1, 3])
            x = g.op("Reshape", [y, g.op("Concat", [b, t, "c"], axis=0)])
        dynamic = {"x": [1, "tokens", dim]}
    elif kind == "runtime":  # one small node of every kind that pipelines run: what a runtime loads for them
        from onnx import numpy_helper

        c, hw = args
        shape = [1, c, hw, hw]
        extra = {"ids": [1, hw]}
        g.inits += [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
                    numpy_helper.from_array(np.array([0, 4, -1], np.int64), "gshape"),
                    numpy_helper.from_array(np.ones(4, np.float32), "ones"),
                    numpy_helper.from_array(np.zeros(4, np.float32), "zeros"),
                    numpy_helper.from_array(np.array([1, c, hw * hw], np.int64), "flat"),
                    numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                    numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
                    numpy_helper.from_array(np.array(2.0, np.float32), "two")]
        y = g.op("Conv", ["x", g.w((c, c, 3, 3)), g.w((c,), 0.01)], pads=[1] * 4)
        y = g.op("Conv", [y, g.w((c, 1, 3, 3)), g.w((c,), 0.01)], pads=[1] * 4, group=c)
        y = g.op("Clip", [g.op("Conv", [y, g.w((c, c, 1, 1)), g.w((c,), 0.01)]), "lo", "hi"])
        n = g.op("InstanceNormalization", [g.op("Reshape", [y, "gshape"]), "ones", "zeros"], epsilon=1e-6)
        y = g.op("Reshape", [n, g.op("Shape", [y])])
        y = g.op("Mul", [y, g.op("Sigmoid", [y])])
        y = g.op("Resize", [y, "", "scales"], mode="nearest", coordinate_transformation_mode="asymmetric",
                 nearest_mode="floor")
        t = g.op("Transpose", [g.op("Reshape", ["x", "flat"])], perm=[0, 2, 1])  # (1, hw*hw, c) tokens
        t = g.op("Concat", [t, g.op("Gather", [g.w((64, c), 0.02), "ids"])], axis=1)
        t = g.op("LayerNormalization", [t, g.w((c,), 1.0), g.w((c,), 0.1)], axis=-1, epsilon=1e-5)
        q = g.op("MatMul", [t, g.w((c, c))])
        p = g.op("Softmax", [g.op("MatMul", [q, g.op("Transpose", [t], perm=[0, 2, 1])])], axis=-1)
        a = g.op("MatMul", [p, t])
        a = g.op("Mul", [a, g.op("Erf", [g.op("Div", [a, g.w((1,), 1.0)])])])
        a = g.op("Add", [g.op("Gemm", [g.op("Flatten", [a], axis=2), g.w((c, c))]), g.w((c,), 0.1)])
        a = g.op("Sqrt", [g.op("Add", [g.op("ReduceMean", [g.op("Pow", [a, "two"])], axes=[-1]), "hi"])])
        x = g.op("Add", [g.op("ReduceMean", [y], axes=[1, 2, 3], keepdims=0), g.op("ReduceMean", [a], keepdims=0)])
    elif kind == "act_inner":  # upsampled, worked on and pooled: the activations live only inside the graph
        from onnx import numpy_helper

        c, hw, up = args
        shape = [1, c, hw, hw]
        g.inits.append(numpy_helper.from_array(np.array([1, 1, up, up], np.float32), "scales"))
        y = g.op("Resize", ["x", "", "scales"], mode="nearest", coordinate_transformation_mode="asymmetric",
                 nearest_mode="floor")
        s = g.op("Sigmoid", [y])
        y = g.op("Add", [g.op("Mul", [y, s]), g.op("Transpose", [y], perm=[0, 1, 3, 2])])
        x = g.op("ReduceMean", [y], axes=[2, 3], keepdims=1)
    elif kind == "activations":  # activation-heavy: memory calibration
        c, hw = args
        shape = [1, c, hw, hw]
        x = g.op("Add", [g.op("Mul", ["x", g.op("Sigmoid", ["x"])]), g.w((c, 1, 1), 0.1)])
    else:  # pragma: no cover - CASE_SPECS names only the kinds above
        raise ValueError(f"unknown case kind {kind!r}")
    dims = {"x": shape, **extra}
    if case == "nodes_dyn":
        dynamic = {"x": [1, "tokens", 32]}
    elif case in ("mm_dyn", "mm_big_dyn"):
        dynamic = {"x": [1, "tokens", shape[2]]}
    elif case == "mm_act_dyn":
        dynamic = {"x": ["batch", "tokens", shape[2]]}
    elif case in ("conv3_dyn", "resblock_dyn"):
        dynamic = {"x": ["batch", shape[1], "height", "width"]}
    ins = [helper.make_tensor_value_info(n, f32, dynamic.get(n, s)) for n, s in dims.items()]
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in dims.items()}
    if "ids" in feeds:  # token ids, within the table
        ins = [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "ids" else f32, s) for n, s in dims.items()]
        feeds["ids"] = rng.integers(0, 64, dims["ids"]).astype(np.int64)
    model = _model(f"cal_{case}", ins, g.nodes, [helper.make_tensor_value_info(x, f32, None)], g.inits)
    return model, feeds


CASES = list(CASE_SPECS)
#: cases for the memory fit only, kept out of the time fit: the dynamic twins of static cases (what a runtime holds
#: when it compiles dims dynamic), activations that live only inside a graph, many small weights
MEMORY_CASES = frozenset({"mm_dyn", "mm_act_dyn", "conv3_dyn", "act_inner", "small_convs", "small_mms",
                          "resblock_dyn", "mm_big_dyn", "mm_big", "conv_big", "node1"})
GROUP = 3  # timed runs per group: a group's best is one sample, and the median of the samples is kept


def robust_ms(times: list[float]) -> float:
    """The median over groups of ``GROUP`` consecutive runs of each group's fastest run. On a machine that
    other jobs share, a run's time is its own plus the time it was scheduled out; the best of a few runs
    sheds most of the latter, and the median over groups sheds a lucky outlier."""
    groups = [times[i:i + GROUP] for i in range(0, len(times), GROUP)]
    return statistics.median(min(g) for g in groups if g)


def wait_quiet(max_wait_s: float = 20.0, busy: float = 0.25, window_s: float = 0.3) -> tuple[float, float]:
    """Wait, up to ``max_wait_s``, until this machine's CPUs were under ``busy`` busy over one ``window_s``
    (``/proc/stat``; other jobs' bursts on a shared machine); returns (seconds waited, the last busy
    fraction). Where ``/proc/stat`` is missing, returns at once."""
    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)

    t0 = time.perf_counter()
    last = 0.0
    prev = sample()
    while prev is not None:
        time.sleep(window_s)
        cur = sample()
        if cur is None:
            break
        total = cur[0] - prev[0]
        last = 1.0 - (cur[1] - prev[1]) / total if total > 0 else 0.0
        prev = cur
        if last < busy or time.perf_counter() - t0 > max_wait_s:
            break
    return time.perf_counter() - t0, last


_PROBE: dict[str, Any] = {"best": None, "data": None}
#: seconds that the measurements of one process may spend, in all, waiting for a quiet machine: on a machine
#: that other work keeps busy for minutes, waiting at every measurement would only make the run long
WAIT_BUDGET_S = {"left": 90.0}


def probe_ms() -> float:
    """Milliseconds of one short fixed computation on this machine's cores and memory: float32 matmuls
    (BLAS threads) and a 64 MiB copy, the best of three. Slower than this process's best: other work
    shares the CPUs, caches or memory, whether /proc/stat shows it (other processes) or not (other
    virtual machines on the same host)."""
    if _PROBE["data"] is None:
        rng = np.random.default_rng(0)
        _PROBE["data"] = (rng.standard_normal((384, 384)).astype(np.float32),
                          np.ones(16 * 2**20, np.float32), np.empty(16 * 2**20, np.float32))
    a, src, dst = _PROBE["data"]
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(4):
            a @ a
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 1000 * best


def wait_fast(max_wait_s: float = 20.0, slack: float = 1.15) -> tuple[float, float]:
    """Wait, up to ``max_wait_s``, until ``probe_ms`` is within ``slack`` of the fastest probe this process
    has seen; returns (seconds waited, the last probe over the best: 1.0 is an undisturbed machine)."""
    t0 = time.perf_counter()
    while True:
        p = probe_ms()
        _PROBE["best"] = min(_PROBE["best"] or p, p)
        ratio = p / _PROBE["best"]
        if ratio <= slack or time.perf_counter() - t0 > max_wait_s:
            return time.perf_counter() - t0, ratio
        time.sleep(0.5)


def report_key(backend: str, kind: str, precision: str) -> str:
    """The key of one calibration's measurements in a self-test report (``calibration_measurements``): ``backend`` and
    ``backend/precision`` for this CPU, ``backend/kind`` and ``backend/kind/precision`` for another device (``gpu``);
    fp32 names no precision. ``parse_report_key`` reads it."""
    return "/".join([backend] + ([kind] if kind != "cpu" else []) + ([precision] if precision != "fp32" else []))


def parse_report_key(key: str) -> tuple[str, str, str]:
    """(backend, device kind, precision) of a ``report_key``."""
    parts = key.split("/")
    kind = parts.pop(1) if len(parts) > 1 and parts[1] in ("gpu", "igpu", "npu") else "cpu"
    return parts[0], kind, parts[1] if len(parts) > 1 else "fp32"


def quiet_for(device: DeviceSpec) -> float:
    """``measure``'s ``quiet_s`` on ``device``: the waits for idle CPUs guard a CPU's timings; a GPU's are taken
    without them."""
    return 5.0 if device.kind == "cpu" else 0.0


def measure(path: Path, feeds: dict[str, np.ndarray], backend: str, *, repeats: int = 7, warmup: int = 2,
            device: str | None = None, timeout: float = 600.0, options: dict[str, Any] | None = None,
            budget_s: float | None = None, quiet_s: float = 5.0,
            shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Compile ``path`` on ``backend`` in a child process, run it ``warmup + repeats`` times; returns
    ``{"times_ms": [...], "median_ms", "inputs" (the compiled inputs' shapes), "rss_before", "peak_rss",
    "peak_bytes"}`` (peak over the child's resident memory after imports, inputs included, in bytes). ``budget_s``: a
    part whose first run takes over a second gets one warm-up and as many timed runs as fit in this many seconds
    (whole groups of three).
    ``quiet_s``: first wait up to this long for the CPUs to be idle (``wait_quiet``), then up to 2 x as long
    for a probe computation to run at its best speed (``wait_fast``: other virtual machines on the host do not
    show in /proc/stat), so that a shared machine's bursts of other work fall between measurements rather
    than in them. All the waits of one process stop once they add up to ``WAIT_BUDGET_S``. ``shapes``: the graph is
    compiled pinned to these input shapes (``Graph.with_shapes``, after the imports: the pin's memory counts), whatever
    the backend, as a pipeline compiles its parts (``Part.session``)."""
    with tempfile.TemporaryDirectory(prefix="sdrt-measure-") as tmp:
        npz = Path(tmp) / "feeds.npz"
        np.savez(npz, **feeds)
        spec = {"path": str(path), "feeds": str(npz), "backend": backend, "device": device, "repeats": repeats,
                "warmup": warmup, "options": options or {}, "budget_s": budget_s,
                "shapes": {k: [int(d) for d in v] for k, v in (shapes or {}).items()}}
        env = dict(os.environ, SDRT_CACHE_DIR=str(Path(tmp) / "cache"))
        quiet_s = min(quiet_s, WAIT_BUDGET_S["left"])
        waited, busy = wait_quiet(quiet_s) if quiet_s > 0 else (0.0, 0.0)
        slow_wait, slow = wait_fast(min(2 * quiet_s, WAIT_BUDGET_S["left"] - waited)) if quiet_s > 0 else (0.0, 1.0)
        WAIT_BUDGET_S["left"] = max(0.0, WAIT_BUDGET_S["left"] - waited - slow_wait)
        proc = subprocess.run([sys.executable, "-c", "from sdrt.cost.calibrate import _child; _child()"],
                              input=json.dumps(spec), capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {path.name} on {backend} failed: {proc.stderr.strip()[-600:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])  # times_ms: per call
    out["median_ms"] = statistics.median(out["times_ms"])
    out["robust_ms"] = robust_ms(out["times_ms"])
    out["quiet_wait_s"], out["busy_before"] = waited + slow_wait, busy
    out["slow_before"] = slow  # the probe before it over the best probe (1.0: an undisturbed machine)
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it does not inherit the parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> bool:
    """Reset this process's peak resident memory (VmHWM) to its current resident memory (Linux 4.0 and later:
    ``5`` into ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _child() -> None:
    import gc

    import sdrt

    spec = json.loads(sys.stdin.read())
    from sdrt.cache import wait_for_stores
    from sdrt.graph import Graph
    from sdrt.plugins import get_registry
    from sdrt.runtime import select

    get_registry()
    be, dev = select(spec["backend"], spec["device"])
    # a device with memory of its own (a GPU): its memory in use, read between the steps, stands for the resident
    # memory (the weights and activations live there); this first read also starts the device's runtime (CUDA's
    # context), so that the base holds it
    device_before = be.memory_in_use(dev)
    on_device = device_before is not None
    shapes = {k: tuple(v) for k, v in (spec.get("shapes") or {}).items()}
    gc.collect()
    before = device_before if on_device else _rss()  # the inputs count: a part's peak holds them
    with np.load(spec["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    model: Any = Graph.load(spec["path"]).with_shapes(shapes) if shapes else spec["path"]
    sess = sdrt.load(model, backend=spec["backend"], device=spec["device"], **spec["options"])
    # the compile cache's entry is written by a thread of its own (a bf16 SD 1.5 text encoder's 323 MB: hashed and
    # written while the first calls ran, it took one of two cores from them, 28 -> 45 ms a call); a pipeline stores
    # its entries after the job, so the calls are timed once the store is done, and its memory is the compile phase's
    wait_for_stores()
    if on_device:
        _device_child(spec, sess, feeds, before, lambda: be.memory_in_use(dev) or 0)
        return
    compile_peak, compiled = _hwm(), _rss()  # the compile phase's peak, and what it left resident
    reset = _reset_hwm()  # from here VmHWM is the run phase's peak (where the kernel lets it be reset)
    times = _timed_runs(spec, sess, feeds)
    run_peak = _hwm() if reset else 0
    peak = max(compile_peak, run_peak) if reset else _hwm()
    print(json.dumps({"times_ms": times, "inputs": {i.name: list(i.shape) for i in sess.inputs},
                      "rss_before": before, "peak_rss": peak, "peak_bytes": max(0, peak - before),
                      "compile_peak_rss": compile_peak, "compiled_rss": compiled,
                      "run_peak_rss": run_peak if reset else None}))


def _timed_runs(spec: dict[str, Any], sess: Any, feeds: dict[str, np.ndarray],
                after_run: Callable[[], None] | None = None) -> list[float]:
    """``spec``'s warm-ups and timed runs of ``sess``: milliseconds per call of each timed run. A call under 5 ms is
    timed over enough calls to last 5 ms, so that the clock's noise is small; a part whose first run takes over a
    second (with ``budget_s``) gets one warm-up and as many timed runs as fit in the budget (whole groups of
    ``GROUP``, at least one). ``after_run``: called after each run, outside the timing."""
    times = []
    loops = 1
    warm, runs, i = spec["warmup"], spec["warmup"] + spec["repeats"], 0
    while i < runs:
        t = time.perf_counter()
        for _ in range(loops):
            sess.run(feeds)
        dt = time.perf_counter() - t
        if after_run:
            after_run()
        if i >= warm:
            times.append(1000 * dt / loops)
        elif dt < 5e-3:
            loops = max(loops, min(1000, int(5e-3 / max(dt / loops, 1e-7)) + 1))
        elif i == 0 and spec.get("budget_s") and dt > 1.0:
            warm = 1
            runs = 1 + max(GROUP, min(spec["repeats"], GROUP * int(spec["budget_s"] / dt / GROUP)))
        i += 1
    return times


def _device_child(spec: dict[str, Any], sess: Any, feeds: dict[str, np.ndarray], before: int,
                  in_use: Callable[[], int]) -> None:
    """``_child`` on a device with memory of its own: the same runs, and the device's memory in use (``in_use``) as
    the memory figures: after compiling (the weights uploaded, nothing run yet) and the largest after any run (the
    runtime allocates its compute buffers and scratch pools at the first runs); ``host_peak_rss``: the process's own."""
    compiled = in_use()
    peak = [compiled]
    times = _timed_runs(spec, sess, feeds, lambda: peak.append(in_use()))
    run_peak = max(peak)
    # where the nodes ran (a backend that tells: ggml's scheduler may hand an op the device lacks to the CPU)
    placement = sess.placement() if callable(getattr(sess, "placement", None)) else None
    print(json.dumps({"times_ms": times, "inputs": {i.name: list(i.shape) for i in sess.inputs},
                      "rss_before": before, "peak_rss": run_peak, "peak_bytes": max(0, run_peak - before),
                      "compile_peak_rss": compiled, "compiled_rss": compiled, "run_peak_rss": run_peak,
                      "memory": "device", "host_peak_rss": _hwm(), "placement": placement}))


def measure_bandwidth(mb: int = 128, repeats: int = 9) -> float:
    """This machine's copy bandwidth in bytes/s (read + write), from ``robust_ms`` of ``repeats`` copies."""
    a = np.ones(mb * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    return 2 * a.nbytes / (robust_ms(times) or 1e-9)


#: the terms of the time fit besides one FLOPs term per timing class (``TIME_CLASSES``)
TERMS = ("act_ms", "attn_act_ms", "conv_act_ms", "data_ms", "relayout_ms", "relayout_narrow_ms", "weight_ms", "conv_weight_ms", "conv_weight_batch_ms", "stream_weight_ms", "fused_ms", "fused_flops_ms", "io_ms", "nodes", "attn_nodes", "attn_rows", "int_nodes", "shape_nodes", "dyn_nodes", "call")
#: the op classes whose nodes each have a fixed cost of their own on a device with memory of its own (``features``'
#: ``transfers``): a GPU runtime launches kernels per node, as many as the op class takes (ggml on CUDA: a conv is an
#: im2col, a matmul and a bias add; a transpose a copy), where a CPU runtime's fixed cost per node is one figure
NODE_CLASSES = ("matmul", "conv", "attention", "norm", "elementwise", "data")
TERMS += tuple(f"nodes_{c}" for c in NODE_CLASSES) + ("im2col_ms", "matmul_convert_ms", "half_convs")
#: backends that convolve through im2col on a GPU (ggml: ``ggml_conv_2d``), whose buffer the GPU holds beside the
#: activations (``Factors.im2col_memory_factor``)
IM2COL_GPU_BACKENDS = frozenset({"ggml"})


def features(cost: Any, peak: float, bandwidth: float, pinned: bool = False, act_scale: float = 1.0,
             tail32: bool = False, transfers: bool = False, dense_heads: bool = False,
             cache_bytes: float = 0.0) -> dict[str, float]:
    """A part's time features, linear in the factors ``fit`` finds: milliseconds of FLOPs per timing class
    at ``peak`` (``flops_<class>``), milliseconds of traffic at ``bandwidth`` (``act_ms``: activations of
    compute nodes but convs and attention; ``attn_act_ms``: of attention's matmuls and softmax, the scores, which
    the CPU runtimes' fused attention works through per element, not per byte (a bf16 softmax computes in float32:
    OpenVINO's attention cases ran at 0.53-0.63 of their fp32 time at bf16, not 0.5); ``conv_act_ms``: of convs; ``data_ms``: data-movement nodes; ``weight_ms``: weights
    but dense 3x3-and-wider conv kernels, ``conv_weight_ms``: those, ``conv_weight_batch_ms``: those again for
    each image after the first; ``fused_ms``: epilogues; ``fused_flops_ms``: their arithmetic at ``peak``), the
    timed nodes (integer nodes apart: ``int_nodes``; attention's matmuls and softmax again, ``attn_nodes``, and its
    softmax's rows, ``attn_rows``: a fused attention's work per query row), the shape arithmetic of a graph with dynamic dims
    (``shape_nodes``: a runtime that keeps them dynamic runs it every call), every timed node again in such a
    graph (``dyn_nodes``: shape inference per node and call; neither where the backend ran the graph ``pinned``, at
    static shapes), the graph's inputs and outputs at a half precision (``io_ms``: the runtime converts them from and
    to float32 every call; 0 at fp32, but with ``transfers``: a device with memory of its own, a GPU, whose runtime copies
    them from and to the host's memory every call) and the call; ``fixed_ms``: a part not fitted (0 here). ``act_scale``
    multiplies the activation traffic (2: a backend that keeps activations float32 at a half precision,
    ``FLOAT32_ACTIVATION_BACKENDS``). ``tail32``: the backend keeps the graph's tail float32 at a half precision
    (``float32_tail``), so each activation crossing between the tail and the half body (``GraphCost.tail_conversions``)
    is converted by a node of its own: one more node (``nodes``, and ``dyn_nodes``; its traffic, a contiguous copy in
    cache, is left out: OpenVINO converted a 1024 x 320 residual stream to bf16 and back at ~150 GB/s, 26 us a block).
    ``dense_heads``: the backend copies attention's head transposes (``model.copies_heads``); elsewhere they are free.
    ``cache_bytes``: the weight bytes that stay cached between calls (a calibration's ``stream_cache_bytes``, else the
    reported last-level cache; 0: unknown, or a GPU): ``stream_weight_ms``, the weights again where they do not fit
    (``model.streamed_bytes``), which every call reads from memory (``fit_precision`` sets it again from the measured
    threshold, ``effective_cache``)."""
    out: dict[str, float] = {f"flops_{c}": 0.0 for c in TIME_CLASSES}
    out.update({t: 0.0 for t in TERMS}, call=1.0, fixed_ms=0.0)
    out["shape_nodes"] = 0.0 if pinned else float(getattr(cost, "dynamic_shape_nodes", 0))
    if transfers or getattr(cost, "precision", "fp32") != "fp32":  # inputs and outputs copied or converted each call
        out["io_ms"] = 1000 * float(getattr(cost, "io_bytes", 0.0)) / bandwidth
    if transfers:  # a GPU runtime's convs through im2col: the unfolded input written, then read by the matmul
        out["im2col_ms"] = 1000 * 2 * float(getattr(cost, "im2col_bytes", 0.0)) / bandwidth
    for n in cost.nodes:
        if not timed_node(n, dense_heads):
            continue
        if n.fused:
            out["fused_ms"] += 1000 * (n.weight_bytes + act_scale * (n.bytes - n.weight_bytes)) / bandwidth
            out["fused_flops_ms"] += 1000 * n.flops / peak  # its arithmetic (a SiLU's exponentials are not free)
            continue
        if n.time_class == "int":
            out["int_nodes"] += 1
        elif transfers and n.op_class in NODE_CLASSES:
            out[f"nodes_{n.op_class}"] += 1
        else:
            out["nodes"] += 1
        if n.op_class == "attention":  # a fused attention's fixed cost, on top of a node's, and its work per row
            out["attn_nodes"] += 1
            out["attn_rows"] += getattr(n, "rows", 0)
        out[f"flops_{n.time_class if n.time_class in TIME_CLASSES else n.op_class}"] += 1000 * getattr(
            n, "timed_flops", n.flops) / peak
        out["conv_weight_ms" if n.time_class in DENSE_CONVS else "weight_ms"] += 1000 * n.weight_bytes / bandwidth
        if n.time_class in DENSE_CONVS:
            out["conv_weight_batch_ms"] += 1000 * (n.batch - 1) * n.weight_bytes / bandwidth
        key = ("data_ms" if n.op_class == "data" else "conv_act_ms" if n.op_class == "conv" else "attn_act_ms"
               if n.op_class == "attention" else "act_ms")
        out[key] += 1000 * act_scale * (n.bytes - n.weight_bytes) / bandwidth
    out["stream_weight_ms"] = 1000 * streamed_bytes(cost, cache_bytes) / bandwidth
    if act_scale != 1.0:  # float32 activations into half matmuls
        out["matmul_convert_ms"] = 1000 * act_scale * matmul_input_bytes(cost) / bandwidth
        out["half_convs"] = float(half_convs(cost))  # ... and half convs' fixed cost
    if tail32 and getattr(cost, "precision", "fp32") != "fp32" and getattr(cost, "tail_conversions", 0):
        out["nodes"] += cost.tail_conversions
    out["relayout_ms"] = 1000 * act_scale * getattr(cost, "relayout_bytes", 0.0) / bandwidth
    out["relayout_narrow_ms"] = 1000 * act_scale * getattr(cost, "relayout_narrow_bytes", 0.0) / bandwidth
    if getattr(cost, "dynamic", False) and not pinned:  # a runtime that keeps the dims dynamic infers shapes per call
        out["dyn_nodes"] = out["nodes"] + out["int_nodes"] + sum(out[f"nodes_{c}"] for c in NODE_CLASSES)
    return out


def case_row(name: str, cost: Any, m: dict[str, Any], *, peak: float, bandwidth: float, pinned: bool = False,
             scale: float = 1.0, tail: bool = False, transfers: bool = False, dense_heads: bool = False,
             plain_pixels: int = 0, cache_bytes: float = 0.0) -> dict[str, Any]:
    """One calibration case's row for the fit: its measurement ``m`` (``measure``'s figures) and what the fit reads of
    its ``GraphCost`` (features, weights, activations as the runtime holds them: ``scale`` x at a half precision on a
    backend that keeps them float32; ``tail``: with the graph's tail float32, ``float32_tail``). ``pinned``: the backend
    ran the case at static shapes; ``plain_pixels``: the backend holds the kernels of convs on maps of at most so many
    output pixels as stored (``Factors.plain_conv_pixels``); ``cache_bytes``: the CPU's last-level cache (``features``).
    Stored measurements
    (``--calibrate --report``) are refitted through this with the cost code of the day (``scripts/refit_calibration.py``)."""
    largest_conv, largest_other = largest_weights(cost, plain_pixels)
    return {"case": name, "features": features(cost, peak, bandwidth, pinned=pinned, act_scale=scale, tail32=tail,
                                               transfers=transfers, dense_heads=dense_heads, cache_bytes=cache_bytes),
            "timed": name.removeprefix("cal_") not in MEMORY_CASES, "pinned": pinned,
            "median_ms": m["median_ms"], "robust_ms": m["robust_ms"], "times_ms": m["times_ms"],
            "pass_ms": m.get("pass_ms", [m["robust_ms"]]),
            "busy_before": m.get("busy_before"), "slow_before": m.get("slow_before"),
            "peak_bytes": m["peak_bytes"], "peak_rss": m["peak_rss"], "rss_before": m["rss_before"],
            "compile_peak_rss": m.get("compile_peak_rss"), "run_peak_rss": m.get("run_peak_rss"),
            "compiled_rss": m.get("compiled_rss"), "pinned_peak_rss": m.get("pinned_peak_rss"),
            # compiled with its dims dynamic (not pinned by a backend that needs static shapes)
            "dynamic": bool(cost.dynamic) and not pinned,
            "io_bytes": cost.io_bytes, "stream_bytes": stream_candidate_bytes(cost), "cache_bytes": cache_bytes,
            "weight_bytes": cost.weight_bytes, "table_bytes": cost.table_bytes,
            "largest_conv_bytes": largest_conv, "largest_weight_bytes": largest_other,
            "attention": any(n.op_class == "attention" for n in cost.nodes),
            "conv_weight_bytes": conv_weight_bytes(cost, plain_pixels), "mem_nodes": memory_nodes(cost),
            # activations as the runtime holds them (float32 where it keeps them so)
            "activation_bytes": scale * (cost.peak_activation_bytes_tail if tail and cost.peak_activation_bytes_tail
                                         is not None else cost.peak_activation_bytes_inplace),
            "activation_bytes_fused": scale * cost.peak_activation_bytes_fused,
            "input_bytes": scale * cost.input_bytes, "output_bytes": scale * cost.output_bytes,
            "small_weight_bytes": cost.small_weight_bytes,
            "largest_relayout_bytes": scale * cost.largest_relayout_bytes,
            "epilogue_weight_bytes": cost.epilogue_weight_bytes, "flops": cost.flops,
            "inflight_bytes": inflight_bytes(cost)}


def calibrate(backend: str, *, device: DeviceSpec | None = None, repeats: int = 9, workdir: Path | None = None,
              progress: Callable[[str], None] | None = None, precision: str = "fp32", passes: int = 2,
              reference: Factors | None = None, device_id: str | None = None) -> tuple[Factors, list[dict[str, Any]]]:
    """Time the calibration cases on ``backend`` here, compiled at ``precision``, and fit its factors;
    returns (factors, the measurements). Every case is measured in each of ``passes`` passes over all the
    cases, and the pass with the lower robust time is kept: on a shared machine a burst of other work lasting
    seconds (which the waits before each measurement cannot always see) then spoils a case only if it comes
    back at the same case in every pass. ``reference``: the float32 calibration of the same backend, whose
    ``SHARED_TERMS`` a half precision on a ``FLOAT32_ACTIVATION_BACKENDS`` backend holds (``held_terms``).
    ``device_id``: the backend's device to run on (``sdrt info`` lists them; default: the backend's choice), ``device``
    its library spec (``devices.for_runtime``; default: this CPU). On a device with memory of its own (a GPU) the
    memory figures are the device's (``Backend.memory_in_use``) and the traffic unit is the spec's bandwidth (the
    fitted efficiencies carry what it reaches); on a CPU the unit is a measured copy."""
    dev = device or this_cpu()
    bw = measure_bandwidth() if dev.kind == "cpu" else dev.bandwidth_bytes_per_s
    quiet = quiet_for(dev)
    peak = dev.peak(precision)
    scale = case_activation_scale(backend, precision)
    plain = plain_conv_pixels(backend, device_id, precision)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="sdrt-calibrate-") as tmp:
        folder = Path(workdir or tmp)
        cache = dev.cache_bytes if dev.kind == "cpu" else 0
        counts = {case: sized_count(case, cache, precision) for case in SIZED_CASES}
        built = [case_cost(case, folder, precision, counts.get(case)) for case in CASES
                 if (case not in RELAYOUT_CASES or backend in RELAYOUT_BACKENDS) and counts.get(case) != 0]
        for _ in range(max(1, passes)):
            for name, path, feeds, cost in built:
                if progress:
                    progress(f"{backend}: {name}")
                pinned = False
                try:
                    m = measure(path, feeds, backend, repeats=repeats, options={"precision": precision},
                                device=device_id, quiet_s=quiet)
                except RuntimeError as exc:  # a backend that compiles static shapes only: pinned, as sdrt runs it
                    if not cost.dynamic or "dynamic" not in str(exc):
                        raise
                    m = measure(path, feeds, backend, repeats=repeats, options={"precision": precision},
                                shapes={k: v.shape for k, v in feeds.items()}, device=device_id, quiet_s=quiet)
                    pinned = True
                if name in rows and rows[name]["robust_ms"] <= m["robust_ms"]:
                    rows[name]["pass_ms"].append(m["robust_ms"])
                    continue
                prev = rows[name]["pass_ms"] if name in rows else []
                rows[name] = case_row(name, cost, m, peak=peak, bandwidth=bw, pinned=pinned, scale=scale,
                                      tail=float32_tail(backend, precision), transfers=dev.kind != "cpu",
                                      dense_heads=copies_heads(backend, dev.kind), plain_pixels=plain,
                                      cache_bytes=cache)
                rows[name]["pass_ms"] = prev + [m["robust_ms"]]
                rows[name]["args"] = list(CASE_SPECS[name.removeprefix("cal_")][1])  # as built (a refit builds it so)
                if name.removeprefix("cal_") in counts:  # a sized case: built again as measured (a refit)
                    rows[name]["count"] = counts[name.removeprefix("cal_")]
        # what pinning first adds (Factors.pin_bytes): the one-node case again, its shapes pinned; none for a backend
        # that compiles static shapes only, whose dynamic cases were pinned, so that their rows hold it (ggml's tiny
        # SDXL parts, pinned, were predicted within 2 MiB without it, and 1.21 x over imports with it)
        if not any(r["pinned"] for r in rows.values()):
            name, path, feeds, _ = next(b for b in built if b[0] == "cal_call")
            if progress:
                progress(f"{backend}: {name}, pinned")
            pin = measure(path, feeds, backend, repeats=3, options={"precision": precision},
                          shapes={k: v.shape for k, v in feeds.items()}, device=device_id, quiet_s=quiet)
            rows["cal_call"]["pinned_peak_rss"] = pin["peak_rss"]  # fit() reads it: Factors.pin_bytes
    out = list(rows.values())
    return fit_precision(out, bw, backend, precision, dev, reference, plain_pixels=plain), out


def plain_conv_pixels(backend: str, device_id: str | None, precision: str) -> int:
    """``Backend.plain_conv_pixels`` of ``backend`` on its device (``device_id``, or its choice) at ``precision``."""
    from ..plugins import get_registry
    from ..runtime import select

    get_registry()
    be, dev = select(backend, device_id)
    return int(be.plain_conv_pixels(dev, precision))


def case_cost(case: str, folder: Path, precision: str, count: int | None = None, args: tuple[Any, ...] | None = None
              ) -> tuple[str, Path, dict[str, np.ndarray], Any]:
    """Calibration case ``case`` built (``count``: a ``SIZED_CASES`` case's; ``args``: a stored measurement's,
    ``measured_args``), written into ``folder`` and costed at ``precision``: (its graph's name, the ONNX file, its
    feeds, its ``GraphCost``)."""
    from ..graph import Graph

    model, feeds = build_case(case, count, args)
    path = folder / f"{model.graph.name}.onnx"
    path.write_bytes(model.SerializeToString())
    return model.graph.name, path, feeds, graph_costs(Graph.load(path), {k: v.shape for k, v in feeds.items()},
                                                      precision)


def case_activation_scale(backend: str, precision: str) -> float:
    """The factor on a case's activation bytes at ``precision`` as ``backend`` holds them (``case_row``'s ``scale``):
    float32 where the backend keeps activations so at a half precision."""
    return activation_scale(precision, Factors({}, {}, float32_activations=float32_activations(backend, precision)))


def fit_precision(rows: list[dict[str, Any]], bandwidth: float, backend: str, precision: str, device: DeviceSpec,
                  reference: Factors | None = None, plain_pixels: int = 0) -> Factors:
    """``backend``'s factors at ``precision`` fitted from its cases' ``rows`` (``case_row``): a half precision on a
    ``FLOAT32_ACTIVATION_BACKENDS`` backend holds ``reference``'s ``SHARED_TERMS`` (``held_terms``, scaled by the
    device's peaks), and a ``FLOAT32_TAIL_BACKENDS`` one counts the graph's float32 tail."""
    act32 = float32_activations(backend, precision)
    cache = effective_cache(rows, max((float(r.get("cache_bytes") or 0.0) for r in rows), default=0.0))
    rows = [_stream_feature(r, cache, bandwidth) for r in rows if r["case"].removeprefix("cal_") not in LADDER_CASES]
    f = fit(rows, bandwidth, backend, float32_activations=act32, held=half_held(backend, precision, device, reference),
            tail32=float32_tail(backend, precision), held_memory=half_held_memory(precision, reference))
    gpu = device.kind != "cpu"
    return dataclasses.replace(f, host_transfers=gpu, im2col_memory_factor=1.0 if gpu and backend in IM2COL_GPU_BACKENDS
                               else 0.0, plain_conv_pixels=plain_pixels,
                               stream_cache_bytes=cache if f.stream_weight_bandwidth_efficiency is not None else 0.0)


def _stream_feature(row: dict[str, Any], cache: float, bandwidth: float) -> dict[str, Any]:
    """``row`` with its ``stream_weight_ms`` feature for weights past ``cache`` bytes (``effective_cache``)."""
    if "stream_bytes" not in row or not row.get("features"):
        return row
    past = past_cache(float(row["stream_bytes"]), cache)
    return {**row, "features": {**row["features"], "stream_weight_ms": 1000 * past / bandwidth}}


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (an active set, dropping the most negative each round)."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            x[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return x


def _fit_times(rows: list[dict[str, Any]], held: dict[str, float] | None = None) -> dict[str, float]:
    """Every case at once: ``time - fixed = sum of features x coefficients`` (``features``), fitted with
    non-negative coefficients, each case weighted by 1/time (relative errors count alike, large case or
    small). ``held``: coefficients taken as they are (their terms' time is subtracted first; ``held_terms``).
    Returns the coefficient of each feature (1/efficiency for the ms terms; ms for nodes, call)."""
    held = held or {}
    timed = [r for r in rows if r.get("features") and r["robust_ms"] > 0 and r.get("timed", True)]
    names = [f"flops_{c}" for c in TIME_CLASSES] + list(TERMS)
    names = [k for k in names if any(r["features"].get(k) for r in timed) and k not in held]
    a = np.array([[r["features"].get(k, 0.0) for k in names] for r in timed])
    y = np.array([r["robust_ms"] for r in timed])
    fixed = np.array([r["features"].get("fixed_ms", 0.0) + sum(c * r["features"].get(k, 0.0) for k, c in held.items())
                      for r in timed])
    x = _nnls(a / y[:, None], np.maximum(y - fixed, 0.0) / y)
    return {**dict(zip(names, (float(v) for v in x))), **held}


#: the time terms of the work that a half precision leaves as it is on a ``FLOAT32_ACTIVATION_BACKENDS`` backend (its
#: float32 kernels: attention, softmax, norms, elementwise, data movement, depthwise convs, epilogues, the nodes' and
#: the call's fixed costs): its half-precision calibration holds them at the float32 calibration's coefficients
#: (``held_terms``) and fits only the matmuls, dense convs, weight traffic and the inputs' and outputs' conversion.
#: Fitted afresh, these terms were split differently among themselves at each precision (ggml's softmax came out 25%
#: faster at bf16 for the same float32 kernel), which put the tiny SDXL UNet at 512 px at 0.60 of its measured time
SHARED_TERMS = ("flops_dwconv", "flops_attention", "flops_softmax", "flops_norm", "flops_groupnorm",
                "flops_elementwise", "flops_data", "act_ms", "attn_act_ms", "data_ms", "relayout_ms", "relayout_narrow_ms", "fused_ms",
                "fused_flops_ms", "nodes", "attn_nodes", "attn_rows", "int_nodes", "shape_nodes", "dyn_nodes", "call",
                *(f"nodes_{c}" for c in NODE_CLASSES))


#: (backend, precision) -> the CPU feature with which that backend runs its attention at that precision in a kernel of
#: its own, not the float32 one: sdrt-ggml's attention without a mask on AMX tiles at bf16 (``sdrt_ggml.native``,
#: since 2026-12-02; the calibration's attention cases ran 2.6-3.5x faster than at fp32 on Sapphire Rapids, where
#: holding the float32 terms predicted the full-size SDXL UNet at 1.34-1.51x its time). Its half-precision fit leaves
#: ``ATTENTION_TERMS`` free there
HALF_ATTENTION = {("ggml", "bf16"): "amx_bf16"}
ATTENTION_TERMS = ("flops_attention", "attn_act_ms", "attn_rows")


def half_held(backend: str, precision: str, device: DeviceSpec, reference: Factors | None) -> dict[str, float]:
    """The time coefficients ``backend``'s fit at ``precision`` on ``device`` holds at the float32 calibration's
    (``reference``): ``held_terms`` on a ``FLOAT32_ACTIVATION_BACKENDS`` backend at a half precision, less the attention
    terms where its attention is a half-precision kernel of its own (``half_attention``); {} otherwise."""
    if not float32_activations(backend, precision):
        return {}
    held = held_terms(reference, device.peak(precision), device.peak("fp32"))
    if half_attention(backend, precision, device):
        held = {k: v for k, v in held.items() if k not in ATTENTION_TERMS}
    return held


def half_held_memory(precision: str, reference: Factors | None) -> dict[str, float]:
    """The memory factors a half-precision fit holds at the float32 calibration's (``reference``): the activations'
    (``Factors.activation_factor``, bytes held per byte of live activations at the precision), which is the runtime's
    memory plan and not the element's size. Fitted afresh at bf16, OpenVINO's came out at 0.79 against float32's 1.13,
    traded against the outputs' factor on cases whose outputs are as large as their activations, and the SDXL VAE
    decoder at 768 px was predicted at 0.76 of its peak (1.24 bytes held per live byte at both precisions, Xeon family
    6 model 167, 2026-12-07); held, 0.95. {} at fp32 or without a reference."""
    if precision == "fp32" or reference is None or not reference.calibrated:
        return {}
    return {"activation_factor": float(reference.activation_factor)}


def half_attention(backend: str, precision: str, device: DeviceSpec) -> bool:
    """Whether ``backend`` runs attention at ``precision`` in its own half-precision kernel on ``device``
    (``HALF_ATTENTION``)."""
    flag = HALF_ATTENTION.get((backend, precision))
    return flag is not None and device.kind == "cpu" and flag in (device.isa or ())


def held_terms(reference: Factors | None, peak: float, reference_peak: float) -> dict[str, float]:
    """The ``SHARED_TERMS`` coefficients of ``reference`` (the float32 calibration) for a half-precision fit whose
    FLOPs features are at ``peak`` (those of ``reference`` at ``reference_peak``): {} without a reference."""
    coef = (reference.fit or {}).get("coefficients") if reference is not None else None
    if not coef:
        return {}
    return {k: float(coef.get(k, 0.0)) * (peak / reference_peak if k.startswith("flops_") or k == "fused_flops_ms"
                                          else 1.0)  # FLOPs at the peak: a feature at twice the peak is half as large
            for k in SHARED_TERMS}


def _inv(c: float | None) -> float:
    """An efficiency from a fitted time coefficient (1 / c; a term the fit found free gets 100)."""
    return 1.0 / c if c and c > 1e-9 else 100.0


#: a calibration case with fewer bytes of weights and activations than this measures the session alone
SMALL = 4 * 2**20


def _fit_memory(rows: list[dict[str, Any]], relayout: bool = True, held: dict[str, float] | None = None
                ) -> dict[str, float]:
    """``peak = weight_factor x weights + conv_weight_factor x conv kernels + table_factor x lookup tables
    + transient factors x the largest conv kernel and the largest other weight + activation_factor x activations
    + node_bytes x nodes + base``. The runtime's base is the whole process's peak (VmHWM) on the ``runtime`` case
    (one node of every kind: the interpreter, sdrt, the backend's libraries and the code of every op kind);
    the bytes per node from the tiny cases (``nodes`` against ``call``); over what the one-kind ``call`` case
    held (each case loads one or two kinds of op, not all): the activation factor from the weight-free cases
    without attention, then the weight factors a non-negative fit, on bytes, of the cases with a MiB of weights.
    ``held``: factors taken as they are (``half_held_memory``: the activation factor). Returns the factors by name
    (``base`` and ``imports``: bytes of the whole process)."""
    held = held or {}
    by = {str(r.get("case", "")).removeprefix("cal_"): r for r in rows}
    small = [r for r in rows if r["weight_bytes"] + r["activation_bytes"] < SMALL]
    one = by.get("call") or (min(small, key=lambda r: r["peak_bytes"]) if small else None)
    base_fit = float(one["peak_bytes"]) if one else 0.0
    per_node = 0.0
    many = by.get("nodes")
    # against the same op once (``node1``), where measured: the code a runtime loads for an op kind is not a node's
    # (OpenVINO's bf16 matmul kernels took 5 MiB, which the one-Add ``call`` case left to the 400 nodes: 128 kB a node)
    first = by.get("node1") or one
    if first and many and many.get("mem_nodes", 1) > first.get("mem_nodes", 1):
        per_node = max(0.0, (many["peak_bytes"] - first["peak_bytes"]) / (many["mem_nodes"] - first.get("mem_nodes", 1)))
    imports = float(np.median([r["rss_before"] for r in rows if r.get("rss_before")])) if any(
        r.get("rss_before") for r in rows) else 0.0
    rt = by.get("runtime")
    base = float(rt["peak_rss"]) if rt and rt.get("peak_rss") else imports + base_fit
    out = {"weight_factor": 1.0, "conv_weight_factor": 1.0, "table_factor": 1.0, "transient_conv_factor": 0.0,
           "transient_factor": 0.0, "activation_factor": 1.0, "node_bytes": per_node, "base": base,
           "imports": imports}
    # activations: the weight-free cases without attention (these CPU backends fuse attention, so its scores
    # never take the memory that liveness counts for them), a line through the origin in bytes
    act = [r for r in rows if r["weight_bytes"] < 0.01 * r["activation_bytes"] and r["activation_bytes"] >= SMALL
           and not r.get("attention")]
    af = held.get("activation_factor")
    if act and af is None:
        av = np.array([float(r["activation_bytes"]) for r in act])
        ay = np.array([float(r["peak_bytes"]) - base_fit for r in act])
        af = max(float(av @ ay / (av @ av)), 0.0)
    # weights: the cases with at least a MiB of them but the per-node one, fitted on bytes (a budget counts
    # bytes: a case of a few MiB, mostly fixed costs, must not set the factor for gigabytes of weights)
    big = [r for r in rows if r["weight_bytes"] >= SMALL / 4 and r is not many]
    if not big:
        return out
    cols = []
    for r in big:
        cw = float(r.get("conv_weight_bytes", 0.0))
        tb = float(r.get("table_bytes", 0.0))
        cols.append([r["weight_bytes"] - cw - tb, cw, tb, float(r.get("largest_conv_bytes", 0.0)),
                     float(r.get("largest_weight_bytes", 0.0)), 0.0 if af is not None else r["activation_bytes"]])
    a = np.array(cols)
    y = np.array([float(r["peak_bytes"]) for r in big])
    rest = y - base_fit - per_node * np.array([float(r.get("mem_nodes", 1)) for r in big])
    if af is not None:
        rest -= af * np.array([float(r["activation_bytes"]) for r in big])
    keep = [i for i in range(a.shape[1]) if a[:, i].any()]
    x = np.zeros(a.shape[1])
    x[keep] = _nnls(a[:, keep], rest)
    for k, v in zip(("weight_factor", "conv_weight_factor", "table_factor", "transient_conv_factor",
                     "transient_factor", "activation_factor"), x):
        out[k] = float(v)
    if af is not None:
        out["activation_factor"] = af
    if not a[:, 2].any():
        out["table_factor"] = out["weight_factor"]
    if all(r.get("run_peak_rss") and r.get("compile_peak_rss") for r in rows) and one is not None:
        out.update(_fit_phases(rows, one, many, per_node, relayout, held))
    return out


#: backends that run narrow convs channels-last and copy their outputs to planar for a norm and back (OpenVINO's CPU
#: plugin: Reorder nodes acdb -> abcd before each MVN and abcd -> acdb after it, in its runtime model of a VAE); the
#: run phase's ``dynamic_relayout_memory_factor`` is fitted for these only. ggml runs its convs planar: its graph
#: allocator placed the ``resblock_dyn`` case's maps (pinned) in 48.1 MiB (``ggml_gallocr_get_buffer_size``), the
#: in-place count's 48.0
RELAYOUT_BACKENDS = frozenset({"openvino"})
#: backends that keep their activations float32 at a half precision, making only the matmul and conv weights half:
#: ggml (``sdrt_ggml.half``: biases, norms, softmax and attention, depthwise convs and every activation stay float32;
#: its bf16 kernels round each activation block as they read it). Their bf16 calibration and plans count activations
#: at 4 bytes (``Factors.float32_activations``); OpenVINO's bf16 runs its activations bf16
FLOAT32_ACTIVATION_BACKENDS = frozenset({"ggml"})


def float32_activations(backend: str, precision: str) -> bool:
    """Whether ``backend`` keeps its activations float32 at ``precision`` (a half precision on a
    ``FLOAT32_ACTIVATION_BACKENDS`` backend)."""
    return backend in FLOAT32_ACTIVATION_BACKENDS and precision in ("bf16", "fp16")


#: backends that convert their weights one at a time as they lower the nodes, in the nodes' order (ggml: bf16 panels,
#: Winograd kernels), so that one weight's temporaries are in flight at a time on top of the weights before it
#: (``Factors.sequential_transients``). The calibration cases repeat one weight, so the last is the largest and the
#: transient factors fit as the largest weight's
SEQUENTIAL_WEIGHT_BACKENDS = frozenset({"ggml"})

#: backends that keep a graph's tail float32 at a half precision (``sdrt.cost.nodes.float32_tail_values``: OpenVINO's CPU
#: plugin runs what follows the last conv, matmul or resize on the way to an output in float32, and so a graph without
#: them wholly: the weight-free calibration cases, a SiLU, a norm, a transpose, ran as f32 layers at bf16)
FLOAT32_TAIL_BACKENDS = frozenset({"openvino"})


def float32_tail(backend: str, precision: str) -> bool:
    """Whether ``backend`` keeps a graph's tail float32 at ``precision`` (a half precision on a
    ``FLOAT32_TAIL_BACKENDS`` backend)."""
    return backend in FLOAT32_TAIL_BACKENDS and precision in ("bf16", "fp16")


#: the cases that measure those copies' memory, run on ``RELAYOUT_BACKENDS`` only
RELAYOUT_CASES = frozenset({"resblock_dyn"})

#: the memory factors of the two phases, by the feature they multiply (``_fit_phases``)
COMPILE_TERMS = ("compile_weight_factor", "compile_conv_weight_factor", "compile_table_factor",
                 "transient_conv_factor", "transient_factor", "compile_input_factor", "compile_small_factor")
RUN_TERMS = ("weight_factor", "conv_weight_factor", "table_factor", "activation_factor", "output_factor",
             "retained_factor")


def _phase_columns(r: dict[str, Any]) -> dict[str, float]:
    cw = float(r.get("conv_weight_bytes", 0.0))
    tb = float(r.get("table_bytes", 0.0))
    other = float(r["weight_bytes"]) - cw - tb
    return {"compile_weight_factor": other, "compile_conv_weight_factor": cw, "compile_table_factor": tb,
            "transient_conv_factor": float(r.get("largest_conv_bytes", 0.0)),
            "transient_factor": float(r.get("largest_weight_bytes", 0.0)),
            "compile_input_factor": float(r.get("input_bytes", 0.0)),
            "compile_small_factor": float(r.get("small_weight_bytes", 0.0)),
            "weight_factor": other, "conv_weight_factor": cw, "table_factor": tb,
            "activation_factor": max(0.0, float(r["activation_bytes"]) - float(r.get("input_bytes", 0.0))),
            "output_factor": float(r.get("output_bytes", 0.0)),
            "retained_factor": float(r.get("small_weight_bytes", 0.0))}


def _fit_phases(rows: list[dict[str, Any]], one: dict[str, Any], many: dict[str, Any] | None,
                per_node: float, relayout: bool = True, held: dict[str, float] | None = None) -> dict[str, float]:
    """The two phases' memory factors (``Factors.compile_weight_factor`` ...), where the child reset its peak
    after compiling: the compile phase's peak over the one-node case's, a non-negative fit in bytes over the
    static cases of the weights (conv kernels, tables apart), the largest kernel and other weight (in flight
    while one is transformed) and the inputs and outputs; the run phase's likewise of the weights as held and
    the activations; then, on the cases compiled with dynamic dims and a MiB of weights, the weights' and
    conv kernels' factors of each phase for a dynamic graph (the static fit's other terms taken as they are). ``held``:
    run-phase factors taken as they are (their terms subtracted first)."""
    held = held or {}
    out: dict[str, float] = {}
    static = [r for r in rows if not r.get("dynamic") and r is not many]
    one_nodes = float(one.get("mem_nodes", 1))

    def target(rs: list[dict[str, Any]], key: str) -> np.ndarray:
        return np.array([float(r[key]) - float(one[key]) - per_node * (float(r.get("mem_nodes", 1)) - one_nodes)
                         for r in rs])

    for terms, key in ((COMPILE_TERMS, "compile_peak_rss"), (RUN_TERMS, "run_peak_rss")):
        kept = {t: held[t] for t in terms if t in held}
        terms = tuple(t for t in terms if t not in kept)
        a = np.array([[_phase_columns(r)[t] for t in terms] for r in static])
        y = target(static, key) - np.array([sum(v * _phase_columns(r)[t] for t, v in kept.items()) for r in static])
        keep = [i for i in range(a.shape[1]) if a[:, i].any()]
        x = np.zeros(a.shape[1])
        if keep:
            x[keep] = _nnls(a[:, keep], y)
        out.update({t: float(v) for t, v in zip(terms, x)}, **kept)
    dyn = [r for r in rows if r.get("dynamic") and r["weight_bytes"] >= SMALL / 4]
    for terms, key, name in ((COMPILE_TERMS, "compile_peak_rss", "dynamic_compile"),
                             (RUN_TERMS, "run_peak_rss", "dynamic_run")):
        if not dyn:
            break
        # the other weights apart from those of matmuls with an activation epilogue, then kernels, tables, those;
        # compiling, the float32 weights in flight while a half copy is made (``Factors.dynamic_compile_inflight_factor``:
        # at most ``HALF_COPY_CHUNK_BYTES`` at once, so only a case past that, ``mm_big_dyn``, tells them from the weights)
        inflight = key == "compile_peak_rss"
        a = np.array([[_phase_columns(r)[terms[0]] - float(r.get("epilogue_weight_bytes", 0.0))]
                      + [_phase_columns(r)[t] for t in terms[1:3]] + [float(r.get("epilogue_weight_bytes", 0.0))]
                      + ([float(r.get("inflight_bytes", 0.0))] if inflight else []) for r in dyn])
        rest = np.array([sum(out[t] * _phase_columns(r)[t] for t in terms[3:]) for r in dyn])  # as the static fit
        keep = [i for i in range(a.shape[1]) if a[:, i].any()]
        # a kind no dynamic case holds: as static; no half copy: none in flight
        x = np.array([out[t] for t in terms[:3]] + [out[terms[0]]] + ([0.0] if inflight else []))
        if keep:
            x[keep] = _nnls(a[:, keep], target(dyn, key) - rest)
        for suffix, v in zip(("weight_factor", "conv_weight_factor", "table_factor", "epilogue_weight_factor",
                              "inflight_factor"), x):
            out[f"{name}_{suffix}"] = float(v)
    # the layout copies of a graph compiled with dynamic dims (OpenVINO allocates a dynamic graph's buffers as it
    # runs, without the static memory plan, which shares the copies' memory with the rest): a line through the
    # origin over what the static fit's terms leave, on the dynamic cases with copies
    relay = [r for r in rows if r.get("dynamic") and float(r.get("largest_relayout_bytes", 0.0)) > 0] if relayout else []
    if relay:
        v = np.array([float(r["largest_relayout_bytes"]) for r in relay])
        rest = np.array([sum(out[t] * _phase_columns(r)[t] for t in RUN_TERMS) for r in relay])
        out["dynamic_relayout_memory_factor"] = max(0.0, float(v @ (target(relay, "run_peak_rss") - rest) / (v @ v)))
    return out


def fit(rows: list[dict[str, Any]], bandwidth: float, backend: str, float32_activations: bool = False,
        held: dict[str, float] | None = None, tail32: bool = False, held_memory: dict[str, float] | None = None
        ) -> Factors:
    """The factors from the calibration measurements (``_fit_times``, ``_fit_memory``); ``float32_activations``:
    the rows' activation features count float32 activations at a half precision (``Factors.float32_activations``);
    ``held``: time coefficients taken as they are (``held_terms``); ``tail32``: the rows' activations hold the
    graph's tail float32 (``Factors.float32_tail``); ``held_memory``: memory factors taken as they are
    (``half_held_memory``)."""
    c = _fit_times(rows, held)
    # a narrow matmul or large conv no case measured (rows without the class) takes its op class's efficiency
    # (``predict``'s fallback)
    eff = {k: _inv(c.get(f"flops_{k}")) for k in TIME_CLASSES if k not in OPTIONAL_CLASSES or f"flops_{k}" in c}
    over = {k: c.get("nodes", 0.0) / 1000.0 for k in TIME_CLASSES}  # ms -> s per node
    if any(r.get("features", {}).get(f"nodes_{k}") for r in rows for k in NODE_CLASSES):  # per op class (a GPU's
        # launches; ``features``' transfers): a time class (conv1x1, groupnorm) falls back to its op class's
        over = {k: c.get(f"nodes_{k}", 0.0) / 1000.0 for k in NODE_CLASSES}
    over["int"] = c.get("int_nodes", c.get("nodes", 0.0)) / 1000.0  # integer work (on the host, for some runtimes)
    base = dict(over)  # attention's matmuls and softmax: a fused attention's fixed cost on top of their class's
    for k in ("attention", "softmax"):
        over[k] = base.get(k, base.get("attention", 0.0)) + c.get("attn_nodes", 0.0) / 1000.0
    mem = _fit_memory(rows, relayout=backend in RELAYOUT_BACKENDS, held=held_memory)
    fused = c.get("fused_ms", 0.0)
    # what pinning a part's shapes first adds (the one-node case measured again pinned, where the calibration did)
    call = next((r for r in rows if r.get("case") == "cal_call" and r.get("pinned_peak_rss")), None)
    pin = max(0.0, float(call["pinned_peak_rss"]) - float(call["peak_rss"])) if call else 0.0
    return Factors(eff, over, mem["weight_factor"], mem["activation_factor"], mem["base"], True, bandwidth,
                   f"sdrt selftest --calibrate ({backend})",
                   additive=True, bandwidth_efficiency=_inv(c.get("act_ms")),
                   data_bandwidth_efficiency=_inv(c.get("data_ms")),
                   relayout_bandwidth_efficiency=_inv(c.get("relayout_ms")),
                   io_bandwidth_efficiency=_inv(c.get("io_ms")),
                   im2col_bandwidth_efficiency=_inv(c.get("im2col_ms")) if "im2col_ms" in c else None,
                   relayout_narrow_bandwidth_efficiency=_inv(c.get("relayout_narrow_ms")),
                   conv_bandwidth_efficiency=_inv(c.get("conv_act_ms")),
                   attention_bandwidth_efficiency=_inv(c.get("attn_act_ms")) if "attn_act_ms" in c else None,
                   conv_weight_factor=mem["conv_weight_factor"], node_bytes=mem["node_bytes"],
                   table_factor=mem["table_factor"], transient_conv_factor=mem["transient_conv_factor"],
                   transient_factor=mem["transient_factor"], process_base=True, imports_bytes=mem["imports"],
                   fused_attention_memory=True, inplace_activations=True,
                   weight_bandwidth_efficiency=_inv(c.get("weight_ms")),
                   conv_weight_bandwidth_efficiency=_inv(c.get("conv_weight_ms")),
                   conv_weight_batch_bandwidth_efficiency=_inv(c.get("conv_weight_batch_ms")),
                   fused_bandwidth_efficiency=1.0 / fused if fused > 1e-9 else 0.0,
                   fused_flops_efficiency=_inv(c.get("fused_flops_ms")),
                   matmul_convert_bandwidth_efficiency=_inv(c.get("matmul_convert_ms")),
                   half_conv_node_s=c.get("half_convs", 0.0) / 1000.0,
                   stream_weight_bandwidth_efficiency=_inv(c["stream_weight_ms"]) if "stream_weight_ms" in c else None,
                   call_s=c.get("call", 0.0) / 1000.0, attention_row_s=c.get("attn_rows", 0.0) / 1000.0, shape_node_s=c.get("shape_nodes", 0.0) / 1000.0,
                   dynamic_node_s=c.get("dyn_nodes", 0.0) / 1000.0, float32_activations=float32_activations,
                   sequential_transients=backend in SEQUENTIAL_WEIGHT_BACKENDS, float32_tail=tail32, pin_bytes=pin,
                   **{k: mem[k] for k in ("compile_weight_factor", "compile_conv_weight_factor", "compile_table_factor",
                                          "compile_input_factor", "dynamic_compile_weight_factor",
                                          "dynamic_compile_conv_weight_factor", "dynamic_compile_table_factor",
                                          "dynamic_run_weight_factor", "dynamic_run_conv_weight_factor",
                                          "dynamic_run_table_factor", "output_factor", "retained_factor",
                                          "compile_small_factor", "dynamic_compile_epilogue_weight_factor",
                                          "dynamic_run_epilogue_weight_factor", "dynamic_relayout_memory_factor",
                                          "dynamic_compile_inflight_factor")
                      if k in mem},
                   fit={"coefficients": c,
                        "cases": [{k: r.get(k) for k in ("case", "robust_ms", "median_ms", "peak_bytes", "peak_rss",
                                                         "compile_peak_rss", "run_peak_rss")}
                                  for r in rows]})
