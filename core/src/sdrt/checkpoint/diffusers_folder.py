"""A diffusers folder of ``.safetensors`` as the hub serves it, bound onto sdrt's shipped weight-free graphs.

    model = open_diffusers_folder("stable-diffusion-v1-5")     # no ONNX parts: unet/, text_encoder/, vae/ ...
    model.family                                               # "sd1", "sdxl", "flux-dev", ...

The layout: ``model_index.json``; ``unet/`` or ``transformer/`` holding ``diffusion_pytorch_model.safetensors``
(or its shards ``diffusion_pytorch_model-00001-of-00002.safetensors`` with their ``.index.json``, and/or the
``.fp16`` variant; or, in older folders, ``diffusion_pytorch_model.bin``, read by ``sdrt.weights.torchfile``);
``text_encoder*/model.safetensors`` (or ``pytorch_model.bin``; transformers' names); ``vae/`` (diffusers' names);
``tokenizer*/`` and ``scheduler/scheduler_config.json``. Of a part's variants the plain one is taken, else fp16
(as ``Checkpoint._open_folder`` does for ``--weights``).

The names are already the canonical ones ``onnxmap.param_map`` reads from the graphs (diffusers' for the
denoiser and VAE, transformers' for the text encoders), so each part binds through ``Checkpoint.lazy`` like a
single file's. The family comes from the denoiser's tensors (SDXL's ``add_embedding``, SD 2.x's linear
``proj_in``, 9 input channels for inpainting, Flux's ``single_transformer_blocks``...), checked against
``model_index.json``'s ``_class_name``. Unlike a single file, the folder's own scheduler config, VAE
``config.json`` (``scaling_factor``, ``shift_factor``, and ``latents_mean`` / ``latents_std``: Playground v2.5)
and denoiser ``sample_size`` are used; its tokenizers
are taken by the pipeline (``sdrt.pipelines.ModelFolder.from_diffusers``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError, ModelNotFoundError, SdrtError, WeightsError
from ..weights import Weights, folder_files
from . import components, foreign
from .families import FAMILY_GRAPHS, LABELS, PART_KINDS
from .families import diffusers_denoiser as denoiser_family
from .files import OpenedModel, graph_kind, release_defaults, stored_type
from .graphs import shipped_graph
from .hashing import model_hash
from .ldm import Source
from .single_file import Checkpoint, with_own_constants

log = logging.getLogger("sdrt.checkpoint.diffusers_folder")

PathLike = str | os.PathLike[str]
DENOISERS = ("unet", "transformer")
#: the part folders whose .safetensors make a folder a diffusers folder of weights
WEIGHT_FOLDERS = ("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae")
#: model_index.json's ``_class_name`` (its start) -> the families it may be (first match wins)
PIPELINE_CLASSES = (("StableDiffusionXLInstructPix2Pix", ("sdxl-ip2p",)),
                    ("StableDiffusionXL", ("sdxl", "sdxl-inpaint", "sdxl-refiner")),
                    ("StableDiffusion3", ("sd3-medium", "sd35-medium", "sd35-large")),
                    ("FluxFill", ("flux-fill",)), ("FluxControlNet", ("flux-dev", "flux-schnell")),
                    ("FluxControl", ("flux-control",)),
                    ("Flux", ("flux-dev", "flux-schnell", "flux-fill", "flux-control")), ("Chroma", ("chroma",)),
                    ("StableDiffusionInstructPix2Pix", ("sd1-ip2p",)),
                    ("StableDiffusion", ("sd1", "sd1-inpaint", "sd2", "sd2-inpaint")))
#: the families of diffusers folders sdrt runs, in words (for messages)
RUNS = "SD 1.x, SD 2.x, SDXL, SD 3 Medium, SD 3.5, Flux.1 and Chroma"
_SHARD = re.compile(r"-\d{5}-of-\d{5}")
_FLOW = ("FlowMatchEulerDiscreteScheduler",)
#: what the pipelines read of the folder's ``vae/config.json``
VAE_KEYS = ("scaling_factor", "shift_factor", "latents_mean", "latents_std")


def weight_files(folder: Path) -> list[Path]:
    """A part folder's weights: its one ``.safetensors`` file or all its shards, the plain variant first, else
    ``fp16``, else another (``bf16``...). Shards an ``.index.json`` lists but the folder lacks are an error."""
    groups: dict[str, list[Path]] = {}
    for f in folder_files(folder):  # .safetensors, else PyTorch .bin files
        name = _SHARD.sub("", f.name)  # diffusion_pytorch_model[.fp16].safetensors
        groups.setdefault(".".join(name.split(".")[1:-1]), []).append(f)
    if not groups:
        return []
    chosen = groups.get("") or groups.get("fp16") or groups[sorted(groups)[0]]
    names = {f.name for f in chosen}
    for index in sorted(folder.glob("*.index*.json")):
        try:
            listed = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelError(f"cannot read the shard index {index.name}: {exc}", where=str(index),
                             fix="re-download the folder") from exc
        if listed & names and listed - names:
            raise ModelNotFoundError(f"the {folder.name} folder lacks shards its {index.name} lists: "
                                     f"{', '.join(sorted(listed - names))}", where=str(folder),
                                     fix="re-download the missing files")
    return chosen


def denoiser_files(root: Path) -> list[Path]:
    """The files of a diffusers folder's ``unet/`` or ``transformer/`` (``weight_files``), or [] when none."""
    return next((fs for d in DENOISERS if (fs := weight_files(root / d))), [])


