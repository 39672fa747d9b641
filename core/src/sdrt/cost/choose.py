"""``backend="auto"`` with a calibrated cost model: rank the candidate backends by predicted time."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .devices import this_cpu
from .model import calibrated_precisions, factors_for, is_calibrated, load_calibration, predict
from .nodes import GraphCost, NodeCost, graph_costs

if TYPE_CHECKING:  # pragma: no cover
    from ..backend import Backend, Device
    from ..graph import Graph

log = logging.getLogger("sdrt.cost")

#: an SD 1.5 UNet call (512x512, batch 2) by op class: (nodes, GFLOP, GB moved), from sdrt.cost.nodes
UNET_MIX = {"matmul": (184, 466.6, 1.76), "conv": (98, 887.9, 1.74), "attention": (96, 259.4, 12.0),
            "norm": (109, 1.3, 0.64), "elementwise": (571, 2.2, 6.08), "data": (401, 0.0, 1.74)}


def _mix_cost() -> GraphCost:
    nodes = []
    for cls, (count, gflop, gb) in UNET_MIX.items():
        nodes += [NodeCost(f"{cls}{i}", cls, cls, gflop * 1e9 / count, gb * 1e9 / count, 0.0, 0.0)
                  for i in range(count)]
    return GraphCost("an SD 1.5 UNet call", "fp32", nodes, 0.0, 0.0, 0.0)


def _graph_cost(graph: Graph | None, precision: str = "fp32") -> GraphCost:
    if graph is None:
        return _mix_cost()
    from .shapes import single_file_shapes

    try:
        return graph_costs(graph, single_file_shapes(graph, 512, 512) or None, precision)
    except Exception as exc:  # noqa: BLE001 - e.g. shapes only the caller knows: rank by the UNet mix
        log.debug("costing %s failed (%s); ranking by an SD UNet's op mix", graph.name, exc)
        return _mix_cost()


def by_prediction(candidates: list[tuple[Backend, Device]], graph: Graph | None) -> tuple[Backend, Device, str] | None:
    cal = load_calibration()
    usable = [(b, d) for b, d in candidates if d.kind == "cpu" and is_calibrated(b.name, "cpu", cal)]
    if len(usable) < 2:
        return None
    cpu = this_cpu()
    costs: dict[str, GraphCost] = {}  # by precision: the graph is costed once for each

    def ms(b: Backend, d: Device) -> float:  # at the precision the load will compile at, where it was calibrated
        prec = b.precision_for(d)
        prec = prec if prec in calibrated_precisions(b.name, "cpu", cal) else "fp32"
        if prec not in costs:
            costs[prec] = _graph_cost(graph, prec)
        return predict(costs[prec], cpu, b.name, prec, factors_for(b.name, cpu, prec, cal)).ms

    times = sorted(((ms(b, d), b, d) for b, d in usable), key=lambda t: t[0])
    best_ms, be, dev = times[0]
    others = ", ".join(f"{b.name} {ms:.1f} ms" for ms, b, _ in times[1:])
    fixed = candidates[0][0].name
    name = next(iter(costs.values())).name  # the graph's (or the UNet mix's), whatever the precision
    why = (f"the calibrated cost model predicts {best_ms:.1f} ms per call of {name} against {others}"
           + (f" (the fixed priority would pick {fixed})" if fixed != be.name else " (the fixed priority agrees)"))
    return be, dev, why
