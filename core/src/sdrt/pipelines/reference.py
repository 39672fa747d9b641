"""Reference images (FLUX.1 Kontext): pictures the transformer reads beside the noise, as more image tokens.

A Kontext checkpoint has Flux dev's weights and graph; what makes an edit is the input. Each reference image is
VAE-encoded (the latent distribution's mean: diffusers' ``sample_mode="argmax"``, so the seeded stream is not
drawn from), shifted and scaled, packed into 2x2 tokens, and appended after the noise tokens of every
transformer call. Their ``img_ids`` are ``(1, row, column)`` where the noise's are ``(0, row, column)``
(diffusers' ``FluxKontextPipeline.prepare_latents``); only the first ``S`` output tokens, the noise's, are read.

Several references follow ComfyUI's ``ReferenceLatent`` chain with its default ``offset`` method (the Forge
extension ``forge2_flux_kontext`` does the same): every reference has index 1, and each is placed beside the
ones before it, below them when that keeps the covered area squarer, else to their right
(``reference_ids``). One reference is diffusers' layout exactly.

``reference_resize`` (default on) resizes each reference to the Kontext training resolution (``PREFERRED``)
whose aspect ratio is nearest its own, as diffusers' ``_auto_resize``, ComfyUI's ``FluxKontextImageScale`` and
BFL's code do; diffusers stretches to that size (Lanczos), which sdrt copies (ComfyUI and Forge crop the
centre instead; the aspect ratios differ by a few percent at most). Off, each side is cut down to a multiple
of 16 (diffusers' rounding), resizing by that much.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from .flowparts import WrappedPart
from .images import PILLOW_HINT, check_path, to_nchw, to_rgb

#: (width, height) Kontext was trained at: diffusers' ``PREFERRED_KONTEXT_RESOLUTIONS`` (from BFL's code)
PREFERRED = ((672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248), (880, 1184),
             (944, 1104), (1024, 1024), (1104, 944), (1184, 880), (1248, 832), (1328, 800), (1392, 752),
             (1456, 720), (1504, 688), (1568, 672))
#: the most reference images one run takes (each adds its tokens to every transformer call)
MAX_REFERENCES = 8
_FIX = "pass {@reference_images} as image paths, Pillow images or HxWx3 uint8 arrays (a list of them for several)"


def references_of(value: Any) -> list[Any] | None:
    """``reference_images`` as a list (one image alone is a list of one; None or an empty list: None), each path
    checked; an ``InputError`` naming the argument otherwise. Called by ``validate``, before any model loads."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike, bytes)) or (isinstance(value, np.ndarray) and value.ndim in (2, 3)) \
            or hasattr(value, "convert"):
        items = [value]
    elif isinstance(value, Mapping) or not isinstance(value, (Sequence, np.ndarray)):
        raise InputError(f"reference_images must be a list of images, got {type(value).__name__} {value!r:.40}",
                         where="reference_images", fix=_FIX)
    else:
        items = list(value)
    if not items:
        return None
    if len(items) > MAX_REFERENCES:
        raise InputError(f"{len(items)} reference images were given, and a run takes {MAX_REFERENCES} at most",
                         where="reference_images", fix="pass fewer images (Kontext is trained on one)")
    for i, item in enumerate(items):
        if item is None:
            raise InputError(f"reference_images[{i}] is None", where="reference_images", fix=_FIX)
        check_path(item, f"reference image {i + 1}", "reference_images")
    return items


def preferred_size(width: int, height: int) -> tuple[int, int]:
    """diffusers' ``_auto_resize``: the preferred (width, height) nearest in aspect ratio to the image's sides cut
    down to multiples of 16 (ties go to the smaller width, as its ``min`` over tuples does)."""
    return nearest_preferred((width - width % 16) / (height - height % 16))


def nearest_preferred(aspect: float) -> tuple[int, int]:
    """The preferred (width, height) whose aspect ratio is nearest ``aspect`` (BFL's, diffusers' and ComfyUI's
    rule; ComfyUI's ``FluxKontextImageScale`` and the Forge extension take the raw sides' ratio)."""
    _, pw, ph = min((abs(aspect - a / b), a, b) for a, b in PREFERRED)
    return pw, ph


def prepare(images: Sequence[Any], resize: bool) -> list[np.ndarray]:
    """Each reference as HxWx3 uint8 at the size it is encoded at (multiples of 16)."""
    out = []
    for i, value in enumerate(images):
        what = f"reference image {i + 1}"
        rgb = to_rgb(value, what, "reference_images")
        h, w = rgb.shape[:2]
        if w < 16 or h < 16:
            raise InputError(f"{what} is {w}x{h}, and a reference needs at least 16x16 pixels",
                             where="reference_images", fix="use a larger image")
        tw, th = preferred_size(w, h) if resize else (w - w % 16, h - h % 16)
        out.append(rgb if (tw, th) == (w, h) else _lanczos(rgb, tw, th, what))
    return out


