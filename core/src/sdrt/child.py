"""Work in a child process that may crash or hang: the parent side and the child side.

``sdrt selftest`` (one child per backend) and the conformance kit's isolated
runs (``sdrt conformance --isolate``: batches of test cases per child) both run
vendor code that can kill its process (a C ``abort()``, a segfault) or never
return. The child reports on a private copy of its stdout, one event a line
(``@kind payload``), so the parent keeps everything that came before a crash
and knows what the child was doing when it died. Whatever the child's libraries
print goes to stderr, whose last lines the parent keeps for the report.
"""

from __future__ import annotations

import collections
import importlib
import importlib.metadata as md
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any

from .plugins import Registry, get_registry

#: lines of a child's stderr kept for the report
STDERR_LINES = 40


# -- the child side -----------------------------------------------------------
def plugin_registry(plugin_modules: Sequence[str]) -> Registry:
    """The registry, with each importable module of ``plugin_modules`` registered as a plugin too.

    Lets a child find a backend that is not installed as an entry point (one
    being written, or a test fixture).
    """
    check_plugin_modules(plugin_modules)
    reg = get_registry()
    owners = md.packages_distributions() if plugin_modules else {}
    for name in plugin_modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the plugin's own error, in one line
            first = (str(exc).strip().splitlines() or [""])[0]
            raise _import_failed(name, f"{type(exc).__name__}: {first}") from exc
        dists = owners.get(name.split(".", 1)[0]) or [None]
        reg.register_plugin(module, name.rsplit(".", 1)[-1], distribution=dists[0], version=_version(dists[0]))
    return reg


def check_plugin_modules(plugin_modules: Sequence[str], try_import: bool = False) -> None:
    """An InputError naming ``plugin_modules`` for a module that cannot be found, checked in the parent
    (``importlib.util.find_spec``: nothing is imported here) before any child starts; with ``try_import``, also for
    one whose import fails, tried in a child process of its own (a plugin's import may crash), the error's last line
    quoted (rather than a child's traceback under "listing backends failed")."""
    import importlib.machinery
    import importlib.util

    from .errors import InputError

    # the children import with this process's PYTHONPATH, which may have changed since it started
    child_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for name in plugin_modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a missing parent package of a dotted name, or an empty name
            found = False
        if not found and name and child_path:
            found = importlib.machinery.PathFinder.find_spec(name.split(".", 1)[0], child_path) is not None
        if not found:
            raise InputError(f"{{@plugin_modules}}: no module named {name!r} can be imported here",
                             where="plugin_modules",
                             fix="pass the module's import name (as in `import NAME`), with its folder on "
                                 "PYTHONPATH or its package installed in this Python")
        if try_import:
            _try_import(name)


def _try_import(name: str, timeout: float = 120.0) -> None:
    """Import the plugin module ``name`` in a child process; an InputError quoting its error when that fails."""
    import subprocess
    import sys

    from .errors import InputError

    code = f"import importlib; importlib.import_module({name!r})"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InputError(f"{{@plugin_modules}}: importing {name!r} did not finish in {timeout:.0f} s",
                         where="plugin_modules", fix=f'run `python -c "import {name}"` to see where it hangs') from None
    if proc.returncode != 0:
        raise _import_failed(name, next((ln.strip() for ln in reversed(proc.stderr.splitlines()) if ln.strip()),
                                        exit_text(proc.returncode)))


def _import_failed(name: str, error: str) -> Exception:
    """The InputError for plugin module ``name`` whose import failed with ``error`` (its last line)."""
    from .errors import InputError

    return InputError(f"{{@plugin_modules}}: importing {name!r} failed: {error[:300]}", where="plugin_modules",
                      fix=f'run `python -c "import {name}"` to see the traceback, and fix the module')


def _version(distribution: str | None) -> str | None:
    try:
        return md.version(distribution) if distribution else None
    except md.PackageNotFoundError:
        return None


def event_channel() -> IO[str]:
    """A private copy of stdout for events; fd 1 (and ``sys.stdout``) then go to stderr.

    Vendor libraries that print on stdout, with or without a newline, cannot
    garble the events.
    """
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def emit(channel: IO[str], kind: str, payload: str = "") -> None:
    channel.write(f"@{kind} {payload}\n")
    channel.flush()


# -- the parent side ----------------------------------------------------------
def exit_text(code: int) -> str:
    """``killed by SIGABRT`` or ``exit code 3``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class Child:
    """A running child process that streams ``@kind payload`` events.

    ``timeout`` seconds without a call to ``rearm`` (the start counts as one)
    and the whole process group is killed; ``timed_out`` then says so.
    ``stdin`` is written to the child and closed. Iterate ``events()``, then
    call ``wait()`` for the exit code.
    """

    def __init__(self, cmd: Sequence[str], *, timeout: float, stdin: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        # glibc writes "free(): invalid pointer" and the like to stderr, not to a tty we cannot read
        child_env = dict(os.environ if env is None else env, LIBC_FATAL_STDERR_="1")
        self.timeout = timeout
        self.timed_out = False
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                     text=True, start_new_session=True, env=child_env)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self._timer: threading.Timer | None = None
        self.rearm()
        if stdin is not None:
            threading.Thread(target=self._write_stdin, args=(stdin,), daemon=True).start()

    def _write_stdin(self, text: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text)
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):  # the child died before reading it; its exit code says why
            pass

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line.rstrip("\n"))

    def rearm(self) -> None:
        """Restart the clock: the child has ``timeout`` seconds from now."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(self.timeout, self._kill)
        self._timer.daemon = True
        self._timer.start()

    def _kill(self) -> None:
        self.timed_out = True
        self.kill()

    def kill(self) -> None:
        """Kill the child and whatever it started (its process group; on Windows the child alone)."""
        try:
            if hasattr(os, "killpg"):
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:  # pragma: no cover - Windows
                self.proc.kill()
        except (ProcessLookupError, PermissionError):  # pragma: no cover - already gone
            pass

    def events(self) -> Iterator[tuple[str, str]]:
        """``(kind, payload)`` for each event line, until the child closes stdout (exits or dies)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@"):
                kind, _, payload = line[1:].rstrip("\n").partition(" ")
                yield kind, payload

    def wait(self) -> int:
        code = self.proc.wait()
        if self._timer is not None:
            self._timer.cancel()
        self._reader.join(timeout=5)
        return code

    def stderr_tail(self, lines: int = 15) -> str:
        return "\n".join(list(self._stderr)[-lines:])

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.wait()
