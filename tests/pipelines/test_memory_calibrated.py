"""The memory budget on a calibrated CPU: each part's need and what it keeps loaded come from the cost model
(``sdrt.cost.footprint``), not the fixed 2 x float32 weights; without a calibration of this CPU for the part's backend
and precision, the fixed footprint stands.

The calibration is one ``sdrt selftest --calibrate`` stored on an Intel Xeon with AMX (2 cores), captured as it was
written (tests/data/calibration/spr-amx.json); the tests that need it as this CPU's rename its device to this CPU, so
the plan's arithmetic is checked on any machine (the figures' truth on that CPU is docs/plan.md's check)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pipeline_helpers import DATA, register

from sdrt.cost.devices import this_cpu
from sdrt.cost.footprint import calibrated_here, part_footprint
from sdrt.cost.model import factors_for, load_calibration, predict
from sdrt.cost.nodes import graph_costs
from sdrt.graph import Graph
from sdrt.pipelines import load
from sdrt.pipelines.budget import available_memory, memory_source, plan_memory

CAPTURED = Path(__file__).parents[1] / "data" / "calibration" / "spr-amx.json"
W = {"text_encoder": 1000, "unet": 4000, "vae_decoder": 500}
SHAPES = {"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _store(cache: Path, *, here: bool = True) -> dict:
    """The captured calibration stored as this process reads it, as if measured on this CPU (``here``) or on another."""
    data = json.loads(CAPTURED.read_text())
    data["device"]["name"] = this_cpu().name if here else "this CPU (another machine's, 64 cores)"
    (cache / "calibration").mkdir(parents=True)
    (cache / "calibration" / "calibration.json").write_text(json.dumps(data))
    return data


# ---------------------------------------------------------------------------- the plan's arithmetic
def test_parts_that_keep_less_than_their_peak_stay_loaded():
    """Peaks 1200 / 5000 / 1000 do not fit 7000 side by side, but what the parts keep once loaded (500 / 4000 / 300)
    plus the largest part's excess over what it keeps does: every part stays, and each phase is counted so."""
    fp = {"text_encoder": 1.2, "unet": 1.25, "vae_decoder": 2.0}
    keeps = {"text_encoder": 500, "unet": 4000, "vae_decoder": 300}
    fixed = plan_memory(W, "unet", 7100, base=100, footprints=fp)
    assert fixed.placement("unet").placement == "released"  # 1200 + 5000 + 1000 > 7000
    plan = plan_memory(W, "unet", 7100, base=100, footprints=fp, keeps=keeps)
    assert {p.placement for p in plan.parts} == {"resident"} and plan.fits
    held = sum(keeps.values())
    assert plan.placement("unet").peak_bytes == 100 + held + 1000  # its 5000 less the 4000 it keeps
    assert plan.placement("vae_decoder").peak_bytes == 100 + held + 700
    assert plan.peak_bytes == 100 + held + 1000 and plan.keeps == keeps
    # a keep above the need is capped at it (a part never holds more than its peak)
    over = plan_memory(W, "unet", None, footprints=fp, keeps={"unet": 9000})
    assert over.keeps["unet"] == 5000 and over.placement("unet").peak_bytes == 1200 + 5000 + 1000


def test_without_keeps_the_plan_is_as_before():
    for budget in (12000, 9000):  # all resident; the smaller parts resident while the UNet runs
        a = plan_memory(W, "unet", budget, base=100)
        b = plan_memory(W, "unet", budget, base=100, keeps={})
        assert [(p.placement, p.peak_bytes) for p in a.parts] == [(p.placement, p.peak_bytes) for p in b.parts]
    a = plan_memory(W, "unet", 12000, base=100)
    assert a.peak_bytes == 100 + 2 * 5500


def test_a_cpu_budget_is_what_the_os_has_even_where_the_device_reports_the_ram():
    """ggml's CPU device reports the machine's memory: the plan's budget is still what the OS has available."""

    class Cpu:
        kind, memory_bytes = "cpu", 1 << 50  # more than any machine here has available

    budget = available_memory(Cpu())
    assert budget is not None and budget < 1 << 50 and memory_source(Cpu(), budget).endswith("available")

    class Gpu:
        kind, memory_bytes = "gpu", 8 << 30

    assert available_memory(Gpu()) == 8 << 30 and memory_source(Gpu(), 8 << 30) == "reported by the device"


