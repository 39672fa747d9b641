"""``GgmlBackend``: devices from ggml's backend registry, compile = lower + allocate."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from sdrt import Backend, Device, Session, TensorInfo, resolve_weights
from sdrt.errors import BackendUnavailable, ModelError, SdrtError

from .support import check_graph

log = logging.getLogger("sdrt.ggml")

#: options ``compile`` accepts
OPTIONS = ("shapes", "threads", "rewrites", "conv_impl", "dw_layout", "transpose", "layouts", "pad_k", "flash_attn", "scheduler",
           "accel")
_KIND = {0: "cpu", 1: "gpu", 2: "gpu"}


def _ggml() -> Any:
    from .ops._common import gg

    try:
        ggml = gg()
    except (ImportError, OSError, RuntimeError) as exc:
        raise BackendUnavailable(
            f"ggml-python cannot be imported: {exc}",
            where="import ggml",
            fix="pip install ggml-python (it builds ggml from source: a C/C++ compiler and cmake are needed)",
        ) from exc
    return ggml


def list_devices() -> list[Device]:
    """Every CPU/GPU device the ggml build registered (accelerators such as BLAS are used with the CPU)."""
    g = _ggml()
    out: list[Device] = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        kind = _KIND.get(int(g.ggml_backend_dev_type(dev)))
        if kind is None:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = g.ggml_backend_dev_name(dev).decode()
        reg = g.ggml_backend_dev_backend_reg(dev)
        props: dict[str, Any] = {"ggml_backend": g.ggml_backend_reg_name(reg).decode() if reg else "",
                                 "free_bytes": int(free.value)}
        if kind == "cpu":
            props["tinyblas"] = bool(g.ggml_cpu_has_llamafile())
        out.append(Device(
            backend="ggml", id=name, name=g.ggml_backend_dev_description(dev).decode(), kind=kind,
            memory_bytes=int(total.value) or None, properties=props,
        ))
    return out


def _static_inputs(graph: Any) -> list[TensorInfo]:
    infos = []
    for info in graph.inputs:
        if not info.is_static:
            raise ModelError(
                f"input {info} has dynamic dimensions; ggml needs static shapes",
                where=graph.name,
                fix=f"pass shapes={{'{info.name}': (...)}} (or a dim name: shapes={{'batch': 1}}) to sdrt.load, "
                "or pin them with graph.with_shapes(...)",
            )
        infos.append(TensorInfo(info.name, info.dtype, tuple(int(d) for d in info.shape)))  # type: ignore[arg-type]
    return infos


class GgmlBackend(Backend):
    name = "ggml"
    api_version = (1, 0)
    priority = 10
    conformance: dict[str, Any] = {}

    def devices(self) -> list[Device]:
        return list_devices()

    def compile(self, graph: Any, weights: Any, device: Device, **options: Any) -> Session:
        from .session import GgmlSession

        if device.kind == "cpu" and not device.properties.get("tinyblas", True):
            log.warning("ggml-python was built without GGML_LLAMAFILE: float32 matmuls run about 4x slower; "
                        "reinstall with CMAKE_ARGS=-DGGML_LLAMAFILE=on pip install --force-reinstall "
                        "--no-cache-dir ggml-python")
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise SdrtError(f"unknown options for the ggml backend: {', '.join(unknown)}",
                            where="sdrt.load(..., backend='ggml')", fix=f"valid options: {', '.join(OPTIONS)}")
        check_graph(graph.model.graph.node, graph.name)  # before any long work
        if options.get("shapes"):
            graph = graph.with_shapes(dict(options["shapes"]))  # the core pins dims and checks them
        model = graph.model
        inputs = _static_inputs(graph)
        inits = resolve_weights(graph, weights)
        opsets = {o.domain or "": int(o.version) for o in model.opset_import}
        return GgmlSession(
            nodes=model.graph.node, initializers=inits, inputs=inputs, outputs=graph.outputs, opsets=opsets,
            device_name=device.id, options=options, graph=graph, where=graph.name,
        )
