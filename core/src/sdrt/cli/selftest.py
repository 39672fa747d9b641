"""``sdrt selftest``: prove every installed backend on this machine, and write a report to share."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import printable

API_NAMES = {"backends": "--backend", "plugin_modules": "--plugin-module"}


#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("selftest", help="check every installed backend here: conformance, accuracy, speed, "
                                        "features, end to end; write a report to share")
    p.add_argument("--backend", action="append", default=[], help="test only this backend; repeatable")
    p.add_argument("--device", default=None, help="test only this device id (as `sdrt info` lists it)")
    p.add_argument("--quick", action="store_true", help="a short check (under a minute) for after `sdrt install`")
    p.add_argument("--only", action="append", default=[], metavar="GROUP",
                   help="run only this check group (conformance, accuracy, speed, features, end-to-end); repeatable")
    p.add_argument("--report", metavar="FILE.json", help="write the JSON report here, and FILE.md beside it")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a backend that takes longer than this (default: 300 quick, 3600 full)")
    p.add_argument("--plugin-module", action="append", default=[], metavar="MODULE",
                   help="also register this importable module as a plugin (test a backend before packaging it)")
    p.add_argument("--calibrate", action="store_true",
                   help="instead of the checks: time the calibration cases on each installed backend here, at fp32 and, "
                        "where this CPU has bf16 dot products (AVX-512-BF16 or AMX), at bf16 too, and store the cost "
                        "model's factors (used by `sdrt plan` and backend=\"auto\"); the report carries them. With "
                        "--device naming a GPU of the device library: on that GPU, at fp32 and its default precision, "
                        "its memory the GPU's own")
    p.add_argument("--passes", type=int, default=None,
                   help="with --calibrate: passes over all the calibration cases, the faster of each case's kept "
                        "(default 2; 1 halves the time on a machine with no other work)")
    p.add_argument("--repeats", type=int, default=None,
                   help="with --calibrate: timed runs per calibration case and pass (the median of each 3 runs' best "
                        "is kept; of two passes over all the cases, the faster; default 9)")
    return p


def _calibrate(args: argparse.Namespace) -> int:
    from ..cost import calibrate
    from ..cost.devices import for_runtime, this_cpu
    from ..cost.model import save_calibration
    from ..errors import SdrtError
    from ..plugins import get_registry
    from ..runtime import select

    reg = get_registry()
    names = args.backend or sorted(reg.backends)
    unknown = [n for n in names if n not in reg.backends]
    if unknown:  # as without --calibrate
        from ..selftest.runner import not_installed

        raise not_installed(unknown, sorted(reg.backends))
    cpu = this_cpu()
    entries: dict[str, dict[str, Any]] = {}  # by device name: "backend/kind/precision" -> factors
    specs: dict[str, Any] = {}
    measured = {}
    reasons: list[SdrtError] = []
    for name in names:
        try:
            be, dev = select(name, args.device)
            if dev.kind != "cpu" and not args.device:
                raise SdrtError(f"its device here is {dev.id} ({dev.name}), a {dev.kind}",
                                fix=f"pass --device {dev.id} to calibrate it there")
            if dev.kind != "cpu" and be.memory_in_use(dev) is None:
                raise SdrtError(f"the {name} backend cannot tell how much of {dev.id}'s memory is in use",
                                where="--device", fix="calibrate another backend on it, or its CPU")
            spec = cpu if dev.kind == "cpu" else for_runtime(dev)  # a GPU's peak rates come from the library
        except SdrtError as exc:
            print(f"{name}: not calibrated: {exc}", file=sys.stderr)
            reasons.append(exc)
            continue
        if name == "reference":
            continue
        mine = entries.setdefault(spec.name, {})
        specs[spec.name] = spec
        for prec, passes in _precisions(be, dev):
            factors, rows = calibrate.calibrate(name, device=spec, repeats=args.repeats, precision=prec,
                                                passes=args.passes or passes,
                                                progress=lambda m: print(m, file=sys.stderr) if sys.stderr.isatty() else None,
                                                reference=mine.get(f"{name}/{dev.kind}/fp32"),
                                                device_id=None if dev.kind == "cpu" else dev.id)
            mine[f"{name}/{dev.kind}/{prec}"] = factors
            measured[calibrate.report_key(name, dev.kind, prec)] = rows
            _summary(name, dev.id, prec, factors)
    if not any(entries.values()):
        from ..errors import NoDeviceError

        if len(reasons) == 1 and not isinstance(reasons[0], NoDeviceError):
            raise reasons[0]  # the one backend's own reason (a GPU the device library lacks, say)
        raise SdrtError("nothing calibrated: " + (f"no installed backend has device {args.device!r}" if args.device else
                                                  "no installed backend could be calibrated here"),
                        where="--device" if args.device else "--backend",
                        fix="pass a device id that `sdrt info` lists (the lines above say each backend's)"
                        if args.device else "see the lines above for each backend")
    for dev_name, found in entries.items():
        path = save_calibration(found, specs[dev_name].to_dict())
    print(printable(f"stored in {path}"))
    if args.report:
        from ..selftest.report import assemble, write

        report = assemble([], [], quick=True)
        report["mode"] = "calibrate"
        report["passed"] = True  # it ran no checks: a calibration that stored its factors succeeded
        report["calibration_measurements"] = measured
        out, md = write(report, args.report)
        print(printable(f"wrote {out} and {md}"))
    return 0


#: passes over the calibration cases at bf16, as at fp32: the faster of two is kept. One pass (half the added time)
#: was tried: on a machine with other work it measured ggml's bf16 matmuls at half its fp32 speed, and the bf16
#: check fell from 30/38 rows in time to 7/38 (docs/plan.md)
BF16_PASSES = 2


def _precisions(be: Any, dev: Any = None) -> list[tuple[str, int]]:
    """(precision, passes) to calibrate ``be`` at: fp32, and on a CPU bf16 where it has bf16 dot products
    (AVX-512-BF16 or AMX: sdrt's default precision here, ``sdrt.precision_default``) and the backend runs bf16; on
    another device the backend's default precision there (fp16 on a GPU) where it is not fp32."""
    from ..precision_default import cpu_bf16_fast

    out = [("fp32", 2)]
    if dev is not None and dev.kind != "cpu":
        default = be.precision_for(dev)
        return out + ([(default, BF16_PASSES)] if default != "fp32" and default in getattr(be, "precisions", {})
                      else [])
    if cpu_bf16_fast() and "bf16" in getattr(be, "precisions", {}):
        out.append(("bf16", BF16_PASSES))
    return out


def _summary(name: str, dev_id: str, prec: str, factors: Any) -> None:
    from ..selftest.report import efficiency_text

    eff = ", ".join(f"{k} {efficiency_text(v)}" for k, v in factors.efficiency.items())
    node_us = 1e6 * max((v for k, v in factors.overhead_s.items() if k != "int"), default=0.0)  # the costliest class
    print(f"{name} on {dev_id} ({prec}): FLOPs efficiency {eff}; {1e6 * factors.call_s:.0f} us per call, {node_us:.1f} us"
          f" per node; traffic at {factors.bandwidth_bytes_per_s / 1e9:.1f} GB/s x activations"
          f" {factors.bandwidth_efficiency:.2f}, data {factors.data_bandwidth_efficiency:.2f}, weights"
          f" {factors.weight_bandwidth_efficiency or 0:.2f} (3x3 conv kernels"
          f" {factors.conv_weight_bandwidth_efficiency or 0:.2f}, per further image"
          f" {factors.conv_weight_batch_bandwidth_efficiency or 0:.2f}"
          + (f", past the last-level cache again x {factors.stream_weight_bandwidth_efficiency:.2f}"
             if factors.stream_weight_bandwidth_efficiency is not None else "")
          + f"), epilogues {factors.fused_bandwidth_efficiency:.2f};"
          f" memory = {factors.weight_factor:.2f} x weights ({factors.conv_weight_factor or 0:.2f} x conv kernels)"
          f" + {factors.activation_factor:.2f} x activations + {factors.node_bytes / 1e3:.0f} kB per node"
          f" + {factors.base_bytes / 2**20:.0f} MiB"
          + (f" running, {factors.compile_weight_factor:.2f} x weights ({factors.compile_conv_weight_factor:.2f} x"
             f" conv kernels) + {factors.transient_conv_factor:.2f} x the largest kernel compiling"
             if factors.compile_weight_factor is not None else "")
          + f"; pinning shapes first {factors.pin_bytes / 2**20:.0f} MiB")


class _Bar:
    """One status line on stderr, redrawn in place; only on a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.count = 0

    def __call__(self, target: str, event: str) -> None:
        if not self.enabled:
            return
        if event == "done":
            sys.stderr.write("\r\033[K")
        else:
            self.count += 1
            spin = "|/-\\"[self.count % 4]
            sys.stderr.write(f"\r\033[K{spin} {target}: {event}")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from ..errors import SdrtError
    from ..selftest import render_text
    from ..selftest import run as selftest
    from ..selftest.report import write

    if args.report and not args.report.lower().endswith(".json"):
        raise SdrtError(f"the report file must end in .json, got {args.report!r}", where="sdrt selftest --report",
                        fix="pass a name like report.json (the Markdown goes beside it as report.md)")
    if args.report:
        _check_folder(args.report)
    if args.repeats is not None and not args.calibrate:
        raise SdrtError("--repeats sets the timed runs of --calibrate, and does nothing without it",
                        where="sdrt selftest --repeats", fix="add --calibrate, or drop --repeats")
    if args.passes is not None and not args.calibrate:
        raise SdrtError("--passes sets the passes of --calibrate, and does nothing without it",
                        where="sdrt selftest --passes", fix="add --calibrate, or drop --passes")
    if args.passes is not None and args.passes < 1:
        raise SdrtError(f"--passes must be at least 1, got {args.passes}", where="sdrt selftest --passes",
                        fix="pass --passes 1 or 2")
    if args.repeats is not None and args.repeats < 1:
        raise SdrtError(f"--repeats must be at least 1, got {args.repeats}", where="sdrt selftest --repeats",
                        fix="pass e.g. --repeats 7")
    if args.timeout is not None and not args.timeout > 0:
        raise SdrtError(f"--timeout must be above 0 seconds, got {args.timeout:g}", where="sdrt selftest --timeout",
                        fix="pass e.g. --timeout 600, or drop it for the default (300 s with --quick, 3600 s without)")
    if args.calibrate:
        if args.repeats is None:
            args.repeats = 9
        return _calibrate(args)
    report = selftest(args.backend or None, args.device, quick=args.quick, only=args.only, timeout=args.timeout,
                      plugin_modules=args.plugin_module, progress=_Bar())
    print(render_text(report))
    if args.report:
        out, md = write(report, args.report)
        print("\n" + printable(f"wrote {out} and {md}: paste the .md into an issue, or attach the .json"))
    if not report["backends"]:
        print("no backend could be tested: install a plugin (`sdrt install`)", file=sys.stderr)
    return 0 if report["passed"] else 1


def _check_folder(path: str) -> None:
    """Fail before the (long) run when the report could not be written."""
    import os

    from ..errors import SdrtError
    from ..pipelines.png import output_target

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SdrtError(f"cannot write the report into {folder!r}: it is not a writable folder",
                        where="sdrt selftest --report", fix="create the folder first, or pass another path")
    for target in (path, os.path.splitext(path)[0] + ".md"):  # a folder, device or read-only file: refused now
        output_target(target, "report", ".json")
