"""``sdrt demo``: the main job on an embedded default.

It builds a small SD-style latent decoder (conv_in, a ResNet block with
GroupNorm and SiLU, nearest 2x upsampling, GroupNorm, conv_out to RGB) as a
real ONNX graph with fixed, seeded weights, feeds it seeded latents, runs it on
the backend that ``sdrt.load`` picks for this machine, and writes a PNG.
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Any

LATENT_CHANNELS = 4
WIDTH = 64


def build_decoder(latent_size: int = 32, channels: int = WIDTH, seed: int = 0) -> Any:
    """An SD-VAE-decoder-shaped ONNX model: float32[1, 4, s, s] -> float32[1, 3, 2s, 2s]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits: list[Any] = []
    nodes: list[Any] = []

    def param(name: str, shape: tuple[int, ...], scale: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def conv(x: str, cin: int, cout: int, name: str, k: int = 3) -> str:
        w = param(f"{name}.weight", (cout, cin, k, k), (2.0 / (cin * k * k)) ** 0.5)
        b = param(f"{name}.bias", (cout,), 0.01)
        nodes.append(helper.make_node("Conv", [x, w, b], [name], name=name, pads=[k // 2] * 4))
        return name

    def group_norm(x: str, c: int, name: str, groups: int = 32) -> str:
        scale = param(f"{name}.weight", (c,), 0.0)
        inits[-1] = numpy_helper.from_array(np.ones(c, np.float32), scale)
        bias = param(f"{name}.bias", (c,), 0.0)
        nodes.append(helper.make_node("GroupNormalization", [x, scale, bias], [name], name=name,
                                      num_groups=groups, epsilon=1e-6))
        return name

    def silu(x: str, name: str) -> str:
        nodes.append(helper.make_node("Sigmoid", [x], [f"{name}.sig"], name=f"{name}.sig"))
        nodes.append(helper.make_node("Mul", [x, f"{name}.sig"], [name], name=name))
        return name

    h = conv("latent", LATENT_CHANNELS, channels, "conv_in")
    r = silu(group_norm(h, channels, "mid.norm1"), "mid.act1")
    r = conv(r, channels, channels, "mid.conv1")
    r = silu(group_norm(r, channels, "mid.norm2"), "mid.act2")
    r = conv(r, channels, channels, "mid.conv2")
    nodes.append(helper.make_node("Add", [h, r], ["mid.out"], name="mid.add"))
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up.scales")
    inits.append(scales)
    nodes.append(helper.make_node("Resize", ["mid.out", "", "up.scales"], ["up"], name="up", mode="nearest",
                                  coordinate_transformation_mode="asymmetric", nearest_mode="floor"))  # as torch exports
    u = conv("up", channels, channels, "up.conv")
    u = silu(group_norm(u, channels, "norm_out"), "act_out")
    out = conv(u, channels, 3, "conv_out")
    nodes.append(helper.make_node("Tanh", [out], ["image"], name="tanh"))
    graph = helper.make_graph(
        nodes, "sdrt_demo_decoder",
        [helper.make_tensor_value_info("latent", TensorProto.FLOAT, [1, LATENT_CHANNELS, latent_size, latent_size])],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 2 * latent_size, 2 * latent_size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="sdrt-demo",
                              ir_version=10)  # IR 10 (opset 21): what onnxruntime and OpenVINO read
    onnx.checker.check_model(model)
    return model


def write_png(path: Path, rgb: Any) -> None:
    """Write an HxWx3 uint8 array as a PNG (zlib only, no imaging library needed)."""
    height, width, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    from .pipelines.png import write_file

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    write_file(path, b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6))
               + chunk(b"IEND", b""))  # atomically, as generate writes its images


def run_demo(output: Path, backend: str = "auto", device: str | None = None, seed: int = 42,
             latent_size: int = 32) -> dict[str, Any]:
    import numpy as np

    from .graph import Graph
    from .runtime import select
    from .samplers.seeds import resolve_seed

    seed = resolve_seed(seed)  # as generate takes it: -1 is a random seed, a negative one is seed + 2**64
    be, dev = select(backend, device)
    graph = Graph(build_decoder(latent_size))
    latent = np.random.default_rng(seed % 2**64).standard_normal((1, LATENT_CHANNELS, latent_size, latent_size))
    latent = latent.astype(np.float32)
    t0 = time.perf_counter()
    with be.compile(graph, None, dev) as session:  # select() already resolved both; no second lookup
        t1 = time.perf_counter()
        image = session.run({"latent": latent})["image"]
        t2 = time.perf_counter()
    rgb = ((image[0].transpose(1, 2, 0) + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    write_png(output, rgb)
    return {"output": str(output), "shape": list(image.shape), "compile_s": t1 - t0, "run_s": t2 - t1,
            "backend": be.name, "device": str(dev), "seed": seed}
