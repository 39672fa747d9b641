"""Hires fix as A1111 does it: a first pass at the base size, an upscale, then img2img at the target size.

Upscalers (A1111's names):

- latent, resampled as ``torch.nn.functional.interpolate(latent, size, mode, antialias)`` with
  ``align_corners=False``, which A1111's ``latent_upscale_modes`` call: ``Latent`` (bilinear),
  ``Latent (antialiased)`` (bilinear, antialias), ``Latent (bicubic)``, ``Latent (bicubic antialiased)``,
  ``Latent (nearest)``, ``Latent (nearest-exact)``;
- image: the first pass is decoded, resized with Pillow (``Lanczos``, ``Nearest``; Pillow is the
  ``sdrt[images]`` extra) and encoded again;
- a model upscaler (ESRGAN, Real-ESRGAN, 4x-UltraSharp...; ``sdrt.pipelines.upscaler``): the path of its
  ``.safetensors``/``.pth`` file, or its name (the file's stem) in a folder of ``$SDRT_UPSCALERS``
  (folders separated by ``os.pathsep``). The decoded image is upscaled by the model's factor in tiles,
  then resized to the target with Lanczos, as A1111 does; the infotext names the model.

The second pass runs ``hires_steps`` steps (0: the first pass's count) at the end of a schedule of
``int(hires_steps / min(denoise, 0.999))`` steps, as A1111's ``setup_img2img_steps`` with explicit steps
does, from the upscaled latent noised to its first step; its noise is drawn afresh from each image's
seed at the new size (A1111 makes a new ``ImageRNG`` for the pass).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, ModelNotFoundError
from .bounds import MAX_STEPS

__all__ = ["LATENT_MODES", "UPSCALERS", "Hires", "interpolate", "parse", "second_pass_steps", "upscale_image"]

#: A1111's latent upscale modes -> (torch interpolate mode, antialias)
LATENT_MODES: dict[str, tuple[str, bool]] = {
    "Latent": ("bilinear", False),
    "Latent (antialiased)": ("bilinear", True),
    "Latent (bicubic)": ("bicubic", False),
    "Latent (bicubic antialiased)": ("bicubic", True),
    "Latent (nearest)": ("nearest", False),
    "Latent (nearest-exact)": ("nearest-exact", False),
}
#: image upscalers by Pillow resampling filter
IMAGE_MODES = {"Lanczos": "LANCZOS", "Nearest": "NEAREST"}
UPSCALERS = (*LATENT_MODES, *IMAGE_MODES)


@dataclass(frozen=True)
class Hires:
    """Checked hires-fix settings."""

    scale: float
    steps: int  # 0: the first pass's steps
    denoise: float
    upscaler: str
    #: a model upscaler's file (``upscaler`` is then its name)
    model: Path | None = None

    @property
    def latent(self) -> bool:
        return self.upscaler in LATENT_MODES

    def target(self, width: int, height: int) -> tuple[int, int]:
        """A1111's ``int(size * scale)``, down to a multiple of 8 (the latent grid)."""
        return int(width * self.scale) // 8 * 8, int(height * self.scale) // 8 * 8

    def fitting_scales(self, width: int, height: int, multiple: int) -> list[tuple[float, int, int]]:
        """``[(scale, w, h), ...]``: the scales (in steps of 0.05, the smallest for each size) whose second pass is
        nearest below and above this one's with both sides multiples of ``multiple`` (16 for the flow models)."""
        sizes: dict[tuple[int, int], float] = {}
        for k in range(21, 161):  # 1.05 to 8.00
            w, h = int(width * k / 20) // 8 * 8, int(height * k / 20) // 8 * 8
            if w % multiple == 0 and h % multiple == 0 and (w, h) != (width, height):
                sizes.setdefault((w, h), k / 20)
        tw, th = self.target(width, height)
        below = [(sc, w, h) for (w, h), sc in sizes.items() if w * h < tw * th]
        above = [(sc, w, h) for (w, h), sc in sizes.items() if w * h > tw * th]
        return ([max(below)] if below else []) + ([min(above)] if above else [])

    def infotext(self) -> dict[str, object]:
        fields: dict[str, object] = {"Denoising strength": _num(self.denoise), "Hires upscale": _num(self.scale)}
        if self.steps:
            fields["Hires steps"] = self.steps
        fields["Hires upscaler"] = self.upscaler
        return fields


