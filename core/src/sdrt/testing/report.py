"""Run a conformance suite and summarise it per op."""

from __future__ import annotations

import re
import unittest
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: outcomes a test can have, in report order: ``unsupported`` is a backend's ``UnsupportedGraph``,
#: ``skipped`` an excluded test; in an isolated run (``BackendTest.run(isolate=True)``) ``crashed`` is
#: a test that killed its child process, ``timeout`` one that gave no answer in time and was stopped
OUTCOMES = ("passed", "failed", "crashed", "timeout", "unsupported", "skipped", "xfail", "xpass")

#: the prefix of a skip reason that a backend's ``UnsupportedGraph`` gave (see ``adapter.py``)
UNSUPPORTED = "unsupported: "


@dataclass
class Crash:
    """A test whose child process died, or gave no answer and was stopped, while running it."""

    test: str
    op: str
    exit: str  # "killed by SIGABRT", "exit code 1", "no answer after 600 s"
    stderr_tail: str  # the child's last lines of stderr
    #: whether the test, run again alone in a fresh process, crashed too; when False the outcome of that
    #: lone run is the test's outcome, and the crash is likely an earlier test's damage (a corrupted heap)
    confirmed: bool = True
    alone: str = "crashed"

    def message(self) -> str:
        said = " | ".join(ln.strip() for ln in self.stderr_tail.splitlines()[-3:] if ln.strip())
        return self.exit + (f": {said}" if said else "")

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "op": self.op, "exit": self.exit, "confirmed": self.confirmed,
                "alone": self.alone, "stderr_tail": self.stderr_tail.splitlines()}


@dataclass
class OpResult:
    op: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failures: list[tuple[str, str]] = field(default_factory=list)
    crashes: list[tuple[str, str]] = field(default_factory=list)
    unsupported: list[tuple[str, str]] = field(default_factory=list)  # (test, the backend's reason)


