"""sdrt-ggml on an NVIDIA GPU against PyTorch eager on the same GPU (issue 20, point 5).

Run on a machine with an NVIDIA GPU, torch (CUDA), diffusers, transformers, torchvision,
onnxruntime, sdrt and sdrt-ggml, with ggml-python built for CUDA:

    CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native" pip install --no-binary ggml-python ggml-python
    python scripts/ggml_cuda_check.py OUT.json [--full] [--budget SECONDS] [--part exports|bench]

For each real export of ``make_ggml_exports`` (the same torch modules, seeded random weights),
and with ``--full`` the SD 1.5 VAE decoder at full width on a 64x64 latent (512x512 image):

- PyTorch eager on the GPU at fp32 (TF32 off) and fp16 (``module.half()``): time per call with
  the inputs already on the GPU, and with the host copies counted as sdrt's numpy API counts them;
- sdrt-ggml on ``CUDA0`` at fp32 (the export as it is) and fp16 (``sdrt.precision.to_half``):
  compile time, time per ``Session.run``, and the error against onnxruntime on the CPU;
- onnxruntime on the CPU as the accuracy reference (and PyTorch's own error against it).

Also the bench models (``sdrt.testing.models``, no torch counterpart): ggml on CUDA0 and on the
CPU, and onnxruntime on the CPU. Every row is written to OUT.json as soon as it is measured, so a
run stopped by a time limit keeps what it has. Errors are max |a-b| / max |ref|.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROW = len(sys.argv) > 1 and sys.argv[1] == "--row"  # a child measuring sdrt: no torch in that process
if not ROW:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_ggml_exports as exports

REPEATS = 10
GPU = not ROW and torch.cuda.is_available()
TORCH_DEV = "cuda" if GPU else "cpu"
GGML_DEV = "CUDA0" if GPU else "CPU"  # without a GPU the script still runs end to end (a smoke test)
BENCH = ("vae_decoder", "unet", "text_encoder", "mobilenet_v2", "mobilenet_v3")


def _median_time(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up (cuBLAS/cuDNN handles, ggml graph allocation)
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _torch_rows(module: torch.nn.Module, feeds: dict[str, np.ndarray], ref: np.ndarray) -> dict:
    out: dict = {}
    for label, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        m = copy.deepcopy(module).to(TORCH_DEV, dtype).eval()
        args = [torch.from_numpy(v).to(TORCH_DEV, dtype if v.dtype.kind == "f" else None) for v in feeds.values()]

        def call(m=m, args=args):
            with torch.no_grad():
                r = m(*args)
            return r[0] if isinstance(r, (tuple, list)) else r

        def resident(call=call):
            call()
            if GPU:
                torch.cuda.synchronize()

        def with_copies(m=m, dtype=dtype):
            a = [torch.from_numpy(v).to(TORCH_DEV, dtype if v.dtype.kind == "f" else None) for v in feeds.values()]
            with torch.no_grad():
                r = m(*a)
            (r[0] if isinstance(r, (tuple, list)) else r).float().cpu().numpy()

        got = call().float().cpu().numpy()
        out[f"torch_{label}_ms"] = 1e3 * _median_time(resident)
        out[f"torch_{label}_copies_ms"] = 1e3 * _median_time(with_copies)
        out[f"torch_{label}_err"] = _err(got, ref)
        del m
        if GPU:
            torch.cuda.empty_cache()
    return out


def _sdrt_rows(path: Path, feeds: dict[str, np.ndarray], ref: np.ndarray, first: str, device: str,
               labels=("fp32", "fp16")) -> dict:
    """sdrt-ggml's rows, measured in a child process (no torch in it, and an abort costs one row)."""
    import subprocess

    np.savez(path.with_suffix(".feeds.npz"), **feeds)
    np.save(path.with_suffix(".ref.npy"), ref)
    out: dict = {}
    for label in labels:
        proc = subprocess.run([sys.executable, __file__, "--row", str(path), first, device, label],
                              capture_output=True, text=True, timeout=600)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            out.update(json.loads(lines[-1]))
        else:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            out[f"ggml_{device}_{label}_error"] = f"exit {proc.returncode}: {tail}"[:400]
    return out


