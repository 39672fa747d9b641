"""Devices as data: the library of device specs in ``sdrt/data/devices.json`` and this machine's CPU.

An entry holds peak dense FLOP/s per precision, memory bandwidth and size, what kind of device it
is (``gpu``, ``igpu``, ``npu``, ``cpu``), for CPUs the ISA and core count, and where its figures come
from (``source``, ``derived``, ``checked``); ``scripts/make_device_library.py`` writes the file.
``this_cpu()`` describes the CPU that ``sdrt.hardware.detect()`` finds, with derived figures.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import SdrtError

#: precisions that compute at another precision's rate (weights dequantize to fp16 on the fly)
COMPUTE_AS = {"q8_0": "fp16", "q5_0": "fp16", "q4_0": "fp16", "q4_k": "fp16", "nf4": "fp16", "fp8": "fp8"}


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    vendor: str
    kind: str  # gpu, igpu, npu, cpu
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops: dict[str, float]
    source: str = ""
    derived: str = ""
    checked: Any = False
    shared_memory: bool = False
    cores: int = 0
    isa: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    #: a CPU's last-level cache in bytes (``sdrt.hardware``'s ``CPU.cache_bytes``; 0: unknown, or not a CPU): a part
    #: whose weights are larger streams them from memory every call (``Factors.stream_weight_bandwidth_efficiency``)
    cache_bytes: int = 0

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s at ``precision``: its own figure, else the rate it computes at, else fp32's."""
        for p in (precision, COMPUTE_AS.get(precision, precision), "fp16" if precision != "fp32" else "fp32",
                  "fp32"):
            if p in self.peak_flops:
                return self.peak_flops[p]
        return max(self.peak_flops.values())

    def supports(self, precision: str) -> bool:
        """Whether the device computes ``precision`` at a rate of its own (or dequantizes it to one it has)."""
        return precision == "fp32" or precision in self.peak_flops or COMPUTE_AS.get(precision) in self.peak_flops \
            or (precision.startswith("q") and self.kind == "cpu")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vendor": self.vendor, "kind": self.kind, "memory_bytes": self.memory_bytes,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s, "peak_flops": self.peak_flops,
                "cores": self.cores, "isa": list(self.isa), "source": self.source, "derived": self.derived,
                **({"cache_bytes": self.cache_bytes} if self.cache_bytes else {})}


def _spec(e: dict[str, Any]) -> DeviceSpec:
    known = {"name", "vendor", "kind", "memory_bytes", "bandwidth_bytes_per_s", "peak_flops", "source", "derived",
             "checked", "shared_memory", "cores", "isa", "cache_bytes"}
    return DeviceSpec(e["name"], e["vendor"], e["kind"], int(e["memory_bytes"]), float(e["bandwidth_bytes_per_s"]),
                      {k: float(v) for k, v in e["peak_flops"].items()}, e.get("source", ""), e.get("derived", ""),
                      e.get("checked", False), bool(e.get("shared_memory", False)), int(e.get("cores", 0)),
                      tuple(e.get("isa", ())), {k: v for k, v in e.items() if k not in known},
                      int(e.get("cache_bytes", 0) or 0))


@lru_cache(maxsize=1)
def library() -> tuple[DeviceSpec, ...]:
    """Every device of the shipped library."""
    text = resources.files("sdrt").joinpath("data/devices.json").read_text()
    return tuple(_spec(e) for e in json.loads(text)["devices"])


def _norm(s: str) -> str:
    return "".join(c for c in s.lower() if c.isalnum())


