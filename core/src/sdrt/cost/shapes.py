"""Input shapes for a lone graph whose inputs keep dynamic dims (``sdrt plan model.onnx``, ``backend="auto"``)."""

from __future__ import annotations

from typing import Any


def fixed_size(graph: Any) -> tuple[int, int] | None:
    """(width, height) in pixels that a lone graph's first image-like (4-D) input fixes, when its two spatial
    dims are numbers: latents (not 3 channels) x 8, pixels as they are; None when they are dynamic."""
    for i in graph.inputs:
        dims = list(i.shape)
        if len(dims) == 4 and isinstance(dims[2], int) and isinstance(dims[3], int):
            scale = 1 if dims[1] == 3 else 8
            return dims[3] * scale, dims[2] * scale
    return None


def takes_pixels(graph: Any) -> bool:
    """Whether a lone graph's first image-like (4-D) input is an image in pixels (3 channels, or channels named as
    such), not a latent: its width and height are any size, a latent's are multiples of 8."""
    for i in graph.inputs:
        dims = list(i.shape)
        if len(dims) == 4:
            return dims[1] == 3 or (isinstance(dims[1], str) and "channel" in dims[1].lower())
    return False


def single_file_shapes(graph: Any, width: int, height: int, batch: int = 1) -> dict[str, tuple[int, ...]]:
    """Shapes for a lone graph's dynamic inputs: batch ``batch``; 4-D image-like inputs at the latent
    (width/8) or pixel size by their channels; a dim named for image tokens (``img``) at a DiT's packed
    latent length (width/16 x height/16), one named for T5 text (``txt``) 512 long; a 4-D input's channels named
    as such (``num_channels``: Optimum's image classifiers) 3, so pixels; other token
    sequences 77 long; anything else 1."""
    out: dict[str, tuple[int, ...]] = {}
    for i in graph.inputs:
        dims = list(i.shape)
        if all(isinstance(d, int) for d in dims):
            continue
        for k, d in enumerate(dims):
            if isinstance(d, int):
                continue
            name = str(d).lower()
            if k == 0:
                dims[k] = batch
            elif "img" in name or "image" in name:
                dims[k] = (height // 16) * (width // 16)
            elif "txt" in name:
                dims[k] = 512
            elif len(dims) == 4 and k == 1 and "channel" in name:  # Optimum's image classifiers: num_channels
                dims[k] = 3
            elif len(dims) == 4 and k >= 2:
                ch = dims[1] if isinstance(dims[1], int) else 4
                scale = 1 if ch == 3 else 8
                dims[k] = (height if k == 2 else width) // scale
            elif len(dims) in (2, 3) and k == 1:
                dims[k] = 77
            else:
                dims[k] = 1
        out[i.name] = tuple(int(d) for d in dims)
    return out
