"""Peak memory and time per step with and without a memory budget (docs/memory.md).

``flux``: a full-width, reduced-depth Flux.1 transformer body (``sdrt.testing.dit_blocks.flux_chain``: 3072
wide, 24 heads; random weights), one step, run whole and streamed under a budget, each in a fresh process
so each peak is its own. The weights are generated on access (``sdrt.Weights`` whose references make each
tensor when a session binds it, the way mapped file pages come in), so no multi-GB file is written.

``sd15``: the full-size SD 1.5 ONNX folder (/work/models/sd15-full/onnx) at 512x512, one step, with the
default budget and with ``memory=`` small: the measured peak RSS per stage beside the plan's prediction.

    PYTHONPATH=core/src /work/venv/bin/python scripts/memory_bench.py flux --double 1 --single 2
    PYTHONPATH=core/src /work/venv/bin/python scripts/memory_bench.py sd15 --memory 3GB

``prefetch``: the full-size SD 1.5 UNet alone (the folder's ``unet/model.onnx``, 3.44 GB of float32 weights in
``model.onnx_data``), streamed in groups under ``--memory``, one call, with the next group's weights read ahead
while the current one computes and without, alternating, each in a fresh process whose file pages were first
dropped from the page cache (``posix_fadvise(DONTNEED)`` on the weights file: a cold start, as after a reboot
or when other work has pushed the file out).

    PYTHONPATH=core/src /work/venv/bin/python scripts/memory_bench.py prefetch --memory 2GB --repeat 2

``sdxl``: the full-size SDXL single file (/work/models/single/sdxl_full_fp16.safetensors, random fp16 weights) at
1024x1024, one step, on OpenVINO and ggml at their default precision, each configuration in a fresh process with
a fresh compile cache (deleted after):
the plan's predicted peak per part beside the measured peak per stage. A run without ``--memory`` (the default
budget: what the OS has available) is made only when the machine has its predicted peak plus 1 GiB available.

    PYTHONPATH=core/src /work/venv/bin/python scripts/memory_bench.py sdxl --out sdxl.jsonl

``controlnet``: the full-size SD 1.5 diffusers folder and a full-size SD 1.5 ControlNet written by
``scripts/make_sd15_controlnet_full.py`` into ``--folder`` (a temp folder), 64x64, two Euler steps, under ``--memory``
with ``--low-memory on|off|auto``, optionally with the hires fix and a model upscaler (``--hires FILE``): the plan's
predicted peak per part beside the measured peak per stage (docs/memory.md, ControlNets released after their use).

    PYTHONPATH=scripts/_tvblock:scripts /work/refvenv/bin/python scripts/make_sd15_controlnet_full.py --out /tmp/cnfull
    PYTHONPATH=core/src:plugins/template/src /work/venv/bin/python scripts/memory_bench.py controlnet \
        --folder /tmp/cnfull --backend reference --memory 16GiB --low-memory on

Each run prints one JSON line; ``--out FILE`` appends it there. No torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def _synthetic(graph):
    """Weights for every weight-free initializer of ``graph``, made when read (seeded by name)."""
    import zlib

    from sdrt.weights.store import TensorRef, Weights

    refs = {}
    for t in graph.model.graph.initializer:
        if t.name not in graph.external_refs:  # small inline tensors (constants, biases): the graph's own
            refs[t.name] = TensorRef(t.name, np.dtype(graph.initializer_info()[t.name].dtype), tuple(t.dims),
                                     "graph", (lambda t=t: graph.tensor_array(t)))
            continue
        shape = tuple(int(d) for d in t.dims)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]

        seed = zlib.crc32(t.name.encode())

        def make(shape=shape, seed=seed, fan_in=fan_in):
            rng = np.random.default_rng(seed)
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(1 / np.sqrt(max(fan_in, 1)))

        refs[t.name] = TensorRef(t.name, np.dtype(np.float32), shape, "synthetic", make)
    return Weights(refs)


def flux_one(args) -> dict:
    """One configuration in this process: build (weight-free), plan, run one step; the peaks."""
    import sdrt
    from sdrt.graph import Graph
    from sdrt.pipelines.budget import current_rss, peak_rss, plan_memory, reset_peak
    from sdrt.pipelines.streaming import StreamedSession, split
    from sdrt.testing.dit_blocks import flux_chain

    cfg = {"dim": args.dim, "heads": args.dim // 128, "img": args.img, "txt": args.txt}
    model, feeds = flux_chain(args.double, args.single, cfg, stub=True)
    graph = Graph.load(model.SerializeToString(), base_dir=tempfile.gettempdir()).with_shapes()
    del model
    weights = _synthetic(graph)
    wbytes = weights.nbytes
    from sdrt.pipelines.lowmem import give_back
    from sdrt.runtime import select

    select(args.backend, None)  # the backend's libraries are loaded before the base is read
    give_back()
    base = current_rss()
    budget = None if args.mode == "whole" else int(args.memory)
    plan = plan_memory({"transformer": wbytes}, "transformer", budget, base=base,
                       split=lambda cap: [g.weight_bytes for g in split(graph, max_weight_bytes=cap)])
    p = plan.placement("transformer")
    opts = {"precision": "fp32", "cache": False} if args.backend == "openvino" else {}
    reset_peak()
    t0 = time.perf_counter()
    if p.placement == "streamed":
        sess = StreamedSession(graph, weights, max_weight_bytes=p.cap_bytes, backend=args.backend,
                               share=args.mode == "share", options=opts)
        load_s = 0.0
    else:
        sess = sdrt.load(graph, weights=weights, backend=args.backend, **opts)
        load_s = time.perf_counter() - t0
    steps = []
    for _ in range(args.steps):
        t = time.perf_counter()
        out = sess.run(feeds)["out_hidden_states"]
        steps.append(time.perf_counter() - t)
    peak, source = peak_rss()
    stream = (round(getattr(sess, "load_s", 0.0), 2), round(getattr(sess, "run_s", 0.0), 2))
    swaps = getattr(sess, "swaps", 0)
    sess.close()
    del sess
    t = time.perf_counter()  # what making the weights costs (a file's pages would be read instead)
    for name in weights:
        weights[name]
    gen_s = time.perf_counter() - t
    return {"bench": "flux", "mode": args.mode, "backend": args.backend, "double": args.double,
            "single": args.single, "tokens": args.img + args.txt, "weight_bytes": wbytes, "budget": budget,
            "base_rss": base, "placement": p.placement, "groups": len(p.groups) or 1,
            "group_max_bytes": max(p.groups) if p.groups else wbytes, "predicted_peak": p.peak_bytes,
            "measured_peak": peak, "peak_source": source, "load_s": round(load_s, 2),
            "step_s": [round(x, 2) for x in steps],
            "stream_load_s": stream[0], "stream_run_s": stream[1],
            "swaps": swaps, "weights_made_s": round(gen_s, 2), "out_checksum": float(np.abs(out).mean())}


def sd15_one(args) -> dict:
    from sdrt import pipelines

    opts = {"cache": False} if args.backend == "openvino" else {}  # the backend's default precision
    mem = {} if args.memory is None else {"memory": args.memory}
    pipe = pipelines.load(args.folder, backend=args.backend, **mem, **opts)
    t = time.perf_counter()
    gen = pipe.generate("a photograph of an astronaut riding a horse", steps=1, seed=1, width=512, height=512)
    took = time.perf_counter() - t
    plan = gen.memory
    return {"bench": "sd15", "backend": args.backend, "memory": args.memory, "seconds": round(took, 1),
            "budget": plan.budget_bytes, "base_rss": plan.base_bytes,
            "parts": [{"part": p.part, "placement": p.placement, "weights": p.weight_bytes,
                       "predicted_peak": p.peak_bytes, "groups": len(p.groups)} for p in plan.parts],
            "measured": plan.measured, "peak_source": plan.measured_source,
            "image_mean": float(np.asarray(gen.images[0]).mean())}


def drop_file_pages(path: str) -> None:
    """Evict ``path``'s pages from the page cache (only this file's, unlike /proc/sys/vm/drop_caches)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def prefetch_one(args) -> dict:
    """The SD 1.5 UNet streamed under ``--memory``, one call (batch 2, as CFG runs it), prefetch on or off."""
    from sdrt.graph import Graph
    from sdrt.pipelines.budget import current_rss, peak_rss, plan_memory, reset_peak
    from sdrt.pipelines.lowmem import give_back
    from sdrt.pipelines.streaming import StreamedSession, split
    from sdrt.runtime import select

    path = os.path.join(args.folder, "unet", "model.onnx")
    size = args.size // 8
    graph = Graph.load(path, load_external=False).with_shapes(
        {"sample": (2, 4, size, size), "timestep": (2,), "encoder_hidden_states": (2, 77, 768)})
    wbytes = sum(g.weight_bytes for g in split(graph, groups=1))
    select(args.backend, None)
    give_back()
    base = current_rss()
    plan = plan_memory({"unet": wbytes}, "unet", int(args.memory), base=base,
                       split=lambda cap: [g.weight_bytes for g in split(graph, max_weight_bytes=cap)])
    p = plan.placement("unet")
    rng = np.random.default_rng(0)
    feeds = {"sample": rng.standard_normal((2, 4, size, size), dtype=np.float32),
             "timestep": np.array([999, 999], dtype=np.float32 if graph.inputs[1].dtype == "float32" else np.int64),
             "encoder_hidden_states": rng.standard_normal((2, 77, 768), dtype=np.float32)}
    feeds = {i.name: feeds[i.name].astype(i.dtype) for i in graph.inputs}
    data = os.path.join(args.folder, "unet", "model.onnx_data")
    opts = {"cache": False} if args.backend == "openvino" else {}
    from sdrt.weights.pages import cached_fraction

    cached_before = cached_fraction(data)
    reset_peak()
    t0 = time.perf_counter()
    sess = StreamedSession(graph, None, max_weight_bytes=p.cap_bytes, backend=args.backend, options=opts,
                           prefetch=args.mode == "on")
    out = sess.run(feeds)
    took = time.perf_counter() - t0
    peak, source = peak_rss()
    res = {"bench": "prefetch", "prefetch": args.mode, "backend": args.backend, "size": args.size,
           "budget": int(args.memory), "groups": len(sess.groups), "predicted_peak": p.peak_bytes,
           "measured_peak": peak, "peak_source": source, "seconds": round(took, 2),
           "load_s": round(sess.load_s, 2), "run_s": round(sess.run_s, 2), "prefetched": sess.prefetched_bytes,
           "cached_before": round(cached_before, 3), "out_checksum": float(np.abs(next(iter(out.values()))).mean())}
    sess.close()
    return res


