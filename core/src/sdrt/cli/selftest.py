"""``sdrt selftest``: prove every installed backend on this machine, and write a report to share."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("selftest", help="check every installed backend here: conformance, accuracy, speed, "
                                        "features, end to end; write a report to share")
    p.add_argument("--backend", action="append", default=[], help="test only this backend; repeatable")
    p.add_argument("--device", default=None, help="test only this device id (as `sdrt info` lists it)")
    p.add_argument("--quick", action="store_true", help="a short check (under a minute) for after `sdrt install`")
    p.add_argument("--only", action="append", default=[], metavar="GROUP",
                   help="run only this check group (conformance, accuracy, speed, features, end-to-end); repeatable")
    p.add_argument("--report", metavar="FILE.json", help="write the JSON report here, and FILE.md beside it")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a backend that takes longer than this (default: 300 quick, 3600 full)")
    p.add_argument("--plugin-module", action="append", default=[], metavar="MODULE",
                   help="also register this importable module as a plugin (test a backend before packaging it)")
    return p


class _Bar:
    """One status line on stderr, redrawn in place; only on a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.count = 0

    def __call__(self, target: str, event: str) -> None:
        if not self.enabled:
            return
        if event == "done":
            sys.stderr.write("\r\033[K")
        else:
            self.count += 1
            spin = "|/-\\"[self.count % 4]
            sys.stderr.write(f"\r\033[K{spin} {target}: {event}")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from ..errors import SdrtError
    from ..selftest import render_text
    from ..selftest import run as selftest
    from ..selftest.report import write

    if args.report and not args.report.lower().endswith(".json"):
        raise SdrtError(f"the report file must end in .json, got {args.report!r}", where="sdrt selftest --report",
                        fix="pass a name like report.json (the Markdown goes beside it as report.md)")
    if args.report:
        _check_folder(args.report)
    report = selftest(args.backend or None, args.device, quick=args.quick, only=args.only, timeout=args.timeout,
                      plugin_modules=args.plugin_module, progress=_Bar())
    print(render_text(report))
    if args.report:
        out, md = write(report, args.report)
        print(f"\nwrote {out} and {md}: paste the .md into an issue, or attach the .json")
    if not report["backends"]:
        print("no backend could be tested: install a plugin (`sdrt install`)", file=sys.stderr)
    return 0 if report["passed"] else 1


def _check_folder(path: str) -> None:
    """Fail before the (long) run when the report could not be written."""
    import os

    from ..errors import SdrtError

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SdrtError(f"cannot write the report into {folder!r}: it is not a writable folder",
                        where="sdrt selftest --report", fix="create the folder first, or pass another path")
