"""sdrt.weights.pages.private_map: a read-only map of a weights file mapped again copy-on-write, so a backend can keep
a weight as the file stores it (OpenVINO's shared constants, ggml's weights) without a copy."""

from __future__ import annotations

import numpy as np

from sdrt.weights.pages import private_map


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


def test_a_slice_of_a_map_is_mapped_again_at_its_own_offset(tmp_path):
    """A slice of an ``np.memmap`` is a memmap that keeps the first one's ``offset``: a GGUF reader's tensors are
    slices of its one map of the file, and their private map read the file's first bytes (the GGUF header)."""
    values = np.arange(1000, dtype=np.float32)
    path = tmp_path / "w.bin"
    path.write_bytes(b"GGUF" + b"\1" * 96 + values.tobytes())
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    tensor = whole[100:].view(np.float32)[10:500]  # as gguf's reader slices its map
    assert isinstance(tensor, np.memmap) and tensor.offset == 0
    cow = private_map(np.asarray(tensor))
    assert cow is not None
    np.testing.assert_array_equal(cow, values[10:500])


def test_a_file_changed_since_it_was_mapped_is_not_mapped_again(tmp_path):
    """A map made again by the file's name would read the new file at the old offsets: refused (FileChanged)."""
    import os

    import pytest

    from sdrt.errors import FileChanged
    from sdrt.weights import Weights, stfile

    path = tmp_path / "w.safetensors"
    stfile.write(path, {"w": np.arange(4096, dtype=np.float32)})
    arr = Weights.open(path)["w"]
    stfile.write(tmp_path / "b.safetensors", {"w": np.zeros(4096, np.float32)})
    os.replace(tmp_path / "b.safetensors", path)
    with pytest.raises(FileChanged, match="w.safetensors changed on disk"):
        private_map(arr)


def test_an_alignment_asked_for_is_the_file_offsets(tmp_path):
    import hashlib

    data = np.arange(3 * 4096, dtype=np.float32)
    path = tmp_path / "w.bin"
    data.tofile(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    whole = np.asarray(np.memmap(path, dtype=np.uint8, mode="r", offset=64, shape=(4096 * 4,))).view(np.float32)
    arr = whole.reshape(64, 64)  # a view of a view of the map, 64 bytes into the file
    got = private_map(arr, 64)
    assert got is not None and got.shape == (64, 64) and got.dtype == np.float32 and got.flags.writeable
    assert got.ctypes.data != arr.ctypes.data and got.ctypes.data % 64 == 0
    np.testing.assert_array_equal(got, data[16:16 + 4096].reshape(64, 64))
    got[:] = -1.0  # a write lands in this process's pages, never in the file
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    np.testing.assert_array_equal(arr, data[16:16 + 4096].reshape(64, 64))
    assert private_map(whole[1:], 64) is None  # 4 bytes off a 64-byte boundary
    assert private_map(whole[1:]) is not None  # no alignment asked for
    assert private_map(arr[:, ::2], 64) is None  # not contiguous
    assert private_map(np.memmap(path, dtype=np.float32, mode="c"), 64) is None  # writable: the caller's own
