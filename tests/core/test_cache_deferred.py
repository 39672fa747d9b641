"""``sdrt.cache.deferred``: stores held by a job run after it, in a background thread, once no job runs."""

from __future__ import annotations

import threading
import time

from sdrt.cache import deferred, wait_for_stores


def test_outside_a_job_nothing_is_held():
    assert not deferred.holding()
    assert deferred.submit(lambda: None, "x") is False


def test_held_stores_run_after_the_outermost_job_in_another_thread():
    ran: list[tuple[str, str]] = []
    job_thread = threading.current_thread().name
    with deferred.hold():
        with deferred.hold():  # nested: the outer hold starts them
            assert deferred.submit(lambda: ran.append(("a", threading.current_thread().name)), "a")
        assert deferred.holding()
        assert deferred.submit(lambda: ran.append(("b", threading.current_thread().name)), "b")
        time.sleep(deferred.IDLE_S + 0.3)
        assert ran == [], "a held store waits for the job's end"
    assert not deferred.holding()
    assert wait_for_stores(timeout=30)
    assert [name for name, _ in ran] == ["a", "b"]
    assert all(thread != job_thread for _, thread in ran)


def test_a_held_store_waits_while_another_job_runs(monkeypatch):
    monkeypatch.setattr(deferred, "IDLE_S", 0.2)
    ran: list[float] = []
    second_started = threading.Event()
    second_may_end = threading.Event()

    def second_job() -> None:
        with deferred.hold():
            second_started.set()
            second_may_end.wait(10)

    t = threading.Thread(target=second_job)
    with deferred.hold():
        deferred.submit(lambda: ran.append(time.monotonic()), "a")
        t.start()  # the second job begins before the first ends: no idle moment between them
        assert second_started.wait(10)
    time.sleep(0.6)
    assert ran == [], "the store does not start while a job runs"
    ended = time.monotonic()
    second_may_end.set()
    t.join()
    assert wait_for_stores(timeout=30)
    assert len(ran) == 1 and ran[0] >= ended + 0.2 - 0.05


def test_a_failing_store_is_logged_not_raised(caplog):
    def boom() -> None:
        raise OSError("disk full")

    with deferred.hold():
        deferred.submit(boom, "the unet")
    assert wait_for_stores(timeout=30)
    assert any("cannot store the unet" in r.getMessage() for r in caplog.records)


def test_pending_counts_the_stores_not_finished():
    import threading as th

    gate = th.Event()
    before = deferred.pending()
    with deferred.hold():
        deferred.submit(gate.wait, "a")
        deferred.submit(lambda: None, "b")
    assert deferred.pending() == before + 2
    gate.set()
    assert wait_for_stores(timeout=30)
    assert deferred.pending() == 0