SDXL_FILE = "/work/models/single/sdxl_full_fp16.safetensors"
#: (backend, --memory) of the ``sdxl`` bench, in order (None: the default budget)
SDXL_RUNS = [("openvino", "6GB"), ("openvino", "12GB"), ("ggml", "6GB"), ("openvino", None)]


def sdxl_one(args) -> dict:
    """SDXL at ``--size``, one step, under ``--memory`` (or the default budget) on ``--backend``."""
    from sdrt import pipelines
    from sdrt.pipelines.budget import _size

    mem = {} if args.memory is None else {"memory": args.memory}
    pipe = pipelines.load(args.model, backend=args.backend, **mem)
    kw = dict(steps=1, seed=1, width=args.size, height=args.size)
    prompt = "a red fox in the snow"
    plan = pipe.plan(prompt, **kw).memory
    avail = None
    if args.memory is None:
        with open("/proc/meminfo") as f:
            avail = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable:"))
        if avail < plan.peak_bytes + 2**30:
            return {"bench": "sdxl", "backend": args.backend, "memory": None, "skipped":
                    f"MemAvailable {_size(avail)} < predicted peak {_size(plan.peak_bytes)} + 1 GiB"}
    t = time.perf_counter()
    gen = pipe.generate(prompt, **kw)
    took = time.perf_counter() - t
    plan = gen.memory
    return {"bench": "sdxl", "backend": args.backend, "memory": args.memory, "size": args.size,
            "seconds": round(took, 1), "budget": plan.budget_bytes, "budget_source": plan.budget_source,
            "base_rss": plan.base_bytes, "predicted_peak": plan.peak_bytes, "mem_available": avail,
            "parts": [{"part": p.part, "placement": p.placement, "weights": p.weight_bytes,
                       "activations": p.activation_bytes, "predicted_peak": p.peak_bytes, "groups": len(p.groups)}
                      for p in plan.parts],
            "measured": plan.measured, "peak_source": plan.measured_source,
            "plan": plan.format(), "image_mean": float(np.asarray(gen.images[0]).mean())}


