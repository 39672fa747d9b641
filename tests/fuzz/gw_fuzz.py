"""Mutation strategies for the ONNX and safetensors fuzz tests.

``SDRT_FUZZ_EXAMPLES`` sets how many examples each fuzz test runs (default
200, kept modest for the suite). A larger run:

    SDRT_FUZZ_EXAMPLES=5000 pytest tests/fuzz -q --hypothesis-show-statistics
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("SDRT_FUZZ_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 200,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

INTERESTING = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x08, 0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x3A, 0x42, 0x62, 0x7B, 0x5B]


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    """``seed`` with 1-8 random edits: bit flips, byte sets, inserts, deletes, truncation, duplication."""
    b = bytearray(seed)
    for _ in range(draw(st.integers(1, 8))):
        if not b:
            b += draw(st.binary(min_size=1, max_size=8))
        i = draw(st.integers(0, len(b) - 1))
        op = draw(st.sampled_from(["flip", "set", "interesting", "insert", "delete", "truncate", "dup"]))
        if op == "flip":
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            b[i] = draw(st.integers(0, 255))
        elif op == "interesting":
            b[i] = draw(st.sampled_from(INTERESTING))
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del b[i:i + draw(st.integers(1, 32))]
        elif op == "truncate":
            del b[i:]
        else:
            j = draw(st.integers(0, len(b) - 1))
            b[i:i] = b[j:j + draw(st.integers(1, 64))]
    return bytes(b)


def big_or_odd_ints() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-4, 64), st.sampled_from([2**31, 2**32 + 1, 2**40, 2**62, -(2**62)]))
