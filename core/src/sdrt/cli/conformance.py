"""``sdrt conformance BACKEND``: onnx's node and light model tests, summarised per op."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("conformance", help="run ONNX's backend test suite against a backend, per op")
    p.add_argument("backend", help="backend name, as `sdrt info` lists it")
    p.add_argument("--device", default=None, help="device id (default: the backend's first device)")
    p.add_argument("--suite", action="append", choices=["node", "light"], default=None,
                   help="which suites to run (default: both)")
    p.add_argument("-k", "--include", action="append", default=[], metavar="REGEX",
                   help="run only tests whose name matches; repeatable")
    p.add_argument("--exclude", action="append", default=[], metavar="REGEX")
    p.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--no-failures", action="store_true", help="do not list each failure")
    p.add_argument("--strict", action="store_true", help="exit 1 when any test fails")
    return p


def run(args: argparse.Namespace) -> int:
    from ..testing import BackendTest

    suite = BackendTest(args.backend, args.device, suites=tuple(args.suite or ("node", "light")))
    for pattern in args.include:
        suite.include(pattern)
    for pattern in args.exclude:
        suite.exclude(pattern, "excluded on the command line")
    done = [0]

    def progress(name: str, outcome: str) -> None:
        done[0] += 1
        if done[0] % 100 == 0:
            print(f"  ... {done[0]} tests", file=sys.stderr, flush=True)

    summary = suite.run(progress)
    print(summary.render(failures=not args.no_failures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary.to_json(), f, indent=1)
    return 1 if args.strict and summary.totals()["failed"] else 0
