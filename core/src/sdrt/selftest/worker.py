"""The child process of ``sdrt selftest``: one backend and device per process.

``python -m sdrt.selftest.worker list [--backend B] [--device D]`` prints the
targets (backend, device, versions) as one JSON line, and the backends that
cannot run here with the reason.

``python -m sdrt.selftest.worker check --backend B --device D [--quick]``
runs the checks and streams one line per event on stdout, so the parent keeps
every result that came before a crash:

- ``@start NAME``: a check is starting (a crash after it is blamed on NAME);
- ``@check {json}``: one finished ``Check``.

``--plugin-module M`` imports module ``M`` and registers it as a plugin first,
so a backend can be self-tested before it is packaged (and the tests can
register a backend that crashes on purpose).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import sys
from typing import Any

from ..child import emit, event_channel, plugin_registry
from ..plugins import Registry


def _requirement_versions(distribution: str | None) -> dict[str, str]:
    """Versions of what a plugin distribution depends on (its vendor runtime), sdrt itself left out."""
    if not distribution:
        return {}
    out: dict[str, str] = {}
    try:
        requires = md.requires(distribution) or []
    except md.PackageNotFoundError:
        return {}
    for req in requires:
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0]
        if not name or name.lower().startswith("sdrt"):
            continue
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def list_targets(reg: Registry, backends: list[str] | None, device: str | None,
                 first_only: bool = False) -> dict[str, Any]:
    """Every (backend, device) to test; ``first_only`` keeps each backend's first device."""
    targets: list[dict[str, Any]] = []
    unavailable: list[dict[str, str]] = []
    seen: set[str] = set()  # device ids of the backends looked at, before ``device`` filters them
    for rec in sorted(reg.plugins.values(), key=lambda r: r.name):
        if not rec.ok:
            if not backends or rec.name in backends:
                unavailable.append({"backend": rec.name, "reason": f"plugin is {rec.state}: {rec.error}"})
            continue
        for name in rec.backends:
            if backends and name not in backends:
                continue
            be = reg.backends[name]
            try:
                devices = list(be.devices())
            except Exception as exc:  # noqa: BLE001 - reported, never fatal
                unavailable.append({"backend": name, "reason": f"devices() failed: {exc!r}"})
                continue
            seen.update(d.id for d in devices)
            if device is not None:
                devices = [d for d in devices if d.id.lower() == device.lower()]
            if not devices:
                why = f"no device {device!r}" if device else "no usable device here"
                unavailable.append({"backend": name, "reason": why})
            elif first_only:
                devices = devices[:1]
            for d in devices:
                targets.append({
                    "backend": name, "device": d.id, "device_name": d.name, "kind": d.kind,
                    "memory_bytes": d.memory_bytes,
                    "plugin": {"name": rec.name, "distribution": rec.distribution, "version": rec.version},
                    "runtime": _requirement_versions(rec.distribution),
                })
    for name in backends or []:
        if name not in reg.backends and name not in reg.plugins:
            unavailable.append({"backend": name, "reason": "not installed"})
    return {"targets": targets, "unavailable": unavailable, "installed": sorted(reg.backends),
            "devices": sorted(seen)}


def check(reg: Registry, backend: str, device: str, quick: bool, groups: tuple[str, ...] = ()) -> None:
    from ..runtime import device_of
    from .checks import Plan, run_checks

    be = reg.backends[backend]
    dev = device_of(be, device)
    channel = event_channel()
    run_checks(be, dev, Plan.make(quick, groups), emit=lambda c: emit(channel, "check", json.dumps(c.to_json())),
               announce=lambda name: emit(channel, "start", name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sdrt.selftest.worker")
    p.add_argument("action", choices=["list", "check"])
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--device")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", action="append", default=[], help="run only this check group; repeatable")
    p.add_argument("--plugin-module", action="append", default=[])
    p.add_argument("--first-device", action="store_true", help="list: only each backend's first device")
    args = p.parse_args(argv)
    reg = plugin_registry(args.plugin_module)
    if args.action == "list":
        print(json.dumps(list_targets(reg, args.backend or None, args.device, args.first_device)))
        return 0
    check(reg, args.backend[0], args.device, args.quick, tuple(args.only))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main())
