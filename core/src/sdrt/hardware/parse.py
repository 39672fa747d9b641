"""Pure parsers: captured tool output in, plain data out. No I/O here.

Each function takes the text a probe read (a file, or a command's stdout) and
never raises on odd input: what it cannot read it leaves out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .model import CPU

# -- CPU ---------------------------------------------------------------------

#: /proc/cpuinfo flag -> canonical name (x86 "flags", ARM "Features")
_X86_FLAGS = {
    "sse4_2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512dq": "avx512dq",
    "avx512_vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16",
    "avx_vnni": "avx_vnni", "amx_tile": "amx_tile", "amx_bf16": "amx_bf16", "amx_int8": "amx_int8",
    "amx_fp16": "amx_fp16",
}
_ARM_FLAGS = {"asimd": "neon", "neon": "neon", "asimddp": "dotprod", "i8mm": "i8mm", "bf16": "bf16",
              "sve": "sve", "sve2": "sve2", "sme": "sme", "fphp": "fp16", "asimdhp": "fp16"}

#: ARM "CPU implementer" codes (assigned by Arm) -> vendor key
_ARM_IMPLEMENTERS = {"0x41": "arm", "0x42": "broadcom", "0x43": "cavium", "0x48": "hisilicon", "0x4e": "nvidia",
                     "0x51": "qualcomm", "0x61": "apple", "0x6d": "microsoft", "0xc0": "ampere"}

#: Arm Ltd. core part numbers ("CPU part" when the implementer is 0x41)
_ARM_PARTS = {"0xd03": "Cortex-A53", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76", "0xd0c": "Neoverse-N1",
              "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2", "0xd4f": "Neoverse-V2", "0xd8e": "Neoverse-N3"}

_X86_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon", "CentaurHauls": "centaur"}


def normalize_arch(machine: str) -> str:
    m = machine.strip().lower()
    if m in ("x86_64", "amd64", "x64", "em64t"):
        return "x86_64"
    if m in ("arm64", "aarch64", "armv8", "arm64e"):
        return "arm64"
    return m or "unknown"


def parse_cpuinfo(text: str, arch: str) -> CPU:
    """``/proc/cpuinfo`` (x86 or ARM) -> CPU."""
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    fields: list[dict[str, str]] = []
    for b in blocks:
        d: dict[str, str] = {}
        for line in b.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                d.setdefault(key.strip().lower(), value.strip())
        fields.append(d)
    procs = [f for f in fields if "processor" in f]
    first = procs[0] if procs else (fields[0] if fields else {})
    machine = next((f for f in fields if "processor" not in f), {})   # ARM: trailing Hardware/Model block
    cpu = CPU(arch=arch)
    raw_flags = (first.get("flags") or first.get("features") or "").split()
    table = _X86_FLAGS if arch == "x86_64" else _ARM_FLAGS
    cpu.features = tuple(sorted({table[f] for f in raw_flags if f in table}))
    if "vendor_id" in first:
        cpu.vendor = _X86_VENDORS.get(first["vendor_id"], first["vendor_id"].lower())
    elif "cpu implementer" in first:
        cpu.vendor = _ARM_IMPLEMENTERS.get(first["cpu implementer"].lower(), "arm")
    model = first.get("model name") or machine.get("model") or machine.get("hardware")
    if not model and "cpu part" in first:
        part = first["cpu part"].lower()
        model = _ARM_PARTS.get(part) if cpu.vendor == "arm" else None
        model = model or f"{cpu.vendor} CPU part {part}"
    cpu.model = re.sub(r"\s+", " ", model).strip() if model else "unknown"
    sockets = len({p.get("physical id", "0") for p in procs}) or 1
    if _int(first.get("cpu cores")) and _int(first.get("siblings")):
        # x86: per-socket counts, so a listing of one processor per socket is enough
        cpu.cores = _int(first["cpu cores"]) * sockets  # type: ignore[operator]
        cpu.threads = max(_int(first["siblings"]) * sockets, len(procs))  # type: ignore[operator]
    else:
        cpu.threads = len(procs) or None
        cpu.cores = cpu.threads
    return cpu


def parse_sysctl(text: str) -> dict[str, str]:
    """``sysctl name ...`` output (``key: value`` lines) -> dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_cache_size(text: str) -> int | None:
    """A sysfs cache ``size`` (``491520K``, ``32M``) in bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text or "", re.IGNORECASE)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def last_level_cache(rows: list[dict[str, str]]) -> int | None:
    """The last-level cache in bytes from sysfs rows (``probe_linux._caches``): the highest level's data or unified
    caches, each instance (its ``shared_cpu_list``) once, summed (the L3 of each of two CCDs: both). None if none."""
    data = [r for r in rows if r.get("type", "").lower() != "instruction" and _int(r.get("level")) is not None]
    if not data:
        return None
    top = max(_int(r["level"]) or 0 for r in data)
    seen: dict[str, int] = {}
    for r in data:
        size = parse_cache_size(r.get("size", ""))
        if _int(r["level"]) == top and size:
            seen.setdefault(r.get("shared_cpu_list") or r.get("size", ""), size)
    return sum(seen.values()) or None


def cpu_from_sysctl(values: dict[str, str], arch: str) -> CPU:
    """macOS ``sysctl machdep.cpu hw`` values -> CPU."""
    brand = values.get("machdep.cpu.brand_string", "unknown")
    cpu = CPU(model=brand, arch=arch)
    if brand.startswith("Apple"):
        cpu.vendor = "apple"
    elif "Intel" in brand:
        cpu.vendor = "intel"
    flags = " ".join(values.get(k, "") for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")).lower()
    feats = {f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl") if f in flags.split()}
    if "avx1.0" in flags.split():
        feats.add("avx")
    if values.get("hw.optional.neon") == "1" or values.get("hw.optional.AdvSIMD") == "1":
        feats.add("neon")
    for key, name in (("hw.optional.arm.FEAT_DotProd", "dotprod"), ("hw.optional.arm.FEAT_I8MM", "i8mm"),
                      ("hw.optional.arm.FEAT_BF16", "bf16"), ("hw.optional.arm.FEAT_SME", "sme")):
        if values.get(key) == "1":
            feats.add(name)
    cpu.features = tuple(sorted(feats))
    # hw.* first; machdep.cpu.core_count/thread_count are what some macOS releases and sysctl subsets give
    cpu.cores = _int(values.get("hw.physicalcpu")) or _int(values.get("machdep.cpu.core_count"))
    cpu.threads = _int(values.get("hw.logicalcpu")) or _int(values.get("machdep.cpu.thread_count"))
    # the last level the CPU reports: an Intel Mac's L3; Apple silicon's performance cluster's L2
    cpu.cache_bytes = (_int(values.get("hw.l3cachesize")) or _int(values.get("hw.perflevel0.l2cachesize"))
                       or _int(values.get("hw.l2cachesize")) or None)
    return cpu


def cpu_from_cim(items: list[dict[str, Any]], arch: str, features: tuple[str, ...] = ()) -> CPU:
    """``Get-CimInstance Win32_Processor`` JSON items -> CPU (summed over sockets)."""
    if not items:
        return CPU(arch=arch, features=features)
    first = items[0]
    maker = str(first.get("Manufacturer") or "")
    vendor = _X86_VENDORS.get(maker, maker.lower() or "unknown")
    if "qualcomm" in vendor:
        vendor = "qualcomm"
    return CPU(
        vendor=vendor,
        model=re.sub(r"\s+", " ", str(first.get("Name") or "unknown")).strip(),
        arch=arch,
        cores=sum(_int(i.get("NumberOfCores")) or 0 for i in items) or None,
        threads=sum(_int(i.get("NumberOfLogicalProcessors")) or 0 for i in items) or None,
        features=features,
        cache_bytes=1024 * sum(_int(i.get("L3CacheSize")) or 0 for i in items) or None,  # KiB per socket
    )


# -- PCI ---------------------------------------------------------------------

@dataclass
class PciRecord:
    """One PCI function as sysfs or lspci shows it."""

    slot: str            # "0000:01:00.0"
    class_code: int      # 24-bit: 0x030000
    vendor_id: str       # "10de"
    device_id: str       # "2684"
    name: str | None = None
    driver: str | None = None


#: domains are 4 hex digits, or 5 and more behind an Intel VMD controller ("10000:e0:06.0")
_SLOT = r"(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
_LSPCI = re.compile(
    rf"^(?P<slot>{_SLOT})\s+.*?\[(?P<cls>[0-9a-f]{{4}})\]:\s+"
    r"(?P<name>.*?)\s*\[(?P<ven>[0-9a-f]{4}):(?P<dev>[0-9a-f]{4})\]", re.IGNORECASE)
_LSPCI_ANY_HEADER = re.compile(rf"^{_SLOT}\s", re.IGNORECASE)


def parse_lspci_nn(text: str) -> list[PciRecord]:
    """``lspci -nn`` (or ``-nnk``) -> one record per function: class, ids, the name lspci printed, driver."""
    out: list[PciRecord] = []
    current: PciRecord | None = None
    for line in text.splitlines():
        m = _LSPCI.match(line.strip()) if not line.startswith(("\t", " ")) else None
        if not m:
            if _LSPCI_ANY_HEADER.match(line):
                current = None            # a function this parser cannot read: its lines are not the last one's
                continue
            # sub-lines are tab-indented, but captures pasted into web pages often lose the indent
            drv = re.match(r"\s*Kernel driver in use:\s*(\S+)", line)
            if drv and current is not None:
                current.driver = drv[1]
            continue
        slot = m["slot"].lower()
        if slot.count(":") == 1:
            slot = "0000:" + slot
        current = PciRecord(slot=slot, class_code=int(m["cls"], 16) << 8, vendor_id=m["ven"].lower(),
                            device_id=m["dev"].lower(), name=m["name"].strip())
        out.append(current)
    return out


def parse_hex_id(text: str | None) -> str | None:
    """sysfs ``0x10de`` -> ``10de``."""
    if not text:
        return None
    t = text.strip().lower()
    t = t[2:] if t.startswith("0x") else t
    return t.zfill(4) if re.fullmatch(r"[0-9a-f]{1,4}", t) else None


def parse_class(text: str | None) -> int | None:
    try:
        return int(text.strip(), 16) if text else None
    except ValueError:
        return None


def is_accelerator_class(class_code: int) -> str | None:
    """PCI class -> "gpu" (display 0x03xxxx), "npu" (processing accelerator 0x12xxxx), or None."""
    base = class_code >> 16
    if base == 0x03:
        return "gpu"
    if base == 0x12:
        return "npu"
    return None


def parse_pci_ids(text: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The system ``pci.ids`` database -> names for the (vendor, device) pairs asked for."""
    vendors = {v for v, _ in wanted}
    out: dict[tuple[str, str], str] = {}
    vendor: str | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("C "):
            break                         # device classes follow the vendor list
        if not line.startswith("\t"):
            vendor = line[:4].lower() if line[:4].lower() in vendors else None
            continue
        if vendor and not line.startswith("\t\t"):
            dev = line[1:5].lower()
            if (vendor, dev) in wanted:
                out[(vendor, dev)] = line[5:].strip()
    return out


