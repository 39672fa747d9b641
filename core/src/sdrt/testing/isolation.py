"""Isolated conformance runs: the tests in batches of child processes, so that a crash costs one test.

A vendor library that aborts (``free(): invalid pointer``), segfaults or hangs
inside a test would take the whole run with it. Here the parent lists the
tests and hands them, ``batch`` at a time, to a child
(``python -m sdrt.testing.worker``, fed the suite's ``job()`` on stdin). The
child streams ``@start NAME`` before each test and ``@result {json}`` after it
(``sdrt.child``). When a child dies, or gives no answer for ``timeout``
seconds, the test it had started is the suspect: it runs again alone in a
fresh child. Crashing again, it is recorded as ``crashed`` with the exit (the
signal or code) and the child's last lines of stderr (a test stopped for giving
no answer is ``timeout``, and is not run again); passing or failing
alone, that lone outcome counts, and the crash is listed apart as not
reproduced (an earlier test of the same child likely corrupted its heap). A
new child then resumes after the suspect.
"""

from __future__ import annotations

import json
import logging
import sys
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..child import Child, exit_text
from ..errors import SdrtError
from .report import Crash, Summary, recorder

if TYPE_CHECKING:  # pragma: no cover
    from .suite import BackendTest

log = logging.getLogger("sdrt.testing")

#: seconds a child may go without an answer (at start-up, or on one test) before it is stopped
TIMEOUT = 900.0
#: tests per child: a fresh process now and then bounds what one test's damage can do to the next, and
#: each costs a start-up (an OpenVINO child takes many seconds), so batches are large
BATCH = 1000

Record = Callable[[str, str, str], None]


@dataclass
class _Death:
    test: str | None  # the test the child had started and not finished; None: at start-up or between tests
    exit: str
    stderr_tail: str
    timed_out: bool


def test_names(suite: unittest.TestSuite) -> list[str]:
    """Test method names of ``suite``, in the order it runs them."""

    def walk(s: Any) -> Iterator[str]:
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from walk(t)
            else:
                yield t._testMethodName

    return list(walk(suite))


def _batch(job: dict[str, Any], names: list[str], timeout: float, record: Record) -> tuple[list[str], _Death | None]:
    """Run ``names`` in one child; the names it finished, and how it died if it did not finish them all."""
    cmd = [sys.executable, "-m", "sdrt.testing.worker"]
    done: list[str] = []
    current: str | None = None
    with Child(cmd, timeout=timeout, stdin=json.dumps(dict(job, tests=names))) as child:
        for kind, payload in child.events():
            if kind == "start":
                current = payload.strip()
                child.rearm()
            elif kind == "result":
                r = json.loads(payload)
                record(r["test"], r["outcome"], r["message"])
                done.append(r["test"])
                current = None
            elif kind == "fatal":
                child.kill()
                raise SdrtError(json.loads(payload)["message"], where="sdrt.testing isolated run (child process)",
                                fix="see the message; the same suite runs in-process with isolate=False")
            elif kind == "done":
                return done, None
        code = child.wait()
    if child.timed_out:
        what = f"no answer after {timeout:.0f} s; the process was stopped"
    else:
        what = exit_text(code)
    return done, _Death(current, what, child.stderr_tail(), child.timed_out)


def _alone(job: dict[str, Any], name: str, timeout: float) -> tuple[str, str] | _Death:
    """Run one test in a fresh child: its (outcome, message), or how the child died."""
    got: list[tuple[str, str]] = []
    _, death = _batch(job, [name], timeout, lambda n, outcome, message: got.append((outcome, message)))
    if got:
        return got[0]
    assert death is not None
    return death


def run(suite: BackendTest, runner: Any, ops: dict[str, str], progress: Callable[[str, str], None] | None, *,
        plugin_modules: tuple[str, ...], timeout: float, batch: int) -> Summary:
    """Run ``runner``'s tests in batches of child processes; see the module's docstring."""
    job = suite.job(plugin_modules)
    summary = Summary(suite.backend.name, str(suite.device))
    record = recorder(summary, ops, suite._xfail, progress)
    pending = test_names(runner.test_suite)
    while pending:
        done, death = _batch(job, pending[: max(1, batch)], timeout, record)
        pending = pending[len(done):]
        if death is None:
            continue
        if death.test is None:
            if done:  # died between two tests (or on the way out): nothing to blame, go on
                log.warning("a conformance child died between tests (%s); going on", death.exit)
                continue
            raise SdrtError(f"the conformance child process died before its first test ({death.exit}): "
                            f"{' | '.join(death.stderr_tail.splitlines()[-3:])}",
                            where=f"sdrt.testing isolated run of {suite.backend.name} on {suite.device}",
                            fix="run `sdrt info` to check the plugin loads; run with isolate=False (--no-isolate) "
                                "to see the error in this process")
        name = death.test
        pending = pending[1:]  # the suspect was the first test this child had not finished
        op = ops.get(name, "(unknown)")
        log.warning("conformance: %s %s%s", name, death.exit, "" if death.timed_out else "; running it again alone")
        alone = _Death(name, death.exit, death.stderr_tail, True) if death.timed_out else _alone(job, name, timeout)
        if isinstance(alone, _Death):
            crash = Crash(name, op, alone.exit, alone.stderr_tail)
            summary.crashes.append(crash)
            record(name, "timeout" if alone.timed_out else "crashed", crash.message())
        else:
            outcome, message = alone
            summary.crashes.append(Crash(name, op, death.exit, death.stderr_tail, confirmed=False, alone=outcome))
            record(name, outcome, message)
    return summary
