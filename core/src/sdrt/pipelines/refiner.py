"""A refiner after the base model, as A1111 runs it (``refiner=``, ``refiner_switch_at=``).

One sampler run over the base model's schedule: every model call at a timestep ``t`` with
``(N - 1 - t) / N >= switch_at`` (``N`` the training timesteps, 1000) goes to the refiner, and every call after
it too. This is A1111's rule (``sd_samplers_common.apply_refiner``: the timestep of the sigma nearest the
current one, ``completed_ratio = (999 - t) / 1000``; the refiner's weights are swapped in mid-run, the sampler
and its state go on). At 0.8 the base runs the timesteps from 999 down to 200 and the refiner those under 200,
which is where diffusers' ensemble of experts cuts the same schedule (``StableDiffusionXLPipeline(
denoising_end=0.8)``, then ``StableDiffusionXLImg2ImgPipeline(denoising_start=0.8)`` on its latents:
``int(round(1000 - 0.8 * 1000))`` = 200); for a sampler without memory across steps (Euler, Euler a on one
noise stream, DDIM) the two give the same image. A multistep sampler (DPM++ 2M) keeps its history across the
switch, as in A1111; diffusers restarts its scheduler there.

The refiner has its own text encoders, tokenizers and time ids (the SDXL refiner: CLIP-G alone, the aesthetic
scores), encodes the same prompts, and its VAE decodes the result unless the base runs a chosen VAE file (A1111 decodes with the model loaded last,
diffusers with the refiner pipeline's VAE). It must continue the base's latents: the SDXL refiner after an SDXL
model, or a model of the base's own family; with the base's prediction type (eps or v).

``refiner_switch_by_steps=True`` is A1111's ``refiner_switch_by_sample_steps`` option: the switch counts the
sampler's denoiser calls instead (``apply_refiner``: ``completed_ratio = step / total_steps``, ``step`` the calls made
so far in this pass, ``total_steps`` the steps the pass runs, doubled for A1111's second-order samplers), so the call
``k`` with ``k / total >= switch_at`` and every later one go to the refiner; the infotext says ``Refiner switch by
sampling steps: True``, as A1111 writes it whenever the option is on.

With the hires fix the switch is the same timestep rule in each pass (each runs its own schedule), and
``hires_refiner_pass`` (A1111's ``hires_fix_refiner_pass``) says which passes it may take over in; once it has,
it stays, its VAE decodes and encodes between the passes and decodes the result (:class:`Run`). The infotext
names it only when it took over (A1111's ``apply_refiner`` writes its fields at the swap).
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from .pipeline import Pipeline
    from .settings import Settings

#: A1111's default ("Switch at" in the UI, refiner_switch_at in the API)
DEFAULT_SWITCH_AT = 0.8
#: A1111's ``hires_fix_refiner_pass`` (its infotext's ``Hires refiner``): the passes of the hires fix the refiner may
#: take over in (:class:`Run`); A1111's default is the second pass
HIRES_PASSES = ("first pass", "second pass", "both passes")
DEFAULT_HIRES_PASS = "second pass"
#: the samplers A1111 counts two denoiser calls a step for (``"second_order"`` in its sampler tables: Heun, DPM2,
#: DPM2 a, DPM++ 2S a, DPM++ SDE; its Restart, which sdrt does not run, too): ``SamplerData.total_steps``
SECOND_ORDER = frozenset({"heun", "dpm_2", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde"})


def calls_per_step(sampler: str) -> int:
    """What A1111's ``total_steps`` counts a step as, for ``sampler`` (sdrt's name, ``SamplerChoice.sampler``)."""
    return 2 if sampler in SECOND_ORDER else 1


def check_hires_pass(value: Any) -> str:
    """``hires_refiner_pass``: one of :data:`HIRES_PASSES` (any case)."""
    if isinstance(value, str) and value.strip().lower() in HIRES_PASSES:
        return value.strip().lower()
    raise InputError(f"unknown {{@hires_refiner_pass}} {value!r}", where="hires_refiner_pass",
                     fix="use one of " + ", ".join(repr(v) for v in HIRES_PASSES) + " (A1111's default: 'second pass')")


def check_switch_at(value: Any) -> float:
    """``refiner_switch_at``: a fraction of the schedule above 0, at most 1 (A1111's slider's end: the refiner
    never takes over, since ``(999 - t) / 1000`` is at most 0.999)."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or not 0 < float(value) <= 1:
        raise InputError(f"{{@refiner_switch_at}} must be above 0 and at most 1, got {value!r}",
                         where="refiner_switch_at",
                         fix="pass e.g. {@refiner_switch_at=}0.8: the base runs the first 80% of the schedule")
    return float(value)


