"""Pure assembly: what the probes gathered -> ``Hardware``. No I/O except the PCI name lookup."""

from __future__ import annotations

import re
from typing import Any

from . import families, parse, pcidb
from .model import AMD, APPLE, CPU, INTEL, NVIDIA, OTHER, PCI_VENDORS, QUALCOMM, Accelerator, Hardware

_MAC_VENDORS = {"apple": (APPLE, "106b"), "amd": (AMD, "1002"), "ati": (AMD, "1002"), "intel": (INTEL, "8086"),
                "nvidia": (NVIDIA, "10de")}
#: Windows adapters that are not hardware accelerators
_WIN_SKIP = re.compile(r"basic display|basic render|remote display|parsec|virtual display|citrix|vmware svga",
                       re.IGNORECASE)


def vendor_key(vendor_id: str | None) -> str:
    if vendor_id == "qcom":
        return QUALCOMM
    return PCI_VENDORS.get(vendor_id or "", OTHER)


def describe_pci(vendor_id: str, device_id: str, kind: str, entry: pcidb.DbEntry | None,
                 fallback_name: str | None = None, slot: str | None = None) -> Accelerator:
    """One accelerator from its PCI ids and its database entry: name, chip, architecture, integrated."""
    vendor = vendor_key(vendor_id)
    if entry is not None and entry.market:
        name = entry.market
    elif fallback_name:
        name = families.split_db_name(fallback_name)[1] or fallback_name
    else:
        name = f"{vendor.upper() if vendor != OTHER else 'unknown'} {kind.upper()} [{vendor_id}:{device_id}]"
    dev = Accelerator(kind=kind, vendor=vendor, name=with_vendor(vendor, name), vendor_id=vendor_id,
                      device_id=device_id,
                      chip=entry.chip if entry else None, bus_id=slot)
    raw_name = entry.raw if entry else (fallback_name or "")
    if kind == "npu":
        dev.integrated = True
        dev.architecture = name if vendor == INTEL else None
        return dev
    if vendor == NVIDIA:
        dev.architecture, dev.compute_capability = families.nvidia_arch(dev.chip)
        dev.integrated = False
    elif vendor == AMD:
        dev.gfx_target = families.amd_gfx(dev.chip, entry.apu_gfx if entry else None)
        dev.architecture = families.amd_family(dev.gfx_target)
        if entry is not None and entry.discrete is not None:
            dev.integrated = not entry.discrete
    elif vendor == INTEL:
        dev.architecture = families.intel_generation(raw_name)
        dev.integrated = _not(families.intel_is_discrete(dev.chip, raw_name))
        if dev.integrated is None and slot:
            dev.integrated = slot.split(":")[1] == "00"     # Intel iGPUs sit on the root bus (00:02.0)
    return dev


_VENDOR_LABEL = {NVIDIA: "NVIDIA", AMD: "AMD", INTEL: "Intel", QUALCOMM: "Qualcomm"}


def with_vendor(vendor: str, name: str) -> str:
    """"GeForce RTX 4090" -> "NVIDIA GeForce RTX 4090": database names leave the maker out."""
    label = _VENDOR_LABEL.get(vendor)
    if not label or name.lower().startswith(label.lower()) or name.startswith(("ATI ", "Advanced Micro")):
        return name
    return f"{label} {name}"


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def _set_nvidia(dev: Accelerator, row: dict[str, Any]) -> None:
    dev.name = row.get("name") or dev.name
    dev.vram_bytes = row.get("vram_bytes", dev.vram_bytes)
    dev.driver_version = row.get("driver_version", dev.driver_version)
    dev.architecture, dev.compute_capability = families.nvidia_arch(dev.chip, row.get("compute_capability"))
    dev.source = "+".join(filter(None, (dev.source, "nvidia-smi")))


# -- Linux -------------------------------------------------------------------

