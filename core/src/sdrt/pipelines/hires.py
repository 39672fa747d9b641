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

The size: ``hires_scale`` times the first pass's (A1111's ``int(side * scale)``), or ``hires_width`` /
``hires_height`` (A1111's ``hr_resize_x`` / ``hr_resize_y``, "Resize width to / height to"): one given, the other
follows the first pass's aspect ratio; both, the picture is upscaled to cover that size and its latent cropped
centrally to it (A1111's ``truncate_x`` / ``truncate_y``, in both the latent and the image paths: the image is
stretched to the covering size, encoded, then its latent cropped). Sides round down to a multiple of 8.

The second pass may have its own sampler and schedule (``hires_sampler``, ``hires_schedule``: A1111's
``hr_sampler_name`` / ``hr_scheduler``) and prompts (``hires_prompt``, ``hires_negative_prompt``: A1111's
``hr_prompt`` / ``hr_negative_prompt``), each the first pass's when unset.

The second pass runs ``hires_steps`` steps (0: the first pass's count) at the end of a schedule of
``int(hires_steps / min(denoise, 0.999))`` steps, as A1111's ``setup_img2img_steps`` with explicit steps
does, from the upscaled latent noised to its first step; its noise is drawn afresh from each image's
seed at the new size (A1111 makes a new ``ImageRNG`` for the pass). A1111's DDIM and PLMS cut that schedule their own
way (:mod:`sdrt.pipelines.compvis`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelNotFoundError
from .bounds import MAX_SIDE, MAX_STEPS

__all__ = ["LATENT_MODES", "UPSCALERS", "Hires", "interpolate", "parse", "second_pass_steps", "upscale_image"]

#: the keywords of the hires fix (sdrt.pipelines.toolbox)
KEYWORDS = ("hires_scale", "hires_steps", "hires_denoise", "hires_upscaler", "hires_width", "hires_height",
            "hires_sampler", "hires_schedule", "hires_prompt", "hires_negative_prompt")

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
    #: A1111's (hr_resize_x, hr_resize_y); (0, 0): the size comes from ``scale``
    resize: tuple[int, int] = (0, 0)
    #: the second pass's own sampler / schedule names (None: the first pass's), and its resolved SamplerChoice
    sampler: str | None = None
    schedule: str | None = None
    #: the second pass's own prompts (None: the first pass's)
    prompt: str | None = None
    negative_prompt: str | None = None
    #: the first pass's ``schedule`` argument (None: its sampler's own), which a ``sampler`` given alone runs with
    first_schedule: str | None = None

    @property
    def latent(self) -> bool:
        return self.upscaler in LATENT_MODES

    def upscaled(self, width: int, height: int) -> tuple[int, int]:
        """The size the first pass is upscaled to (A1111's ``hr_upscale_to_x/y``), down to multiples of 8: with both
        of ``resize`` given, the size that covers it at the first pass's aspect ratio (then cropped: :meth:`crop`)."""
        rx, ry = self.resize
        if not rx and not ry:
            w, h = int(width * self.scale), int(height * self.scale)
        elif not ry:
            w, h = rx, rx * height // width
        elif not rx:
            w, h = ry * width // height, ry
        elif width / height < rx / ry:
            w, h = rx, rx * height // width
        else:
            w, h = ry * width // height, ry
        return w // 8 * 8, h // 8 * 8

    def crop(self, width: int, height: int) -> tuple[int, int]:
        """(x, y) latent columns and rows cropped from the upscaled latent, A1111's ``truncate_x/y`` (split half
        before, the rest after); (0, 0) unless both sides of ``resize`` are given."""
        rx, ry = self.resize
        if not rx or not ry:
            return 0, 0
        w, h = self.upscaled(width, height)
        return max(0, (w - rx) // 8), max(0, (h - ry) // 8)

    def target(self, width: int, height: int) -> tuple[int, int]:
        """The second pass's size: A1111's ``int(size * scale)`` or its resize, down to a multiple of 8."""
        w, h = self.upscaled(width, height)
        tx, ty = self.crop(width, height)
        return w - 8 * tx, h - 8 * ty

    def off(self, width: int, height: int) -> bool:
        """A1111's "the user has chosen to do nothing": the second pass would run at the first pass's size."""
        return self.target(width, height) == (width, height)

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

    def choice(self, first: Any) -> Any:
        """The second pass's SamplerChoice: its own sampler and schedule, each the first pass's (``first``, its
        (sampler name, SamplerChoice)) when unset, as A1111's ``hr_sampler_name or sampler_name`` and
        ``hr_scheduler`` (unset: the first pass's scheduler as given, so "Automatic" is the hires sampler's own)."""
        from ..samplers import resolve

        name, own = first
        if self.sampler is None and self.schedule is None:
            return own
        if self.sampler is None:
            return resolve(name, self.schedule)
        return resolve(self.sampler, self.schedule if self.schedule is not None else self.first_schedule)

    def infotext(self, first: Any = None, prompt: str = "", negative_prompt: str = "",
                 checkpoint: str | None = None) -> dict[str, object]:
        """A1111's fields, in its order: ``first`` (the first pass's (sampler name, SamplerChoice)) for ``Hires
        sampler`` / ``Hires schedule type`` (written when they differ from the first pass's), the first pass's
        prompts for ``Hires prompt`` / ``Hires negative prompt`` (likewise)."""
        fields: dict[str, object] = {"Denoising strength": _num(self.denoise)}
        if checkpoint is not None:  # A1111's hr_checkpoint_info.short_title, before the sampler's fields
            fields["Hires checkpoint"] = checkpoint
        if first is not None and (self.sampler is not None or self.schedule is not None):
            from .names import sampler_labels

            label, sched = sampler_labels(first[1])
            own_label, own_sched = sampler_labels(self.choice(first))
            if own_label != label:
                fields["Hires sampler"] = own_label
            if own_sched != sched:
                fields["Hires schedule type"] = own_sched
        if self.prompt is not None and self.prompt != prompt:
            fields["Hires prompt"] = self.prompt
        if self.negative_prompt is not None and self.negative_prompt != negative_prompt:
            fields["Hires negative prompt"] = self.negative_prompt
        if any(self.resize):
            fields["Hires resize"] = f"{self.resize[0]}x{self.resize[1]}"
        else:
            fields["Hires upscale"] = _num(self.scale)
        if self.steps:
            fields["Hires steps"] = self.steps
        fields["Hires upscaler"] = self.upscaler
        return fields


def _num(v: float) -> object:
    return int(v) if float(v).is_integer() else round(float(v), 4)


def parse(scale: float | None, steps: int | None, denoise: float | None, upscaler: str | None,
          width: int | None = None, height: int | None = None, sampler: str | None = None,
          schedule: str | None = None, prompt: str | None = None, negative_prompt: str | None = None, *,
          first_schedule: str | None = None) -> Hires | None:
    """``hires_scale`` (or ``hires_width`` / ``hires_height``) turns the fix on; the others need it. A1111's
    defaults: denoise 0.7, ``Latent``."""
    sides = {}
    for name, side in (("hires_width", width), ("hires_height", height)):
        if side is None or (not isinstance(side, bool) and isinstance(side, (int, np.integer)) and side == 0):
            continue  # A1111's 0: unset
        if isinstance(side, bool) or not isinstance(side, (int, np.integer)) or not 8 <= side <= MAX_SIDE:
            raise InputError(f"{{@{name}}} must be an integer from 8 to {MAX_SIDE} pixels (0: unset), got {side!r}",
                             where=name, fix="pass e.g. {@" + name + "=}1024")
        sides[name] = int(side)
    if scale is None and not sides:
        for name, value in (("hires_steps", steps), ("hires_denoise", denoise), ("hires_upscaler", upscaler),
                            ("hires_sampler", sampler), ("hires_schedule", schedule), ("hires_prompt", prompt),
                            ("hires_negative_prompt", negative_prompt)):
            if value is not None:
                raise InputError(f"{{@{name}}} needs {{@hires_scale}}", where=name,
                                 fix="pass {@hires_scale=}2 (for example) too (or {@hires_width} / {@hires_height}), or "
                                     "leave {@" + name + "} out")
        return None
    if scale is not None and sides:
        name = next(iter(sides))
        raise InputError(f"{{@hires_scale}} and {{@{name}}} both size the second pass", where=name,
                         fix="pass {@hires_scale} (a factor) or {@hires_width} / {@hires_height} (a size), not both")
    if scale is None:
        scale = 1.0  # unused: the size comes from hires_width / hires_height
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)) or not math.isfinite(scale) \
            or not 1 <= scale <= 8:
        raise InputError(f"{{@hires_scale}} must be a number from 1 to 8, got {scale!r}", where="hires_scale",
                         fix="pass e.g. {@hires_scale=}2")
    steps = 0 if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= MAX_STEPS:
        raise InputError(f"{{@hires_steps}} must be an integer from 0 to {MAX_STEPS}, got {steps!r}",
                         where="hires_steps", fix="pass e.g. {@hires_steps=}10 (0: as many as the first pass)")
    for name, value in (("hires_sampler", sampler), ("hires_schedule", schedule), ("hires_prompt", prompt),
                        ("hires_negative_prompt", negative_prompt)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{{@{name}}} must be a string, got {type(value).__name__} {value!r:.40}", where=name,
                             fix="pass a string, or leave {@" + name + "} out (the first pass's)")
    if sampler is not None or schedule is not None:  # the names checked now, before any model loads
        from ..errors import SdrtError
        from ..samplers import resolve

        try:
            resolve(sampler if sampler is not None else "Euler", schedule)
        except SdrtError as exc:
            where = "hires_sampler" if sampler is not None and exc.where == "sampler" else "hires_schedule"
            raise InputError(f"{{@{where}}}: {exc.what}", where=where, fix=exc.fix) from None
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
    return Hires(float(scale), int(steps), float(denoise), upscaler, model,
                 (sides.get("hires_width", 0), sides.get("hires_height", 0)), sampler, schedule, prompt, negative_prompt,
                 first_schedule if isinstance(first_schedule, str) else None)


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


def crop_latent(latent: np.ndarray, tx: int, ty: int) -> np.ndarray:
    """A1111's crop of the upscaled latent to the asked size: ``tx`` columns and ``ty`` rows cut off, half of each
    (rounded down) before, the rest after."""
    if not tx and not ty:
        return latent
    h, w = latent.shape[2], latent.shape[3]
    return np.ascontiguousarray(latent[:, :, ty // 2:h - (ty + 1) // 2, tx // 2:w - (tx + 1) // 2])


def upscale_image(image: np.ndarray, width: int, height: int, upscaler: str) -> np.ndarray:
    """An HxWx3 uint8 image resized with Pillow's filter for ``upscaler`` (``Lanczos``, ``Nearest``)."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError(f"the {upscaler} hires upscaler needs Pillow", where="hires_upscaler",
                         fix="pip install 'sdrt[images]', or use a Latent upscaler") from None
    resample = getattr(Image.Resampling, IMAGE_MODES[upscaler])
    return np.asarray(Image.fromarray(image).resize((width, height), resample=resample), dtype=np.uint8)
