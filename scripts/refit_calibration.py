"""Refit a stored calibration with this code: the measurements of ``sdrt selftest --calibrate --report R.json``
(``calibration_measurements``) with each case's costs recomputed (``sdrt.cost.calibrate.case_row``), fitted as the
calibration fits them (fp32 first, then bf16 with fp32 as its reference) and stored in sdrt's cache
(``SDRT_CACHE_DIR``), where ``sdrt plan`` and ``scripts/check_plan_predictions.py`` read them. Nothing is timed:
a change to the model or the fit is tried on measurements already taken.

    python scripts/refit_calibration.py R.json [--backend openvino]
    python scripts/refit_calibration.py GPU-R.json --device "H200 SXM 141GB"   # a report of --calibrate --device CUDA0

A report's measurement keys: ``backend`` and ``backend/precision`` for this CPU, ``backend/kind`` and
``backend/kind/precision`` for another device (``gpu``), which ``--device`` names in the device library.
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
    ap.add_argument("--device", default=None, help="the library device a GPU report's measurements were taken on")
    args = ap.parse_args(argv)
    from sdrt.cost.calibrate import (
        case_activation_scale,
        case_cost,
        case_row,
        fit_precision,
        float32_tail,
        measured_args,
        parse_report_key,
    )
    from sdrt.cost.devices import find, this_cpu
    from sdrt.cost.model import Factors, copies_heads, save_calibration

    data = json.loads(args.report.read_text())
    measured = data["calibration_measurements"]
    entries = (data.get("calibration") or {}).get("entries", {})
    specs = {"cpu": this_cpu()}
    out: dict[str, dict[str, Factors]] = {}
    keys = sorted(measured, key=lambda k: parse_report_key(k)[2] != "fp32")  # fp32 before the half precisions
    with tempfile.TemporaryDirectory(prefix="sdrt-refit-") as tmp:
        for key in keys:
            backend, kind, precision = parse_report_key(key)
            if args.backend and backend not in args.backend:
                continue
            if kind not in specs:
                if not args.device:
                    sys.exit(f"error: {key} was measured on a {kind}: name it with --device (a library device)")
                specs[kind] = find(args.device)
            dev = specs[kind]
            mine = out.setdefault(kind, {})
            stored = entries.get(f"{backend}/{kind}/{precision}") or {}
            bw = stored.get("bandwidth_bytes_per_s") or dev.bandwidth_bytes_per_s
            scale = case_activation_scale(backend, precision)
            plain = int(stored.get("plain_conv_pixels", 0))  # as the backend routed the measured cases
            # the cache the cases were measured beside (a report from before it was recorded: none, no stream term)
            cache = ((data.get("calibration") or {}).get("device") or {}).get("cache_bytes", 0)
            rows = []
            for r in measured[key]:
                _name, _path, _feeds, cost = case_cost(r["case"].removeprefix("cal_"), Path(tmp), precision,
                                                       r.get("count"), measured_args(r))  # as it was measured
                pinned = r.get("pinned", bool(cost.dynamic) and not r.get("dynamic"))
                rows.append(case_row(r["case"], cost, r, peak=dev.peak(precision), bandwidth=bw, pinned=pinned,
                                     scale=scale, tail=float32_tail(backend, precision), transfers=kind != "cpu",
                                     dense_heads=copies_heads(backend, kind), plain_pixels=plain,
                                     cache_bytes=int(cache) if kind == "cpu" else 0))
            mine[f"{backend}/{kind}/{precision}"] = fit_precision(rows, bw, backend, precision, dev,
                                                                   mine.get(f"{backend}/{kind}/fp32"), plain_pixels=plain)
            print(f"refitted {backend}/{kind}/{precision} from {len(rows)} cases", file=sys.stderr)
    for kind, found in out.items():
        path = save_calibration(found, specs[kind].to_dict())
        print(f"stored in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