def linux(raw: dict[str, Any], arch: str) -> Hardware:
    hw = Hardware(os="Linux", arch=arch, wsl=bool(raw.get("wsl")))
    hw.cpu = parse.parse_cpuinfo(raw["cpuinfo"], arch) if raw.get("cpuinfo") else CPU(arch=arch)
    hw.cpu.cache_bytes = parse.last_level_cache(raw.get("caches") or [])
    records: list[parse.PciRecord] = raw.get("pci") or []
    ids = {(r.vendor_id, r.device_id) for r in records}
    ids |= {(g["vendor_id"], g["device_id"]) for g in raw.get("nvidia_smi", []) if g.get("device_id")}
    db = pcidb.lookup(ids, raw.get("pci_ids"))
    by_slot: dict[str, Accelerator] = {}
    for r in records:
        kind = parse.is_accelerator_class(r.class_code) or "npu"
        entry = db.get((r.vendor_id, r.device_id))
        if kind == "npu" and entry is not None and entry.source == "torchruntime":
            kind = "gpu"                 # Instinct and other compute GPUs use the processing-accelerator class
        dev = describe_pci(r.vendor_id, r.device_id, kind, entry, r.name, r.slot)
        dev.driver = r.driver
        dev.driver_version = raw.get("driver_versions", {}).get(r.driver or "")
        dev.vram_bytes = raw.get("vram", {}).get(r.slot)
        dev.source = raw.get("pci_source", "sysfs")
        hw.devices.append(dev)
        by_slot[r.slot] = dev
    _merge_kfd(hw, by_slot, raw.get("kfd", []))
    _merge_rocminfo(hw, by_slot, raw.get("rocminfo", []))
    _merge_nvidia_smi(hw, by_slot, raw.get("nvidia_smi", []), db)
    return hw


def _merge_kfd(hw: Hardware, by_slot: dict[str, Accelerator], nodes: list[dict[str, int]]) -> None:
    for props in nodes:
        slot = parse.bdf_to_slot(props.get("location_id", 0), props.get("domain", 0))
        dev = by_slot.get(slot)
        if dev is None or dev.vendor != AMD:
            continue
        gfx = parse.gfx_from_target_version(props["gfx_target_version"])
        if gfx:
            dev.gfx_target, dev.architecture = gfx, families.amd_family(gfx)
            dev.source += "+kfd"


def _merge_rocminfo(hw: Hardware, by_slot: dict[str, Accelerator], agents: list[dict[str, Any]]) -> None:
    amd = [d for d in hw.gpus if d.vendor == AMD]
    for i, agent in enumerate(agents):
        dev = by_slot.get(parse.bdf_to_slot(agent["bdf"])) if "bdf" in agent else None
        if dev is None:
            same = [d for d in amd if d.device_id == agent.get("device_id")]
            dev = same[0] if len(same) == 1 else (amd[i] if i < len(amd) and len(agents) == len(amd) else None)
        if dev is None:
            continue
        if agent.get("name") and agent["name"] != "AMD Radeon Graphics":
            dev.name = with_vendor(AMD, agent["name"])
        if agent.get("gfx_target"):
            dev.gfx_target = agent["gfx_target"]
            dev.architecture = families.amd_family(dev.gfx_target)
        if not dev.vram_bytes and agent.get("vram_bytes") and dev.integrated is False:
            dev.vram_bytes = agent["vram_bytes"]
        dev.source += "+rocminfo"


def _merge_nvidia_smi(hw: Hardware, by_slot: dict[str, Accelerator], rows: list[dict[str, Any]],
                      db: dict[tuple[str, str], pcidb.DbEntry]) -> None:
    nv = [d for d in hw.gpus if d.vendor == NVIDIA]
    for i, row in enumerate(rows):
        dev = by_slot.get(row.get("bus_id", ""))
        if dev is None and len(rows) == len(nv):
            dev = nv[i]
        if dev is None:                     # WSL2, or a container without the PCI tree: nvidia-smi is all we have
            vid, did = row.get("vendor_id", "10de"), row.get("device_id")
            dev = describe_pci(vid, did, "gpu", db.get((vid, did))) if did else Accelerator(
                kind="gpu", vendor=NVIDIA, name=row["name"], integrated=False)
            dev.bus_id = None if hw.wsl else row.get("bus_id")
            hw.devices.append(dev)
        _set_nvidia(dev, row)


# -- Windows -----------------------------------------------------------------

