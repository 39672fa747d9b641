"""Refit a stored calibration with this code: the measurements of ``sdrt selftest --calibrate --report R.json``
(``calibration_measurements``) with each case's costs recomputed (``sdrt.cost.calibrate.case_row``), fitted as the
calibration fits them (fp32 first, then bf16 with fp32 as its reference) and stored in sdrt's cache
(``SDRT_CACHE_DIR``), where ``sdrt plan`` and ``scripts/check_plan_predictions.py`` read them. Nothing is timed:
a change to the model or the fit is tried on measurements already taken.

    python scripts/refit_calibration.py R.json [--backend openvino]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("report", type=Path)
    ap.add_argument("--backend", action="append", default=[])
    args = ap.parse_args(argv)
    from sdrt.cost.calibrate import case_activation_scale, case_cost, case_row, fit_precision, float32_tail
    from sdrt.cost.devices import this_cpu
    from sdrt.cost.model import Factors, save_calibration

    data = json.loads(args.report.read_text())
    measured = data["calibration_measurements"]
    entries = (data.get("calibration") or {}).get("entries", {})
    cpu = this_cpu()
    out: dict[str, Factors] = {}
    keys = sorted(measured, key=lambda k: "/" in k)  # fp32 (plain backend names) before bf16
    with tempfile.TemporaryDirectory(prefix="sdrt-refit-") as tmp:
        for key in keys:
            backend, precision = (key.split("/") + ["fp32"])[:2]
            if args.backend and backend not in args.backend:
                continue
            stored = entries.get(f"{backend}/cpu/{precision}") or {}
            bw = stored.get("bandwidth_bytes_per_s") or cpu.bandwidth_bytes_per_s
            scale = case_activation_scale(backend, precision)
            rows = []
            for r in measured[key]:
                _name, _path, _feeds, cost = case_cost(r["case"].removeprefix("cal_"), Path(tmp), precision)
                pinned = r.get("pinned", bool(cost.dynamic) and not r.get("dynamic"))
                rows.append(case_row(r["case"], cost, r, peak=cpu.peak(precision), bandwidth=bw, pinned=pinned,
                                     scale=scale, tail=float32_tail(backend, precision)))
            out[f"{backend}/cpu/{precision}"] = fit_precision(rows, bw, backend, precision, cpu,
                                                              out.get(f"{backend}/cpu/fp32"))
            print(f"refitted {backend}/cpu/{precision} from {len(rows)} cases", file=sys.stderr)
    path = save_calibration(out, cpu.to_dict())
    print(f"stored in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
