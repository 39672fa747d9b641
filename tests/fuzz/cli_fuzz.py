"""Running ``sdrt`` in-process for the CLI fuzz tests, and what every run must keep to.

``sdrt(args)`` runs ``sdrt.cli.main`` with stdout and stderr captured and returns ``(rc, stderr)`` after checking
the error policy: exit 0 (done), 1 (an sdrt error) or 2 (argparse's refusal); on 1 or 2 exactly one ``error:``
line that says what, where (``Where:``) and what to do (``What to do:``); never a traceback or an exception out of
``main``; and no run longer than ``LIMIT`` seconds (a FIFO read as a picture would wait forever).

``Sandbox`` is a folder of inputs (pictures, a LoRA, a text file, a FIFO, a folder named like a file, links) whose
bytes are hashed before a run and checked after it: no run may change or remove one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import resource
import shutil
import signal
import stat
from pathlib import Path

import pictures

from sdrt.cli import main

#: seconds one run may take (a run here is 1-2 steps on a tiny model; a blocked open would be forever)
LIMIT = 60
#: stderr lines that a run prints besides its error (the backend it picked, the cache it writes)
INFO = ("backend ", "writing the compile cache", "wrote ")


class Hung(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise Hung(f"a run took over {LIMIT} s")


#: bytes of address space a run may add: a value that asks for tens of GB fails here as a MemoryError (a finding),
#: not as the OOM killer's SIGKILL of the whole test process (and of whatever else runs on the machine)
HEADROOM = 4 << 30


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _bounded_memory():
    if not Path("/proc/self/statm").exists():
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + HEADROOM
    if soft != resource.RLIM_INFINITY and soft < limit or hard != resource.RLIM_INFINITY and hard < limit:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def sdrt(args: list[str]) -> tuple[int, str]:
    """``sdrt ARGS`` in-process: (exit status, stderr), the error policy asserted."""
    err, out = io.StringIO(), _Bytes()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), _bounded_memory():
            try:
                rc = main(args)
            except SystemExit as exc:  # argparse's refusal, as the command exits on it
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    check_policy(args, rc, text)
    return rc, text


def check_policy(args: list[str], rc: int, text: str) -> None:
    assert "Traceback" not in text, f"sdrt {args!r} printed a traceback:\n{text}"
    assert rc in (0, 1, 2), f"sdrt {args!r} exited {rc}:\n{text}"
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    if rc == 0:
        assert not errors, f"sdrt {args!r} exited 0 with an error line:\n{text}"
        return
    assert len(errors) == 1, f"sdrt {args!r} exited {rc} with {len(errors)} error lines:\n{text}"
    others = [line for line in text.splitlines() if not line.startswith(("error:", *INFO))]
    assert not others, f"sdrt {args!r} printed more than its error:\n{text}"
    line = errors[0]
    assert " Where: " in line and " What to do: " in line, f"sdrt {args!r}: the error lacks where / what to do:\n{line}"


class _Bytes(io.StringIO):
    """A stdout that also takes bytes (``-o -`` writes a PNG to ``sys.stdout.buffer``), is no terminal, and encodes
    as a strict UTF-8 terminal does (a UTF-8 locale other than C.UTF-8): a surrogate is a UnicodeEncodeError."""

    encoding = "utf-8"

    def __init__(self) -> None:
        super().__init__()
        self.buffer = io.BytesIO()

    def write(self, text: str) -> int:
        text.encode(self.encoding)
        return super().write(text)

    def isatty(self) -> bool:
        return False


def _outputs(args: list[str]) -> set[str]:
    """The values given to ``-o`` / ``--output`` in ``args`` (``-o X``, ``--output X``, ``-o=X``, ``--output=X``)."""
    out = set()
    for i, a in enumerate(args):
        if a in ("-o", "--output") and i + 1 < len(args):
            out.add(args[i + 1])
        elif a.startswith(("-o=", "--output=")):
            out.add(a.split("=", 1)[1])
    return out


def digest(path: Path) -> str:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return "dir:" + ",".join(sorted(os.listdir(path)))
    if not stat.S_ISREG(st.st_mode):
        return f"special:{stat.S_IFMT(st.st_mode)}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unblock(fifo: Path) -> None:
    """Open ``fifo`` for writing, and close it, whenever a reader waits on it (a daemon thread)."""
    import threading
    import time

    def run() -> None:
        while fifo.exists():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader yet
                pass
            time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()


class Sandbox:
    """Input files of every odd kind in ``root``, checked unchanged after each run (``check``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.inputs = root / "in"
        self.inputs.mkdir(exist_ok=True)
        self.picture = pictures.make("png", self.inputs)
        self.paths: dict[str, Path] = {"picture": self.picture}
        for kind in ("jpeg", "rgba.png", "exif-rotated.jpg", "empty.png", "text.png", "truncated.png", "bomb.png",
                     "1x1.png", "animated.gif"):
            self.paths[kind] = pictures.make(kind, self.inputs)
        (self.inputs / "notes.txt").write_text("not a model\n")
        self.paths["text"] = self.inputs / "notes.txt"
        (self.inputs / "folder.png").mkdir(exist_ok=True)
        self.paths["folder"] = self.inputs / "folder.png"
        self.paths["missing"] = self.inputs / "missing.png"
        fifo = self.inputs / "fifo.png"
        if not fifo.exists():
            os.mkfifo(fifo)
        self.paths["fifo"] = fifo
        _unblock(fifo)  # a run that opens it gets an empty file (what it says is then checked), never a wait forever
        link = self.inputs / "dangling.png"
        if not os.path.lexists(link):
            os.symlink(self.inputs / "nowhere", link)
        self.paths["dangling"] = link
        loop = self.inputs / "loop.png"
        if not os.path.lexists(loop):
            os.symlink(loop, loop)
        self.paths["loop"] = loop
        self.paths["devnull"] = Path(os.devnull)
        self.paths["newline"] = self.inputs / "new\nline.png"
        self.paths["newline"].write_bytes(pictures.GOOD["png"])
        self.paths["unicode"] = self.inputs / "ünï cødé 画像 🦊.png"
        self.paths["unicode"].write_bytes(pictures.GOOD["png"])
        self.paths["not-utf8"] = self.inputs / "\udcff.png"  # the byte 0xff, as Python reads argv on Linux
        self.paths["not-utf8"].write_bytes(pictures.GOOD["png"])
        self.out = root / "out"
        self.out.mkdir(exist_ok=True)
        self.cwd = root / "cwd"  # the runs' current folder: every -o drawn is absolute, so it stays empty
        self.cwd.mkdir(exist_ok=True)
        self.before = self.snapshot()
        self.original = {str(p): p.read_bytes() for p in self.inputs.iterdir() if p.is_file() and not p.is_symlink()
                         and stat.S_ISREG(p.stat().st_mode)}

    def snapshot(self) -> dict[str, str]:
        return {str(p): digest(p) for p in sorted(self.inputs.rglob("*"), key=str) if p.parent == self.inputs}

    def check(self, args: list[str]) -> None:
        """No input of the run changed or removed. A sandbox file the run was told to write (``-o FILE``) and did not
        read is the user's to replace: it is put back for the next run."""
        after = self.snapshot()
        changed = {k: (v, after.get(k)) for k, v in self.before.items() if after.get(k) != v}
        told = _outputs(args)
        read = [a for i, a in enumerate(args) if not (i and args[i - 1] in ("-o", "--output"))
                and not a.startswith(("-o=", "--output="))]
        for name in [k for k in changed if k in told and not any(r == k or r.startswith(k + ":") for r in read)]:
            # written as asked, and not an input of the run: the user's to replace; put back for the next run
            Path(name).write_bytes(self.original[name])
            del changed[name]
        assert not changed, f"sdrt {args!r} changed or removed inputs: {changed}"
        stray = sorted(p.name for p in self.cwd.iterdir())
        for p in self.cwd.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        assert not stray, f"sdrt {args!r} wrote {stray} in the current folder, which no argument named"
        added = set(after) - set(self.before)
        for extra in added:  # something written among the inputs: allowed (an -o that points there), then removed
            p = Path(extra)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        for p in self.out.iterdir():  # each run starts with an empty output folder
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
