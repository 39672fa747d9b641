"""The pipeline row: time per sampling step of ``sdrt.pipelines`` against raw UNet ``Session.run`` calls.

    python -m bench.pipeline                          # every installed backend but reference, 20 steps, cfg 7
    python -m bench.pipeline --backends openvino --steps 20 --rounds 5
    python -m bench.pipeline --macs                   # multiply-adds of the bench models against SD 1.5's

It assembles a model folder (Optimum layout) from the bench models of ``sdrt.testing.models``: the
bench-size UNet with a dynamic batch axis (as diffusers' and Optimum's exports have), the CLIP
ViT-L-size text encoder, a VAE decoder at the UNet's latent size, CLIP's real tokenizer
(``tests/data/clip-tokenizer``) and SD 1.5's scheduler config. The runs are what a user's are:
classifier-free guidance at cfg 7 with a prompt and a negative prompt, so each step is one UNet
pass over a batch of 2 (uncond and cond rows).

Per backend and round: one 20-step ``generate`` (the CLI's default sampler DPM++ 2M Karras), and after
each of its steps, from the step callback, one raw ``Session.run`` on the very session the pipeline
compiled, with the same feeds (the encoded prompts, the step's latents): so pipeline steps and raw
runs interleave and load from other processes hits both alike. Reported: median ms per pipeline step
(callback to callback, the raw run taken out), median ms per raw run, the pipeline's overhead per
step (the median over steps of each step's time over the raw run right after it, paired so that
load drift cancels; and the ratio of the two medians), and tokenize + encode of the prompt and the
negative prompt as a share of the run (the whole ``generate``: encode, 20 steps, VAE decode).
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
CFG = 7.0  # A1111's and the CLI's default: guidance on, so every step runs the UNet on uncond and cond
SD15_SCHEDULER = {"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
                  "beta_start": 0.00085, "num_train_timesteps": 1000, "set_alpha_to_one": False,
                  "skip_prk_steps": True, "steps_offset": 1, "clip_sample": False}


def build_folder(workdir: Path, size: str = "bench") -> Path:
    """The bench models as a model folder (built once per size and models-source version)."""
    import hashlib
    import inspect

    import onnx

    from sdrt.testing import builder, models

    # what the folder is made of: the model builders and this function (not the timing code)
    src = (Path(models.__file__).read_bytes() + Path(builder.__file__).read_bytes()
           + inspect.getsource(build_folder).encode() + json.dumps(SD15_SCHEDULER).encode())
    folder = workdir / f"pipeline-{size}-{hashlib.sha256(src).hexdigest()[:10]}"
    if (folder / "model_index.json").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    latent = models.SIZES["unet"][size]["latent"]
    models.SIZES["vae_decoder"]["pipeline"] = dict(models.SIZES["vae_decoder"][size], latent=latent)
    try:
        parts = {"unet": models.unet(size, batch="batch")[0], "text_encoder": models.build("text_encoder", size)[0],
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


def bench_backend(folder: Path, backend: str, steps: int, rounds: int, cfg: float = CFG) -> dict[str, Any]:
    from sdrt import pipelines
    from sdrt.text import tokenize_prompt

    pipe = pipelines.load(folder, backend=backend)
    try:
        pipe(PROMPT, NEGATIVE, steps=2, cfg=cfg, seed=0)  # compile every part once, at the UNet batch of this cfg
        (key, unet), = pipe.unet.sessions.items()
        rows = dict(key[0])["sample"][0]
        # the raw runs get the values the pipeline's UNet calls get: the encoded prompt (and negative
        # prompt) and, at each step, the current latents, so value-dependent costs hit both alike
        conds = [pipe.prompts.encode(t).hidden for t in ((NEGATIVE, PROMPT) if rows == 2 else (PROMPT,))]
        feeds = {"encoder_hidden_states": np.concatenate(conds, axis=0),
                 "timestep": np.full((rows,), 500.0, np.float32)}
        step_ms: list[float] = []
        raw_ms: list[float] = []
        paired: list[float] = []  # each pipeline step over the raw run right after it
        encode_share, tokenize_share, run_ms = [], [], []
        texts = (PROMPT, NEGATIVE) if cfg != 1.0 else (PROMPT,)  # what generate encodes (no negative at cfg 1)
        for _ in range(rounds):
            pipe.prompts._cache.clear()
            t0 = time.perf_counter()
            for enc in pipe.prompts.encoders:
                for text in texts:
                    tokenize_prompt(enc.tokenizer, text)
            tok_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for text in texts:
                pipe.prompts.encode(text)
            encode_s = time.perf_counter() - t0
            pipe.prompts._cache.clear()
            # interleaved: after each pipeline step, one raw run of the same session; the step's time is
            # from the end of that raw run to the next callback
            mark = [0.0]

            def after_step(i: int, n: int, x: np.ndarray, mark: list[float] = mark) -> None:
                now = time.perf_counter()
                sample = np.concatenate([x] * rows, axis=0) if rows > 1 else x
                r0 = time.perf_counter()
                unet.run({**feeds, "sample": sample})
                raw_ms.append((time.perf_counter() - r0) * 1e3)
                if i > 1:
                    step_ms.append((now - mark[0]) * 1e3)
                    paired.append(step_ms[-1] / raw_ms[-1])
                mark[0] = time.perf_counter()

            gen_start = time.perf_counter()
            pipe.generate(PROMPT, NEGATIVE, steps=steps, cfg=cfg, seed=1, callback=after_step)
            run_s = time.perf_counter() - gen_start - sum(raw_ms[-steps:]) / 1e3
            run_ms.append(run_s * 1e3)
            encode_share.append(encode_s / run_s)
            tokenize_share.append(tok_s / run_s)
        step, raw = statistics.median(step_ms), statistics.median(raw_ms)
        return {"backend": backend, "steps": steps, "rounds": rounds, "cfg": cfg, "unet_batch": rows,
                "step_ms": step, "raw_unet_ms": raw, "overhead": statistics.median(paired) - 1,
                "overhead_of_medians": step / raw - 1, "encode_share": statistics.median(encode_share),
                "tokenize_share": statistics.median(tokenize_share),
                "run_ms": statistics.median(run_ms)}
    finally:
        pipe.close()


def _shape_only_builder() -> type:
    """sdrt.testing's Builder with weights as shaped graph inputs and no data, so that SD 1.5's full-size
    models (3.4 GB of UNet weights) can be counted without building their weights."""
    from onnx import TensorProto, helper

    from sdrt.testing.builder import Builder

    class ShapeOnly(Builder):
        def param(self, name: str, shape: Any, std: float | None = None, fill: float | None = None) -> str:
            self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
            return name

        def _shift_param(self, name: str, offset: float) -> None:
            pass

    return ShapeOnly


def count_macs(model: Any) -> int:
    """Multiply-adds of the Conv, MatMul and Gemm nodes (attention's QK^T and PV products included)."""
    from onnx import shape_inference

    m = shape_inference.infer_shapes(model, data_prop=True)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]}
    shapes.update({t.name: list(t.dims) for t in m.graph.initializer})
    total = 0
    for n in m.graph.node:
        if n.op_type not in ("Conv", "MatMul", "Gemm"):
            continue
        out = shapes.get(n.output[0], [])
        if not out or not all(out):
            raise RuntimeError(f"shape inference left {n.name} without a static output shape")
        inner = int(np.prod(shapes[n.input[1]][1:])) if n.op_type == "Conv" else shapes[n.input[0]][-1]
        total += int(np.prod(out)) * inner
    return total


