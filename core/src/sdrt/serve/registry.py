"""Model, LoRA and embedding names, resolved only inside the configured folders.

A request names things; it never gives a path. Every name is looked up in a listing of the
configured folder (exact name, A1111 title ``"name [hash]"``, or the name without case), so
``../x``, absolute paths and anything not listed are refused before the filesystem is touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ApiError, in_request_words

log = logging.getLogger("sdrt.serve.registry")


@dataclass(frozen=True)
class ModelEntry:
    """A servable model: an ONNX model folder, a single-file checkpoint served on its own on sdrt's
    shipped graphs (``path`` is the file), or a single-file checkpoint (``weights``) bound onto the ONNX
    folder ``path`` of its architecture (``--checkpoint-base``)."""

    name: str
    path: Path
    hash: str
    weights: Path | None = None
    #: a file that lacks its text encoders or VAE (a transformer-only Flux file): what it lacks (it runs once a
    #: request chooses them: sdrt.serve.modules)
    needs: str | None = None
    #: the separate VAE and text-encoder files a request chose (sdrt.serve.modules.choose), and its field
    vae: Path | None = None
    text_encoders: tuple[Path, ...] = ()
    module_field: str | None = None

    @property
    def title(self) -> str:
        """A1111's checkpoint title: ``"name [shorthash]"``."""
        return f"{self.name} [{self.hash}]"

    @property
    def model_name(self) -> str:
        """A1111's ``model_name``: a checkpoint's file name without its extension."""
        if self.weights is not None:
            return self.weights.stem
        return self.path.stem if self.path.is_file() else self.name

    @property
    def key(self) -> str:
        """One pipeline per model: the VAE and text encoders a request chooses are bound onto it
        (``Pipeline.set_part_files``), so switching them keeps its UNet or transformer loaded."""
        return str(self.weights or self.path)

    @property
    def files(self) -> tuple[Path | None, tuple[Path, ...]]:
        """The chosen VAE and text-encoder files: ``(vae, text_encoders)``."""
        return self.vae, self.text_encoders


def _short_hash(unet: Path) -> str:
    """First 10 hex digits of a file's SHA-256: the UNet's ``model.onnx`` for a folder (the pipeline's
    ``Model hash``), the file itself for a checkpoint (A1111's short hash)."""
    h = hashlib.sha256()
    with open(unet, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:10]


@dataclass(frozen=True)
class ControlNetEntry:
    """A ControlNet a request can name: a ``.safetensors`` file or a folder (``model.onnx``, or diffusers'
    weights) in the models folder's ``ControlNet/``, or a model folder's own ``controlnet*`` part (``owner``: that
    model, the only one it runs with). ``hash``: A1111's short model hash, as sd-webui-controlnet lists it."""

    name: str
    path: Path
    hash: str
    owner: str | None = None

    @property
    def title(self) -> str:
        return f"{self.name} [{self.hash}]"


def _foreign_folder(folder: Path) -> str | None:
    """What a diffusers folder of a pipeline sdrt does not run is (``model_index.json``), or None."""
    from ..checkpoint.diffusers_folder import foreign_folder

    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {}
    return foreign_folder(folder, index if isinstance(index, dict) else {})


def _unloadable(folder: Path, what: str) -> str | None:
    """Why ``pipelines.load`` would fail on the folder, in its words, or None. ``what``: ``"index"`` reads
    ``model_index.json`` alone (not JSON, not an object, unreadable); ``"parts"`` opens the ONNX folder's layout
    (a part or a tokenizer missing). Reads JSON files and the layout only: nothing is compiled."""
    from ..errors import ModelError
    from ..pipelines.folder import ModelFolder, read_json

    try:
        if what == "index":
            read_json(folder / "model_index.json", "model_index.json")
        else:
            ModelFolder.open(folder)
    except ModelError as exc:
        return f"{exc.what} ({exc.fix})"
    return None


#: single-file families that make no image from a prompt alone: an init image, a mask or a control image is needed
_NO_TXT2IMG = ("sd1-inpaint", "sd2-inpaint", "sdxl-inpaint", "sdxl-refiner", "flux-fill", "flux-control")


