"""Parse a prepared graph with TensorRT-RTX's ONNX parser and build a serialized engine for one target."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from sdrt.errors import UnsupportedGraph

from .errors import TrtError, make_logger
from .prepare import Prepared
from .targets import compute_capability

log = logging.getLogger("sdrt.trt")

#: builder flags per refit mode (TensorRT-RTX builds these only on a machine with a CUDA GPU)
REFIT_FLAGS = {"none": (), "identical": ("STRIP_PLAN", "REFIT_IDENTICAL"), "full": ("STRIP_PLAN", "REFIT")}


def _skeleton(graph: Any, arrays: dict[str, np.ndarray]) -> bytes:
    """The model with every initializer's data left out (declared as external), for ``load_model_proto``:
    the weights go in through ``load_initializer`` instead, so no model is serialized with its weights and
    protobuf's 2 GiB limit does not apply."""
    from onnx import TensorProto

    from sdrt.graph.protos import copy_model

    model = copy_model(graph.model, initializers=False)
    for t in graph.model.graph.initializer:
        ref = TensorProto()
        ref.name, ref.data_type = t.name, t.data_type
        ref.dims.extend(t.dims)
        ref.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "sdrt-trt-weights"), ("offset", "0"), ("length", str(arrays[t.name].nbytes))):
            entry = ref.external_data.add()
            entry.key, entry.value = key, value
        model.graph.initializer.append(ref)
    return model.SerializeToString()


def _packed(arr: np.ndarray) -> np.ndarray:
    """``arr`` as the ONNX parser reads an initializer's bytes: 4-bit types two to a byte (ONNX's layout: the
    first value in the low nibble), every other type as numpy stores it."""
    a = np.ascontiguousarray(arr)
    if a.dtype.name not in ("int4", "uint4"):
        return a
    flat = a.reshape(-1).view(np.uint8) & 0x0F  # ml_dtypes keeps one 4-bit value per byte
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def parse(prepared: Prepared, logger: Any = None) -> tuple[Any, Any, Any, Any, dict[str, np.ndarray]]:
    """``(builder, network, parser, logger, weights)``; raises ``UnsupportedGraph`` listing every node the parser
    rejects. ``weights`` must outlive the build: the network points into them."""
    import tensorrt_rtx as trt

    logger = logger or make_logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT-RTX networks are always strongly typed
    parser = trt.OnnxParser(network, logger)
    graph = prepared.graph
    weights = {k: _packed(v) for k, v in prepared.weight_arrays().items()}
    ok = parser.load_model_proto(_skeleton(graph, weights))
    for name, arr in weights.items():
        ok = ok and parser.load_initializer(name, arr.ctypes.data, arr.nbytes)
    ok = ok and parser.parse_model_proto()
    if not ok or parser.num_errors:
        nodes = list(graph.model.graph.node)
        unsupported: dict[str, list[str]] = {}
        for i in range(parser.num_errors):
            err = parser.get_error(i)
            index = err.node()
            if 0 <= index < len(nodes):
                node = nodes[index]
                op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
                unsupported.setdefault(op, []).append(err.node_name() or node.name or f"#{index}")
            else:
                desc = " ".join(str(err.desc()).split())[:160]
                unsupported.setdefault(f"graph ({desc})", []).append(graph.name)
        logger.take()
        raise UnsupportedGraph("TensorRT-RTX's ONNX parser rejects the graph", unsupported=unsupported,
                               where=graph.name, fix="use another backend for this model (sdrt-ggml, sdrt-openvino), "
                                                     "or re-export it without these ops")
    return builder, network, parser, logger, weights


def build_engine(prepared: Prepared, target: str, refit: str) -> tuple[bytes, float]:
    """The serialized engine for ``target`` (``"sm86"``) and the seconds the build took."""
    import tensorrt_rtx as trt

    builder, network, _parser, logger, _weights = parse(prepared)
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    if not config.set_compute_capability(compute_capability(target), 0):
        raise TrtError(f"TensorRT-RTX refuses target {target}: {logger.take()}", where="IBuilderConfig",
                       fix="pick another target (sdrt compile MODEL --backend trt --list-targets)")
    for flag in REFIT_FLAGS[refit]:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if prepared.profiles:
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in prepared.profiles.items():
            profile.set_shape(name, trt.Dims(mn), trt.Dims(opt), trt.Dims(mx))
        config.add_optimization_profile(profile)
    start = time.perf_counter()
    try:
        plan = builder.build_serialized_network(network, config)
    except Exception as exc:  # noqa: BLE001 - the bindings raise bare RuntimeErrors
        plan, message = None, str(exc) or logger.take()
    else:
        message = logger.take() if plan is None else ""
    seconds = time.perf_counter() - start
    if plan is None:
        raise TrtError(f"TensorRT-RTX could not build the engine for {target}: {message}",
                       where=f"{prepared.graph.name} ({refit=})", fix=_fix(message, refit))
    log.info("built %s for %s in %.2f s (%d bytes, refit=%s)", prepared.graph.name, target, seconds, plan.nbytes,
             refit)
    return bytes(plan), seconds


def _fix(message: str, refit: str) -> str:
    if "FP32 GEMM is not supported" in message:
        return "Turing (sm75) runs no fp32 GEMM: build with precision='fp16'"
    if "graph_jit.cpp" in message and refit != "none":
        return ("TensorRT-RTX builds weight-stripped, refittable engines only with a CUDA GPU present: build with "
                "refit='none' here, or build on the machine with the GPU")
    if "runtime-fusion" in message:
        return ("TensorRT-RTX 1.7 has no kernel for one of this graph's fused layers on this target (seen for the UNet "
                "on sm75): pick a newer target or precision; after such a failure later builds in the same process "
                "fail too, so run the next build in a new process")
    return "run with -vv to see TensorRT-RTX's log, try precision='fp32', or use another backend"
