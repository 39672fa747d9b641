"""convert.private_map: a read-only map of a weights file mapped again copy-on-write, so OpenVINO can share it."""

from __future__ import annotations

import numpy as np

from sdrt_openvino.convert import private_map


def test_a_read_only_file_map_is_mapped_again_writable_with_the_same_values_and_the_file_untouched(tmp_path):
    values = np.arange(4096 + 37, dtype=np.float32)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 100 + values.tobytes())  # an offset inside the file, not page-aligned
    ro = np.asarray(np.memmap(path, dtype=np.uint8, mode="r", offset=100, shape=(values.nbytes,))).view(np.float32)
    view = ro[37:].reshape(16, 256)  # a view that starts inside the map
    for arr in (ro, view):
        cow = private_map(arr)
        assert cow is not None and cow.flags.writeable and not arr.flags.writeable
        assert cow.shape == arr.shape and cow.dtype == arr.dtype
        np.testing.assert_array_equal(cow, arr)
        cow[...] = -1  # a private map: the write stays in this process
    np.testing.assert_array_equal(np.frombuffer(path.read_bytes()[100:], np.float32), values)


def test_arrays_that_are_not_read_only_file_maps_are_left_alone():
    assert private_map(np.zeros(8, np.float32)) is None  # writable: shared as it is
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    assert private_map(frozen) is None  # read-only but in memory: the caller copies it
    assert private_map(np.frombuffer(b"\0" * 32, np.float32)) is None
