"""sdrt.weights.pages.release: mapped weights leave the resident set and stay readable."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sdrt.weights.pages import release


def _resident_file_bytes() -> int:
    from sdrt.pipelines.budget import _status  # /proc/self/status, as the memory budget reads it

    return _status("RssFile")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssFile and MADV_DONTNEED are Linux's")
def test_mapped_pages_leave_rss_and_the_array_stays_valid(tmp_path):
    data = np.random.default_rng(0).standard_normal(4 * 2**20).astype(np.float32)  # 16 MiB
    path = tmp_path / "w.bin"
    data.tofile(path)
    arr = np.asarray(np.memmap(path, dtype=np.uint8, mode="r")).view(np.float32)  # as onnxfile/stfile map them
    assert float(arr.sum()) == pytest.approx(float(data.sum()), rel=1e-4)  # every page read
    before = _resident_file_bytes()
    assert release([arr, arr[:10], np.zeros(3)]) >= data.nbytes  # one mapping, advised once; in-memory arrays skipped
    assert before - _resident_file_bytes() >= 12 * 2**20  # most of the 16 MiB left RSS
    np.testing.assert_array_equal(arr, data)  # and reads back from the page cache


def test_in_memory_arrays_are_left_alone():
    a = np.ones(1000, np.float32)
    assert release([a, a.reshape(10, 100)]) == 0
    assert a.sum() == 1000


def _dropped(path) -> float | None:
    """Evict ``path`` from the page cache; the share still cached after (None: not measurable here)."""
    import os

    from sdrt.weights.pages import cached_fraction

    if not hasattr(os, "posix_fadvise"):
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return cached_fraction(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise and mincore are Linux's here")
def test_prefetch_reads_ranges_into_the_page_cache_not_the_resident_set(tmp_path):
    import time

    from sdrt.weights.pages import Prefetcher, cached_fraction, file_ranges
    from sdrt.weights.store import TensorRef

    path = tmp_path / "w.bin"
    np.random.default_rng(1).standard_normal(4 * 2**20).astype(np.float32).tofile(path)  # 16 MiB
    left = _dropped(path)
    if left is None or left > 0.5:
        pytest.skip(f"this file system keeps the file cached after DONTNEED ({left})")
    half = 8 * 2**20
    refs = [TensorRef("a", np.dtype(np.float32), (half // 4,), "f", lambda: None, (str(path), 0, half)),
            TensorRef("mem", np.dtype(np.float32), (4,), "m", lambda: None)]  # in memory: skipped
    ranges = file_ranges(refs)
    assert ranges == {str(path): [(0, half)]}
    before = _resident_file_bytes()
    p = Prefetcher()
    p.start(ranges)
    p.wait()
    assert p.bytes == half
    for _ in range(100):  # the reads were queued; they land shortly after
        cached = cached_fraction(path)
        if cached is not None and cached >= 0.45:
            break
        time.sleep(0.05)
    assert 0.45 <= cached <= 0.75  # the first half, not the rest
    assert _resident_file_bytes() - before < 2 * 2**20  # the page cache, not this process's memory


def test_prefetch_merges_neighbouring_ranges():
    from sdrt.weights.pages import _merged

    assert _merged([(100, 10), (0, 50), (2**30, 8)]) == [(0, 110), (2**30, 8)]


def test_unmapped_bytes_counts_only_memory_the_process_holds(tmp_path):
    """Arrays on a file mapping (np.memmap, views of it) hold no bytes of their own; converted ones do."""
    import numpy as np

    from sdrt.weights.pages import unmapped_bytes

    path = tmp_path / "w.bin"
    np.arange(1024, dtype=np.float32).tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r")
    held = mapped.astype(np.float16).astype(np.float32)  # as a float16 file bound onto float32 graphs is
    assert unmapped_bytes([mapped, mapped[10:20]]) == 0
    assert unmapped_bytes([mapped, held]) == held.nbytes


def test_openvino_keeps_float32_weights_held_in_memory_for_a_16_bit_compile():
    """The float16 copy of a 16-bit OpenVINO compile is made only where it lowers the peak: large float32 weights
    held in memory (not on a file map) would be held twice (SDXL under --memory 6GB passed its budget so)."""
    import numpy as np
    import pytest

    backend = pytest.importorskip("sdrt_openvino.backend", reason="the OpenVINO plugin is not installed")
    big = np.zeros((96 << 20) // 4, dtype=np.float32)  # zero pages: nothing is touched
    assert not backend._halving_frees({"w": big})
    assert backend._halving_frees({"w": np.zeros(16, dtype=np.float32)})  # small: copied anyway
    assert backend._halving_frees({})
