"""A weights file that changes on disk after ``Weights.open`` read its header is never read through the old header:
its tensors' offsets belong to the old version, so a read would give the new bytes at the old places (half one file,
half another; or garbage, once the layout moved). ``FileChanged`` says so, and opening the file again reads the new
version."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sdrt.errors import FileChanged, WeightsError
from sdrt.weights import Weights, stfile
from sdrt.weights.store import file_stamp


def _file(path, value: float, n: int = 4):
    stfile.write(path, {"a": np.full((n,), value, np.float32), "b": np.arange(3, dtype=np.float32)})
    return path


def test_a_file_written_over_in_place_is_refused_then_read_again(tmp_path) -> None:
    p = _file(tmp_path / "w.safetensors", 1.0)
    w = Weights.open(p)
    assert w["a"].tolist() == [1.0] * 4
    data = _file(tmp_path / "new.safetensors", 2.0).read_bytes()
    with open(p, "r+b") as f:  # the same inode and size, new values at the same offsets
        f.write(data)
    with pytest.raises(FileChanged, match="w.safetensors changed on disk since it was opened") as exc:
        w["a"]
    assert isinstance(exc.value, WeightsError) and "open the file again" in str(exc.value)
    assert Weights.open(p)["a"].tolist() == [2.0] * 4


def test_a_file_renamed_over_with_another_layout_is_refused(tmp_path) -> None:
    p = _file(tmp_path / "w.safetensors", 1.0)
    w = Weights.open(p)
    os.replace(_file(tmp_path / "new.safetensors", 3.0, n=40), p)
    with pytest.raises(FileChanged, match=r"is \d+ bytes now, \d+ when opened"):
        w["b"]
    p.unlink()
    with pytest.raises(FileChanged, match="is gone"):
        w["b"]


def test_the_stamp_tells_versions_apart_and_an_unchanged_file_reads(tmp_path) -> None:
    p = _file(tmp_path / "w.safetensors", 1.0)
    before = file_stamp(p)
    assert file_stamp(p) == before and Weights.open(p)["b"].tolist() == [0.0, 1.0, 2.0]
    os.utime(p, ns=(before[1] + 1, before[1] + 1))
    assert file_stamp(p) != before and file_stamp(tmp_path / "none") is None
