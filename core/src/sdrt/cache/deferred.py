"""Compile-cache stores held until a job has delivered its result.

Writing a compiled model into the cache is not free: OpenVINO's CPU plugin serializes the full-size SD 1.5
UNet's 1.7 GB blob in about 4.3 s of one core (``bench.ov_cache_probe``: ``compile_model`` with ``CACHE_DIR``
7.2-7.8 s against 2.9-3.2 s without). A pipeline's first image need not wait for it: inside ``hold()`` a backend
that can write its entry from the compiled model later (``Backend._defers_store``) compiles without writing and
hands the store here; when the outermost ``hold()`` ends (the job returned its images, or failed), the held
stores run one after another in a background thread. Python waits for that thread at exit (it is not a daemon),
and ``sdrt.cache.wait_for_stores`` waits for it too, so a process that makes one image and exits still leaves a
filled cache for the next one. Each held store starts only when no job has run for ``IDLE_S`` (it writes
between jobs, or at exit; one that a new job catches mid-write finishes beside it), on Linux at the lowest CPU
priority (nice 19).

Outside ``hold()`` nothing is deferred: a compile stores its entry before it returns, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger("sdrt.cache")

_local = threading.local()


def holding() -> bool:
    """Whether this thread is inside ``hold()``: stores submitted now wait for its end."""
    return bool(getattr(_local, "jobs", None) is not None)


def submit(job: Callable[[], object], what: str) -> bool:
    """Hold ``job`` (a store) until the current ``hold()`` ends; False (nothing held) outside one."""
    jobs = getattr(_local, "jobs", None)
    if jobs is None:
        return False
    jobs.append((job, what))
    return True


def current() -> list[tuple[Callable[[], object], str]] | None:
    """This thread's open ``hold()``'s stores (None outside one), for ``within`` on a thread that works for it."""
    return getattr(_local, "jobs", None)


@contextlib.contextmanager
def within(jobs: list[tuple[Callable[[], object], str]] | None) -> Iterator[None]:
    """Stores submitted on this thread join another thread's ``hold()`` (``jobs``: its ``current()``; None: none is
    open there, so nothing is deferred): a part compiled ahead for a job stores its entry with the job's. The other
    thread waits for this one before its ``hold()`` ends."""
    before = getattr(_local, "jobs", None)
    _local.jobs = jobs
    try:
        yield
    finally:
        _local.jobs = before


@contextlib.contextmanager
def hold() -> Iterator[None]:
    """Stores submitted inside run in a background thread once the outermost ``hold()`` ends, and only while no
    ``hold()`` of any thread is open (see ``IDLE_S``)."""
    if getattr(_local, "jobs", None) is not None:  # nested: the outer one starts them
        yield
        return
    _local.jobs = []
    with _busy:
        _busy.count += 1  # type: ignore[attr-defined]
    try:
        yield
    finally:
        jobs, _local.jobs = _local.jobs, None
        with _busy:
            _busy.count -= 1  # type: ignore[attr-defined]
            _busy.notify_all()
        if jobs:
            start(jobs)


#: a held store starts once no job has run for this long: back-to-back images (a batch, a benchmark, a queue of
#: requests) are not slowed by it; it runs between them, or at the process's exit
IDLE_S = 1.0
_busy = threading.Condition()
_busy.count = 0  # type: ignore[attr-defined]
_busy.waiting = 0  # type: ignore[attr-defined]
_writing = threading.Lock()


def _wait_idle() -> None:
    with _busy:
        while True:
            while _busy.count:  # type: ignore[attr-defined]
                _busy.wait()
            if not _busy.wait(IDLE_S) and not _busy.count:  # type: ignore[attr-defined]
                return


def _lower_priority() -> None:
    """This thread only (Linux: a thread is a task with its own nice value) yields the CPU to the jobs that
    follow: the next image's compute runs at full speed and the store uses the idle time, or finishes at exit."""
    import os
    import sys

    if sys.platform.startswith("linux") and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # not allowed here: the store runs at the process's priority
            pass


def pending() -> int:
    """How many held stores have not finished yet (started or waiting for the jobs to stop)."""
    with _busy:
        return int(_busy.waiting)  # type: ignore[attr-defined]


def start(jobs: list[tuple[Callable[[], object], str]]) -> threading.Thread:
    from .store import _pending, _pending_lock

    def run() -> None:
        _lower_priority()
        for job, what in jobs:
            _wait_idle()
            try:
                with _writing:  # one store at a time (each holds a whole blob in memory while it writes)
                    job()
            except Exception as exc:  # noqa: BLE001 - the cache is optional: log, never raise
                log.warning("cannot store %s in the compile cache (%s); going on without it", what, exc)
            finally:
                with _busy:
                    _busy.waiting -= 1  # type: ignore[attr-defined]

    thread = threading.Thread(target=run, name="sdrt-cache-deferred", daemon=False)
    with _busy:
        _busy.waiting += len(jobs)  # type: ignore[attr-defined]
    with _pending_lock:
        _pending.append(thread)
    log.info("storing %s in the compile cache in the background", ", ".join(w for _, w in jobs))
    thread.start()
    return thread