def _is_pipeline(spec: Any) -> bool:
    return hasattr(spec, "family") and hasattr(spec, "folder") and callable(getattr(spec, "generate", None))


def check_spec(spec: Any) -> Any:
    """``refiner``: a model path (a folder or a single file) or a loaded :class:`Pipeline`."""
    if _is_pipeline(spec):
        return spec
    if isinstance(spec, (str, os.PathLike)) and os.fspath(spec):
        if not os.path.exists(os.fspath(spec)):
            raise InputError(f"the refiner model {os.fspath(spec)!r} does not exist", where="refiner",
                             fix="pass the refiner's .safetensors file or model folder (e.g. "
                                 "sd_xl_refiner_1.0.safetensors), or a pipeline from sdrt.pipelines.load")
        return spec
    raise InputError(f"refiner must be a model path or a pipeline, got {type(spec).__name__} {spec!r:.40}",
                     where="refiner", fix="pass {@refiner=}'sd_xl_refiner_1.0.safetensors' or a loaded pipeline")


def resolve(pipe: Pipeline, s: Settings, load: Callable[..., Pipeline]) -> Pipeline:
    """The refiner pipeline of this job (a path is loaded once per base pipeline with ``load``, which is
    ``sdrt.pipelines.load``, on the base's backend and device), checked against the base."""
    spec = s.toolbox.refiner
    if _is_pipeline(spec):
        ref = spec
    else:
        key = os.path.realpath(os.fspath(spec))
        opened = getattr(pipe.folder, "single_file", None)
        source = getattr(opened, "path", None) or pipe.folder.path
        if key == os.path.realpath(source):  # not loaded a second time to run the same weights
            raise InputError("the refiner is the base model itself", where="refiner",
                             fix="pass another model as {@refiner}, or leave it out")
        cache = pipe._refiners
        if key not in cache:
            for old in cache.values():  # one refiner held at a time, as A1111 holds one
                old.close()
            cache.clear()
            cache[key] = load(spec, backend=pipe.backend, device=pipe.device, low_memory=None, **pipe.options)
        ref = cache[key]
        if not pipe._dry and pipe.low_memory is not None:  # one it loaded follows the base's low-memory mode
            ref.low_memory = pipe.low_memory
        ref.memory = pipe.memory  # and its memory budget (the plan's refiner section and the run both read it)
    if ref is pipe:
        raise InputError("the refiner is the base model itself", where="refiner",
                         fix="pass another model as {@refiner}, or leave it out")
    base, fam = pipe.family, ref.family
    if base.name == "sdxl-refiner":
        raise InputError(f"this model is an {base.label}: it is the refiner, not a base", where="refiner",
                         fix="load the base model (SDXL) and pass this one as its {@refiner}")
    same = fam.name == base.name or (fam.name == "sdxl-refiner" and base.name == "sdxl")
    if not same or base.flow:
        raise InputError(f"the refiner is {_a(fam.label)} model and this model is {base.label}: the refiner continues "
                         "the base's latents, so it must be of the same kind", where="refiner",
                         fix="use an SDXL base with the SDXL refiner (or a refiner of the base's own family)"
                             if not base.flow else f"{base.label} models have no refiner: leave {{@refiner}} out")
    shape = tuple(ref.denoiser.inputs[fam.sample_input].shape)
    if len(shape) == 4 and isinstance(shape[1], int) and shape[1] != fam.latent_channels:
        what = "an InstructPix2Pix editing model" if ref.instruct_pix2pix else "an inpainting model"
        raise InputError(f"the refiner ({ref.folder.name}) is {what}: its {fam.sample_input} takes {shape[1]} channels, "
                         f"the latents and the {'picture' if ref.instruct_pix2pix else 'mask and masked picture'} "
                         "beside them, and a refiner pass gives it the base's latents alone", where="refiner",
                         fix="pass a model of the base's kind without extra input channels as {@refiner}, or leave "
                             "it out")
    kinds = [getattr(p.schedule, "kind", "") for p in (pipe, ref)]
    if kinds[0] != kinds[1] and "edm" in kinds:  # Playground v2.5 / CosXL: their latents and sigmas are not SDXL's
        edm, other = (pipe, ref) if kinds[0] == "edm" else (ref, pipe)
        raise InputError(f"{'this model' if edm is pipe else 'the refiner'} ({edm.folder.name}) is EDM-trained and "
                         f"{'the refiner' if edm is pipe else 'this model'} ({other.folder.name}) is not: their noise "
                         "schedules and latents differ, so one cannot continue the other's latents", where="refiner",
                         fix="leave {@refiner} out for this model, or use a refiner trained as the base was")
    if ref.family.prediction != pipe.family.prediction:  # a bound checkpoint's own (load_weights) included
        raise InputError(f"the refiner predicts {ref.family.prediction} and this model {pipe.family.prediction}",
                         where="refiner", fix="use a refiner trained with the base model's prediction type")
    if _is_pipeline(spec) and not pipe._dry:  # a loaded pipeline: no other thread runs it (or is told another
        from .holds import hold  # memory plan) until this job ends, as a loaded hires checkpoint

        hold(pipe, ref, "refiner")
    return ref