def find(name: str) -> DeviceSpec:
    """The library device named ``name`` (case, spaces and punctuation ignored; a unique part of a name
    will do, e.g. "rtx 3060 12gb"), or ``this_cpu()`` for "cpu"/"this"."""
    if _norm(name) in ("cpu", "this", "thiscpu", "host"):
        return this_cpu()
    want = _norm(name)
    devs = library()
    exact = [d for d in devs if _norm(d.name) == want]
    if exact:
        return exact[0]
    hits = [d for d in devs if want in _norm(d.name)]
    if len(hits) > 1:  # "Apple M2" is the M2, not the M2 Ultra; "RTX 4070" not the 4070 Ti (_VARIANT_WORDS)
        asked = set(_tokens(name))
        plain = [d for d in hits if not (set(_tokens(d.name)) & _VARIANT_WORDS) - asked]
        hits = plain if len(plain) == 1 else hits
    if len(hits) == 1:
        return hits[0]
    last = [w for w in name.lower().split()[-1:] if _norm(w) not in _VENDOR_WORDS]  # "GPU" names no device
    close = hits or [d for d in devs if any(w and w in _norm(d.name) for w in last)]
    names = [d.name for d in (close or devs)]
    raise SdrtError(f"no single library device matches {name!r}" + (f" ({len(hits)} do)" if hits else ""),
                    where="the device library (sdrt/data/devices.json)",
                    fix="name one of: " + ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
                    + "; or 'cpu' for this machine's CPU (sdrt plan --list-devices lists them all)")


#: words that say who made a device, not which one it is ("NVIDIA GeForce RTX 3060", "AMD Radeon RX 7900 XTX")
_VENDOR_WORDS = frozenset({"nvidia", "geforce", "amd", "radeon", "intel", "apple", "graphics", "gpu"})
#: words of a library name that tell apart boards of one chip rather than name the chip
_BOARD_WORDS = frozenset({"sxm", "pcie"})
#: words that make another product of a model number ("RTX 4070 Ti", "RX 9070 XT", "RTX 4060 Laptop GPU"): a device
#: whose name has one is never an entry without it
_VARIANT_WORDS = frozenset({"ti", "super", "xt", "xtx", "gre", "laptop", "mobile", "max", "pro", "ultra", "nvl"})


def _tokens(name: str) -> list[str]:
    """A name's words, lower case, without trademark marks and parenthesised notes, vendor words dropped."""
    import re

    name = re.sub(r"\((r|tm|c)\)", "", name.lower())
    name = re.sub(r"\([^)]*\)", " ", name)
    return [w for w in (_norm(t) for t in name.split()) if w and w not in _VENDOR_WORDS]


def for_runtime(device: Any) -> DeviceSpec:
    """The library spec of a device a backend lists (``sdrt.backend.Device``): this machine's CPU for a CPU, else
    the library entry of the same kind whose name's model words (memory sizes and board words such as "SXM" aside)
    all appear in the device's name ("NVIDIA H200" is "H200 SXM 141GB"; "NVIDIA GeForce RTX 3060" is "RTX 3060 12GB",
    not "RTX 3060 Ti 8GB"), the one whose memory is nearest the device's where several are. Raises ``SdrtError`` for
    a device the library does not hold."""
    import re

    if device.kind == "cpu":
        return this_cpu()
    have = set(_tokens(str(device.name)))
    hits = []
    for d in library():
        model = [t for t in _tokens(d.name) if not re.fullmatch(r"\d+gb", t) and t not in _BOARD_WORDS]
        if d.kind == device.kind and model and set(model) <= have and (have & _VARIANT_WORDS) <= set(model):
            hits.append((len(model), d))
    if not hits:
        raise SdrtError(f"the device library holds no entry for {device.id} ({device.name}), so its peak rates are "
                        "unknown", where="the device library (sdrt/data/devices.json)",
                        fix="share `sdrt selftest --report r.json` from it so that the library can add it; `sdrt plan` "
                            "plans its kind's default efficiencies meanwhile")
    mem = device.memory_bytes or 0
    # the most model words; then the nearest memory; then the board the name says ("H100 PCIe"); then the library's order
    return min(hits, key=lambda h: (-h[0], abs(h[1].memory_bytes - mem) // 2**30 if mem else 0,
                                    not (set(_tokens(h[1].name)) & _BOARD_WORDS & have)))[1]


def _clock_ghz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.lower().startswith("cpu mhz")]
        if mhz:
            return max(mhz) / 1000
    except (OSError, ValueError):
        pass
    return 3.0


