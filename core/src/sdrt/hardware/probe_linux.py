"""Linux (and WSL2) probes: sysfs, procfs, nvidia-smi, rocminfo. Data out, no decisions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import parse
from .pcidb import KNOWN_NPUS, PCI_IDS_PATHS
from .probe import Context

PCI_DEVICES = "sys/bus/pci/devices"
CPU_DEVICES = "sys/devices/system/cpu"
KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
WSL_NVIDIA_SMI = "usr/lib/wsl/lib/nvidia-smi"


def gather(ctx: Context) -> dict[str, Any]:
    """Everything the Linux assembler needs, read under ``ctx.root``."""
    raw: dict[str, Any] = {}
    raw["cpuinfo"] = ctx.read("proc/cpuinfo")
    raw["caches"] = ctx.guard("cpu caches", lambda: _caches(ctx)) or []
    version = ctx.read("proc/version") or ""
    raw["wsl"] = "microsoft" in version.lower() or ctx.path(WSL_NVIDIA_SMI).exists()
    raw["pci"], raw["pci_source"] = ctx.guard("sysfs pci", lambda: _pci(ctx)) or ([], "none")
    raw["vram"] = ctx.guard("amdgpu vram", lambda: _amdgpu_vram(ctx, raw["pci"])) or {}
    raw["driver_versions"] = ctx.guard("driver versions", lambda: _driver_versions(ctx, raw["pci"])) or {}
    raw["kfd"] = ctx.guard("kfd topology", lambda: _kfd(ctx)) or []
    vendors = {r.vendor_id for r in raw["pci"] if parse.is_accelerator_class(r.class_code)}
    raw["nvidia_smi"] = _nvidia_smi(ctx, wsl=raw["wsl"]) if "10de" in vendors or raw["wsl"] else []
    raw["rocminfo"] = _rocminfo(ctx) if "1002" in vendors else []
    raw["pci_ids"] = None
    if raw["pci"]:
        for rel in PCI_IDS_PATHS:
            text = ctx.read(rel)
            if text:
                raw["pci_ids"] = text
                break
    return raw


def _caches(ctx: Context) -> list[dict[str, str]]:
    """The cache levels from sysfs (``level``, ``type``, ``size``, ``shared_cpu_list`` of each index): every index of
    the first CPU, and of the others only those at its highest data or unified level (which instance each CPU shares),
    so a 256-thread server reads one index a CPU, not four."""
    base = ctx.path(CPU_DEVICES)
    cpus = sorted(base.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])) if base.is_dir() else []
    if not cpus:
        return []

    def read(index: Path) -> dict[str, str]:
        return {k: (ctx.read(index / k) or "").strip() for k in ("level", "type", "size", "shared_cpu_list")}

    first = {i.name: read(i) for i in sorted((cpus[0] / "cache").glob("index[0-9]*"))}
    data = {n: r for n, r in first.items() if r["level"].isdigit() and r["size"] and r["type"].lower() != "instruction"}
    top = max((int(r["level"]) for r in data.values()), default=None)
    last = [n for n, r in data.items() if int(r["level"]) == top]
    out = list(data.values())
    for cpu in cpus[1:]:
        out += [r for r in (read(cpu / "cache" / n) for n in last) if r["level"] and r["size"]]
    return out


def _pci(ctx: Context) -> tuple[list[parse.PciRecord], str]:
    base = ctx.path(PCI_DEVICES)
    if not base.is_dir():
        out = ctx.cmd("lspci", ["lspci", "-nnk"])
        records = [r for r in parse.parse_lspci_nn(out or "")
                   if parse.is_accelerator_class(r.class_code) or (r.vendor_id, r.device_id) in KNOWN_NPUS]
        return (records, "lspci") if out else ([], "none")
    records = []
    for dev in sorted(base.iterdir()):
        cls = parse.parse_class(ctx.read(dev / "class"))
        vendor = parse.parse_hex_id(ctx.read(dev / "vendor"))
        device = parse.parse_hex_id(ctx.read(dev / "device"))
        if cls is None or not vendor or not device:
            continue
        if not parse.is_accelerator_class(cls) and (vendor, device) not in KNOWN_NPUS:
            continue
        driver = None
        if (dev / "driver").is_symlink():
            driver = os.path.basename(os.readlink(dev / "driver"))
        records.append(parse.PciRecord(slot=dev.name.lower(), class_code=cls, vendor_id=vendor,
                                       device_id=device, driver=driver))
    return records, "sysfs"


def _amdgpu_vram(ctx: Context, records: list[parse.PciRecord]) -> dict[str, int]:
    out = {}
    for r in records:
        text = ctx.read(f"{PCI_DEVICES}/{r.slot}/mem_info_vram_total")
        if text and text.strip().isdigit():
            out[r.slot] = int(text.strip())
    return out


def _driver_versions(ctx: Context, records: list[parse.PciRecord]) -> dict[str, str]:
    out = {}
    for driver in {r.driver for r in records if r.driver}:
        text = ctx.read(f"sys/module/{driver}/version")
        if text and text.strip():
            out[driver] = text.strip()
    return out


def _kfd(ctx: Context) -> list[dict[str, int]]:
    base = ctx.path(KFD_NODES)
    if not base.is_dir():
        return []
    nodes = []
    for node in sorted(base.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        text = ctx.read(node / "properties")
        if text:
            props = parse.parse_kfd_properties(text)
            if props.get("gfx_target_version"):
                nodes.append(props)
    return nodes


def _nvidia_smi(ctx: Context, wsl: bool) -> list[dict[str, Any]]:
    exe = str(ctx.path(WSL_NVIDIA_SMI)) if wsl and ctx.path(WSL_NVIDIA_SMI).exists() else "nvidia-smi"
    return nvidia_smi(ctx, exe)


def nvidia_smi(ctx: Context, exe: str = "nvidia-smi") -> list[dict[str, Any]]:
    """Query every NVIDIA GPU; drivers older than 510 lack ``compute_cap``, so retry without it."""
    for name, fields in (("nvidia-smi", parse.NVSMI_FIELDS), ("nvidia-smi-old", parse.NVSMI_FIELDS_OLD)):
        notes = len(ctx.notes)
        out = ctx.cmd(name, [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
        if out is not None:
            if name == "nvidia-smi-old":
                del ctx.notes[notes - 1:notes]        # the first try failing was expected
            return parse.parse_nvidia_smi(out, fields)
        if len(ctx.notes) == notes or "compute_cap" not in ctx.notes[-1]:
            return []                                 # not installed, or broken beyond the field list
    return []


def _rocminfo(ctx: Context) -> list[dict[str, Any]]:
    exe = "rocminfo" if not ctx.path("opt/rocm/bin/rocminfo").exists() else str(ctx.path("opt/rocm/bin/rocminfo"))
    out = ctx.cmd("rocminfo", [exe])
    return parse.parse_rocminfo(out) if out else []
