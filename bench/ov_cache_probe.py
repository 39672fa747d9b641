"""Raw OpenVINO, no sdrt: what a cached compile and a cache hit cost on the full-size SD 1.5 UNet (issue 38).

    python -m bench.ov_cache_probe                  # every step, each in a fresh process, bf16, 256x256
    python -m bench.ov_cache_probe --steps compile,import-tensor

Steps, in order (the later ones read the blobs the earlier ones wrote): ``compile`` (no cache), ``compile-cache``
(``CACHE_DIR``, a miss: hash + compile + write the blob), ``hit-model`` (the same ``compile_model`` again: hash +
import), ``import-tensor`` (``import_model`` of an ``ov.Tensor`` over a copy-on-write map of the blob, as sdrt's
cache hit does), ``import-stream`` (the blob read into Python and imported from a ``BytesIO``), ``compile-half``
(the model's float32 constants made float16 + decompression ``Convert``, as sdrt's ``convert.half_weights``, then
``CACHE_DIR``), ``import-half`` (its blob, mapped). Each prints its seconds, the blob's size, the process's peak
RSS and two UNet calls; the first step's output is the reference the others' max difference is given against.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STEPS = "compile,compile-cache,hit-model,import-tensor,import-stream,compile-half,import-half"
#: also: ``nocache-half`` (float16 constants, no cache), ``export-half`` (that, then ``export_model`` to a file)


def _one(step: str, onnx: str, folder: str, hint: str, size: int) -> None:
    import io
    import resource

    import openvino as ov

    core = ov.Core()
    lat = size // 8
    shapes = {"sample": [2, 4, lat, lat], "timestep": [2], "encoder_hidden_states": [2, 77, 768]}
    props = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
    half = step.endswith("half")
    cache = os.path.join(folder, "half" if half else "full")
    os.makedirs(cache, exist_ok=True)

    def model():
        m = core.read_model(onnx)
        m.reshape(shapes)
        if half:
            from openvino._offline_transformations import compress_model_transformation

            t = time.perf_counter()
            compress_model_transformation(m)
            print(f"  float16 constants: {time.perf_counter() - t:.2f} s", flush=True)
        return m

    def blob():
        path = glob.glob(cache + "/*.blob")[0]
        head = open(path, "rb").read(4096)
        return path, (head.find(b"\n") + 1 if head.startswith(b"<?xml") else 0)

    extra = ""
    if step in ("compile", "nocache-half"):
        m = model()
        t = time.perf_counter()
        compiled = core.compile_model(m, "CPU", props)
    elif step == "export-half":  # no CACHE_DIR: compile, then export_model's whole blob in memory to a file
        m = model()
        t = time.perf_counter()
        compiled = core.compile_model(m, "CPU", props)
        t1 = time.perf_counter()
        with open(os.path.join(cache, "exported.blob"), "wb") as f:
            f.write(compiled.export_model().getbuffer())
        extra = f" (compile {t1 - t:.2f} s, export + write {time.perf_counter() - t1:.2f} s)"
    elif step in ("compile-cache", "hit-model", "compile-half"):
        m = model()
        t = time.perf_counter()
        compiled = core.compile_model(m, "CPU", {**props, "CACHE_DIR": cache})
    elif step in ("import-tensor", "import-half"):
        path, off = blob()
        t = time.perf_counter()
        mapped = np.memmap(path, dtype=np.uint8, mode="c", offset=off)
        compiled = core.import_model(ov.Tensor(mapped, shared_memory=True), "CPU", props)
    elif step == "import-stream":
        path, off = blob()
        t = time.perf_counter()
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read()
        extra = f" (read {time.perf_counter() - t:.2f} s)"
        compiled = core.import_model(io.BytesIO(data), "CPU", props)
    else:
        raise SystemExit(f"unknown step {step!r}; steps: {STEPS}")
    took = time.perf_counter() - t
    size_b = sum(os.path.getsize(p) for p in glob.glob(cache + "/*.blob"))
    rng = np.random.default_rng(0)
    feeds = {"sample": rng.standard_normal((2, 4, lat, lat), dtype=np.float32),
             "timestep": np.array([999.0, 999.0], np.float32),
             "encoder_hidden_states": rng.standard_normal((2, 77, 768), dtype=np.float32)}
    req = compiled.create_infer_request()
    calls = []
    for _ in range(2):
        t = time.perf_counter()
        req.infer(feeds)
        calls.append(time.perf_counter() - t)
    out = req.get_output_tensor(0).data.copy()
    ref_path = os.path.join(folder, "reference.npy")
    if not os.path.exists(ref_path):
        np.save(ref_path, out)
    diff = float(np.abs(out - np.load(ref_path)).max())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{step:14s} {took:6.2f} s{extra}  blob {size_b / 1e9:.3f} GB  peak RSS {peak:.2f} GiB  "
          f"calls {calls[0]:.2f} / {calls[1]:.2f} s  max diff vs first step {diff:.3g}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("SDRT_E2E_MODEL", "/work/models/sd15-full")))
    ap.add_argument("--steps", default=STEPS)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    onnx = str(args.model / "onnx" / "unet" / "model.onnx")
    if args.one:
        _one(args.one[0], onnx, args.one[1], args.precision, args.size)
        return 0
    with tempfile.TemporaryDirectory(prefix="ov-cache-probe-") as folder:
        for step in args.steps.split(","):
            subprocess.run([sys.executable, "-m", "bench.ov_cache_probe", "--model", str(args.model),
                            "--precision", args.precision, "--size", str(args.size), "--one", step, folder],
                           check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
