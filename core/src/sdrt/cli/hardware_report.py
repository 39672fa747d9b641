"""The hardware section of ``sdrt info``, with the command that installs the recommended plugin; never raises.

It lives with the CLI, above the installer and the hardware probes: ``sdrt.load`` never probes hardware.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
from typing import Any

from ..hardware import Hardware, Recommendation

log = logging.getLogger("sdrt.hardware")


def installed_version(distribution: str) -> str | None:
    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def install_command(rec: Recommendation, hw: Hardware) -> str:
    """The exact command that installs the recommended plugin into this environment."""
    from ..installer import plan

    return plan(rec.plugin, build=rec.build, hw=hw).command


def summary(hw: Hardware | None = None) -> dict[str, Any]:
    """Detected hardware + recommendation + install state, as JSON-friendly data."""
    try:
        from ..hardware import detect, recommend

        hw = hw or detect()
        rec = recommend(hw)
        installed = installed_version(rec.distribution)
        return {
            "hardware": dict(hw.to_dict(), described=[d.describe() for d in hw.devices]),
            "recommendation": rec.to_dict(),
            "installed": installed,
            # the command that installs (or, for another build, reinstalls) the recommended plugin
            "install_command": install_command(rec, hw),
        }
    except Exception as exc:  # noqa: BLE001 - `sdrt info` must work even when detection breaks
        log.warning("hardware detection failed: %r", exc, exc_info=True)
        return {"error": repr(exc)}


def render(info: dict[str, Any]) -> list[str]:
    if "error" in info:
        return ["hardware:", f"  detection failed: {info['error']}"]
    hw, rec = info["hardware"], info["recommendation"]
    cpu = hw["cpu"]
    counts = f"{cpu['cores'] or '?'} cores / {cpu['threads'] or '?'} threads"
    lines = ["hardware:", f"  os: {hw['os']} {hw['arch']}" + (" (WSL2)" if hw["wsl"] else ""),
             f"  cpu: {cpu['model']} ({cpu['vendor']}, {cpu['arch']}, {counts})",
             f"  cpu features: {', '.join(cpu['isa']) or 'none of AVX2/AVX-512/AMX/NEON'}"]
    if not hw["devices"]:
        lines.append("  gpu/npu: none found")
    for dev, text in zip(hw["devices"], hw["described"]):
        lines.append(f"  {dev['kind']}: {text}")
    for note in hw["notes"]:
        lines.append(f"  note: {note}")
    label = rec["distribution"] + (f", {rec['build']} build" if rec["build"] else "")
    lines += ["", f"recommended plugin: {rec['plugin']} ({label})", f"  why: {rec['reason']}",
              f"  uses: {'; '.join(rec['devices']) or 'nothing'}"]
    for p in rec["passed_over"]:
        lines.append(f"  passed over: {p['device']}: {p['why']}")
    if info["installed"]:
        lines.append(f"  installed: {rec['distribution']} {info['installed']}")
        if rec["build"]:
            lines.append(f"  for the {rec['build']} build, reinstall with: {info['install_command']}")
    else:
        lines += ["  not installed; install it with:", f"    {info['install_command']}", "    (or: sdrt install)"]
    return lines
