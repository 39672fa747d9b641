"""The everyday toolbox's arguments (ControlNet, hires fix, live previews, A1111's seeds), checked once.

``split(kwargs)`` takes these keywords out of ``generate``'s and returns them checked as a
:class:`Toolbox`; the generic settings (:mod:`.settings`) never see them. ``noise_source`` gives the
generator a run draws its noise from:

- ``rng="cpu"`` without a variation seed (the default): diffusers' stream, one
  ``torch.Generator("cpu").manual_seed(seed)`` for the whole batch (VAE sample, initial noise, then
  each ancestral step), which every diffusers reference of the test suite follows;
- ``rng="gpu"`` / ``"nv"``, or any ``rng`` with a variation seed (``subseed_strength > 0``): A1111's
  ``ImageRNG``: every image of a batch its own generator of its own seed (``seed + i``; the same seed
  and ``subseed + i`` with a variation strength), the initial noise drawn per image in
  ``(C, H / 8, W / 8)`` and stacked, ancestral noise from the same per-image generators. The VAE
  encoder's sample (img2img) comes from a CPU generator of the first seed (A1111 draws it from torch's
  unseeded global generator, which nothing can reproduce).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError

KEYWORDS = ("controlnets", "guess_mode", "hires_scale", "hires_steps", "hires_denoise", "hires_upscaler",
            "hires_width", "hires_height", "hires_sampler", "hires_schedule", "hires_prompt", "hires_negative_prompt",
            "rng",
            "subseed", "subseed_strength", "preview", "preview_size", "refiner", "refiner_switch_at",
            "refiner_switch_by_steps", "hires_refiner_pass", "ip_adapter", "hires_checkpoint")


@dataclass
class Toolbox:
    controlnets: list[Any] = field(default_factory=list)
    hires: Any = None
    rng: str = "cpu"
    subseed: int | None = None
    subseed_strength: float = 0.0
    #: the subseed as given (None: none or -1), which sd-webui-controlnet's set_numpy_seed reads (``subseed`` is the
    #: one drawn for the noise)
    subseed_given: int | None = None
    preview: Any = None
    #: a TAESD preview's longer side at most, in pixels (None: the decoder's full size)
    preview_size: int | None = 256
    #: a refiner after the base (a model path or a Pipeline) and where it takes over (sdrt.pipelines.refiner)
    refiner: Any = None
    refiner_switch_at: float | None = None
    #: A1111's refiner_switch_by_sample_steps: the switch counts the sampler's denoiser calls, not timesteps
    refiner_switch_by_steps: bool = False
    #: with the hires fix: the passes the refiner may take over in (A1111's hires_fix_refiner_pass)
    hires_refiner_pass: str = "second pass"
    #: the IP-Adapters (image prompts; sdrt.pipelines.ipadapter.IPAdapter), checked, their files opened per job
    ip_adapter: list[Any] = field(default_factory=list)
    #: the hires fix's second pass on another model (a path or a Pipeline; sdrt.pipelines.hiresmodel)
    hires_checkpoint: Any = None
    #: the reference units (``reference_only``: sdrt.pipelines.refattn), taken out of ``controlnets``; ``units``:
    #: every unit in the order given (the infotext numbers them so)
    references: list[Any] = field(default_factory=list)
    units: list[Any] = field(default_factory=list)
    #: the T2I-Adapter units (a net that is a T2I-Adapter file: sdrt.pipelines.t2iadapter), taken out of ``controlnets``
    adapters: list[Any] = field(default_factory=list)
    #: the revision units (``revision_clipvision``, ``revision_ignore_prompt``: sdrt.pipelines.revision), taken out
    #: of ``controlnets``
    revisions: list[Any] = field(default_factory=list)
    #: the T2I-Adapter style adapter units (``t2ia_style_clipvision``: sdrt.pipelines.styleadapter), taken out of
    #: ``controlnets``
    styles: list[Any] = field(default_factory=list)

    def place(self, unit: Any, k: int) -> int:
        """A unit's place in ``controlnets`` as given (``k``, its place among the ControlNet units, where the run has
        no reference units): what errors and notes name it by."""
        return next((j for j, v in enumerate(self.units) if v is unit), k)

    @property
    def per_image(self) -> bool:
        """Noise drawn per image as A1111 does (else diffusers' one stream for the batch)."""
        return self.rng != "cpu" or self.subseed_strength != 0


def split(kwargs: dict[str, Any], schedule: str | None = None) -> tuple[dict[str, Any], Toolbox]:
    """(generic keywords, checked toolbox arguments); ``schedule``: the first pass's schedule argument (the hires
    fix's own sampler runs it when no schedule of its own is given)."""
    from ..samplers.seeds import RNG_SOURCES, resolve_seed
    from . import controlnet, hires
    from .preview import DEFAULT_PREVIEW_SIZE, check_preview_size

    rest = {k: v for k, v in kwargs.items() if k not in KEYWORDS}
    tb = Toolbox()
    tb.controlnets = controlnet.parse_units(kwargs.get("controlnets"))
    from .ipadapter import parse as parse_ip_adapter

    tb.ip_adapter = parse_ip_adapter(kwargs.get("ip_adapter"))
    guess = kwargs.get("guess_mode", False)
    if not isinstance(guess, (bool, np.bool_)):
        raise InputError(f"{{@guess_mode}} must be True or False, got {guess!r}", where="guess_mode",
                         fix="pass {@guess_mode=}True (diffusers' guess mode for every ControlNet) or leave it out")
    if guess:  # diffusers' pipeline argument: every net in guess mode
        if not tb.controlnets:
            raise InputError("{@guess_mode} without a ControlNet", where="guess_mode",
                             fix="pass {@controlnets} too, or leave {@guess_mode} out")
        for k, unit in enumerate(tb.controlnets):
            if unit.control_mode != controlnet.CONTROL_MODES[0]:
                raise InputError(f"{{@guess_mode}} and controlnets[{k}]'s control mode {unit.control_mode!r} are two "
                                 "ways of scaling the residuals", where="guess_mode",
                                 fix=f"leave {{@guess_mode}} out, or controlnets[{k}]'s control mode Balanced")
            unit.guess_mode = True
    tb.hires = hires.parse(*(kwargs.get(k) for k in hires.KEYWORDS), first_schedule=schedule)
    if tb.hires is None:  # the extension ignores hr_option without the fix: here it is said rather than dropped
        for k, unit in enumerate(tb.controlnets):
            if unit.hr_option != controlnet.HR_OPTIONS[0]:
                raise InputError(f"controlnets[{k}] hr_option {unit.hr_option!r} picks a pass of the hires fix, and "
                                 "the run has no hires fix", where=f"controlnets[{k}] hr_option",
                                 fix="pass {@hires_scale} too, or leave hr_option 'Both'")
    from .refattn import is_reference
    from .revision import is_revision
    from .styleadapter import is_style

    tb.units = list(tb.controlnets)

    def take(which: Any, kind: str) -> list[Any]:
        """The units ``which`` picks, out of ``controlnets``: they have no residuals for diffusers' guess mode."""
        taken = [u for u in tb.controlnets if which(u)]
        if taken:
            tb.controlnets = [u for u in tb.controlnets if not which(u)]
            if guess and not tb.controlnets:
                raise InputError(f"{{@guess_mode}} scales ControlNet residuals, and the units are {kind} units, "
                                 "which have none", where="guess_mode", fix="leave {@guess_mode} out")
            for u in taken:
                u.guess_mode = False
        return taken

    tb.references = take(is_reference, "reference")  # sdrt.pipelines.refattn
    tb.revisions = take(is_revision, "revision")  # sdrt.pipelines.revision: no net
    tb.styles = take(is_style, "style adapter")  # sdrt.pipelines.styleadapter: its net is the adapter
    from .t2iadapter import adapter_file

    tb.adapters = [u for k, u in enumerate(tb.controlnets)
                   if adapter_file(u.net, f"controlnets[{tb.place(u, k)}]") is not None]
    if tb.adapters:
        for u in tb.adapters:
            if u.guess_mode:
                k = tb.place(u, 0)
                if guess:  # the pipeline's argument, which puts every unit in guess mode
                    raise InputError(f"controlnets[{k}] is a T2I-Adapter, and {{@guess_mode}} scales ControlNet "
                                     "residuals", where="guess_mode",
                                     fix="leave {@guess_mode} out (a ControlNet unit beside it takes guess mode as "
                                         "the ControlNet units' own guess_mode=True)")
                raise InputError(f"controlnets[{k}] is a T2I-Adapter, and its guess_mode scales ControlNet residuals",
                                 where=f"controlnets[{k}] guess_mode", fix=f"leave controlnets[{k}]'s guess_mode out")
        tb.controlnets = [u for u in tb.controlnets if all(u is not a for a in tb.adapters)]
    rng = kwargs.get("rng")  # no truth test of the value: an array's is a ValueError ("ambiguous")
    rng = "cpu" if rng is None or (isinstance(rng, str) and not rng) else rng
    if not isinstance(rng, str) or rng.lower() not in RNG_SOURCES:
        raise InputError(f"unknown random source {{@rng=}}{rng!r}", where="rng",
                         fix="use cpu (diffusers' and A1111's CPU), gpu (A1111's default GPU noise) or nv")
    tb.rng = rng.lower()
    strength = kwargs.get("subseed_strength")
    strength = 0.0 if strength is None or (isinstance(strength, (int, float)) and strength == 0) else strength
    if isinstance(strength, bool) or not isinstance(strength, (int, float, np.floating)) \
            or not math.isfinite(strength) or not 0 <= strength <= 1:
        raise InputError(f"{{@subseed_strength}} must be from 0 to 1, got {strength!r}", where="subseed_strength",
                         fix="pass e.g. {@subseed_strength=}0.3 (0: no variation)")
    tb.subseed_strength = float(strength)
    subseed = kwargs.get("subseed")
    if subseed is not None:
        from ..samplers.noise import check_seed

        check_seed(subseed, "subseed")  # as the seed is checked: one range, one wording
    tb.subseed_given = None if subseed is None or int(subseed) == -1 else int(subseed)
    if tb.subseed_strength:
        tb.subseed = resolve_seed(-1 if subseed is None else int(subseed))
    elif subseed is not None and int(subseed) != -1:
        tb.subseed = int(subseed)
    preview = kwargs.get("preview")
    if preview is not None and preview is not False:
        if preview is True or (isinstance(preview, str) and preview == "approx"):
            tb.preview = "approx"
        elif isinstance(preview, (str, os.PathLike)):
            if not os.path.isfile(os.fspath(preview)):
                raise InputError(f"no preview decoder at {os.fspath(preview)!r}", where="preview",
                                 fix="pass a TAESD/TAESDXL/TAEF1 decoder's ONNX file to {@preview}")
            tb.preview = os.fspath(preview)
        elif callable(preview):  # a TaesdPreview, or any latent -> image function
            tb.preview = preview
        else:
            raise InputError(f"preview must be True, 'approx', an ONNX file or a function, got {preview!r}",
                             where="preview", fix="pass preview='approx' or a TAESD decoder file")
    tb.preview_size = check_preview_size(kwargs.get("preview_size", DEFAULT_PREVIEW_SIZE))
    if "preview_size" in kwargs and (not isinstance(tb.preview, str) or tb.preview == "approx"):
        fix = "pass {@preview} (the decoder's ONNX file) too, or leave {@preview_size} out"
        if callable(tb.preview):  # only the API passes a function: a TaesdPreview sizes its own previews
            fix = "leave preview_size out: a TaesdPreview you pass has its own preview_size"
        raise InputError("{@preview_size} bounds a TAESD decoder's previews, and none is given", where="preview_size",
                         fix=fix)
    _refiner(kwargs, tb)
    from . import hiresmodel

    tb.hires_checkpoint = hiresmodel.check_spec(kwargs.get("hires_checkpoint"))
    if tb.hires_checkpoint is not None:
        hiresmodel.check_toolbox(tb)
    return rest, tb


def _refiner(kwargs: dict[str, Any], tb: Toolbox) -> None:
    from . import refiner

    spec, switch, passes = kwargs.get("refiner"), kwargs.get("refiner_switch_at"), kwargs.get("hires_refiner_pass")
    by_steps = kwargs.get("refiner_switch_by_steps")
    if spec is None or (isinstance(spec, str) and spec == ""):
        unset = by_steps is None or (isinstance(by_steps, (bool, np.bool_)) and not by_steps)
        for name, value in (("refiner_switch_at", switch), ("hires_refiner_pass", passes),
                            ("refiner_switch_by_steps", None if unset else by_steps)):
            if value is not None:
                raise InputError(f"{{@{name}}} without {{@refiner}}", where=name,
                                 fix=f"pass {{@refiner}} (the refiner model) too, or leave {{@{name}}} out")
        return
    tb.refiner = refiner.check_spec(spec)
    tb.refiner_switch_at = refiner.check_switch_at(refiner.DEFAULT_SWITCH_AT if switch is None else switch)
    if by_steps is not None:
        if not isinstance(by_steps, (bool, np.bool_)):
            raise InputError(f"{{@refiner_switch_by_steps}} must be True or False, got {by_steps!r:.40}",
                             where="refiner_switch_by_steps",
                             fix="pass True (switch by the sampler's steps) or False (by timestep, A1111's default)")
        tb.refiner_switch_by_steps = bool(by_steps)
    if passes is not None:
        if tb.hires is None:
            raise InputError("{@hires_refiner_pass} needs {@hires_scale}", where="hires_refiner_pass",
                             fix="pass {@hires_scale} too, or leave {@hires_refiner_pass} out")
        tb.hires_refiner_pass = refiner.check_hires_pass(passes)


class A1111Noise:
    """A1111's per-image noise behind the ``randn(shape)`` a loop calls (see the module doc)."""

    def __init__(self, shape: tuple[int, ...], seeds: list[int], tb: Toolbox, subseed: int | None = None) -> None:
        from ..samplers import TorchGenerator
        from ..samplers.seeds import ImageNoise

        subseeds = None
        if tb.subseed_strength:
            base = tb.subseed if subseed is None else subseed
            assert base is not None
            subseeds = [base + i for i in range(len(seeds))]
        self.shape = tuple(shape)
        self.noise = ImageNoise(shape[1:], seeds, subseeds=subseeds, subseed_strength=tb.subseed_strength,
                                rng=tb.rng)
        self.vae_generator = TorchGenerator(seeds[0])

    def randn(self, shape: Any) -> np.ndarray:
        shape = tuple(int(d) for d in shape)
        if shape != self.shape:
            raise AssertionError(f"noise of shape {shape} asked of A1111's per-image source of {self.shape}")
        return self.noise.next()


def noise_source(tb: Toolbox, shape: tuple[int, ...], seed: int, subseed: int | None = None) -> Any:
    """The generator of one run (``batch`` images from ``seed``; variation seeds from ``subseed``, default
    ``tb.subseed``): diffusers' stream, or A1111's per image."""
    from ..samplers import TorchGenerator

    if not tb.per_image:
        return TorchGenerator(seed)
    step = 0 if tb.subseed_strength else 1
    return A1111Noise(shape, [seed + i * step for i in range(shape[0])], tb, subseed)


def image_seeds(tb: Toolbox, seed: int, batch: int) -> list[int]:
    """The seed written for each image of a run (A1111: ``seed + i``; diffusers' stream: ``seed`` for all)."""
    if tb.per_image and not tb.subseed_strength:
        return [seed + i for i in range(batch)]
    return [seed] * batch


def seed_fields(tb: Toolbox, position: int) -> dict[str, object]:
    """A1111's ``Variation seed``, ``Variation seed strength`` and ``RNG`` fields for one image."""
    from ..samplers.seeds import rng_infotext

    fields: dict[str, object] = {}
    if tb.subseed_strength:
        assert tb.subseed is not None
        fields["Variation seed"] = tb.subseed + position
        fields["Variation seed strength"] = _num(tb.subseed_strength)
    fields.update(rng_infotext(tb.rng))
    return fields


def _num(v: float) -> object:
    return int(v) if float(v).is_integer() else round(float(v), 4)