def _num(v: float) -> object:
    return int(v) if float(v).is_integer() else round(float(v), 4)


def parse(scale: float | None, steps: int | None, denoise: float | None, upscaler: str | None) -> Hires | None:
    """``hires_scale`` turns the fix on; the others need it. A1111's defaults: denoise 0.7, ``Latent``."""
    if scale is None:
        for name, value in (("hires_steps", steps), ("hires_denoise", denoise), ("hires_upscaler", upscaler)):
            if value is not None:
                raise InputError(f"{{@{name}}} needs {{@hires_scale}}", where=name,
                                 fix="pass {@hires_scale=}2 (for example) too, or leave {@" + name + "} out")
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)) or not math.isfinite(scale) \
            or not 1 <= scale <= 8:
        raise InputError(f"{{@hires_scale}} must be a number from 1 to 8, got {scale!r}", where="hires_scale",
                         fix="pass e.g. {@hires_scale=}2")
    steps = 0 if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= MAX_STEPS:
        raise InputError(f"{{@hires_steps}} must be an integer from 0 to {MAX_STEPS}, got {steps!r}",
                         where="hires_steps", fix="pass e.g. {@hires_steps=}10 (0: as many as the first pass)")
    denoise = 0.7 if denoise is None else denoise
    if isinstance(denoise, bool) or not isinstance(denoise, (int, float, np.floating)) or not 0 < denoise <= 1:
        raise InputError(f"{{@hires_denoise}} must be in (0, 1], got {denoise!r}", where="hires_denoise",
                         fix="pass e.g. {@hires_denoise=}0.5")
    upscaler = "Latent" if upscaler is None else upscaler
    model = None
    if isinstance(upscaler, Path):
        upscaler = str(upscaler)
    if upscaler not in UPSCALERS:
        lower = {u.lower(): u for u in UPSCALERS}
        if isinstance(upscaler, str) and upscaler.lower() in lower:
            upscaler = lower[upscaler.lower()]
        elif (model := model_upscaler(upscaler)) is not None:  # checked now, not after pass 1
            upscaler = model.stem
        elif isinstance(upscaler, str) and Path(upscaler).suffix.lower() in (".safetensors", ".pth", ".pt", ".ckpt"):
            # a model file's path that is not there: said so, not "unknown upscaler" with a list of names
            raise ModelNotFoundError(f"the hires upscaler file {upscaler!r} does not exist", where="hires_upscaler",
                                     fix="check the path (an ESRGAN-family .safetensors/.pth model), or use one of "
                                         f"{', '.join(repr(u) for u in UPSCALERS)}")
        else:
            raise InputError(f"unknown hires upscaler {upscaler!r}", where="hires_upscaler",
                             fix=f"use one of {', '.join(repr(u) for u in UPSCALERS)}{models_hint()}")
    return Hires(float(scale), int(steps), float(denoise), upscaler, model)


def model_files() -> dict[str, Path]:
    """``{name: path}`` of the model upscalers in the folders of ``$SDRT_UPSCALERS``."""
    from .upscaler import find_models

    return find_models(*(p for p in os.environ.get("SDRT_UPSCALERS", "").split(os.pathsep) if p))


def model_file(value: object) -> Path | None:
    """The model upscaler file ``value`` names: a path to one, or a name in ``$SDRT_UPSCALERS``."""
    from .upscaler import is_model_file

    if not isinstance(value, str) or not value:
        return None
    if is_model_file(value):
        return Path(value)
    models = model_files()
    if value in models:
        return models[value]
    return {k.casefold(): v for k, v in models.items()}.get(value.casefold())


def model_upscaler(value: object) -> Path | None:
    """The model upscaler file ``value`` names (:func:`model_file`), its tensors checked (headers only): a file that
    is no upscaler fails now, before any model loads; None when ``value`` names no file."""
    model = model_file(value)
    if model is not None:
        from ..weights import Weights
        from .upscaler import detect

        detect(Weights.open(model).shapes(), str(model))
    return model


def models_hint() -> str:
    """The rest of an unknown upscaler's fix: the model upscalers in ``$SDRT_UPSCALERS``, else that a path works."""
    models = model_files()
    return f"; model upscalers in $SDRT_UPSCALERS: {', '.join(models)}" if models else \
        "; or the path of an ESRGAN-family .safetensors/.pth model"


