"""Isolated conformance runs: a test that aborts, segfaults or hangs costs that test, not the run.

The ``fragile`` fixture backend (``fixtures/sdrt_conformance_fixture.py``) dies
for real inside ``Session.run``: ``os.abort()``, a read of address 0, a sleep
past the timeout. The children find it through PYTHONPATH (the tests load no
entry points) and ``plugin_modules``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sdrt.errors import SdrtError
from sdrt.testing import BackendTest

FIXTURES = Path(__file__).parent / "fixtures"
MODULE = "sdrt_conformance_fixture"


@pytest.fixture
def fragile(registry, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(FIXTURES))
    import sdrt_conformance_fixture

    registry.register_plugin(sdrt_conformance_fixture, "fragile")
    return (MODULE,)


def test_an_abort_costs_one_test_and_the_tests_after_it_still_run(fragile):
    summary = (BackendTest("fragile", suites=("node",)).include(r"^test_(neg|relu|reciprocal)_cpu$")
               .run(isolate=True, plugin_modules=fragile))
    assert summary.outcome == {"test_neg_cpu": "crashed", "test_reciprocal_cpu": "passed", "test_relu_cpu": "passed"}
    (crash,) = summary.crashes
    assert (crash.test, crash.op, crash.exit, crash.confirmed) == ("test_neg_cpu", "Neg", "killed by SIGABRT", True)
    assert "fragile: aborting on Neg" in crash.stderr_tail
    assert summary.ops["Neg"].counts["crashed"] == 1 and summary.totals()["failed"] == 0
    text = summary.render()
    assert "crashed or stopped (the process died running the test, alone too, or gave no answer):" in text
    assert "test_neg_cpu [Neg]: killed by SIGABRT: fragile: aborting on Neg" in text
    assert "2 passed, 0 failed, 1 crashed, 0 timeout" in text
    data = summary.to_json()
    assert data["totals"]["crashed"] == 1 and data["crashes"][0]["exit"] == "killed by SIGABRT"
    assert data["ops"]["Neg"]["crashes"][0][0] == "test_neg_cpu"


def test_a_segfault_in_a_small_batch_is_recorded_with_its_signal(fragile):
    summary = (BackendTest("fragile", suites=("node",)).include(r"^test_(sin|relu)_cpu$")
               .run(isolate=True, plugin_modules=fragile, batch=1))
    assert summary.outcome == {"test_relu_cpu": "passed", "test_sin_cpu": "crashed"}
    assert summary.crashes[0].exit == "killed by SIGSEGV"
    assert "reading address 0 on Sin" in summary.crashes[0].stderr_tail


def test_a_hang_is_stopped_at_the_timeout_and_the_run_goes_on(fragile):
    summary = (BackendTest("fragile", suites=("node",)).include(r"^test_(cos|relu)_cpu$")
               .run(isolate=True, plugin_modules=fragile, timeout=5))
    assert summary.outcome == {"test_cos_cpu": "timeout", "test_relu_cpu": "passed"}
    assert summary.crashes[0].exit == "no answer after 5 s; the process was stopped"
    assert summary.totals()["timeout"] == 1 and "1 timeout" in summary.render()


def test_a_crash_that_does_not_happen_alone_keeps_the_lone_outcome_and_is_listed_apart(fragile):
    # Tanh aborts only after earlier runs in the same process: first in a child (alone) it passes
    summary = (BackendTest("fragile", suites=("node",)).include(r"^test_(tanh|relu)_cpu$")
               .run(isolate=True, plugin_modules=fragile))
    assert summary.outcome == {"test_tanh_cpu": "passed", "test_relu_cpu": "passed"}
    (crash,) = summary.crashes
    assert (crash.test, crash.confirmed, crash.alone, crash.exit) == ("test_tanh_cpu", False, "passed",
                                                                      "killed by SIGABRT")
    assert "crashes not reproduced alone" in summary.render() and summary.totals()["crashed"] == 0


def test_isolated_and_in_process_runs_agree_on_a_backend_that_does_not_crash(registry, fixture_reference):
    pattern = r"^test_(relu|abs|softmax_axis_0|add_bcast|bernoulli_seed)(_|$)"
    inproc = BackendTest("reference", suites=("node",)).include(pattern).run()
    isolated = BackendTest("reference", suites=("node",)).include(pattern).run(
        isolate=True, plugin_modules=fixture_reference, batch=2)
    assert isolated.outcome == inproc.outcome and isolated.crashes == []
    assert isolated.outcome["test_bernoulli_seed_cpu"] == "xfail"  # the backend's expectations travel too


@pytest.fixture
def fixture_reference():
    return ("sdrt_reference",)


def test_a_backend_the_child_cannot_find_is_an_error_that_says_what_to_do(registry, inline_plugin):
    from test_conformance import _Plugin  # the in-process "wrong" backend: no module a child can import

    inline_plugin(_Plugin(), "wrong-plugin")
    with pytest.raises(SdrtError, match=r"backend 'wrong' is not registered in the child process.*plugin_modules"):
        BackendTest("wrong").include(r"^test_relu_gpu_1$").run(isolate=True)


def test_compile_options_that_are_not_json_values_are_refused(registry):
    suite = BackendTest("reference", suites=("node",)).include(r"^test_relu_cpu$")
    suite.compile_options = {"hook": object()}  # past the up-front check (the reference backend takes no options)
    with pytest.raises(SdrtError, match=r"cannot be sent to a child process.*isolate=False"):
        suite.run(isolate=True)


def test_cli_isolates_by_default_and_writes_crashes_to_json(fragile, tmp_path, capsys):
    from sdrt.cli import main

    out, md = tmp_path / "c.json", tmp_path / "c.md"
    args = ["conformance", "fragile", "--suite", "node", "-k", "^test_(neg|relu)_cpu$", "--plugin-module", MODULE,
            "--json", str(out), "--markdown", str(md)]
    assert main(args) == 0
    assert main([*args, "--strict"]) == 1
    text = capsys.readouterr()
    assert "test_neg_cpu [Neg]: killed by SIGABRT" in text.out and "test_neg_cpu: crashed" in text.err
    data = json.loads(out.read_text())
    assert data["totals"]["crashed"] == 1 and data["crashes"][0]["test"] == "test_neg_cpu"
    assert "fragile: aborting on Neg" in data["crashes"][0]["stderr_tail"]
    table = md.read_text()
    assert "| Neg | 0 | 0 | 1 | 0 | 0 | 0 |" in table and "| **total** | **1** | **0** | **1** |" in table
    assert "- `test_neg_cpu` (Neg): killed by SIGABRT: fragile: aborting on Neg" in table


def test_the_worker_puts_vendor_prints_on_stderr_not_in_the_event_stream(fragile):
    import subprocess

    job = BackendTest("fragile", suites=("node",)).job(fragile)
    script = ("import sys, sdrt.child as c; ch = c.event_channel(); print('vendor noise', end=''); "
              "c.emit(ch, 'start', 'x')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert proc.stdout == "@start x\n" and proc.stderr == "vendor noise"
    assert job["backend"] == "fragile" and job["plugin_modules"] == [MODULE]
