"""A diffusers folder of ``.safetensors`` (no ONNX parts) as a pipeline's model folder.

``folder_from_diffusers(path, ...)``: ``sdrt.checkpoint.open_diffusers_folder`` binds the folder's weights
onto sdrt's shipped weight-free graphs (as a single file's are), and the ``ModelFolder`` takes the folder's
own scheduler config, VAE scaling and tokenizers (``tokenizer*/``), not the release defaults a single file
gets; ``model_index.json`` is kept (``force_zeros_for_empty_prompt``). An ONNX folder never comes here
(``sdrt.checkpoint.diffusers_folder.is_diffusers_folder``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoint.diffusers_folder import is_diffusers_folder

if TYPE_CHECKING:  # pragma: no cover
    from .folder import ModelFolder

log = logging.getLogger("sdrt.pipelines.difffolder")

PathLike = str | os.PathLike[str]

__all__ = ["folder_from_diffusers", "is_diffusers_folder"]


def _has_tokenizer(folder: Path, kind: str) -> bool:
    if kind == "t5":
        return any((folder / f).is_file() for f in ("tokenizer.json", "spiece.model"))
    return all((folder / f).is_file() or (folder / f"{f}.gz").is_file() for f in ("vocab.json", "merges.txt"))


def folder_from_diffusers(path: PathLike, *, graph_paths: Mapping[str, PathLike] | None = None,
                          tokenizers: Mapping[str, PathLike] | None = None,
                          prediction: str | None = None) -> ModelFolder:
    """A :class:`ModelFolder` for a diffusers folder of ``.safetensors``."""
    from ..checkpoint.diffusers_folder import open_diffusers_folder
    from .families import by_name
    from .folder import PIPELINE_FAMILY, ModelFolder, _read_json

    root = Path(path)
    opened = open_diffusers_folder(root, graph_paths=dict(graph_paths) if graph_paths else None,
                                   prediction=prediction)
    fam = by_name(PIPELINE_FAMILY[opened.family])
    own: dict[str, PathLike] = {}
    for enc in fam.encoders:
        folder = root / enc.tokenizer
        if _has_tokenizer(folder, enc.kind):
            own[enc.tokenizer] = folder
        else:
            log.warning("%s has no usable %s/; using the %s release's tokenizer", root, enc.tokenizer, fam.label)
    folder = ModelFolder.from_single_file(opened, tokenizers={**own, **(tokenizers or {})})
    index_path = root / "model_index.json"
    index = _read_json(index_path, "model_index.json") if index_path.is_file() else {}
    return dataclasses.replace(folder, index=index)
