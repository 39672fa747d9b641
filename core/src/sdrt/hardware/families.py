"""Architecture from a chip codename: pure rules, no I/O.

The PCI database (torchruntime's copy of pci.ids) names each device as
``CHIP [Marketing name]``, e.g. ``AD102 [GeForce RTX 4090]``. The chip code
fixes the architecture; these rules turn it into the terms each vendor's
compiler uses: NVIDIA compute capability, AMD gfx target, Intel GPU
generation. Device-level tables stay in the database, not here.
"""

from __future__ import annotations

import re

# -- names -------------------------------------------------------------------

_DB_NAME = re.compile(r"^(?P<chip>[^\[]+?)\s*\[(?P<market>.+)\]\s*$")


def split_db_name(name: str) -> tuple[str | None, str]:
    """``AD102 [GeForce RTX 4090]`` -> ("AD102", "GeForce RTX 4090"); a plain name -> (None, name)."""
    m = _DB_NAME.match(name.strip())
    return (m["chip"].strip(), m["market"].strip()) if m else (None, name.strip())


# -- NVIDIA ------------------------------------------------------------------

#: chip prefix -> (architecture, compute capability); longest prefix wins
_NVIDIA = [
    ("GB10B", "Blackwell", "12.1"), ("GB100", "Blackwell", "10.0"), ("GB102", "Blackwell", "10.0"),
    ("GB110", "Blackwell", "10.3"), ("GB2", "Blackwell", "12.0"), ("GB", "Blackwell", "12.0"),
    ("GH", "Hopper", "9.0"), ("AD", "Ada Lovelace", "8.9"),
    ("GA100", "Ampere", "8.0"), ("GA10B", "Ampere", "8.7"), ("GA", "Ampere", "8.6"),
    ("TU", "Turing", "7.5"), ("GV", "Volta", "7.0"),
    ("GP100", "Pascal", "6.0"), ("GP10B", "Pascal", "6.2"), ("GP", "Pascal", "6.1"),
    ("GM20", "Maxwell", "5.2"), ("GM", "Maxwell", "5.0"),
    ("GK210", "Kepler", "3.7"), ("GK11", "Kepler", "3.5"), ("GK", "Kepler", "3.0"),
]
_CC_ARCH = {"12": "Blackwell", "10": "Blackwell", "9": "Hopper", "7.5": "Turing", "7.0": "Volta", "7.2": "Volta",
            "6": "Pascal", "5": "Maxwell", "3": "Kepler"}


def nvidia_arch(chip: str | None, compute_capability: str | None = None) -> tuple[str | None, str | None]:
    """(architecture, compute capability) from the chip code and/or the capability nvidia-smi gave."""
    arch, cc = None, compute_capability
    code = (chip or "").split()[0].upper().rstrip("GLM") if chip else ""
    for prefix, name, pcc in sorted(_NVIDIA, key=lambda t: -len(t[0])):
        if code.startswith(prefix):
            arch, cc = name, cc or pcc
            break
    if arch is None and cc:
        major = cc.split(".")[0]
        arch = "Ada Lovelace" if cc == "8.9" else "Ampere" if major == "8" else _CC_ARCH.get(cc) or _CC_ARCH.get(major)
    return arch, cc


def cc_tuple(cc: str | None) -> tuple[int, int] | None:
    if not cc or not re.fullmatch(r"\d+\.\d+", cc):
        return None
    a, b = cc.split(".")
    return int(a), int(b)


# -- AMD ---------------------------------------------------------------------

