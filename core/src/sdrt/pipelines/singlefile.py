"""Single files in a pipeline: a ``.safetensors`` checkpoint as the model, and separate VAE and text-encoder files.

- ``folder_from_file(path, vae, text_encoders, ...)``: a ``ModelFolder`` for a single file
  (``sdrt.checkpoint.open_single_file``, then ``ModelFolder.from_single_file``): its parts are sdrt's
  shipped weight-free graphs, each with the file's weights bound (``ModelFolder.weights``), and its
  scheduler, tokenizers and VAE scaling are those of the family's release
  (``sdrt/data/release/families.json``).
- ``check_part_file(path, arg, family, ...)``: what a file given as ``vae=`` / ``text_encoders=`` is,
  from its tensor names and shapes, checked against what the model needs (one ``SdrtError`` naming
  the argument, the file, what it is and what the model takes).
- ``bind_part_files(pipe, vae, text_encoders)``: on an ONNX folder, those files replace the weights of
  the matching parts, bound through ``sdrt.checkpoint``'s key maps onto the folder's own graphs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..args import one_or_many
from ..checkpoint.files import release_tokenizer
from ..errors import InputError, ModelError, ModelNotFoundError, SdrtError

if TYPE_CHECKING:  # pragma: no cover
    from .folder import ModelFolder
    from .pipeline import Pipeline

log = logging.getLogger("sdrt.pipelines.singlefile")

PathLike = str | os.PathLike[str]

#: a pipeline family -> a checkpoint family with its parts (which encoder kind each text part is)
_PARTS_OF = {"sd1": "sd1", "sd2": "sd2", "sdxl": "sdxl", "sdxl-refiner": "sdxl-refiner", "sd3": "sd35-medium", "flux": "flux-dev", "chroma": "chroma"}

__all__ = ["MAIN_FILE", "PartFile", "bind_part_files", "check_part_file", "denoiser_graph", "folder_from_file",
           "is_single_file", "missing_parts", "note_part_files", "release_tokenizer", "set_part_files"]


def is_single_file(path: object) -> bool:
    """Whether ``path`` names a file (a ``.safetensors`` checkpoint) rather than a model folder."""
    return isinstance(path, (str, os.PathLike)) and Path(path).is_file() and Path(path).suffix.lower() != ".onnx"


# -- what a separate file is -------------------------------------------------------------------------
@dataclass(frozen=True)
class PartFile:
    """A separate VAE or text-encoder file: its kind (``vae4``, ``vae16``, ``clip_l``, ``clip_g``,
    ``openclip_h``, ``t5xxl``), the parts of the model it fills, and its key prefix."""

    path: Path
    kind: str
    label: str
    parts: tuple[str, ...]
    prefix: str


def _kinds(family: str) -> dict[str, str]:
    """``{part: kind}`` of a checkpoint family's text encoders and VAE (``clip_l``, ``t5xxl``, ``vae16``...)."""
    from ..checkpoint.families import FAMILY_GRAPHS
    from ..checkpoint.files import graph_kind

    return {p: graph_kind(g) for p, g in FAMILY_GRAPHS[family].items() if p.startswith(("text_encoder", "vae"))}


