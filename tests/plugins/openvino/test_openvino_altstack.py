"""OpenVINO's CPU plugin swaps the compiling thread's alternate signal stack per ``openvino.Core`` and puts the old
one back when that Core dies: two Cores that died in the order they were made left the thread on an unmapped
stack, and the next Ctrl-C (any signal Python handles on the alternate stack) killed the process with SIGSEGV,
no traceback. One pytest process over tests/pipelines, tests/serve and tests/core died so at its first Ctrl-C
test; a long ``sdrt serve`` could too. The backend keeps one Core for the process (``shared_core``)."""

from __future__ import annotations

import ctypes
import gc
import sys

import pytest
from ov_helpers import conv_model

import sdrt

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps (Linux)")


class _Stack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _alt_stack() -> tuple[int, int]:
    """(address, size) of this thread's alternate signal stack, (0, 0) for none."""
    s = _Stack()
    assert ctypes.CDLL(None).sigaltstack(None, ctypes.byref(s)) == 0
    return (s.ss_sp or 0, s.ss_size) if not s.ss_flags & 2 else (0, 0)  # SS_DISABLE


def _mapped(addr: int, size: int) -> bool:
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((lo, hi))
    return all(any(lo <= a < hi for lo, hi in spans) for a in (addr, addr + size - 1))


def test_backends_that_die_in_the_order_made_leave_a_mapped_alternate_signal_stack(ov_registry):
    from sdrt_openvino.backend import OpenVINOBackend

    graph = sdrt.Graph.load(conv_model().SerializeToString())
    first, second = OpenVINOBackend(), OpenVINOBackend()  # two registries' instances, as over a long process
    cpu = next(d for d in first.devices() if d.id == "CPU")
    a = first.compile(graph, None, cpu, cache=False)
    b = second.compile(graph, None, cpu, cache=False)
    a.close()
    del a, first
    gc.collect()
    b.close()
    del b, second
    gc.collect()
    addr, size = _alt_stack()
    # unmapped, the next signal handled on it (Python's SIGINT handler) kills the process with SIGSEGV
    assert not addr or _mapped(addr, size), f"this thread's alternate signal stack {addr:#x} is unmapped"
