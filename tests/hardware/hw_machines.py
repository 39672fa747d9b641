"""Machines as fixtures: captured tool output replayed through the real probes.

Each folder in ``machines/`` is one machine:

- ``platform.json``: what ``platform.system()/machine()`` said, which ``cpus/`` capture is its
  ``/proc/cpuinfo``, whether its sysfs PCI tree is rebuilt from its ``lspci -nnk`` capture, and whether
  ``lspci`` is installed there;
- ``lspci-nnk.txt``: captured ``lspci -nnk``;
- ``root/``: captured files (sysfs, procfs, pci.ids) laid out from ``/``. PCI slot folders are stored as
  ``0000_03_00.0`` (a ``:`` cannot be in a file name on Windows) and renamed back when copied;
- ``<probe>.csv|txt|json``: a command's captured stdout; ``<probe>.error``: what it printed when it failed,
  with its exit status in ``platform.json`` (``"exit_status": {"nvidia-smi": 18}``). The failure reaches the
  probe through the same ``failure_message`` that ``run_command`` uses on a real machine;
- ``SOURCES.md`` (next to ``machines/``) says, file by file, which fixtures are real captures and from where.

``load_machine`` builds the root in a temporary folder and runs ``sdrt.hardware.collect`` on it,
with a runner that answers each command from these captures. Nothing is mocked: the probes read
real files and the parsers parse real output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from sdrt.hardware import Hardware, collect
from sdrt.hardware.probe import ProbeFailed, ProbeUnavailable, failure_message

HERE = Path(__file__).parent
MACHINES = HERE / "machines"
CPUS = HERE / "cpus"

#: PCI domains have 4 hex digits, or more behind an Intel VMD controller (``10000:e0:06.0``)
_STORED_SLOT = re.compile(r"^[0-9a-f]{4,8}_[0-9a-f]{2}_[0-9a-f]{2}\.[0-7]$")
_LSPCI_LINE = re.compile(r"^(?:(?P<dom>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})\.(?P<fn>[0-7]) "
                         r".*?\[(?P<cls>[0-9a-f]{4})\]: .*?\[(?P<ven>[0-9a-f]{4}):(?P<did>[0-9a-f]{4})\]")

OUTPUT_FILES = {
    "nvidia-smi": "nvidia-smi.csv", "nvidia-smi-old": "nvidia-smi-old.csv", "rocminfo": "rocminfo.txt",
    "lspci": "lspci-nnk.txt", "cim-video": "cim-video.json", "cim-npu": "cim-npu.json",
    "cim-processor": "cim-processor.json", "registry-memsize": "registry-memsize.json",
    "system_profiler": "system_profiler.json", "sysctl": "sysctl.txt",
}


class CapturedOutputs:
    """A probe runner that answers from a machine's captured outputs and records what was asked."""

    def __init__(self, folder: Path, meta: dict) -> None:
        self.folder, self.meta = folder, meta
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, name: str, argv: Sequence[str], timeout: float) -> str:
        self.calls.append((name, list(argv)))
        assert timeout > 0
        if name == "lspci" and not self.meta.get("lspci_installed"):
            raise ProbeUnavailable("lspci not installed on this machine")
        error = self.folder / f"{name.removesuffix('-old')}.error"
        captured = self.folder / OUTPUT_FILES[name]
        if not captured.exists() and error.exists():
            status = self.meta["exit_status"][name.removesuffix("-old")]
            raise ProbeFailed(failure_message(status, error.read_text()))
        if not captured.exists():
            raise ProbeUnavailable(f"{name} not installed on this machine")
        return captured.read_text()


def build_root(folder: Path, meta: dict, dest: Path) -> Path:
    root = dest / "root"
    if (folder / "root").exists():
        shutil.copytree(folder / "root", root, symlinks=True)
    root.mkdir(exist_ok=True)
    for dirpath, dirnames, _ in os.walk(root, topdown=False):
        for d in dirnames:
            if _STORED_SLOT.match(d):
                os.rename(os.path.join(dirpath, d), os.path.join(dirpath, d.replace("_", ":")))
    if meta.get("cpuinfo"):
        (root / "proc").mkdir(exist_ok=True)
        shutil.copy(CPUS / meta["cpuinfo"], root / "proc" / "cpuinfo")
    if meta.get("sysfs_from_lspci"):
        _sysfs_from_lspci((folder / "lspci-nnk.txt").read_text(), root)
    return root


def _sysfs_from_lspci(text: str, root: Path) -> None:
    """What the kernel shows in /sys/bus/pci/devices for each function that ``lspci -nnk`` listed."""
    base = root / "sys" / "bus" / "pci" / "devices"
    base.mkdir(parents=True, exist_ok=True)
    last: Path | None = None
    for line in text.splitlines():
        m = _LSPCI_LINE.match(line)
        if m:
            last = base / f"{m['dom'] or '0000'}:{m['bus']}:{m['dev']}.{m['fn']}"
            last.mkdir(exist_ok=True)
            (last / "class").write_text(f"0x{m['cls']}00\n")
            (last / "vendor").write_text(f"0x{m['ven']}\n")
            (last / "device").write_text(f"0x{m['did']}\n")
        elif last is not None and "Kernel driver in use:" in line:
            driver = line.split(":", 1)[1].strip()
            os.symlink(f"../../../bus/pci/drivers/{driver}", last / "driver")


def load_machine(name: str, tmp_path: Path) -> tuple[Hardware, CapturedOutputs]:
    folder = MACHINES / name
    meta = json.loads((folder / "platform.json").read_text())
    if meta["system"] == "Linux" and sys.platform == "win32":
        pytest.skip("Linux sysfs fixtures use symlinks and ':' in names, which need a POSIX filesystem")
    root = build_root(folder, meta, tmp_path)
    runner = CapturedOutputs(folder, meta)
    return collect(system=meta["system"], machine=meta["machine"], root=root, runner=runner), runner
