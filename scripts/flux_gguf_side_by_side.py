"""One 256x256 step of full-depth Flux.1 dev from GGUF files, sdrt (ggml, a memory budget) beside
stable-diffusion.cpp (``stable-diffusion-cpp-python``) on the same files; each in a fresh process.

The files come from ``scripts/make_flux_gguf_full.py`` (random weights): ``flux1-dev-{Q8_0,Q4_K}.gguf``,
``t5xxl-encoder-Q8_0.gguf`` (llama.cpp names), ``clip_l.safetensors``, ``ae.safetensors``. Each run prints one
JSON line: load seconds, image seconds (prompt to pixels), peak RSS (the process's ``VmHWM``), and for sdrt the
plan's predicted peak and the measured peak per stage.

    /work/venv/bin/python scripts/flux_gguf_side_by_side.py sdrt Q4_K --memory 12GB     # this checkout's sdrt
    /work/e2evenv/bin/python scripts/flux_gguf_side_by_side.py sdcpp Q4_K              # stable-diffusion.cpp
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a red fox sitting in fresh snow, golden hour"


def hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run_sdcpp(d: Path, qtype: str, size: int, steps: int, threads: int) -> dict:
    from stable_diffusion_cpp import StableDiffusion

    t0 = time.perf_counter()
    sd = StableDiffusion(diffusion_model_path=str(d / f"flux1-dev-{qtype}.gguf"), clip_l_path=str(d / "clip_l.safetensors"),
                         t5xxl_path=str(d / "t5xxl-encoder-Q8_0.gguf"), vae_path=str(d / "ae.safetensors"),
                         n_threads=threads, verbose=False)
    t1 = time.perf_counter()
    images = sd.generate_image(PROMPT, width=size, height=size, sample_steps=steps, cfg_scale=1.0, guidance=3.5,
                               sample_method="euler", seed=42)
    t2 = time.perf_counter()
    images[0].save(d / f"sdcpp-{qtype}.png")
    return {"contender": "stable-diffusion.cpp", "load_s": t1 - t0, "image_s": t2 - t1}


def run_sdrt(d: Path, qtype: str, size: int, steps: int, memory: str | None, max_seq: int | None) -> dict:
    sys.path.insert(0, str(ROOT / "core" / "src"))
    from sdrt import pipelines

    t0 = time.perf_counter()
    pipe = pipelines.load(d / f"flux1-dev-{qtype}.gguf", backend="ggml", memory=memory,
                          text_encoders=[d / "clip_l.safetensors", d / "t5xxl-encoder-Q8_0.gguf"], vae=d / "ae.safetensors")
    t1 = time.perf_counter()
    kw = dict(width=size, height=size, steps=steps, guidance=3.5, sampler="Euler", seed=42)
    if max_seq:
        kw["max_sequence_length"] = max_seq
    images = pipe(PROMPT, **kw)
    t2 = time.perf_counter()
    from PIL import Image

    Image.fromarray(images[0]).save(d / f"sdrt-{qtype}.png")
    out = {"contender": "sdrt-ggml", "memory": memory, "max_sequence_length": max_seq or "family default (512)", "load_s": t1 - t0, "image_s": t2 - t1}
    plan = pipe._measured()  # the budget's plan with the measured peak per stage
    if plan is not None:
        out.update(predicted_peak_bytes=plan.peak_bytes, fits=plan.fits, stage_peaks=plan.measured,
                   plan=plan.format())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("who", choices=["sdrt", "sdcpp"])
    ap.add_argument("qtype", choices=["Q8_0", "Q4_K"])
    ap.add_argument("--dir", type=Path, default=Path("/work/models/flux-gguf"))
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--memory", default="12GB")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seq", type=int, default=None,
                    help="sdrt's T5 max_sequence_length (stable-diffusion.cpp pads T5 to 256 tokens; Flux dev's own is 512)")
    a = ap.parse_args()
    if a.who == "sdcpp":
        out = run_sdcpp(a.dir, a.qtype, a.size, a.steps, a.threads)
    else:
        out = run_sdrt(a.dir, a.qtype, a.size, a.steps, a.memory or None, a.max_seq)
    out.update(qtype=a.qtype, size=a.size, steps=a.steps, peak_rss_bytes=hwm())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