def check_part_file(path: PathLike, arg: str, family: str, label: str) -> PartFile:
    """What the file given as ``arg`` (``vae`` or ``text_encoders``) is, checked against ``family`` (a key of
    ``sdrt.checkpoint.FAMILY_GRAPHS``; ``label`` its name in words). Headers only."""
    from ..checkpoint.families import PART_KINDS, identify
    from ..weights import Weights

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p.name} is a folder, and {{@{arg}}} takes one .safetensors file", where=arg,
                         fix=f"pass the file itself (e.g. {p / 'diffusion_pytorch_model.safetensors'})")
    if not p.is_file():
        from .png import _kind

        kind = _kind(p.stat().st_mode) if p.exists() else None
        if kind is not None:  # /dev/null, a FIFO: not "does not exist"
            raise InputError(f"{p} is {kind}, and {{@{arg}}} takes one .safetensors file", where=arg,
                             fix="pass the weights file itself")
        raise ModelNotFoundError(f"{p} does not exist", where=arg, fix="check the path")
    try:
        w = Weights.open(p)
    except SdrtError as exc:
        from ..checkpoint.files import open_fix

        raise type(exc)(f"{{@{arg}}}: cannot open {p.name}: {exc.what}", where=str(p),
                        fix=open_fix(p, exc, vae=arg == "vae")) from exc
    from ..checkpoint.files import gguf_arch

    ident = identify(w.shapes(), arch=gguf_arch(w))
    kinds = _kinds(family)
    vae = arg == "vae"
    wanted = sorted({k for part, k in kinds.items() if part.startswith("vae") == vae})
    if ident.foreign:
        from ..checkpoint.files import runs_elsewhere

        tail = f"not {'a VAE' if vae else 'a text encoder'}" if runs_elsewhere(ident.label) else "which sdrt does not run"
        raise ModelError(f"{{@{arg}}}: {p.name} is {ident.label}, {tail}", where=str(p),
                         fix=f"{label} takes {' and '.join(PART_KINDS[k] for k in wanted)} here")
    if ident.kind not in PART_KINDS:
        from ..checkpoint.families import NOT_CHECKPOINTS, detect, with_use

        plain = detect(w.shapes())  # a LoRA, ControlNet or embedding: where it goes instead ("not a checkpoint")
        if plain in NOT_CHECKPOINTS:
            raise ModelError(f"{{@{arg}}}: {p.name} is {with_use(plain, 'a VAE' if vae else 'a text encoder')}",
                             where=str(p), fix=f"{label} takes {' and '.join(PART_KINDS[k] for k in wanted)} here")
        what = f"a whole {ident.label} model" if ident.kind == "checkpoint" else ident.label
        raise ModelError(f"{{@{arg}}}: {p.name} is {what}, not {'a VAE' if vae else 'a text encoder'}", where=str(p),
                         fix=f"{label} takes {' and '.join(PART_KINDS[k] for k in wanted)} here")
    if ident.kind.startswith("vae") != vae:
        raise ModelError(f"{{@{arg}}}: {p.name} is {PART_KINDS[ident.kind]}, not {'a VAE' if vae else 'a text encoder'}",
                         where=str(p), fix=f"pass it with {{@{'text_encoders' if vae else 'vae'}}}")
    parts = tuple(part for part, k in kinds.items() if k == ident.kind)
    if not parts:
        if vae:
            raise ModelError(f"{{@{arg}}}: {p.name} is {PART_KINDS[ident.kind]} and {label} needs "
                             f"{PART_KINDS[wanted[0]]}", where=str(p), fix="pass the VAE that belongs to this model")
        raise ModelError(f"{{@{arg}}}: {p.name} is {PART_KINDS[ident.kind]}, which {label} does not use", where=str(p),
                         fix=f"{label} takes {', '.join(PART_KINDS[k] for k in wanted) or 'no text encoder file'}")
    return PartFile(p, ident.kind, PART_KINDS[ident.kind], parts, next(iter(ident.components.values())))


def missing_parts(path: PathLike) -> str | None:
    """Why a ``.safetensors`` file cannot be served on its own (headers only), or None when it holds a whole
    model: a denoiser of a family sdrt ships graphs for, with its text encoders and VAE."""
    from ..checkpoint.families import FAMILY_GRAPHS, PART_KINDS, identify
    from ..checkpoint.files import graph_kind
    from ..weights import Weights

    try:
        w = Weights.open(path)
    except SdrtError as exc:
        return f"it cannot be opened ({exc.what})"
    from ..checkpoint.files import gguf_arch

    ident = identify(w.shapes(), arch=gguf_arch(w))
    if ident.foreign:
        from ..checkpoint.files import runs_elsewhere

        return f"it is {ident.label}, " + ("not a model" if runs_elsewhere(ident.label) else "which sdrt does not run")
    if ident.family is None:  # a LoRA's label says "(not a checkpoint: pass it with ...)" itself
        return f"it is {ident.label}" + ("" if "(not a checkpoint: " in ident.label else ", not a model")
    have = {"vae_decoder" if c == "vae" else c for c in ident.components}
    optional = {"vae_encoder", *(("text_encoder_3",) if ident.family.startswith("sd3") else ())}  # SD3: T5 too
    lack = [p for p in FAMILY_GRAPHS[ident.family] if p not in optional and p not in have]
    if lack:
        kinds = ", ".join(dict.fromkeys(PART_KINDS[graph_kind(FAMILY_GRAPHS[ident.family][p])] for p in lack))
        return f"it is {ident.label} and lacks {kinds}"  # PART_KINDS carry their article: "a CLIP-L text encoder"
    return None


