"""bf16 on a CPU with bf16 dot products: calibrated beside fp32 by `sdrt selftest --calibrate`, then planned from its
own factors; without a bf16 calibration the planner keeps fp32 (no timed runs here)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdrt.cost import devices
from sdrt.cost.model import Factors, calibrated_precisions, factors_for, load_calibration, save_calibration
from sdrt.cost.planner import precisions_for


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))


def _cpu(isa: tuple[str, ...], detected: bool = True) -> devices.DeviceSpec:
    """This machine's CPU as detection describes it, with the ISA given (bf16 at 2 x fp32 with AVX-512-BF16)."""
    cpu = devices.this_cpu()
    peaks = {"fp32": 1e11} | ({"bf16": 2e11} if "avx512_bf16" in isa or "amx_bf16" in isa else {})
    return replace(cpu, isa=isa, peak_flops=peaks,
                   source=cpu.source if detected else "a library entry")


def _factors(tag: str) -> Factors:
    return Factors({"matmul": 0.5}, {"matmul": 0.0}, calibrated=True, source=tag)


def test_bf16_is_planned_where_it_was_calibrated():
    bf16_cpu = _cpu(("avx512f", "avx512_bf16"))
    assert "bf16" not in precisions_for("openvino", bf16_cpu)  # fp32 only calibrated (or nothing): fp32
    save_calibration({"openvino/cpu/fp32": _factors("fp32"), "openvino/cpu/bf16": _factors("bf16"),
                      "ggml/cpu/fp32": _factors("ggml fp32")}, bf16_cpu.to_dict())
    cal = load_calibration()
    assert calibrated_precisions("openvino", "cpu", cal) == {"fp32", "bf16"}
    assert calibrated_precisions("ggml", "cpu", cal) == {"fp32"}
    assert precisions_for("openvino", bf16_cpu, cal) == ["fp32", "bf16"]
    assert "bf16" not in precisions_for("ggml", bf16_cpu, cal)  # not measured at bf16: not planned at it
    # the bf16 plan takes the bf16 factors, fp32 keeps its own
    assert factors_for("openvino", bf16_cpu, "bf16", cal).source == "bf16"
    assert factors_for("openvino", bf16_cpu, "fp32", cal).source == "fp32"
    # a library CPU (not this machine) is not described by this machine's calibration; a CPU without bf16 units
    # (no bf16 rate) is not planned at bf16 whatever is stored
    assert "bf16" not in precisions_for("openvino", _cpu(("avx512f", "avx512_bf16"), detected=False), cal)
    assert "bf16" not in precisions_for("openvino", _cpu(("avx2", "fma")), cal)


def test_amx_plans_bf16_without_a_calibration():
    assert "bf16" in precisions_for("openvino", _cpu(("avx512f", "amx_bf16")), {"entries": {}})


@pytest.mark.parametrize("flags, offered, want", [
    ({"avx512f", "avx512_bf16"}, {"fp32": {}, "bf16": {}}, [("fp32", 2), ("bf16", 2)]),
    ({"amx_bf16"}, {"fp32": {}, "bf16": {}}, [("fp32", 2), ("bf16", 2)]),
    ({"avx2", "fma"}, {"fp32": {}, "bf16": {}}, [("fp32", 2)]),   # bf16 emulated: not sdrt's default, not measured
    ({"avx512f", "avx512_bf16"}, {"fp32": {}}, [("fp32", 2)]),    # a backend without bf16
])
def test_selftest_calibrates_bf16_where_the_cpu_has_it(monkeypatch, flags, offered, want):
    from sdrt import precision_default
    from sdrt.cli import selftest

    monkeypatch.setattr(precision_default, "cpu_flags", lambda: frozenset(flags))

    class Backend:
        precisions = offered

    assert selftest._precisions(Backend()) == want
