"""Run a conformance suite and summarise it per op."""

from __future__ import annotations

import re
import unittest
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: outcomes a test can have, in report order
OUTCOMES = ("passed", "failed", "skipped", "xfail", "xpass")


@dataclass
class OpResult:
    op: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failures: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Summary:
    backend: str
    device: str
    ops: dict[str, OpResult] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)  # test name -> outcome

    def totals(self) -> dict[str, int]:
        t = dict.fromkeys(OUTCOMES, 0)
        for r in self.ops.values():
            for k, v in r.counts.items():
                t[k] += v
        return t

    def render(self, *, failures: bool = True) -> str:
        width = max([len(o) for o in self.ops] + [10])
        lines = [f"conformance: {self.backend} on {self.device}", ""]
        lines.append(f"{'op':<{width}}  " + "  ".join(f"{o:>7}" for o in OUTCOMES))
        for op in sorted(self.ops):
            c = self.ops[op].counts
            lines.append(f"{op:<{width}}  " + "  ".join(f"{c[o]:>7}" for o in OUTCOMES))
        t = self.totals()
        lines.append(f"{'TOTAL':<{width}}  " + "  ".join(f"{t[o]:>7}" for o in OUTCOMES))
        if failures:
            failed = [(op, n, m) for op, r in sorted(self.ops.items()) for n, m in r.failures]
            if failed:
                lines += ["", "failures:"]
                lines += [f"  {n} [{op}]: {m}" for op, n, m in failed]
        run = t["passed"] + t["failed"] + t["xfail"] + t["xpass"]
        lines += ["", f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, "
                      f"{t['xfail']} xfail, {t['xpass']} xpass ({run} run)"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "device": self.device, "totals": self.totals(),
            "ops": {op: {"counts": r.counts, "failures": [list(f) for f in r.failures]}
                    for op, r in sorted(self.ops.items())},
        }


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


class _Result(unittest.TestResult):
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
        self._record(test._testMethodName, "skipped", reason[:300])

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self._record(test._testMethodName, "xfail", _first_line(self._exc_info_to_string(err, test)))

    def addUnexpectedSuccess(self, test: Any) -> None:
        self._record(test._testMethodName, "xpass", "")


def collect(suite: unittest.TestSuite, ops: dict[str, str], backend: str, device: str,
            xfail_reasons: dict[str, str], progress: Callable[[str, str], None] | None = None) -> Summary:
    summary = Summary(backend, device)

    def record(name: str, outcome: str, message: str) -> None:
        op = ops.get(name, "(unknown)")
        r = summary.ops.setdefault(op, OpResult(op))
        r.counts[outcome] += 1
        summary.outcome[name] = outcome
        if outcome == "failed":
            r.failures.append((name, message))
        elif outcome == "xfail":
            reason = next((why for pat, why in xfail_reasons.items() if re.search(pat, name)), "")
            r.failures.append((name, f"xfail: {reason}"))
        if progress:
            progress(name, outcome)

    suite.run(_Result(record))
    return summary