def _no_txt2img(entry: ModelEntry) -> str | None:
    """What the model is when it makes no image from a prompt alone (an inpainting model, the SDXL refiner, FLUX.1
    Fill or Canny/Depth), read from headers and JSON files (nothing is compiled); None when it does, or when that
    cannot be told without loading it."""
    from ..errors import SdrtError

    try:
        if entry.weights is None and entry.path.is_file():  # a single file served on its own
            from ..checkpoint.families import LABELS, identify
            from ..checkpoint.files import gguf_arch
            from ..weights import Weights

            w = Weights.open(entry.path)
            family = identify(w.shapes(), arch=gguf_arch(w)).family
            return LABELS[family] if family in _NO_TXT2IMG else None
        from ..pipelines.fluxtools import LABELS as TOOL_LABELS
        from ..pipelines.fluxtools import TOOLS
        from ..pipelines.folder import ModelFolder

        folder = ModelFolder.open(entry.path)  # a --checkpoint-base file: its base folder's architecture
    except (SdrtError, OSError, ValueError):
        return None
    fam = folder.family_class
    if fam is None:
        return None
    if not fam.txt2img:
        return fam.label
    in_channels = (folder.configs.get("unet") or folder.configs.get("transformer") or {}).get("in_channels")
    if folder.family == "flux" and in_channels in TOOLS:
        return TOOL_LABELS[TOOLS[in_channels]]
    if "Inpaint" in str(folder.index.get("_class_name", "")) or (
            not fam.flow and in_channels == fam.latent_channels + fam.inpaint_channels):
        return f"{fam.label} inpainting"
    return None


