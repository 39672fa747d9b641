"""Tiled VAE decode and encode with blended seams, for images larger than a device decodes at once.

The input is cut into overlapping tiles of one size (so one static-shape session serves them
all; the last row and column of tiles are moved back to end at the edge), each tile goes
through the part, and the outputs are summed with weights that ramp linearly across each
overlap, so seams fade from one tile into the next instead of showing a step. Tiles at the
image border keep full weight on their outer edges.

VAE GroupNorms see one tile's statistics instead of the whole image's, so a tiled result is
close to, not equal to, the untiled one; the overlap hides the seams that this causes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InputError


def starts(size: int, tile: int, overlap: int) -> list[int]:
    """Tile origins along one axis: stride ``tile - overlap``, the last one moved back to end at ``size``."""
    if tile >= size:
        return [0]
    stride = tile - overlap
    out = list(range(0, size - tile, stride))
    out.append(size - tile)
    return out


def ramp(length: int, overlap: int, first: bool, last: bool) -> np.ndarray:
    """Blend weights along one axis of a tile: linear over ``overlap`` at inner edges, 1 elsewhere."""
    w = np.ones(length, np.float32)
    if overlap > 0:
        r = (np.arange(overlap, dtype=np.float32) + 1) / (overlap + 1)
        if not first:
            w[:overlap] = r
        if not last:
            w[-overlap:] = r[::-1]
    return w


def tiled(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, tile: int, overlap: int, scale: float,
          out_channels: int) -> np.ndarray:
    """Apply ``fn`` (NCHW -> NCHW, spatial size times ``scale``) to overlapping tiles of ``x``, blended.

    ``tile`` and ``overlap`` are in input pixels; ``scale`` is 8 for a decoder (latent -> image) and
    1/8 for an encoder.
    """
    n, _, h, w = x.shape
    th, tw = min(tile, h), min(tile, w)
    if overlap < 0 or (overlap >= min(th, tw) and (h > th or w > tw)):
        raise InputError(f"tile overlap {overlap} must be >= 0 and below the tile size {tile}", where="tiled VAE",
                         fix="use e.g. tile=64, overlap=16 (latent pixels) for decoding")
    ys, xs = starts(h, th, overlap), starts(w, tw, overlap)
    oh, ow = int(round(h * scale)), int(round(w * scale))
    acc = np.zeros((n, out_channels, oh, ow), np.float32)
    norm = np.zeros((oh, ow), np.float32)
    o_ov = int(round(overlap * scale))
    for iy, y in enumerate(ys):
        for ix, x0 in enumerate(xs):
            out = np.asarray(fn(np.ascontiguousarray(x[:, :, y:y + th, x0:x0 + tw])), np.float32)
            ph, pw = out.shape[2], out.shape[3]
            oy, ox = int(round(y * scale)), int(round(x0 * scale))
            # overlaps actually shared with the neighbours (the moved-back last tile overlaps more)
            wy = ramp(ph, min(o_ov, ph // 2), iy == 0, iy == len(ys) - 1)
            wx = ramp(pw, min(o_ov, pw // 2), ix == 0, ix == len(xs) - 1)
            wgt = wy[:, None] * wx[None, :]
            acc[:, :, oy:oy + ph, ox:ox + pw] += out * wgt
            norm[oy:oy + ph, ox:ox + pw] += wgt
    return acc / norm


def decode_tiled(decode: Callable[[np.ndarray], np.ndarray], latents: np.ndarray, *, tile: int = 64,
                 overlap: int = 16) -> np.ndarray:
    """VAE decode of ``latents`` [N, 4, h, w] by tiles of ``tile`` latent pixels -> [N, 3, 8h, 8w]."""
    return tiled(decode, latents, tile, overlap, 8.0, 3)


def encode_tiled(encode: Callable[[np.ndarray], np.ndarray], image: np.ndarray, *, tile: int = 512,
                 overlap: int = 128, channels: int = 8) -> np.ndarray:
    """VAE encode of ``image`` [N, 3, H, W] by tiles of ``tile`` pixels -> [N, channels, H/8, W/8]
    (the encoder's mean and log-variance: they are blended, then sampled once, as the untiled path does)."""
    if tile % 8 or overlap % 8:
        raise InputError(f"encoder tiles ({tile}) and overlaps ({overlap}) must be multiples of 8",
                         where="tiled VAE encode", fix="use e.g. tile=512, overlap=128")
    return tiled(encode, image, tile, overlap, 1 / 8, channels)
