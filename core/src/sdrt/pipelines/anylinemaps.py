"""MistoLine's Anyline: sd-webui-controlnet's ``softedge_anyline``.

``MTEED.pth`` (TheMistoAI/MistoLine, ``Anyline/``) is TEED's architecture with other weights (the same tensor names
and shapes as ``7_model.pth``): it runs as :class:`sdrt.pipelines.teedmaps.TEED` does. Around it, numpy follows
the extension's ``scripts/preprocessor/teed.py`` (``PreprocessorAnyline``), not controlnet_aux's ``AnylineDetector``
(which blurs with sigma 2, counts the median above 3, keeps lines of any level and resizes the map back to the
image's size):

- the image as ``resize_image_with_pad`` gives it (default resolution 1280);
- the MTEED map exactly as ``softedge_teed``'s (``TEEDDetector``'s steps, the "Safe Steps" slider, default 2);
- ``lineart_standard``'s map of the same padded image (:func:`sdrt.pipelines.linemaps.lineart_standard`); its
  pixels of level exactly 1 (the extension's ``get_intensity_mask`` with bounds 0 and 1) form the line layer;
- skimage's ``remove_small_objects(min_size=36, connectivity=1)`` on that layer as the extension calls it, on the
  three-channel array: 6-connected in 3-D, so a 4-connected component of ``n`` pixels counts ``3n`` and is dropped
  below 12 pixels (:func:`components`, in numpy);
- ``combine_layers`` in the extension's uint8 arithmetic: ``1 - (1 - top) * (1 - base)`` where the layer is set is
  1 whatever the MTEED level, so the map is MTEED's with the kept line pixels set to level 1;
- cropped back.

In the extension the line layer comes from ``lineart_standard`` run on the already padded image, which pads it
again: at a resolution that is a multiple of 64 that second resize is a copy (the same image); at others it shrinks
the image and the two layers differ in size (the extension stops with numpy's broadcast error). sdrt makes the line
layer of the same padded image at every resolution (the extension's map wherever it makes one).
"""

from __future__ import annotations

import numpy as np

from .hedmaps import pad64
from .teedmaps import TEED

__all__ = ["MTEED", "MTEED_FILE", "MIN_PIXELS", "components", "detect", "kept", "line_layer"]

MTEED_FILE = "MTEED.pth"
#: the extension's ``min_size=36`` on its three identical channels: a 2-D component of fewer pixels is dropped
MIN_PIXELS = 12


class MTEED(TEED):
    """``MTEED.pth`` compiled on one backend per input size (TEED's network)."""

    WHAT = "MistoLine's MTEED.pth"
    FIX = f"download {MTEED_FILE} (TheMistoAI/MistoLine, Anyline; the extension's annotator/downloads/TEED) and pass it"


def components(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, sizes)`` of the 4-connected components of a boolean ``(H, W)`` mask: ``labels`` int64, -1 off the
    mask, else the component's number (0..n-1, by its first pixel in row order); ``sizes[k]`` its pixel count.
    Union-find over the mask's horizontal and vertical neighbour pairs, hooked and compressed in numpy."""
    h, w = mask.shape
    flat = mask.ravel()
    idx = np.flatnonzero(flat)
    labels = np.full(h * w, -1, np.int64)
    if idx.size == 0:
        return labels.reshape(h, w), np.zeros(0, np.int64)
    pos = np.full(h * w, -1, np.int64)
    pos[idx] = np.arange(idx.size)
    right = mask[:, :-1] & mask[:, 1:]
    down = mask[:-1, :] & mask[1:, :]
    ry, rx = np.nonzero(right)
    dy, dx = np.nonzero(down)
    a = np.concatenate([pos[ry * w + rx], pos[dy * w + dx]])
    b = np.concatenate([pos[ry * w + rx + 1], pos[(dy + 1) * w + dx]])
    parent = np.arange(idx.size)
    while a.size:
        pa, pb = parent[a], parent[b]
        diff = pa != pb
        if not diff.any():
            break
        a, b, pa, pb = a[diff], b[diff], pa[diff], pb[diff]
        hi, lo = np.maximum(pa, pb), np.minimum(pa, pb)
        np.minimum.at(parent, hi, lo)  # each root hooks under the smallest root it touches
        while True:  # full compression: every node points at its root
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt
    roots, comp = np.unique(parent, return_inverse=True)
    labels[idx] = comp
    return labels.reshape(h, w), np.bincount(comp, minlength=roots.size)


def kept(mask: np.ndarray) -> np.ndarray:
    """``remove_small_objects(np.repeat(mask[..., None], 3, 2), min_size=36, connectivity=1)[..., 0]`` as the
    extension runs it (scikit-image 0.21, A1111's pin: objects below 36 go): the 4-connected runs of at least
    :data:`MIN_PIXELS` pixels."""
    labels, sizes = components(mask)
    return np.concatenate([sizes * 3 >= 36, [False]])[labels]  # -1 (off the mask) -> the appended False


def line_layer(rgb: np.ndarray) -> np.ndarray:
    """The extension's Anyline line layer of a padded RGB uint8 image: True where ``lineart_standard``'s level is
    exactly 1 in a 4-connected run of at least :data:`MIN_PIXELS` such pixels; ``(H, W)`` bool."""
    from .linemaps import lineart_standard

    level = lineart_standard(rgb)[:, :, 0]
    return kept(level == 1)  # get_intensity_mask(0, 1): levels 0 and 1 stay, and 0 is no object


def detect(rgb: np.ndarray, net: TEED, safe_steps: int = 2, size: tuple[int, int] | None = None) -> np.ndarray:
    """``softedge_anyline``'s map of an RGB uint8 image: padded to 64 here unless the caller did (``size``: the
    unpadded ``(h, w)``), cropped back; ``(h, w, 3)`` uint8."""
    if size is None:
        rgb, size = pad64(rgb)
    else:
        rgb = pad64(rgb)[0]
    edge = net.map(rgb, safe_steps)
    m = np.where(line_layer(rgb), np.uint8(1), edge)[:size[0], :size[1]]
    return np.repeat(m[:, :, None], 3, axis=2)
