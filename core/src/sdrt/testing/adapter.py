"""An adapter that makes any sdrt Backend look like an ``onnx.backend.base.Backend``."""

from __future__ import annotations

import re
import unittest
from typing import Any

import numpy as np
from onnx.backend.base import Backend as OnnxBackend
from onnx.backend.base import BackendRep

from ..backend import Backend, Device, Session
from ..errors import UnsupportedGraph
from ..graph import Graph
from .report import UNSUPPORTED

#: keyword arguments that onnx's runner passes to ``prepare`` and that are not compile options
_RUNNER_KWARGS = {"rtol", "atol"}


def device_tag(device: Device) -> str:
    """The device as it appears in test names: ``CPU`` -> ``cpu``, ``GPU.0`` -> ``gpu_0``."""
    return re.sub(r"\W+", "_", device.id).strip("_").lower() or "dev"


class SdrtBackendRep(BackendRep):
    """A compiled sdrt Session, run with positional inputs as onnx's runner does."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = {info.name: value for info, value in zip(self.session.inputs, inputs)}
        outputs = self.session.run(feeds)
        return tuple(outputs[o.name] for o in self.session.outputs)


def make_onnx_backend(backend: Backend, device: Device, **compile_options: Any) -> type[OnnxBackend]:
    """An ``onnx.backend.base.Backend`` class bound to one sdrt backend and device.

    Its only supported device string is ``device_tag(device).upper()``, so
    onnx's ``BackendTest`` names each test after the device.
    """
    tag = device_tag(device).upper()

    class Adapter(OnnxBackend):
        sdrt_backend = backend
        sdrt_device = device

        @classmethod
        def supports_device(cls, device_str: str) -> bool:
            return device_str == tag

        @classmethod
        def prepare(cls, model: Any, device: str = tag, **kwargs: Any) -> SdrtBackendRep:
            options = {k: v for k, v in kwargs.items() if k not in _RUNNER_KWARGS}
            graph = Graph(model)
            try:
                session = backend.compile(graph, None, cls.sdrt_device, **{**compile_options, **options})
            except UnsupportedGraph as exc:
                raise unittest.SkipTest(f"{UNSUPPORTED}{exc}") from exc
            return SdrtBackendRep(session)

        @classmethod
        def run_model(cls, model: Any, inputs: Any, device: str = tag, **kwargs: Any) -> tuple[Any, ...]:
            return cls.prepare(model, device, **kwargs).run(inputs)

    Adapter.__name__ = f"SdrtOnnxBackend_{backend.name}_{tag}"
    Adapter.__qualname__ = Adapter.__name__
    return Adapter
