"""sdrt.weights.pages.release: mapped weights leave the resident set and stay readable."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sdrt.weights.pages import release


def _resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssFile and MADV_DONTNEED are Linux's")
def test_mapped_pages_leave_rss_and_the_array_stays_valid(tmp_path):
    data = np.random.default_rng(0).standard_normal(4 * 2**20).astype(np.float32)  # 16 MiB
    path = tmp_path / "w.bin"
    data.tofile(path)
    arr = np.asarray(np.memmap(path, dtype=np.uint8, mode="r")).view(np.float32)  # as onnxfile/stfile map them
    assert float(arr.sum()) == pytest.approx(float(data.sum()), rel=1e-4)  # every page read
    before = _resident_kib()
    assert release([arr, arr[:10], np.zeros(3)]) >= data.nbytes  # one mapping, advised once; in-memory arrays skipped
    assert before - _resident_kib() >= 12 * 1024  # most of the 16 MiB left RSS
    np.testing.assert_array_equal(arr, data)  # and reads back from the page cache


def test_in_memory_arrays_are_left_alone():
    a = np.ones(1000, np.float32)
    assert release([a, a.reshape(10, 100)]) == 0
    assert a.sum() == 1000
