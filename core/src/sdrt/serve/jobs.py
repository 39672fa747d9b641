"""The job queue and its workers: one thread per device, each keeping its pipelines warm.

A job is one A1111/OpenAI request: ``n_iter`` runs of ``batch`` images. Workers take jobs in
arrival order from one shared queue, so several devices share the load. Each worker builds its
own pipeline per model (from a :class:`PipelineSpec`) the first time a job asks for it and keeps
the ``keep`` most recent ones; the VAE and text-encoder files a job chooses are swapped on the model's
pipeline; a pipeline is only ever used by the worker that built it.
Progress is kept per job; an interrupt ends the running job at its next step, a skip ends the
current run of a job and goes on with the next.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FileChanged, InputError, ModelError, SamplerError, SdrtError, WeightsError, caller_words
from . import mapcount
from .errors import ApiError
from .registry import ModelEntry
from .spec import PipelineSpec
from .stopping import generate_until_stopped

log = logging.getLogger("sdrt.serve.jobs")


@dataclass
class Work:
    """What to generate: the pipeline keywords of one run, and how many runs."""

    model: ModelEntry
    prompt: str
    negative: str
    kwargs: dict[str, Any]       # steps, cfg, sampler, schedule, width, height, batch, clip_skip, init_image, ...
    seed: int
    batch: int = 1
    n_iter: int = 1
    #: Forge's distilled_cfg_scale: the ``guidance`` of a guidance-distilled model (Flux dev); others take none
    distilled_cfg: float | None = None
    #: A1111's image_cfg_scale (img2img): an InstructPix2Pix model's image guidance; None (A1111's API default)
    #: runs it as A1111 does then, ordinary CFG with the image on both rows (image_cfg 1); others take none
    image_cfg: float | None = None
    #: this server's largest width and height, checked (with the hires. fix's scale) once the model's own size is
    #: known, for a request that leaves width or height to the model
    max_size: tuple[int, int] | None = None
    #: the request's field of a pipeline argument a refusal may name (``controlnets[0]`` ->
    #: ``alwayson_scripts.controlnet.args[2]``): the client reads its own field, never a server path
    fields: dict[str, str] = field(default_factory=dict)
    #: the request's picture whose size the run took, width and height not being sent (``init_images[0]``): a size
    #: the model refuses is said as that picture's, with what to send instead
    size_from: str | None = None
    #: A1111 infotext fields the pipeline does not write for this request (an option's, written whatever ran):
    #: added to each image's settings where the pipeline wrote none
    extra_infotext: dict[str, object] = field(default_factory=dict)
    #: the request's width / height brought down to a multiple of 8 (A1111's rule), as sent: a size the model
    #: refuses is said with them ("width: 100 ran as 96"), not as if 96 had been sent
    rounded: list[str] = field(default_factory=list)
    #: the clip skip is the server's ``CLIP_stop_at_last_layers`` option, not the request's: one deeper than the model's
    #: text encoder has runs at the deepest it has, named (the option is server-wide, and models change)
    clip_skip_option: bool = False
    #: A1111's fixed subseed at subseed_strength 0 (-1 drawn, as ``get_fixed_seed``): ``info`` lists
    #: ``subseed + j`` for image ``j`` as A1111's ``all_subseeds`` does; the run does not read it (no variation)
    subseed: int | None = None


@dataclass
class Result:
    images: list[np.ndarray]
    settings: list[dict[str, object]]
    seeds: list[int]
    prompt: str
    negative: str
    interrupted: bool = False
    skipped: int = 0
    worker: str = ""
    seconds: float = 0.0
    #: what the request asked that this model could not do, found once the model was loaded
    not_honoured: list[str] = field(default_factory=list)


@dataclass
class Job:
    work: Work
    id: str = field(default_factory=lambda: f"task({uuid.uuid4().hex[:15]})")
    future: Future = field(default_factory=Future)
    state: str = "queued"           # queued, running, done, failed, interrupted
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    iteration: int = 0
    step: int = 0
    total: int = 0
    #: the live preview (HxWx3 uint8) of the running step's denoised estimate: /progress's current_image
    preview: np.ndarray | None = None
    worker: str = ""
    interrupt: threading.Event = field(default_factory=threading.Event)
    skip: threading.Event = field(default_factory=threading.Event)
    #: a stopped run answers with its partial images (A1111's interrupt); not when nobody will read them
    wants_partial: bool = True

    @property
    def progress(self) -> float:
        if self.state in ("done", "failed", "interrupted"):
            return 1.0
        if self.total == 0:
            return 0.0
        return min((self.iteration + self.step / self.total) / max(self.work.n_iter, 1), 1.0)

    @property
    def eta(self) -> float:
        if self.started is None or self.progress <= 0:
            return 0.0
        elapsed = time.time() - self.started
        return max(elapsed / self.progress - elapsed, 0.0)


def hires_said(scale: float, resize: tuple[int, int]) -> tuple[str, str]:
    """``(how, field)``: the hires. fix's size as the request set it (``hr_scale 2`` or ``hr_resize 0x768``) and the
    request field a too large size is said of."""
    if not any(resize):
        return f"hr_scale {scale:g}", "hr_scale"
    return f"hr_resize {resize[0]}x{resize[1]}", "hr_resize_x" if resize[0] else "hr_resize_y"


def _check_own_size(w: Work, kwargs: dict[str, Any], side: int) -> None:
    """A size left to the model (its own, ``side`` pixels a side), and the hires. fix's sizes from it, within the
    server's limits (``Work.max_size``): a 400 about the field that made it too large. A hires. fix whose second
    pass is that size is dropped, as A1111 drops it (``_hires``)."""
    assert w.max_size is not None
    from ..pipelines.hires import Hires

    width, height = (kwargs.get(k) or side for k in ("width", "height"))
    limit = f"this server's limit of {w.max_size[0]}x{w.max_size[1]}"
    if width > w.max_size[0] or height > w.max_size[1]:
        raise ApiError(400, f"width and height were left to {w.model.name}, whose own size {width}x{height} is above "
                            f"{limit}; pass width and height", field="width")
    resize = (kwargs.get("hires_width") or 0, kwargs.get("hires_height") or 0)
    if not any(resize) and kwargs.get("hires_scale") is None:
        return
    scale = kwargs.get("hires_scale") or 1.0
    sizer = Hires(scale, 0, 0.7, "Latent", resize=resize)
    if sizer.off(width, height):  # A1111's "the user has chosen to do nothing": one pass
        for key in [k for k in kwargs if k.startswith("hires_")]:
            del kwargs[key]
        if kwargs.get("controlnets"):  # the extension runs every unit in its one pass without the fix
            kwargs["controlnets"] = [dataclasses.replace(u, hr_option="Both") for u in kwargs["controlnets"]]
        return
    tw, th = sizer.upscaled(width, height)
    if tw > w.max_size[0] or th > w.max_size[1]:
        how, field = hires_said(scale, resize)
        raise ApiError(400, f"hires. fix at {how} makes {tw}x{th} from {w.model.name}'s own size, above "
                            f"{limit}; pass width and height, or a smaller {field}", field=field)


@dataclass(frozen=True)
class FinishedJob:
    """What ``/internal/progress`` reads of a finished job: its images, init image and prompt are not kept (512
    finished jobs held every image they made, and their init images: gigabytes on a busy server)."""

    id: str
    state: str
    step: int
    total: int
    iteration: int
    worker: str
    progress: float = 1.0
    eta: float = 0.0
    preview: None = None


def _main_files(model: ModelEntry) -> tuple[Path, ...]:
    """The files a model's own weights come from: its single file (and a checkpoint bound onto a folder), or a
    folder's part files (``unet/model.onnx`` and its data, a diffusers folder's ``.safetensors``, tokenizers)."""
    files = [model.weights] if model.weights is not None else []
    if model.path.is_file():
        files.append(model.path)
    elif model.path.is_dir():
        files += sorted(p for p in model.path.glob("*/*") if p.is_file())
    return tuple(files)


def _part_files(files: tuple[Path | None, tuple[Path, ...]]) -> tuple[Path, ...]:
    vae, encoders = files
    return (*([vae] if vae is not None else []), *encoders)


def _versions(files: tuple[Path, ...]) -> dict[str, Any]:
    """``{file: its version now}`` (``file_stamp``: size, mtime, inode; None once it is gone)."""
    from ..weights.store import file_stamp

    return {str(f): file_stamp(f) for f in files}


def _names(files: list[str]) -> str:
    names = sorted(Path(f).name for f in files)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _stopped_before_start(job: Job) -> bool:
    """An interrupt, or a skip of the job's only run, came before it started: it answers without running."""
    return job.interrupt.is_set() or (job.skip.is_set() and job.work.n_iter <= 1)


