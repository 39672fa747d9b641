"""``python -m bench``: time the installed sdrt backends against raw onnxruntime and raw OpenVINO.

    python -m bench                          # every model at bench size, then vae_decoder and unet at full size
    python -m bench --no-full                # bench size only
    python -m bench --full-models unet --full-rounds 5
    python -m bench --models unet,vae_decoder --rounds 30
    python -m bench --backends openvino,ggml --option openvino:precision=bf16
    python -m bench --size tiny --include-reference
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from sdrt.testing import models

from . import harness, pipeline

#: the models timed at full size too by default: the two whose bench size shrinks the real one
FULL_MODELS = ("vae_decoder", "unet")


def _parse_options(specs: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        backend, _, kv = spec.partition(":")
        key, sep, value = kv.partition("=")
        if not sep or not backend or not key:
            raise SystemExit(f"bad --option {spec!r}: write BACKEND:KEY=VALUE")
        parsed: Any = value
        for cast in (int, float):
            try:
                parsed = cast(value)
                break
            except ValueError:
                continue
        if value.lower() in ("true", "false"):
            parsed = value.lower() == "true"
        out.setdefault(backend, {})[key] = parsed
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(models.MODELS), help="comma-separated (default: all)")
    p.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    p.add_argument("--backends", default=None, help="sdrt backends to time (default: every installed one)")
    p.add_argument("--include-reference", action="store_true", help="also time the (slow) reference backend")
    p.add_argument("--peers", default=",".join(harness.PEERS), help="raw runtimes to compare with")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per model (default: from --min-seconds)")
    p.add_argument("--min-seconds", type=float, default=10.0, help="timing budget per model when --rounds is unset")
    p.add_argument("--pair-with", default="openvino-raw",
                   help="contender for the paired ratio column (default openvino-raw; else the best peer)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every runner (default: each decides)")
    p.add_argument("--option", action="append", default=[], metavar="BACKEND:KEY=VALUE",
                   help="a compile option for one sdrt backend; repeat (device=... picks its device)")
    p.add_argument("--sdrt-input", default="stripped", choices=["stripped", "full"],
                   help="what sdrt backends load: the weight-stripped graph + .safetensors that `sdrt strip` "
                        "writes (default, the real workload) or the same single .onnx file the peers load")
    p.add_argument("--workdir", type=Path, default=None, help="where built models are kept")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results")
    p.add_argument("--no-pipeline", action="store_true", help="skip the pipeline row (bench/pipeline.py)")
    p.add_argument("--full-models", default=None,
                   help="after the --size models, also time these at size full (default: those of "
                        f"{','.join(FULL_MODELS)} in --models, when --size is bench)")
    p.add_argument("--full-rounds", type=int, default=3, help="timed rounds per full-size model (default 3)")
    p.add_argument("--full-warmup", type=int, default=1, help="warmup runs per full-size contender (default 1)")
    p.add_argument("--no-full", action="store_true", help="skip the full-size rows")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")

    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in models.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(models.MODELS)}")
    only = [b for b in args.backends.split(",") if b] if args.backends else None
    backends = harness.sdrt_backends(args.include_reference, only)
    options = _parse_options(args.option)
    options.setdefault("openvino", {}).setdefault("device", "CPU")  # the peers run on CPU too
    peers = [x for x in args.peers.split(",") if x]
    workdir = args.workdir or _default_workdir()
    full = _full_models(args, names)
    unknown = [m for m in full if m not in models.MODELS]
    if unknown:
        p.error(f"unknown --full-models {unknown}; known: {', '.join(models.MODELS)}")
    if full and args.full_rounds < 1:
        p.error("--full-rounds must be at least 1")
    print(f"sdrt backends: {', '.join(backends) or 'none'}; peers: {', '.join(peers)}; size {args.size}"
          + (f", then {', '.join(full)} at size full" if full else ""),
          flush=True)

    # the --size models with the usual budget, then the full-size ones with a few fixed rounds
    plan = [(name, args.size, args.rounds, args.min_seconds, args.warmup) for name in names]
    plan += [(name, "full", args.full_rounds, 0.0, args.full_warmup) for name in full]
    results: list[harness.Result] = []
    for name, size, rounds, min_seconds, warmup in plan:
        print(f"[{name}{'' if size == args.size else '@' + size}] building and timing ...", flush=True)
        rows = harness.bench_model(name, size, workdir, backends, rounds=rounds, min_seconds=min_seconds,
                                   warmup=warmup, threads=args.threads, peers=peers, sdrt_options=options,
                                   pair_with=args.pair_with, sdrt_input=args.sdrt_input)
        results.extend(rows)
        print(harness.render(rows), flush=True)
    print("\n" + harness.render(results))
    pipeline_rows = [] if args.no_pipeline else pipeline.report(backends, workdir, args.size)
    config = {"models": names, "size": args.size, "sdrt_input": args.sdrt_input, "backends": backends, "peers": peers, "rounds": args.rounds,
              "min_seconds": args.min_seconds, "threads": args.threads, "options": options,
              "full_models": full, "full_rounds": args.full_rounds, "full_warmup": args.full_warmup}
    args.json.write_text(json.dumps({**harness.to_json(results, config), "pipeline": pipeline_rows}, indent=1))
    print(f"wrote {args.json}")
    return 0


def _full_models(args: argparse.Namespace, names: list[str]) -> list[str]:
    """The models to time at full size after the --size ones: none with --no-full or --size full."""
    if args.no_full or args.size == "full":
        return []
    if args.full_models is not None:
        return [m for m in args.full_models.split(",") if m]
    return [m for m in FULL_MODELS if m in names] if args.size == "bench" else []


def _default_workdir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sdrt")) / "bench-models"


if __name__ == "__main__":
    sys.exit(main())
