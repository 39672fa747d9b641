"""Windows probes: PowerShell CIM queries, the display-class registry, nvidia-smi, CPU feature bits."""

from __future__ import annotations

import os
import sys
from typing import Any

from . import parse
from .probe import Context
from .probe_linux import nvidia_smi

POWERSHELL = os.path.join(os.environ.get("SystemRoot", r"C:\Windows"), "System32", "WindowsPowerShell", "v1.0",
                          "powershell.exe")

VIDEO = ("Get-CimInstance Win32_VideoController | Select-Object Name,PNPDeviceID,AdapterRAM,DriverVersion,"
         "VideoProcessor,AdapterCompatibility | ConvertTo-Json")
NPU = ("Get-CimInstance Win32_PnPEntity -Filter \"PNPClass='ComputeAccelerator'\" | "
       "Select-Object Name,PNPDeviceID,Manufacturer | ConvertTo-Json")
PROCESSOR = ("Get-CimInstance Win32_Processor | Select-Object Name,Manufacturer,NumberOfCores,"
             "NumberOfLogicalProcessors,L3CacheSize | ConvertTo-Json")
#: dedicated memory per adapter: AdapterRAM is a 32-bit field and stops at 4 GiB
MEMSIZE = ("Get-ItemProperty -Path 'HKLM:\\SYSTEM\\CurrentControlSet\\Control\\Class\\"
           "{4d36e968-e325-11ce-bfc1-08002be10318}\\0*' -ErrorAction SilentlyContinue | "
           "Select-Object MatchingDeviceId,DriverDesc,'HardwareInformation.qwMemorySize' | ConvertTo-Json")

#: IsProcessorFeaturePresent constants (winnt.h)
_PF = {"avx2": 40, "avx512f": 41, "neon": 19, "dotprod": 43}


def _ps(ctx: Context, name: str, script: str) -> list[dict[str, Any]]:
    out = ctx.cmd(name, [POWERSHELL, "-NoProfile", "-NonInteractive", "-Command", script])
    return parse.parse_cim_json(out) if out else []


def gather(ctx: Context) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "video": _ps(ctx, "cim-video", VIDEO),
        "npu": _ps(ctx, "cim-npu", NPU),
        "processor": _ps(ctx, "cim-processor", PROCESSOR),
        "memsize": _ps(ctx, "registry-memsize", MEMSIZE),
        "features": ctx.guard("cpu features", _cpu_features) or (),
    }
    ids = [parse.parse_pnp_device_id(v.get("PNPDeviceID")) for v in raw["video"]]
    raw["nvidia_smi"] = nvidia_smi(ctx) if any(i and i[1] == "10de" for i in ids) else []
    return raw


def _cpu_features() -> tuple[str, ...]:
    """The ISA bits Windows reports for this CPU (empty elsewhere). AMX has no PF_ constant."""
    if sys.platform != "win32":
        return ()
    import ctypes

    present = ctypes.windll.kernel32.IsProcessorFeaturePresent  # type: ignore[attr-defined]
    return tuple(sorted(name for name, pf in _PF.items() if present(pf)))
