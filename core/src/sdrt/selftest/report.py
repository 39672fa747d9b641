"""The self-test report: JSON for merging many users' reports, text for the terminal, Markdown for issues.

``SCHEMA`` versions the JSON layout. The report holds the machine (OS, CPU,
GPUs with driver and memory, from ``sdrt.hardware``), the versions of sdrt,
each plugin and its vendor runtime, every check's figures, and errors with
their messages; it holds nothing personal: user and host names are replaced,
and paths under the home folder are shortened to ``~``.
"""

from __future__ import annotations

import datetime
import getpass
import os
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any

#: the JSON layout's version; bump the major when a field changes meaning
SCHEMA = "sdrt-selftest/1"

#: an absolute path that no placeholder covered (POSIX or Windows); only its last part is kept
_ABSOLUTE = re.compile(r"(?<![\w<>.~])(?:[A-Za-z]:\\|/)(?:[^\s'\"/\\:,;()]+[/\\])+[^\s'\"/\\:,;()]*")


def _places() -> list[tuple[str, str]]:
    """Folders a report may name, each by a placeholder: sdrt's cache, the Python environment, home."""
    out: list[tuple[str, str]] = []
    try:
        from ..cache import cache_root

        out.append((str(cache_root()), "<sdrt-cache>"))
    except Exception:  # noqa: BLE001
        pass
    out += [(sys.prefix, "<python-env>"), (sys.base_prefix, "<python>"), (os.getcwd(), "<cwd>")]
    out.append((str(Path(__file__).resolve().parents[2]), "<sdrt-src>"))
    home = str(Path.home())
    if len(home) > 1:
        out.append((home, "~"))
    return [(p, r) for p, r in out if len(p) > 1]


def _personal() -> list[tuple[str, str]]:
    """(text, replacement) pairs for what identifies the user, longest first."""
    pairs = _places()
    for value, repl in ((_safe(getpass.getuser), "<user>"), (_safe(socket.gethostname), "<host>")):
        if value and len(value) >= 3:
            pairs.append((value, repl))
    return sorted(pairs, key=lambda p: -len(p[0]))


def _safe(fn: Any) -> str:
    try:
        return str(fn())
    except Exception:  # noqa: BLE001 - no user name in a container is fine
        return ""


def scrub(value: Any, pairs: list[tuple[str, str]] | None = None) -> Any:
    """``value`` with every user name, host name and home path replaced, recursively."""
    pairs = _personal() if pairs is None else pairs
    if isinstance(value, str):
        for text, repl in pairs:
            value = value.replace(text, repl)
        return _ABSOLUTE.sub(lambda m: "<path>/" + re.split(r"[\\/]", m.group(0))[-1], value)
    if isinstance(value, dict):
        return {k: scrub(v, pairs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, pairs) for v in value]
    return value


def machine() -> dict[str, Any]:
    """OS, Python, CPU and accelerators as ``sdrt.hardware`` sees them."""
    info: dict[str, Any] = {"os": platform.system(), "os_release": platform.release(),
                            "arch": platform.machine(), "python": platform.python_version()}
    try:
        from .. import hardware

        hw = hardware.detect().to_dict()
        info.update(cpu=hw.get("cpu"), accelerators=hw.get("devices", []), wsl=hw.get("wsl"),
                    notes=hw.get("notes", []))
    except Exception as exc:  # noqa: BLE001 - the report is still useful without it
        info["hardware_error"] = repr(exc)
    return info


def assemble(results: list[dict[str, Any]], unavailable: list[dict[str, str]], *, quick: bool) -> dict[str, Any]:
    from .. import __version__

    report = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sdrt": __version__,
        "mode": "quick" if quick else "full",
        "machine": machine(),
        "backends": results,
        "unavailable": unavailable,
        "passed": bool(results) and all(r["status"] == "passed" for r in results),
        "command": " ".join(["sdrt", "selftest", *sys.argv[2:]]) if sys.argv[1:2] == ["selftest"] else None,
        "calibration": _calibration(),
    }
    return scrub(report)


def _calibration() -> dict[str, Any]:
    """The cost model's factors fitted here (``sdrt selftest --calibrate``), so that reports from users'
    machines can grow the device library; empty when this machine was never calibrated."""
    from ..cost.model import load_calibration

    return load_calibration()


