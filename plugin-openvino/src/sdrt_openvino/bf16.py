"""The bf16 twin of a model: the float32 weights that a bf16 compile rounds anyway, rounded here instead.

A bf16 compile on the CPU (sdrt's default where the CPU has AVX-512-BF16 or AMX) takes the float32 weight
constants as they are and rounds each convolution and matmul weight to bf16 itself (round to nearest even)
while it packs them. Compiling from the float32 constants is the fastest cold compile: no copy of the weights
first (a float16 copy, ``convert.half_weights``, cost the full-size SD 1.5 UNet 0.8-2.6 s). But what
OpenVINO then stores (``export_model``, ``CACHE_DIR``) is the model as given: float32 weights, twice the size.

So the cache entry is written from a twin: the same model, with every float32 constant that only ops the
compiled model runs in bf16 read (Convolution, MatMul; directly or through a Transpose) made a bf16 constant
behind a ``Convert`` marked as decompression, rounded the way the CPU plugin rounds. The CPU plugin keeps such
constants bf16 in its blob (half the float32 size), and an import of that blob computes with the very weights the
float32 compile computed with: the full-size UNet's output matched bit for bit, cold compile and cache hit alike
(docs/openvino.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

log = logging.getLogger("sdrt.openvino.bf16")

#: the ops whose float32 weight inputs a bf16 compile rounds to bf16 itself (the runtime model names them
#: Convolution and FullyConnected or MatMul, at runtime precision bf16)
WEIGHT_OPS = frozenset({"Convolution", "MatMul"})
_RUNTIME_WEIGHT_LAYERS = frozenset({"Convolution", "FullyConnected", "MatMul"})
#: rounded this many elements at a time: the temporaries stay in the cache
_CHUNK = 1 << 18
#: the float32 bytes read between two calls of ``twin``'s ``release``
_RELEASE_EVERY = 256 << 20
#: constants smaller than this stay float32: the compile rounds them as it rounds them from the cold model
_MIN_ELEMENTS = 1024


def runs_weights_in_bf16(layers: Iterable[tuple[str, str]]) -> bool:
    """Whether a compiled model whose runtime model has ``layers`` (type, runtime precision) runs every convolution
    and matmul in bf16: then it rounded every one of their weights to bf16, and the twin holds the weights it
    computes with. (The runtime model names a fused layer after its last op, a matmul fused with its bias after
    the Add, so this is asked of the whole model, not per op.) False where there are none (no runtime model)."""
    weighted = [precision for kind, precision in layers if kind in _RUNTIME_WEIGHT_LAYERS]
    return bool(weighted) and all(precision == "bf16" for precision in weighted)


def round_to_bf16(src: np.ndarray, out: np.ndarray) -> None:
    """Write float32 ``src`` rounded to nearest even into ``out``'s bf16 bits (uint16), as the CPU's
    ``vcvtneps2bf16`` and OpenVINO's CPU plugin round; NaN stays NaN. A chunk at a time: no temporary of the
    whole array."""
    flat = np.ascontiguousarray(src, dtype=np.float32).reshape(-1)
    dst = out.reshape(-1)
    step = np.empty(min(_CHUNK, flat.size), np.uint32)
    for start in range(0, flat.size, _CHUNK):
        bits = flat[start:start + _CHUNK].view(np.uint32)
        tmp = step[:bits.size]
        np.right_shift(bits, 16, out=tmp)
        np.bitwise_and(tmp, 1, out=tmp)
        tmp += 0x7FFF
        tmp += bits
        tmp >>= 16
        nan = np.isnan(flat[start:start + _CHUNK])
        if nan.any():  # the rounding above would carry a NaN's payload into the exponent: keep it a quiet NaN
            tmp[nan] = (bits[nan] >> 16) | 0x0040
        dst[start:start + _CHUNK] = tmp


def _weight_only(const: Any) -> bool:
    """Whether ``const`` is read only as a convolution's or matmul's weight: directly, or through a ``Transpose``
    read only by them (a linear weight bound in torch's [out, in] layout, as sdrt's shipped weight-free graphs take
    a checkpoint's: the compile folds the transpose into the constant before it rounds it, and rounding commutes
    with a transpose)."""
    readers = [t.get_node() for t in const.output(0).get_target_inputs()]
    if not readers:
        return False
    for r in readers:
        kind = r.get_type_name()
        if kind == "Transpose":
            after = [t.get_node() for t in r.output(0).get_target_inputs()]
            if not after or any(a.get_type_name() not in WEIGHT_OPS for a in after):
                return False
        elif kind not in WEIGHT_OPS:
            return False
    return True


def twin(model: Any, release: Callable[[], Any] | None = None) -> Any:
    """A copy of ``model`` whose float32 constants that only convolutions and matmuls read (``_weight_only``) are
    bf16 behind a decompression ``Convert`` (each over a tensor of OpenVINO's own, which the constant keeps alive).
    ``model`` is left as it is (``update_weights`` swaps its constants). ``release`` hands back the pages of the float32
    weights' file maps; it is called every ``_RELEASE_EVERY`` bytes read, so that they are never all resident
    beside the bf16 copy (the full-size UNet's twin peaked 4.7 GiB over the process without it)."""
    import openvino as ov

    copy = model.clone()
    count = size = unreleased = 0
    for op in copy.get_ordered_ops():
        if op.get_type_name() != "Constant" or op.get_element_type() != ov.Type.f32:
            continue
        shape = [int(d) for d in op.get_output_shape(0)]
        if len(shape) < 2 or int(np.prod(shape)) < _MIN_ELEMENTS:
            continue
        if not _weight_only(op):
            continue
        values = op.get_data()
        tensor = ov.Tensor(ov.Type.bf16, shape)  # OpenVINO's own memory: no transparent huge page faults
        round_to_bf16(values, tensor.data.view(np.uint16))
        const = ov.op.Constant(tensor, shared_memory=True)
        widen = ov.opset13.convert(const, ov.Type.f32)
        # what ov::mark_as_decompression writes: constant folding leaves the Convert, the CPU plugin keeps bf16
        widen.get_rt_info()["decompression_0"] = ""
        name = op.get_friendly_name()
        const.set_friendly_name(name)
        widen.set_friendly_name(name + "/decompress")
        op.output(0).replace(widen.output(0))
        count += 1
        size += int(values.nbytes)
        unreleased += int(values.nbytes)
        if release is not None and unreleased >= _RELEASE_EVERY:
            release()
            unreleased = 0
    log.debug("bf16 twin: %d constants, %.1f MB of float32 weights made bf16", count, size / 1e6)
    return copy
