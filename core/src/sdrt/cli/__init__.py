"""The ``sdrt`` command. Each subcommand lives in its own module here and
exposes ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

from ..errors import InputError, SdrtError

#: subcommand modules, in the order ``sdrt --help`` lists them
COMMANDS = ["info", "generate", "plan", "run", "compile", "cache", "conformance", "selftest", "strip", "quantize",
            "demo", "install", "serve"]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="sdrt", description="Run Stable Diffusion-class ONNX models on this machine.")
    parser.add_argument("--version", action="version", version=f"sdrt {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".{name}", __name__)
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run, _names={**flag_names(p), **getattr(module, "API_NAMES", {})})
        if hasattr(module, "EMPTY_OK"):  # the command's options that are checked to be non-empty
            p.set_defaults(_nonempty={d: f for d, f in flag_names(p).items() if d not in module.EMPTY_OK})
    return parser


def check_nonempty(args: argparse.Namespace) -> None:
    """An option given an empty value (``--device ""``, ``--lora-dir "$UNSET"``) is refused naming it: it was
    read as not given (no previews for ``--preview-dir ""``), as the current folder, or as a name no backend
    has. A command lists the options an empty value is meaningful for in ``EMPTY_OK`` (``--negative ""``)."""
    for dest, flag in getattr(args, "_nonempty", {}).items():
        value = getattr(args, dest, None)
        if value == "" or (isinstance(value, list) and any(v == "" for v in value)):
            raise InputError(f"{flag} is given an empty value", where=flag,
                             fix=f"give {flag} a value, or leave it out for its default")


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{API argument name: the flag that sets it} for a subcommand's options (``init_image`` ->
    ``--init-image``), so that an error raised with argument names speaks in flags on the command line."""
    names = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            names[action.dest] = max(action.option_strings, key=len)
    return names


def main(argv: list[str] | None = None) -> int:
    try:  # importing the subcommands takes a while: Ctrl-C then is one line too
        parser = build_parser()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        check_nonempty(args)
        return int(args._run(args) or 0)
    except SdrtError as exc:  # in the command's words: flags, not the API's argument names
        print(f"error: {exc.render(getattr(args, '_names', None))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's exit status for SIGINT
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sdrt ... | head`: the reader left; quiet, as other tools are
        with contextlib.suppress(OSError):  # stdout is gone: point it at /dev/null so exit does not flush into it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