class _Generating(Exception):
    """Wraps what ``Pipeline.generate`` raised on a loaded model: the request asked for something
    this model cannot do (a size its fixed-shape graph refuses, a prompt too long, a LoRA of
    another family), so the client gets a 400."""


def _caller_names(work: Work) -> dict[str, str]:
    """The request's fields of the pipeline's arguments (errors.from_pipeline's, and the model's VAE / text encoder
    fields): a warning a job logs (``in_caller_words``) names what the client sent."""
    from .errors import _FIELDS

    return {**_FIELDS, **_module_fields(work.model), **work.fields}


def _module_fields(model: ModelEntry) -> dict[str, str]:
    """The request's fields that chose the model's VAE and text encoders, by the pipeline's argument names."""
    field = model.module_field or ""
    return {"vae": field if field.endswith("sd_vae") else "sd_vae or forge_additional_modules",
            "text_encoders": "forge_additional_modules"}


def _public_error(exc: BaseException, work: Work | None = None) -> ApiError:
    """The HTTP error a failed job (of ``work``) ends in: 400 for what the request asked wrongly, else 500; the
    model's files said by their names in the models folder, never by their paths on the server."""
    err = _request_error(exc)
    work = work if work is not None else exc.args[2] if isinstance(exc, _Generating) and len(exc.args) > 2 else None
    model = getattr(work, "model", None)
    if isinstance(model, ModelEntry) and err.status != 499:
        err.message = _no_server_paths(err.message, model)
    from .errors import file_names

    err.message = file_names(err.message, getattr(work, "fields", None) or {})  # a unit's files, as the admin names them
    return err