def write(report: dict[str, Any], path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``path`` (JSON) and the Markdown beside it (``.md``), atomically; return both paths."""
    import json

    from ..pipelines.png import write_file

    out = Path(path)
    md = out.with_suffix(".md")
    for target, text in ((out, json.dumps(report, indent=2) + "\n"), (md, render_markdown(report))):
        write_file(target, text.encode("utf-8"))  # never over a folder, a device or a read-only file
    return out, md


# -- rendering ------------------------------------------------------------------
def _figure(check: dict[str, Any]) -> str:
    f = check.get("figures") or {}
    group = check["group"]
    if group == "conformance" and "totals" in f:
        t = f["totals"]
        unsupported = (f"{t['unsupported']} unsupported (ONNX ops or attribute values this backend does not "
                       "implement: a model that uses one is refused up front with an error naming it, never run "
                       "wrong; not failures), " if t.get("unsupported") else "")  # reports since issue 18
        return f"{t['passed']} passed, {t['failed']} failed, {unsupported}{t['skipped']} skipped, {t['xfail']} xfail"
    if group == "accuracy" and "rel_err" in f:
        return f"rel err {f['rel_err']:.1e} (limit {f['tolerance']:.0e}, vs {f['against']})"
    if group == "speed" and "median_ms" in f:
        text = f"{f['median_ms']:.1f} ms"
        if "onnxruntime_ms" in f:
            text += f", onnxruntime {f['onnxruntime_ms']:.1f} ms, speedup {f['speedup']:.2f}x"
        return text
    if "cold_s" in f:
        return f"cold {f['cold_s']:.2f} s, second {f['second_s']:.2f} s"
    if "update_s" in f:
        return f"{f['update_s'] * 1e3:.1f} ms, rel err {f['rel_err']:.1e}"
    if "mean_abs_diff" in f:
        return f"{f['seconds']:.1f} s, mean pixel diff {f['mean_abs_diff']:.2f} to reference"
    if "seconds" in f:
        return f"{f['seconds']:.2f} s" + (f", {f['bytes'] / 2**20:.1f} MiB" if "bytes" in f else "")
    return ""


def _machine_line(m: dict[str, Any]) -> str:
    cpu = m.get("cpu") or {}
    accel = ", ".join(f"{a.get('name') or a.get('vendor')}" + (f" (driver {a['driver']})" if a.get("driver") else "")
                      for a in m.get("accelerators") or []) or "no GPU/NPU found"
    return f"{m['os']} {m['os_release']} {m['arch']}, Python {m['python']}; CPU {cpu.get('model', '?')}; {accel}"


def render_text(report: dict[str, Any]) -> str:
    lines = [f"sdrt {report['sdrt']} self-test ({report['mode']}), {report['created']}",
             f"machine: {_machine_line(report['machine'])}", ""]
    for b in report["backends"]:
        runtime = ", ".join(f"{k} {v}" for k, v in (b.get("runtime") or {}).items())
        lines.append(f"{b['backend']} on {b['device']} ({b.get('device_name') or b['kind']}): {b['status'].upper()}"
                     + (f"  [{runtime}]" if runtime else ""))
        for c in b["checks"]:
            mark = {"passed": "ok", "info": "--", "unsupported": "n/a", "skipped": "skip"}.get(c["status"], "FAIL")
            detail = _figure(c) or c.get("message", "")
            if c["status"] in ("failed", "error") and c.get("message"):
                detail = f"{detail}; {c['message']}" if _figure(c) else c["message"]
            lines.append(f"  {mark:>4}  {c['group']}: {c['name']}  {detail}".rstrip())
        for e in b["errors"]:
            lines.append(f"  FAIL  {e}")
        lines.append("")
    for u in report["unavailable"]:
        lines.append(f"{u['backend']}: not tested: {u['reason']}")
    verdict = "all checks passed" if report["passed"] else "some checks FAILED"
    lines += ["" if report["unavailable"] else "", f"result: {verdict}"]
    return "\n".join(lines).replace("\n\n\n", "\n\n")


def efficiency_text(value: float) -> str:
    """A fitted efficiency as the report shows it: a term the fit found free (stored as 100, ``calibrate._inv``) is
    "free", not an efficiency of 100x the peak; a small one keeps three significant figures."""
    if value >= 100.0:
        return "free"
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3g}"


def _calibration_lines(report: dict[str, Any]) -> list[str]:
    """What a ``--calibrate`` report fitted: the device and, per backend/kind/precision, its FLOPs efficiencies
    and the cases measured (the full factors are in the JSON's ``calibration``)."""
    cal = report.get("calibration") or {}
    dev = cal.get("device") or {}
    peaks = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in (dev.get("peak_flops") or {}).items())
    lines = [f"- device: {dev.get('name', '?')} ({dev.get('derived') or dev.get('source', '')}; peak {peaks})", "",
             "| backend/kind/precision | cases | FLOPs efficiency (of the peak; free: the fit charges it no time) |", "|---|---|---|"]
    measured = report.get("calibration_measurements") or {}
    from ..cost.calibrate import report_key

    for key, f in (cal.get("entries") or {}).items():
        parts = key.split("/")
        rows = (measured.get(report_key(*parts)) or []) if len(parts) == 3 else []
        eff = ", ".join(f"{k} {efficiency_text(v)}" for k, v in (f.get("efficiency") or {}).items())
        lines.append(f"| {key} | {len(rows)} | {eff} |")
    return lines + [""]


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    calibrating = report["mode"] == "calibrate"
    verdict = "calibrated" if calibrating else "passed" if report["passed"] else "FAILED"
    lines = [f"### sdrt {report['sdrt']} self-test ({report['mode']})", "",
             f"- machine: {_machine_line(m)}", f"- created: {report['created']}",
             f"- result: **{verdict}**", ""]
    if calibrating:
        lines += _calibration_lines(report)
    for b in report["backends"]:
        runtime = ", ".join(f"{k} {v}" for k, v in (b.get("runtime") or {}).items()) or "-"
        plugin = b.get("plugin") or {}
        lines += [f"#### {b['backend']} on {b['device']} ({b.get('device_name') or b['kind']}): {b['status']}", "",
                  f"plugin {plugin.get('distribution') or plugin.get('name')} {plugin.get('version') or ''}, "
                  f"runtime: {runtime}", "",
                  "| group | check | status | figures |", "|---|---|---|---|"]
        for c in b["checks"]:
            detail = _figure(c)
            if c["status"] in ("failed", "error", "unsupported", "skipped") and c.get("message"):
                detail = f"{detail} {c['message']}".strip()
            lines.append(f"| {c['group']} | {c['name']} | {c['status']} | {detail.replace('|', '/')} |")
        for e in b["errors"]:
            lines.append(f"| process | - | {b['status']} | {e.replace('|', '/')} |")
        lines.append("")
    for u in report["unavailable"]:
        lines.append(f"- {u['backend']}: not tested: {u['reason']}")
    return "\n".join(lines).rstrip() + "\n"