# -- a single file as a model folder -------------------------------------------------------------------
def folder_from_file(path: PathLike, vae: PathLike | None = None, text_encoders: Iterable[PathLike] = (), *,
                     graph_paths: Mapping[str, PathLike] | None = None, tokenizers: Mapping[str, PathLike] | None = None,
                     prediction: str | None = None, family: str | None = None) -> ModelFolder:
    """A :class:`ModelFolder` for a single-file checkpoint (plus separate VAE / text-encoder files). ``family``:
    ``open_single_file``'s, for a model at other widths than its release on graphs of its own (``graph_paths``)."""
    from ..checkpoint import open_single_file
    from ..checkpoint.families import LABELS, identify
    from ..weights import Weights

    main = Path(path)
    encoders = list(one_or_many(text_encoders))
    extras: list[Path] = []
    if vae is not None or encoders:  # checked against the family first, in the caller's words
        w = Weights.open(main)
        fam = identify(w.shapes(), family).family
        if fam is not None:
            if vae is not None:
                extras.append(check_part_file(vae, "vae", fam, LABELS[fam]).path)
            # with family= (graphs of other widths), a text encoder of no release width is matched to its graph
            # by open_single_file
            extras += [Path(t) if family is not None and _unidentified(t) else
                       check_part_file(t, "text_encoders", fam, LABELS[fam]).path for t in encoders]
        else:
            extras += [Path(vae)] if vae is not None else []
            extras += [Path(t) for t in encoders]
    opened = open_single_file(main, extras, prediction=prediction, graph_paths=graph_paths, family=family)
    from .folder import ModelFolder

    return ModelFolder.from_single_file(opened, tokenizers=tokenizers, vae_file=Path(vae) if vae is not None else None)


def _unidentified(path: PathLike) -> bool:
    """Whether a readable .safetensors file's tensors say no known part (no release width)."""
    from ..checkpoint.families import identify
    from ..weights import Weights

    try:
        w = Weights.open(path)
    except (SdrtError, OSError):
        return False  # check_part_file names the problem
    return identify(w.shapes()).kind == "unknown"


class PartNotLoaded(InputError):
    """A VAE / text-encoder file for a part the loaded pipeline does not have (SD 3 loaded without T5). Loading the
    model again with the file gives that part (``sdrt serve`` does)."""


class PartNotOwned(ModelError):
    """A part a file filled at load (SD 3's T5 on a file without one) that the model has no weights of its own to go
    back to. Loading the model again without the file drops that part (``sdrt serve`` does)."""


# -- separate files onto an ONNX folder --------------------------------------------------------------
def bind_part_files(pipe: Pipeline, vae: PathLike | None = None, text_encoders: Iterable[PathLike] = ()) -> list[str]:
    """Replace the weights of the folder's VAE / text encoders with those files (through ``WeightState``,
    so LoRAs and embeddings apply on top). Everything is checked before anything changes. Returns the parts."""
    encoders = list(one_or_many(text_encoders))
    planned, files = _plan_files(pipe, vae, encoders, at_load=True)
    _bind_planned(pipe, planned, {p: f.path for f in files for p in f.parts if p in planned})
    return sorted(planned)