def apply_memory_plan(pipe: Pipeline, ref: Pipeline, calls: Any) -> None:
    """The refiner told the plan of its part of the run, as the run plan's refiner section shows it
    (``RunPlan.refiner_memory``): its parts released once used, or streamed, where that plan places them, on the
    same base (the process and the base model's resident parts, which stay loaded beside it)."""
    from .budget import apply_section
    from .plan import REFINER_PREFIX

    first = getattr(pipe, "_memory_plan", None)
    if first is not None:
        apply_section(ref, calls, REFINER_PREFIX, lambda: pipe._hires_base(first, False))


def _a(label: str) -> str:
    return ("an " if label[:1] in "AEIOS" else "a ") + label


def dry_twin(ref: Pipeline) -> Pipeline:
    """A copy of the refiner on recording parts (the run plan runs nothing real)."""
    dry = copy.copy(ref)
    dry._parts = {name: part.dry() for name, part in ref._parts.items()}
    dry._prompts = None
    dry._weight_state = None
    dry.low_memory = False
    dry._dry = True
    dry._lock, dry._state, dry._stop, dry._owner = threading.Lock(), threading.RLock(), threading.Event(), None
    return dry


class Switch:
    """The guided model a loop calls: the base's until the switch, the refiner's from then on. ``refiner`` is the
    refiner's guided model, or a function that makes it (its prompts are encoded only when it takes over, as A1111
    encodes them at the switch)."""

    def __init__(self, base: Any, refiner: Any, model_sampling: Any, switch_at: float,
                 on_switch: Callable[[], None] | None = None, by_calls: int | None = None) -> None:
        self.base = base
        self._make = refiner if callable(refiner) and not hasattr(refiner, "predict") else None
        self.refiner = None if self._make is not None else refiner
        self.model_sampling = model_sampling
        self.switch_at = switch_at
        self.switched = False
        self.on_switch = on_switch
        self.train_steps = int(getattr(model_sampling, "num_timesteps", 0) or 1000)
        #: A1111's refiner_switch_by_sample_steps: the calls the pass counts on (None: by timestep), and those made
        self.by_calls, self.made = by_calls, 0

    @property
    def calls(self) -> int:
        return int(getattr(self.base, "calls", 0)) + int(getattr(self.refiner, "calls", 0))

    def _pick(self, timestep: float) -> Any:
        if not self.switched:
            if self.by_calls is not None:  # the calls made before this one, of the pass's total
                self.switched = self.made / self.by_calls >= self.switch_at
                self.made += 1
            else:
                t = int(round(float(timestep)))
                self.switched = (self.train_steps - 1 - t) / self.train_steps >= self.switch_at
            if self.switched:
                if self.refiner is None:
                    assert self._make is not None
                    self.refiner = self._make()
                if self.on_switch is not None:
                    self.on_switch()  # the base's UNet runs no more in this run: the memory plan may drop it
        return self.refiner if self.switched else self.base

    def predict(self, x_in: np.ndarray, timestep: float, **kwargs: Any) -> np.ndarray:
        return self._pick(timestep).predict(x_in, timestep, **kwargs)

    def __call__(self, x: np.ndarray, sigma: Any, **kwargs: Any) -> np.ndarray:
        s = float(np.asarray(sigma).reshape(-1)[0])
        table = getattr(self.model_sampling, "sigmas", None)
        # A1111: the index of the discrete sigma nearest this one (argmin |sigmas - sigma|)
        t = float(np.abs(np.asarray(table) - s).argmin()) if table is not None else self.model_sampling.timestep(s)
        return self._pick(t)(x, sigma, **kwargs)

    def __getattr__(self, name: str) -> Any:  # anything else a loop reads (quantize ...): the base's
        return getattr(self.base, name)


