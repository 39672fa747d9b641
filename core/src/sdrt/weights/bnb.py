"""bitsandbytes 4-bit weights (NF4, FP4) as people download them, dequantized with numpy.

Forge's ``flux1-dev-bnb-nf4(-v2).safetensors``, the NF4 Flux finetunes made from it, and diffusers / transformers
folders saved with a bnb 4-bit ``quantization_config`` hold each quantized ``Linear`` weight the way
``bitsandbytes.nn.Linear4bit`` saves it (``_save_to_state_dict``: the weight, then ``"weight." +`` each item of
``QuantState.as_dict(packed=True)``):

- ``X.weight``: the 4-bit codes, two to a byte, the first value of each pair in the high nibble, the values of
  the tensor in row-major order (``ceil(n / 2)`` bytes, shape ``[bytes, 1]``; stored as uint8, or viewed as
  another dtype when the model was quantized with another ``quant_storage``: the bytes are the same);
- ``X.weight.absmax``: one scale per block of ``blocksize`` consecutive values (the last block may be short),
  float32; or, with double quantization, uint8 codes of those scales, decoded as
  ``nested_quant_map[code] * nested_absmax[i // nested_blocksize] + nested_offset`` in float32;
- ``X.weight.quant_map``: the 16 values of the 4-bit type (bnb's kernels use their own table for the type, and
  so does this module);
- ``X.weight.nested_absmax`` / ``X.weight.nested_quant_map``: with double quantization only;
- ``X.weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``): a uint8 tensor holding UTF-8 JSON with
  ``quant_type``, ``blocksize``, ``dtype`` (the weight's dtype: ``bfloat16``, ``float16`` or ``float32``),
  ``shape`` and, nested, ``nested_blocksize``, ``nested_dtype`` and ``nested_offset``.

A value is ``table[code] * absmax[block]`` computed in float32 and rounded once to the recorded dtype, as
``bitsandbytes.functional.dequantize_4bit`` gives it (checked equal, bit for bit, in tests/weights/test_bnb4.py).
``fold`` turns each such group into one tensor of the recorded dtype and shape, read (and dequantized, a chunk
of blocks at a time, so no float32 copy of the whole tensor is ever made) when it is used; everything above it
(single files, diffusers folders, LoRA merging, every backend) sees a plain bf16/fp16 tensor.

bitsandbytes' 8-bit (LLM.int8: ``X.SCB``, ``X.weight_format``) and any other ``quant_state.bitsandbytes__*``
type are refused on open, naming the file and the tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import WeightsError
from . import stfile

#: the key of the packed JSON state, after the weight's name
STATE = ".quant_state.bitsandbytes__"
#: the 4-bit types bitsandbytes has (``QuantState.valid_quant_types``)
TYPES = ("nf4", "fp4")
#: the tensors beside a quantized weight, after ``X.weight.``
PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
#: values dequantized per chunk (a multiple of every block size): the float32 scratch stays a few MB
CHUNK = 1 << 20

#: NormalFloat4: the 16 quantiles of N(0, 1) scaled to [-1, 1] (QLoRA, Dettmers et al. 2023, appendix E), as
#: float32, in code order
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)
#: bitsandbytes' FP4 (1 sign, 2 exponent, 1 mantissa bit, its own bias): code ``s eee`` -> these magnitudes over
#: 12 (the largest), in code order; the upper 8 codes are the negatives, code 8 a positive zero as bnb's portable kernel has it (its CUDA kernel gives -0.0)
FP4 = np.array([0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0],
               np.float32) / np.float32(12.0)

FIX = "use an fp16/bf16, fp8 or GGUF version of this model, or an NF4 one saved by bitsandbytes (Forge, diffusers)"


def _pairs(table: np.ndarray) -> np.ndarray:
    """``[256, 2]`` float32: the two values each packed byte holds (high nibble first)."""
    b = np.arange(256)
    return np.stack([table[b >> 4], table[b & 15]], axis=1).astype(np.float32)


PAIRS = {"nf4": _pairs(NF4), "fp4": _pairs(FP4)}


@dataclasses.dataclass(frozen=True)
class State:
    """One quantized weight's state, checked against its tensors' shapes."""

    quant_type: str
    blocksize: int
    dtype: np.dtype
    shape: tuple[int, ...]
    nested_blocksize: int | None = None
    nested_offset: float | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def blocks(self) -> int:
        return -(-self.size // self.blocksize)


def dequantize(packed: np.ndarray, absmax: np.ndarray, state: State, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Values ``lo:hi`` of the weight's flattened values (all of them, in ``state.shape``, by default) in
    ``state.dtype``, from its packed codes (any dtype: their bytes) and its float32 ``absmax`` (one per block), a
    chunk of blocks at a time."""
    codes = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    n, bs = state.size, state.blocksize
    whole_tensor = lo == 0 and hi is None
    lo = min(lo, n)  # rows past the end read as empty, as numpy's slicing gives them
    hi = n if hi is None else max(lo, min(hi, n))
    first, end = lo // bs * bs, min(-(-hi // bs) * bs, n)  # the whole blocks that hold lo:hi
    pairs = PAIRS[state.quant_type]
    scale = np.asarray(absmax, np.float32).reshape(-1)
    flat = np.empty(end - first, state.dtype)
    step = max(1, CHUNK // (2 * bs)) * 2 * bs  # whole blocks and whole bytes
    for a in range(first, end, step):
        b = min(a + step, end)
        # float32 scratch, this chunk only (np.take: ~10x numpy's fancy indexing on a 2-D table)
        # (a block of odd size can start in a byte's low nibble: skip the high one)
        vals = np.take(pairs, codes[a // 2:(b + 1) // 2], axis=0).reshape(-1)[a % 2:a % 2 + b - a]
        whole = (b - a) // bs
        b0 = a // bs
        if whole:
            vals[:whole * bs].reshape(whole, bs)[...] *= scale[b0:b0 + whole, None]
        if whole * bs < b - a:  # the last, short block
            vals[whole * bs:] *= scale[b0 + whole]
        flat[a - first:b - first] = vals  # rounded once to the recorded dtype
    return flat.reshape(state.shape) if whole_tensor else flat[lo - first:hi - first]


def nested_absmax(codes: np.ndarray, nested_map: np.ndarray, nested_scales: np.ndarray, state: State) -> np.ndarray:
    """Double quantization undone: ``nested_map[code] * nested_scales[block] + offset``, in float32 (the absmax)."""
    q = np.asarray(codes).reshape(-1).view(np.uint8)
    table = np.asarray(nested_map, np.float32).reshape(-1)
    scales = np.asarray(nested_scales, np.float32).reshape(-1)
    bs = int(state.nested_blocksize or 1)
    vals = np.take(table, q)
    whole = q.size // bs
    if whole:
        vals[:whole * bs].reshape(whole, bs)[...] *= scales[:whole, None]
    if whole * bs < q.size:
        vals[whole * bs:] *= scales[whole]
    vals += np.float32(state.nested_offset or 0.0)
    return vals


def parse_state(raw: np.ndarray, name: str, where: str) -> dict[str, Any]:
    """The JSON of a ``quant_state.bitsandbytes__*`` tensor, as a dict."""
    try:
        data = json.loads(np.asarray(raw).reshape(-1).view(np.uint8).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WeightsError(f"{name} is not bitsandbytes' quantization state (its bytes are not JSON)", where=where,
                           fix="re-download the file") from exc
    if not isinstance(data, dict):
        raise WeightsError(f"{name} is not bitsandbytes' quantization state (not a JSON object)", where=where,
                           fix="re-download the file")
    return data


def _bad(what: str, where: str) -> WeightsError:
    return WeightsError(what, where=where, fix="re-download the file; if it loads in Forge or diffusers, report it")


def _state(d: Mapping[str, Any], wname: str, kind: str, where: str) -> State:
    sname = f"{wname}{STATE}{kind}"
    if d.get("quant_type") != kind:
        raise _bad(f"{sname} says quant_type {d.get('quant_type')!r}, its name says {kind!r}", where)
    bs, dt, shape = d.get("blocksize"), d.get("dtype"), d.get("shape")
    if type(bs) is not int or bs <= 0:
        raise _bad(f"{sname}: blocksize {bs!r} is not a positive integer", where)
    if dt not in DTYPES:
        raise _bad(f"{sname}: dtype {dt!r} is not one bitsandbytes dequantizes to (bfloat16, float16, float32)", where)
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise _bad(f"{sname}: shape {shape!r} is not a list of sizes", where)
    nested = {}
    if "nested_blocksize" in d or "nested_offset" in d:
        nb, off, ndt = d.get("nested_blocksize"), d.get("nested_offset"), d.get("nested_dtype", "float32")
        if type(nb) is not int or nb <= 0 or not isinstance(off, (int, float)) or isinstance(off, bool) \
                or not math.isfinite(off) or ndt != "float32":  # (json reads NaN and Infinity as floats)
            raise _bad(f"{sname}: nested_blocksize {nb!r}, nested_offset {off!r}, nested_dtype {ndt!r} are not a "
                       "double quantization bitsandbytes writes", where)
        nested = {"nested_blocksize": nb, "nested_offset": float(off)}
    return State(kind, bs, stfile.st_dtype(DTYPES[dt]), tuple(shape), **nested)


def fold(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """``raw`` (``{name: TensorRef}`` of one or more files) with every bnb 4-bit group made one tensor of its
    recorded dtype and shape (read and dequantized on use), and ``{quant type: weights folded}``. Refuses 8-bit
    bnb weights, unknown 4-bit types and groups that do not fit together (one line each)."""
    eight = next((n for n in raw if n.endswith((".SCB", ".weight_format"))), None)
    if eight is not None:
        raise WeightsError(f"{eight}: bitsandbytes 8-bit (LLM.int8) weights, which sdrt does not read",
                           where=raw[eight].source, fix=FIX)
    states = [n for n in raw if STATE in n]
    if not states:
        stray = next((n for n in raw if n.endswith((".weight.absmax", ".weight.quant_map"))), None)
        if stray is not None:
            raise _bad(f"{stray} is a bitsandbytes 4-bit scale without its quant_state.bitsandbytes__nf4/fp4 "
                       "tensor: the file is incomplete", raw[stray].source)
        return raw, {}
    out = dict(raw)
    counts: dict[str, int] = {}
    for sname in states:
        wname, _, kind = sname.partition(STATE)
        sref = raw[sname]
        if kind not in TYPES:
            raise WeightsError(f"{wname} is stored in bitsandbytes' {kind!r} format, which sdrt does not read "
                               "(4-bit nf4 and fp4 only)", where=sref.source, fix=FIX)
        w = raw.get(wname)
        if w is None:
            raise _bad(f"{sname} has no {wname} beside it", sref.source)
        st = _state(parse_state(sref.load(), sname, sref.source), wname, kind, sref.source)
        parts = {p: raw.get(f"{wname}.{p}") for p in PARTS}
        nbytes = math.prod(w.shape) * w.dtype.itemsize
        problem = None
        absmax = parts["absmax"]
        if nbytes != (st.size + 1) // 2:
            problem = f"{wname} holds {nbytes} bytes, and {st.size} 4-bit values of shape {list(st.shape)} take " \
                      f"{(st.size + 1) // 2}"
        elif absmax is None or parts["quant_map"] is None:
            problem = f"{wname}: {'absmax' if absmax is None else 'quant_map'} is missing beside {sname}"
        elif math.prod(absmax.shape) != st.blocks:
            problem = f"{wname}.absmax has {math.prod(absmax.shape)} values for {st.blocks} blocks of {st.blocksize}"
        elif st.nested_blocksize is not None:
            na = parts["nested_absmax"]
            if absmax.dtype != np.uint8 or na is None or parts["nested_quant_map"] is None:
                problem = f"{wname}: double quantization without uint8 absmax, nested_absmax and nested_quant_map"
            elif math.prod(na.shape) != -(-st.blocks // st.nested_blocksize) or \
                    math.prod(parts["nested_quant_map"].shape) != 256:
                problem = f"{wname}.nested_absmax / nested_quant_map do not fit {st.blocks} absmax values in " \
                          f"blocks of {st.nested_blocksize}"
        elif absmax.dtype.kind != "f" and absmax.dtype.name != "bfloat16":
            problem = f"{wname}.absmax is {absmax.dtype}, not floats (and there is no double quantization)"
        if problem:
            raise _bad(problem, w.source)

        def scales(parts: dict[str, Any] = parts, st: State = st) -> np.ndarray:
            scale = parts["absmax"].load()
            if st.nested_blocksize is not None:
                scale = nested_absmax(scale, parts["nested_quant_map"].load(), parts["nested_absmax"].load(), st)
            return scale

        def load(w: Any = w, st: State = st, scales: Callable[[], np.ndarray] = scales) -> np.ndarray:
            return dequantize(w.load(), scales(), st)

        def rows(lo: int, hi: int, w: Any = w, st: State = st, scales: Callable[[], np.ndarray] = scales) -> np.ndarray:
            """Rows ``lo:hi`` alone (a fused qkv's third, Flux's linear1 split): only their blocks are decoded."""
            lo, hi = min(lo, st.shape[0]), min(hi, st.shape[0])
            hi = max(lo, hi)
            inner = math.prod(st.shape[1:])
            return dequantize(w.load(), scales(), st, lo * inner, hi * inner).reshape((hi - lo, *st.shape[1:]))

        how = f"bnb {kind} {st.blocksize}{' nested' if st.nested_blocksize else ''} {st.dtype.name}"
        origin = None if w.origin is None else (*w.origin[:3], how)
        out[wname] = dataclasses.replace(w, dtype=st.dtype, shape=st.shape, load=load, origin=origin, blocks=None,
                                          stored=kind, rows=rows if st.shape else None)
        del out[sname]
        for p in PARTS:
            out.pop(f"{wname}.{p}", None)
        counts[kind] = counts.get(kind, 0) + 1
    leftover = next((n for n in out if n.endswith(tuple(f".weight.{p}" for p in PARTS))), None)
    if leftover is not None:
        raise _bad(f"{leftover} belongs to no quantized weight (its quant_state.bitsandbytes__* is missing)",
                   out[leftover].source)
    return out, counts


__all__ = ["FP4", "NF4", "State", "dequantize", "fold", "nested_absmax", "parse_state"]
