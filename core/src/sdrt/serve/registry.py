"""Model, LoRA and embedding names, resolved only inside the configured folders.

A request names things; it never gives a path. Every name is looked up in a listing of the
configured folder (exact name, A1111 title ``"name [hash]"``, or the name without case), so
``../x``, absolute paths and anything not listed are refused before the filesystem is touched.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ApiError

log = logging.getLogger("sdrt.serve.registry")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    hash: str

    @property
    def title(self) -> str:
        """A1111's checkpoint title: ``"name [shorthash]"``."""
        return f"{self.name} [{self.hash}]"


def _short_hash(unet: Path) -> str:
    """First 10 hex digits of the SHA-256 of the UNet's ``model.onnx``: the pipeline's ``Model hash``."""
    h = hashlib.sha256()
    with open(unet, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:10]


class Registry:
    """What the server can load. ``models=None`` serves the embedded demo model only."""

    def __init__(self, models: Path | None, lora_dir: Path | None = None, embedding_dir: Path | None = None) -> None:
        self.models_dir = models
        self.lora_dir = lora_dir
        self.embedding_dir = embedding_dir
        self._lock = threading.Lock()
        self._hashes: dict[tuple[Path, float], str] = {}
        self._models: dict[str, ModelEntry] = {}
        self.refresh()

    # ---------------------------------------------------------------- models
    def _folders(self) -> list[Path]:
        if self.models_dir is None:
            from ..pipelines import DEMO_MODEL

            return [DEMO_MODEL]
        return sorted(p for p in self.models_dir.iterdir() if (p / "model_index.json").is_file())

    def refresh(self) -> None:
        """Read the models folder again (A1111's ``/refresh-checkpoints``)."""
        found: dict[str, ModelEntry] = {}
        for folder in self._folders():
            unet = folder / "unet" / "model.onnx"
            if not unet.is_file():
                log.warning("skipping %s: it has no unet/model.onnx", folder)
                continue
            key = (unet, unet.stat().st_mtime)
            if key not in self._hashes:
                self._hashes[key] = _short_hash(unet)
            found[folder.name] = ModelEntry(folder.name, folder, self._hashes[key])
        with self._lock:
            self._models = found

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
            if text in (entry.name, entry.title):
                return entry
        bare = text.split(" [", 1)[0].strip()
        for entry in models.values():
            if bare.casefold() in (entry.name.casefold(), entry.title.casefold()):
                return entry
        choices = ", ".join(e.title for e in models.values()) or "none"
        raise ApiError(400, f"no model named {name[:200]!r}; this server has: {choices}", field=field)

    @property
    def default(self) -> ModelEntry:
        models = self.models
        if not models:
            raise ApiError(503, f"the models folder {self.models_dir} holds no model folder "
                                "(a diffusers/Optimum ONNX folder with model_index.json)")
        return models[0]

    # ---------------------------------------------------------------- LoRAs and embeddings
    @staticmethod
    def _files(folder: Path | None) -> dict[str, Path]:
        if folder is None or not folder.is_dir():
            return {}
        return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix.lower() == ".safetensors" and p.is_file()}

    @property
    def loras(self) -> dict[str, Path]:
        return self._files(self.lora_dir)

    @property
    def embeddings(self) -> dict[str, Path]:
        return self._files(self.embedding_dir)

    def check_loras(self, names: list[str], field: str = "prompt") -> None:
        """Every ``<lora:NAME:w>`` of a prompt must be a listed LoRA (no path reaches the pipeline)."""
        have = self.loras
        for name in names:
            if name not in have:
                listing = ", ".join(sorted(have)[:20]) or "none"
                where = "no LoRA folder is configured (--lora-dir)" if self.lora_dir is None else f"LoRAs here: {listing}"
                raise ApiError(400, f"the prompt asks for <lora:{name[:100]}:...>, which is not a LoRA of this "
                                    f"server; {where}", field=field)


__all__ = ["ModelEntry", "Registry"]
