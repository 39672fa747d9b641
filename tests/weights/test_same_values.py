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
