"""Output paths of the CLI, checked before any long work."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError


def output_file(arg: str, suffix: str, option: str = "-o") -> Path:
    """The file ``arg`` names, with ``suffix`` added when it has none (another suffix is refused); its folder
    must exist.

    Raises ``InputError`` for a folder (``adir/``, or an existing directory) or a missing parent,
    so that a run never computes for minutes and then fails to write.
    """
    if not arg or arg.endswith(("/", "\\")) or os.path.isdir(arg):
        raise InputError(f"{option} {arg!r} names a folder, not a file", where=f"sdrt {option}",
                         fix=f"give a file name, such as {Path(arg or '.') / ('out' + suffix)}")
    from ..pipelines.png import output_target

    path = Path(arg)
    if os.path.lexists(path):  # /dev/null as given: refused, not written as /dev/null.npz beside it
        output_target(path, "output", suffix)
    if path.suffix and path.suffix.lower() != suffix:  # x.gif as x.gif.png, r.txt as r.txt.npz: not what was asked
        raise InputError(f"{option} {arg!r} ends in {path.suffix}, and this command writes {suffix} files",
                         where=f"sdrt {option}",
                         fix=f"end the name in {suffix} ({path.stem}{suffix}), or leave the suffix out ({path.stem})")
    if path.suffix.lower() != suffix:
        path = path.with_name(path.name + suffix)
    if not path.parent.is_dir():
        raise InputError(f"the folder of {option} {arg!r} does not exist", where=str(path.parent),
                         fix=f"create it first (mkdir -p {path.parent}) or write somewhere else")
    output_target(path, "output", suffix)  # a regular file or none: never a device, FIFO or socket
    return path
