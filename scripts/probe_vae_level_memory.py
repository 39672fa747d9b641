"""OpenVINO's run-phase peak on a diffusers-VAE-like last level against the cost model's prediction
(docs/plan.md, "On an Intel Emerald Rapids"): 256 channels upsampled 2x and convolved, a 256 -> 128 resnet, two
128-channel resnets, GroupNorm, SiLU and ``conv_out`` (``vae``), or one 256-channel resnet (``wide``), static dims.

    python scripts/probe_vae_level_memory.py PRECISION SIZE [vae|wide]

Uses the stored calibration (``sdrt selftest --calibrate``); prints the gap in units of the level's maps."""
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from sdrt.cost import calibrate
from sdrt.cost.devices import this_cpu
from sdrt.cost.model import factors_for, load_calibration, predict
from sdrt.cost.nodes import graph_costs
from sdrt.graph import Graph

MIB = 2 ** 20


class Builder:
    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.nodes: list = []
        self.inits = [numpy_helper.from_array(np.array([0, 32, -1], np.int64), "gshape"),
                      numpy_helper.from_array(np.ones(32, np.float32), "ones"),
                      numpy_helper.from_array(np.zeros(32, np.float32), "zeros"),
                      numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
        self.k = 0

    def w(self, shape: tuple, scale: float = 0.02) -> str:
        self.k += 1
        name = f"w{self.k}"
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def op(self, kind: str, inputs: list, **attrs) -> str:
        self.k += 1
        out = f"v{self.k}"
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def conv(self, v: str, ci: int, co: int, ks: int = 3) -> str:
        return self.op("Conv", [v, self.w((co, ci, ks, ks)), self.w((co,), 0.01)], pads=[ks // 2] * 4)

    def gn_silu(self, v: str, c: int) -> str:  # GroupNorm as torch exports it, then SiLU
        n = self.op("InstanceNormalization", [self.op("Reshape", [v, "gshape"]), "ones", "zeros"], epsilon=1e-6)
        back = self.op("Reshape", [n, self.op("Shape", [v])])
        y = self.op("Add", [self.op("Mul", [back, self.w((c, 1, 1), 1.0)]), self.w((c, 1, 1), 0.1)])
        return self.op("Mul", [y, self.op("Sigmoid", [y])])

    def resnet(self, v: str, ci: int, co: int) -> str:
        h = self.conv(self.gn_silu(self.conv(self.gn_silu(v, ci), ci, co), co), co, co)
        return self.op("Add", [self.conv(v, ci, co, 1) if ci != co else v, h])


def main() -> None:
    prec, hw = sys.argv[1], int(sys.argv[2])
    variant = sys.argv[3] if len(sys.argv) > 3 else "vae"
    b = Builder()
    x = b.conv(b.op("Resize", ["x", "", "scales"], mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor"), 256, 256)
    if variant == "vae":
        x = b.resnet(b.resnet(b.resnet(x, 256, 128), 128, 128), 128, 128)
        x = b.conv(b.gn_silu(x, 128), 128, 3)
    else:
        x = b.conv(b.gn_silu(b.resnet(x, 256, 256), 256), 256, 3)
    shape = (1, 256, hw // 2, hw // 2)
    graph = helper.make_graph(b.nodes, "level", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": b.rng.standard_normal(shape).astype(np.float32)}
    cpu = this_cpu()
    factors = factors_for("openvino", cpu, prec, load_calibration())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "level.onnx"
        path.write_bytes(model.SerializeToString())
        cost = graph_costs(Graph.load(path, load_external=False), {"x": shape}, prec)
        pr = predict(cost, cpu, "openvino", prec, factors)
        m = calibrate.measure(path, feeds, "openvino", repeats=3, options={"precision": prec}, budget_s=2)
    map128 = 128 * hw * hw * (2 if prec == "bf16" else 4)
    gap = m["run_peak_rss"] - pr.run_peak_bytes
    print(f"{prec} {variant} {hw}px: run peak predicted {pr.run_peak_bytes / MIB:.0f} MiB, measured "
          f"{m['run_peak_rss'] / MIB:.0f} MiB; gap {gap / MIB:.0f} MiB = {gap / map128:.2f} x the 128-channel map, "
          f"{gap / (2 * map128):.2f} x the 256-channel map; {m['robust_ms']:.0f} ms a call")


if __name__ == "__main__":
    main()