class Run:
    """The refiner across one run's passes, as A1111's ``apply_refiner`` with the hires fix.

    Without the hires fix the refiner takes over in the one pass. With it, ``hires_refiner_pass`` (A1111's
    ``hires_fix_refiner_pass``) says where it may: ``"second pass"`` (A1111's default): the first pass is the
    base's alone, and the refiner takes over in the hires pass at the first call whose timestep passes the switch
    (the pass runs the tail of its own schedule, so at a denoise under ``1 - switch_at`` that is its first call);
    ``"first pass"``: it may take over in the first pass only; ``"both passes"``: in either. Once it has taken
    over it stays (A1111 keeps the refiner loaded): the whole hires pass runs on it, and its VAE decodes the
    first pass for an image upscaler and encodes the upscaled image again, and decodes the result."""

    def __init__(self, pipe: Pipeline, s: Settings) -> None:
        ref = pipe._refiner_job  # resolved by the job's preparation
        assert ref is not None
        if pipe._dry:  # one recording twin per job: the run plan lists its calls (plan.dry_run)
            twin = pipe.__dict__.get("_refiner_dry")
            if twin is None or twin.folder is not ref.folder:
                twin = pipe._refiner_dry = dry_twin(ref)
            ref = twin
        self.pipe, self.ref, self.s = pipe, ref, s
        self.switch_at = float(s.toolbox.refiner_switch_at)
        self.passes = s.toolbox.hires_refiner_pass if s.toolbox.hires is not None else None
        #: A1111's refiner_switch_by_sample_steps: denoiser calls a step count for (None: switch by timestep)
        self.per_step = calls_per_step(s.choice.sampler) if s.toolbox.refiner_switch_by_steps else None
        #: the refiner has taken over (in A1111's terms: it is the model loaded now)
        self.active = False
        self._cond: tuple[Any, Any] | None = None
        self._hires_cond: tuple[Any, Any] | None = None

    def model(self, width: int, height: int, second: bool = False) -> Any:
        """The refiner's guided model at this size (its time ids hold the size), its prompts encoded once; in the
        hires pass (``second``) the hires fix's own prompts when it has them (A1111's hr_c / hr_uc, which its
        refiner encodes in the hires pass)."""
        from .families import ModelCall

        ref, s = self.ref, self.s
        if self._cond is None:
            self._cond = ref._conditioning(s)
            self._hires_cond = ref._hires_conditioning(s)
            ref._release(*ref.family.text_parts, stage=True)
        cond, uncond = self._hires_cond if second and self._hires_cond is not None else self._cond
        call = ModelCall(width, height, s.batch, float(s.cfg or 1.0), cond, uncond,
                         guidance_rescale=s.guidance_rescale)
        return ref.family.denoiser(ref.denoiser, ref.family.model_sampling(width, height), call)

    def _took_over(self) -> None:
        self.active = True
        self.pipe._refiner_took = True  # the infotext names the refiner only when it ran (A1111's apply_refiner)
        self.pipe._release(self.pipe.denoiser.name)  # the base's UNet runs no more in this run

    def _switch(self, model: Any, ms: Any, width: int, height: int, steps: int, second: bool = False) -> Switch:
        per = self.per_step
        if second and per is not None:  # the hires pass's own sampler (hires_sampler) may call it more or less often
            per = calls_per_step(self.s.toolbox.hires.choice((self.s.sampler, self.s.choice)).sampler)
        by_calls = steps * per if per is not None else None
        return Switch(model, lambda: self.model(width, height, second), ms, self.switch_at,
                      on_switch=self._took_over, by_calls=by_calls)

    def first_pass(self, model: Any, ms: Any, steps: int) -> Any:
        """The model the first (or only) pass calls; ``steps``: the steps it runs."""
        if self.passes == "second pass":
            return model
        assert self.s.width is not None and self.s.height is not None
        return self._switch(model, ms, self.s.width, self.s.height, steps)

    def second_pass(self, model: Any, ms: Any, width: int, height: int, steps: int) -> Any:
        """The model the hires pass calls (``model``: the base's at the target size; ``steps``: the steps it runs)."""
        if self.active:
            return self.model(width, height, second=True)
        if self.passes == "first pass":
            return model
        return self._switch(model, ms, width, height, steps, second=True)

    @property
    def vae(self) -> Pipeline:
        """The pipeline whose VAE decodes and encodes now: the model loaded last, as in A1111, with the VAE file
        chosen for the run (A1111's sd_vae applies to the refiner it loads too, so a base's vae= / set_vae file
        decodes unless the refiner has its own)."""
        pipe, ref = self.pipe, self.ref
        if self.active and (pipe.vae_file is None or ref.vae_file is not None):
            return ref
        return pipe