def is_diffusers_folder(path: object) -> bool:
    """Whether ``path`` is a folder of diffusers ``.safetensors`` parts with no ONNX part (``PART/model.onnx``)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    root = Path(path)
    try:
        if not root.is_dir() or any(root.glob("*/model.onnx")):
            return False
        return any(folder_files(root / d) for d in WEIGHT_FOLDERS)
    except PermissionError:  # an unreadable folder: ModelFolder.open says which
        return False


def has_tokenizer(folder: Path, kind: str) -> bool:
    """Whether a tokenizer folder holds what sdrt reads: T5's ``tokenizer.json`` or ``spiece.model``, CLIP's
    ``vocab.json`` and ``merges.txt``, or its ``tokenizer.json`` alone (transformers 5 saves only that)."""
    if kind == "t5":
        return any((folder / f).is_file() for f in ("tokenizer.json", "spiece.model"))
    return (folder / "tokenizer.json").is_file() or all(
        (folder / f).is_file() or (folder / f"{f}.gz").is_file() for f in ("vocab.json", "merges.txt"))


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the {what}: {exc}", where=str(path), fix="re-download the folder") from exc
    if not isinstance(data, dict):
        raise ModelError(f"the {what} is not a JSON object", where=str(path), fix="re-download the folder")
    return data


@dataclass
class DiffusersModel(OpenedModel):
    """``OpenedModel`` of a diffusers folder: ``path`` is the folder, ``release`` its own configs."""

    denoiser_file: Path | None = None
    #: every file the parts' weights come from (all shards), for the size of the model
    all_files: tuple[Path, ...] = ()

    @property
    def name(self) -> str:
        """The PNG's ``Model:``: the folder's name."""
        return self.path.name

    @property
    def model_hash(self) -> str:
        """A1111's short hash (first 10 hex digits of the SHA-256, cached) of the denoiser's (first) file."""
        return model_hash(self.denoiser_file or self.path)[:10]


def foreign_folder(root: Path, index: dict[str, Any]) -> str | None:
    """What a diffusers folder of a pipeline sdrt does not run is (``model_index.json``'s ``_class_name``), in
    words, or None. (An EDM scheduler on an SDXL pipeline, Playground v2.5, runs: ``sdrt.samplers.EDMSchedule``.)"""
    cls_name = str(index.get("_class_name", ""))
    what = foreign.pipeline_class(cls_name)
    if what is not None:
        return f"{what} (model_index.json: {cls_name})"
    return None


def refuse_foreign(root: Path, index: dict[str, Any]) -> None:
    """One ``ModelError`` for a diffusers folder of a pipeline sdrt does not run (``foreign_folder``)."""
    what = foreign_folder(root, index)
    if what is not None:
        raise ModelError(f"the diffusers folder {root.name} is {what}, which sdrt does not run", where=str(root),
                         fix=f"sdrt runs folders of {RUNS}: pass one of those")


def _no_t5(root: Path, index: dict[str, Any]) -> bool:
    """Whether an SD3 folder is meant to run without T5: ``model_index.json`` names none (``"text_encoder_3":
    [null, null]``, as diffusers saves ``text_encoder_3=None``), or names none and has no ``text_encoder_3/``.
    A ``text_encoder_3/`` without weights, or one the index names, is an incomplete download and refused."""
    entry = index.get("text_encoder_3", None)
    named = isinstance(entry, list) and any(e is not None for e in entry)
    return not named and not (root / "text_encoder_3").is_dir()  # asked only when it holds no weights


def _open(files: list[Path], part: str) -> Weights:
    try:
        return Weights.open(files)
    except SdrtError as exc:
        raise type(exc)(f"cannot open the {part} weights ({', '.join(f.name for f in files)}): {exc.what}",
                        where=str(files[0].parent), fix="re-download the folder (a file may be truncated)") from exc


def open_diffusers_folder(path: PathLike, *, graph_paths: dict[str, PathLike] | None = None,
                          prediction: str | None = None) -> DiffusersModel:
    """Open a diffusers folder of ``.safetensors`` onto sdrt's shipped graphs (``graph_paths={part: .onnx}``
    binds onto others with the same parameter names). Headers only; every part is checked against its graph
    before anything compiles; one ``SdrtError`` naming the part for anything that cannot run."""
    from ..graph import Graph

    root = Path(path)
    index_path = root / "model_index.json"
    index = _read_json(index_path, "model_index.json") if index_path.is_file() else {}
    refuse_foreign(root, index)
    den = next((d for d in DENOISERS if (root / d).is_dir()), None)
    files = weight_files(root / den) if den else []
    if not files:
        where = root / (den or "unet")
        raise ModelNotFoundError(f"the diffusers folder's {den or 'unet or transformer'} holds no .safetensors "
                                 "(and the folder has no ONNX parts)", where=str(where),
                                 fix="download the denoiser's diffusion_pytorch_model.safetensors (or its shards) "
                                     "into it, or pass an ONNX export")
    dw = _open(files, den)
    shapes = dw.shapes()
    fam, looks = denoiser_family(shapes)
    if fam is None:
        raise ModelError(f"the {den} of this diffusers folder is {looks}", where=str(root / den),
                         fix=f"sdrt runs folders of {RUNS}: pass one of those")
    if fam == "sdxl" and index.get("requires_aesthetics_score") is True:  # a refiner at other widths (graph_paths)
        fam, looks = "sdxl-refiner", "an SDXL refiner UNet (model_index.json: requires_aesthetics_score)"
    cls_name = str(index.get("_class_name", ""))
    allowed = next((fams for prefix, fams in PIPELINE_CLASSES if cls_name.startswith(prefix)), None)
    if cls_name and allowed is not None and fam not in allowed:
        raise ModelError(f"model_index.json names {cls_name} and the {den}'s tensors are {looks}",
                         where=str(index_path), fix="repair model_index.json or the folder's parts")
    graphs = FAMILY_GRAPHS[fam]
    # configs: the folder's own scheduler, VAE scaling and image size
    sched_path = root / "scheduler" / "scheduler_config.json"
    release = dict(release_defaults(fam))
    if sched_path.is_file():
        release["scheduler"] = _read_json(sched_path, "scheduler config")
    else:
        log.warning("%s has no scheduler/scheduler_config.json; using the %s release's", root, LABELS[fam])
    vae_cfg = root / "vae" / "config.json"
    if vae_cfg.is_file():
        cfg = _read_json(vae_cfg, "VAE config.json")
        release["vae"] = {k: cfg[k] for k in VAE_KEYS if cfg.get(k) is not None}
    den_cfg = root / den / "config.json"
    if den_cfg.is_file():
        size = _read_json(den_cfg, f"{den} config.json").get("sample_size")
        if isinstance(size, int) and size > 0 and not fam.startswith(("flux", "chroma")):  # in latents
            release["sample_size"] = size * 8
    if prediction is None:
        kind = release["scheduler"].get("_class_name")
        prediction = "flow" if kind in _FLOW else str(release["scheduler"].get("prediction_type", "epsilon"))
    elif prediction in ("epsilon", "v_prediction"):
        release["scheduler"] = {**release["scheduler"], "prediction_type": prediction}
    elif prediction == "sample":  # x0, with the trailing timesteps a few-step x0 model is run with
        from .files import X0_SCHEDULER

        release["scheduler"] = {**release["scheduler"], **X0_SCHEDULER}
    else:
        raise ModelError(f"unknown prediction {prediction!r}", where="prediction",
                         fix="use 'epsilon', 'v_prediction' or 'sample'")
    # each part: its folder's files and the canonical names of their tensors
    bound: dict[str, tuple[Path, Weights]] = {}
    used: dict[str, Path] = {}
    dtypes: dict[str, set[str]] = {}
    problems: list[str] = []
    opened: dict[str, Weights] = {den: dw}
    every: list[Path] = list(files)
    for part, gname in graphs.items():
        sub = "vae" if part.startswith("vae") else part
        comp = "vae" if sub == "vae" else part
        if sub not in opened:
            pf = weight_files(root / sub)
            if not pf:
                if part == "vae_encoder":
                    continue
                if part == "text_encoder_3" and fam.startswith("sd3") and _no_t5(root, index):
                    continue  # SD 3 without T5 (diffusers' text_encoder_3=None): zeros in its place, one warning
                what = "the denoiser" if sub in DENOISERS else PART_KINDS.get(graph_kind(gname), sub)
                raise ModelNotFoundError(f"the diffusers folder has no {sub} weights ({LABELS[fam]} needs {what})",
                                         where=str(root / sub), fix=f"download {sub}/ with its .safetensors")
            opened[sub] = _open(pf, sub)
            every += pf
        w = opened[sub]
        wshapes = w.shapes()
        if sub in DENOISERS:
            srcs, unknown = {k: Source(k) for k in w}, []
        elif sub == "vae":
            srcs, unknown = components.convert_vae_any(wshapes)
        elif graph_kind(gname) == "t5xxl":
            srcs, unknown = components.convert_t5(list(w))
        else:
            srcs, unknown = components.convert_clip(list(w))
        if unknown:
            log.warning("%s/%s: %d keys not used: %s", root.name, sub, len(unknown), ", ".join(unknown[:5]))
        gpath = Path(graph_paths[part]) if graph_paths and part in graph_paths else shipped_graph(gname)
        graph = Graph.load(gpath)
        ck = Checkpoint(w, {comp: srcs}, f"{LABELS[fam]} ({sub})", root / sub)
        try:
            (refs,) = ck.lazy({part: graph}).values()
        except WeightsError as exc:
            problems.append(exc.what)
            continue
        first = Path(next(iter(w.ref(k).source for k in w)))
        bound[part] = (gpath, with_own_constants(graph, refs, first))
        used[part] = first
        dtypes[part] = {stored_type(w.ref(s.key)) for s in srcs.values()}
    if problems:
        raise WeightsError("; ".join(problems)[:2000], where=str(root),
                           fix=f"the folder does not match the {LABELS[fam]} architecture sdrt ships; check it "
                               "loads in diffusers")
    log.info("%s: diffusers folder, %s (%s), parts %s", root.name, LABELS[fam], prediction, ", ".join(bound))
    return DiffusersModel(fam, f"{LABELS[fam]} (diffusers folder)", prediction, release, bound, used, root, dtypes,
                          denoiser_file=files[0], all_files=tuple(every))