def _no_server_paths(text: str, model: ModelEntry) -> str:
    """``text`` with the server's paths of ``model``'s files (a text encoder's graph a clip skip asks too much of,
    a part that cannot load) as the models folder names them: ``demo-a/text_encoder/model.onnx``."""
    for path in (model.vae, *model.text_encoders, model.weights):  # files of other folders: their names
        if path is not None:
            text = text.replace(str(path), path.name)
    folder = str(model.path.parent)
    for sep in {os.sep, "/"}:
        if folder.rstrip(sep):  # a models folder at the root would take every "/" away
            text = text.replace(folder.rstrip(sep) + sep, "")
    return text


def _request_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    changed = exc.__cause__ if isinstance(exc, _Generating) else exc
    if isinstance(changed, FileChanged):  # not the request's fault: the next job reads the file on disk then
        return ApiError(503, f"{changed.what}; the next request loads it again: retry once the file is complete")
    if isinstance(exc, _Generating) and isinstance(exc.__cause__, (InputError, SamplerError, WeightsError,
                                                                   ModelError)):
        from .errors import from_pipeline

        names = exc.args[1] if len(exc.args) > 1 else {}
        work = exc.args[2] if len(exc.args) > 2 else None
        names = {**names, "sampler": _sampler_field(getattr(exc.__cause__, "where", None), work)}
        if work is not None and work.size_from and getattr(exc.__cause__, "where", None) in ("width", "height"):
            return ApiError(400, f"the model {exc.args[0]} refused the request: {_picture_size(exc.__cause__, work)}",
                            field=work.size_from.partition("[")[0])
        inner = from_pipeline(exc.__cause__, names)  # what and what to do, in the request's fields
        if work is not None and work.rounded and getattr(exc.__cause__, "where", None) in ("width", "height"):
            inner.message += f" ({'; '.join(work.rounded)})"  # "96x64 was asked" of a request that sent 100
        # "controlnets[0] (/models/ControlNet/x.safetensors)": the unit's own field, without the file's path
        key = re.match(r"\w+(\[\d+\])?", inner.field or "")
        name = names.get(key.group(0)) if key else None
        field = name or inner.field
        if field and ("/" in field or "\\" in field):  # a server file (a prompt's LoRA), never a request field
            file = Path(field).name
            field = _tag_field(Path(field).stem, work)
            if file not in inner.message:  # the file's own check ("header length ... does not fit the file")
                inner.message = f"{field + ': ' if field else ''}{file}: {inner.message}"
        return ApiError(400, f"the model {exc.args[0]} refused the request: {inner.message}", field=field)
    if isinstance(exc, _Generating) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, (InputError, SamplerError, WeightsError)):
        return ApiError(400, str(exc))
    if isinstance(exc, SdrtError):
        return ApiError(500, str(exc), kind=type(exc).__name__)
    return ApiError(500, f"internal error ({type(exc).__name__}: {exc}); the server logged it and keeps serving",
                    kind=type(exc).__name__)


def _sampler_field(where: str | None, work: Work | None) -> str:
    """The request field of the sampler a run-time sampler check names (``where``: "sampler uni_pc"):
    ``hr_sampler_name`` when the hires. fix's second pass runs that sampler and the first pass another."""
    from ..samplers.names import resolve

    kwargs = getattr(work, "kwargs", None) or {}
    if not (where or "").startswith("sampler ") or not kwargs.get("hires_sampler"):
        return "sampler_name"
    name = where.split(" ", 2)[1]
    try:
        first = resolve(kwargs.get("sampler") or "Euler", kwargs.get("schedule")).sampler
        second = resolve(kwargs["hires_sampler"], kwargs.get("hires_schedule") or kwargs.get("schedule")).sampler
    except SdrtError:
        return "sampler_name"
    return "hr_sampler_name" if second == name != first else "sampler_name"


def _tag_field(stem: str, work: Work | None) -> str | None:
    """The prompt field whose ``<lora:NAME:...>`` tag names the file ``stem`` (the LoRA a job refused), else None."""
    from ..text import extract_loras

    for text, key in ((getattr(work, "prompt", None), "prompt"), (getattr(work, "negative", None), "negative_prompt")):
        if isinstance(text, str) and "<" in text and any(
                Path(name).name.casefold() == stem.casefold() for name, _ in extract_loras(text)[1]):
            return key
    return None


def _picture_size(exc: SdrtError, work: Work) -> str:
    """A size the model refused that was the picture's (``Work.size_from``; the request sent no width and height):
    the pipeline's words for its width and height, said as that picture's, and what to send instead (the pipeline's
    own fix speaks of width and height as the caller's: "pass width=64 ..., or leave them unset")."""
    from ..errors import _render

    limit = f", at most {work.max_size[0]}x{work.max_size[1]} on this server" if work.max_size else ""
    return (f"{_render(exc.what, None)}: the size is {work.size_from}'s, as the request sets no width and height; pass "
            f"width and height (the picture is fitted to that size{limit}), or send a picture of a size it takes")


