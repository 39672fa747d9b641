"""``sdrt conformance BACKEND``: onnx's node and light model tests, summarised per op.

By default the tests run in child processes (``sdrt.testing.isolation``): a
vendor library that aborts or segfaults on one test costs that test, which the
summary lists as crashed, not the run. ``--no-isolate`` runs them in this
process, as the Python API does by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

API_NAMES = {"include": "-k", "plugin_modules": "--plugin-module", "compile_options": "-o"}


#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


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
    p.add_argument("--markdown", metavar="FILE", help="also write the per-op table as Markdown")
    p.add_argument("--no-failures", action="store_true", help="do not list each failure")
    p.add_argument("--strict", action="store_true", help="exit 1 when any test fails, crashes or times out")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                   help="run the tests in child processes, so a crash costs one test, not the run (default); "
                        "--no-isolate runs them in this process")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="isolated: stop a test that gives no answer for this long (default 900)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="isolated: tests per child process (default 1000)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a compile option for the backend, e.g. -o precision=fp32 (VALUE is read as JSON "
                        "when it parses, else as a string); repeatable")
    p.add_argument("--plugin-module", action="append", default=[], metavar="MODULE",
                   help="also register this importable module as a plugin (a backend not yet packaged)")
    return p


def _options(pairs: list[str]) -> dict[str, Any]:
    from ..errors import SdrtError

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise SdrtError(f"compile option {pair!r} is not KEY=VALUE", where="sdrt conformance -o",
                            fix="write it as -o precision=fp32")
        try:
            options[key.strip()] = json.loads(text)
        except ValueError:
            options[key.strip()] = text
    return options


def run(args: argparse.Namespace) -> int:
    from ..child import plugin_registry
    from ..errors import SdrtError
    from ..testing import BackendTest

    given = [flag for flag, v in (("--timeout", args.timeout), ("--batch", args.batch)) if v is not None]
    if given and not args.isolate:
        one = len(given) == 1
        raise SdrtError(f"{' and '.join(given)} {'limits' if one else 'limit'} the child processes of an isolated "
                        f"run, and {'does' if one else 'do'} nothing with --no-isolate", where=f"sdrt conformance {given[0]}", fix=f"drop {' and '.join(given)}, "
                        "or drop --no-isolate")
    for key in ("json", "markdown"):  # before the (long) run: a folder, device or read-only file is refused now
        if getattr(args, key) is not None:
            from ..pipelines.png import output_target

            output_target(getattr(args, key), key, ".json" if key == "json" else ".md")
    if args.json is not None and args.markdown is not None:
        from .paths import _same_file

        if _same_file(args.json, args.markdown):  # the Markdown table replaced the JSON summary in silence
            raise SdrtError(f"--json and --markdown name one file ({args.markdown}), so the table would overwrite "
                            "the summary", where="--markdown", fix="give --json and --markdown different files")
    plugin_registry(args.plugin_module)
    suite = BackendTest(args.backend, args.device, suites=tuple(args.suite or ("node", "light")),
                        **_options(args.option))
    for pattern in args.include:
        suite.include(pattern)
    for pattern in args.exclude:
        suite.exclude(pattern, "excluded on the command line")
    done = [0]

    def progress(name: str, outcome: str) -> None:
        done[0] += 1
        if outcome in ("crashed", "timeout"):
            print(f"  {name}: {outcome}", file=sys.stderr, flush=True)
        if done[0] % 100 == 0:
            print(f"  ... {done[0]} tests", file=sys.stderr, flush=True)

    limits = {k: v for k, v in (("timeout", args.timeout), ("batch", args.batch)) if v is not None}
    summary = suite.run(progress, isolate=args.isolate, plugin_modules=tuple(args.plugin_module), **limits)
    print(summary.render(failures=not args.no_failures))
    from ..pipelines.png import write_file

    if args.json:
        write_file(args.json, json.dumps(summary.to_json(), indent=1).encode())
    if args.markdown:
        write_file(args.markdown, summary.markdown().encode())
    totals = summary.totals()
    return 1 if args.strict and (totals["failed"] or totals["crashed"] or totals["timeout"]) else 0