#: AMD chip codename (as pci.ids spells it) -> LLVM gfx target
_AMD = {
    "navi 48": "gfx1201", "navi 44": "gfx1200",
    "navi 31": "gfx1100", "navi 32": "gfx1101", "navi 33": "gfx1102",
    "navi 21": "gfx1030", "navi 22": "gfx1031", "navi 23": "gfx1032", "navi 24": "gfx1034",
    "navi 10": "gfx1010", "navi 12": "gfx1011", "navi 14": "gfx1012",
    "aqua vanjaram": "gfx942", "aldebaran": "gfx90a", "arcturus": "gfx908",
    "vega 20": "gfx906", "vega 10": "gfx900", "vega 12": "gfx904",
    "ellesmere": "gfx803", "baffin": "gfx803", "lexa": "gfx803", "polaris": "gfx803", "fiji": "gfx803",
}
_AMD_FAMILY = [("gfx12", "RDNA 4"), ("gfx115", "RDNA 3.5"), ("gfx11", "RDNA 3"), ("gfx103", "RDNA 2"),
               ("gfx101", "RDNA 1"), ("gfx950", "CDNA 4"), ("gfx942", "CDNA 3"), ("gfx90a", "CDNA 2"),
               ("gfx908", "CDNA 1"), ("gfx9", "GCN 5 (Vega)"), ("gfx8", "GCN 4 (Polaris)")]


def amd_gfx(chip: str | None, integrated_gfx: str | None = None) -> str | None:
    """gfx target from the chip codename (discrete) or torchruntime's APU table (integrated)."""
    if integrated_gfx:
        return integrated_gfx
    c = (chip or "").lower()
    for key, gfx in _AMD.items():
        if c.startswith(key) or c.startswith(key.replace(" ", "")):
            return gfx
    m = re.search(r"instinct mi3[05]", c)
    return "gfx950" if m and "mi35" in c else None


def amd_family(gfx: str | None) -> str | None:
    for prefix, fam in _AMD_FAMILY:
        if gfx and gfx.startswith(prefix):
            return fam
    return None


# -- Intel -------------------------------------------------------------------

#: codename fragment (lowercase, spaces removed) -> Intel GPU generation
_INTEL = [
    ("battlemage", "Xe2-HPG (Battlemage)"), ("bmg", "Xe2-HPG (Battlemage)"),
    ("dg2", "Xe-HPG (Alchemist)"), ("alchemist", "Xe-HPG (Alchemist)"), ("dg1", "Xe-LP (DG1)"),
    ("pantherlake", "Xe3-LPG (Panther Lake)"), ("lunarlake", "Xe2-LPG (Lunar Lake)"),
    ("200v", "Xe2-LPG (Lunar Lake)"), ("arrowlake", "Xe-LPG+ (Arrow Lake)"),
    ("meteorlake", "Xe-LPG (Meteor Lake)"),
    ("raptorlake", "Xe-LP (Gen12)"), ("alderlake", "Xe-LP (Gen12)"), ("rocketlake", "Xe-LP (Gen12)"),
    ("tigerlake", "Xe-LP (Gen12)"), ("jasperlake", "Gen11"), ("elkhartlake", "Gen11"), ("icelake", "Gen11"),
    ("cometlake", "Gen9.5"), ("coffeelake", "Gen9.5"), ("whiskeylake", "Gen9.5"), ("kabylake", "Gen9.5"),
    ("geminilake", "Gen9"), ("apollolake", "Gen9"), ("skylake", "Gen9"), ("broadwell", "Gen8"),
    ("haswell", "Gen7.5"),
]
#: chip codenames of Intel's discrete GPUs; every other Intel GPU is integrated
_INTEL_DISCRETE = ("dg1", "dg2", "battlemage", "bmg", "alchemist", "pontevecchio", "arcticsound", "ats-m")


def intel_generation(name: str | None) -> str | None:
    n = re.sub(r"[\s_-]", "", (name or "").lower())
    for key, gen in _INTEL:
        if key in n:
            return gen
    return None


def intel_is_discrete(chip: str | None, market: str | None) -> bool | None:
    """True for DG1/DG2/Battlemage parts. None when the name says nothing either way."""
    text = re.sub(r"\s", "", f"{chip or ''} {market or ''}".lower())
    if any(k in text for k in _INTEL_DISCRETE):
        return True
    if intel_generation(text):
        return False
    if re.search(r"arc\(tm\)a\d{3}|arca\d{3}|arcb\d{3}", text) and "lake" not in text:
        return True
    if re.search(r"uhd|irisxe|iris|hdgraphics", text):
        return False
    return None