def _module_error(model: ModelEntry, exc: SdrtError) -> ApiError:
    """A 400 naming the request's field of the VAE / text encoders it chose, when the model refuses them (a file of
    another family, of other widths, a part still missing); never a server path."""
    from ..errors import _render

    names = _module_fields(model)
    what = _render(exc.what, names)
    fix = _render(exc.fix, names) if getattr(exc, "fix", None) else None
    for path in (model.vae, *model.text_encoders, model.path, model.weights):
        if path is not None:
            what = what.replace(str(path), path.name)
            fix = fix.replace(str(path), path.name) if fix else fix
    return ApiError(400, f"the model {model.name} cannot run with the files chosen: {what}" + (f"; {fix}" if fix else ""),
                    field=model.module_field)


class Worker(threading.Thread):
    """Runs jobs from ``jobs`` on one device; ``spec_for(model, device)`` says how to build a pipeline."""

    def __init__(self, name: str, device: str | None, jobs: JobQueue,
                 spec_for: Callable[[ModelEntry, str | None], PipelineSpec], keep: int = 2) -> None:
        super().__init__(name=f"sdrt-serve-{name}", daemon=True)
        self.label = name
        self.device = device
        self.jobs = jobs
        self.spec_for = spec_for
        self.keep = max(keep, 1)
        self.pipes: collections.OrderedDict[str, Any] = collections.OrderedDict()
        #: the VAE and text-encoder files bound on each pipeline now (ModelEntry.files)
        self.files: dict[str, tuple[Any, tuple[Any, ...]]] = {}
        #: the versions (``file_stamp``) of each pipeline's files when it read them: its model's and the embeddings
        #: (``_own_files``), and the VAE and text encoders of ``files``
        self.versions: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.current: Job | None = None
        self.done = 0
        #: held while a job runs: unload/reload wait for it (the pipelines are this thread's between jobs)
        self.busy = threading.Lock()
        self.stopped = False

    def pipeline(self, model: ModelEntry, pinned: tuple[str, ...] = ()) -> Any:
        """The model's pipeline, with the VAE and text-encoder files the request chose bound. One pipeline per
        model: another choice of files swaps them on it (``Pipeline.set_part_files``: only those parts compile
        again), as A1111 and Forge swap the VAE, so a client switching VAEs holds one UNet, not one per VAE. A file
        the model refuses is a 400 naming the request's field, and the pipeline keeps the files it had. A part only
        a load adds or drops (a T5 file chosen for, or no longer chosen for, an SD 3 file without one) loads the model
        again with the chosen files."""
        from ..pipelines.singlefile import PartNotLoaded, PartNotOwned

        key = model.key
        changed = self._changed(key, model) if key in self.pipes else []
        if changed and not self._reread(key, model, changed):  # bound from the old files: the next job runs the
            log.info("%s changed on disk: loading %s again on %s", _names(changed), model.name, self.label)
            self._drop(key)  # files on disk now
        if key in self.pipes:
            self.pipes.move_to_end(key)
            pipe = self.pipes[key]
        else:
            # a model that runs on its own loads without the chosen files (a refused file then costs no load); a
            # transformer-only file needs them to load at all
            own = model if model.needs else dataclasses.replace(model, vae=None, text_encoders=(), module_field=None)
            pipe = self._build(model, own)
            while len(self.pipes) > self.keep:  # the least recently used, never this one nor a pinned one
                old_key = next((k for k in self.pipes if k != key and k not in pinned), None)
                if old_key is None:
                    break
                self._drop(old_key)
        if self.files.get(key) != model.files:
            parts = _versions(_part_files(model.files))
            try:  # checked before anything changes: a refused file leaves the pipeline as it was
                pipe.set_part_files(vae=model.vae, text_encoders=list(model.text_encoders))
            except FileChanged:
                raise
            except (PartNotLoaded, PartNotOwned) as exc:
                # a part only a load adds or drops (SD 3's T5 on a file without one): the model loads again with the
                # files chosen, as Forge reloads it when its modules change; the old pipeline stays if that is refused
                log.info("loading %s again on %s: %s", model.name, self.label, exc.what)
                pipe = self._build(model, model, replaces=pipe)
                return pipe
            except SdrtError as exc:
                raise _module_error(model, exc) from exc
            self.files[key] = model.files
            self.versions[key] = self.versions[key][0], parts
        return pipe

    def _build(self, model: ModelEntry, own: ModelEntry, replaces: Any = None) -> Any:
        """Build ``model``'s pipeline with ``own``'s VAE and text-encoder files bound at load, and hold it under the
        model's key; ``replaces``: the pipeline held there now, closed once the new one is built (a refusal keeps
        it). A file the model refuses is a 400 naming the request's field."""
        key = model.key
        versions = _versions(self._own_files(model)), _versions(_part_files(own.files))  # before any read
        try:
            pipe = self.spec_for(own, self.device).build()
        except SdrtError as exc:
            if isinstance(exc, FileChanged):
                raise
            if own.module_field is not None:  # a VAE / text encoder the request chose that this model refuses
                raise _module_error(model, exc) from exc
            if isinstance(exc, WeightsError):  # a checkpoint of another architecture than its base folder
                raise ApiError(500, f"the model {model.name} cannot be loaded: {exc}",
                               kind=type(exc).__name__) from exc
            raise
        if replaces is not None:
            self._drop(key)
        self.pipes[key] = pipe
        self.files[key] = own.files
        self.versions[key] = versions
        return pipe

    def _own_files(self, model: ModelEntry) -> tuple[Path, ...]:
        """The files a model's pipeline reads besides the VAE and text encoders a request chooses: the model's own
        (``_main_files``) and the embeddings folder's (a pipeline loads them all when it is built)."""
        return (*_main_files(model), *self.spec_for(model, self.device).embeddings)

    def _changed(self, key: str, model: ModelEntry) -> list[str]:
        """The files a loaded model's pipeline read that are another version on disk now (replaced, written again,
        added or removed: ``file_stamp``). A VAE or text-encoder file counts while the request keeps it; one it
        changes for another is read anew by ``set_part_files`` anyway."""
        main, parts = self.versions.get(key, ({}, {}))
        old, now = dict(main), _versions(self._own_files(model))
        if self.files.get(key) == model.files:
            old.update(parts)
            now.update(_versions(_part_files(model.files)))
        return sorted(f for f in old.keys() | now.keys() if old.get(f) != now.get(f))

    def _reread(self, key: str, model: ModelEntry, changed: list[str]) -> bool:
        """Bind again only what ``changed`` files feed, where the pipeline allows it; False: load the model again.

        - a VAE or text-encoder file the request chose: those parts (``Pipeline.reread_part_files``);
        - an embedding, changed or added: its rows of the token table (``Pipeline.reread_embeddings``; the UNet and
          its sessions stay); one removed, or whose vector count changed, loads the model again;
        - a file of a folder's part (``vae_decoder/model.onnx``, ``unet/model.onnx_data``): that part's graph
          (``Pipeline.reread_parts``), unless weights are bound over it.
        Anything else (a single file, a tokenizer, the scheduler's config) loads the model again. LoRA files are no
        pipeline's files here: the pipeline reads one again when its version changes (``WeightState.lora``)."""
        pipe = self.pipes[key]
        parts = self.versions[key][1]
        now = _versions(self._own_files(model)), _versions(_part_files(model.files))  # before anything is read
        embeddings = {str(p) for p in self.spec_for(model, self.device).embeddings}
        chosen = set(parts) if self.files.get(key) == model.files else set()
        part_files, emb_files, folder_parts = [], [], set()
        for f in changed:
            if f in chosen and now[1].get(f) is not None:
                part_files.append(f)
            elif f in embeddings and now[0].get(f) is not None:
                emb_files.append(f)
            else:
                owner = [name for name, part in pipe.parts.items()
                         if model.path.is_dir() and Path(f).parent == part.path.parent == model.path / part.path.parent.name]
                if len(owner) != 1 or now[0].get(f) is None:  # a part's file removed: the model loads again
                    return False
                folder_parts.add(owner[0])
        try:
            if folder_parts:
                pipe.reread_parts(*sorted(folder_parts))
            if part_files:
                pipe.reread_part_files(*part_files)
            loaded = {str(Path(e.source)) for e in pipe.weights.embeddings}
            for f in emb_files:
                try:
                    pipe.reread_embeddings(f)
                except WeightsError as exc:
                    if f in loaded:
                        raise
                    # a new file of another family is skipped, as when the pipeline was built
                    log.warning("embedding %s not loaded for %s: %s", Path(f).name, model.name, exc)
        except Exception as exc:  # noqa: BLE001 - refused (weights bound over a part, an embedding's tokens
            # changed) or unreadable: the model loads again, whatever was bound already
            what = exc.what if isinstance(exc, SdrtError) else f"{type(exc).__name__}: {exc}"
            log.info("%s changed on disk and cannot be bound again alone (%s)", _names(changed), what)
            return False
        log.info("%s changed on disk: %s of %s bound again on %s", _names(changed),
                 ", ".join(sorted(folder_parts) + (["the chosen VAE/text encoders"] if part_files else [])
                           + (["embeddings"] if emb_files else [])), model.name, self.label)
        self.versions[key] = now[0], (now[1] if chosen else parts)
        return True

    def _drop(self, key: str) -> None:
        pipe = self.pipes.pop(key)
        self.files.pop(key, None)
        self.versions.pop(key, None)
        pipe.close()

    def run(self) -> None:
        while True:
            job = self.jobs.next()
            if job is None:
                break
            self.current = job
            held = False
            try:
                held = self._hold(job)
                with caller_words(_caller_names(job.work)):  # its warnings in the request's fields, as its errors
                    self._run(job)
            except BaseException as exc:  # noqa: BLE001 - a failed job must never end the worker
                err = _public_error(exc, job.work)
                if err.status >= 500:
                    log.error("job %s failed on %s: %s (traceback at debug level)", job.id, self.label,
                              err.message)
                    log.debug("traceback of job %s", job.id, exc_info=exc)
                else:
                    log.info("job %s refused: %s", job.id, err.message)
                job.state = "failed"
                job.finished = time.time()
                if not job.future.done():
                    job.future.set_exception(err)
            finally:
                if held:
                    self.busy.release()
                self.current = None
                self.done += 1
                self.jobs.finished(job)
                job = None  # not held (with its images) while this worker waits for the next one
                mapcount.check()  # models compiled and released over a long run: warned before the limit
        with self.busy:  # after a reload-checkpoint still loading: nothing is loaded onto a stopped worker
            self.stopped = True
            pipes = list(self.pipes.values())
            self.pipes.clear()
            self.files.clear()
            self.versions.clear()
        for pipe in pipes:
            pipe.close()

    def _hold(self, job: Job) -> bool:
        """Take ``busy`` for ``job``. While ``/unload-checkpoint`` or ``/reload-checkpoint`` holds it (a reload may
        compile for minutes), the job is this worker's current one: an interrupt, or a skip of its only run, answers
        it at once without the lock (False), as the user pressing it expects, and the worker goes on with the queue."""
        while not self.busy.acquire(timeout=0.05):
            if _stopped_before_start(job):
                return False
        return True

    def unload(self) -> int:
        """A1111's ``/unload-checkpoint`` on this device: every loaded pipeline closed (its memory freed) once the
        running job, if any, is done; the next job loads its model again. The number closed."""
        with self.busy:
            pipes = list(self.pipes.values())
            self.pipes.clear()
            self.files.clear()
            self.versions.clear()
        for pipe in pipes:
            pipe.close()
        return len(pipes)

    def load(self, model: ModelEntry) -> None:
        """A1111's ``/reload-checkpoint``: ``model`` loaded (and compiled) now, after the running job."""
        with self.busy:
            if self.stopped:
                raise ApiError(503, "the server is stopping: no model is loaded now")
            try:  # the files the options choose are bound too, as a job of this model would bind them
                self.pipeline(model)
            except SdrtError as exc:  # a model that cannot load: the one-line error, not an internal error
                raise _public_error(exc) from exc

    def _run(self, job: Job) -> None:
        w = job.work
        job.state = "running"
        job.started = time.time()
        job.worker = self.label
        self.jobs.changed()
        result = Result([], [], [], w.prompt, w.negative, worker=self.label)
        if job.interrupt.is_set():
            result.interrupted = True
        elif _stopped_before_start(job):  # its only run skipped before it started: no model is loaded for it
            result.skipped = 1
        else:
            pipe = self.pipeline(w.model)
            kwargs = dict(w.kwargs)
            if isinstance(kwargs.get("refiner"), ModelEntry):  # refiner_checkpoint: one of this worker's pipelines,
                # shared by every model it refines and counted in keep (a path would load one per base pipeline)
                kwargs["refiner"] = self.pipeline(kwargs["refiner"], pinned=(w.model.key,))
            if isinstance(kwargs.get("hires_checkpoint"), ModelEntry):  # hr_checkpoint_name: likewise, kept beside the
                # first model's pipeline (its parts go before the second's load when the memory is tight: hiresmodel)
                entry = kwargs["hires_checkpoint"]
                kwargs["hires_checkpoint"] = pipe if entry.key == w.model.key else \
                    self.pipeline(entry, pinned=(w.model.key,))
            if w.max_size is not None and not (kwargs.get("width") and kwargs.get("height")):
                _check_own_size(w, kwargs, pipe.default_size)
            if w.distilled_cfg is not None:
                if "guidance" in pipe.denoiser.inputs:
                    kwargs["guidance"] = w.distilled_cfg
                elif w.distilled_cfg != 3.5:  # Forge's default, which Easy Diffusion always sends
                    result.not_honoured.append(f"distilled_cfg_scale: {w.model.name} is no guidance-distilled model "
                                               "(Flux dev is); cfg_scale is its guidance")

            if "init_image" in kwargs and pipe.instruct_pix2pix:  # A1111's edit model (sdrt.pipelines.edit)
                kwargs["image_cfg"] = 1.0 if w.image_cfg is None else w.image_cfg
            elif w.image_cfg is not None and w.image_cfg not in (1.5, 0.0, 1.0):  # 1.5: what clients always send
                result.not_honoured.append(f"image_cfg_scale: {w.model.name} is no InstructPix2Pix model; its "
                                           "image guidance applies to those only")
            _latent_upscale_note(pipe, kwargs, result)
            cfg = pipe.family.default_cfg if kwargs.get("cfg") is None else kwargs["cfg"]
            if w.negative.strip() and not pipe.family.negative_pass(cfg, w.negative):  # the pipeline logs it only
                result.not_honoured.append(f"negative_prompt: cfg_scale {cfg:g} runs one pass, with the prompt only; "
                                           "a cfg_scale above 1 runs the negative prompt's pass")
            elif (cfg != 1 and not pipe.family.negative_pass(cfg, w.negative)
                  and pipe.family.negative_pass(cfg, "x")):  # Flux: its true CFG runs with a negative prompt only
                result.not_honoured.append(f"cfg_scale: {cfg:g} runs one pass on {pipe.family.label}, with the prompt "
                                           "only: its true CFG runs with a negative_prompt (diffusers' rule); send "
                                           "one, or cfg_scale 1")

            def on_step(step: int, total: int, latents: np.ndarray) -> None:
                job.step, job.total = step, total
                try:  # the denoised estimate, in the family's own colours (as A1111's live preview shows it)
                    job.preview = pipe.preview()
                except SdrtError:
                    job.preview = None

            for k in range(w.n_iter):
                if job.interrupt.is_set():
                    result.interrupted = True
                    break
                job.iteration, job.step = k, 0
                try:  # a skip that came before this run started (the model loading, the worker held) skips it
                    gen, stopped = self._generate(job, pipe, on_step, k, kwargs, result)
                except SdrtError as exc:
                    raise _Generating(w.model.name, w.fields, w) from exc
                finally:
                    job.skip.clear()  # a skip ends one run: the next one runs
                    for unit in kwargs.get("controlnets") or ():  # inpaint_only+lama leans the job's first batch
                        if getattr(unit, "preprocessor", None) == "inpaint_only+lama":  # only, as the extension's
                            unit.lean_noise = False  # HackedImageRNG in A1111's n_iter loop
                if gen is not None:  # a stopped run's partial images too, as A1111 gives them
                    for settings in gen.settings:
                        for key, value in w.extra_infotext.items():
                            settings.setdefault(key, value)
                    result.images += gen.images
                    result.settings += gen.settings
                    result.seeds += gen.seeds
                    result.prompt, result.negative = gen.prompt, gen.negative_prompt
                if stopped:
                    if job.interrupt.is_set():
                        result.interrupted = True
                        break
                    result.skipped += 1
        job.finished = time.time()
        result.seconds = job.finished - job.started
        job.state = "interrupted" if result.interrupted else "done"
        job.preview = None
        job.future.set_result(result)


    def _generate(self, job: Job, pipe: Any, on_step: Callable[[int, int, np.ndarray], None], k: int,
                  kwargs: dict[str, Any], result: Result) -> tuple[Any, bool]:
        """Run ``k`` of the job. A clip skip the model's text encoder cannot give (an ONNX export without
        hidden_states outputs: Optimum's SD 1.x ones) runs at 1, named: A1111 users often keep CLIP skip 2 as a
        server-wide option, which would otherwise fail every request on such a model."""
        w = job.work

        def run() -> Any:
            seed, seeds = run_seeds(w.seed, k, w.batch, kwargs)
            return generate_until_stopped(pipe, lambda: job.interrupt.is_set() or job.skip.is_set(), on_step,
                                          w.prompt, w.negative, lambda: job.wants_partial,
                                          seed=seed, batch_count=1, **{**kwargs, **seeds})

        try:
            return run()
        except ModelError as exc:
            skip = kwargs.get("clip_skip", 1)
            deepest = re.search(r"its largest clip skip is (\d+)", str(getattr(exc, "what", "")))
            if w.clip_skip_option and deepest and getattr(exc, "where", None) == "clip_skip" \
                    and int(deepest.group(1)) < skip:
                most = int(deepest.group(1))
                result.not_honoured.append(f"CLIP_stop_at_last_layers: the server's option {skip} ran at {most} on "
                                           f"{w.model.name}, whose text encoder has {most} hidden states")
                kwargs["clip_skip"] = most  # and so do the job's next runs; another encoder may have fewer
                return self._generate(job, pipe, on_step, k, kwargs, result)
            if skip <= 1 or not str(getattr(exc, "what", "")).startswith("clip skip "):
                raise
            result.not_honoured.append(f"CLIP_stop_at_last_layers: {skip} ran at 1 on {w.model.name}: {exc.what}")
            kwargs["clip_skip"] = 1  # and so do the job's next runs
            return run()