def _x86_family(cpuinfo: str | None = None, identifier: str | None = None) -> tuple[int, int] | None:
    """The x86 CPU (family, model): ``cpu family`` and ``model`` of ``/proc/cpuinfo`` (Linux), else the ``Family N
    Model M`` of Windows' ``PROCESSOR_IDENTIFIER`` ("AMD64 Family 25 Model 17 Stepping 1, AuthenticAMD"); None where
    neither says."""
    import re

    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read(65536)
        except OSError:
            cpuinfo = ""
    fam = re.search(r"^cpu family\s*:\s*(\d+)", cpuinfo, re.MULTILINE)
    if fam is not None:
        mod = re.search(r"^model\s*:\s*(\d+)", cpuinfo, re.MULTILINE)
        return int(fam.group(1)), int(mod.group(1)) if mod else -1
    m = re.search(r"\bFamily (\d+) Model (\d+)\b", identifier if identifier is not None else os.environ.get(
        "PROCESSOR_IDENTIFIER", ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


#: AMD's family 25 (0x19: Zen 3 and Zen 4; only Zen 4 has AVX-512) runs each 512-bit FMA as two halves on its
#: 256-bit units: 32 FP32 FLOPs a cycle, as AVX2's two FMA pipes (Zen 5, family 26, has full-width units)
HALF_WIDTH_AVX512_FAMILIES = {"amd": frozenset({25})}

#: Zen 1 and Zen+ (AMD family 23 = 0x17, models below 0x30; Hygon's family 24 is the same core) run each 256-bit
#: AVX2 FMA as two halves on their two 128-bit FMA pipes: 16 FP32 FLOPs a cycle (Zen 2, family 23 from model 0x30,
#: has 256-bit pipes)
HALF_WIDTH_AVX2 = {"amd": (23, 0x30), "hygon": (24, 0x100)}


def fp32_flops_per_cycle(features: set[str], vendor: str | None, family: int | None, model: int | None = None) -> int:
    """FP32 FLOPs a core does a cycle at its widest FMA: AVX-512 64 (32 on 256-bit units), AVX2+FMA 32 (16 on
    Zen 1's 128-bit units), else 16."""
    if "avx512f" in features:
        return 32 if family in HALF_WIDTH_AVX512_FAMILIES.get(vendor or "", ()) else 64
    if {"avx2", "fma"} <= features:
        half = HALF_WIDTH_AVX2.get(vendor or "")
        return 16 if half and family == half[0] and model is not None and 0 <= model < half[1] else 32
    return 16


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


@lru_cache(maxsize=1)
def this_cpu() -> DeviceSpec:
    """This machine's CPU as a library entry, from ``sdrt.hardware.detect()``: peak FP32 = cores x clock x
    FLOPs per cycle for its widest FMA (AVX-512: 64, 32 on an AMD Zen 4's 256-bit units, AVX2+FMA: 32, 16 on
    Zen 1's 128-bit units, else 16,
    ``fp32_flops_per_cycle``); bf16 twice that with
    AVX512_BF16, 16 x with AMX; bandwidth a nominal 12 GB/s per core (capped at 100 GB/s), which
    ``sdrt selftest --calibrate`` replaces by what it measures."""
    from ..hardware import detect

    cpu = detect().cpu
    feats = set(cpu.features)
    fam_model = _x86_family() if cpu.arch == "x86_64" else None
    per_cycle = fp32_flops_per_cycle(feats, cpu.vendor, *(fam_model or (None, None)))
    cores = max(1, int(cpu.cores or os.cpu_count() or 1))
    ghz = _clock_ghz()
    fp32 = cores * ghz * 1e9 * per_cycle
    peaks = {"fp32": fp32}
    if "amx_bf16" in feats:
        peaks["bf16"] = 16 * fp32
    elif "avx512_bf16" in feats:
        peaks["bf16"] = 2 * fp32
    if "avx512_vnni" in feats or "avx_vnni" in feats:
        peaks["int8"] = 4 * fp32
    bw = min(100e9, 12e9 * cores)
    return DeviceSpec(f"this CPU ({cpu.model or cpu.vendor}, {cores} cores)", cpu.vendor or "?", "cpu", _memory_bytes(),
                      bw, peaks, "sdrt.hardware.detect() on this machine",
                      f"{cores} cores x {ghz:.2f} GHz x {per_cycle} FP32 FLOPs/cycle", False, True, cores,
                      tuple(sorted(feats)), cache_bytes=int(cpu.cache_bytes or 0))
