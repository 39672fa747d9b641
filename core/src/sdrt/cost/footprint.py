"""A pipeline part's memory as the calibrated cost model predicts it: what it adds to the process while it compiles
and runs, and what it keeps once compiled (``sdrt.pipelines.budget`` places the parts with these where this CPU
was calibrated for the part's backend and precision, instead of its fixed ``FOOTPRINT`` x float32 weights)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .devices import this_cpu
from .model import calibrated_precisions, factors_for, load_calibration, predict
from .nodes import graph_costs

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph

log = logging.getLogger("sdrt.cost")


@dataclass(frozen=True)
class PartFootprint:
    """Bytes over the calibrated runtime base (``base_bytes``: the interpreter, sdrt and the backend's libraries)."""

    #: the part's peak while it compiles or runs (the larger phase), the pin of its shapes included
    peak_bytes: float
    #: what it holds once compiled, between its calls (its weights as the runtime keeps them, its nodes)
    resident_bytes: float
    base_bytes: float
    #: ``"openvino bf16"``: the calibration it came from
    source: str


def calibrated_here(backend: str, precision: str, calibration: dict[str, Any] | None = None) -> bool:
    """Whether ``sdrt selftest --calibrate`` measured ``backend`` at ``precision`` on this machine's CPU (the stored
    calibration names the CPU it ran on: one made on another, a cache folder carried over, does not count)."""
    cal = calibration if calibration is not None else load_calibration()
    cpu = this_cpu()
    measured_on = (cal.get("device") or {}).get("name")
    return (precision in calibrated_precisions(backend, "cpu", cal) and measured_on == cpu.name
            and factors_for(backend, cpu, precision, cal).calibrated)


def part_footprint(graph: Graph, shapes: dict[str, tuple[int, ...]], backend: str, precision: str,
                   calibration: dict[str, Any] | None = None) -> PartFootprint | None:
    """``graph`` (pinned to ``shapes`` already: ``Graph.with_shapes``) on this CPU through ``backend`` at ``precision``;
    None where ``sdrt selftest --calibrate`` did not measure that backend at that precision here, or where the graph
    cannot be costed (the caller keeps its fixed footprint then)."""
    cal = calibration if calibration is not None else load_calibration()
    if not calibrated_here(backend, precision, cal):
        return None
    cpu = this_cpu()
    f = factors_for(backend, cpu, precision, cal)
    try:
        standard = graph.without_contrib_ops()  # onnxruntime's contrib ops costed as the standard ops backends run
        pinned = standard if standard is graph else standard.with_shapes(dict(shapes))
        pr = predict(graph_costs(pinned, None, precision, inferred=True), cpu, backend, precision, f, pinned=True)
    except Exception as exc:  # noqa: BLE001 - an estimate: the fixed footprint then
        log.debug("memory: no calibrated footprint for %s: %s", graph.name, exc)
        return None
    return PartFootprint(max(pr.peak_bytes - f.base_bytes, 0.0), max(pr.resident_bytes, 0.0), f.base_bytes,
                         f"{backend} {precision}")
