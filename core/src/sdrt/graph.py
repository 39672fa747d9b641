"""``Graph``: an ONNX model loaded safely, described, and transformed.

onnx is imported lazily so that ``import sdrt`` stays light.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backend import NON_TENSOR, Dim, TensorInfo
from .errors import ModelError, ModelNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    import onnx


def _tensor_info(value_info: Any) -> TensorInfo:
    from onnx import helper

    if not value_info.type.HasField("tensor_type"):
        return TensorInfo(value_info.name, NON_TENSOR, ())
    ttype = value_info.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(ttype.elem_type).name if ttype.elem_type else "undefined"
    shape: list[Dim] = []
    if ttype.HasField("shape"):
        for d in ttype.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                shape.append(d.dim_param)
            else:
                shape.append(None)
    return TensorInfo(value_info.name, dtype, tuple(shape))


class Graph:
    """An ONNX graph. Build one with ``Graph.load(path_or_bytes)``."""

    def __init__(self, model: onnx.ModelProto, path: Path | None = None) -> None:
        self.model = model
        self.path = path

    # -- loading -------------------------------------------------------
    @classmethod
    def load(cls, source: str | os.PathLike[str] | bytes) -> Graph:
        """Load from a file path or from the serialized bytes of a model."""
        import onnx

        if isinstance(source, (bytes, bytearray, memoryview)):
            try:
                model = onnx.load_model_from_string(bytes(source))
            except Exception as exc:
                raise ModelError(
                    f"the bytes are not a valid ONNX model ({exc})",
                    where="<bytes>",
                    fix="pass the complete contents of a .onnx file",
                ) from exc
            return cls(model)
        path = Path(source)
        if not path.exists():
            raise ModelNotFoundError(
                "the model file does not exist", where=str(path), fix="check the path, or export the model to ONNX first"
            )
        try:
            model = onnx.load(str(path))
        except Exception as exc:
            raise ModelError(
                f"the file could not be read as an ONNX model ({exc})",
                where=str(path),
                fix="check that it is a complete .onnx file, for example by re-exporting it",
            ) from exc
        return cls(model, path)

    # -- description ---------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name if self.path else (self.model.graph.name or "<graph>")

    @property
    def initializer_names(self) -> list[str]:
        return [t.name for t in self.model.graph.initializer]

    @property
    def inputs(self) -> list[TensorInfo]:
        """Graph inputs that the caller feeds (initializers excluded)."""
        inits = set(self.initializer_names)
        return [_tensor_info(v) for v in self.model.graph.input if v.name not in inits]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [_tensor_info(v) for v in self.model.graph.output]

    def op_types(self) -> Iterable[str]:
        return (n.op_type for n in self.model.graph.node)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"Graph({self.name}: ({ins}) -> ({outs}))"
