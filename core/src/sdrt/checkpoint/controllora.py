"""Stability AI's Control-LoRA (``control-lora-canny-rank128.safetensors`` and its siblings): an SDXL ControlNet
stored as a difference from the SDXL UNet it runs with.

The file (LDM names, no prefix) holds a ``lora_controlnet`` marker, the ControlNet's own tensors in full
(``input_hint_block.*``, ``zero_convs.*``, ``middle_block_out.*``), the norms and biases of the UNet copy in full,
and for each Linear/Conv weight of the copy a pair ``<module>.up`` [out, r(, 1, 1)] and ``<module>.down``
[r, in(, k, k)]. The ControlNet's weight is the base UNet's own weight plus ``up.flatten(1) @ down.flatten(1)``
reshaped to it (as ComfyUI's ``ControlLora`` and the A1111 extension's ``controlnet_lora`` build it); a parameter
the file has in full replaces the base's (a weight held in full beside its pair takes the pair on top, as ComfyUI
sets the file's tensors over the UNet's and adds the product in the layer), and one the file does not name is the
base's as it is.

``sources(w, needed, read, where, convert)`` gives the ControlNet's parameters in diffusers' ``ControlNetModel`` names as lazy
tensors: each merged weight is computed when the backend reads it, from the mmapped file and one base tensor,
so no whole second copy of the UNet encoder is built here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ModelError
from ..weights import TensorRef, Weights
from .ldm import Source

MARKER = "lora_controlnet"
_LORA = re.compile(r"^(.+)\.(up|down)$")
#: the prefix of a merged tensor's name in the in-memory weights (not a name in any file)
BASE = "base:"


def is_control_lora(shapes: Mapping[str, tuple[int, ...]]) -> bool:
    return MARKER in shapes or any(k.startswith(MARKER) for k in shapes)


def is_sdxl(shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """SDXL's added embedding (``label_emb.*``) is there; an SD 1.x one has none."""
    return any(k.startswith("label_emb.") for k in shapes)


def pairs(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, str]]:
    """``{LDM weight name: (up key, down key)}`` of the low-rank pairs."""
    ups = {m[1] for k in shapes if (m := _LORA.match(k)) and m[2] == "up"}
    return {f"{mod}.weight": (f"{mod}.up", f"{mod}.down") for mod in ups if f"{mod}.down" in shapes}


def torch_shape(up: tuple[int, ...], down: tuple[int, ...]) -> tuple[int, ...]:
    """The weight's torch shape from its pair: [out, in] for a Linear, [out, in, k, k] for a Conv."""
    return (int(up[0]),) + tuple(int(d) for d in down[1:])


BaseReader = Callable[[str, tuple[int, ...]], "np.ndarray | None"]


def base_reader(graph: object, weights: Weights) -> tuple[BaseReader, dict[str, tuple[int, ...]]]:
    """``(read, shapes)``: ``read(diffusers name, torch shape)`` the base UNet's tensor in torch layout (None when
    the UNet has none of that name), whichever way its graph stores it (a shipped weight-free graph's named
    initializers, an ONNX export's transposed ``onnx::MatMul_*``); ``shapes``: which names it holds."""
    from .onnxmap import param_map

    slots = param_map(graph)  # type: ignore[arg-type]

    def read(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        slot = slots.get(name)
        if slot is None or slot.init not in weights:
            return None
        a = np.asarray(weights[slot.init]).reshape(slot.shape)
        if slot.layout == "T":
            a = a.T
        if a.size != int(np.prod(shape)):
            return None
        return a.reshape(shape)

    return read, {k: v.shape for k, v in slots.items()}


def sources(w: Weights, needed: Mapping[str, tuple[int, ...]], read: BaseReader, where: str,
            convert: Callable[[list[str]], tuple[dict[str, Source], list[str]]]
            ) -> tuple[Weights, dict[str, Source], list[str]]:
    """``(weights, {ControlNetModel name: Source}, unused keys)``: the file's full tensors as they are, each
    pair's weight merged onto the base's (read on use), and each parameter of the ControlNet graph
    (``needed``: name -> its shape there) the file does not name taken from the base UNet. ``convert``: LDM
    ControlNet names -> ``({diffusers name: Source}, unused)`` (``controlnet.convert``)."""

    shapes = w.shapes()
    lora = pairs(shapes)
    used = {k for pair in lora.values() for k in pair}
    full = [k for k in shapes if k != MARKER and k not in used and not _LORA.match(k) and k not in lora]
    srcs, unused = convert(full + list(lora))
    refs: dict[str, TensorRef] = {k: w.ref(k) for k in full}
    out: dict[str, Source] = {}
    for name, src in srcs.items():
        if src.key not in lora:
            out[name] = src
            continue
        up, down = lora[src.key]
        shape = torch_shape(shapes[up], shapes[down])
        key = BASE + name

        own = src.key if src.key in shapes else None  # a weight the file also holds in full replaces the UNet's

        def merged(name: str = name, up: str = up, down: str = down, shape: tuple[int, ...] = shape,
                   own: str | None = own) -> np.ndarray:
            base = np.asarray(w[own]).reshape(shape) if own is not None else read(name, shape)
            if base is None:
                raise ModelError(f"{where}: the SDXL UNet has no weight {name} {list(shape)} for the Control-LoRA's "
                                 f"{up}/{down}", where=where, fix="run the Control-LoRA with an SDXL model")
            u = np.asarray(w[up], np.float32).reshape(shape[0], -1)
            d = np.asarray(w[down], np.float32).reshape(u.shape[1], -1)
            return base.astype(np.float32) + (u @ d).reshape(shape)

        refs[key] = TensorRef(key, np.dtype(np.float32), shape, where, merged)
        out[name] = Source(key)
    for name, shape in needed.items():  # what the copy keeps of the base unchanged
        if name in out or name.startswith("controlnet_"):  # the ControlNet's own: only the file has them
            continue
        key = BASE + name

        def same(name: str = name, shape: tuple[int, ...] = shape) -> np.ndarray:
            base = read(name, shape)
            if base is None:
                raise ModelError(f"{where}: the SDXL UNet has no tensor {name} {list(shape)}, which the "
                                 "Control-LoRA keeps from it", where=where, fix="run the Control-LoRA with an SDXL "
                                                                                "model")
            return np.asarray(base, np.float32)

        refs[key] = TensorRef(key, np.dtype(np.float32), tuple(shape), where, same)
        out[name] = Source(key)
    return Weights(refs, sources=w.sources), out, unused


def widen_hint(w: Weights, srcs: dict[str, Source]) -> Weights:
    """A one-channel conditioning embedding (a grey control map) fed RGB: ``conv_in``'s weight spread over three
    equal channels (each a third), which gives the same output for a grey picture (R = G = B)."""
    name = "controlnet_cond_embedding.conv_in.weight"
    src = srcs.get(name)
    if src is None or len(w.ref(src.key).shape) != 4 or w.ref(src.key).shape[1] != 1:
        return w
    ref = w.ref(src.key)
    shape = (ref.shape[0], 3) + tuple(ref.shape[2:])

    def load() -> np.ndarray:
        a = np.asarray(ref.load(), np.float32)
        return np.repeat(a / 3.0, 3, axis=1)

    key = BASE + name
    srcs[name] = Source(key)
    return Weights({**{k: w.ref(k) for k in w}, key: TensorRef(key, np.dtype(np.float32), shape, ref.source, load)},
                   sources=w.sources)


__all__ = ["MARKER", "base_reader", "is_control_lora", "is_sdxl", "pairs", "sources", "widen_hint"]
