"""Output paths of the CLI, checked before any long work."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import InputError


def refuse_stdout(value: object, command: str, suffix: str) -> None:
    """``-o -`` is standard output in ``sdrt generate``; every other command wrote a file named ``-`` (or
    ``-.png``, ``-.safetensors``) in the current folder without a word. Refused, naming the way to such a file."""
    if value == "-":
        raise InputError(f"-o - writes to standard output in sdrt generate only; sdrt {command} writes a file, and "
                         "would have made one named '-'", where="-o",
                         fix=f"give a file name, such as out{suffix} (./- for a file named -)")


def check_suffix(arg: str, suffix: str, option: str = "-o") -> None:
    """Refuse a file name that ends in another format's suffix (x.gif as x.gif.png, r.txt as r.txt.npz, a graph
    written as out.png): not what was asked. A name without a suffix passes."""
    path = Path(arg)
    if path.suffix and path.suffix.lower() != suffix:
        raise InputError(f"{option} {arg!r} ends in {path.suffix}, and this command writes {suffix} files",
                         where=option,
                         fix=f"end the name in {suffix} ({path.stem}{suffix}), or leave the suffix out ({path.stem})")


def output_file(arg: str, suffix: str, option: str = "-o") -> Path:
    """The file ``arg`` names, with ``suffix`` added when it has none (another suffix is refused); its folder
    must exist.

    Raises ``InputError`` for a folder (``adir/``, or an existing directory) or a missing parent,
    so that a run never computes for minutes and then fails to write.
    """
    if not arg or arg.endswith(("/", "\\")) or os.path.isdir(arg):
        raise InputError(f"{option} {arg!r} names a folder, not a file", where=option,
                         fix=f"give a file name, such as {Path(arg or '.') / ('out' + suffix)}")
    from ..pipelines.png import output_target

    path = Path(arg)
    if os.path.lexists(path):  # /dev/null as given: refused, not written as /dev/null.npz beside it
        output_target(path, "output", suffix)
    check_suffix(arg, suffix, option)
    if path.suffix.lower() != suffix:
        path = path.with_name(path.name + suffix)
    if not path.parent.is_dir():
        raise InputError(f"the folder of {option} {arg!r} does not exist", where=str(path.parent),
                         fix=f"create it first (mkdir -p {path.parent}) or write somewhere else")
    output_target(path, "output", suffix)  # a regular file or none: never a device, FIFO or socket
    return path


def _paths(value: object) -> list[str | os.PathLike[str]]:
    """A flag's value as a list of paths (none for None or "")."""
    if value is None or value == "":
        return []
    if isinstance(value, (str, os.PathLike)):
        return [value]
    return [v for v in value if v]  # type: ignore[attr-defined]


def check_folder_writes(flag: str, folder: str | os.PathLike[str], names: re.Pattern[str],
                        inputs: Mapping[str, str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None]) -> None:
    """Refuse, before any work, a folder the run writes files into (``--preview-dir``: ``names`` matches the
    names it writes) that holds one of the input files under such a name (or a link to one): writing there would
    destroy that input."""
    try:
        written = [e for e in Path(folder).iterdir() if names.fullmatch(e.name)]
    except OSError:  # an unreadable folder is refused by the folder's own checks
        return
    for target in written:
        for in_flag, in_value in inputs.items():
            for src in _paths(in_value):
                if _same_file(target, src):
                    raise InputError(f"{flag} {folder} holds {target.name}, which is {in_flag} {src}, and a file of "
                                     f"that name is written there: it would destroy that input", where=flag,
                                     fix=f"pass another {flag} (an empty folder), or move the input out of it")


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: the same resolved path (a symlink to it), or the same inode (a hard link)."""
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        return os.path.samefile(a, b)
    except (OSError, RuntimeError, ValueError):
        return False


def check_writes(outputs: Mapping[str, str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None],
                 inputs: Mapping[str, str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None]) -> None:
    """Refuse, before any work, an output whose folder does not exist or that is one of the input files.

    ``outputs`` and ``inputs`` map each flag (``"-o"``, ``"--init-image"``) to a path, a list of paths
    or None (not given). An output that is the same file as an input (the same path, a symlink to it,
    a hard link) would destroy that input; a missing folder is not created (as ``sdrt generate`` refuses it)."""
    for flag, value in outputs.items():
        for out in _paths(value):
            folder = Path(out).parent
            if not folder.is_dir():
                raise InputError(f"the folder of {flag} {out} does not exist", where=flag,
                                 fix=f"create it first (mkdir -p {folder}) or write somewhere else")
            for in_flag, in_value in inputs.items():
                for src in _paths(in_value):
                    if _same_file(out, src):
                        shown = in_flag if os.fspath(src) == os.fspath(out) else f"{in_flag} {src}"
                        raise InputError(f"{flag} {out} is the same file as {shown}; writing it would destroy "
                                         "that input", where=flag,
                                         fix=f"pass another {flag} path (a new file name)")


def check_links(outputs: dict[str, str | os.PathLike[str] | None]) -> None:
    """Refuse an output that is a dangling symlink, before any work, as ``-o`` of generate refuses one (and ``cp``):
    quantize wrote the whole graph, then failed ("check free disk space and permissions"); strip replaced a
    --weights link with a file, or refused -o with "the weights file must sit in the stripped graph's folder"."""
    from ..cache.paths import DANGLING_FIX, write_target

    for flag, value in outputs.items():
        if value is None:
            continue
        try:
            write_target(value)
        except FileNotFoundError as exc:
            raise InputError(f"{flag} {exc.strerror}", where=flag, fix=DANGLING_FIX) from None


def weights_once(weights: list[str] | None) -> None:
    """Refuse a --weights file given twice (or a link to it): opening them read its tensors twice, and the
    refusal spoke the API ("Where: Weights.open. What to do: open the files separately")."""
    files = weights or []
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            if _same_file(a, b):
                what = f"--weights {a} is given twice" if a == b else f"--weights {a} and {b} name one file"
                raise InputError(what, where="--weights", fix=f"give --weights {a} once")
