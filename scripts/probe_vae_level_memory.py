"""OpenVINO's run-phase peak on a diffusers-VAE-like last level against the cost model's prediction
(docs/plan.md, "On an Intel Emerald Rapids"): 256 channels upsampled 2x and convolved, a 256 -> 128 resnet, two
128-channel resnets, GroupNorm, SiLU and ``conv_out`` (``vae``), or one 256-channel resnet (``wide``), static dims.

    python scripts/probe_vae_level_memory.py PRECISION SIZE [vae|wide]

Uses the stored calibration (``sdrt selftest --calibrate``); prints the gap in units of the level's maps."""
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto

from sdrt.cost import calibrate
from sdrt.cost.devices import this_cpu
from sdrt.cost.model import factors_for, load_calibration, predict
from sdrt.cost.nodes import graph_costs
from sdrt.graph import Graph
from sdrt.testing.builder import Builder
from sdrt.testing.models import _resnet, _upsample

MIB = 2 ** 20


def main() -> None:
    prec, hw = sys.argv[1], int(sys.argv[2])
    variant = sys.argv[3] if len(sys.argv) > 3 else "vae"
    b = Builder("level")
    shape = (1, 256, hw // 2, hw // 2)
    x = _upsample(b, b.input("x", TensorProto.FLOAT, shape), "up", 256)
    if variant == "vae":
        x = _resnet(b, _resnet(b, _resnet(b, x, "r0", 256, 128), "r1", 128, 128), "r2", 128, 128)
        x = b.conv(b.silu(b.group_norm(x, "norm_out", 128), "act_out"), "conv_out", 128, 3, 3)
    else:
        x = b.conv(b.silu(b.group_norm(_resnet(b, x, "r0", 256, 256), "norm_out", 256), "act_out"), "conv_out",
                   256, 3, 3)
    b.output(x)
    model = b.model()
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
