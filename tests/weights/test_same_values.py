"""``sdrt.weights.same_values``: how backends tell a weight passed again unchanged from a new one."""

import numpy as np

from sdrt.weights import same_values


def test_same_values():
    a = np.arange(1000, dtype=np.float32)
    assert same_values(a, a) and same_values(a, a.copy())
    assert not same_values(None, a)
    b = a.copy()
    b[-1] += 1  # past the leading values it checks first
    assert not same_values(a, b)
    assert not same_values(a, a.astype(np.float16))  # same values, other dtype
    assert not same_values(a, a.reshape(10, 100))


def test_one_region_of_one_file_mapped_twice_is_the_same_without_a_compare(tmp_path, monkeypatch):
    """Two read-only maps of the same bytes of one file (a pipeline rebinding a part whose weights another
    ``Weights`` mapped again) are the same values: the pages are not read (np.array_equal is not reached). A
    copy-on-write map that was written to, another offset, or another file is compared as before."""
    path = tmp_path / "w.bin"
    data = np.arange(4096, dtype=np.float32)
    path.write_bytes(np.concatenate([data, data]).tobytes())

    def region(offset: int, mode: str = "r") -> np.ndarray:
        return np.memmap(path, dtype=np.uint8, mode=mode, offset=offset, shape=(data.nbytes,)).view(np.float32)

    other = tmp_path / "v.bin"
    other.write_bytes(data.tobytes())
    compared = []
    real = np.array_equal
    monkeypatch.setattr(np, "array_equal", lambda a, b: compared.append(1) or real(a, b))
    assert same_values(region(0), region(0).reshape(-1)) and not compared
    assert same_values(region(0), region(data.nbytes)) and compared  # equal bytes elsewhere: compared
    compared.clear()
    assert same_values(region(0), np.memmap(other, dtype=np.float32, mode="r")) and compared
    written = region(0, "c")
    written[-1] = -1.0  # a private copy of the page now
    assert not same_values(region(0), written)
