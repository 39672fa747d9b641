"""A job's later parts compiled ahead, on one background thread, beside the first part's compile and run.

A pipeline compiles each part when a job first uses it: the text encoder, then the UNet, then the VAE, one after the
other. OpenVINO's compile of the full-size SD 1.5 UNet takes 2.4-2.5 s with the interpreter released, using 1.5 of
a 2-core machine's cores on average (3.7-3.9 s of CPU), and the text encoder's and the VAE's compiles less. The
job's dry run (``Pipeline.plan``) already knows every part it will call and at which shapes, in order of first use,
so as the job starts the parts after the first are compiled in that order on one thread while this one compiles and
runs the first (``for_job``). A part's ``session`` (and every change to the part) waits for its own compile started
ahead, and while it waits compiles those not started yet itself (the VAE decoder while the UNet compiles); the job's
end waits for the thread and drops what it has not started.

Only where it cannot change what the job holds or computes: the backend says it compiles this way
(``Backend.compiles_beside``), the memory plan keeps every part of the job resident with room in the budget for
the largest part's weights besides (two compiles' transients at once), the pipeline is not in low-memory mode, and
the call is the one the job makes (whole graph, those shapes): the same session the job would have compiled, a little
earlier. A compile that fails ahead is compiled again when used, where its error is raised as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("sdrt.pipelines.ahead")

Shapes = dict[str, tuple[int, ...]]


class Pending:
    """One part's compile started ahead: ``wait`` returns once it is done (or dropped)."""

    def __init__(self, ahead: Ahead) -> None:
        self.ahead: Ahead | None = ahead
        #: the thread compiling it (the background one, or the one that took it over: ``Ahead.help``)
        self.thread = ahead.thread
        self.done = threading.Event()

    def wait(self) -> None:
        ahead = self.ahead
        if ahead is not None:
            ahead.help(self)
        self.done.wait()


class Ahead:
    """Compiles ``work`` (part, shapes) in order on one thread; a thread that waits for one of them compiles the
    ones not started yet meanwhile (``help``); ``stop`` drops what has not started and waits."""

    def __init__(self, work: list[tuple[Any, Shapes]], stores: Any = None) -> None:
        self.thread = threading.Thread(target=self._run, name="sdrt-compile-ahead", daemon=False)
        self.work = [(part, shapes, Pending(self)) for part, shapes in work]
        self._queue = list(self.work)
        self._lock = threading.Lock()
        self._stop = False
        self._stores = stores
        for part, _, pending in self.work:
            part._ahead = pending

    def start(self) -> Ahead:
        log.info("compiling %s ahead", ", ".join(part.name for part, _, _ in self.work))
        self.thread.start()
        return self

    def _take(self) -> tuple[Any, Shapes, Pending] | None:
        with self._lock:
            if self._stop or not self._queue:
                return None
            item = self._queue.pop(0)
            item[2].thread = threading.current_thread()
            return item

    @staticmethod
    def _compile(item: tuple[Any, Shapes, Pending]) -> None:
        part, shapes, pending = item
        try:
            part.session(shapes)
        except Exception as exc:  # noqa: BLE001 - compiled again when used, and raised there
            log.debug("compiling %s ahead failed (%s); it compiles when used", part.name, exc)
        finally:
            pending.done.set()

    def _run(self) -> None:
        from ..cache import deferred

        with deferred.within(self._stores):
            while (item := self._take()) is not None:
                self._compile(item)

    def help(self, until: Pending) -> None:
        """On a thread about to wait for ``until``: compile the parts not started yet (the VAE while the UNet
        compiles) until it is done or none is left, rather than idle."""
        while not until.done.is_set() and (item := self._take()) is not None:
            self._compile(item)

    def stop(self) -> None:
        with self._lock:
            self._stop = True
        if self.thread.ident is not None:  # started
            self.thread.join()
        for part, _, pending in self.work:
            pending.done.set()  # dropped: nothing to wait for
            pending.ahead = None  # no cycle left to hold the parts (a pipeline dropped without close() is freed)
            if part._ahead is pending:
                part._ahead = None
        self.work, self._queue = [], []


def plan_ahead(pipe: Any, calls: Mapping[str, list[Shapes]] | None, outputs: Mapping[str, tuple[str, ...]]
               ) -> list[tuple[Any, Shapes]]:
    """What to compile ahead for this job: the first call of each part after the first one it uses, in order, where
    that is not compiled yet (empty where that could change what the job holds; see the module doc)."""
    from ..errors import SdrtError
    from ..runtime import select

    if not calls or not pipe._resident_with_room():  # two compiles' transients at once: the same room
        return []
    work: list[tuple[Any, Shapes]] = []
    for name in list(calls)[1:]:
        part = pipe._parts.get(name)
        if part is None or outputs.get(name) or part.stream_bytes:
            continue
        try:
            be, _ = select(part.backend, part.device)
        except SdrtError:
            continue
        if not getattr(be, "compiles_beside", False):
            continue
        shapes = calls[name][0]  # its first call's (a hires fix's second size compiles when used)
        if part.shape_key(shapes) not in part.sessions and all(part is not q for q, _ in work):
            work.append((part, dict(shapes)))
    return work


@contextlib.contextmanager
def for_job(pipe: Any, calls: Mapping[str, list[Shapes]] | None,
            outputs: Mapping[str, tuple[str, ...]]) -> Iterator[None]:
    """Inside, the job's later parts compile ahead (``plan_ahead``); at its end, the compiles not started are dropped
    and the one running is waited for."""
    work = plan_ahead(pipe, calls, outputs)
    if not work:
        yield
        return
    from ..cache import deferred

    for part, _ in work:
        _ = part.graph  # loaded here, not raced for by both threads
    ahead = Ahead(work, deferred.current()).start()
    try:
        yield
    finally:
        ahead.stop()
