"""The ``sdrt`` command. Each subcommand lives in its own module here and
exposes ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import logging
import os
import re
import sys
from typing import Any

from ..errors import InputError, SdrtError

#: subcommand modules, in the order ``sdrt --help`` lists them
COMMANDS = ["info", "generate", "plan", "run", "compile", "cache", "conformance", "selftest", "strip", "quantize",
            "demo", "install", "serve", "upscale"]


#: what argparse takes for a negative number after an option, not an option itself: its own pattern (-1, -0.5)
#: and also exponents, inf and nan, which it read as unknown options ("--cfg: expected one argument"), and sizes
#: with a unit (--memory -5G), which the size's own check then refuses by value
NEGATIVE_NUMBER = re.compile(r"^-(?:\d+\.?\d*(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?|inf|infinity|nan)"
                             r"(?:[kmgt]i?b?|b)?$", re.IGNORECASE)


class _Parser(argparse.ArgumentParser):
    """argparse, where a negative number (``NEGATIVE_NUMBER``) is always a value: its own check matched only -1 and
    -0.5, and a value such as ``-nan`` was split as a short option (``-n an``) before that check ran."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        """argparse's refusal (a bad value for its type, a missing or unknown argument) in one line, as every other
        refusal of the command: it printed the usage, then ``sdrt generate: error: ...``, on two lines."""
        from ..errors import printable

        self.exit(2, f"error: {printable(message)}. Where: {self.prog}. What to do: see `{self.prog} --help` for "
                     "its arguments.\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        """``--backend=--`` is the value ``--``: Python 3.11's argparse dropped it as the end-of-options marker and
        gave the option an empty list, which reached the command as a list (``sdrt cache --backend=--``: a
        TypeError traceback; ``--steps=--``: no number at all)."""
        if action.option_strings and action.nargs in (None, argparse.OPTIONAL) and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse's, after ``bare_values``: a flag whose value may be left out takes the next word only when that
        word is one of its values (``--control-pixel-perfect "a cat"`` leaves the prompt a prompt)."""
        if args is None:
            args = sys.argv[1:]
        self.bare_after: dict[str, str] = {}  # {the word after a bare flag: the flag}, for an error about the word
        return super().parse_known_args(bare_values(self, list(args), self.bare_after), namespace)

    def _parse_optional(self, arg_string: str) -> Any:
        if NEGATIVE_NUMBER.match(arg_string) and arg_string not in self._option_string_actions:
            return None
        return super()._parse_optional(arg_string)


class OptionalValue(argparse._AppendAction):
    """A repeatable flag whose value may be left out: ``--flag`` alone is ``--flag=CONST``, and the next word is its
    value only when it is one of ``choices`` (any case). argparse's ``nargs="?"`` took any next word, so a flag left
    bare before the prompt swallowed the prompt ("invalid choice: 'a cat'"). Values are checked and lowercased by
    ``type`` (one line naming the flag and its values); ``bare_values`` rewrites the bare flags before parsing."""

    def __init__(self, option_strings: list[str], dest: str, *, const: str, choices: tuple[str, ...],
                 **kwargs: Any) -> None:
        def value(text: str) -> str:
            if text.lower() not in choices:
                raise argparse.ArgumentTypeError(f"takes {' or '.join(choices)} (or nothing: {const}), got {text!r}")
            return text.lower()

        kwargs.setdefault("metavar", f"[{'|'.join(choices)}]")
        super().__init__(option_strings, dest, type=value, **kwargs)
        self.bare, self.values = const, choices


def bare_values(parser: argparse.ArgumentParser, args: list[str], after: dict[str, str] | None = None) -> list[str]:
    """``args`` with each bare ``OptionalValue`` flag of ``parser`` (or an abbreviation argparse would take for it)
    written ``--flag=CONST`` when the next word is not one of its values; nothing after ``--`` changes. ``after``
    gets ``{next word: flag}`` of those (a word argparse then finds no place for was maybe meant as the value)."""
    known = parser._option_string_actions
    if not any(isinstance(a, OptionalValue) for a in known.values()):
        return args
    out = list(args)
    for k, word in enumerate(args):
        if word == "--":
            break
        if not word.startswith("--") or "=" in word:
            continue
        action = known.get(word)
        if action is None and parser.allow_abbrev:
            found = {known[o] for o in known if o.startswith(word)}
            action = found.pop() if len(found) == 1 else None
        if isinstance(action, OptionalValue) and (k + 1 >= len(args) or args[k + 1].lower() not in action.values):
            out[k] = f"{word}={action.bare}"
            if after is not None and k + 1 < len(args) and not args[k + 1].startswith("-"):  # a flag: no value try
                after.setdefault(args[k + 1], max(action.option_strings, key=len))
    return out


