"""Names for PCI ids, from maintained databases.

1. torchruntime's ``gpu_pci_ids.db``: GPUs of AMD, NVIDIA and Intel, rebuilt
   weekly from pci.ids, with a discrete/integrated flag and an APU gfx table.
2. The system's own ``pci.ids`` (``/usr/share/hwdata``, ``/usr/share/misc``),
   when the OS ships one: it also names NPUs and other accelerators.
3. A short list of NPUs that neither source names on a bare system.

The lookup reads packaged data files and nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .families import split_db_name

log = logging.getLogger("sdrt.hardware")

#: NPUs (neither torchruntime nor every distro names them); ids from pci.ids
KNOWN_NPUS = {
    ("8086", "7d1d"): "Meteor Lake NPU",
    ("8086", "ad1d"): "Arrow Lake NPU",
    ("8086", "643e"): "Lunar Lake NPU",
    ("8086", "b03e"): "Panther Lake NPU",
    ("1022", "1502"): "AMD IPU Device (XDNA NPU)",
    ("1022", "17f0"): "AMD NPU (XDNA 2)",
}

#: display-only adapters found on servers, VMs and WSL2: named so the report reads well, never used
KNOWN_DISPLAY_ONLY = {
    ("1a03", "2000"): "ASPEED Graphics Family (server BMC)",
    ("1414", "008e"): "Microsoft Basic Render Driver (WSL2 GPU paravirtualization)",
    ("1234", "1111"): "QEMU standard VGA",
    ("1af4", "1050"): "Virtio GPU",
    ("15ad", "0405"): "VMware SVGA II",
    ("102b", "0536"): "Matrox G200eW3 (server BMC)",
}

PCI_IDS_PATHS = ("usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/pci.ids")


@dataclass
class DbEntry:
    raw: str                       # "AD102 [GeForce RTX 4090]"
    chip: str | None               # "AD102"
    market: str                    # "GeForce RTX 4090"
    discrete: bool | None = None   # torchruntime's flag, None from other sources
    apu_gfx: str | None = None     # torchruntime's gfx target for AMD APUs
    source: str = ""


def lookup(ids: set[tuple[str, str]], pci_ids_text: str | None = None) -> dict[tuple[str, str], DbEntry]:
    """(vendor, device) pairs -> database entries. Unknown pairs are left out."""
    out: dict[tuple[str, str], DbEntry] = {}
    if not ids:
        return out
    out.update(_torchruntime(ids))
    missing = ids - set(out)
    if missing and pci_ids_text:
        from .parse import parse_pci_ids

        for key, raw in parse_pci_ids(pci_ids_text, missing).items():
            chip, market = split_db_name(raw)
            out[key] = DbEntry(raw, chip, market, source="pci.ids")
    for key in ids - set(out):
        name = KNOWN_NPUS.get(key) or KNOWN_DISPLAY_ONLY.get(key)
        if name:
            out[key] = DbEntry(name, None, name, discrete=False, source="sdrt")
    return out


def _torchruntime(ids: set[tuple[str, str]]) -> dict[tuple[str, str], DbEntry]:
    try:
        from torchruntime.device_db import get_device_infos
        from torchruntime.gpu_db import get_amd_gfx_info
    except Exception as exc:  # noqa: BLE001 - a missing or broken database must not stop detection
        log.warning("torchruntime's PCI database is unavailable (%r); GPU names come from the OS only", exc)
        return {}
    out: dict[tuple[str, str], DbEntry] = {}
    try:
        for gpu in get_device_infos(sorted(ids)):
            key = (gpu.vendor_id.lower(), gpu.device_id.lower())
            chip, market = split_db_name(gpu.device_name)
            apu = get_amd_gfx_info(key[1])[1] if key[0] == "1002" else ""
            out.setdefault(key, DbEntry(gpu.device_name, chip, market, bool(gpu.is_discrete), apu or None,
                                        source="torchruntime"))
    except Exception as exc:  # noqa: BLE001
        log.warning("torchruntime's PCI database could not be read: %r", exc)
    return out
