"""What needs an RTX GPU: execution, refit, the runtime cache, the cache hit on a device, speed.

These run ``sdrt_trt.verify`` (what a user runs: ``python -m sdrt_trt.verify``) and skip here with the
reason; the parts of the check that need no GPU run here.
"""

from __future__ import annotations

import numpy as np
import pytest

from sdrt.graph import Graph
from sdrt.precision import to_half
from sdrt_trt import verify


def test_gpu_verify_all_checks(gpu) -> None:  # type: ignore[no-untyped-def]
    report = verify.run(gpu.id, "fp16", runs=5)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, failed
    assert {c["name"] for c in report["checks"]} == {"device", "run", "speed", "update_weights", "runtime cache",
                                                      "engine cache"}


def test_gpu_fp32_and_bf16(gpu) -> None:  # type: ignore[no-untyped-def]
    for precision in ["fp32"] + (["bf16"] if gpu.properties.get("bf16") else []):
        report = verify.run(gpu.id, precision, runs=1)
        assert all(c["ok"] for c in report["checks"]), report["checks"]


def test_gpu_conformance(gpu, trt_registry) -> None:  # type: ignore[no-untyped-def]
    from sdrt.testing import BackendTest

    summary = BackendTest("trt", gpu.id).include(r"test_(relu|add|matmul|conv|softmax)").run()
    totals = summary.totals()
    assert totals["passed"] > 0 and totals["failed"] == 0, summary.render()


def test_verify_model_is_valid_at_fp16_here() -> None:
    """The verify block against itself through to_half on onnxruntime: the check's own yardstick holds."""
    import onnxruntime as ort

    model, feeds = verify.block_model()
    want = verify._reference(model, feeds)
    half = to_half(Graph(model)).model
    got = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert 0 < verify._rel(want, got) < verify.RTOL["fp16"] / 10
    assert np.isfinite(got).all()


def test_verify_without_a_gpu_says_so(backend, capsys) -> None:  # type: ignore[no-untyped-def]
    if backend.devices():
        pytest.skip("this machine has a GPU")
    assert verify.main([]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL device: no usable device")
