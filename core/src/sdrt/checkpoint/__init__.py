"""Custom weights for an ONNX export, and single files onto sdrt's shipped graphs.

- ``open_single_file(path, extra_files=[...])``: a checkpoint as people download it (A1111/LDM
  SD 1.x/2.x/SDXL, SD 3 Medium, SD 3.5, Flux.1 and Chroma as their publishers and ComfyUI ship them, plus
  separate ``clip_l``/``clip_g``/``t5xxl``/``ae``/VAE files) -> ``OpenedModel``: its family,
  release defaults, and each part's shipped weight-free graph with the weights bound to it
  (``files``); ``shipped_graph(name)`` (``graphs``); ``model_hash(path)`` (``hashing``).
- ``Checkpoint.open(path)``: a single-file ``.safetensors`` in the original LDM/CompVis
  layout (SD 1.x, SD 2.x, SDXL) or a diffusers folder; ``ckpt.arrays({part: graph})``
  gives each part's initializers in the graph's names, layout and dtype, after
  checking every part (a checkpoint of another architecture is refused first).
- ``param_map(graph)``: which initializer holds which parameter, from the graph itself
  (named, anonymous transposed MatMul, folded GroupNorm weights; both text-encoder
  export generations).
- ``load_embedding(path)``: A1111 textual-inversion embeddings; ``extend_table`` /
  ``reserve_rows`` add their token rows.
- ``families.detect(shapes)`` / ``families.identify(shapes)``: what a file looks like.
- ``open_controlnet(path, base=...)``: a ControlNet ``.safetensors`` (lllyasviel's LDM layout or
  diffusers') bound onto sdrt's shipped weight-free SD 1.x / SDXL ControlNet graph (``controlnet``).
- ``open_diffusers_folder(path)``: a diffusers folder of ``.safetensors`` (no ONNX) onto the shipped graphs,
  with the folder's own scheduler and VAE configs (``diffusers_folder``).
"""

from __future__ import annotations

from .controlnet import OpenedControlNet, open_controlnet
from .diffusers_folder import DiffusersModel, open_diffusers_folder
from .embeddings import Embedding, extend_table, load_embedding, reserve_rows, token_table
from .families import FAMILY_GRAPHS, Identity, identify
from .families import detect as detect_family
from .files import OpenedModel, open_parts, open_single_file, release_defaults, release_tokenizer
from .graphs import shipped_graph, shipped_names
from .hashing import model_hash
from .onnxmap import Slot, param_map
from .single_file import PARTS, Checkpoint, load_checkpoint

__all__ = ["FAMILY_GRAPHS", "PARTS", "Checkpoint", "Embedding", "Identity", "OpenedControlNet", "OpenedModel", "Slot",
           "detect_family", "extend_table", "identify", "load_checkpoint", "load_embedding", "model_hash",
           "open_controlnet", "open_parts", "open_single_file", "param_map", "release_defaults", "release_tokenizer",
           "reserve_rows", "shipped_graph", "shipped_names", "token_table"]
__all__ += ["DiffusersModel", "open_diffusers_folder"]
