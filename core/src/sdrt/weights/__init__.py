"""The weights layer: ``.safetensors`` files (and PyTorch checkpoints) -> ``Weights`` -> the arrays a backend binds.

- ``stfile``: the safetensors format, read with mmap and written streamed;
- ``torchfile``: PyTorch checkpoints (``torch.save``'s zip and legacy formats), read with a restricted unpickler
  that runs nothing from the file, tensors mapped like a safetensors file's;
- ``keymap``: rules that rename checkpoint keys to initializer names;
- ``store``: ``Weights``, named tensors read on access, and ``bind`` (checking them against a graph);
- ``resolve``: ``resolve_weights``, every initializer's final array for a backend;
- ``gguf``: GGUF files (the optional ``gguf`` package) as ``GGUFWeights``;
- ``bnb``: bitsandbytes 4-bit (NF4/FP4) weights, folded on open into tensors dequantized when read;
- ``lora``: merging LoRA adapters (imported on first use: ``sdrt.lora`` or ``sdrt.weights.lora``).

Nothing here imports ``sdrt.graph`` at run time except ``lora``, which finds
anonymous weights through a graph's nodes.
"""

from __future__ import annotations

from .keymap import KeyMap
from .resolve import resolve_weights, same_values
from .store import (
    CONVERT_HINT,
    OPENERS,
    PICKLE_SUFFIXES,
    BindReport,
    TensorRef,
    Weights,
    folder_files,
    is_torch_file,
    refuse_unsafe,
)

OPENERS[".gguf"] = lambda path, mapping=None: __import__("sdrt.weights.gguf", fromlist=["open_gguf"]).open_gguf(
    path, mapping)  # imported on first use: the gguf reader is optional

__all__ = ["CONVERT_HINT", "PICKLE_SUFFIXES", "BindReport", "KeyMap", "TensorRef", "Weights", "folder_files",
           "is_torch_file", "refuse_unsafe",
           "resolve_weights", "same_values"]
