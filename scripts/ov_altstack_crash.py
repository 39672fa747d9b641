"""OpenVINO alone: two ``openvino.Core`` objects that die in the order they were made leave the main thread on an
unmapped alternate signal stack, and the next signal Python handles kills the process with SIGSEGV.

    /work/venv/bin/python scripts/ov_altstack_crash.py        # exits 139 (SIGSEGV) on OpenVINO 2026.4.1
    /work/venv/bin/python scripts/ov_altstack_crash.py nested # the second Core dies first: prints "survived"

OpenVINO's CPU plugin installs an alternate signal stack (``sigaltstack``, 11568 bytes here) on the thread that
compiles through a Core, unmaps it when that Core dies, and puts back the stack that was in place when it
installed its own. Core 1 installs S1 (saving Python's), Core 2 installs S2 (saving S1); Core 1 dies: S2 is
replaced by Python's; Core 2 dies: S1, unmapped, is put back. Python installs its signal handlers with
SA_ONSTACK (faulthandler's too), so the kernel cannot write the signal frame and kills the process, with no
traceback. sdrt_openvino keeps one Core for the process (``backend.shared_core``) so this order never arises.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys

import openvino as ov
from onnx import TensorProto, helper


class _Stack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def alt_stack(tag: str) -> None:
    s = _Stack()
    ctypes.CDLL(None).sigaltstack(None, ctypes.byref(s))
    addr = s.ss_sp or 0
    mapped = any(lo <= addr < hi for lo, hi in
                 ((int(a, 16), int(b, 16)) for a, b in (ln.split()[0].split("-") for ln in open("/proc/self/maps"))))
    state = "none" if not addr else "mapped" if mapped else "UNMAPPED"
    print(f"{tag}: alternate signal stack {addr:#x} ({s.ss_size} bytes), {state}", flush=True)


def main() -> None:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()

    def compiled(core: ov.Core) -> object:
        return core.compile_model(core.read_model(model, b""), "CPU")

    alt_stack("start")
    c1 = ov.Core()
    k1 = compiled(c1)
    c2 = ov.Core()
    k2 = compiled(c2)
    alt_stack("two Cores")
    if sys.argv[1:] == ["nested"]:
        del k2, c2
        gc.collect()
        del k1, c1
    else:
        del k1, c1
        gc.collect()
        del k2, c2
    gc.collect()
    alt_stack("both gone")
    signal.signal(signal.SIGINT, lambda *_: print("SIGINT handled", flush=True))
    os.kill(os.getpid(), signal.SIGINT)
    print("survived", flush=True)


if __name__ == "__main__":
    main()