def _lanczos(rgb: np.ndarray, width: int, height: int, what: str) -> np.ndarray:
    """PIL's Lanczos resize of uint8 RGB, as diffusers' ``VaeImageProcessor.resize`` does for a PIL image."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError(f"{what} is {rgb.shape[1]}x{rgb.shape[0]} and is resized to {width}x{height}, which needs "
                         "Pillow", where="reference_images",
                         fix=PILLOW_HINT + "; or pass images whose sides are multiples of 16 and turn the "
                         "resizing off ({@reference_resize})") from None
    return np.asarray(Image.fromarray(rgb).resize((width, height), resample=Image.Resampling.LANCZOS))


def reference_ids(sizes: Sequence[tuple[int, int]]) -> np.ndarray:
    """``img_ids`` of the references' tokens, in order, for latent sizes ``(h, w)`` (even): ComfyUI's ``offset``
    layout, index 1 for all, each one below or beside the area the earlier ones cover (in latent pixels)."""
    ids = []
    h = w = 0
    for rh, rw in sizes:
        h_off = w_off = 0
        if rh + h > rw + w:
            w_off = w
        else:
            h_off = h
        h, w = max(h, rh + h_off), max(w, rw + w_off)
        th, tw = rh // 2, rw // 2
        grid = np.zeros((th, tw, 3), np.float32)
        grid[..., 0] = 1
        grid[..., 1] = (np.arange(th) + (h_off + 1) // 2)[:, None]
        grid[..., 2] = (np.arange(tw) + (w_off + 1) // 2)[None, :]
        ids.append(grid.reshape(th * tw, 3))
    return np.concatenate(ids, axis=0)


class References:
    """The encoded references of one job: ``tokens [1, R, 4 C]`` and ``ids [R, 3]``, and the sizes they came at."""

    def __init__(self, latents: list[np.ndarray], sizes: list[tuple[int, int]]) -> None:
        from .flowparts import pack_latents

        self.sizes = sizes  # (width, height) in pixels, as encoded
        self.tokens = np.concatenate([pack_latents(z) for z in latents], axis=1).astype(np.float32)
        self.ids = reference_ids([z.shape[2:] for z in latents])

    @property
    def count(self) -> int:
        return int(self.tokens.shape[1])


class _Zeros:
    """A generator whose draws are zeros: ``Pipeline._encode_image`` then gives the latent distribution's mean."""

    def randn(self, shape: Sequence[int]) -> np.ndarray:
        return np.zeros(tuple(shape), np.float32)


#: the "generator" that makes ``Pipeline._encode_image`` give the mean and draw nothing (diffusers' argmax)
MEAN = _Zeros()


def encode(pipe: Any, images: list[np.ndarray]) -> References:
    """VAE-encode each prepared reference (the mean, shifted and scaled as the family's latents)."""
    latents = [pipe._encode_image(to_nchw(im), MEAN) for im in images]
    return References(latents, [(im.shape[1], im.shape[0]) for im in images])


class ReferenceTokens(WrappedPart):
    """The denoiser part with the references' tokens appended to every call: the family's session (Flux's
    packing) wraps this, so ``run`` sees packed ``hidden_states`` and ``img_ids`` for the noise tokens only."""

    def __init__(self, part: Any, refs: References, sample: str, output: str) -> None:
        super().__init__(part, sample, output)
        self.refs = refs
        self.name, self.path = getattr(part, "name", "transformer"), getattr(part, "path", None)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        x = feeds[self.sample]
        rows, tokens = x.shape[0], x.shape[1]
        ref = self.refs.tokens
        if x.ndim != 3 or x.shape[2] != ref.shape[2]:
            raise InputError(f"this transformer takes {x.shape[-1]}-wide tokens and the reference images make "
                             f"{ref.shape[2]}-wide ones", where="reference_images",
                             fix="use reference images with a Flux dev or Kontext model (not a Fill, Canny or "
                                 "Depth one)")
        more = dict(feeds)
        more[self.sample] = np.concatenate([x, np.repeat(ref, rows, axis=0).astype(x.dtype)], axis=1)
        img = np.asarray(feeds["img_ids"])
        more["img_ids"] = np.concatenate([img, self.refs.ids.astype(img.dtype)], axis=img.ndim - 2)
        mask = feeds.get("attention_mask")
        if mask is not None:
            more["attention_mask"] = np.concatenate([mask, np.ones((mask.shape[0], self.refs.count), mask.dtype)],
                                                    axis=1)
        out = dict(self.part.run(more, outputs))
        name = self.output_name(out)
        out[name] = np.asarray(out[name])[:, :tokens]
        return out


def check_model(pipe: Any) -> None:
    """Reference images need a family that reads them (Flux) and a transformer whose token axis is dynamic."""
    fam = pipe.family
    if not getattr(fam, "reference_images", False):
        raise InputError(f"reference images are FLUX.1 Kontext's input, and {fam.label} models take none",
                         where="reference_images", fix="use a Flux Kontext model (any Flux dev or Kontext "
                         "checkpoint), or leave {@reference_images} unset ({@init_image} is img2img's picture)")
    shape = tuple(pipe.denoiser.inputs[fam.sample_input].shape)
    tokens = shape[1] if len(shape) == 3 else None
    if isinstance(tokens, int) and tokens > 0:
        raise InputError(f"this model's transformer is exported for {tokens} image tokens only, and reference "
                         "images add theirs", where="reference_images",
                         fix="export the transformer with a dynamic token axis (sdrt's shipped Flux graph has one)")


def infotext(images: Sequence[np.ndarray], resize: bool) -> dict[str, object]:
    """``Reference images: 2 (1024x1024, 832x1248)``: how many were used and the sizes they were encoded at (the
    pictures themselves are not in the PNG; with them, these sizes reproduce the run)."""
    sizes = ", ".join(f"{im.shape[1]}x{im.shape[0]}" for im in images)
    info: dict[str, object] = {"Reference images": f"{len(images)} ({sizes})"}
    if not resize:
        info["Reference resize"] = "off"
    return info
