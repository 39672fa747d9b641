"""Run sdrt on the model variants of ``gen_family_variants.py`` and compare each image with diffusers'.

    python scripts/check_family_variants.py ROOT [--only NAME ...] [--backends reference openvino ggml]
        [--exports sdrt optimum] [--json OUT.json] [--precision fp32]

ROOT holds one folder per variant (``gen_family_variants.py ROOT``), each with ``refs.json``/``refs.npz`` and
its exports: ``sdrt/`` (torch.onnx, as the test folders are made) and ``optimum/`` (``export_optimum.py``).
Every case runs with the case's seed, steps, size, batch, cfg, sampler and strength; the table gives the
largest difference in any uint8 value, the share of values that differ and the PSNR, or the one-line error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from sdrt import pipelines, plugins

PLUGINS = {"reference": ("sdrt_reference", "sdrt-reference"), "openvino": ("sdrt_openvino", "sdrt-openvino"),
           "ggml": ("sdrt_ggml", "sdrt-ggml")}


def register(name: str) -> None:
    module, dist = PLUGINS[name]
    reg = plugins.get_registry()
    if name not in reg.backends:
        reg.register_plugin(importlib.import_module(module), name, distribution=dist)


def kwargs(kind: str, case: dict, init: np.ndarray, mask: np.ndarray | None,
           control: np.ndarray | None = None) -> dict:
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              cfg=case["cfg"], sampler=case.get("sampler", "Euler"))
    if "max_sequence_length" in case:
        kw["max_sequence_length"] = case["max_sequence_length"]
    if "guidance" in case:
        kw["guidance"] = case["guidance"]
    if case["mode"] in ("img2img", "inpaint"):
        kw.update(init_image=init, strength=case["strength"])
        del kw["width"], kw["height"]
    if case["mode"] == "inpaint":
        kw["mask"] = mask
    if "scale" in case:  # a ControlNet case: the folder's controlnet/ on the case's control image
        image = control.transpose(1, 0, 2) if case.get("transpose") else control
        kw["controlnets"] = [("controlnet", np.ascontiguousarray(image), case["scale"], case["start"], case["end"])]
    return kw


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    if got.shape != want.shape:
        return dict(error=f"shape {got.shape} vs {want.shape}")
    d = np.abs(got.astype(np.int64) - want.astype(np.int64))
    mse = float((d.astype(np.float64) ** 2).mean())
    return dict(max=int(d.max()), share=float((d > 0).mean()),
                psnr=math.inf if mse == 0 else 10 * math.log10(255**2 / mse))


def line(row: dict) -> str:
    what = row.get("error") or f"max {row['max']}, {100 * row['share']:.3f}% differ, PSNR {row['psnr']:.1f} dB"
    return f"{row['variant']:15} {row['export']:8} {row['backend']:9} {row['case']:40} {what}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--backends", nargs="*", default=["reference", "openvino", "ggml"])
    ap.add_argument("--exports", nargs="*", default=["sdrt", "optimum"])
    ap.add_argument("--cases", nargs="*", help="case names to run (default: all)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--precision", default="fp32", help="SDRT_PRECISION for every part (diffusers ran float32)")
    args = ap.parse_args()
    os.environ["SDRT_PRECISION"] = args.precision
    rows = []
    for variant in sorted(p for p in args.root.iterdir() if (p / "refs.json").exists()):
        if args.only and variant.name not in args.only:
            continue
        meta = json.loads((variant / "refs.json").read_text())
        refs = np.load(variant / "refs.npz")
        for export in args.exports:
            folder = variant / export
            if not folder.exists():
                continue
            for backend in args.backends:
                register(backend)
                try:
                    pipe = pipelines.load(folder, backend=backend)
                except Exception as exc:  # noqa: BLE001  (reported in the table)
                    rows.append(dict(variant=variant.name, export=export, backend=backend, case="(load)",
                                     error=f"{type(exc).__name__}: {exc}"))
                    print(line(rows[-1]), flush=True)
                    continue
                for case in meta["cases"]:
                    if args.cases and case["name"] not in args.cases:
                        continue
                    row = dict(variant=variant.name, export=export, backend=backend, case=case["name"])
                    t0 = time.perf_counter()
                    try:
                        images = pipe(case["prompt"], case["negative_prompt"] or "",
                                      **kwargs(meta["kind"], case, refs["init_image"],
                                                 refs["mask"] if "mask" in refs else None,
                                                 refs["control"] if "control" in refs else None))
                        row.update(compare(np.stack(images), refs[f"{case['name']}/image"]))
                    except Exception as exc:  # noqa: BLE001
                        row["error"] = f"{type(exc).__name__}: {exc}"
                    row["s"] = round(time.perf_counter() - t0, 1)
                    rows.append(row)
                    print(line(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