def macs_report(steps: int = 20) -> str:
    """GMAC per part call and per 20-step cfg-7 run: the bench folder's models against SD 1.5's (512x512)."""
    from unittest import mock

    from sdrt.testing import models

    bench_latent = models.SIZES["unet"]["bench"]["latent"]
    shapes_only = _shape_only_builder()
    with mock.patch.object(models, "Builder", shapes_only), \
            mock.patch.dict(models.SIZES["vae_decoder"], {"pipeline": dict(models.SIZES["vae_decoder"]["bench"],
                                                                           latent=bench_latent)}):
        g = {(part, size): count_macs(models.MODELS[part](size)[0]) / 1e9
             for part, size in [("text_encoder", "bench"), ("unet", "bench"), ("vae_decoder", "pipeline"),
                                ("text_encoder", "full"), ("unet", "full"), ("vae_decoder", "full")]}
    lines = [f"GMAC (multiply-adds of Conv/MatMul/Gemm), {steps} steps at cfg 7 (2 prompts, 2 UNet rows per step):",
             "| | text encoder, 1 prompt | UNet, 1 row | VAE decoder | run: encode | run: UNet | run: decode | "
             "encode share of the run's MACs |", "|---|---|---|---|---|---|---|---|"]
    for label, size, vae in [(f"bench folder ({bench_latent}x{bench_latent} latents)", "bench", "pipeline"),
                             ("SD 1.5 (64x64 latents, 512x512)", "full", "full")]:
        te, un, va = g[("text_encoder", size)], g[("unet", size)], g[("vae_decoder", vae)]
        enc, loop = 2 * te, 2 * steps * un
        lines.append(f"| {label} | {te:.2f} | {un:.2f} | {va:.2f} | {enc:.1f} | {loop:.0f} | {va:.1f} | "
                     f"{enc / (enc + loop + va):.2%} |")
    return "\n".join(lines)


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| backend | cfg (UNet batch) | ms/step (pipeline) | ms/run (raw UNet) | overhead/step, paired | "
             "overhead, of the medians | tokenize+encode share of a run | of which tokenize | run ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| sdrt-{r['backend']} | {r['cfg']:g} ({r['unet_batch']}) | {r['step_ms']:.2f} | "
                     f"{r['raw_unet_ms']:.2f} | {r['overhead']:+.1%} | {r['overhead_of_medians']:+.1%} | "
                     f"{r['encode_share']:.1%} | {r['tokenize_share']:.3%} | {r['run_ms']:.0f} |")
    return "\n".join(lines)


def report(backends: list[str], workdir: Path, size: str = "bench", steps: int = 20, rounds: int = 3,
           cfg: float = CFG) -> list[dict]:
    """Build the folder, time each backend, print the table; returns the rows."""
    if size != "bench":
        print(f"[pipeline] skipped at size {size}: only the bench size has a CLIP-sized text encoder", flush=True)
        return []
    print(f"[pipeline] {steps}-step generate vs raw UNet runs, cfg {cfg:g}, {rounds} rounds ...", flush=True)
    folder = build_folder(workdir, size)
    rows = [bench_backend(folder, b, steps, rounds, cfg) for b in backends]
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
    p.add_argument("--cfg", type=float, default=CFG, help="guidance scale (1: one UNet row per step, no negative prompt)")
    p.add_argument("--workdir", type=Path, default=Path(user_cache_dir("sdrt")) / "bench-models")
    p.add_argument("--macs", action="store_true", help="print the models' multiply-adds against SD 1.5's and stop")
    args = p.parse_args(argv)
    if args.macs:
        print(macs_report(args.steps))
        return 0
    only = [b for b in args.backends.split(",") if b] if args.backends else None
    report(harness.sdrt_backends(False, only), args.workdir, args.size, args.steps, args.rounds, args.cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
