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

    check_sources(args.find_links, args.index_url)
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


def check_sources(find_links: list[str], index_url: str | None) -> None:
    """Where pip is told to look, checked before it runs (and in a dry run, whose command would fail): pip ignores a
    --find-links or --index-url that is neither a URL nor a path that exists with a warning ("lacks a specific
    scheme"), then says only that no matching distribution was found."""
    import os
    from urllib.parse import urlsplit

    from ..errors import InputError

    for link in find_links:
        if "://" not in link and not os.path.exists(link):
            raise InputError(f"--find-links {link} is neither a URL nor a folder or file that exists", where="--find-links",
                             fix="pass a folder of wheels that exists, or a URL such as https://example.com/wheels/")
    if index_url is not None:
        parts = urlsplit(index_url)
        url = parts.scheme in ("http", "https") and parts.netloc or parts.scheme == "file"
        if not url and not os.path.isdir(index_url):  # pip takes a folder laid out as an index too
            raise InputError(f"--index-url {index_url} is neither an http(s) or file URL nor a folder that exists",
                             where="--index-url",
                             fix="pass a package index URL such as https://pypi.org/simple (a folder of wheels goes "
                                 "to --find-links)")
