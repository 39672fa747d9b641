"""``sdrt install [--dry-run] [--plugin NAME] [--uv]``: install the one plugin that fits this machine."""

from __future__ import annotations

import argparse
import sys
from typing import Any

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..installer import GGML_BUILDS, PLUGINS

    p = sub.add_parser("install", help="install the backend plugin that fits this machine")
    p.add_argument("--dry-run", action="store_true", help="print the exact command and install nothing")
    p.add_argument("--plugin", choices=PLUGINS, help="install this plugin instead of the recommended one")
    p.add_argument("--build", choices=list(GGML_BUILDS), help="ggml only: which ggml build to compile")
    p.add_argument("--uv", action="store_true", help="install with uv instead of pip")
    p.add_argument("--find-links", metavar="DIR_OR_URL", action="append", default=[],
                   help="also look for the plugin here (passed to pip)")
    p.add_argument("--index-url", metavar="URL", help="package index to install from (passed to pip)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..installer import install, plan

    extra: list[str] = []
    for link in args.find_links:
        extra += ["--find-links", link]
    if args.index_url:
        extra += ["--index-url", args.index_url]
    p = plan(args.plugin, build=args.build, use_uv=args.uv, extra_args=extra)
    label = p.distribution + (f" ({p.build} build)" if p.build else "")
    print(f"plugin: {p.plugin}  ->  {label}")
    print(f"why: {p.reason}")
    if p.caveat:
        print(f"note: {p.caveat}")
    print(f"command: {p.command}")
    if args.dry_run:
        print("dry run: nothing was installed")
        return 0
    result = install(args.plugin, build=args.build, use_uv=args.uv, extra_args=extra, echo=sys.stderr)
    added = ", ".join(f"{k} {v}" for k, v in sorted(result.added.items())) or "nothing new"
    print(f"installed: {added}")
    return 0
