"""``sdrt demo``: decode seeded latents with an embedded SD-style decoder and write a PNG."""

from __future__ import annotations

import argparse
from typing import Any

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="run an embedded SD-style decoder on this machine and write a PNG")
    p.add_argument("--output", "-o", default="sdrt-demo.png",
                   help="the PNG to write (default sdrt-demo.png; .png is added to a name without it)")
    p.add_argument("--backend", default="auto", help="a backend `sdrt info` lists (default: auto, the one sdrt picks here)")
    p.add_argument("--device", default=None, help="a device id as `sdrt info` lists it (default: the one sdrt picks for the backend)")
    p.add_argument("--seed", type=int, default=42, help="seed of the latents (-1: a random one, as generate takes it)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo
    from .paths import output_file, refuse_stdout

    refuse_stdout(args.output, "demo", ".png")
    result = run_demo(output_file(args.output, ".png"), backend=args.backend, device=args.device, seed=args.seed)
    print(f"backend {result['backend']} on {result['device']}")
    print(f"decoded latents {result['shape']} in {result['run_s'] * 1e3:.1f} ms "
          f"(compile {result['compile_s'] * 1e3:.0f} ms)")
    from ..errors import printable

    print(printable(f"wrote {result['output']} (seed {result['seed']})"))
    return 0
