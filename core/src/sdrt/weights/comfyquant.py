"""ComfyUI's per-layer quantized weights (comfy-kitchen's "mixed precision" files), read as ComfyUI dequantizes them.

Such a file marks each quantized layer ``X`` with ``X.comfy_quant``, a uint8 tensor holding JSON
(``{"format": "float8_e4m3fn"}``), or lists the layers in its header's ``_quantization_metadata``
(``{"layers": {"X": {"format": ...}}}``); beside ``X.weight`` in the stored type it keeps ``X.weight_scale`` and
optionally ``X.input_scale`` (used only by fp8 matmuls). ComfyUI's formats (``comfy.quant_ops.QUANT_ALGOS``):

- ``float8_e4m3fn``, ``float8_e5m2``, ``int8_tensorwise``: one scale per tensor; the weight is
  ``weight * weight_scale`` (comfy-kitchen's per-tensor dequantization), read here in float32;
- ``nvfp4``, ``mxfp8`` (block scales), ``convrot_w4a4`` (Hadamard-rotated int4), ``asym_w4a8_int8``,
  ``awq_w4a16``: refused in one line naming the file, the format and a layer.

Read without its scale such a weight is off by that scale (``max|W| / 448`` for fp8: every value hundreds of times
too large), so a marked layer is never passed on unscaled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import WeightsError

#: the header key a file may list its quantized layers under, instead of ``X.comfy_quant`` tensors
HEADER_KEY = "_quantization_metadata"
#: formats with one scale per tensor: stored value * weight_scale
PER_TENSOR = ("float8_e4m3fn", "float8_e5m2", "int8_tensorwise")
_SIDE = ("comfy_quant", "weight_scale", "input_scale")
_FIX = ("use the model's fp16 / bf16 / plain fp8 file, or a GGUF conversion (Q8_0, Q5_K, Q4_K: "
        "docs/quantization.md)")


def _bad(source: str, what: str) -> WeightsError:
    return WeightsError(what, where=source, fix=_FIX)


def _layer_conf(ref: Any) -> dict[str, Any] | str:
    """A ``X.comfy_quant`` tensor's JSON, or what is wrong with it."""
    if math.prod(ref.shape) > 65536:
        return f"{ref.name} holds {math.prod(ref.shape)} values, not a layer's JSON marker"
    try:
        conf = json.loads(np.asarray(ref.load()).astype(np.uint8).tobytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{ref.name} is not JSON ({exc})"
    return conf if isinstance(conf, dict) else f"{ref.name} is not a JSON object"


def fold(raw: dict[str, Any], headers: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """``raw`` with every ComfyUI-quantized layer's ``X.weight`` read as its float32 values and its side tensors
    dropped; ``headers``: each file's safetensors ``__metadata__`` (by path). ``raw`` as given when no layer is
    marked. Raises ``WeightsError`` for a format or a layer that cannot be read."""
    layers: dict[str, tuple[dict[str, Any], str]] = {}
    for path, meta in headers.items():
        text = meta.get(HEADER_KEY)
        if not text:
            continue
        try:
            listed = json.loads(text).get("layers", {})
        except (ValueError, AttributeError) as exc:
            raise _bad(path, f"its {HEADER_KEY} header is not a JSON object with 'layers' ({exc})") from exc
        for name, conf in (listed.items() if isinstance(listed, dict) else ()):
            layers[name] = (conf if isinstance(conf, dict) else {}, path)
    for name, ref in raw.items():
        if name.endswith(".comfy_quant"):
            conf = _layer_conf(ref)
            if isinstance(conf, str):
                raise _bad(ref.source, f"a ComfyUI-quantized layer's marker cannot be read: {conf}")
            layers[name[: -len(".comfy_quant")]] = (conf, ref.source)
    if not layers:
        return raw
    other: dict[str, list[str]] = {}
    out = dict(raw)
    for layer, (conf, source) in layers.items():
        fmt = str(conf.get("format"))
        if fmt not in PER_TENSOR:
            other.setdefault(fmt, []).append(layer)
            continue
        w, s = raw.get(layer + ".weight"), raw.get(layer + ".weight_scale")
        if w is None or s is None or math.prod(s.shape) != 1:
            what = ("its weight is missing" if w is None else "its weight_scale is missing" if s is None else
                    f"its weight_scale has shape {list(s.shape)}, not one value per tensor")
            raise _bad(source, f"ComfyUI {fmt} layer {layer}: {what}")

        def load(w: Any = w, s: Any = s) -> np.ndarray:
            return np.asarray(w.load()).astype(np.float32) * np.float32(np.asarray(s.load(), np.float32).reshape(()))

        origin = None if w.origin is None else (*w.origin[:3], f"x {layer}.weight_scale")
        out[layer + ".weight"] = replace(w, dtype=np.dtype(np.float32), load=load, origin=origin, blocks=None, stored=None,
                                         rows=None)  # a store.TensorRef
        for side in _SIDE:
            out.pop(f"{layer}.{side}", None)
    if other:
        fmt, names = next(iter(sorted(other.items())))
        total = sum(len(v) for v in other.values())
        src = layers[names[0]][1]
        raise _bad(src, f"{total} layers of {src.rsplit('/', 1)[-1]} are stored in ComfyUI's "
                   f"{', '.join(sorted(other))} quantization ({names[0]}, ...), which sdrt cannot read "
                   f"(it reads ComfyUI's {', '.join(PER_TENSOR)} layers)")
    return out