def _plan_files(pipe: Pipeline, vae: PathLike | None, encoders: list[PathLike], at_load: bool = False
                ) -> tuple[dict[str, dict[str, Any]], list[PartFile]]:
    """``({part: {initializer: TensorRef}}, files)`` of the files bound onto the pipeline's own graphs, every file
    checked (its kind, then every tensor's name and shape) before anything changes. ``at_load``: bound by
    ``pipelines.load`` onto a folder's own parts (not swapped on a loaded pipeline)."""
    from ..checkpoint.files import part_file_refs
    from ..errors import WeightsError

    fam = _PARTS_OF[pipe.family.name]
    label = pipe.family.label
    files = ([check_part_file(vae, "vae", fam, label)] if vae is not None else []) + \
        [check_part_file(t, "text_encoders", fam, label) for t in encoders]
    state = pipe.weights
    planned: dict[str, dict[str, Any]] = {}
    for pf in files:
        parts = [p for p in pf.parts if p in pipe.parts]
        if not parts:  # SD 3's T5 on a folder without text_encoder_3/, or on a model loaded without T5: unused
            arg = "vae" if pf.kind.startswith("vae") else "text_encoders"
            if at_load:  # a folder runs the parts it holds
                toks = [f"{e.tokenizer}/" for e in pipe.family.encoders if e.part in pf.parts]
                raise ModelError(f"{{@{arg}}}: {pf.path.name} is {pf.label}, and this {label} folder has no "
                                 f"{' or '.join(pf.parts)} for it to fill (a folder runs the parts it holds)",
                                 where=str(pf.path), fix=f"add the release's {' and '.join([f'{pf.parts[0]}/', *toks])} "
                                 "to the folder, or leave the file out")
            raise PartNotLoaded(f"{{@{arg}}}: {pf.path.name} is {pf.label} for {', '.join(pf.parts)}, which this "
                                f"{label} model was loaded without", where=arg,
                                fix=f"load the model with the file (it adds {', '.join(pf.parts)}), or leave it out")
        try:
            planned.update(part_file_refs(pf.path, {p: state._graph(p) for p in parts}))
        except WeightsError as exc:
            arg = "vae" if pf.kind.startswith("vae") else "text_encoders"
            raise WeightsError(f"{{@{arg}}}: {pf.path.name} ({pf.label}) does not fit this {label} model's "
                               f"{', '.join(parts)}: {exc.what}", where=str(pf.path),
                               fix="pass the file that belongs to this model (the same architecture and widths)"
                               ) from exc
    return planned, files


#: ``WeightState.own_base`` of a part that a file given to ``pipelines.load`` filled on a single file: its own
#: weights (if the file holds that part) are read from the file again when the part goes back to them
MAIN_FILE = "main file"
_KEEP: Any = object()


def _bind_planned(pipe: Pipeline, planned: Mapping[str, Mapping[str, Any] | None], files: Mapping[str, Path | None],
                  ) -> None:
    """Bind each part's planned weights (None: the model's own again) and record which file fills it."""
    state = pipe.weights
    for part, refs in planned.items():
        if part not in state.part_files:  # the model's own weights for it, to go back to (a checkpoint's, or none)
            state.own_base[part] = state.base.get(part)
        if refs is None:
            own = state.own_base.pop(part, None)
            if own is None:
                state.base.pop(part, None)
            else:
                state.base[part] = dict(own)
        else:
            state.base[part] = dict(refs)
        if files.get(part) is None:
            state.part_files.pop(part, None)
        else:
            state.part_files[part] = Path(files[part])  # type: ignore[arg-type]
    if planned:
        if state.embeddings and any(p.startswith("text_encoder") for p in planned):
            state._write_embeddings()  # the new token table gets the embedding rows again
        state._apply(set(planned))


def note_part_files(pipe: Pipeline, files: Iterable[PathLike]) -> None:
    """On a pipeline of a single file opened with separate files (``pipelines.load(FILE, vae=, text_encoders=)``):
    record which parts those files fill, so ``set_part_files`` knows what runs and what the model's own is."""
    opened = pipe.folder.single_file
    given = {Path(f) for f in files}
    if opened is None or not given:
        return
    state = pipe.weights
    for part, f in opened.files.items():
        if Path(f) in given and part in pipe.parts:
            state.part_files[part] = Path(f)
            state.own_base[part] = MAIN_FILE


def _own_of_main(pipe: Pipeline, parts: list[str], arg: str) -> dict[str, dict[str, Any]]:
    """The main file's own weights of ``parts`` (a single file whose parts came from separate files at load)."""
    from ..checkpoint.files import open_single_file

    opened = pipe.folder.single_file
    assert opened is not None
    try:
        own = open_single_file(opened.path, parts=parts, graph_paths={p: opened.parts[p][0] for p in parts})
    except SdrtError as exc:
        what = "VAE" if arg == "vae" else "text encoder"
        raise ModelError(f"{{@{arg}}}: {opened.path.name} holds no {what} of its own ({exc.what})",
                         where=str(opened.path),
                         fix=f"pass a {what} file for it" + (" ({@vae}=FILE)" if arg == "vae" else
                                                            " ({@text_encoders}=[FILE, ...])")) from exc
    missing = [p for p in parts if p not in own.parts]  # SD 3's T5, which a file filled at load: none to go back to
    if missing:
        what = "VAE" if arg == "vae" else "text encoder"
        raise PartNotOwned(f"{{@{arg}}}: {opened.path.name} holds no {what} of its own for {', '.join(missing)}",
                         where=str(opened.path), fix=f"keep a {what} file for it, or load the model again without one")
    return {p: {n: w.ref(n) for n in w} for p, (_, w) in own.parts.items() if p in parts}


