"""Input shapes for a lone graph whose inputs keep dynamic dims (``sdrt plan model.onnx``, ``backend="auto"``)."""

from __future__ import annotations

from typing import Any


def fixed_size(graph: Any) -> tuple[int, int] | None:
    """(width, height) in pixels that a lone graph's first image-like (4-D) input fixes, when its two spatial
    dims are numbers: latents (not 3 channels) x 8, pixels as they are; None when they are dynamic."""
    for i in graph.inputs:
        dims = list(i.shape)
        if len(dims) == 4 and isinstance(dims[2], int) and isinstance(dims[3], int):
            scale = 1 if image_channels(graph, i.name, dims) == 3 else 8
            return dims[3] * scale, dims[2] * scale
    return None


def takes_pixels(graph: Any) -> bool:
    """Whether a lone graph's first image-like (4-D) input is an image in pixels (3 channels: ``image_channels``),
    not a latent: its width and height are any size, a latent's are multiples of 8."""
    for i in graph.inputs:
        dims = list(i.shape)
        if len(dims) == 4:
            return image_channels(graph, i.name, dims) == 3
    return False


#: ops a 4-D input may pass through, its channels unchanged, before the first Conv reads it
_SAME_CHANNELS = frozenset({"Cast", "Identity", "Mul", "Div", "Add", "Sub", "Pad", "Clip", "Relu", "QuantizeLinear",
                            "DequantizeLinear"})


def image_channels(graph: Any, name: str, dims: list[Any]) -> int | None:
    """A 4-D input's channels: its dim when a number; else the in-channels of the first Conv that reads it (a UNet's
    ``conv_in``: 4; a classifier's stem: 3), as Optimum names the dim ``num_channels`` for UNets, VAEs and image
    classifiers alike; else 3 for an input named for pixels (``pixel_values``); None when unknown."""
    if isinstance(dims[1], int):
        return dims[1]
    proto = getattr(getattr(graph, "model", None), "graph", None)
    if proto is None:
        return 3 if "pixel" in name.lower() else None
    inits = {t.name: list(t.dims) for t in proto.initializer}
    made = {o: n for n in proto.node for o in n.output}
    seen, front = {name}, [name]
    for _ in range(8):  # a few hops: a Cast or a scaling Mul before the Conv
        nxt = []
        for node in proto.node:
            if not node.input or node.input[0] not in front:
                continue
            if node.op_type == "Conv" and len(node.input) > 1:
                weight = node.input[1]
                src = made.get(weight)
                if weight not in inits and src is not None and src.op_type in ("DequantizeLinear", "Cast", "Identity"):
                    weight = src.input[0]
                shape = inits.get(weight)
                if shape and len(shape) == 4:
                    group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
                    return int(shape[1]) * int(group)
            elif node.op_type in _SAME_CHANNELS:
                nxt += [o for o in node.output if o not in seen]
        if not nxt:
            break
        seen.update(nxt)
        front = nxt
    return 3 if "pixel" in name.lower() else None


def single_file_shapes(graph: Any, width: int, height: int, batch: int = 1) -> dict[str, tuple[int, ...]]:
    """Shapes for a lone graph's dynamic inputs: batch ``batch``; 4-D image-like inputs at the latent
    (width/8) or pixel size by their channels; a dim named for image tokens (``img``, Optimum's
    ``packed_height_width``) at a DiT's packed latent length (width/16 x height/16), one named for T5 text
    (``txt``) 512 long; a 4-D input's symbolic channels those of the first Conv reading it (``image_channels``: 3 for
    pixels, 4 for an SD latent); other token sequences 77 long; anything else 1. A dim name has one value on every
    input, the one its place after the first axis gives it (Optimum's Flux transformer has ``txt_ids
    [sequence_length, 3]`` beside ``encoder_hidden_states [batch_size, sequence_length, 64]``: read as a batch
    there, the pin was refused as 'sequence_length pinned to both 77 and 1')."""
    named: dict[str, int] = {}
    for first in (True, False):  # first: what each name means after the first axis; then every input with those
        out: dict[str, tuple[int, ...]] = {}
        for i in graph.inputs:
            dims = list(i.shape)
            if all(isinstance(d, int) for d in dims):
                continue
            for k, d in enumerate(dims):
                if isinstance(d, int):
                    continue
                if not first and str(d) in named:
                    dims[k] = named[str(d)]
                    continue
                dims[k] = _guess(graph, i.name, dims, k, str(d).lower(), width, height, batch)
                if first and k > 0:
                    named.setdefault(str(d), dims[k])
            out[i.name] = tuple(int(d) for d in dims)
    return out


def _guess(graph: Any, name: str, dims: list[Any], k: int, dim: str, width: int, height: int, batch: int) -> int:
    """One dynamic dim's value (``single_file_shapes``)."""
    if k == 0:
        return batch
    if "img" in dim or "image" in dim or "packed" in dim:
        return (height // 16) * (width // 16)
    if "txt" in dim:
        return 512
    if len(dims) == 4 and k == 1:  # Optimum's num_channels: the first Conv's in-channels (pixels: 3)
        return image_channels(graph, name, dims) or 1
    if len(dims) == 4 and k >= 2:
        ch = dims[1] if isinstance(dims[1], int) else 4
        scale = 1 if ch == 3 else 8
        return (height if k == 2 else width) // scale
    if len(dims) in (2, 3) and k == 1:
        return 77
    return 1
