"""A picklable description of a pipeline: what a worker (a thread here, a Ray replica elsewhere)
needs to build the same pipeline itself, on its own device."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("sdrt.serve.spec")

#: pipelines.load reads plugin registries and compile caches; workers build one at a time
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class PipelineSpec:
    """``folder`` + ``backend`` + ``device`` (+ a single-file checkpoint bound onto the folder, the
    LoRA folder, the embeddings to load, and separate VAE / text-encoder files)."""

    folder: Path
    backend: str = "auto"
    device: str | None = None
    lora_dir: Path | None = None
    embeddings: tuple[Path, ...] = ()
    low_memory: bool | None = False
    weights: Path | None = None
    #: separate VAE and text-encoder files (``pipelines.load``'s ``vae`` and ``text_encoders``)
    vae: Path | None = None
    text_encoders: tuple[Path, ...] = ()
    #: the compute precision (``sdrt.load``'s ``precision=``); None: the device's default
    precision: str | None = None
    #: the weight quantization (``pipelines.load``'s ``quantize=``); None: float weights
    quantize: str | None = None

    def build(self) -> Any:
        """A ready ``sdrt.pipelines.Pipeline`` (its parts compile on first use)."""
        from .. import pipelines

        with _BUILD_LOCK:
            parts = {"vae": self.vae, "text_encoders": self.text_encoders} if self.weights is None else {}
            compute = {k: v for k, v in (("precision", self.precision), ("quantize", self.quantize)) if v}
            pipe = pipelines.load(self.folder, backend=self.backend, device=self.device, low_memory=self.low_memory,
                                  **parts, **compute)
            if self.weights is not None:
                pipe.load_weights(self.weights)  # refused, naming the family, when it does not fit the folder
                if self.vae is not None or self.text_encoders:  # the chosen files over the checkpoint's own
                    from ..pipelines.singlefile import bind_part_files

                    bind_part_files(pipe, self.vae, self.text_encoders)
            if self.lora_dir is not None:
                pipe.weights.lora_dir = self.lora_dir
            if self.embeddings:
                for path in self.embeddings:
                    try:  # an embedding of another family is skipped (A1111 lists it as skipped)
                        pipe.add_embedding(path)
                    except Exception as exc:  # noqa: BLE001 - an SdrtError naming the file
                        log.warning("embedding %s not loaded for %s: %s", path.name, self.folder.name, exc)
        log.info("loaded %s on %s:%s", self.folder.name, pipe.backend, pipe.device)
        return pipe


__all__ = ["PipelineSpec"]
