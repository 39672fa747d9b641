"""The pipeline row: time per sampling step of ``sdrt.pipelines`` against raw UNet ``Session.run`` calls.

    python -m bench.pipeline                          # every installed backend but reference, 20 steps
    python -m bench.pipeline --backends openvino --steps 20 --rounds 5

It assembles a model folder (Optimum layout) from the bench models of ``sdrt.testing.models``: the
bench-size UNet, the CLIP ViT-L-size text encoder, a VAE decoder at the UNet's latent size, CLIP's
real tokenizer (``tests/data/clip-tokenizer``) and SD 1.5's scheduler config. The bench UNet has a
fixed batch of 1, so the runs use ``cfg=1`` (one UNet pass per step, as with guidance off).

Per backend and round: one 20-step ``generate`` (the CLI's default sampler DPM++ 2M Karras), and after
each of its steps, from the step callback, one raw ``Session.run`` on the very session the pipeline
compiled, with feeds of the same shapes: so pipeline steps and raw runs interleave and load from other
processes hits both alike. Reported: median ms per pipeline step (callback to callback, the raw run
taken out), median ms per raw run, their ratio (the pipeline's overhead per step), and tokenize +
encode of the prompt and the negative prompt (as a CFG run encodes both) as a share of the run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "clip-tokenizer"
PROMPT = ("a photograph of an astronaut riding a horse on the moon, detailed, sharp focus, "
          "(masterpiece:1.2), by a famous photographer")
NEGATIVE = "blurry, lowres, watermark, [text]"
SD15_SCHEDULER = {"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
                  "beta_start": 0.00085, "num_train_timesteps": 1000, "set_alpha_to_one": False,
                  "skip_prk_steps": True, "steps_offset": 1, "clip_sample": False}


def build_folder(workdir: Path, size: str = "bench") -> Path:
    """The bench models as a model folder (built once per size and models-source version)."""
    import hashlib

    import onnx

    from sdrt.testing import models

    src = Path(models.__file__).read_bytes() + Path(__file__).read_bytes()
    folder = workdir / f"pipeline-{size}-{hashlib.sha256(src).hexdigest()[:10]}"
    if (folder / "model_index.json").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    latent = models.SIZES["unet"][size]["latent"]
    models.SIZES["vae_decoder"]["pipeline"] = dict(models.SIZES["vae_decoder"][size], latent=latent)
    try:
        parts = {"unet": models.build("unet", size)[0], "text_encoder": models.build("text_encoder", size)[0],
                 "vae_decoder": models.vae_decoder("pipeline")[0]}
    finally:
        del models.SIZES["vae_decoder"]["pipeline"]
    for name, model in parts.items():
        (tmp / name).mkdir(parents=True)
        onnx.save_model(model, str(tmp / name / "model.onnx"))
    (tmp / "tokenizer").mkdir()
    for f in TOKENIZER.iterdir():
        if f.is_file():
            shutil.copy(f, tmp / "tokenizer" / f.name)
    (tmp / "scheduler").mkdir()
    (tmp / "scheduler" / "scheduler_config.json").write_text(json.dumps(SD15_SCHEDULER))
    (tmp / "unet" / "config.json").write_text(json.dumps({"sample_size": latent}))
    (tmp / "model_index.json").write_text(json.dumps({"_class_name": "ORTStableDiffusionPipeline"}))
    tmp.rename(folder)
    return folder


def bench_backend(folder: Path, backend: str, steps: int, rounds: int) -> dict[str, Any]:
    from sdrt import pipelines
    from sdrt.text import tokenize_prompt

    pipe = pipelines.load(folder, backend=backend)
    try:
        pipe(PROMPT, NEGATIVE, steps=2, cfg=1.0, seed=0)  # compile every part once
        (key, unet), = pipe.unet.sessions.items()
        rng = np.random.default_rng(0)
        feeds = {name: (rng.standard_normal(dims).astype(np.float32) if name != "timestep"
                        else np.full(dims, 500.0, np.float32)) for name, dims in key[0]}
        step_ms: list[float] = []
        raw_ms: list[float] = []
        encode_share, tokenize_share, run_ms = [], [], []
        for _ in range(rounds):
            pipe.prompts._cache.clear()
            t0 = time.perf_counter()
            for enc in pipe.prompts.encoders:
                tokenize_prompt(enc.tokenizer, PROMPT)
                tokenize_prompt(enc.tokenizer, NEGATIVE)
            tok_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            pipe.prompts.encode(PROMPT)
            pipe.prompts.encode(NEGATIVE)
            encode_s = time.perf_counter() - t0
            pipe.prompts._cache.clear()
            # interleaved: after each pipeline step, one raw run of the same session; the step's time is
            # from the end of that raw run to the next callback
            mark = [0.0]

            def after_step(i: int, n: int, x: np.ndarray, mark: list[float] = mark) -> None:
                now = time.perf_counter()
                if i > 1:
                    step_ms.append((now - mark[0]) * 1e3)
                r0 = time.perf_counter()
                unet.run(feeds)
                raw_ms.append((time.perf_counter() - r0) * 1e3)
                mark[0] = time.perf_counter()

            gen_start = time.perf_counter()
            pipe.generate(PROMPT, NEGATIVE, steps=steps, cfg=1.0, seed=1, callback=after_step)
            run_s = time.perf_counter() - gen_start - sum(raw_ms[-steps:]) / 1e3
            run_ms.append(run_s * 1e3)
            encode_share.append(encode_s / run_s)
            tokenize_share.append(tok_s / run_s)
        step, raw = statistics.median(step_ms), statistics.median(raw_ms)
        return {"backend": backend, "steps": steps, "rounds": rounds, "step_ms": step, "raw_unet_ms": raw,
                "overhead": step / raw - 1, "encode_share": statistics.median(encode_share),
                "tokenize_share": statistics.median(tokenize_share),
                "run_ms": statistics.median(run_ms)}
    finally:
        pipe.close()


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| backend | ms/step (pipeline) | ms/run (raw UNet) | pipeline overhead/step | tokenize+encode share "
             "of a run | of which tokenize | run ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| sdrt-{r['backend']} | {r['step_ms']:.2f} | {r['raw_unet_ms']:.2f} | {r['overhead']:+.1%} | "
                     f"{r['encode_share']:.1%} | {r['tokenize_share']:.3%} | {r['run_ms']:.0f} |")
    return "\n".join(lines)


def report(backends: list[str], workdir: Path, size: str = "bench", steps: int = 20, rounds: int = 3) -> list[dict]:
    """Build the folder, time each backend, print the table; returns the rows."""
    if size != "bench":
        print(f"[pipeline] skipped at size {size}: only the bench size has a CLIP-sized text encoder", flush=True)
        return []
    print(f"[pipeline] {steps}-step generate vs raw UNet runs, cfg 1, {rounds} rounds ...", flush=True)
    folder = build_folder(workdir, size)
    rows = [bench_backend(folder, b, steps, rounds) for b in backends]
    print(render(rows), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from platformdirs import user_cache_dir

    from . import harness

    p = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default=None, help="comma-separated (default: every installed one but reference)")
    p.add_argument("--size", default="bench", choices=["bench"], help="the tiny bench text encoder has no CLIP vocabulary")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path(user_cache_dir("sdrt")) / "bench-models")
    args = p.parse_args(argv)
    only = [b for b in args.backends.split(",") if b] if args.backends else None
    report(harness.sdrt_backends(False, only), args.workdir, args.size, args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
