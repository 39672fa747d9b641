"""Custom weights for an ONNX export: single-file LDM checkpoints, diffusers folders, embeddings.

- ``Checkpoint.open(path)``: a single-file ``.safetensors`` in the original LDM/CompVis
  layout (SD 1.x, SD 2.x, SDXL) or a diffusers folder; ``ckpt.arrays({part: graph})``
  gives each part's initializers in the graph's names, layout and dtype, after
  checking every part (a checkpoint of another architecture is refused first).
- ``param_map(graph)``: which initializer holds which parameter, from the graph itself
  (named, anonymous transposed MatMul, folded GroupNorm weights; both text-encoder
  export generations).
- ``load_embedding(path)``: A1111 textual-inversion embeddings; ``extend_table`` /
  ``reserve_rows`` add their token rows.
- ``families.detect(shapes)``: what a checkpoint looks like.
"""

from __future__ import annotations

from .embeddings import Embedding, extend_table, load_embedding, reserve_rows, token_table
from .families import detect as detect_family
from .onnxmap import Slot, param_map
from .single_file import PARTS, Checkpoint, load_checkpoint

__all__ = ["PARTS", "Checkpoint", "Embedding", "Slot", "detect_family", "extend_table", "load_checkpoint",
           "load_embedding", "param_map", "reserve_rows", "token_table"]
