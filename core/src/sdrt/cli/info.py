"""``sdrt info``: the core, each plugin with its devices and state, and broken plugins."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import __version__
from ..backend import API_VERSION
from ..plugins import get_registry

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("info", help="show the core, plugins, devices and hardware")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return p


def collect() -> dict[str, Any]:
    reg = get_registry()
    plugins = []
    for rec in sorted(reg.plugins.values(), key=lambda r: r.name):
        backends = []
        for name in rec.backends:
            be = reg.backends[name]
            defaults: dict[str, str] = {}
            try:
                found = be.devices()
                devices = [str(d) for d in found]
                dev_error = None
                for d in found:  # the precision compile uses when no precision= is passed
                    try:
                        defaults[str(d)] = be.precision_for(d)
                    except Exception:  # noqa: BLE001 - a plugin's broken override: leave it out
                        pass
            except Exception as exc:  # noqa: BLE001 - report, never crash info
                devices, dev_error = [], repr(exc)
            from ..quantization import describe

            backends.append({"name": name, "priority": be.priority, "devices": devices, "error": dev_error,
                             "default_precision": defaults, "precisions": sorted(be.precisions or {"fp32": {}}),
                             "quantized_weights": describe(be), "gguf_blocks": _gguf_blocks(be)})
        plugins.append({
            "name": rec.name, "distribution": rec.distribution, "version": rec.version,
            "state": rec.state, "error": rec.error, "backends": backends,
        })
    from .hardware_report import summary

    return {"sdrt": __version__, "plugin_api": ".".join(map(str, API_VERSION)), "plugins": plugins,
            "hardware": summary(), "environment": _environment()}


def _environment() -> dict[str, Any]:
    """The environment variables that change what sdrt does, as set here (a bad value with its error)."""
    import os

    from ..errors import SdrtError
    from ..precision_default import ENV, requested

    env: dict[str, Any] = {}
    if os.environ.get(ENV, "").strip():
        try:
            env[ENV] = {"value": os.environ[ENV], "precision": requested(), "error": None}
        except SdrtError as exc:
            env[ENV] = {"value": os.environ[ENV], "precision": None, "error": str(exc)}
    return env


def _gguf_blocks(be: Any) -> str:
    """What the backend does with a GGUF file's block-quantized tensors (``Backend.weight_blocks``)."""
    try:
        kept = sorted(be.weight_blocks())
    except Exception as exc:  # noqa: BLE001 - a plugin's broken override: report, never crash info
        return f"unknown ({type(exc).__name__}: {exc})"
    if not kept:
        return "dequantized to float32 at load"
    return (f"{', '.join(kept)} kept as stored for matmul weights (quantized mul_mat); other tensors dequantized "
            "to float32 at load")


def render(info: dict[str, Any]) -> str:
    lines = [f"sdrt {info['sdrt']} (plugin API {info['plugin_api']})", "", "plugins:"]
    if not info["plugins"]:
        lines.append("  (none installed)")
    for p in info["plugins"]:
        head = f"  {p['name']}"
        if p["distribution"]:
            head += f"  [{p['distribution']} {p['version'] or ''}]".rstrip()
        lines.append(f"{head}  {p['state']}")
        if p["error"]:
            lines.append(f"    error: {p['error']}")
        for b in p["backends"]:
            lines.append(f"    backend {b['name']} (priority {b['priority']})")
            if b.get("precisions"):
                lines.append(f"      precisions: {', '.join(b['precisions'])}")
            if b.get("quantized_weights"):
                lines.append(f"      quantized weights: {b['quantized_weights']}")
            if b.get("gguf_blocks"):
                lines.append(f"      GGUF block types: {b['gguf_blocks']}")
            if b["error"]:
                lines.append(f"      devices: error {b['error']}")
            for d in b["devices"]:
                precision = b.get("default_precision", {}).get(d)
                lines.append(f"      device {d}" + (f"  default precision {precision}" if precision else ""))
            if not b["devices"] and not b["error"]:
                lines.append("      devices: none usable here")
    for name, var in info.get("environment", {}).items():
        lines += ["", f"{name}={var['value']}: " + (f"error: {var['error']}" if var["error"] else
                                                     f"{var['precision']} wherever a backend offers it")]
    if "hardware" in info:
        from .hardware_report import render as render_hardware

        lines += [""] + render_hardware(info["hardware"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    info = collect()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0