#: ``{@@name}`` (sdrt.errors) on the command line: how a file of that kind is passed, for every command (generate
#: says its own flags alone)
CLI_USAGE = {"@loras": "sdrt generate --lora FILE:WEIGHT", "@controlnets": "sdrt generate --controlnet FILE "
             "--control-image PNG", "@embeddings": "sdrt generate --embedding FILE",
             "@model": "sdrt generate FILE PROMPT", "@weights": "sdrt generate MODEL PROMPT --weights FILE",
             "@lora_dir": "--lora-dir", "@hires_upscaler": "sdrt generate --hires-upscaler FILE, or sdrt upscale -m FILE"}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="sdrt", description="Run Stable Diffusion-class ONNX models on this machine.")
    parser.add_argument("--version", action="version", version=f"sdrt {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".{name}", __name__)
        p = module.add_parser(sub)
        # -v after the command too (`sdrt generate ... -v`, as docs/memory.md shows); SUPPRESS keeps `sdrt -v CMD`'s
        p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log more (-v info, -vv debug)")
        p.set_defaults(_run=module.run, _names={**CLI_USAGE, **flag_names(p), **getattr(module, "API_NAMES", {})})
        if hasattr(module, "EMPTY_OK"):  # the command's options (and positionals) checked to be non-empty
            given = {**flag_names(p), **{a.dest: str(a.metavar or a.dest.upper()) for a in p._actions
                                         if not a.option_strings and a.dest != "help"}}
            p.set_defaults(_nonempty={d: f for d, f in given.items() if d not in module.EMPTY_OK})
    return parser


def check_nonempty(args: argparse.Namespace) -> None:
    """An option given an empty value (``--device ""``, ``--lora-dir "$UNSET"``) is refused naming it: it was
    read as not given (no previews for ``--preview-dir ""``), as the current folder, or as a name no backend
    has. A command lists the options an empty value is meaningful for in ``EMPTY_OK`` (``--negative ""``)."""
    for dest, flag in getattr(args, "_nonempty", {}).items():
        value = getattr(args, dest, None)
        if value == "" or (isinstance(value, list) and any(v == "" for v in value)):
            raise InputError(f"{flag} is given an empty value", where=flag,
                             fix=f"give {flag} a value" + (", or leave it out for its default" if flag[0] == "-" else ""))


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{API argument name: the flag that sets it} for a subcommand's options (``init_image`` ->
    ``--init-image``), so that an error raised with argument names speaks in flags on the command line."""
    names = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            names[action.dest] = max(action.option_strings, key=len)
    return names


_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _OneLine(logging.Formatter):
    """Each log line as the command's errors and "wrote" lines print paths: a newline or escape sequence in a file
    name (a warning naming a skipped embedding, a folder not served) escaped as repr writes it (``printable``), so
    it can neither break the line nor reach the terminal; a traceback (``-vv``) keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from ..errors import printable

        return printable(super().formatMessage(record))