def second_pass_steps(hires: Hires, first_steps: int) -> tuple[int, int]:
    """(schedule length, steps run at its end) of the second pass, A1111's ``setup_img2img_steps`` with the steps
    given (its hires fix passes them): the img2img rule ``"a1111-fix-steps"`` (:mod:`sdrt.pipelines.strength`)."""
    from .strength import schedule

    run = hires.steps or first_steps
    fix = "lower {@hires_steps}" if hires.steps else "pass a lower {@hires_steps} (or lower {@steps}, which it runs)"
    return schedule(run, hires.denoise, "a1111-fix-steps", where="hires_denoise", steps_fix=fix)[0], run


# ------------------------------------------------------------------ torch's interpolate, in numpy
def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))


def _matrix(n_in: int, n_out: int, mode: str, antialias: bool) -> np.ndarray:
    """The (n_out, n_in) resampling matrix torch applies along one axis (align_corners=False, size given)."""
    scale = n_in / n_out
    m = np.zeros((n_out, n_in), dtype=np.float64)
    dst = np.arange(n_out)
    if mode in ("nearest", "nearest-exact"):
        src = np.floor((dst + (0.5 if mode == "nearest-exact" else 0.0)) * np.float32(scale)).astype(np.int64)
        m[dst, np.minimum(src, n_in - 1)] = 1.0
        return m
    if antialias:  # torch's _upsample_*_aa: a separable filter with support widened when shrinking
        size = 2 if mode == "bilinear" else 4
        support = size * 0.5 * scale if scale >= 1 else size * 0.5
        inv = 1 / scale if scale >= 1 else 1.0
        for i in range(n_out):
            center = scale * (i + 0.5)
            lo = max(int(center - support + 0.5), 0)
            hi = min(int(center + support + 0.5), n_in)
            x = (np.arange(lo, hi) - center + 0.5) * inv
            w = np.maximum(1 - np.abs(x), 0) if mode == "bilinear" else _cubic(x, -0.5)
            total = w.sum()
            m[i, lo:hi] = w / total if total else w
        return m
    src = (dst + 0.5) * scale - 0.5
    if mode == "bilinear":
        src = np.maximum(src, 0)
        i0 = np.floor(src).astype(np.int64)
        lam = src - i0
        i1 = np.minimum(i0 + 1, n_in - 1)
        i0 = np.minimum(i0, n_in - 1)
        np.add.at(m, (dst, i0), 1 - lam)
        np.add.at(m, (dst, i1), lam)
        return m
    if mode == "bicubic":
        i0 = np.floor(src).astype(np.int64)
        t = src - i0
        for k in range(-1, 3):
            np.add.at(m, (dst, np.clip(i0 + k, 0, n_in - 1)), _cubic(t - k, -0.75))
        return m
    raise InputError(f"unknown interpolation mode {mode!r}", where="hires_upscaler", fix="use a Latent mode")


def interpolate(latent: np.ndarray, height: int, width: int, mode: str = "bilinear",
                antialias: bool = False) -> np.ndarray:
    """``torch.nn.functional.interpolate(latent, size=(height, width), mode, antialias)`` on (B, C, h, w)."""
    x = np.asarray(latent, dtype=np.float32)
    rows = _matrix(x.shape[2], height, mode, antialias).astype(np.float32)
    cols = _matrix(x.shape[3], width, mode, antialias).astype(np.float32)
    return np.einsum("ph,bchw,qw->bcpq", rows, x, cols, optimize=True).astype(np.float32)


def upscale_latent(latent: np.ndarray, hires: Hires, height: int, width: int) -> np.ndarray:
    mode, aa = LATENT_MODES[hires.upscaler]
    return interpolate(latent, height // 8, width // 8, mode, aa)


def upscale_image(image: np.ndarray, width: int, height: int, upscaler: str) -> np.ndarray:
    """An HxWx3 uint8 image resized with Pillow's filter for ``upscaler`` (``Lanczos``, ``Nearest``)."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError(f"the {upscaler} hires upscaler needs Pillow", where="hires_upscaler",
                         fix="pip install 'sdrt[images]', or use a Latent upscaler") from None
    resample = getattr(Image.Resampling, IMAGE_MODES[upscaler])
    return np.asarray(Image.fromarray(image).resize((width, height), resample=resample), dtype=np.uint8)