@dataclass
class Summary:
    backend: str
    device: str
    ops: dict[str, OpResult] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)  # test name -> outcome
    crashes: list[Crash] = field(default_factory=list)  # isolated runs: every child that died, in order

    def record(self, op: str, name: str, outcome: str, message: str = "") -> None:
        r = self.ops.setdefault(op, OpResult(op))
        r.counts[outcome] += 1
        self.outcome[name] = outcome
        if outcome in ("failed", "xfail"):
            r.failures.append((name, message))
        elif outcome in ("crashed", "timeout"):
            r.crashes.append((name, message))
        elif outcome == "unsupported":
            r.unsupported.append((name, message[len(UNSUPPORTED):] if message.startswith(UNSUPPORTED) else message))

    def totals(self) -> dict[str, int]:
        t = dict.fromkeys(OUTCOMES, 0)
        for r in self.ops.values():
            for k, v in r.counts.items():
                t[k] += v
        return t

    def render(self, *, failures: bool = True) -> str:
        width = max([len(o) for o in self.ops] + [10])
        lines = [f"conformance: {self.backend} on {self.device}", ""]
        cols = {o: max(7, len(o)) for o in OUTCOMES}
        lines.append(f"{'op':<{width}}  " + "  ".join(f"{o:>{cols[o]}}" for o in OUTCOMES))
        for op in sorted(self.ops):
            c = self.ops[op].counts
            lines.append(f"{op:<{width}}  " + "  ".join(f"{c[o]:>{cols[o]}}" for o in OUTCOMES))
        t = self.totals()
        lines.append(f"{'TOTAL':<{width}}  " + "  ".join(f"{t[o]:>{cols[o]}}" for o in OUTCOMES))
        if failures:
            failed = [(op, n, m) for op, r in sorted(self.ops.items()) for n, m in r.failures]
            if failed:
                lines += ["", "failures:"]
                lines += [f"  {n} [{op}]: {m}" for op, n, m in failed]
        crashed = [c for c in self.crashes if c.confirmed]
        if crashed:
            lines += ["", "crashed or stopped (the process died running the test, alone too, or gave no answer):"]
            lines += [f"  {c.test} [{c.op}]: {c.message()}" for c in crashed]
        other = [c for c in self.crashes if not c.confirmed]
        if other:
            lines += ["", "crashes not reproduced alone (the process died on the test after earlier tests; "
                          "alone it did not):"]
            lines += [f"  {c.test} [{c.op}]: {c.message()}; alone: {c.alone}" for c in other]
        run = t["passed"] + t["failed"] + t["crashed"] + t["timeout"] + t["xfail"] + t["xpass"]
        lines += ["", f"{t['passed']} passed, {t['failed']} failed, {t['crashed']} crashed, {t['timeout']} timeout, "
                      f"{t['unsupported']} unsupported, {t['skipped']} skipped, "
                      f"{t['xfail']} xfail, {t['xpass']} xpass ({run} run)"]
        return "\n".join(lines)

    def markdown(self) -> str:
        """The per-op table and totals as Markdown (for a backend's docs), with the crashes listed."""
        shown = [o for o in OUTCOMES if o not in ("xfail", "xpass")] + \
            [o for o in ("xfail", "xpass") if self.totals()[o]]
        lines = ["| op | " + " | ".join(shown) + " |", "|---|" + "---:|" * len(shown)]
        for op in sorted(self.ops):
            c = self.ops[op].counts
            lines.append(f"| {op} | " + " | ".join(str(c[o]) for o in shown) + " |")
        t = self.totals()
        lines.append("| **total** | " + " | ".join(f"**{t[o]}**" for o in shown) + " |")
        for c in self.crashes:
            lines.append(f"\n- `{c.test}` ({c.op}): {c.message()}" + ("" if c.confirmed else f"; alone: {c.alone}"))
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "device": self.device, "totals": self.totals(),
            "ops": {op: {"counts": r.counts, "failures": [list(f) for f in r.failures],
                         "crashes": [list(c) for c in r.crashes],
                         "unsupported": [list(u) for u in r.unsupported]}
                    for op, r in sorted(self.ops.items())},
            "crashes": [c.to_json() for c in self.crashes],
        }


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def _first_line(text: str) -> str:
    """The exception line of a traceback, with what follows it (numpy's ACTUAL/DESIRED), on one line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    start = max((i for i, ln in enumerate(lines) if _EXC_LINE.match(ln)), default=len(lines) - 1)
    return " | ".join(lines[start:])[:500] if lines else ""


class Outcomes(unittest.TestResult):
    """A unittest result that hands each test's (name, outcome, message) to ``record``."""

    def __init__(self, record: Callable[[str, str, str], None]) -> None:
        super().__init__()
        self._record = record

    def addSuccess(self, test: Any) -> None:
        self._record(test._testMethodName, "passed", "")

    def addFailure(self, test: Any, err: Any) -> None:
        self._record(test._testMethodName, "failed", _first_line(self._exc_info_to_string(err, test)))

    def addError(self, test: Any, err: Any) -> None:
        self._record(test._testMethodName, "failed", _first_line(self._exc_info_to_string(err, test)))

    def addSkip(self, test: Any, reason: str) -> None:
        outcome = "unsupported" if reason.startswith(UNSUPPORTED) else "skipped"
        self._record(test._testMethodName, outcome, reason[:300])

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self._record(test._testMethodName, "xfail", _first_line(self._exc_info_to_string(err, test)))

    def addUnexpectedSuccess(self, test: Any) -> None:
        self._record(test._testMethodName, "xpass", "")


def collect(suite: unittest.TestSuite, ops: dict[str, str], backend: str, device: str,
            xfail_reasons: dict[str, str], progress: Callable[[str, str], None] | None = None) -> Summary:
    summary = Summary(backend, device)
    suite.run(Outcomes(recorder(summary, ops, xfail_reasons, progress)))
    return summary


def recorder(summary: Summary, ops: dict[str, str], xfail_reasons: dict[str, str],
             progress: Callable[[str, str], None] | None = None) -> Callable[[str, str, str], None]:
    """``record(test name, outcome, message)`` into ``summary``, per op, calling ``progress`` after each."""

    def record(name: str, outcome: str, message: str) -> None:
        if outcome == "xfail":
            reason = next((why for pat, why in xfail_reasons.items() if re.search(pat, name)), "")
            message = f"xfail: {reason}"
        summary.record(ops.get(name, "(unknown)"), name, outcome, message)
        if progress:
            progress(name, outcome)

    return record
