"""GGUF files (llama.cpp / ggml's format; city96's Flux, SD 3.5 and SDXL conversions, stable-diffusion.cpp's
own files) as ``Weights``: ``open_gguf(path)`` or ``Weights.open("model.gguf")``.

The file is read with the maintained ``gguf`` package (``pip install gguf``, or ``sdrt[gguf]``): its
reader maps the file, so nothing is read until a tensor is asked for. Tensor names are kept as the
file has them (city96's conversions keep the original checkpoint's names), so the checkpoint key
maps bind them onto graphs like a ``.safetensors`` of the same model. The one exception: a T5 encoder
in llama.cpp's names (``enc.blk.N.attn_q.weight``, ``token_embd.weight``; city96's
``t5-v1_1-xxl-encoder-Q8_0.gguf``, which people pair with Flux GGUFs) reads in transformers' names, as
every other T5 file has them (``llama_t5_name``).

Each tensor keeps its stored type (``GGUFWeights.ggml_type(name)``, ``GGUFWeights.raw(name)``) for a
backend that runs ggml's quantized types itself. Read as an array it is converted for the others:

- F32, F16, BF16, F64, I8..I64: zero-copy views of the mapped file (BF16 as ``ml_dtypes.bfloat16``);
- every quantized type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, the IQ and TQ types, MXFP4, NVFP4):
  dequantized to float32 by ``gguf.quants.dequantize``, block by block on access;
- a type with no dequantizer (Q8_1, Q8_K: ggml's internal activation types, never in model files; types
  newer than the installed ``gguf``): a ``WeightsError`` naming the tensor and type, on open.

A 2-D block-quantized tensor also has a ``blocks`` reader (``TensorRef.blocks``, ``GGUFWeights.blocks``): its
stored rows of blocks as a ``BlockMatrix`` (``sdrt.weights.blocks``), for a backend that runs ggml's quantized
matmuls on them (``Backend.weight_blocks``); the checkpoint binding carries it onto matmul weights.

GGUF stores dimensions innermost first (ggml's ``ne``); shapes here are numpy's (outermost first).
ComfyUI-GGUF records shapes of more than 4 dims as ``comfy.gguf.orig_shape.<name>``; those are applied.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import stamps
from ..errors import WeightsError
from . import keymap
from .blocks import BlockMatrix, dequantize_rows
from .store import TensorRef, Weights

log = logging.getLogger("sdrt.weights.gguf")

#: plain (not block-quantized) GGUF types -> numpy dtype names
_PLAIN = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
          "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64"}
INSTALL_HINT = "install the gguf reader: `pip install gguf` (or `pip install sdrt[gguf]`)"


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise WeightsError("reading .gguf files needs the `gguf` package, which is not installed",
                           where="Weights.open", fix=INSTALL_HINT) from exc
    return gguf


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a GGUF file (by its magic, else by its suffix)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return p.suffix.lower() == ".gguf"


def dequantizable(type_name: str) -> bool:
    """Whether tensors of GGUF type ``type_name`` can be read as arrays here."""
    if type_name in _PLAIN:
        return True
    gguf = _gguf()
    t = getattr(gguf.GGMLQuantizationType, type_name, None)
    if t is None:
        return False
    from gguf import quants

    block, size = gguf.GGML_QUANT_SIZES[t]
    try:
        quants.dequantize(np.zeros((1, size), np.uint8), t)
    except NotImplementedError:
        return False
    return True


class GGUFWeights(Weights):
    """``Weights`` over one GGUF file; also gives each tensor's stored ggml type and raw blocks."""

    def __init__(self, refs: dict[str, TensorRef], *, types: dict[str, str], raw: dict[str, Callable[[], Any]],
                 metadata: dict[str, Any], sources: list[Path]) -> None:
        super().__init__(refs, sources=sources)
        self._types = types
        self._raw = raw
        #: the file's key-value metadata (general.architecture, ...), scalars and strings only
        self.metadata = metadata

    def ggml_type(self, name: str) -> str:
        """The stored type of tensor ``name``: ``"Q4_K"``, ``"F16"``..."""
        if name not in self._types:
            raise WeightsError(f"no tensor named {name!r}", where=self._where(), fix="see list(weights)")
        return self._types[name]

    def raw(self, name: str) -> tuple[str, np.ndarray, tuple[int, ...]]:
        """(type, the stored bytes or values as the file maps them, numpy shape) of tensor ``name``:
        what a ggml backend uploads as it is."""
        return self.ggml_type(name), self._raw[name](), self.ref(name).shape

    def blocks(self, name: str) -> BlockMatrix | None:
        """Tensor ``name``'s stored blocks as a ``BlockMatrix`` (2-D block-quantized tensors), else None."""
        ref = self.ref(name)
        return ref.blocks() if ref.blocks is not None else None

    def types(self) -> dict[str, int]:
        """How many tensors of each stored type."""
        out: dict[str, int] = {}
        for t in self._types.values():
            out[t] = out.get(t, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def renamed(self, mapping: keymap.MappingLike) -> GGUFWeights:
        targets = keymap.apply(self._refs, mapping, self._where())
        refs = {}
        for t, k in targets.items():
            r = self._refs[k]
            refs[t] = TensorRef(t, r.dtype, r.shape, r.source, r.load, r.origin, r.blocks)
        return GGUFWeights(refs, types={t: self._types[k] for t, k in targets.items()},
                           raw={t: self._raw[k] for t, k in targets.items()}, metadata=self.metadata,
                           sources=self.sources)


def _what_is_wrong(p: Path) -> str:
    """Why gguf's reader failed on ``p``, from the fixed header (magic, version, tensor and key counts) and the
    file's size, in words: the reader's own errors are numpy's (a dtype view or reshape of a short buffer)."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(24)
    if len(head) < 24:
        return f"the file is {size} bytes, shorter than a GGUF header (24 bytes): it is truncated"
    if head[:4] != b"GGUF":
        return f"it does not start with the GGUF magic (it starts {head[:4]!r})"
    version = int.from_bytes(head[4:8], "little")
    tensors, keys = int.from_bytes(head[8:16], "little"), int.from_bytes(head[16:24], "little")
    if version not in (2, 3):
        return f"its GGUF version is {version}; readers know versions 2 and 3"
    # each tensor's entry takes at least 32 bytes (name length, dims, type, offset), each key at least 12; a count
    # past that and past any model's (an SDXL UNet has ~1700 tensors, an LLM some thousands) is a corrupt header
    if tensors * 32 > size and tensors > 10**5:
        return f"its header lists {tensors} tensors, more than a file of {size} bytes can hold (the header is corrupt)"
    if keys * 12 > size and keys > 10**5:
        return f"its header lists {keys} metadata keys, more than a file of {size} bytes can hold (the header is corrupt)"
    return f"the file ends at byte {size}, before the end of the {keys} metadata keys and {tensors} tensors its " \
           "header lists: it is truncated"


def open_gguf(path: str | os.PathLike[str], mapping: keymap.MappingLike = None) -> GGUFWeights:
    """Open a GGUF file lazily (its tensors are mapped, converted on access)."""
    gguf = _gguf()
    from gguf import quants

    p = Path(path)
    if not p.is_file():
        raise WeightsError("the weights file does not exist", where=str(p), fix="check the path")
    version = stamps.file_stamp(p)  # the offsets read below are this version's: another one is never read with them
    try:
        reader = gguf.GGUFReader(p, "r")
    except Exception as exc:  # noqa: BLE001 - the reader raises ValueError, struct.error, OSError...
        raise WeightsError(f"not a readable GGUF file: {_what_is_wrong(p)}", where=str(p),
                           fix="re-download the .gguf file (its size should match the source's), or re-convert "
                               "the model to GGUF") from exc
    stamps.check(p, version, "while its header was read")
    stamps.mark(reader.data, p, version)  # the one mapping every tensor views: a session holding one checks it
    meta: dict[str, Any] = {}
    orig_shapes: dict[str, tuple[int, ...]] = {}
    for key, field in reader.fields.items():
        try:
            value = field.contents()
        except Exception:  # noqa: BLE001 - odd or nested fields: not needed here
            continue
        if key.startswith("comfy.gguf.orig_shape."):
            orig_shapes[key[len("comfy.gguf.orig_shape."):]] = tuple(int(v) for v in value)
        elif isinstance(value, (str, int, float, bool)):
            meta[key] = value
    refs: dict[str, TensorRef] = {}
    types: dict[str, str] = {}
    raw: dict[str, Callable[[], Any]] = {}
    bad: dict[str, list[str]] = {}
    for t in reader.tensors:
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        tname = qtype.name
        shape = orig_shapes.get(t.name, tuple(int(d) for d in reversed([int(x) for x in t.shape])))
        data = t.data
        types[t.name] = tname
        raw[t.name] = _checked(p, version, lambda d=data: d)
        if tname in _PLAIN:
            dt = _np_dtype(_PLAIN[tname])
            refs[t.name] = TensorRef(t.name, dt, shape, str(p),
                                     _checked(p, version, lambda d=data, dt=dt, s=shape: np.asarray(d).view(dt).reshape(s)))
            continue
        if not _can_dequantize(quants, qtype, gguf):
            bad.setdefault(tname, []).append(t.name)
            continue
        blocks = None
        if len(shape) == 2 and t.name not in orig_shapes:  # a matrix: rows of blocks along its last axis
            blocks = _checked(p, version, _block_reader(data, tname, shape, f"{p.name}: {t.name}"))
        refs[t.name] = TensorRef(t.name, np.dtype(np.float32), shape, str(p),
                                 _checked(p, version, lambda d=data, q=qtype, s=shape: quants.dequantize(d, q).reshape(s)),
                                 blocks=blocks)
    if bad:
        what = "; ".join(f"{k} ({len(v)} tensors, e.g. {v[0]})" for k, v in bad.items())
        raise WeightsError(f"this GGUF file stores tensors in types that no installed reader or backend can take: "
                           f"{what}", where=str(p),
                           fix="upgrade the gguf package (`pip install -U gguf`), or use a conversion to "
                               "Q8_0, Q5_K or Q4_K, which every backend reads")
    log.info("%s: %d tensors (%s)", p.name, len(refs), ", ".join(f"{k} {v}" for k, v in _count(types).items()))
    weights = GGUFWeights(refs, types=types, raw=raw, metadata=meta, sources=[p])
    if any(k.startswith("enc.blk.") for k in refs):  # llama.cpp's T5 encoder names
        gated = any(".ffn_gate." in k for k in refs)
        weights = weights.renamed(lambda k: llama_t5_name(k, gated))
    return weights if mapping is None else weights.renamed(mapping)


#: llama.cpp's T5 encoder tensors (gguf's ``MODEL_ARCH.T5ENCODER``) -> transformers' names inside ``encoder.block.N.``
_LLAMA_T5 = {"attn_q": "layer.0.SelfAttention.q", "attn_k": "layer.0.SelfAttention.k",
             "attn_v": "layer.0.SelfAttention.v", "attn_o": "layer.0.SelfAttention.o",
             "attn_rel_b": "layer.0.SelfAttention.relative_attention_bias", "attn_norm": "layer.0.layer_norm",
             "ffn_gate": "layer.1.DenseReluDense.wi_0", "ffn_down": "layer.1.DenseReluDense.wo",
             "ffn_norm": "layer.1.layer_norm"}


def llama_t5_name(key: str, gated: bool = True) -> str:
    """transformers' ``T5EncoderModel`` name of a llama.cpp T5 tensor (others unchanged). T5 v1.1 (T5-XXL) is
    gated: ``ffn_gate``/``ffn_up`` are ``wi_0``/``wi_1``; without a gate ``ffn_up`` is the original T5's ``wi``."""
    if key == "token_embd.weight":
        return "shared.weight"
    if key == "enc.output_norm.weight":
        return "encoder.final_layer_norm.weight"
    parts = key.split(".")
    if len(parts) == 5 and parts[:2] == ["enc", "blk"] and parts[4] == "weight":
        inner = "layer.1.DenseReluDense." + ("wi_1" if gated else "wi") if parts[3] == "ffn_up" else _LLAMA_T5.get(parts[3])
        if inner:
            return f"encoder.block.{parts[2]}.{inner}.weight"
    return key


def _checked(path: Path, version: stamps.Stamp | None, read: Callable[[], Any]) -> Callable[[], Any]:
    """``read``, refused (``FileChanged``) once the file is another version than the one whose header gave the
    offsets: the reader's mapping would show the new bytes at the old places, or raise SIGBUS past a shorter end."""

    def checked() -> Any:
        stamps.check(path, version, "since it was opened")
        return read()

    return checked


def _block_reader(data: Any, type_name: str, shape: tuple[int, ...], source: str) -> Callable[[], BlockMatrix]:
    return lambda: BlockMatrix(type_name, np.asarray(data).reshape(shape[0], -1), int(shape[0]), int(shape[1]),
                               source=source)


def _count(types: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in types.values():
        out[t] = out.get(t, 0) + 1
    return out


_DEQ_OK: dict[int, bool] = {}


def _can_dequantize(quants: Any, qtype: Any, gguf: Any) -> bool:
    if int(qtype) not in _DEQ_OK:
        _, size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            quants.dequantize(np.zeros((1, size), np.uint8), qtype)
            _DEQ_OK[int(qtype)] = True
        except NotImplementedError:
            _DEQ_OK[int(qtype)] = False
    return _DEQ_OK[int(qtype)]


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


__all__ = ["BlockMatrix", "GGUFWeights", "dequantizable", "dequantize_rows", "is_gguf", "open_gguf"]