def windows(raw: dict[str, Any], arch: str) -> Hardware:
    hw = Hardware(os="Windows", arch=arch)
    hw.cpu = parse.cpu_from_cim(raw.get("processor", []), arch, tuple(raw.get("features", ())))
    entries = []
    for item in raw.get("video", []):
        ids = parse.parse_pnp_device_id(item.get("PNPDeviceID"))
        if ids is None or _WIN_SKIP.search(str(item.get("Name") or "")):
            continue
        entries.append(("gpu", ids, item))
    for item in raw.get("npu", []):
        ids = parse.parse_pnp_device_id(item.get("PNPDeviceID"))
        if ids is not None:
            entries.append(("npu", ids, item))
    db = pcidb.lookup({(v, d) for _, (bus, v, d), _ in entries if bus == "pci"})
    mem = _registry_memsize(raw.get("memsize", []))
    for kind, (bus, v, d), item in entries:
        dev = describe_pci(v, d, kind, db.get((v, d)) if bus == "pci" else None, str(item.get("Name") or ""))
        dev.name = str(item.get("Name") or dev.name).replace("(R)", "").replace("(TM)", "").strip()
        dev.name = with_vendor(dev.vendor, re.sub(r"\s+", " ", dev.name))
        dev.source = "cim"
        if kind == "gpu":
            dev.driver_version = _win_driver_version(dev.vendor, str(item.get("DriverVersion") or "")) or None
            ram = parse._int(item.get("AdapterRAM"))
            # AdapterRAM is 32-bit (it saturates at 4 GiB) and on iGPUs it is a share of system memory:
            # trust it only below the cap and on discrete parts; the registry's 64-bit size is better
            usable = ram if ram and 0 < ram < 0xFFF00000 and dev.integrated is False else None
            dev.vram_bytes = mem.get((v, d)) or usable
        hw.devices.append(dev)
    nv = [d for d in hw.gpus if d.vendor == NVIDIA]
    for row in raw.get("nvidia_smi", []):
        match = [d for d in nv if d.device_id == row.get("device_id")]
        if match:
            _set_nvidia(match[0], row)
            nv.remove(match[0])
    return hw


def _registry_memsize(items: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    out = {}
    for item in items:
        ids = parse.parse_pnp_device_id(str(item.get("MatchingDeviceId") or "").upper())
        size = item.get("HardwareInformation.qwMemorySize")
        if isinstance(size, list):                   # REG_BINARY comes back as a byte array
            size = int.from_bytes(bytes(int(b) & 0xFF for b in size), "little")
        if ids and isinstance(size, int) and size > 0:
            out.setdefault((ids[1], ids[2]), size)
    return out


def _win_driver_version(vendor: str, version: str) -> str:
    """NVIDIA's Windows driver 32.0.15.6094 is release 560.94; others keep the Windows form."""
    m = re.fullmatch(r"\d+\.\d+\.1(\d)\.(\d{4})", version)
    if vendor == NVIDIA and m:
        digits = m[1] + m[2]
        return f"{int(digits[:3])}.{digits[3:]}"
    return version


# -- macOS -------------------------------------------------------------------

def macos(raw: dict[str, Any], arch: str) -> Hardware:
    hw = Hardware(os="Darwin", arch=arch)
    sysctl: dict[str, str] = raw.get("sysctl", {})
    hw.cpu = parse.cpu_from_sysctl(sysctl, arch)
    memsize = parse._int(sysctl.get("hw.memsize"))
    for item in raw.get("displays", []):
        vendor_text = str(item.get("spdisplays_vendor") or "").lower().replace("sppci_vendor_", "")
        m = re.search(r"\(0x([0-9a-f]{4})\)", vendor_text)
        vendor, vid = next(((v, i) for k, (v, i) in _MAC_VENDORS.items() if vendor_text.startswith(k)),
                           (OTHER, m[1] if m else None))
        did = str(item.get("spdisplays_device-id") or "").lower().replace("0x", "") or None
        name = str(item.get("sppci_model") or item.get("_name") or "GPU")
        dev = Accelerator(kind="gpu", vendor=vendor, name=name, vendor_id=vid, device_id=did,
                          source="system_profiler")
        if vendor == APPLE:
            dev.vendor_id = dev.device_id = None
            dev.architecture = name                      # "Apple M3 Pro": the chip is the architecture
            dev.integrated = True
            dev.vram_bytes = memsize                     # unified memory
            cores = item.get("sppci_cores")
            if cores:
                dev.name = f"{name} ({cores}-core GPU)"
        else:
            entry = pcidb.lookup({(vid, did)}).get((vid, did)) if vid and did else None
            full = describe_pci(vid or "", did or "", "gpu", entry, name)
            dev.chip, dev.architecture = full.chip, full.architecture
            dev.compute_capability, dev.gfx_target = full.compute_capability, full.gfx_target
            dev.integrated = str(item.get("sppci_bus")) == "spdisplays_builtin"
            dev.vram_bytes = parse.parse_size(item.get("spdisplays_vram") or item.get("_spdisplays_vram")
                                              or item.get("spdisplays_vram_shared"))
        hw.devices.append(dev)
    apple_gpu = next((d for d in hw.devices if d.vendor == APPLE), None)
    if hw.cpu.model == "Apple processor" and apple_gpu is not None and apple_gpu.architecture:
        hw.cpu.model = apple_gpu.architecture           # macOS 11 says "Apple processor"; the GPU names the chip
    if arch == "arm64" and hw.cpu.vendor == "apple":
        hw.devices.append(Accelerator(kind="npu", vendor=APPLE, name="Apple Neural Engine",
                                      architecture=hw.cpu.model, integrated=True, source="sysctl"))
    return hw
