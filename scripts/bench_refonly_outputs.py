"""Peak RSS and time per step of a reference_only run, with the read calls copying the banks out (``--before``: the
UNet's every output returned, as before Session.run(outputs=)) or not (the default).

    # a mid-size SD 1.x UNet (SD 1.5's layout at a quarter of its widths), random weights, on tiny-sd15-dyn's parts:
    /work/refvenv/bin/python scripts/bench_refonly_outputs.py export /tmp/mid-sd15
    # one process per figure (peak RSS is the process's high-water mark):
    python scripts/bench_refonly_outputs.py run tests/data/pipelines/tiny-sd15-dyn --size 512 --backend openvino
    python scripts/bench_refonly_outputs.py run /tmp/mid-sd15 --size 512 --backend ggml --before
    # one read call, whole against out_sample alone, interleaved:
    python scripts/bench_refonly_outputs.py calls /tmp/mid-sd15 --size 512 --backend ggml
    # SDXL's banks at 1024 (float16, 200 MiB a row) as a graph's outputs: what a read call copied out
    python scripts/bench_refonly_outputs.py synthetic --backend openvino --rows 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

TINY = Path(__file__).resolve().parents[1] / "tests" / "data" / "pipelines" / "tiny-sd15-dyn"


def export(out: Path) -> None:
    import torch
    from diffusers import UNet2DConditionModel
    from gen_pipeline_refs import _export, _Unet

    torch.manual_seed(0)
    shutil.copytree(TINY, out, dirs_exist_ok=True)
    unet = UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(80, 160, 320, 320),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, cross_attention_dim=32, norm_num_groups=16,
        attention_head_dim=8).eval()
    shutil.rmtree(out / "unet")
    axes = {0: "batch_size", 2: "height", 3: "width"}
    _export(_Unet(unet, False), (torch.randn(2, 4, 32, 36), torch.tensor([999.0, 999.0]), torch.randn(2, 77, 32)),
            out / "unet" / "model.onnx", ["sample", "timestep", "encoder_hidden_states"], ["out_sample"],
            {"sample": axes, "timestep": {0: "batch_size"}, "encoder_hidden_states": {0: "batch_size"},
             "out_sample": axes}, external=True)
    unet.save_config(out / "unet")
    print(f"{sum(p.numel() for p in unet.parameters()) / 1e6:.1f}M parameters in {out}")


def run(folder: Path, size: int, steps: int, backend: str, before: bool) -> None:
    import numpy as np

    from sdrt import pipelines
    from sdrt.pipelines import ControlNet, budget

    if before:  # every UNet call returns every output, the banks too (the read calls as they were)
        from sdrt.pipelines.parts import Part

        edit = Part.edit_graph
        Part.edit_graph = lambda self, e, key=None, hidden=None: edit(self, e, key, None)
    picture = (np.random.default_rng(0).random((size, size, 3)) * 255).astype(np.uint8)
    unit = ControlNet(None, picture, preprocessor="reference_only", scale=1.0)
    times: list[float] = []
    with pipelines.load(folder, backend=backend) as pipe:
        kw = dict(steps=steps, cfg=7.0, sampler="Euler", seed=1, width=size, height=size, controlnets=[unit])
        pipe.generate("a cat", "", **{**kw, "steps": 1})  # compiles
        rss0 = budget.current_rss()
        last = [time.perf_counter()]

        def tick(i, n, x):
            now = time.perf_counter()
            times.append(now - last[0])
            last[0] = now

        reset = budget.reset_peak()  # the steps' own high-water mark, not the compile's
        last[0] = time.perf_counter()
        pipe.generate("a cat", "", callback=tick, **kw)
        peak, source = budget.peak_rss()
        source += "" if reset else " (not reset: the whole process)"
    print(json.dumps({"folder": folder.name, "backend": backend, "size": size, "before": before,
                      "s_per_step_min": round(float(min(times[1:] or times)), 3),
                      "s_per_step_median": round(float(np.median(times[1:] or times)), 3),
                      "rss_after_compile_mib": round(rss0 / 2**20), "peak_rss_mib": round(peak / 2**20),
                      "source": source}))


def calls(folder: Path, size: int, backend: str, repeats: int) -> None:
    """One read call of the reference-edited UNet, whole (every output: the banks too) against ``out_sample`` alone,
    interleaved in one process: median seconds, the bytes returned, and the process's peak RSS above its resident
    size before each call (VmHWM reset per call)."""
    import numpy as np

    from sdrt import pipelines
    from sdrt.pipelines import budget, refattn

    with pipelines.load(folder, backend=backend) as pipe:
        from sdrt.pipelines import ipadapter as ipa

        unet = pipe.unet
        refattn.use_graph(unet, 0, ipa.heads_for(pipe.folder.configs, pipe.family.name, "unet"), True)
        lat = size // 8
        feeds = {"sample": np.zeros((2, 4, lat, lat), np.float32), "timestep": np.full((2,), 500.0, np.float32),
                 "encoder_hidden_states": np.zeros((2, 77, 32), np.float32)}
        layers = refattn.Layers(unet)
        for k, width in layers.widths.items():
            feeds[f"ref_bank_in_{k}"] = np.zeros((2, layers.tokens(k, lat, lat), width), np.float32)
            feeds[f"ref_mix_{k}"] = np.zeros((2, 1, 1), np.float32)
        unet.run(feeds, select=tuple(unet.outputs))  # compiles
        got: dict[str, list[float]] = {"whole": [], "out_sample": []}
        peaks: dict[str, list[int]] = {"whole": [], "out_sample": []}
        sizes = {}
        for _ in range(repeats):
            for how, select in (("whole", tuple(unet.outputs)), ("out_sample", ("out_sample",))):
                rss = budget.current_rss()
                budget.reset_peak()
                t0 = time.perf_counter()
                out = unet.run(feeds, select=select)
                got[how].append(time.perf_counter() - t0)
                peaks[how].append(budget.peak_rss()[0] - rss)
                sizes[how] = sum(np.asarray(v).nbytes for v in out.values())
                del out
    print(json.dumps({"folder": folder.name, "backend": backend, "size": size, "rows": 2, **{
        how: {"s_median": round(float(np.median(t)), 4), "s_min": round(min(t), 4),
              "returned_mib": round(sizes[how] / 2**20, 2), "peak_above_rss_mib": round(float(np.median(peaks[how]))
                                                                                      / 2**20, 1)}
        for how, t in got.items()}}))


def synthetic(backend: str, rows: int, repeats: int) -> None:
    """SDXL's banks at 1024 in float16 as a graph's outputs (10 layers of [rows, 4096, 640], 60 of [rows, 1024, 1280]:
    200 MiB a row) beside a small ``out``: a whole run against ``out`` alone. Median seconds and the peak of the
    arrays numpy allocates during the call (tracemalloc: what the session copies out), interleaved."""
    import tracemalloc

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import sdrt

    f16 = TensorProto.FLOAT16
    nodes, outs = [], [helper.make_tensor_value_info("out", f16, [rows, 4, 128, 128])]
    nodes.append(helper.make_node("Mul", ["s", "one"], ["out"]))
    for i in range(70):
        src, shape = ("z", [rows, 4096, 640]) if i < 10 else ("x", [rows, 1024, 1280])
        nodes.append(helper.make_node("Mul", [src, "one"], [f"ref_bank_{2 * i}"]))
        outs.append(helper.make_tensor_value_info(f"ref_bank_{2 * i}", f16, shape))
    ins = [helper.make_tensor_value_info("s", f16, [rows, 4, 128, 128]),
           helper.make_tensor_value_info("x", f16, [rows, 1024, 1280]),
           helper.make_tensor_value_info("z", f16, [rows, 4096, 640])]
    g = helper.make_graph(nodes, "banks", ins, outs, [numpy_helper.from_array(np.ones((), np.float16), "one")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float16)
             for i in ins}
    got: dict[str, list[float]] = {"whole": [], "out": []}
    peaks: dict[str, list[int]] = {"whole": [], "out": []}
    with sdrt.load(model, backend=backend) as sess:
        sess.run(feeds)
        tracemalloc.start()
        for _ in range(repeats):
            for how, names in (("whole", None), ("out", ["out"])):
                tracemalloc.reset_peak()
                t0 = time.perf_counter()
                res = sess.run(feeds, outputs=names)
                got[how].append(time.perf_counter() - t0)
                peaks[how].append(tracemalloc.get_traced_memory()[1])
                del res
        tracemalloc.stop()
    print(json.dumps({"graph": "SDXL-1024 fp16 banks", "backend": backend, "rows": rows, **{
        how: {"s_median": round(float(np.median(t)), 4), "copied_out_peak_mib": round(max(peaks[how]) / 2**20, 1)}
        for how, t in got.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("out", type=Path)
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--size", type=int, default=512)
    r.add_argument("--steps", type=int, default=4)
    r.add_argument("--backend", default="openvino")
    r.add_argument("--before", action="store_true")
    c = sub.add_parser("calls")
    c.add_argument("folder", type=Path)
    c.add_argument("--size", type=int, default=512)
    c.add_argument("--backend", default="ggml")
    c.add_argument("--repeats", type=int, default=5)
    y = sub.add_parser("synthetic")
    y.add_argument("--backend", default="ggml")
    y.add_argument("--rows", type=int, default=2)
    y.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    if a.cmd == "synthetic":
        synthetic(a.backend, a.rows, a.repeats)
    elif a.cmd == "export":
        export(a.out)
    elif a.cmd == "calls":
        calls(a.folder, a.size, a.backend, a.repeats)
    else:
        run(a.folder, a.size, a.steps, a.backend, a.before)


if __name__ == "__main__":
    sys.exit(main())