def a1111_old_hash(path: Path) -> str:
    """A1111's short model hash (``sd_models.model_hash``), which sd-webui-controlnet puts after a ControlNet's
    name: the first 8 hex digits of the SHA-256 of 64 KiB read at 1 MiB (of nothing, for a smaller file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(0x100000)
        h.update(f.read(0x10000))
    return h.hexdigest()[:8]


#: a ControlNet name's A1111 hash suffix (``"control_v11p_sd15_canny [d14c016b]"``)
_HASH_SUFFIX = re.compile(r"\s*\[[0-9A-Za-z]{0,64}\]\s*$")
#: the extensions a ControlNet name may be given with
_NET_SUFFIXES = (".safetensors", ".pth", ".pt", ".ckpt", ".bin", ".onnx")
#: the ControlNet files ``ControlNet/`` lists (sd-webui-controlnet's), preferred in this order for one name
_NET_FILES = _NET_SUFFIXES[:-1]


class Registry:
    """What the server can load. ``models=None`` serves the embedded demo model only."""

    def __init__(self, models: Path | None, lora_dir: Path | None = None, embedding_dir: Path | None = None,
                 checkpoint_base: str | None = None, vae_dir: Path | None = None,
                 text_encoder_dir: Path | None = None) -> None:
        self.models_dir = models
        self.vae_dir = vae_dir  # None: the models folder's VAE/ (sdrt.serve.modules)
        self.text_encoder_dir = text_encoder_dir  # None: its text_encoder/
        self.checkpoint_base = checkpoint_base
        self.lora_dir = lora_dir
        self.embedding_dir = embedding_dir
        self._lock = threading.Lock()
        self._hashes: dict[tuple[Path, float], str] = {}
        self._net_hashes: dict[tuple[Path, float], str] = {}
        self._net_broken: dict[tuple[Path, float], str | None] = {}
        self._models: dict[str, ModelEntry] = {}
        self._skipped: dict[str, str] = {}
        self.refresh()

    # ---------------------------------------------------------------- models
    def _folders(self) -> list[Path]:
        if self.models_dir is None:
            from ..pipelines import DEMO_MODEL

            return [DEMO_MODEL]
        return sorted(p for p in self.models_dir.iterdir() if (p / "model_index.json").is_file())

    def _file_hash(self, path: Path) -> str:
        """A checkpoint's A1111 short hash (sdrt.checkpoint.model_hash: cached on disk by path, size, mtime)."""
        from ..checkpoint import model_hash

        return model_hash(path)[:10]

    def _hash(self, path: Path) -> str:
        key = (path, path.stat().st_mtime)
        if key not in self._hashes:
            self._hashes[key] = _short_hash(path)
        return self._hashes[key]

    def refresh(self) -> None:
        """Read the models folder again (A1111's ``/refresh-checkpoints``): ONNX model folders (and diffusers
        folders of ``.safetensors``, on the shipped graphs), then
        the ``.safetensors`` checkpoints beside them: each served on its own on sdrt's shipped graphs when
        it holds a whole model, or a denoiser of a family sdrt runs (a transformer-only Flux file, which runs once
        a request chooses its text encoders and VAE: ``needs``; any other file is skipped with a warning), or, when
        ``checkpoint_base`` is set, bound onto that model folder."""
        found: dict[str, ModelEntry] = {}
        skipped: dict[str, str] = {}  # name -> why it is not served (a 400 naming it when a request asks for it)
        for folder in self._folders():
            broken = _unloadable(folder, "index")
            if broken:  # loading it would fail every request naming it: not listed, and a 400 says why
                log.warning("not serving %s: %s", folder, broken)
                skipped[folder.name] = broken
                continue
            unet = folder / "unet" / "model.onnx"
            if not unet.is_file():
                denoiser = folder / "transformer" / "model.onnx"
                if not denoiser.is_file():
                    from ..checkpoint.diffusers_folder import denoiser_files, is_diffusers_folder

                    files = denoiser_files(folder) if is_diffusers_folder(folder) else []
                    why = _foreign_folder(folder) if files else None
                    if why:
                        log.warning("not serving %s: it is %s, which sdrt does not run", folder, why)
                        skipped[folder.name] = f"it is {why}, which sdrt does not run"
                        continue
                    if files:  # a diffusers folder of .safetensors: served on the shipped graphs
                        found[folder.name] = ModelEntry(folder.name, folder, self._file_hash(files[0]))
                        continue
                    log.warning("skipping %s: it has no unet/model.onnx or transformer/model.onnx, and no "
                                "diffusers .safetensors", folder)
                    continue
                unet = denoiser
            incomplete = _unloadable(folder, "parts")
            if incomplete:  # a part missing (an export that failed): every request naming it would fail with a 500
                log.warning("not serving %s: %s", folder, incomplete)
                skipped[folder.name] = incomplete
                continue
            found[folder.name] = ModelEntry(folder.name, folder, self._hash(unet))
        if self.models_dir is not None:
            base = found.get(self.checkpoint_base or "") if self.checkpoint_base else None
            if self.checkpoint_base and base is None:
                log.warning("--checkpoint-base %s is not a model folder here; serving the .safetensors files on "
                            "their own", self.checkpoint_base)
            for f in sorted(self.models_dir.iterdir()):
                if f.suffix.lower() not in (".safetensors", ".ckpt") or not f.is_file() or f.name in found:
                    continue
                if base is not None:
                    found[f.name] = ModelEntry(f.name, base.path, self._hash(f), weights=f)
                    continue
                from ..pipelines.singlefile import missing_parts

                why = missing_parts(f)
                if why:
                    why = in_request_words(why)  # a LoRA's "pass it with {@@loras}": a <lora:...> tag
                    from .modules import part_only

                    if part_only(f):  # runs with the text encoders / VAE a request chooses
                        found[f.name] = ModelEntry(f.name, f, self._file_hash(f), needs=why)
                        continue
                    log.warning("not serving %s: %s", f.name, why)
                    skipped[f.name] = why
                    continue
                found[f.name] = ModelEntry(f.name, f, self._file_hash(f))
        with self._lock:
            self._models = found
            self._skipped = skipped

    @property
    def models(self) -> list[ModelEntry]:
        with self._lock:
            return list(self._models.values())

    def model(self, name: Any, field: str = "sd_model_checkpoint") -> ModelEntry:
        """The entry a request's model name means; 400 naming the choices when none matches."""
        if not isinstance(name, str):
            raise ApiError(422, f"{field} must be a string (a model name from /sdapi/v1/sd-models), "
                                f"got {type(name).__name__}", field=field)
        with self._lock:
            models = dict(self._models)
        text = name.strip()
        for entry in models.values():
            if text in (entry.name, entry.title, entry.model_name):
                return entry
        bare = text.split(" [", 1)[0].strip().casefold()
        # a relative name with folders (A1111 lists models in subfolders as "sub/name.safetensors"; Easy Diffusion
        # sends its own relative path) is looked up by its last part; "..", absolute paths and drives are not names
        parts = bare.replace("\\", "/").split("/")
        relative = len(parts) > 1 and all(p not in ("", ".", "..") and ":" not in p for p in parts)
        last = parts[-1] if relative else bare
        for key in (bare, last, last.removesuffix(".safetensors").removesuffix(".ckpt") if relative else bare):
            for entry in models.values():
                if key in (entry.name.casefold(), entry.title.casefold(), entry.model_name.casefold()):
                    return entry
        choices = ", ".join(e.title for e in models.values()) or "none"
        with self._lock:
            skipped = dict(self._skipped)
        for skip, why in skipped.items():  # a file of the models folder that is not served: say why
            if last in (skip.casefold(), Path(skip).stem.casefold()):
                raise ApiError(400, f"{field}: {skip} is not served: {why[:300]}; this server has: {choices}",
                               field=field)
        raise ApiError(400, f"no model named {name[:200]!r}; this server has: {choices}", field=field)

    def first(self) -> ModelEntry | None:
        """The model a request that names none runs, when no other is chosen (``--default-model``, the
        ``sd_model_checkpoint`` option): the first that runs on its own (not a transformer-only file) and makes images
        from a prompt alone (not an inpainting model, the SDXL refiner, FLUX.1 Fill or Canny/Depth), else the first
        that runs on its own, else the first; None when there is none."""
        models = self.models
        own = [m for m in models if not m.needs] or models
        for m in own:
            why = _no_txt2img(m)
            if why is None:
                return m
            log.info("%s is %s, which makes no image from a prompt alone: not the default model", m.name, why)
        return own[0] if own else None

    @property
    def default(self) -> ModelEntry:
        first = self.first()
        if first is None:
            raise ApiError(503, f"the models folder {self.models_dir} holds no model folder "
                                "(a diffusers/Optimum ONNX folder with model_index.json) and no complete "
                                ".safetensors checkpoint")
        return first

    # ---------------------------------------------------------------- ControlNets
    @property
    def controlnet_dir(self) -> Path | None:
        """The models folder's ``ControlNet/`` (A1111's ``models/ControlNet``; any case), if there is one."""
        if self.models_dir is None or not self.models_dir.is_dir():
            return None
        return next((p for p in sorted(self.models_dir.iterdir()) if p.is_dir() and p.name.casefold() == "controlnet"
                     and not (p / "model_index.json").is_file()), None)

    def _net_hash(self, path: Path) -> str:
        key = (path, path.stat().st_mtime)
        if key not in self._net_hashes:
            self._net_hashes[key] = a1111_old_hash(path)
        return self._net_hashes[key]

    def _net_unreadable(self, path: Path) -> str | None:
        """Why a file of ``ControlNet/`` cannot be read (its safetensors header or PyTorch pickle: no tensor is read),
        or None; cached by path and mtime, and logged once, as the upscalers' files are (sdrt.serve.extras)."""
        from ..errors import SdrtError
        from ..weights import Weights

        key = (path, path.stat().st_mtime)
        if key not in self._net_broken:
            try:
                Weights.open(path).shapes()
                why = None
            except (SdrtError, OSError, ValueError) as exc:
                why = str(getattr(exc, "what", exc)).replace(str(path), path.name)
                log.warning("%s is listed as no ControlNet: %s", path.name, why)
            self._net_broken[key] = why
        return self._net_broken[key]

    def unreadable_controlnets(self) -> dict[str, str]:
        """``{file name: why}`` of the files of ``ControlNet/`` that cannot be read (not listed)."""
        folder = self.controlnet_dir
        out: dict[str, str] = {}
        for p in sorted(folder.iterdir()) if folder is not None else []:
            if p.suffix.lower() in _NET_FILES and p.is_file():
                why = self._net_unreadable(p)
                if why:
                    out[p.name] = why
        return out

    @property
    def controlnets(self) -> list[ControlNetEntry]:
        """Every ControlNet a request can name, read from the folders now: ``ControlNet/``'s files and folders,
        then the model folders' own ``controlnet*`` parts. A file that cannot be read (a truncated download) is left
        out and logged, as an upscaler's is (sdrt.serve.extras)."""
        from ..checkpoint.controlnet import folder_file

        found: list[ControlNetEntry] = []
        folder = self.controlnet_dir
        entries = sorted(folder.iterdir()) if folder is not None else []
        # the extension's files (.safetensors, and PyTorch's .pth/.pt/.ckpt/.bin, which torchfile reads); of two
        # with one name, the earlier suffix
        files: dict[str, Path] = {}
        for p in entries:
            if p.suffix.lower() in _NET_FILES and p.is_file() and not self._net_unreadable(p):
                old = files.get(p.stem)
                if old is None or _NET_FILES.index(p.suffix.lower()) < _NET_FILES.index(old.suffix.lower()):
                    files[p.stem] = p
        for p in entries:
            if files.get(p.stem) == p:
                found.append(ControlNetEntry(p.stem, p, self._net_hash(p)))
            elif p.is_dir():
                weights = p / "model.onnx_data" if (p / "model.onnx_data").is_file() else p / "model.onnx"
                if not (p / "model.onnx").is_file():
                    weights = folder_file(p)
                if weights is not None:
                    found.append(ControlNetEntry(p.name, p, self._net_hash(weights)))
        for model in self.models:
            if model.weights is not None or not model.path.is_dir():
                continue
            for p in sorted(model.path.glob("controlnet*")):
                if (p / "model.onnx").is_file():
                    data = p / "model.onnx_data"
                    found.append(ControlNetEntry(p.name, p, self._net_hash(data if data.is_file() else p / "model.onnx"),
                                                 owner=model.name))
        return found

    def controlnet(self, name: Any, model: ModelEntry, field: str) -> ControlNetEntry:
        """The ControlNet a unit's ``model`` names for ``model`` (its title, its name with or without A1111's hash
        suffix or a file extension, in any case); 400 naming ``field`` and the choices when none matches."""
        if not isinstance(name, str):
            raise ApiError(422, f"{field} must be a string (a name from /controlnet/model_list)", field=field)
        every = self.controlnets
        mine = [e for e in every if e.owner in (None, model.name)]
        text = name.strip()
        bare = _HASH_SUFFIX.sub("", text).strip().casefold()
        stem = next((bare[: -len(x)] for x in _NET_SUFFIXES if bare.endswith(x)), bare)
        for e in mine:
            if text in (e.title, e.name):
                return e
        for key in (bare, stem):
            for e in mine:
                if key == e.name.casefold():
                    return e
        other = next((e for e in every if e.owner is not None and stem == e.name.casefold()), None)
        if other is not None:
            raise ApiError(400, f"the ControlNet {name[:200]!r} is a part of the model folder {other.owner} and runs "
                                f"with that model only (this request runs {model.name})", field=field)
        choices = ", ".join(e.title for e in mine) or "none"
        for file, why in self.unreadable_controlnets().items():  # a file that is there but cannot be read: say why
            if stem == Path(file).stem.casefold():
                raise ApiError(400, f"{field}: the ControlNet file {file} cannot be read ({why[:300]}); download it "
                                    f"again (it may be truncated); this server has: {choices}", field=field)
        where = "" if self.controlnet_dir is not None else (
            "; put ControlNet .safetensors files or ONNX folders in a ControlNet folder inside the models folder")
        if text in ("", "None"):
            raise ApiError(400, f"{field} names no ControlNet model; this server has: {choices}{where}", field=field)
        raise ApiError(400, f"no ControlNet model named {name[:200]!r}; this server has: {choices}{where}", field=field)

    # ---------------------------------------------------------------- LoRAs and embeddings
    @staticmethod
    def _files(folder: Path | None, suffixes: tuple[str, ...]) -> dict[str, Path]:
        """``{stem: file}`` of the folder's files of these suffixes; of two with one stem, the earlier suffix."""
        if folder is None or not folder.is_dir():
            return {}
        out: dict[str, Path] = {}
        for p in sorted(folder.iterdir(), key=lambda p: (p.name.lower(), p.name)):
            if p.suffix.lower() in suffixes and p.is_file():
                old = out.get(p.stem)
                if old is None or suffixes.index(p.suffix.lower()) < suffixes.index(old.suffix.lower()):
                    out[p.stem] = p
        return dict(sorted(out.items()))

    @property
    def loras(self) -> dict[str, Path]:
        from ..pipelines.weights import LORA_SUFFIXES

        return self._files(self.lora_dir, LORA_SUFFIXES)

    @property
    def embeddings(self) -> dict[str, Path]:
        from ..checkpoint.embeddings import EMBEDDING_SUFFIXES

        return self._files(self.embedding_dir, EMBEDDING_SUFFIXES)

    def check_prompt(self, text: str, field: str = "prompt") -> None:
        """A prompt's ``<lora:...>`` tags: each well formed (a 400 naming ``field`` otherwise) and a listed LoRA."""
        from ..errors import SdrtError
        from ..text import extract_loras
        from .errors import from_pipeline

        try:
            tags = extract_loras(text, field)[1]
        except SdrtError as exc:  # a tag whose weight is not a number: a 400, as a LoRA this server lacks
            raise from_pipeline(exc) from None
        self.check_loras([name for name, _ in tags], field)

    def check_loras(self, names: list[str], field: str = "prompt") -> None:
        """Every ``<lora:NAME:w>`` of a prompt must be a listed LoRA (no path reaches the pipeline)."""
        have = self.loras
        for name in names:
            if name not in have:
                listing = ", ".join(sorted(have)[:20]) or "none"
                where = "no LoRA folder is configured (--lora-dir)" if self.lora_dir is None else f"LoRAs here: {listing}"
                raise ApiError(400, f"the prompt asks for <lora:{name[:100]}:...>, which is not a LoRA of this "
                                    f"server; {where}", field=field)


__all__ = ["ControlNetEntry", "ModelEntry", "Registry"]
