"""The parent side of the self-test: one child process per backend and device.

A child that crashes (a C ``abort()``, a segfault) or hangs past its timeout is
recorded with the check it was running; the other backends still run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..args import one_or_many
from ..child import Child, check_plugin_modules, exit_text, tail
from ..errors import InputError, SdrtError
from .report import assemble

#: seconds one backend may take before it counts as hung
TIMEOUT = {"quick": 300.0, "full": 3600.0}

Progress = Callable[[str, str], None]
"""``progress(target, event)``: ``event`` is a check name as it starts, or ``"done"``."""


def _worker_cmd(action: str, backends: Sequence[str], device: str | None, plugin_modules: Sequence[str],
                quick: bool = False, only: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "sdrt.selftest.worker", action]
    for group in only:
        cmd += ["--only", group]
    for b in backends:
        cmd += ["--backend", b]
    if device:
        cmd += ["--device", device]
    for m in plugin_modules:
        cmd += ["--plugin-module", m]
    if quick:
        cmd.append("--quick")
    return cmd


def list_targets(backends: Sequence[str], device: str | None, plugin_modules: Sequence[str],
                 first_only: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """Ask a child which backends and devices there are (listing devices can crash too)."""
    cmd = _worker_cmd("list", backends, device, plugin_modules) + (["--first-device"] if first_only else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise SdrtError(f"listing backends and devices hung for {timeout:.0f} s", where="sdrt selftest",
                        fix="run `sdrt info` to find the plugin that hangs, and block it with "
                            "SDRT_DISABLE_PLUGINS") from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SdrtError(f"listing backends and devices failed ({exit_text(proc.returncode)}): "
                        f"{tail(proc.stderr, 3)}", where="sdrt selftest",
                        fix="run `sdrt info` to find the broken plugin, and block it with SDRT_DISABLE_PLUGINS")
    return json.loads(lines[-1])


def run_target(target: dict[str, Any], *, quick: bool, timeout: float, plugin_modules: Sequence[str],
               only: Sequence[str] = (), progress: Progress | None = None) -> dict[str, Any]:
    """Run the checks of one target in a child; return the target with its checks and status."""
    label = f"{target['backend']}:{target['device']}"
    cmd = _worker_cmd("check", [target["backend"]], target["device"], plugin_modules, quick, only)
    result = dict(target, checks=[], errors=[])
    current = "start-up"
    start = time.perf_counter()
    with Child(cmd, timeout=timeout) as child:
        for kind, payload in child.events():
            if kind == "start":
                current = payload.strip()
                if progress:
                    progress(label, current)
            elif kind == "check":
                result["checks"].append(json.loads(payload))
        code = child.wait()
    stderr = child.stderr_tail()
    result["seconds"] = round(time.perf_counter() - start, 3)
    if child.timed_out:
        result["status"] = "timeout"
        result["errors"].append(f"no answer after {timeout:.0f} s during check {current!r}; the process "
                                "was stopped")
    elif code != 0:
        result["status"] = "crashed"
        said = tail(stderr, 3)
        result["errors"].append(f"the process died ({exit_text(code)}) during check {current!r}"
                                + (f": {said}" if said else ""))
        result["stderr_tail"] = stderr
    else:
        bad = [c for c in result["checks"] if c["status"] in ("failed", "error")]
        result["status"] = "failed" if bad else "passed"
    if progress:
        progress(label, "done")
    return result


def not_installed(unknown: Sequence[str], installed: Sequence[str]) -> InputError:
    """The error for ``backends`` that name no installed backend (with and without ``--calibrate``)."""
    return InputError(f"no backend {' or '.join(map(repr, unknown))} is installed here", where="backends",
                      fix=f"pass one of: {', '.join(installed) or 'none (install a plugin: `sdrt install`)'}")


def run(backends: Sequence[str] | None = None, device: str | None = None, *, quick: bool = False,
        only: Sequence[str] = (), timeout: float | None = None, plugin_modules: Sequence[str] = (),
        progress: Progress | None = None) -> dict[str, Any]:
    """Self-test the installed backends (or ``backends``) on every device (or ``device``).

    ``quick`` runs shorter checks on each backend's first device (unless
    ``device`` names one); ``only`` limits the run to some check groups
    (``conformance``, ``accuracy``, ``speed``, ``features``, ``end-to-end``).
    Returns the report (see ``sdrt.selftest.report``): ``report["passed"]`` says
    whether every check of every backend passed.
    """
    from .checks import GROUPS

    # one name given as a string is one name, not its letters (backends="openvino": 'o', 'p', 'e', ...)
    backends, only, plugin_modules = (one_or_many(v, str) for v in (backends, only, plugin_modules))
    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        raise SdrtError(f"unknown check groups {unknown}", where="sdrt selftest --only",
                        fix=f"use some of: {', '.join(GROUPS)}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise InputError(f"{{@timeout=}}{timeout:g} is not a number of seconds above 0", where="timeout",
                         fix=f"pass {{@timeout=}}{TIMEOUT['quick' if quick else 'full']:.0f} (the default) or more")
    check_plugin_modules(plugin_modules, try_import=True)
    listing = list_targets(list(backends or []), device, plugin_modules, first_only=quick and device is None)
    installed = listing.get("installed", [])
    unknown = [u["backend"] for u in listing["unavailable"] if u["reason"] == "not installed"]
    if unknown:
        raise not_installed(unknown, installed)
    if device is not None and not listing["targets"] and listing.get("devices"):
        raise InputError(f"no device {device!r} among those of the backends tested", where="device",
                         fix=f"pass one of: {', '.join(listing['devices'])} (as `sdrt info` lists them)")
    limit = timeout or TIMEOUT["quick" if quick else "full"]
    results = [run_target(t, quick=quick, timeout=limit, plugin_modules=plugin_modules, only=only,
                          progress=progress) for t in listing["targets"]]
    return assemble(results, listing["unavailable"], quick=quick)