# ---------------------------------------------------------------------------- the cost model's figures
def _unet() -> Graph:
    return Graph.load(DATA / "tiny-sd15" / "unet" / "model.onnx", load_external=False).with_shapes(SHAPES)


def test_a_part_is_costed_only_where_this_cpu_was_calibrated(cache):
    g = _unet()
    assert part_footprint(g, SHAPES, "openvino", "fp32") is None  # nothing stored
    _store(cache, here=False)
    assert not calibrated_here("openvino", "fp32")  # measured on another CPU: not this one's figures
    assert part_footprint(g, SHAPES, "openvino", "fp32") is None


def test_a_calibrated_part_takes_the_cost_models_peak_and_resident_bytes(cache):
    _store(cache)
    g = _unet()
    cal = load_calibration()
    for backend, precision in [("openvino", "fp32"), ("openvino", "bf16"), ("ggml", "bf16")]:
        assert calibrated_here(backend, precision, cal)
        got = part_footprint(g, SHAPES, backend, precision, cal)
        f = factors_for(backend, this_cpu(), precision, cal)
        pr = predict(graph_costs(g, None, precision, inferred=True), this_cpu(), backend, precision, f, pinned=True)
        assert got is not None and got.source == f"{backend} {precision}"
        assert got.peak_bytes == pytest.approx(pr.peak_bytes - f.base_bytes)
        assert got.resident_bytes == pytest.approx(pr.resident_bytes) and got.base_bytes == f.base_bytes
    assert part_footprint(g, SHAPES, "openvino", "fp16", cal) is None  # a precision not measured


@pytest.mark.parametrize("calibrated", [False, True])
def test_the_pipelines_plan_reads_the_calibration(cache, calibrated):
    """A job's plan on OpenVINO's CPU: the calibrated parts come from the cost model (and say so), the rest keep the
    fixed footprint; with nothing calibrated every part keeps it."""
    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    register("openvino")
    if calibrated:
        _store(cache)
    folder = cache.parent / "tiny-sd15"
    shutil.copytree(DATA / "tiny-sd15", folder)
    with load(folder, backend="openvino", precision="fp32") as pipe:
        plan = pipe.plan("a red fox", width=64, height=64, steps=1).memory
        assert plan is not None
        called = {"text_encoder", "unet", "vae_decoder"}
        if not calibrated:
            assert plan.calibrated == {} and plan.keeps == {} and "cost model" not in plan.format()
            assert not pipe._plan_calibrated(*_selected(pipe))
            return
        assert set(plan.calibrated) == called and set(plan.calibrated.values()) == {"openvino fp32"}
        assert set(plan.keeps) == called and "the cost model calibrated on this CPU" in plan.format()
        assert pipe._plan_calibrated(*_selected(pipe))
        unet = plan.placement("unet")
        assert unet.activation_bytes == 0  # counted in the cost model's peak
        assert plan.base_bytes >= factors_for("openvino", this_cpu(), "fp32").base_bytes


def _selected(pipe):
    from sdrt.runtime import select

    return select(pipe.backend, pipe.device)


def test_sdrt_plan_takes_the_pipelines_budget_on_this_cpu():
    """``sdrt plan`` on this machine's CPU plans against what a pipeline here would (what the OS has available, at most
    the RAM); a library CPU keeps the library rule (70% of shared memory)."""
    from dataclasses import replace

    from sdrt.cost.planner import budget_for
    from sdrt.pipelines.budget import cpu_budget

    cpu = this_cpu()
    here = budget_for(cpu, None)
    assert 0 < here <= cpu.memory_bytes
    assert abs(here - cpu_budget(int(cpu.memory_bytes))) < 512 * 2**20  # read twice: what the OS has moves a little
    library = replace(cpu, source="a library entry", shared_memory=True)
    assert budget_for(library, None) == pytest.approx(0.7 * cpu.memory_bytes)
    assert budget_for(cpu, 2**30) == 2**30  # asked: as asked
