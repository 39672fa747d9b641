"""The graph layer: an ONNX file -> ``Graph``.

- ``onnxfile``: safe parsing, external data kept inside the model folder, tensor decoding;
- ``protos``: ModelProto helpers (copy without weights, the inference skeleton, inference);
- ``fold`` and ``shapes``: constant folding, shape pinning and inference;
- ``strip``: weight-stripped graphs (``sdrt strip``) and saving;
- ``upsample``: a UNet's upsamplers sized by their skip connections (any multiple of 8 runs);
- ``graph``: ``Graph``, which ties them together.

Imports point down this list; nothing here imports ``sdrt.weights`` except
``strip``, which writes the safetensors file through ``sdrt.weights.stfile``.
"""

from __future__ import annotations

from .graph import MAX_INLINE_BYTES, Graph
from .strip import STRIPPED_KEY, StripResult

__all__ = ["MAX_INLINE_BYTES", "STRIPPED_KEY", "Graph", "StripResult"]