def _intermixed(sub: argparse.ArgumentParser | None, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """The words argparse left over once the command's repeated positional was read (``sdrt generate MODEL --steps 4
    "a cat"``: argparse takes one run of positionals, so the prompt after an option was "unrecognized"), appended to
    it in order, as a shell user expects; left over still: a word that looks like an option, or one a bare
    ``[on|off]`` flag was refused (its hint says why)."""
    repeated = [a for a in (sub._actions if sub is not None else ()) if not a.option_strings and a.nargs in ("+", "*")]
    if len(repeated) != 1 or any(w.startswith("-") and w != "-" for w in extra) \
            or any(w in getattr(sub, "bare_after", {}) for w in extra):
        return extra
    dest = repeated[0].dest
    setattr(args, dest, [*(getattr(args, dest) or []), *extra])
    return []


def _near_flags(parser: argparse.ArgumentParser, words: list[str]) -> str:
    """`` (did you mean --controlnet?)`` for the misspelt flags among ``words`` (``--control-net``), or ""."""
    import difflib

    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    near = [m[0] for w in words if w.startswith("--")
            for m in [difflib.get_close_matches(w.split("=", 1)[0], flags, n=1, cutoff=0.8)] if m]
    return f" (did you mean {', '.join(dict.fromkeys(near))}?)" if near else ""


def main(argv: list[str] | None = None) -> int:
    try:  # importing the subcommands takes a while: Ctrl-C then is one line too
        parser = build_parser()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    args, extra = parser.parse_known_args(argv)
    if extra:  # refused by the command's own parser: "Where: sdrt plan", not the top-level "sdrt"
        sub = parser._subparsers._group_actions[0].choices.get(args.command) if parser._subparsers and \
            getattr(args, "command", None) else None
        extra = _intermixed(sub, args, extra)
    if extra:
        hint = next(((w, f) for w in extra for f in [getattr(sub, "bare_after", {}).get(w)] if f), None)
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}" + (
            f" ({hint[1]} takes on or off, or nothing for on: {hint[0]!r} is neither, and no other argument is left "
            "to take it)" if hint else _near_flags(sub or parser, extra)))
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format=_LOG_FORMAT)
    for handler in logging.getLogger().handlers:  # basicConfig's own (not one an embedding program set up)
        if type(handler.formatter) is logging.Formatter and handler.formatter._fmt == _LOG_FORMAT:
            handler.setFormatter(_OneLine(_LOG_FORMAT))
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    stdout = sys.stdout
    if stdout is not None:  # None: started with stdout closed (`sdrt info >&-`), where print() writes nothing
        sys.stdout = _Stdout(stdout)  # type: ignore[assignment]
    try:
        check_nonempty(args)
        from ..errors import caller_words
        from . import interrupt

        # its warnings in the command's words, as its errors; a Ctrl-C that CPython swallowed still ends it
        with caller_words(getattr(args, "_names", None)), interrupt.watch():
            code = int(args._run(args) or 0)
        if sys.stdout is not None:  # a full disk behind stdout is found here, not in Python's exit
            sys.stdout.flush()
        return code
    except SdrtError as exc:  # in the command's words: flags, not the API's argument names
        from ..errors import printable  # a path's newline or escape sequence: as repr writes it, one line

        print(f"error: {printable(exc.render(getattr(args, '_names', None)))}", file=sys.stderr)
        if isinstance(exc, StdoutError):
            _drop_stdout(stdout)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's exit status for SIGINT
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sdrt ... | head`: the reader left; quiet, as other tools are
        _drop_stdout(stdout)
        return 141
    except OSError as exc:
        if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
            raise
        # a path that cannot even be looked at, met by any of the many is_file()/exists() checks: pathlib raises
        # these two (it swallows "no such file"); one line naming the option that gave it
        print(f"error: {_path_error(exc, args)}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


def _path_error(exc: OSError, args: argparse.Namespace) -> str:
    """An ENAMETOOLONG / ELOOP error in words, naming the option (or positional) whose value holds the path."""
    name = os.fspath(exc.filename) if exc.filename is not None else ""
    flags = {**getattr(args, "_names", {}), **{k: k.upper() for k in vars(args) if not k.startswith("_")}}
    where = None
    for dest, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        if not dest.startswith("_") and name and any(isinstance(v, str) and name in v for v in values):
            where = getattr(args, "_names", {}).get(dest) or flags.get(dest, dest)
            break
    shown = name if len(name) <= 60 else name[:57] + "..."
    what = ("a path is too long for the file system" if exc.errno == errno.ENAMETOOLONG
            else "a path runs into a loop of symlinks")
    return str(InputError(f"{what} ({exc.strerror}: {shown!r})", where=where or "a path given",
                          fix="give a shorter path" if exc.errno == errno.ENAMETOOLONG
                          else "fix or remove the looping symlink"))


class StdoutError(SdrtError):
    """Standard output cannot be written (a full disk, ``> /dev/full``): one line, not an OSError traceback."""


def _drop_stdout(stdout: object) -> None:
    """Stdout is gone: point it at /dev/null so that Python's exit does not flush into it again."""
    with contextlib.suppress(OSError, AttributeError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())  # type: ignore[attr-defined]


class _Stdout:
    """``sys.stdout`` while a command runs (its ``buffer`` too): a failed write or flush is a ``StdoutError``;
    a closed pipe stays a ``BrokenPipeError``; everything else is the stream's own."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def _call(self, name: str, *args: object) -> object:
        try:
            return getattr(self._inner, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(f"cannot write to standard output ({exc.strerror or exc})", where="standard output",
                              fix="free space where it goes, or redirect it elsewhere") from None

    def write(self, data: object) -> object:
        try:
            return self._call("write", data)
        except UnicodeEncodeError:  # a file name of non-UTF-8 bytes (a surrogate) on a strict stdout: escaped, as
            # stderr escapes it (backslashreplace); it was a traceback after the image was written
            encoding = getattr(self._inner, "encoding", None) or "utf-8"
            return self._call("write", str(data).encode(encoding, "backslashreplace").decode(encoding))

    def flush(self) -> object:
        return self._call("flush")

    @property
    def buffer(self) -> _Stdout:
        return _Stdout(self._inner.buffer)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)