def attach(pipe: Pipeline, s: Settings, model: Any, ms: Any, steps: int) -> tuple[Any, Run]:
    """``(the model the first pass calls, the refiner's run)`` for one run of ``pipe`` whose first pass runs
    ``steps`` steps."""
    run = Run(pipe, s)
    return run.first_pass(model, ms, steps), run


def infotext(pipe: Pipeline, s: Settings) -> dict[str, object]:
    """A1111's ``Refiner: name [hash]`` and ``Refiner switch at`` (and ``Hires refiner`` when not the default),
    written only when the refiner took over: a switch past the last step's timestep (1.0, or a late switch with
    few steps) leaves them out, as A1111's ``apply_refiner`` sets them only when it swaps the refiner in."""
    ref = pipe._refiner_job
    # A1111 writes this one at every denoiser call while its option is on, whether the refiner swaps in or not
    fields: dict[str, object] = {"Refiner switch by sampling steps": True} \
        if ref is not None and s.toolbox.refiner_switch_by_steps else {}
    if ref is None or not getattr(pipe, "_refiner_took", False):
        return fields
    switch = s.toolbox.refiner_switch_at
    if s.toolbox.hires is not None and s.toolbox.hires_refiner_pass != DEFAULT_HIRES_PASS:
        fields["Hires refiner"] = s.toolbox.hires_refiner_pass  # A1111 sets it first, then the refiner's two
    fields["Refiner"] = f"{ref.folder.name} [{ref.model_hash}]"
    fields["Refiner switch at"] = int(switch) if float(switch).is_integer() else round(float(switch), 4)
    return fields
