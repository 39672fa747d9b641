"""Live previews of a latent while it forms: a linear latent-to-RGB projection, or a TAESD decoder.

``project(latent, fmt)`` is the cheap preview ComfyUI shows ("Latent2RGB") and A1111's "Approx cheap":
each latent pixel's channels times a ``(C, 3)`` matrix plus a bias, mapped from [-1, 1] to 0..255.
The factors are ComfyUI's (``comfy/latent_formats.py``, fitted by its authors against each family's
VAE): ``"sd1"`` (also SD 2.x, whose VAE is SD 1.x's), ``"sdxl"``, ``"sd3"`` and ``"flux"`` (16 channels).
The input is the latent as the sampler holds it (the model's space, VAE scaling applied), ``(C, h, w)``
or ``(1, C, h, w)``; the result is ``(h, w, 3)`` uint8 at the latent's resolution (``upscale=8`` repeats
pixels to the image size).

``TaesdPreview(path)`` decodes with a TAESD-family decoder (TAESD for SD 1.x/2.x, TAESDXL, TAESD3,
TAEF1) exported to ONNX in Optimum's ``vae_decoder`` layout (``latent_sample`` in, ``sample`` in
[-1, 1] out, as diffusers' ``AutoencoderTiny.decode`` returns it). The latent given is first mapped
to the decoder's own space, ``latent / scaling_factor + shift_factor`` from the decoder folder's
``config.json`` (1 and 0 for TAESD and TAESDXL; TAESD3/TAEF1 ship their VAE's factors).

A TAESD decode is not cheap on a CPU (about 140 GFLOP for a 512x512 image), so ``TaesdPreview`` bounds
the preview's size (ComfyUI caps its previews at ``MAX_PREVIEW_RESOLUTION`` after a full decode; here the
work shrinks too): the latent is first area-downscaled (``area_resize``) so that the decoded preview's
longer side is at most ``preview_size`` pixels (``DEFAULT_PREVIEW_SIZE``, 256; ``None``: the decoder's
full size). The decoder is fully convolutional,
so its cost scales with the latent's area: 256 is a quarter of a 512x512 decode and a sixteenth of
a 1024x1024 one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["DEFAULT_PREVIEW_SIZE", "LATENT_RGB", "TaesdPreview", "area_resize", "check_preview_size",
           "fit_latent_rgb", "latent_rgb", "preview_latent_size", "project", "to_uint8"]

#: the longer side, in pixels, of a decoded (TAESD) preview unless asked otherwise (``bench/preview.py``)
DEFAULT_PREVIEW_SIZE = 256
#: the most ``project`` repeats a latent pixel (8 is the image's size; far more only fills memory)
MAX_UPSCALE = 64
#: TAESD-family decoders upsample the latent 8 times
_DECODER_SCALE = 8

#: (factors (C, 3), bias (3,)) per latent format, from ComfyUI's comfy/latent_formats.py (data).
LATENT_RGB: dict[str, tuple[tuple[tuple[float, float, float], ...], tuple[float, float, float]]] = {
    "sd1": (((0.3512, 0.2297, 0.3227), (0.3250, 0.4974, 0.2350), (-0.2829, 0.1762, 0.2721),
             (-0.2120, -0.2616, -0.7177)), (0.0, 0.0, 0.0)),
    "sdxl": (((0.3651, 0.4232, 0.4341), (-0.2533, -0.0042, 0.1068), (0.1076, 0.1111, -0.0362),
              (-0.3165, -0.2492, -0.2188)), (0.1084, -0.0175, -0.0011)),
    "sd3": (((-0.0922, -0.0175, 0.0749), (0.0311, 0.0633, 0.0954), (0.1994, 0.0927, 0.0458),
             (0.0856, 0.0339, 0.0902), (0.0587, 0.0272, -0.0496), (-0.0006, 0.1104, 0.0309),
             (0.0978, 0.0306, 0.0427), (-0.0042, 0.1038, 0.1358), (-0.0194, 0.0020, 0.0669),
             (-0.0488, 0.0130, -0.0268), (0.0922, 0.0988, 0.0951), (-0.0278, 0.0524, -0.0542),
             (0.0332, 0.0456, 0.0895), (-0.0069, -0.0030, -0.0810), (-0.0596, -0.0465, -0.0293),
             (-0.1448, -0.1463, -0.1189)), (0.2394, 0.2135, 0.1925)),
    "flux": (((-0.0346, 0.0244, 0.0681), (0.0034, 0.0210, 0.0687), (0.0275, -0.0668, -0.0433),
              (-0.0174, 0.0160, 0.0617), (0.0859, 0.0721, 0.0329), (0.0004, 0.0383, 0.0115),
              (0.0405, 0.0861, 0.0915), (-0.0236, -0.0185, -0.0259), (-0.0245, 0.0250, 0.1180),
              (0.1008, 0.0755, -0.0421), (-0.0515, 0.0201, 0.0011), (0.0428, -0.0012, -0.0036),
              (0.0817, 0.0765, 0.0749), (-0.1264, -0.0522, -0.1103), (-0.0280, -0.0881, -0.0499),
              (-0.1262, -0.0982, -0.0778)), (-0.0329, -0.0718, -0.0851)),
}
_ALIASES = {"sd15": "sd1", "sd1x": "sd1", "sd2": "sd1", "sd21": "sd1", "sd2x": "sd1", "sdxl-refiner": "sdxl",
            "sd35": "sd3", "chroma": "flux"}
_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def latent_rgb(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The float32 ``(C, 3)`` factors and ``(3,)`` bias of a latent format."""
    key = _ALIASES.get(str(fmt).lower(), str(fmt).lower())
    if key not in LATENT_RGB:
        raise InputError(f"no latent-to-RGB factors for {fmt!r}", where="sdrt.pipelines.preview",
                         fix=f"use one of {', '.join(LATENT_RGB)} (SD 2.x uses sd1), or a TAESD decoder")
    if key not in _CACHE:
        f, b = LATENT_RGB[key]
        _CACHE[key] = (np.array(f, np.float32), np.array(b, np.float32))
    return _CACHE[key]