def _row(path: Path, first: str, device: str, label: str) -> dict:
    import sdrt
    from sdrt.precision import to_half

    feeds = dict(np.load(path.with_suffix(".feeds.npz")))
    ref = np.load(path.with_suffix(".ref.npy"))
    out: dict = {}
    try:
        graph = sdrt.Graph.load(str(path))
        if label == "fp16":
            graph = to_half(graph)
        t = time.perf_counter()
        session = sdrt.load(graph, backend="ggml", device=device)
        out[f"ggml_{device}_{label}_compile_s"] = time.perf_counter() - t
        with session:
            got = session.run(feeds)[first]
            out[f"ggml_{device}_{label}_ms"] = 1e3 * _median_time(lambda s=session: s.run(feeds))
        out[f"ggml_{device}_{label}_err"] = _err(got, ref)
    except Exception as exc:  # noqa: BLE001 - a row that fails is reported, the run goes on
        out[f"ggml_{device}_{label}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return out


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> tuple[str, np.ndarray, float]:
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    first = s.get_outputs()[0].name
    ref = s.run([first], feeds)[0]
    return first, ref, 1e3 * _median_time(lambda: s.run([first], feeds), 5)


def _full_vae() -> tuple[torch.nn.Module, dict[str, np.ndarray], list[str]]:
    """SD 1.5's VAE decoder at full width (diffusers' AutoencoderKL with SD's block widths)."""
    vae = exports._vae(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                       down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
    rng = np.random.default_rng(0)
    return exports._Decoder(vae), {"latent": rng.standard_normal((1, 4, 64, 64)).astype(np.float32)}, ["image"]


def main(argv: list[str]) -> int:
    if argv[0] == "--row":
        print(json.dumps(_row(Path(argv[1]), argv[2], argv[3], argv[4])))
        return 0
    out_path = Path(argv[0])
    full = "--full" in argv
    budget = float(argv[argv.index("--budget") + 1]) if "--budget" in argv else 1e9
    start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import subprocess

    info = subprocess.run([sys.executable, "-m", "sdrt", "info"], capture_output=True, text=True).stdout
    report: dict = {"gpu": torch.cuda.get_device_name(0) if GPU else "none", "torch": torch.__version__,
                    "devices": [ln.strip() for ln in info.splitlines() if "device ggml:" in ln],  # in a child: ggml's CUDA
                    # runtime and torch's in one process abort (free(): invalid pointer)
                    "exports": {}, "bench": {}}

    def save() -> None:
        out_path.write_text(json.dumps(report, indent=1))

    tmp = Path(tempfile.mkdtemp())
    part = argv[argv.index("--part") + 1] if "--part" in argv else "all"  # exports, bench or all
    names = (list(exports.ALL) + (["vae_decoder_full"] if full else [])) if part in ("all", "exports") else []
    for name in names:
        if time.perf_counter() - start > budget:
            report["exports"][name] = {"skipped": "time budget"}
            continue
        row: dict = {}
        try:
            module, feeds, outs = _full_vae() if name == "vae_decoder_full" else exports.make(name)
            path = tmp / f"{name}.onnx"
            exports._export(module, tuple(torch.from_numpy(v) for v in feeds.values()), list(feeds), outs, path)
            first, ref, row["ort_cpu_ms"] = _ort(path, feeds)
            row.update(_torch_rows(module, feeds, ref))
            row.update(_sdrt_rows(path, feeds, ref, first, GGML_DEV))
        except Exception:  # noqa: BLE001 - reported in the row
            row["error"] = traceback.format_exc(limit=3)[-600:]
        report["exports"][name] = row
        print(name, json.dumps(row), flush=True)
        save()

    from sdrt.testing.models import build

    for name in BENCH if part in ("all", "bench") else ():
        for size in ("bench", "full"):
            key = f"{name}@{size}"
            if time.perf_counter() - start > budget:
                report["bench"][key] = {"skipped": "time budget"}
                continue
            row = {}
            try:
                import onnx

                model, feeds = build(name, size)
                path = tmp / f"bench_{name}_{size}.onnx"
                onnx.save(model, str(path), save_as_external_data=True, location=f"bench_{name}_{size}.data")
                first, ref, row["ort_cpu_ms"] = _ort(path, feeds)
                row.update(_sdrt_rows(path, feeds, ref, first, GGML_DEV))
                row.update(_sdrt_rows(path, feeds, ref, first, "CPU", labels=("fp32",)))
            except Exception:  # noqa: BLE001 - reported in the row
                row["error"] = traceback.format_exc(limit=3)[-600:]
            report["bench"][key] = row
            print(key, json.dumps(row), flush=True)
            save()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
