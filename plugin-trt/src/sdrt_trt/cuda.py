"""The few CUDA runtime calls the backend needs, through NVIDIA's ``cuda-bindings`` (``cuda.bindings.runtime``).

TensorRT-RTX's wheel has no memory API, so device buffers, copies and streams
come from here. cuda-bindings links the CUDA runtime statically and needs only
the NVIDIA driver: it adds 30 MB to an install (docs/trt.md).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from sdrt.errors import BackendUnavailable

from .errors import TrtError
from .targets import CudaDevice

log = logging.getLogger("sdrt.trt.cuda")


def runtime() -> Any:
    try:
        from cuda.bindings import runtime as rt
    except ImportError as exc:
        raise BackendUnavailable("the CUDA binding cuda-bindings is not installed", where="import cuda.bindings",
                                 fix="pip install 'cuda-bindings>=13,<14' (pip install sdrt-trt pulls it in)") from exc
    return rt


def _check(result: Any, what: str) -> Any:
    rt = runtime()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        name = rt.cudaGetErrorName(err)[1]
        text = rt.cudaGetErrorString(err)[1]
        raise TrtError(f"CUDA {what} failed: {name.decode() if isinstance(name, bytes) else name} "
                       f"({text.decode() if isinstance(text, bytes) else text})", where=f"cuda.bindings.runtime.{what}",
                       fix="check the NVIDIA driver (nvidia-smi) and that the GPU has free memory")
    return rest[0] if len(rest) == 1 else tuple(rest) if rest else None


def list_devices() -> tuple[list[CudaDevice], str | None]:
    """The CUDA devices, or ``([], why)`` when the binding or the driver is missing."""
    try:
        rt = runtime()
    except BackendUnavailable as exc:
        return [], exc.what
    err, count = rt.cudaGetDeviceCount()
    if err != rt.cudaError_t.cudaSuccess:
        name = rt.cudaGetErrorName(err)[1]
        return [], f"cudaGetDeviceCount: {name.decode() if isinstance(name, bytes) else name}"
    out = []
    for i in range(count):
        err, props = rt.cudaGetDeviceProperties(i)
        if err != rt.cudaError_t.cudaSuccess:
            log.warning("CUDA device %d does not answer (%s)", i, err)
            continue
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
        bus = f"{props.pciDomainID:08x}:{props.pciBusID:02x}:{props.pciDeviceID:02x}.0"
        out.append(CudaDevice(i, name.rstrip("\x00"), (int(props.major), int(props.minor)), int(props.totalGlobalMem),
                              bus))
    return out, None


def set_device(ordinal: int) -> None:
    _check(runtime().cudaSetDevice(ordinal), "cudaSetDevice")


class Stream:
    def __init__(self) -> None:
        self.handle: Any = _check(runtime().cudaStreamCreate(), "cudaStreamCreate")

    @property
    def ptr(self) -> int:
        return int(self.handle)

    def synchronize(self) -> None:
        _check(runtime().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            _check(runtime().cudaStreamDestroy(self.handle), "cudaStreamDestroy")
            self.handle = None


class Buffer:
    """Device memory of at least ``nbytes``; ``ensure`` grows it."""

    def __init__(self) -> None:
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.free()
            self.ptr = int(_check(runtime().cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self.nbytes = nbytes
        return self.ptr

    def upload(self, arr: np.ndarray, stream: Stream) -> None:
        rt = runtime()
        arr = np.ascontiguousarray(arr)
        self.ensure(arr.nbytes)
        _check(rt.cudaMemcpyAsync(self.ptr, arr.ctypes.data, arr.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                  stream.handle), "cudaMemcpyAsync")

    def download(self, out: np.ndarray, stream: Stream) -> None:
        rt = runtime()
        _check(rt.cudaMemcpyAsync(out.ctypes.data, self.ptr, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                  stream.handle), "cudaMemcpyAsync")

    def free(self) -> None:
        if self.ptr:
            _check(runtime().cudaFree(self.ptr), "cudaFree")
            self.ptr, self.nbytes = 0, 0
