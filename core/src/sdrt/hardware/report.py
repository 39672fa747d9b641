"""The hardware section of ``sdrt info`` and the "install this" hint; never raises."""

from __future__ import annotations

import importlib.metadata as md
import logging
from typing import Any

from .model import Hardware, Recommendation

log = logging.getLogger("sdrt.hardware")


def installed_version(distribution: str) -> str | None:
    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def install_command(rec: Recommendation, hw: Hardware) -> str:
    """The exact command that installs the recommended plugin into this environment."""
    from ..install import plan

    return plan(rec.plugin, build=rec.build, hw=hw).command


def summary(hw: Hardware | None = None) -> dict[str, Any]:
    """Detected hardware + recommendation + install state, as JSON-friendly data."""
    try:
        from . import detect, recommend

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


_hinted = False


def missing_plugin_hint(loaded: set[str]) -> str | None:
    """A warning line when the recommended plugin is not among ``loaded`` (plugin/backend names), else None.

    Cheap after the first call: ``detect()`` is cached. Never raises.
    """
    try:
        from . import detect, recommend

        hw = detect()
        rec = recommend(hw)
        if rec.plugin in loaded:
            return None
        uses = "; ".join(d.describe() for d in rec.devices) or ("the CPU" if rec.uses_cpu else "this machine")
        return (f"this machine has hardware that no installed sdrt plugin uses: {uses}. "
                f"The {rec.plugin} plugin drives it ({rec.reason}). Install it with: "
                f"{install_command(rec, hw)}  (or: sdrt install)")
    except Exception as exc:  # noqa: BLE001
        log.debug("no plugin hint: %r", exc)
        return None


def warn_missing_plugin(loaded: set[str]) -> None:
    """Log ``missing_plugin_hint`` once per process (``sdrt.load(backend="auto")`` calls this)."""
    global _hinted
    if _hinted:
        return
    _hinted = True
    hint = missing_plugin_hint(loaded)
    if hint:
        log.warning("%s", hint)