def run_seeds(seed: int, k: int, batch: int, kwargs: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The seed and variation seed of run ``k`` of a job (its ``n_iter`` batch ``k``), as A1111's
    ``p.all_seeds`` / ``p.all_subseeds`` give them: image ``j`` of the job has seed ``seed + j`` and subseed
    ``subseed + j``, except that with a variation seed (``subseed_strength > 0``) every image keeps ``seed``.
    The pipeline numbers the images of one batch from these (``seed + i``, ``subseed + i``)."""
    if not kwargs.get("subseed_strength"):
        return seed + k * batch, {}
    subseed = kwargs.get("subseed")
    return seed, {} if subseed is None else {"subseed": subseed + k * batch}


def _latent_upscale_note(pipe: Any, kwargs: dict[str, Any], result: Result) -> None:
    """img2img's resize_mode 3 on a model whose VAE encoder takes one size only runs as 0 (the pipeline says so
    in the log): the request hears it in ``sdrt_not_honoured``."""
    from ..pipelines.images import LATENT_UPSCALE

    picture = kwargs.get("init_image")
    if kwargs.get("resize_mode") != LATENT_UPSCALE or picture is None:
        return
    h, w = picture.shape[:2]
    if (w, h) == (kwargs.get("width"), kwargs.get("height")):
        return  # nothing to resize
    why = pipe.latent_upscale_blocked(w, h)
    if why is not None:
        result.not_honoured.append(f"resize_mode: 3 (latent upscale) ran as 0 (just resize): {why}")


class JobQueue:
    """The queue, its workers, and what ``/progress`` reports."""

    def __init__(self, devices: tuple[str | None, ...], spec_for: Callable[[ModelEntry, str | None], PipelineSpec],
                 *, keep: int = 2, max_queue: int = 64) -> None:
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.max_queue = max_queue
        self.active: dict[str, Job] = {}
        self.recent: collections.OrderedDict[str, FinishedJob] = collections.OrderedDict()
        self.submitted = 0
        #: called (from a worker thread) when a job starts or ends; the Ray replicas report then
        self.on_change: Callable[[], None] | None = None
        labels = [str(d) if d is not None else "default" for d in devices]
        names = [f"{i}:{label}" for i, label in enumerate(labels)]
        self.workers = [Worker(n, d, self, spec_for, keep) for n, d in zip(names, devices)]
        for w in self.workers:
            w.start()

    # ---------------------------------------------------------------- submitting
    def submit(self, work: Work, job_id: str | None = None) -> Job:
        job = Job(work) if not job_id else Job(work, id=job_id)
        with self._lock:
            waiting = sum(1 for j in self.active.values() if j.state == "queued")
            if waiting >= self.max_queue:
                raise ApiError(503, f"the queue is full ({waiting} job{'s' if waiting != 1 else ''} waiting); "
                                    "try again shortly")
            if job.id in self.active:
                raise ApiError(409, f"a job with id {job.id!r} is already queued or running", field="force_task_id")
            self.active[job.id] = job
            self.submitted += 1
        self._queue.put(job)
        return job

    def next(self) -> Job | None:
        return self._queue.get()

    def finished(self, job: Job) -> None:
        with self._lock:
            self.active.pop(job.id, None)
            self.recent[job.id] = FinishedJob(job.id, job.state, job.step, job.total, job.iteration, job.worker)
            while len(self.recent) > 512:
                self.recent.popitem(last=False)
        self.changed()

    def changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception as exc:  # noqa: BLE001 - reporting must never fail a job
                log.warning("progress report failed: %s", exc)

    # ---------------------------------------------------------------- control
    def running(self) -> list[Job]:
        with self._lock:
            return sorted((j for j in self.active.values() if j.state == "running"), key=lambda j: j.started or 0)

    def queued(self) -> int:
        with self._lock:
            return sum(1 for j in self.active.values() if j.state == "queued")

    def find(self, job_id: str) -> Job | FinishedJob | None:
        with self._lock:
            return self.active.get(job_id) or self.recent.get(job_id)

    def current(self) -> list[Job]:
        """The job each worker holds: running, or taken from the queue and waiting while an unload or reload
        holds the worker (A1111's "current job", which its interrupt and skip reach)."""
        jobs = {j.id: j for j in self.running()}
        for w in self.workers:
            job = w.current
            if job is not None and not job.future.done():
                jobs.setdefault(job.id, job)
        return list(jobs.values())

    def interrupt(self) -> int:
        """Stop every current job (``current``) at its next step, or before it starts (A1111 has one; here each
        device may run one). Jobs still in the queue are not touched, as in A1111."""
        jobs = self.current()
        for j in jobs:
            j.interrupt.set()
        return len(jobs)

    def abandon(self, job: Job) -> None:
        """The job's client disconnected (or its request was cancelled): nobody will read the images, so a
        queued job is dropped when a worker reaches it and a running one stops at its next step."""
        if job.future.done():
            return
        job.wants_partial = False
        job.interrupt.set()
        log.info("job %s abandoned by its client while %s; %s", job.id, job.state,
                 "it will not run" if job.state == "queued" else "stopping it")

    def unload(self) -> int:
        """Every worker's pipelines closed, each after its running job; the number closed."""
        return sum(w.unload() for w in self.workers)

    def reload(self, model: ModelEntry) -> None:
        for w in self.workers:
            w.load(model)

    def skip(self) -> int:
        """End the current run of every current job (``current``); one that has not started skips its first run."""
        jobs = self.current()
        for j in jobs:
            j.skip.set()
        return len(jobs)

    def close(self) -> None:
        """Stop: queued and running jobs end at once (answered as interrupted), then the workers."""
        with self._lock:
            pending = list(self.active.values())
        for j in pending:
            j.wants_partial = False
            j.interrupt.set()
        for _ in self.workers:
            self._queue.put(None)
        for w in self.workers:
            w.join(timeout=60)


__all__ = ["FinishedJob", "Job", "JobQueue", "Result", "Work", "Worker"]