def _latent(latent: np.ndarray, where: str) -> np.ndarray:
    x = np.asarray(latent)
    if x.ndim == 4:
        if x.shape[0] != 1:
            raise InputError(f"preview of a batch of {x.shape[0]} latents", where=where,
                             fix="pass one latent, e.g. latent[i] (shape (C, h, w))")
        x = x[0]
    if x.ndim != 3 or not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"latent of {x.dtype} {x.shape} is not (C, h, w) floats", where=where,
                         fix="pass the sampler's latent for one image, shape (C, h, w) or (1, C, h, w)")
    return x


def to_uint8(image: np.ndarray) -> np.ndarray:
    """``(h, w, 3)`` values in [-1, 1] -> uint8 as ComfyUI's previews do (``(x + 1) / 2``, clamp, times 255, truncate)."""
    return (np.clip((image + np.float32(1)) * np.float32(0.5), 0, 1) * np.float32(255)).astype(np.uint8)


def fit_latent_rgb(latents: np.ndarray, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares latent-to-RGB factors for a VAE without published ones (how such factors are made).

    ``latents``: ``(N, C, h, w)`` as the sampler holds them; ``images``: their decoded ``(N, H, W, 3)``
    uint8 images, ``H = f h`` and ``W = f w``. Each image is averaged over ``f x f`` cells and mapped to
    [-1, 1]; returns float32 ``factors (C, 3)`` and ``bias (3,)`` for ``project(..., factors=, bias=)``.
    """
    z = np.asarray(latents, np.float64)
    im = np.asarray(images)
    where = "sdrt.pipelines.preview.fit_latent_rgb"
    if z.ndim != 4 or im.ndim != 4 or im.shape[3] != 3 or z.shape[0] != im.shape[0] \
            or im.shape[1] % z.shape[2] or im.shape[2] % z.shape[3] \
            or im.shape[1] // z.shape[2] != im.shape[2] // z.shape[3]:
        raise InputError(f"latents {z.shape} and images {im.shape} do not pair up", where=where,
                         fix="pass (N, C, h, w) latents and their (N, f*h, f*w, 3) decoded images")
    n, c, h, w = z.shape
    f = im.shape[1] // h
    target = im.astype(np.float64).reshape(n, h, f, w, f, 3).mean(axis=(2, 4)) / 127.5 - 1.0
    a = np.concatenate([z.transpose(0, 2, 3, 1).reshape(-1, c), np.ones((n * h * w, 1))], axis=1)
    sol, *_ = np.linalg.lstsq(a, target.reshape(-1, 3), rcond=None)
    return sol[:c].astype(np.float32), sol[c].astype(np.float32)


def project(latent: np.ndarray, fmt: str | None = None, *, upscale: int = 1, factors: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> np.ndarray:
    """The cheap linear preview of one latent: ``(h * upscale, w * upscale, 3)`` uint8.

    ``fmt`` names published factors; or pass your own ``factors`` ``(C, 3)`` and ``bias`` ``(3,)``.
    """
    if isinstance(upscale, (bool, np.bool_)) or not isinstance(upscale, (int, np.integer)) \
            or not 1 <= upscale <= MAX_UPSCALE:
        raise InputError(f"upscale must be a whole number from 1 to {MAX_UPSCALE}, got {type(upscale).__name__} "
                         f"{upscale!r:.40}", where="upscale",
                         fix="pass upscale=1 (one pixel per latent pixel) or 8 (the image's size)")
    x = _latent(latent, "sdrt.pipelines.preview.project")
    if factors is not None:
        factors = np.asarray(factors, np.float32)
        bias = np.zeros(3, np.float32) if bias is None else np.asarray(bias, np.float32)
        fmt = fmt or "given"
        if factors.ndim != 2 or factors.shape[1] != 3 or bias.shape != (3,):
            raise InputError(f"factors {factors.shape} and bias {bias.shape}", where="sdrt.pipelines.preview.project",
                             fix="pass factors of shape (C, 3) and a bias of shape (3,)")
    elif fmt is None:
        raise InputError("no latent format given", where="sdrt.pipelines.preview.project",
                         fix=f"pass fmt= (one of {', '.join(LATENT_RGB)}) or factors=")
    else:
        factors, bias = latent_rgb(fmt)
    if x.shape[0] != factors.shape[0]:
        raise InputError(f"a {x.shape[0]}-channel latent given to the {fmt} preview, which takes "
                         f"{factors.shape[0]} channels", where="sdrt.pipelines.preview.project",
                         fix="pass the latent format of the model that made the latent")
    c, h, w = x.shape
    # einsum's own single-threaded loop, not BLAS: a BLAS call for this thin product is slow in one
    # orientation and, right after a backend's step, waits for threads the backend still holds
    rgb = np.einsum("cn,cr->nr", x.reshape(c, h * w).astype(np.float32, copy=False), factors,
                    optimize=False).reshape(h, w, 3) + bias
    out = to_uint8(rgb)
    if upscale > 1:
        out = out.repeat(upscale, axis=0).repeat(upscale, axis=1)
    return out


def check_preview_size(value: Any, where: str = "preview_size") -> int | None:
    """``value`` as a preview size: an int of at least 8 pixels (one latent pixel), or None (full size)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < _DECODER_SCALE:
        raise InputError(f"{{@preview_size}} must be a whole number of pixels, at least {_DECODER_SCALE}, got "
                         f"{value!r}", where=where, fix="give the preview's longer side in pixels, e.g. 256, or "
                                                        "{@preview_size=}None for the decoder's full size")
    return int(value)


def preview_latent_size(h: int, w: int, preview_size: int | None) -> tuple[int, int]:
    """The latent size ``(h', w')`` a decoder is given so that its image's longer side is at most
    ``preview_size`` (``8 h'``, ``8 w'``): ``(h, w)`` itself when it fits or ``preview_size`` is None;
    never larger than ``(h, w)``, the aspect kept to a latent pixel, at least 1."""
    longest = _DECODER_SCALE * max(h, w)
    if preview_size is None or longest <= preview_size:
        return h, w
    return max(1, h * preview_size // longest), max(1, w * preview_size // longest)


def _area_weights(n: int, m: int) -> np.ndarray:
    """``(m, n)`` weights of an area (box) resample of ``n`` samples to ``m``: each output averages
    the part of the input its cell covers, fractions of a sample included (OpenCV's INTER_AREA when shrinking)."""
    edges = np.arange(m + 1, dtype=np.float64) * (n / m)
    lo, hi = edges[:-1, None], edges[1:, None]
    j = np.arange(n, dtype=np.float64)[None, :]
    return (np.clip(np.minimum(j + 1, hi) - np.maximum(j, lo), 0, None) * (m / n)).astype(np.float32)


def area_resize(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """``(C, H, W)`` -> ``(C, h, w)`` float32 by area averaging (each output the mean of its cell)."""
    x = np.asarray(x, np.float32)
    if x.shape[1:] == (h, w):
        return x
    # einsum's own loop, not BLAS (see project)
    y = np.einsum("ih,chw->ciw", _area_weights(x.shape[1], h), x, optimize=False)
    return np.einsum("ciw,jw->cij", y, _area_weights(x.shape[2], w), optimize=False)


class TaesdPreview:
    """Decode previews with a TAESD-family decoder given as an ONNX file (or its folder).

    ``session`` may be an open ``sdrt`` Session instead of a path; ``scaling_factor`` and
    ``shift_factor`` override the folder's ``config.json``. ``preview_size``: the preview's longer side at
    most, in pixels (the latent is area-downscaled before the decode); None decodes at full size. Other
    keyword arguments go to ``sdrt.load`` (``backend=``, ``device=``, ``precision=``; without one, the
    backend's default precision, bf16 on CPUs that have it).
    """

    def __init__(self, path: str | Path | None = None, *, session: Any = None, scaling_factor: float | None = None,
                 shift_factor: float | None = None, preview_size: int | None = DEFAULT_PREVIEW_SIZE,
                 **load_options: Any) -> None:
        where = "sdrt.pipelines.preview.TaesdPreview"
        #: the preview's longer side at most (pixels), or None: the decoder's full size
        self.preview_size = check_preview_size(preview_size)
        config: dict = {}
        self._graph = None
        if session is None:
            if path is None:
                raise InputError("no TAESD decoder given", where=where, fix="pass the decoder's model.onnx or folder")
            p = Path(path)
            onnx_path = p / "model.onnx" if p.is_dir() else p
            if not onnx_path.is_file():
                raise InputError("the TAESD decoder file does not exist", where=str(onnx_path),
                                 fix="pass a vae_decoder/model.onnx exported from AutoencoderTiny (or its folder)")
            cfg = onnx_path.parent / "config.json"
            if cfg.is_file():
                config = json.loads(cfg.read_text())
            from ..graph import Graph

            self._graph = Graph.load(onnx_path)
            names = [i.name for i in self._graph.inputs]
            if len(names) != 1:
                raise InputError(f"TAESD decoder with inputs {names}", where=str(onnx_path),
                                 fix="export the decoder alone: one input (latent_sample), one output (sample)")
        self.session = session
        self._sessions: dict[tuple[int, ...], Any] = {}
        self._load_options = load_options
        self.scaling_factor = float(scaling_factor if scaling_factor is not None else config.get("scaling_factor", 1.0))
        self.shift_factor = float(shift_factor if shift_factor is not None else config.get("shift_factor", 0.0) or 0.0)

    def _session_for(self, shape: Sequence[int]) -> Any:
        if self.session is not None:
            return self.session
        key = tuple(int(d) for d in shape)
        sess = self._sessions.get(key)
        if sess is None:
            from ..runtime import load

            assert self._graph is not None
            name = self._graph.inputs[0].name
            sess = load(self._graph.with_shapes({name: key}), **self._load_options)
            self._sessions[key] = sess
        return sess

    def __call__(self, latent: np.ndarray) -> np.ndarray:
        """``(H, W, 3)`` uint8 preview of one latent, its longer side at most ``preview_size``."""
        x = _latent(latent, "sdrt.pipelines.preview.TaesdPreview")
        size = check_preview_size(self.preview_size)
        x = area_resize(x, *preview_latent_size(x.shape[1], x.shape[2], size))
        z = (x.astype(np.float32) / np.float32(self.scaling_factor) + np.float32(self.shift_factor))[None]
        sess = self._session_for(z.shape)
        name = sess.inputs[0].name
        out = sess.run({name: z})
        image = next(iter(out.values())) if len(out) == 1 else out.get("sample", next(iter(out.values())))
        return to_uint8(np.asarray(image, np.float32)[0].transpose(1, 2, 0))

    def close(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()

    def __enter__(self) -> TaesdPreview:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
