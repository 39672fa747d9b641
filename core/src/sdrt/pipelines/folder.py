"""A diffusers / Optimum ONNX model folder: which parts it has, which family it is, its configs.

Reading a folder touches only its JSON files and checks that each part's ``model.onnx``
exists; the graphs are loaded later, by :class:`sdrt.pipelines.parts.Part`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, ModelError, ModelNotFoundError
from .families import by_name, detect, registered

log = logging.getLogger("sdrt.pipelines.folder")

#: the parts a folder may hold (Optimum's names): every registered family's (sdrt.pipelines.families)
PART_NAMES = ("text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer", "vae_encoder", "vae_decoder")

#: sdrt.checkpoint's family of a single file -> the pipeline family (sdrt.pipelines.families) that runs it
PIPELINE_FAMILY = {"sd1": "sd1", "sd1-inpaint": "sd1", "sd1-ip2p": "sd1", "sd2": "sd2", "sd2-inpaint": "sd2", "sdxl": "sdxl", "sdxl-inpaint": "sdxl",
                   "sdxl-ip2p": "sdxl",
                   "sdxl-refiner": "sdxl-refiner", "sd3-medium": "sd3", "sd35-medium": "sd3",
                   "sd35-large": "sd3", "flux-dev": "flux",
                   "flux-schnell": "flux", "flux-fill": "flux", "flux-control": "flux", "chroma": "chroma"}

#: SD's scheduler when a folder has no scheduler/scheduler_config.json (the SD 1.5 release config)
DEFAULT_SCHEDULER: dict[str, Any] = {
    "_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000, "prediction_type": "epsilon", "set_alpha_to_one": False, "steps_offset": 1,
}


def no_t5(fam: Any, parts: Mapping[str, Any], where: Path) -> None:
    """One warning when a family that can run without its T5 encoder (SD3) has none: a single file takes a T5-XXL
    file beside it; a folder's parts are its own, so there the fix is the folder's text_encoder_3/."""
    if any(e.kind == "t5" and e.part not in parts and e.part in fam.optional for e in fam.encoders):
        from ..errors import in_caller_words

        fix = ("add the release's text_encoder_3/ and tokenizer_3/ to the folder" if where.is_dir() else
               in_caller_words("pass a T5-XXL file with {@text_encoders} (t5xxl_fp16.safetensors)"))
        log.warning("%s has no T5 text encoder: %s runs on CLIP-L and CLIP-G alone (T5's states zeros, as diffusers' "
                    "text_encoder_3=None), and follows long prompts worse; %s", where, fam.label, fix)


def without_t5(folder: ModelFolder, t5: Any, text_encoders: Any = ()) -> ModelFolder:
    """``t5=False``: the folder without its T5 part (SD3, whose T5 is optional), so it is neither loaded nor
    counted in the memory plan; T5's states are zeros (``textcond.ZeroT5``). A T5 file among ``text_encoders`` is
    refused: dropped, it would be ignored without a word."""
    if t5 is True:
        return folder
    fam = folder.family_class
    if t5 is not False:
        raise InputError(f"t5 must be True or False, got {t5!r}", where="t5", fix="pass t5=False to run without T5")
    parts = [e.part for e in fam.encoders if e.kind == "t5"]
    if not parts or any(p not in fam.optional for p in parts):
        raise InputError(f"{{@t5=}}False runs SD 3 / 3.5 without T5-XXL, and {fam.label} "
                         + ("has no T5 encoder" if not parts else "needs its T5 encoder"), where="t5",
                         fix="leave T5 on for this model (drop {@t5=}False)")
    from ..checkpoint.files import is_t5_file

    t5_file = next((f for f in text_encoders if is_t5_file(f)), None)
    if t5_file is not None:
        raise InputError(f"{{@text_encoders}} {Path(t5_file).name} is a T5-XXL text encoder, and {{@t5=}}False leaves "
                         "T5 out", where="t5", fix="drop {@t5=}False to run with this T5, or leave the file out")
    log.info("%s: T5 left out (t5=False): %s runs on its CLIP encoders alone", folder.path.name, fam.label)
    return dataclasses.replace(folder, parts={k: v for k, v in folder.parts.items() if k not in parts},
                               weights={k: v for k, v in folder.weights.items() if k not in parts})


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A model folder's JSON file as a dict, or one ``ModelError`` naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read the {what}: {exc}", where=str(path), fix="check the file") from exc
    except json.JSONDecodeError as exc:
        raise ModelError(f"the {what} is not valid JSON ({exc.msg} at line {exc.lineno})", where=str(path),
                         fix="repair or re-export the model folder") from exc
    if not isinstance(data, dict):
        raise ModelError(f"the {what} is not a JSON object", where=str(path), fix="repair or re-export the folder")
    return data


@dataclass(frozen=True)
class ModelFolder:
    """What a model folder holds. Build one with :meth:`ModelFolder.open` (a diffusers folder of
    ``.safetensors`` with no ONNX parts opens onto the shipped graphs: :meth:`ModelFolder.from_diffusers`).

    - ``family``: the family's name (``"sd1"``, ``"sd2"``, ``"sdxl"``); ``family_class`` the
      :class:`sdrt.pipelines.families.Family` that declares it.
    - ``parts``: part name -> its ``model.onnx``; ``configs``: part name -> its ``config.json`` (or ``{}``).
    - ``tokenizers``: ``tokenizer`` (and ``tokenizer_2`` for SDXL) folders.
    - ``scheduler``: ``scheduler/scheduler_config.json`` (SD's defaults when absent).
    """

    path: Path
    index: dict[str, Any]
    family: str
    parts: dict[str, Path]
    configs: dict[str, dict[str, Any]]
    tokenizers: dict[str, Path]
    scheduler: dict[str, Any] = field(default_factory=dict)
    family_class: Any = None
    #: a single file's parts: ``{part: Weights}`` bound onto the weight-free graphs of ``parts``
    weights: dict[str, Any] = field(default_factory=dict)
    #: the ``sdrt.checkpoint.OpenedModel`` this folder stands for (``from_single_file``), else None
    single_file: Any = None
    #: the separate VAE file given with a single file (PNG ``VAE``/``VAE hash``), else None
    vae_file: Path | None = None

    @property
    def prediction(self) -> str:
        """``"eps"``, ``"v"`` or ``"x0"`` (``"sample"``), from the scheduler config's ``prediction_type``; ``"flow"``
        for a flow scheduler."""
        from .scheduling import FLOW_SCHEDULERS, PREDICTIONS

        if self.scheduler.get("_class_name") in FLOW_SCHEDULERS:
            return "flow"
        kind = str(self.scheduler.get("prediction_type", "epsilon"))
        if kind in PREDICTIONS:
            return PREDICTIONS[kind]
        raise ModelError(f"prediction_type {kind!r} is not supported", where=str(self.path / "scheduler"),
                         fix="use a model trained for 'epsilon', 'v_prediction' or 'sample'")

    @property
    def is_xl(self) -> bool:
        return self.family == "sdxl"

    @property
    def name(self) -> str:
        """The folder's name; a single file's stem (A1111's ``Model:``)."""
        return str(self.single_file.name) if self.single_file is not None else self.path.name

    @property
    def vae_scaling_factor(self) -> float:
        return self.family_class(self).scaling[0]

    @property
    def force_zeros_for_empty_prompt(self) -> bool:
        return bool(self.index.get("force_zeros_for_empty_prompt", self.family_class.zeros_for_empty_negative))

    def part_file(self, part: str) -> Path:
        """The part's ``model.onnx``; ``ModelError`` naming the part when the folder has none."""
        path = self.parts.get(part)
        if path is None:
            raise ModelNotFoundError(
                f"the model folder has no {part} part", where=str(self.path / part / "model.onnx"),
                fix=f"export the {part} too (Optimum: optimum-cli export onnx ...), "
                    + ("or generate without an init image, a mask or a ControlNet unit that encodes its picture "
                       "(inpaint_only, tile_colorfix)" if part == "vae_encoder" else "or pick another folder"),
            )
        return path

    @classmethod
    def from_single_file(cls, opened: Any, *, tokenizers: Mapping[str, str | os.PathLike[str]] | None = None,
                         vae_file: Path | None = None) -> ModelFolder:
        """The folder of a single file opened with ``sdrt.checkpoint.open_single_file``: its parts are the
        weight-free graphs with the file's ``Weights`` bound (``weights``), its scheduler, tokenizers and VAE
        scaling the release's; ``tokenizers`` replaces release tokenizer folders by name. Build one from a
        path with ``sdrt.pipelines.load(FILE)`` (``singlefile.folder_from_file``)."""
        from ..checkpoint.files import release_tokenizer

        fam = by_name(PIPELINE_FAMILY[opened.family])
        release = opened.release
        denoiser: dict[str, Any] = {"sample_size": int(release.get("sample_size", fam.default_size)) // fam.vae_factor}
        if opened.family.startswith("flux"):
            # schnell: no guidance input, T5 length 256; FLUX.1 Tools (Fill, Canny/Depth) are dev with wider inputs
            denoiser["guidance_embeds"] = opened.family != "flux-schnell"
        configs: dict[str, dict[str, Any]] = {}
        for part in opened.parts:
            if part in ("unet", "transformer"):
                configs[part] = dict(denoiser)
                if part == "unet":  # the sides it makes (Pipeline._size_multiple) and why it refuses one
                    blocks = unet_blocks(opened.parts[part][1])
                    if blocks:
                        configs[part]["block_out_channels"] = blocks
            else:
                configs[part] = dict(release.get("vae", {})) if part.startswith("vae") else {}
        given = {k: Path(v) for k, v in (tokenizers or {}).items()}
        toks = {tok: given.get(tok) or release_tokenizer(name) for tok, name in release["tokenizers"].items()}
        missing = [e.tokenizer for e in fam.encoders if e.tokenizer not in toks]
        if missing:
            raise ModelError(f"the {opened.family} release defaults name no {', '.join(missing)}",
                             where="sdrt/data/release/families.json", fix="reinstall sdrt")
        folder = cls(opened.path, {}, fam.name, {p: g for p, (g, _) in opened.parts.items()}, configs, toks,
                     opened.scheduler_config(), fam, weights={p: w for p, (_, w) in opened.parts.items()},
                     single_file=opened, vae_file=vae_file)
        no_t5(fam, opened.parts, opened.path)
        folder.prediction  # noqa: B018 - validates prediction_type now, before any model loads
        log.info("%s: %s (%s-prediction), shipped graphs for %s", opened.path.name, fam.name, folder.prediction,
                 ", ".join(folder.parts))
        return folder

    @classmethod
    def from_diffusers(cls, path: str | os.PathLike[str], *,
                       graph_paths: Mapping[str, str | os.PathLike[str]] | None = None,
                       tokenizers: Mapping[str, str | os.PathLike[str]] | None = None,
                       prediction: str | None = None) -> ModelFolder:
        """A diffusers folder of ``.safetensors`` (no ONNX parts), bound onto the shipped graphs by
        ``sdrt.checkpoint.open_diffusers_folder`` as a single file is, but with the folder's own scheduler,
        VAE scaling and tokenizers (``tokenizer*/``; ``tokenizers`` replaces them by name) and its
        ``model_index.json``."""
        from ..checkpoint.diffusers_folder import has_tokenizer, open_diffusers_folder

        root = Path(path)
        opened = open_diffusers_folder(root, graph_paths=dict(graph_paths) if graph_paths else None,
                                       prediction=prediction)
        fam = by_name(PIPELINE_FAMILY[opened.family])
        own: dict[str, str | os.PathLike[str]] = {}
        for enc in fam.encoders:
            if enc.part not in opened.parts and enc.part in fam.optional:  # SD3 without T5: no tokenizer_3 either
                continue
            if has_tokenizer(root / enc.tokenizer, enc.kind):
                own[enc.tokenizer] = root / enc.tokenizer
            else:
                log.warning("%s has no usable %s/; using the %s release's", root, enc.tokenizer, fam.label)
        folder = cls.from_single_file(opened, tokenizers={**own, **(tokenizers or {})})
        index_path = root / "model_index.json"
        index = read_json(index_path, "model_index.json") if index_path.is_file() else {}
        return dataclasses.replace(folder, index=index)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ModelFolder:
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(f"the model folder must be a path, got {type(path).__name__}", where="folder",
                             fix="pass the model folder's path, e.g. pipelines.load('path/to/sd15-onnx')")
        root = Path(path)
        from ..checkpoint.diffusers_folder import WEIGHT_FOLDERS, is_diffusers_folder

        names = dict.fromkeys([*PART_NAMES, *(p for f in registered().values() for p in f.parts), *WEIGHT_FOLDERS])
        for folder in (root, *(root / n for n in names)):  # else a PermissionError traceback from a glob or a stat
            if folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK):
                raise ModelError(f"cannot read the {'model' if folder == root else folder.name} folder (Permission "
                                 "denied)", where=str(folder),
                                 fix="check the folder's permissions (it needs read and search: chmod u+rx)")
        if is_diffusers_folder(root):  # .safetensors parts, no ONNX: onto sdrt's shipped graphs
            return cls.from_diffusers(root)
        if not root.is_dir():
            from .png import _kind

            kind = _kind(root.stat().st_mode) if root.exists() else None
            if kind:  # /dev/null, a FIFO: not "does not exist"
                raise ModelNotFoundError(f"{root} is {kind}, not a model folder or file", where=str(root),
                                         fix="pass the model folder, or its .safetensors checkpoint")
            if root.suffix == ".onnx" or root.is_file():
                raise ModelError("a pipeline needs a model folder or a .safetensors checkpoint, not one .onnx graph",
                                 where=str(root),
                                 fix="pass the folder that holds model_index.json, unet/, text_encoder/, vae_decoder/")
            if root.suffix.lower() in (".safetensors", ".gguf", ".ckpt"):
                raise ModelNotFoundError("the model file does not exist", where=str(root), fix="check the path")
            raise ModelNotFoundError("the model folder does not exist", where=str(root), fix="check the path")
        index_path = root / "model_index.json"
        index = read_json(index_path, "model_index.json") if index_path.is_file() else {}
        from ..checkpoint.diffusers_folder import refuse_foreign

        refuse_foreign(root, index)  # a folder of a pipeline sdrt does not run (Wan, PixArt...), named
        parts: dict[str, Path] = {}
        configs: dict[str, dict[str, Any]] = {}
        names = dict.fromkeys([*PART_NAMES, *(p for f in registered().values() for p in f.parts)])
        for part in names:
            model = root / part / "model.onnx"
            if model.is_file():
                parts[part] = model
                config = root / part / "config.json"
                configs[part] = read_json(config, f"{part} config.json") if config.is_file() else {}
            elif (root / part).is_dir():
                raise ModelNotFoundError(f"the {part} folder has no model.onnx", where=str(model),
                                         fix="export that part to ONNX again (Optimum's layout: PART/model.onnx), "
                                             "or download the diffusers folder's .safetensors into it")
        fam = detect(index, set(parts), configs, root) or registered()["sd1"]
        missing = [p for p in fam.parts if p not in parts and p not in fam.optional]
        if missing and not index and not parts:  # a folder of model folders (onnx/ and diffusers/ side by side)
            inner = sorted(d.name for d in root.iterdir() if d.is_dir() and (d / "model_index.json").is_file())
            if inner:
                raise ModelNotFoundError(
                    f"the folder holds model folders, not a model: {', '.join(f'{n}/' for n in inner[:6])}",
                    where=str(root), fix=f"pass one of them: {root / inner[0]}")
        if missing:
            what = "no model_index.json and " if not index else ""
            raise ModelNotFoundError(
                f"the model folder lacks {', '.join(missing)} ({what}not a complete diffusers/Optimum ONNX folder)",
                where=", ".join(str(root / p / "model.onnx") for p in missing),
                fix="export every part (optimum-cli export onnx --model ID FOLDER), or point at the right folder",
            )
        no_t5(fam, parts, root)
        tokenizers: dict[str, Path] = {}
        kinds = {e.tokenizer: e.kind for e in fam.encoders}
        absent = {e.tokenizer for e in fam.encoders if e.part not in parts and e.part in fam.optional}
        for tok in dict.fromkeys(e.tokenizer for e in fam.encoders if e.tokenizer not in absent):
            folder = root / tok
            if kinds[tok] == "t5":
                if not any((folder / f).is_file() for f in ("tokenizer.json", "spiece.model")):
                    raise ModelNotFoundError(f"the model folder's {tok} has no tokenizer.json or spiece.model (T5)",
                                             where=str(folder), fix="copy the tokenizer folder of the original model")
                tokenizers[tok] = folder
                continue
            lacking = [f for f in ("vocab.json", "merges.txt") if not (folder / f).is_file()
                       and not (folder / f"{f}.gz").is_file()]
            if lacking:  # which one: "no vocab.json and merges.txt" was said of a folder missing one, or none at all
                what = (f"has no {tok}/ folder (its CLIP tokenizer: vocab.json and merges.txt)" if not folder.is_dir()
                        else f"{tok}/ lacks {' and '.join(lacking)}")
                raise ModelNotFoundError(f"the model folder {what}", where=str(folder),
                                         fix="copy the tokenizer folder of the original model")
            tokenizers[tok] = folder
        sched_path = root / "scheduler" / "scheduler_config.json"
        if sched_path.is_file():
            scheduler = read_json(sched_path, "scheduler config")
        else:
            log.warning("%s has no scheduler/scheduler_config.json; using SD's release schedule", root)
            scheduler = dict(DEFAULT_SCHEDULER)
        family = fam.name
        folder = cls(root, index, family, parts, configs, tokenizers, scheduler, fam)
        folder.prediction  # noqa: B018 - validates prediction_type now, before any model loads
        log.info("%s: %s (%s-prediction), parts %s", root, family, folder.prediction, ", ".join(parts))
        return folder


def unet_blocks(weights: Any) -> list[int]:
    """A UNet's ``block_out_channels`` read from its bound weights (``down_blocks.N.resnets.0.conv1.weight``'s
    output channels): a single file's UNet has no config.json, and the number of down blocks sets the multiple of
    its sides (64 pixels for SD 1.x/2.x and the SDXL refiner, 32 for SDXL). Empty when the names do not show it."""
    import re

    shapes = weights.shapes() if weights is not None and hasattr(weights, "shapes") else {}
    found: dict[int, int] = {}
    for name, shape in shapes.items():  # the name may carry a prefix (an export's "unet.")
        m = re.search(r"(?:^|\.)down_blocks\.(\d+)\.resnets\.0\.conv1\.weight$", name)
        if m and len(shape) == 4:
            found[int(m.group(1))] = int(shape[0])
    out = []
    while len(out) in found:
        out.append(found[len(out)])
    return out
