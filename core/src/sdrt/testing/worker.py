"""The child process of an isolated conformance run (``isolation.py``).

``python -m sdrt.testing.worker`` reads a job on stdin: ``BackendTest.job()``
plus ``"tests"``, the test names to run in order. It rebuilds the suite for
just those tests and streams, on its event channel (``sdrt.child``):

- ``@start NAME`` before each test (a death after it is blamed on NAME);
- ``@result {"test", "outcome", "message"}`` after it;
- ``@fatal {"message"}`` when the suite cannot be set up (an ``SdrtError``);
- ``@done`` after the last test.
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from typing import Any

from ..child import emit, event_channel
from ..errors import SdrtError


def _tests(suite: unittest.TestSuite) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            out.update(_tests(t))
        else:
            out[t._testMethodName] = t
    return out


def main() -> int:
    channel = event_channel()
    job = json.loads(sys.stdin.read())
    from .report import Outcomes
    from .suite import BackendTest

    try:
        suite = BackendTest.from_job(job)
        names = list(job["tests"])
        tests = _tests(suite.runner(suite.selected(set(names))).test_suite)
    except SdrtError as exc:
        emit(channel, "fatal", json.dumps({"message": str(exc)}))
        return 2

    def record(name: str, outcome: str, message: str) -> None:
        emit(channel, "result", json.dumps({"test": name, "outcome": outcome, "message": message}))

    result = Outcomes(record)
    for name in names:
        emit(channel, "start", name)
        test = tests.get(name)
        if test is None:
            record(name, "skipped", "not in this onnx version's test suite")
            continue
        test(result)
    emit(channel, "done")
    channel.close()
    sys.stderr.flush()
    os._exit(0)  # a vendor library's exit-time destructors cannot turn finished work into a crash


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main())