# -- NVIDIA ------------------------------------------------------------------

#: what ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` is asked for; the name
#: goes last because nvidia-smi does not quote it and a name may hold a comma
NVSMI_FIELDS = ("index", "pci.bus_id", "pci.device_id", "memory.total", "driver_version", "compute_cap", "name")
NVSMI_FIELDS_OLD = tuple(f for f in NVSMI_FIELDS if f != "compute_cap")   # drivers before 510


def parse_nvidia_smi(text: str, fields: tuple[str, ...] = NVSMI_FIELDS) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` -> one dict per GPU."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < len(fields) or not parts[0].isdigit():
            continue
        head = parts[: len(fields) - 1] + [", ".join(parts[len(fields) - 1:])]
        row = dict(zip(fields, head))
        gpu: dict[str, Any] = {"index": int(row["index"]), "name": row["name"]}
        pid = (row.get("pci.device_id") or "").lower()
        if re.fullmatch(r"0x[0-9a-f]{8}", pid):
            gpu["device_id"], gpu["vendor_id"] = pid[2:6], pid[6:10]
        bus = (row.get("pci.bus_id") or "").lower()
        if re.fullmatch(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", bus):
            gpu["bus_id"] = bus[4:]       # 00000000:01:00.0 -> 0000:01:00.0
        mem = _float(row.get("memory.total"))
        if mem is not None:
            gpu["vram_bytes"] = int(mem * 2**20)
        if row.get("driver_version") and row["driver_version"] not in ("[N/A]", "N/A"):
            gpu["driver_version"] = row["driver_version"]
        if re.fullmatch(r"\d+\.\d+", row.get("compute_cap") or ""):
            gpu["compute_capability"] = row["compute_cap"]
        out.append(gpu)
    return out


# -- AMD ---------------------------------------------------------------------

def parse_rocminfo(text: str) -> list[dict[str, Any]]:
    """``rocminfo`` -> one dict per GPU agent: gfx target, marketing name, chip id, BDF id, VRAM."""
    agents = re.split(r"^\*{3,}\s*\n\s*Agent \d+\s*\n\*{3,}\s*$", text, flags=re.MULTILINE)[1:]
    out = []
    for body in agents:
        fields: dict[str, str] = {}
        for line in body.splitlines():
            if line.startswith("  ") and not line.startswith("   "):
                key, sep, value = line.strip().partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
        if fields.get("Device Type") != "GPU":
            continue
        gpu: dict[str, Any] = {}
        if re.fullmatch(r"gfx[0-9a-f]+", fields.get("Name", "")):
            gpu["gfx_target"] = fields["Name"]
        if fields.get("Marketing Name"):
            gpu["name"] = fields["Marketing Name"]
        m = re.search(r"\(0x([0-9a-f]+)\)", fields.get("Chip ID", ""))
        if m:
            gpu["device_id"] = m[1].zfill(4)
        bdf = _int(fields.get("BDFID"))
        if bdf is not None:
            gpu["bdf"] = bdf
        pool = re.search(r"Segment:\s+GLOBAL; FLAGS: COARSE GRAINED\s*\n\s*Size:\s+(\d+)\(0x[0-9a-f]+\) KB", body)
        if pool:
            gpu["vram_bytes"] = int(pool[1]) * 1024
        out.append(gpu)
    return out


def parse_kfd_properties(text: str) -> dict[str, int]:
    """``/sys/class/kfd/kfd/topology/nodes/N/properties`` -> {key: int}."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        v = _int(value.strip())
        if key and v is not None:
            out[key] = v
    return out


def gfx_from_target_version(version: int) -> str | None:
    """KFD ``gfx_target_version`` (e.g. 110000, 90010, 90402) -> "gfx1100", "gfx90a", "gfx942"."""
    if not version:
        return None
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def bdf_to_slot(bdf: int, domain: int = 0) -> str:
    """rocminfo BDFID / KFD location_id (bus << 8 | device << 3 | function) -> "0000:03:00.0"."""
    return f"{domain:04x}:{bdf >> 8:02x}:{(bdf >> 3) & 0x1f:02x}.{bdf & 7}"


# -- Windows -----------------------------------------------------------------

def parse_cim_json(text: str) -> list[dict[str, Any]]:
    """``Get-CimInstance ... | ConvertTo-Json`` -> list of objects (one object comes back bare)."""
    try:
        data = json.loads(text) if text and text.strip() else []
    except ValueError:
        return []
    if isinstance(data, dict):
        data = [data]
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


_PNP = re.compile(r"^(?P<bus>[A-Z0-9]+)\\VEN_(?P<ven>[0-9A-Z]{4})&DEV_(?P<dev>[0-9A-Z]{4})", re.IGNORECASE)


def parse_pnp_device_id(pnp: str | None) -> tuple[str, str, str] | None:
    """``PCI\\VEN_10DE&DEV_2684&SUBSYS_...`` -> ("pci", "10de", "2684"); ACPI ids keep their letters."""
    m = _PNP.match(pnp or "")
    return (m["bus"].lower(), m["ven"].lower(), m["dev"].lower()) if m else None


# -- macOS -------------------------------------------------------------------

def parse_system_profiler(text: str) -> list[dict[str, Any]]:
    """``system_profiler -json SPDisplaysDataType`` -> the GPU entries."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return []
    items = data.get("SPDisplaysDataType") if isinstance(data, dict) else None
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def parse_size(text: str | None) -> int | None:
    """"8 GB", "1536 MB", "Dynamic, Max: 48 GB" -> bytes."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*([KMGT])B", text or "", re.IGNORECASE)
    if not m:
        return None
    return int(float(m[1]) * 1024 ** "KMGT".index(m[2].upper()) * 1024)


# -- helpers -----------------------------------------------------------------

def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip().split("(")[0])
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return None
