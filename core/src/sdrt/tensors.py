"""Tensor types shared by the contract, ``Graph`` and ``Weights``: ``Dim``, ``TensorInfo``, ``NON_TENSOR``.

This module imports nothing from sdrt, so every layer above it can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Dim = int | str | None
"""One dimension: a fixed size, a symbolic name such as ``"batch"``, or unknown."""

#: ``TensorInfo.dtype`` of an input that is not a tensor (a sequence, map or optional)
NON_TENSOR = "non-tensor"


@dataclass(frozen=True)
class TensorInfo:
    """Name, numpy dtype name (``"float32"``) and shape of a graph input, output or initializer."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(dim_str(d) for d in self.shape)}]"


def dim_str(d: Dim) -> str:
    """``"?"`` for an unknown dim, else the size or symbolic name."""
    return "?" if d is None else str(d)


def shape_str(shape: Sequence[Dim]) -> str:
    """A shape as ``(batch, 4, ?)``."""
    return "(" + ", ".join(dim_str(d) for d in shape) + ")"


__all__ = ["NON_TENSOR", "Dim", "TensorInfo", "dim_str", "shape_str"]