def set_part_files(pipe: Pipeline, vae: PathLike | None = _KEEP, text_encoders: Any = _KEEP,
                   again: Iterable[PathLike] = ()) -> list[str]:
    """Which separate files fill a loaded pipeline's VAE and text encoders from now on, as ``pipelines.load(model,
    vae=, text_encoders=)`` would have them: ``vae`` a file, or None for the model's own VAE; ``text_encoders`` a
    list of files (each fills the part its tensors say; a text encoder no file names runs the model's own again).
    An argument left out keeps what runs. Every file is checked before anything changes; a part whose file changes
    has its sessions closed, so its next run compiles with the new weights, as a pipeline loaded with that file
    does (bit for bit); the other parts (the UNet or transformer) keep theirs. Returns the parts that changed.
    ``again``: files read again although the parts run them already (written anew on disk under their name)."""
    state = pipe.weights
    reread = {Path(f) for f in again}
    vae_parts = [p for p in pipe.parts if p.startswith("vae")]
    text_parts = [p for p in pipe.parts if p.startswith("text_encoder")]
    wanted: dict[str, Path | None] = {}
    vae_file = None if vae is _KEEP else vae
    encoders = [] if text_encoders is _KEEP or text_encoders is None else (
        list(one_or_many(text_encoders)))
    planned, files = _plan_files(pipe, vae_file, encoders)  # checks every file first
    by_file = {p: f.path for f in files for p in f.parts if p in planned}
    if vae is not _KEEP:
        wanted.update({p: by_file.get(p) for p in vae_parts})
    if text_encoders is not _KEEP:
        wanted.update({p: by_file.get(p) for p in text_parts})
    changed = {p: f for p, f in wanted.items() if state.part_files.get(p) != (Path(f) if f is not None else None)
               or (f is not None and Path(f) in reread)}
    todo: dict[str, Mapping[str, Any] | None] = {p: planned[p] for p, f in changed.items() if f is not None}
    back = [p for p, f in changed.items() if f is None]
    main = [p for p in back if state.own_base.get(p) == MAIN_FILE]
    if main:
        for arg, group in (("vae", [p for p in main if p in vae_parts]), ("text_encoders", [p for p in main
                                                                                             if p in text_parts])):
            if group:
                todo.update(_own_of_main(pipe, group, arg))
    for p in back:
        if p not in todo:
            todo[p] = None
    if not todo:
        return []
    for p in todo:  # closed: the next run compiles with the new weights, as a freshly loaded pipeline does
        part = pipe.parts[p]
        part.close()
        part.weights = part.default_weights
        default = part.default_weights
        part.weights_factory = None if default is None else (lambda default=default: default)
        state._lora_parts.discard(p)
    _bind_planned(pipe, todo, {p: changed[p] for p in todo})
    for p in main:  # the main file's own weights are its base now, as any model's own
        state.own_base.pop(p, None)
    log.info("%s: %s", pipe.folder.name, ", ".join(f"{p} {'from ' + changed[p].name if changed[p] else 'own'}"
                                                    for p in sorted(todo)))
    return sorted(todo)


# -- ControlNet on a single file ----------------------------------------------------------------------
def denoiser_graph(folder: ModelFolder, control: bool) -> Path | None:
    """The shipped UNet graph a single-file pipeline runs: its twin with ControlNet residual inputs
    (``sdrt.checkpoint.controlnet.CONTROLNET_UNET_GRAPHS``: the same parameters and initializer names) when
    ``control``, else the plain one. None when the folder is not a single file on a shipped SD 1.x/SDXL UNet
    (an ONNX folder, an inpainting UNet, ``graph_paths`` of one's own)."""
    from ..checkpoint.controlnet import CONTROLNET_UNET_GRAPHS
    from ..checkpoint.families import FAMILY_GRAPHS
    from ..checkpoint.graphs import shipped_graph

    opened = getattr(folder, "single_file", None)
    if opened is None or opened.family not in CONTROLNET_UNET_GRAPHS:
        return None
    plain = shipped_graph(FAMILY_GRAPHS[opened.family]["unet"])
    if folder.parts.get("unet") != plain:
        return None  # the caller bound the file onto a graph of their own
    return shipped_graph(CONTROLNET_UNET_GRAPHS[opened.family]) if control else plain
