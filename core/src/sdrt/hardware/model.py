"""What ``detect()`` returns: plain, typed, JSON-friendly dataclasses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: vendor keys used across sdrt.hardware
NVIDIA, AMD, INTEL, APPLE, QUALCOMM, OTHER = "nvidia", "amd", "intel", "apple", "qualcomm", "other"

#: PCI vendor id (lowercase hex, no 0x) -> vendor key
PCI_VENDORS = {"10de": NVIDIA, "1002": AMD, "1022": AMD, "8086": INTEL, "106b": APPLE, "17cb": QUALCOMM,
               "5143": QUALCOMM}


@dataclass
class CPU:
    """The host CPU."""

    vendor: str = "unknown"          # "intel", "amd", "apple", "arm", "qualcomm", ...
    model: str = "unknown"           # "Intel(R) Xeon(R) Platinum 8480+"
    arch: str = "unknown"            # "x86_64", "arm64"
    cores: int | None = None         # physical cores
    threads: int | None = None       # logical processors
    #: canonical lowercase ISA flags we care about (see ``parse.ISA_FLAGS``)
    features: tuple[str, ...] = ()
    #: the last-level cache in bytes, all its instances together (two CCDs' L3s: both); None where unknown
    cache_bytes: int | None = None

    @property
    def isa(self) -> list[str]:
        """Human summary of the ISA extensions that matter for inference."""
        f = set(self.features)
        out = []
        for flag, label in (("avx2", "AVX2"), ("avx_vnni", "AVX-VNNI"), ("avx512f", "AVX-512"),
                            ("avx512_vnni", "AVX-512-VNNI"), ("avx512_bf16", "AVX-512-BF16"),
                            ("avx512_fp16", "AVX-512-FP16"), ("amx_tile", "AMX"), ("amx_bf16", "AMX-BF16"),
                            ("amx_int8", "AMX-INT8"), ("amx_fp16", "AMX-FP16"), ("neon", "NEON"),
                            ("dotprod", "DOTPROD"), ("i8mm", "I8MM"), ("bf16", "BF16"), ("sve", "SVE"),
                            ("sve2", "SVE2"), ("sme", "SME")):
            if flag in f:
                out.append(label)
        return out

    @property
    def is_x86(self) -> bool:
        return self.arch in ("x86_64", "amd64", "i686", "x86")


@dataclass
class Accelerator:
    """One GPU or NPU."""

    kind: str                        # "gpu" or "npu"
    vendor: str                      # NVIDIA, AMD, INTEL, APPLE, QUALCOMM or OTHER
    name: str                        # marketing name: "GeForce RTX 4090"
    vendor_id: str | None = None     # PCI vendor id, lowercase hex: "10de"
    device_id: str | None = None     # PCI device id, lowercase hex: "2684"
    #: the architecture in the vendor's own terms: "Ada Lovelace", "gfx1100", "Xe-HPG (Alchemist)", "Apple M3"
    architecture: str | None = None
    compute_capability: str | None = None   # NVIDIA only: "8.9"
    gfx_target: str | None = None           # AMD only: "gfx1100"
    chip: str | None = None                 # die/codename from the PCI database: "AD102", "Navi 31"
    integrated: bool | None = None
    vram_bytes: int | None = None
    driver: str | None = None               # kernel driver or vendor: "nvidia", "amdgpu", "i915"
    driver_version: str | None = None
    bus_id: str | None = None               # "0000:01:00.0" where known
    source: str = ""                        # which probes contributed: "sysfs+nvidia-smi"

    @property
    def pci_id(self) -> str | None:
        return f"{self.vendor_id}:{self.device_id}" if self.vendor_id and self.device_id else None

    @property
    def vram_gib(self) -> float | None:
        return round(self.vram_bytes / 2**30, 1) if self.vram_bytes else None

    def describe(self) -> str:
        parts = [self.name]
        extra = []
        if self.pci_id:
            extra.append(self.pci_id)
        if self.architecture:
            extra.append(self.architecture)
        if self.compute_capability:
            extra.append(f"compute {self.compute_capability}")
        if self.gfx_target and self.gfx_target != self.architecture:
            extra.append(self.gfx_target)
        if self.integrated is not None:
            extra.append("integrated" if self.integrated else "discrete")
        if self.vram_bytes:
            extra.append(f"{self.vram_gib:g} GiB")
        if self.driver_version:
            extra.append(f"driver {self.driver_version}")
        if extra:
            parts.append(f"({', '.join(extra)})")
        return " ".join(parts)


@dataclass
class Hardware:
    """The machine as ``detect()`` saw it."""

    os: str                           # "Linux", "Windows", "Darwin"
    arch: str                         # normalised: "x86_64" or "arm64"
    cpu: CPU = field(default_factory=CPU)
    devices: list[Accelerator] = field(default_factory=list)
    wsl: bool = False
    #: what could not be probed, one line each ("nvidia-smi: timed out after 10s")
    notes: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> list[Accelerator]:
        return [d for d in self.devices if d.kind == "gpu"]

    @property
    def npus(self) -> list[Accelerator]:
        return [d for d in self.devices if d.kind == "npu"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu"]["isa"] = self.cpu.isa
        return d


@dataclass
class Recommendation:
    """What ``recommend()`` decided."""

    plugin: str                       # "trt", "migraphx", "openvino", "coreml", "ggml"
    distribution: str                 # "sdrt-trt"
    reason: str
    build: str | None = None          # ggml only: "cuda", "vulkan", "metal", "hip", "cpu"
    devices: list[Accelerator] = field(default_factory=list)
    uses_cpu: bool = False
    #: devices that were not chosen, each with why
    passed_over: list[tuple[Accelerator, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "distribution": self.distribution,
            "build": self.build,
            "reason": self.reason,
            "devices": [d.describe() for d in self.devices] + (["CPU"] if self.uses_cpu else []),
            "passed_over": [{"device": d.describe(), "why": why} for d, why in self.passed_over],
        }
