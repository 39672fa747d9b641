"""The hires fix's own checkpoint (``hires_checkpoint``): A1111's ``hr_checkpoint_name``, the UI's "Hires checkpoint".

A1111's ``StableDiffusionProcessingTxt2Img.sample`` runs the first pass on the loaded model, decodes it with that
model's VAE when the upscaler is an image one, then reloads ``hr_checkpoint_info`` and runs the whole second pass
on it: the upscaled picture encoded by its VAE, the hires prompts (the first pass's when unset) encoded by its text
encoders (its own prompt cache: ``get_conds_with_caching`` keys on the checkpoint), its UNet and schedule, and its
VAE decoding the result; then it loads the first model again. Its infotext names it ``Hires checkpoint: name
[hash]`` (the checkpoint's ``short_title``), right after ``Denoising strength``.

Here the second checkpoint is a model path (a folder or a single file, loaded once per first pipeline on its
backend and device, one held at a time) or a loaded :class:`Pipeline`. The steps, seeds and noise are the hires
fix's (:mod:`.hires`): only the model changes. What it must be:

- with a latent upscaler the second pass continues the first pass's latents, so both models share a latent space
  (SD 1.x with SD 2.x: 4 channels, the same VAE scale; SDXL with SDXL and its refiner; Flux with Flux). A1111 does
  not check; an SDXL UNet on SD 1.5 latents makes noise, a Flux transformer cannot take them at all;
- with an image upscaler the picture is encoded again by the second model's VAE, so any UNet family follows any
  other (SD 1.5 then SDXL, as A1111 runs it); the flow families (SD 3, Flux, Chroma) follow their own family only
  (their guidance, shift and sizes are their own);
- no inpainting or InstructPix2Pix model (its UNet takes more channels than the latents), and one that takes the
  second pass's size.

Memory: when the two models do not both fit (either runs in low-memory mode, or their files together take more
than the memory budget allows: ``memory=``, else half the device's memory, :func:`sdrt.pipelines.lowmem.auto_low_memory`),
the first model's parts are released before the second's load, as A1111 unloads one checkpoint to load the other;
the second's go once its VAE has decoded (or the pass stopped), as A1111 loads the first back; each loads again at its
next pass.

Not with a refiner, nor with ControlNet units (reference units too) or IP-Adapters acting in the second pass (they are bound to the first
model's UNet): each is refused in one line.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from .holds import hold, release  # noqa: F401  (the hires checkpoint's hold; release re-exported)

if TYPE_CHECKING:  # pragma: no cover
    from .pipeline import Pipeline
    from .settings import Settings

#: A1111's UI value for "no hires checkpoint" (its API sends the same string)
SAME = "Use same checkpoint"
#: the latent space of each family: models of one space continue each other's latents
LATENT_SPACES = {"sd1": "SD 1.x/2.x", "sd2": "SD 1.x/2.x", "sdxl": "SDXL", "sdxl-refiner": "SDXL", "flux": "Flux",
                 "chroma": "Flux", "sd3": "SD 3"}


def _is_pipeline(spec: Any) -> bool:
    return hasattr(spec, "family") and hasattr(spec, "folder") and callable(getattr(spec, "generate", None))


def check_spec(spec: Any) -> Any:
    """``hires_checkpoint``: a model path (a folder or a single file) or a loaded :class:`Pipeline`; None (or "",
    or A1111's "Use same checkpoint"): the first pass's model."""
    if spec is None or (isinstance(spec, str) and spec.strip() in ("", SAME)):
        return None
    if _is_pipeline(spec):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        if not os.path.exists(path):
            near = _models_beside(path)
            raise InputError(f"the hires checkpoint {path!r} does not exist", where="hires_checkpoint",
                             fix="pass the second pass's model: a .safetensors file or a model folder, or a "
                                 "pipeline from sdrt.pipelines.load" + (f"; {near}" if near else ""))
        return spec
    raise InputError(f"hires_checkpoint must be a model path or a pipeline, got {type(spec).__name__} {spec!r:.40}",
                     where="hires_checkpoint", fix="pass {@hires_checkpoint=}'other.safetensors' or a loaded pipeline")


def _models_beside(path: str, most: int = 12) -> str:
    """The checkpoints in the folder a missing path names (model files and folders with a model_index.json), as
    "FOLDER has: a.safetensors, b/"; "" when that folder is not there or holds none."""
    folder = Path(path).parent
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return ""
    found = [e.name + ("/" if e.is_dir() else "") for e in entries
             if (e.is_file() and e.suffix.lower() in (".safetensors", ".ckpt", ".gguf"))
             or (e.is_dir() and (e / "model_index.json").is_file())]
    if not found:
        return ""
    more = f" and {len(found) - most} more" if len(found) > most else ""
    return f"{folder} has: {', '.join(found[:most])}{more}"


def check_toolbox(tb: Any) -> None:
    """What runs beside a hires checkpoint: a hires fix, and nothing bound to the first model in the second pass."""
    if tb.hires is None:
        raise InputError("{@hires_checkpoint} needs {@hires_scale}", where="hires_checkpoint",
                         fix="pass {@hires_scale=}2 (for example) too, or leave {@hires_checkpoint} out")
    if tb.refiner is not None:
        raise InputError("{@hires_checkpoint} and {@refiner} both change the model mid-run, and sdrt runs one of them",
                         where="hires_checkpoint", fix="leave {@refiner} or {@hires_checkpoint} out")
    for k, unit in enumerate(tb.units or tb.controlnets):  # the reference units too (sdrt.pipelines.refattn)
        if any(unit is r for r in tb.revisions):  # it acts in both passes, whatever its hr_option (the extension's)
            raise InputError(f"controlnets[{k}] ({unit.preprocessor}) replaces the first model's pooled text in both "
                             "passes of the hires fix, and the hires checkpoint replaces that model in the second",
                             where="hires_checkpoint", fix=f"leave controlnets[{k}] or {{@hires_checkpoint}} out")
        if unit.hr_option != "Low res only":
            what = ("it guides the first model's UNet" if any(unit is r for r in tb.references) else
                    "its residuals are the first model's UNet's")
            raise InputError(f"controlnets[{k}] acts in the hires pass (hr_option {unit.hr_option!r}), and {what}, "
                             "which the hires checkpoint replaces there",
                             where="hires_checkpoint",
                             fix=f"set controlnets[{k}] hr_option 'Low res only', or leave {{@hires_checkpoint}} out")
    if tb.ip_adapter:
        raise InputError("an IP-Adapter acts on the first model's UNet, and the hires checkpoint replaces it in the "
                         "second pass", where="hires_checkpoint",
                         fix="leave {@ip_adapter} or {@hires_checkpoint} out")


def _source(pipe: Pipeline) -> str:
    """The file or folder ``pipe`` runs: its bound checkpoint's, else its single file's, else its folder's."""
    state = pipe._weight_state
    ckpt = getattr(state, "checkpoint", None) if state is not None else None
    if ckpt is not None and getattr(ckpt, "path", None) is not None:
        return os.path.realpath(ckpt.path)
    opened = getattr(pipe.folder, "single_file", None)
    return os.path.realpath(getattr(opened, "path", None) or pipe.folder.path)


def resolve(pipe: Pipeline, s: Settings, load: Any, raw: tuple[Any, Any] = ("", "")) -> Pipeline | None:
    """The second pass's pipeline of this job (a path loaded once per first pipeline with ``load``, which is
    ``sdrt.pipelines.load``, on its backend and device), checked against the first; ``pipe`` itself when it names
    the first pass's model (A1111 then reloads nothing). ``raw``: the prompts as given, whose ``<lora:...>`` tags
    apply to the second model too (A1111 activates the hires prompt's extra networks on it)."""
    spec = s.toolbox.hires_checkpoint
    if spec is None:
        return None
    if _is_pipeline(spec):
        other = spec
    else:
        key = os.path.realpath(os.fspath(spec))
        if key == _source(pipe):
            return pipe
        cache: dict[str, Any] = pipe.__dict__.setdefault("_hires_models", {})
        if key not in cache:
            for old in cache.values():  # one second checkpoint held at a time, as A1111 holds one model
                old.close()
            cache.clear()
            cache[key] = _load(load, spec, pipe)
        other = cache[key]
        if not pipe._dry and pipe.low_memory is not None:  # one it loaded follows the first's low-memory mode
            other.low_memory = pipe.low_memory
        other.memory = pipe.memory  # and its memory budget (the plan's hires section and the run both read it)
    if other is pipe:
        return pipe
    check(pipe, other, s)
    if pipe._dry:  # the run plan: a recording twin, nothing compiled (its parts are the plan's hires.*)
        from .refiner import dry_twin

        twin = pipe.__dict__.get("_hires_dry")
        if twin is None or twin.folder is not other.folder:
            twin = pipe._hires_dry = dry_twin(other)
        twin._hires_real = other  # the memory plan asks whether both models fit (tight)
        twin.memory = other.memory  # its budget now (the twin is kept from an earlier plan)
        return twin
    hold(pipe, other)  # no other thread runs it (or rebinds its LoRAs) until this job ends
    from ..text.loras import has_lora_tag

    _share_embeddings(pipe, other)
    if other._weight_state is not None or has_lora_tag(*raw):  # its LoRAs are the prompt's, as the first model's
        if pipe._weight_state is not None and other.weights.lora_dir is None:  # found where the first model's are
            other.weights.lora_dir = pipe.weights.lora_dir
        other.weights.prepare(*raw)
    return other


def apply_memory_plan(pipe: Pipeline, other: Pipeline, calls: Any) -> None:
    """``other`` (the hires checkpoint) told the plan of its pass, as the run plan's hires section shows it
    (``RunPlan.hires_memory``): its parts released once used, or streamed, where that plan places them. ``calls``:
    the job's input shapes per part (its parts are the ``hires.*``); planned on the base ``Pipeline._hires_memory``
    gives it (the process, with the first model's resident parts unless both do not fit)."""
    from .budget import apply_section
    from .plan import HIRES_PREFIX

    first = getattr(pipe, "_memory_plan", None)
    if first is not None:
        apply_section(other, calls, HIRES_PREFIX, lambda: pipe._hires_base(first, tight(pipe, other)))


def _share_embeddings(pipe: Pipeline, other: Pipeline) -> None:
    """The first model's textual-inversion embeddings on the second (A1111 loads its embeddings folder for whichever
    model is loaded, so a trigger word in the hires prompt works on the hires checkpoint too); one of another
    model's widths is skipped, as A1111 skips it (the word is then plain text there, as in A1111)."""
    from ..errors import SdrtError

    state = pipe._weight_state
    if state is None or not state.embeddings:
        return
    have = {e.name.lower() for e in other._weight_state.embeddings} if other._weight_state is not None else set()
    for emb in state.embeddings:
        if emb.name.lower() not in have:
            try:
                other.weights.add_embeddings([emb])
            except SdrtError:  # made for another model's text encoders
                pass


def _load(load: Any, spec: Any, pipe: Pipeline) -> Pipeline:
    """``load(spec)`` on the first model's backend and device; a file that is no model (a LoRA, a VAE, an embedding)
    or cannot be read is one line naming ``hires_checkpoint`` (the loader's own advice is for a first model)."""
    from ..errors import FileChanged, ModelError, WeightsError

    try:
        return load(spec, backend=pipe.backend, device=pipe.device, low_memory=None, **pipe.options)
    except FileChanged:
        raise
    except (ModelError, WeightsError) as exc:
        fix = "pass a whole model as {@hires_checkpoint}: a checkpoint file (.safetensors) or a model folder"
        what = exc.what.split(" (not a checkpoint: ")[0]  # how to pass a LoRA / an embedding to a first model
        raise type(exc)(f"the hires checkpoint {os.fspath(spec)!r}: {what}", where="hires_checkpoint",
                        fix=exc.fix if isinstance(exc, WeightsError) else fix) from None


def check(pipe: Pipeline, other: Pipeline, s: Settings) -> None:
    """The second model continues what the first made: one line naming ``hires_checkpoint`` where it cannot."""
    base, fam = pipe.family, other.family
    hr = s.toolbox.hires
    name = other.folder.name
    where = "hires_checkpoint"
    shape = tuple(other.denoiser.inputs[fam.sample_input].shape)
    if not fam.flow and len(shape) == 4 and isinstance(shape[1], int) and shape[1] != fam.latent_channels:
        what = "an InstructPix2Pix editing model" if other.instruct_pix2pix else "an inpainting model"
        raise InputError(f"the hires checkpoint ({name}) is {what}: its {fam.sample_input} takes {shape[1]} channels, "
                         "and the second pass gives it the latents alone", where=where,
                         fix="pass an ordinary model of this kind as {@hires_checkpoint}")
    space, other_space = latent_space(pipe), latent_space(other)
    if base.flow or fam.flow:
        if base.name != fam.name:
            raise InputError(f"the hires checkpoint ({name}) is {fam.label} and this model {base.label}: "
                             + ("a flow model's second pass follows a model of its own family only"
                                if hr.latent is False else
                                f"their latents differ ({other_space[0]} and {space[0]})"), where=where,
                             fix=f"pass {_a(base.label)} model as {{@hires_checkpoint}}, or leave it out")
    elif hr.latent and space != other_space:
        raise InputError(f"the hires checkpoint ({name}) is {fam.label} and this model {base.label}: the "
                         f"{hr.upscaler} upscaler hands the first pass's latents to the second pass, and "
                         f"{_latents(other_space)} are not {_latents(space)}", where=where,
                         fix=f"pass a model with {space[0]} latents, or an image upscaler ({{@hires_upscaler=}}"
                             "Lanczos, or a model upscaler): the second model's VAE then encodes the picture")
    assert s.width is not None and s.height is not None
    tw, th = hr.target(s.width, s.height)
    wrong = fam.size_error(shape, tw, th)
    if wrong is None and fam.flow:
        from .flowparts import flow_size_error

        bad = flow_size_error(tw, th, fam.label, "hires_scale")
        if bad is not None:
            raise InputError(f"the hires checkpoint ({name}): {bad.what}", where=where, fix=bad.fix)
    if wrong is not None:
        raise InputError(f"the hires checkpoint ({name}) makes {wrong[0]}x{wrong[1]} images only (its "
                         f"{other.denoiser.name} is exported for that size), and the second pass is {tw}x{th}",
                         where=where, fix="pass a model exported with dynamic height and width")


def latent_space(pipe: Pipeline) -> tuple[Any, ...]:
    """What a model's latents are: its family's space (:data:`LATENT_SPACES`), channels, VAE factor, packing, and the
    VAE config's per-channel statistics (Playground v2.5's) when it has them."""
    fam = pipe.family
    stats = fam.latent_stats
    return (LATENT_SPACES.get(fam.name, fam.label), fam.latent_channels, fam.vae_factor, fam.packed,
            None if stats is None else tuple(np.concatenate([stats[0].ravel(), stats[1].ravel()]).round(6)))


def _a(label: str) -> str:
    return ("an " if label[:1] in "AEIOS" else "a ") + label


def _latents(space: tuple[Any, ...]) -> str:
    return f"{space[0]} latents" + (" normalized per channel (latents_mean / latents_std)" if space[4] else "")


def title(other: Pipeline) -> str:
    """A1111's ``short_title`` of the checkpoint: ``name [hash]`` (the file's stem, its short SHA-256)."""
    info: dict[str, object] = {"Model": other.folder.name, "Model hash": other.model_hash}
    state = other._weight_state
    if state is not None and getattr(state, "checkpoint", None) is not None:
        info.update({k: v for k, v in state.infotext().items() if k in ("Model", "Model hash")})
    return f"{info['Model']} [{info['Model hash']}]"


def tight(pipe: Pipeline, other: Pipeline) -> bool:
    """Whether the first model's parts go before the second's load (see the module doc)."""
    if pipe._dry:
        return False
    if pipe.is_low_memory or other.is_low_memory:
        return True
    size = _model_size(pipe) + _model_size(other)
    from .lowmem import FOOTPRINT, auto_low_memory

    if pipe.memory is not None:
        return size * FOOTPRINT > pipe.memory
    from ..runtime import select

    try:
        _, dev = select(pipe.backend, pipe.device)
    except Exception:  # noqa: BLE001  (no device figure: keep both, as before)
        return False
    return auto_low_memory(dev.memory_bytes, size)


def _model_size(p: Pipeline) -> int:
    from .lowmem import model_bytes

    opened = p.folder.single_file
    if opened is not None:
        files = {Path(f) for f in opened.files.values()} | set(getattr(opened, "all_files", ()))
        return sum(f.stat().st_size for f in files if f.is_file())
    return model_bytes(part.path for part in p._parts.values())


def release_first(pipe: Pipeline) -> None:
    """The first model's parts closed, their weights dropped (they load again at the next run's first pass); the
    second model's likewise once its pass is over when both do not fit (A1111 loads the first model back then)."""
    from .lowmem import give_back
    from .lowmem import release as release_parts

    keep = pipe._weight_state._originals if pipe._weight_state is not None else {}
    release_parts(pipe._parts.values(), keep_graph=keep)
    give_back()


def second_pass(pipe: Pipeline, other: Pipeline, s: Settings, x: np.ndarray, seed: int, subseed: int | None,
                on_step: Any, offset: int) -> np.ndarray:
    """A1111's second pass on ``other``: the first pass's latents (``x``) upscaled, or decoded by the first model's
    VAE, resized and encoded by the second's; the hires prompts encoded by its text encoders; its loop at the target
    size over the hires fix's steps, from a fresh noise stream of each image's seed. Returns the latents, which the
    second model's VAE decodes (``pipe._hires_decoder``)."""
    from .hires import second_pass_steps, upscale_image

    hr = s.toolbox.hires
    assert s.width is not None and s.height is not None
    tw, th = hr.target(s.width, s.height)
    uw, uh = hr.upscaled(s.width, s.height)
    total_steps, run = second_pass_steps(hr, s.steps)
    s2 = dataclasses.replace(s, width=tw, height=th, steps=total_steps, choice=hr.choice((s.sampler, s.choice)))
    big = None
    if not hr.latent:  # decoded before the reload, by the first model's VAE (A1111's decoded_samples)
        images = pipe._decode(x)
        pipe._release("vae_decoder", stage=True)
        if hr.model is not None and pipe._dry:
            big = [upscale_image(im, uw, uh, "Lanczos") for im in images]
        elif hr.model is not None:
            up = pipe._model_upscaler(hr.model)
            big = [up.upscale_to(im, uw, uh) for im in images]
            if pipe._releases_extra("upscaler"):
                up.close()
        else:
            big = [upscale_image(im, uw, uh, hr.upscaler) for im in images]
    pipe._hires_tight = tight(pipe, other)
    if pipe._hires_tight:  # A1111 unloads the first checkpoint to load the second
        release_first(pipe)
    pipe._hires_decoder = other  # from here the second model's VAE decodes (an interrupted run's partial too)
    try:
        return _second_pass(pipe, other, s, s2, x, big, seed, subseed, on_step, offset, (uw, uh), total_steps - run)
    except BaseException:  # stopped or refused: the second model goes too, as A1111 loads the first one back
        if pipe._hires_tight:
            release_first(other)
        raise


def _second_pass(pipe: Pipeline, other: Pipeline, s: Settings, s2: Settings, x: np.ndarray, big: Any, seed: int,
                 subseed: int | None, on_step: Any, offset: int, upscaled: tuple[int, int], start: int) -> np.ndarray:
    """:func:`second_pass` once the second model takes over: ``s2`` the pass's settings, ``big`` the upscaled
    pictures (None: the latents are upscaled), ``start`` the step its loop starts at."""
    from .families import ModelCall
    from .hires import crop_latent, upscale_latent
    from .images import to_nchw

    hr = s.toolbox.hires
    assert s.width is not None and s2.width is not None and s2.height is not None
    tw, th, (uw, uh) = s2.width, s2.height, upscaled
    own = dataclasses.replace(s, prompt=s.prompt if hr.prompt is None else hr.prompt,
                              negative_prompt=s.negative_prompt if hr.negative_prompt is None else hr.negative_prompt)
    try:  # its own text encoders (A1111's hr_c / hr_uc, computed on the reloaded model)
        cond, uncond = other._conditioning(own)
    except InputError as exc:
        if exc.where not in ("prompt", "negative_prompt") or (hr.prompt is None and hr.negative_prompt is None):
            raise
        where = "hires_" + exc.where
        raise InputError(exc.what.replace("the negative prompt", "the hires negative prompt").replace(
            "the prompt", "the hires prompt"), where=where, fix=exc.fix) from None
    other._release(*other.family.text_parts, stage=True)
    shape = other.family.latent_shape(s.batch, th, tw)
    generator = pipe._noise(s2, shape, seed, subseed)
    ms = other.family.model_sampling(tw, th)
    loop = other._loop(s2, ms, generator, seed, start=start)
    if big is None:
        latents = upscale_latent(x, hr, uh, uw)
    else:
        latents = np.concatenate([other._encode_image(to_nchw(im), generator) for im in big], axis=0)
    latents = crop_latent(latents, *hr.crop(s.width, s.height))
    noise = generator.randn(shape)
    x2 = loop.start(noise, latents)
    call = ModelCall(tw, th, s.batch, s.cfg, cond, uncond, guidance=s.guidance, guidance_rescale=s.guidance_rescale)
    model = other.family.denoiser(other.denoiser, ms, call)
    total = loop.steps

    def step(i: int, lat: np.ndarray) -> None:
        pipe._step_done(loop, lat, None, i, total)
        on_step(offset + i, lat)

    out = loop.run(model, x2, callback=step)
    other._release(other.denoiser.name, "vae_encoder", stage=True)
    return out
