"""The I/O side of detection: run a command or read a file, with a timeout,
and turn every failure into a note instead of an exception.

Probes never decide anything; they hand text to the pure parsers in
``parse.py``. Tests point ``root`` at a fixture tree and pass a ``runner``
that answers from captured outputs.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("sdrt.hardware")

#: seconds any one command may take
DEFAULT_TIMEOUT = 10.0


class ProbeUnavailable(Exception):
    """The tool is not installed here (not a failure worth a note)."""


class ProbeFailed(Exception):
    """The tool ran but failed, timed out, or printed nothing usable."""


#: runner(probe_name, argv, timeout) -> stdout; raises ProbeUnavailable or ProbeFailed
Runner = Callable[[str, Sequence[str], float], str]


def run_command(name: str, argv: Sequence[str], timeout: float) -> str:
    """Run ``argv`` with a timeout and return its stdout."""
    exe = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0])
    if not exe or not os.path.exists(exe):
        raise ProbeUnavailable(f"{argv[0]} not found")
    env = dict(os.environ, LC_ALL="C", LANG="C")
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0)
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL, creationflags=flags, errors="replace")
    except subprocess.TimeoutExpired as exc:
        raise ProbeFailed(f"timed out after {timeout:g}s") from exc
    except OSError as exc:
        raise ProbeFailed(f"could not start: {exc}") from exc
    if proc.returncode != 0:
        raise ProbeFailed(failure_message(proc.returncode, proc.stderr or proc.stdout))
    return proc.stdout


def failure_message(returncode: int, output: str) -> str:
    """One line for a command that exited non-zero: its status and every non-empty line it printed.

    Tools put the cause on any line: nvidia-smi prints "Failed to initialize NVML: Driver/library version
    mismatch" and then "NVML library version: 550.144", so keeping only the last line would drop the cause.
    """
    detail = "; ".join(line.strip() for line in output.splitlines() if line.strip())
    if len(detail) > 300:
        detail = detail[:297] + "..."
    return f"exit status {returncode}" + (f": {detail}" if detail else "")


class Context:
    """What one ``detect()`` run probes with: a filesystem root, a runner, and its notes."""

    def __init__(self, root: str | os.PathLike[str] = "/", runner: Runner | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.root = Path(root)
        self.runner: Runner = runner or run_command
        self.timeout = timeout
        self.notes: list[str] = []

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str | Path) -> str | None:
        """A file under the root, or None when absent or unreadable."""
        p = rel if isinstance(rel, Path) else self.path(rel)
        try:
            return p.read_text(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.note(f"{p}: {exc.strerror or exc}")
            return None

    def cmd(self, name: str, argv: Sequence[str]) -> str | None:
        """A command's stdout, or None when the tool is absent or fails (which is noted)."""
        try:
            out = self.runner(name, argv, self.timeout)
        except ProbeUnavailable:
            log.debug("probe %s: not available", name)
            return None
        except ProbeFailed as exc:
            self.note(f"{name}: {exc}")
            return None
        except Exception as exc:  # noqa: BLE001 - one probe must never stop detection
            self.note(f"{name}: {exc!r}")
            return None
        return out

    def guard(self, name: str, fn: Callable[[], object]) -> object:
        """Run one probe step; note and swallow whatever it raises."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            self.note(f"{name}: {exc!r}")
            return None

    def note(self, text: str) -> None:
        log.info("hardware probe: %s", text)
        self.notes.append(text)