def controlnet_one(args) -> dict:
    """The full-size SD 1.5 folder with a full-size ControlNet (``scripts/make_sd15_controlnet_full.py``), 64x64, two
    Euler steps, under ``--memory`` (set so that each stage's peak is its own) and ``--low-memory`` or not."""
    from sdrt import pipelines

    low = {"on": True, "off": False, "auto": None}[args.low_memory]
    pipe = pipelines.load(os.path.join(args.folder, "sd15"), backend=args.backend, memory=args.memory, low_memory=low)
    edges = np.zeros((64, 64, 3), np.uint8)
    edges[16:48, 30:34] = 255
    kw = dict(steps=2, seed=1, width=64, height=64, sampler="Euler",
              controlnets=[(os.path.join(args.folder, "controlnet"), edges, 1.0)])
    if args.hires:
        kw.update(hires_scale=2, hires_steps=1, hires_denoise=0.5, hires_upscaler=args.hires)
    t = time.perf_counter()
    gen = pipe.generate("a fox", **kw)
    took = time.perf_counter() - t
    plan = gen.memory
    return {"bench": "controlnet", "backend": args.backend, "memory": args.memory, "low_memory": args.low_memory,
            "hires": args.hires, "seconds": round(took, 1), "budget": plan.budget_bytes, "base_rss": plan.base_bytes,
            "parts": [{"part": p.part, "placement": p.placement, "weights": p.weight_bytes,
                       "activations": p.activation_bytes, "predicted_peak": p.peak_bytes} for p in plan.parts],
            "measured": plan.measured, "peak_source": plan.measured_source, "plan": plan.format(),
            "image_mean": float(np.asarray(gen.images[0]).mean())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bench", choices=["flux", "sd15", "prefetch", "sdxl", "controlnet"])
    ap.add_argument("--model", default=SDXL_FILE, help="sdxl: the single file")
    ap.add_argument("--mode", default="all", choices=["all", "whole", "stream", "share", "on", "off", "one"])
    ap.add_argument("--size", type=int, default=512, help="prefetch: image size")
    ap.add_argument("--repeat", type=int, default=1, help="prefetch: off/on pairs")
    ap.add_argument("--dim", type=int, default=3072, help="width (3072: Flux.1; heads of 128)")
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=2)
    ap.add_argument("--img", type=int, default=256, help="image tokens (256: a 256x256 image)")
    ap.add_argument("--txt", type=int, default=256, help="text tokens")
    ap.add_argument("--memory", default=None, help="budget (flux: required for stream/share)")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--backend", default="openvino")
    ap.add_argument("--folder", default="/work/models/sd15-full/onnx")
    ap.add_argument("--out", default=None)
    ap.add_argument("--low-memory", default="on", choices=["on", "off", "auto"], help="controlnet: low_memory")
    ap.add_argument("--hires", default=None, help="controlnet: a hires fix with this upscaler (a model file)")
    args = ap.parse_args()
    from sdrt.pipelines.budget import parse_memory

    if args.bench == "flux" and args.mode == "all":
        for mode in ("whole", "stream", "share"):
            cmd = [sys.executable, __file__, "flux", "--mode", mode, *sys.argv[2:]]
            subprocess.run(cmd, check=False)
        return
    if args.bench == "sdxl" and args.mode == "all":  # each configuration in a fresh process
        import shutil

        rest = sys.argv[2:]
        for backend, memory in SDXL_RUNS:
            cmd = [sys.executable, __file__, "sdxl", "--mode", "one", "--backend", backend, "--size", "1024",
                   *(["--memory", memory] if memory else []), *rest]
            # a fresh compile cache each time (a first run: every part compiled, its blob stored), deleted after:
            # a streamed UNet stores each of its groups (several GB)
            cache = tempfile.mkdtemp(prefix="sdrt-sdxl-cache-")
            try:
                subprocess.run(cmd, check=False, env={**os.environ, "SDRT_CACHE_DIR": cache})
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        return
    if args.bench == "prefetch" and args.mode == "all":
        data = os.path.join(args.folder, "unet", "model.onnx_data")
        for _ in range(args.repeat):
            for mode in ("off", "on"):
                drop_file_pages(data)
                cmd = [sys.executable, __file__, "prefetch", "--mode", mode, *sys.argv[2:]]
                subprocess.run(cmd, check=False)
        return
    if args.bench in ("flux", "prefetch") and args.mode != "whole":
        args.memory = parse_memory(args.memory, "--memory")
    result = (flux_one(args) if args.bench == "flux" else prefetch_one(args) if args.bench == "prefetch"
              else sdxl_one(args) if args.bench == "sdxl" else controlnet_one(args) if args.bench == "controlnet"
              else sd15_one(args))
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
