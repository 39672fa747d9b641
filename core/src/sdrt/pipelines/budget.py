"""A memory budget and the placement that meets it: each part resident, released after use, or streamed.

``Pipeline(memory=...)`` (``sdrt generate --memory 8GB``) sets the budget; without one it is what the
device reports (``Device.memory_bytes``, as ``auto_low_memory`` reads it) and, for a CPU, the memory the OS says is
available (``MemAvailable``), at most what it reports. ``plan_memory`` is the pure decision:

- every part resident when ``base + FOOTPRINT x all weights`` fits (the normal case: nothing changes);
- otherwise the parts that run once per image are released after use (``sdrt.pipelines.lowmem``), and
  the smallest of them stay resident while they still fit beside the largest running part;
- a denoiser whose ``FOOTPRINT x weights`` alone exceeds what is left is streamed: split into block
  groups of at most ``(budget - base) / FOOTPRINT`` weight bytes (``sdrt.pipelines.streaming``), and the
  other parts are then all released (the denoiser runs every step, the others once per image).

``FOOTPRINT`` (2.0, ``sdrt.pipelines.lowmem``) is the measured ratio of a part's peak to its weight bytes
while it compiles and runs (docs/memory.md); ``base`` is the process's resident memory when the plan is
made (Python, numpy, the backend's libraries). The predicted peak is ``base`` plus the largest phase:
the resident parts plus the running part (or its heaviest group).

On a CPU that ``sdrt selftest --calibrate`` measured for a part's backend and precision, the part's need and what it
keeps once loaded come from the calibrated cost model instead (``sdrt.cost.footprint``, at the job's heaviest call):
a resident part then counts what it keeps beside the running one, and ``base`` is at least the calibrated runtime's.
That calibration also replaces the fixed low-memory rule (``auto_low_memory``) for such a pipeline: the plan releases
what does not fit.

Beside an accelerator (a device whose ``kind`` is not ``cpu``), parts can be **placed on a CPU device** instead, as
stable-diffusion.cpp's ``--clip-on-cpu --vae-on-cpu`` do (``place_parts``): asked with ``placement=`` (``{"text":
"cpu", "vae": "cpu"}``, roles or part names; ``sdrt generate --text-encoders-on-cpu --vae-on-cpu``), or chosen when
the parts do not fit the accelerator's budget: the text encoders first (they run once per prompt), then the VAE if
the denoiser and the VAE still do not fit together. Parts on the CPU are planned against the host's memory (what
the OS has available plus what the process holds), the others against the device's budget.

The measured peak is the process's high-water mark of resident memory: ``VmHWM`` from
``/proc/self/status`` on Linux. With a budget set (``memory=``), it is reset per stage through
``/proc/self/clear_refs`` so each stage (text, denoise, decode) has its own; that also resets what the OS
reports as the process's peak (``ru_maxrss``, ``/usr/bin/time``), so without ``memory=`` nothing is reset
and each stage reads the whole process's peak so far. ``ru_maxrss`` elsewhere (the whole run's peak only).
"""

from __future__ import annotations

import logging
import math
import numbers
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .lowmem import FOOTPRINT, give_back

if TYPE_CHECKING:  # pragma: no cover
    from .parts import Part

log = logging.getLogger("sdrt.pipelines.budget")

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_memory(value: Any, where: str = "memory") -> int:
    """``"8GB"`` (10^9), ``"8GiB"``/``"8G"`` (2^30), ``"512MB"``, ``"6144MiB"`` or a number of bytes -> bytes.

    ``where`` names the argument in the caller's words (``memory``, ``--memory``)."""
    fix = "give a size such as 8GB, 6GiB or 512MB (GB and MB are powers of 10, GiB, MiB, G and M of 2)"
    if isinstance(value, bool):
        raise InputError(f"{where} must be a size, got {value!r}", where=where, fix=fix)
    if isinstance(value, numbers.Real):  # numpy's integers and floats too
        try:
            number, unit = float(value), ""
        except OverflowError:  # an int (or Fraction) past float's range: above any size taken
            number, unit = math.inf, ""
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise InputError(f"cannot read the memory size {value!r:.40}", where=where, fix=fix)
    if unit not in _UNITS:
        raise InputError(f"unknown unit {unit!r} in the memory size {value!r}", where=where, fix=fix)
    size = number * _UNITS[unit]
    if not math.isfinite(size) or size < 2**10 or size > 2**60:
        what = ("not a size" if not math.isfinite(size) else
                "above 1 EiB (no machine has it; leave it out for the device's own memory)" if size > 2**60 else
                "below 1 KiB" + (" (a size without a unit is in bytes)" if not unit else ""))
        raise InputError(f"the memory size {value!r:.40} is {what}", where=where, fix=fix)
    return int(size)


#: the share of what the OS has available that a default budget takes: measured peaks run up to 10% above the
#: plan's prediction (docs/memory.md), and the OS and other programs need room too
OS_SHARE = 0.9
OS_SOURCE = f"{OS_SHARE:.0%} of what the OS has available"


def available_memory(device: Any) -> int | None:
    """What the device reports (``memory_bytes``); for a CPU, ``OS_SHARE`` of ``MemAvailable`` plus what this process
    holds already where the OS tells (a CPU device that reports the machine's memory, as ggml's does, shares it with
    the OS and the other programs: until 2026-12-04 a ggml budget was the whole RAM), at most what it reports."""
    if device is None:
        return None
    reported = getattr(device, "memory_bytes", None)
    if getattr(device, "kind", "cpu") != "cpu":
        return int(reported) if reported else None
    return cpu_budget(reported)


def cpu_budget(reported: int | None) -> int | None:
    """A CPU's default budget: ``OS_SHARE`` of what the OS has available plus this process's memory, at most
    ``reported`` (the machine's memory as the device or the device library gives it); ``reported`` where the OS does
    not tell."""
    os_share = _os_available()
    if os_share is None:
        return int(reported) if reported else None
    return min(os_share, int(reported)) if reported else os_share


def memory_source(device: Any, budget: int | None) -> str:
    """Where ``available_memory(device)``'s figure came from, in the plan's words."""
    reported = getattr(device, "memory_bytes", None)
    if not budget:
        return "unknown"
    if getattr(device, "kind", "cpu") == "cpu" and budget != reported:
        return OS_SOURCE
    return "reported by the device"


def _os_available() -> int | None:
    """``OS_SHARE`` of what the OS has available (``MemAvailable``) plus this process's resident memory; None: unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(int(line.split()[1]) * 1024 * OS_SHARE) + current_rss()  # what we hold is ours too
    except (OSError, ValueError, IndexError):
        pass
    return None


# ---------------------------------------------------------------------------- measuring
def current_rss() -> int:
    """This process's resident memory now (``VmRSS``; 0 where unknown)."""
    return _status("VmRSS") or 0


def _status(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss() -> tuple[int, str]:
    """The process's peak resident memory and where it was read (``VmHWM`` since the last reset, or
    ``ru_maxrss``: the whole process's life)."""
    hwm = _status("VmHWM")
    if hwm is not None:
        return hwm, "VmHWM"
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024), "ru_maxrss"
    except (ImportError, OSError):  # Windows
        return 0, "unknown"


def reset_peak() -> bool:
    """Restart the ``VmHWM`` high-water mark (Linux: write 5 to ``/proc/self/clear_refs``); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------- the plan
@dataclass
class Placement:
    """Where one part lives: ``resident`` all run, ``released`` after each use, or ``streamed`` in groups."""

    part: str
    placement: str
    weight_bytes: int
    #: predicted peak of the process while this part runs (base + resident parts + this part or its group)
    peak_bytes: int
    groups: list[int] = field(default_factory=list)  # a streamed part: the weight bytes of each group
    fits: bool = True
    #: a streamed part: the most weight bytes one group may hold
    cap_bytes: int = 0
    #: the device it runs on when not the pipeline's own (a CPU beside an accelerator): ``"openvino:CPU"``
    device: str = ""
    #: the most activation bytes it holds at once while running (its inputs, outputs and intermediates)
    activation_bytes: int = 0
    #: what it is when not one of the model's own parts: ``controlnet``, ``image_encoder``, ``upscaler``
    role: str = ""
    #: False: pinned resident whatever the budget (``plan_memory``'s ``pinned``); since 2026-12-01 the pipeline pins
    #: nothing: ControlNets and the hires fix's model upscaler are released after their last use like the others
    releasable: bool = True


@dataclass
class MemoryPlan:
    budget_bytes: int | None
    budget_source: str
    base_bytes: int
    footprint: float
    parts: list[Placement]
    #: measured after a run: {stage: peak bytes}, and where the figure was read
    measured: dict[str, int] = field(default_factory=dict)
    #: parts whose own footprint is not ``footprint`` (weights run as stored from the mapped file)
    footprints: dict[str, float] = field(default_factory=dict)
    measured_source: str = ""
    #: the pipeline's device (``"openvino:GPU.0"``); parts placed on a CPU beside it name theirs (``Placement.device``)
    device: str = ""
    #: parts on a CPU beside an accelerator: the host's budget, where it came from, and the process's own memory
    host_budget_bytes: int | None = None
    host_budget_source: str = ""
    host_base_bytes: int = 0
    #: parts whose need and what they keep came from the calibrated cost model (``sdrt.cost.footprint``): {part:
    #: ``"openvino bf16"``}, and what each keeps once loaded
    calibrated: dict[str, str] = field(default_factory=dict)
    keeps: dict[str, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """The predicted peak on the pipeline's device (parts placed on a CPU beside it: ``host_peak_bytes``)."""
        return max((p.peak_bytes for p in self.parts if not p.device), default=self.base_bytes)

    @property
    def host_peak_bytes(self) -> int:
        """The predicted peak of the process's own memory from the parts placed on a CPU (0: none are)."""
        return max((p.peak_bytes for p in self.parts if p.device), default=0)

    @property
    def fits(self) -> bool:
        host_ok = self.host_budget_bytes is None or self.host_peak_bytes <= self.host_budget_bytes
        return all(p.fits for p in self.parts) and host_ok and (self.budget_bytes is None
                                                                or self.peak_bytes <= self.budget_bytes)

    def placement(self, name: str) -> Placement | None:
        return next((p for p in self.parts if p.part == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(peak_bytes=self.peak_bytes, host_peak_bytes=self.host_peak_bytes, fits=self.fits)
        return d

    def format(self) -> str:
        from ..errors import in_caller_words

        budget = "none" if self.budget_bytes is None else _size(self.budget_bytes)
        source = in_caller_words("{@memory=}") if self.budget_source == "memory=" else self.budget_source  # --memory
        fixed = [p for p in self.footprints if p not in self.calibrated]
        cal = sorted(set(self.calibrated.values()))
        rest = [p.part for p in self.parts if p.part not in self.calibrated]
        how = (f"{self.footprint:g} x weights + activations" + "".join(f", {self.footprints[p]:.2g} x {p}'s" for p in fixed)
               + (f" for {', '.join(rest)}" if self.calibrated else "") if rest else "")
        if cal:
            how += ("; " if how else "") + "the cost model calibrated on this CPU for " + ", ".join(
                f"{c} ({', '.join(p for p, s in self.calibrated.items() if s == c)})" for c in cal)
        lines = [f"memory: budget {budget} ({source}), predicted peak {_size(self.peak_bytes)} "
                 f"(base {_size(self.base_bytes)} + {how})"
                 + (f" on {self.device}" if self.device and self.host_peak_bytes else "")
                 + ("" if self.fits else "  DOES NOT FIT")]
        hosts = sorted({p.device for p in self.parts if p.device})
        if hosts:
            hb = "none" if self.host_budget_bytes is None else _size(self.host_budget_bytes)
            lines.append(f"  on {', '.join(hosts)}: budget {hb} ({self.host_budget_source}), predicted peak "
                         f"{_size(self.host_peak_bytes)} of the process's memory (base {_size(self.host_base_bytes)})")
        for p in self.parts:
            extra = ""
            if p.groups:
                extra = f", {len(p.groups)} groups of <= {_size(max(p.groups))}"
            if p.activation_bytes:
                extra += f", activations {_size(p.activation_bytes)}"
            if p.part in self.keeps and p.placement == "resident":
                extra += f", keeps {_size(self.keeps[p.part])} loaded"
            if p.device:
                extra += f", on {p.device}"
            if p.role:
                extra += f", {p.role}" + ("" if p.releasable else " (kept loaded: the pipeline cannot release it)")
            lines.append(f"  {p.part:<16} {p.placement:<9} weights {_size(p.weight_bytes):>10}, peak while running "
                         f"{_size(p.peak_bytes)}{extra}" + ("" if p.fits else "  (over the budget)"))
        if self.measured:
            stages = ", ".join(f"{k} {_size(v)}" for k, v in self.measured.items())
            lines.append(f"  measured peak RSS ({self.measured_source}): {stages}")
        return "\n".join(lines)


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def plan_memory(weights: Mapping[str, int], denoiser: str | None, budget: int | None, *, base: int = 0,
                footprint: float = FOOTPRINT, release_all: bool = False, budget_source: str = "",
                split: Any = None, footprints: Mapping[str, float] | None = None,
                activations: Mapping[str, int] | None = None, pinned: Iterable[str] = (),
                beside: Mapping[str, Iterable[str]] | None = None,
                keeps: Mapping[str, float] | None = None) -> MemoryPlan:
    """Place each part under ``budget`` (see the module doc); pure but for ``split(cap) -> [group bytes]``,
    which cuts the denoiser for a weight cap (``None``: one group per cap's worth, estimated). ``footprints``:
    a part's own ratio of peak to weight bytes where it is not ``footprint`` (weights a backend runs from the
    mapped file as stored, as ggml does with a GGUF file's blocks: no second copy, about 1). ``activations``: the
    most activation bytes each part holds at once while it runs (``activation_peaks``), added to its need; a
    streamed part's ``split`` may give ``(weight bytes, activation bytes)`` per group. ``pinned``: parts that
    stay resident whatever the budget, so every phase counts them and a streamed denoiser's groups get what they
    leave. ``beside``: ``{part: [parts loaded while it runs]}`` beyond the resident ones (a ControlNet runs beside
    the denoiser at every step and is released only after its last pass; the hires fix's model upscaler runs while
    the denoiser, the VAE decoder and the hires pass's ControlNets are still loaded): a released part's phase
    counts them, so a phase they are released before (the VAE decode) does not. ``keeps``: what a part holds once
    loaded, between its runs, where that is less than what it needs while it compiles and runs (the calibrated cost
    model's figures, ``sdrt.cost.footprint``): a resident part counts that beside the running one, and its own
    phase adds the difference; default: its need (the fixed footprint has no other figure)."""
    names = list(weights)
    kept = [p for p in names if p in set(pinned)]
    fp = {p: (footprints or {}).get(p, footprint) for p in names}
    act = {p: int((activations or {}).get(p, 0)) for p in names}
    need = {p: fp[p] * weights[p] + act[p] for p in names}
    keep = {p: min(float((keeps or {}).get(p, need[p])), need[p]) for p in names}
    held = {p: [q for q in dict.fromkeys((beside or {}).get(p, ())) if q in need and q != p] for p in names}
    avail = None if budget is None else budget - base
    placed: dict[str, str] = {}
    groups: list[int] = []
    group_act: list[int] = []
    cap = 0

    def phases(resident: Iterable[str]) -> float:
        """Bytes at the largest phase with ``resident`` kept: they, plus the running part and what it runs beside."""
        res = set(resident)
        return sum(keep[p] for p in res) + max([need[p] - keep[p] for p in res] + [
            need[p] + sum(need[q] for q in held[p] if q not in res) for p in names if p not in res], default=0)

    if not release_all and (avail is None or phases(names) <= avail):
        placed = dict.fromkeys(names, "resident")
    else:
        den_need = need.get(denoiser, 0) if denoiser else 0
        # beside the parts that stay anyway and those that run with the denoiser (its ControlNets)
        left = None if avail is None else (avail - sum(keep[p] for p in kept)
                                           - sum(need[q] for q in held.get(denoiser or "", ()) if q not in kept))
        # streaming helps only when something is left beside the process itself
        stream = denoiser is not None and left is not None and 0 < left < den_need
        resident: list[str] = list(kept)
        if not stream and not release_all and avail is not None:
            for p in sorted((n for n in names if n not in kept), key=lambda n: need[n]):  # the smallest stay
                if phases([*resident, p]) <= avail:
                    resident.append(p)
                else:
                    break
        for p in names:
            placed[p] = "resident" if p in resident else "released"
        if stream:
            assert denoiser is not None and left is not None
            placed[denoiser] = "streamed"
            cap = max(int((left - act[denoiser]) / fp[denoiser]), 1)
            cut = split(cap) if split is not None else [cap] * math.ceil(weights[denoiser] / cap)
            groups = [g[0] if isinstance(g, tuple) else g for g in cut]
            group_act = [g[1] if isinstance(g, tuple) else act[denoiser] for g in cut]
    res_need = sum(keep[p] for p in names if placed[p] == "resident")

    def running(p: str) -> float:
        """What ``p`` holds while it runs beyond what it keeps when resident (a streamed part: its heaviest group)."""
        if placed[p] == "streamed":
            return max(fp[p] * g + a for g, a in zip(groups, group_act))
        return need[p] - keep[p] if placed[p] == "resident" else need[p]

    out = []
    for p in names:
        # the parts it runs beside: a resident one is counted already
        run = running(p) + sum(running(q) for q in held[p] if placed[q] != "resident")
        peak = int(base + res_need + run)
        fits = avail is None or res_need + run <= avail
        streamed = placed[p] == "streamed"
        out.append(Placement(p, placed[p], weights[p], peak, groups if streamed else [], fits, cap if streamed else 0,
                             activation_bytes=act[p], releasable=p not in kept))
    return MemoryPlan(budget, budget_source, base, footprint, out, footprints={p: f for p, f in fp.items()
                                                                               if f != footprint},
                      keeps={p: int(keep[p]) for p in names if p in (keeps or {})})


# ---------------------------------------------------------------------------- placing parts on devices
#: what ``placement=`` may say for a part or a role: the plan decides, the pipeline's device, a CPU device beside it
#: (or a device named as ``sdrt info`` prints it, ``"openvino:CPU"``)
PLACES = ("auto", "device", "cpu")
#: the roles ``placement=`` names besides part names, and the part roles each covers
ROLE_KEYS = {"text": ("text",), "vae": ("vae_decoder", "vae_encoder")}


def parse_placement(value: Any, roles: Mapping[str, str] | None = None, where: str = "placement") -> dict[str, str]:
    """``{"text": "cpu", "vae": "cpu"}`` or ``"text=cpu,vae=cpu"`` -> ``{part or role: place}``; ``roles``
    (``{part: role}``) checks the keys. A place is ``auto``, ``device``, ``cpu`` or a device name with its backend."""
    fix = 'give e.g. {"text": "cpu", "vae": "cpu"} (keys: text, vae or a part name; places: auto, device, cpu)'
    if value is None:
        return {}
    if isinstance(value, str):
        pairs = []
        for item in filter(None, (x.strip() for x in value.split(","))):
            key, sep, place = item.partition("=")
            if not sep:
                raise InputError(f"cannot read {item!r} in {where} {value!r}: it needs KEY=PLACE", where=where, fix=fix)
            pairs.append((key.strip(), place.strip()))
        value = dict(pairs)
    if not isinstance(value, Mapping):
        raise InputError(f"{where} must be a mapping of parts to places, got {value!r}", where=where, fix=fix)
    out: dict[str, str] = {}
    for key, place in value.items():
        if not isinstance(place, str) or (place.lower() not in PLACES and ":" not in place):
            raise InputError(f"unknown place {place!r} for {key!r} in {where}", where=where, fix=fix)
        if roles is not None and key not in ROLE_KEYS and key not in roles:
            raise InputError(f"{where} names {key!r}, which is neither a role (text, vae) nor a part of this model "
                             f"({', '.join(roles)})", where=where, fix=fix)
        out[str(key)] = place if ":" in place else place.lower()
    return out


def asked_place(part: str, role: str, asked: Mapping[str, str]) -> str:
    """What ``placement=`` says for ``part``: its own entry, else its role's, else ``auto``."""
    if part in asked:
        return asked[part]
    for key, covered in ROLE_KEYS.items():
        if role in covered and key in asked:
            return asked[key]
    return "auto"


def place_parts(need: Mapping[str, float], roles: Mapping[str, str], avail: float | None, *, accelerator: bool,
                asked: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{part: "device" | "cpu" | a device name}``: which parts run on a CPU beside an accelerator (pure).

    ``need``: each part's predicted peak bytes while it runs; ``avail``: the accelerator's budget less what it
    already holds (None: unknown, nothing moves unless asked). On a CPU device (``accelerator`` False) every part
    stays on it but those asked onto a named device. Asked places are kept; of the rest, when the parts do not fit together the text encoders move,
    then the VAE too if the denoiser (and ControlNets) and the VAE still do not fit together."""
    asked = asked or {}
    place = {p: "device" for p in need}
    free: list[str] = []
    for p in need:
        a = asked_place(p, roles.get(p, ""), asked)
        if a == "auto":
            free.append(p)
        elif a != "cpu" or accelerator:  # "cpu" on a CPU device: where it is already
            place[p] = a
    if not accelerator:
        return place
    on_device = [p for p in need if place[p] == "device"]
    if avail is None or sum(need[p] for p in on_device) <= avail:
        return place
    for p in free:
        if roles.get(p) == "text":
            place[p] = "cpu"
    vae = [p for p in need if roles.get(p, "").startswith("vae") and place[p] == "device"]
    rest = sum(need[p] for p in need if place[p] == "device" and p not in vae and roles.get(p) != "text")
    if vae and rest + max(need[p] for p in vae) > avail:
        for p in vae:
            if p in free:
                place[p] = "cpu"
    return place


def plan_placed(weights: Mapping[str, int], roles: Mapping[str, str], denoiser: str | None, budget: int | None, *,
                base: int = 0, accelerator: bool = False, device: str = "", host: str | None = None,
                host_budget: int | None = None, host_base: int = 0, asked: Mapping[str, str] | None = None,
                budget_source: str = "", host_budget_source: str = "", footprint: float = FOOTPRINT,
                release_all: bool = False, split: Any = None,
                footprints: Mapping[str, float] | None = None, activations: Mapping[str, int] | None = None,
                pinned: Iterable[str] = (), beside: Mapping[str, Iterable[str]] | None = None,
                keeps: Mapping[str, float] | None = None) -> MemoryPlan:
    """``plan_memory`` with parts placed per device (``place_parts``): the parts left on the pipeline's device are
    planned against ``budget``, those on the CPU device ``host`` (``"openvino:CPU"``; None: there is none, so nothing
    can go there) against ``host_budget`` with the process's own ``host_base``, as are parts asked onto a device
    named in ``asked`` (``"openvino:CPU"``). Pure but for ``split``."""
    fp = {p: (footprints or {}).get(p, footprint) for p in weights}
    acts = dict(activations or {})
    need = {p: fp[p] * weights[p] + acts.get(p, 0) for p in weights}
    avail = None if budget is None else budget - base
    wanted = {p: asked_place(p, roles.get(p, ""), asked or {}) for p in weights}
    if accelerator and host is None and "cpu" in wanted.values():
        bad = next(p for p, v in wanted.items() if v == "cpu")
        raise InputError(f"placement puts {bad} on the CPU, and no backend here offers a CPU device",
                         where="placement", fix="leave placement unset, or install a backend with a CPU device "
                                                "(openvino or ggml)")
    placed = place_parts(need, roles, avail, accelerator=accelerator and host is not None, asked=asked)
    local = {p: w for p, w in weights.items() if placed[p] == "device"}
    away = {p: w for p, w in weights.items() if placed[p] != "device"}
    fps = dict(footprints or {})
    main = plan_memory(local, denoiser if denoiser in local else None, budget, base=base, footprint=footprint,
                       release_all=release_all, budget_source=budget_source, split=split,
                       footprints={p: f for p, f in fps.items() if p in local},
                       activations={p: a for p, a in acts.items() if p in local}, pinned=pinned, beside=beside,
                       keeps={p: k for p, k in (keeps or {}).items() if p in local})
    main.device = device
    if not away:
        return main
    other = plan_memory(away, denoiser if denoiser in away else None, host_budget, base=host_base,
                        footprint=footprint, release_all=release_all, budget_source=host_budget_source, split=split,
                        footprints={p: f for p, f in fps.items() if p in away},
                        activations={p: a for p, a in acts.items() if p in away}, pinned=pinned, beside=beside,
                        keeps={p: k for p, k in (keeps or {}).items() if p in away})
    for pl in other.parts:
        pl.device = host if placed[pl.part] == "cpu" else placed[pl.part]  # type: ignore[assignment]
    by_name = {pl.part: pl for pl in main.parts + other.parts}
    main.parts = [by_name[p] for p in weights]
    main.footprints.update(other.footprints)
    main.keeps.update(other.keeps)
    main.host_budget_bytes, main.host_budget_source, main.host_base_bytes = host_budget, host_budget_source, host_base
    return main


def part_weight_bytes(part: Part) -> int:
    """Bytes of a part's weights, from its graph's initializer types and shapes (nothing read)."""
    from .streaming import _nbytes

    graph = _lean_graph(part)
    return sum(_nbytes(info) for info in graph.initializer_info().values())


def part_memory(part: Part, kept: frozenset[str] = frozenset()) -> tuple[int, int, int]:
    """``(bytes held, bytes of them kept as stored, bytes narrower in their file)`` of a part's weights: the graph's
    initializer bytes, except that a weight bound to a GGUF file's blocks of a type in ``kept``
    (``Backend.weight_blocks``: the backend runs them from the mapped file) counts its stored bytes; the third
    figure is what the float weights bound from a file take less there than in the graph (a float16 checkpoint
    bound onto a float32 graph: half), so their mapped pages count at the file's size. Headers only."""
    from .streaming import _nbytes

    graph = _lean_graph(part)
    info = graph.initializer_info()
    total = sum(_nbytes(i) for i in info.values())
    w = part.weights
    if w is None:
        return total, 0, 0
    # a block tensor read by anything but a matmul (an embedding table's Gather) is dequantized to float32
    matmul_read = {x for n in graph.model.graph.node if n.op_type in ("MatMul", "Gemm", "Transpose") for x in n.input}
    stored = floats = 0
    files: dict[tuple[Any, Any], list[int]] = {}  # a file tensor's stored bytes and the graph bytes bound from it
    for name, i in info.items():
        ref = w.ref(name) if name in w else None
        if ref is None:
            continue
        if ref.blocks is not None and kept and name in matmul_read:
            blocks = ref.blocks()
            if blocks.ggml_type in kept:
                stored += blocks.nbytes
                floats += _nbytes(i)
                continue
        if ref.blocks is None and ref.origin is not None and len(ref.origin) >= 3:
            # slices of one file tensor (a fused qkv bound as three weights) share its mapped pages: once
            got = files.setdefault((ref.origin[0], ref.origin[1]), [int(ref.origin[2]), 0])
            got[1] += _nbytes(i)
    narrow = sum(max(held - size, 0) for size, held in files.values())
    return total - floats + stored, stored, narrow


#: the roles of extra parts that are files, not graphs the backend compiles (``upscaler_bytes`` / ``weight_bytes``)
FILE_ROLES = ("upscaler", "preprocessor", "style_adapter")

#: a compiled preprocessor detector's bytes per byte of its float32 weights while it compiles and runs: its network
#: is built as an in-memory graph and compiled whole (MiDaS on OpenVINO's CPU device, tests/pipelines/kept_rss_probe.py:
#: the process peaked 4.6x its 169 MiB of weights above the model at a ViT width of 512, 5.6x its 470 MiB at the
#: published size; once compiled it holds 1.1-2.2x)
DETECTOR_FOOTPRINT = 5.5


def extra_identity(name: str, role: str, extra: Any) -> tuple[Any, ...]:
    """What tells one extra part (``sdrt.pipelines.plan.extra_parts``) from another for the plan: its name and role,
    its graph, and the weights file bound onto it with that file's version (a ControlNet ``.safetensors`` on the
    shipped graph: the graph is the same for every file); an upscaler by its file's version."""
    from ..stamps import file_stamp

    path = getattr(extra, "path", extra)
    source = getattr(extra, "source_file", None)
    stamp = getattr(extra, "source_stamp", None)
    if stamp is None:
        stamp = file_stamp(source if source is not None else path)
    return name, role, str(path), str(source or ""), repr(stamp)


def extra_bytes(extras: Mapping[str, tuple[str, Any]]) -> int:
    """Weight bytes of the parts a run uses besides the model's own (``sdrt.pipelines.plan.extra_parts``), as the plan
    counts them: a ControlNet's or image encoder's graph initializers (headers only), an upscaler's float32 tensors."""
    total = 0
    for _, (role, extra) in extras.items():
        try:
            total += (upscaler_bytes(extra) if role in ("upscaler", "style_adapter") else extra.weight_bytes() if role == "preprocessor"
                      else part_weight_bytes(extra))
        except Exception as exc:  # noqa: BLE001 - an estimate: a part that cannot be sized counts none
            log.debug("memory: no size for the %s %s: %s", role, extra, exc)
    return total


def upscaler_bytes(path: Any) -> int:
    """Bytes of a model upscaler's weights as it runs them (``ModelUpscaler``: every tensor as float32)."""
    from ..weights import Weights

    return sum(4 * math.prod(shape) for shape in Weights.open(path).shapes().values())


def apply_section(other: Any, calls: Mapping[str, Any] | None, prefix: str, base: Callable[[], int]) -> None:
    """A second model of the job (the hires checkpoint, ``hires.*``; the refiner, ``refiner.*``) told the plan the
    run plan prints for it (``RunPlan.hires_memory`` / ``refiner_memory``): planned on ``base()`` (the process and
    the first model's resident parts) with its own calls of ``calls`` (the job's, its parts under ``prefix``), its
    parts released once used, or streamed, where that plan places them. Nothing when it makes no call."""
    own = {k.removeprefix(prefix): v for k, v in (calls or {}).items() if k.startswith(prefix)}
    if not own:
        return
    other.memory_plan(base=base(), calls=own)
    other._memory_calls = None  # applied below on that base (a plan of its own jobs is made again for them)
    other._apply_memory_plan(own)


def _lean_graph(part: Part) -> Any:
    """The part's graph, loaded without its external data when not loaded yet."""
    if part._graph is not None:
        return part._graph
    from ..graph import Graph

    return Graph.load(part.path, load_external=False)


def calls_of(run_plan: Any) -> dict[str, list[dict[str, tuple[int, ...]]]]:
    """``{part: [{input: shape}, ...]}``: each part's distinct call shapes from a run plan (``Pipeline.plan``)."""
    return {p.part: [{name: tuple(shape) for name, shape, _ in sig} for sig, _ in p.signatures]
            for p in run_plan.parts}


def cpu_host(beside: Any) -> tuple[Any, Any] | None:
    """``sdrt.runtime.cpu_device``: where parts placed on the CPU run (None: no backend offers a CPU)."""
    from ..runtime import cpu_device

    return cpu_device(beside)


# ---------------------------------------------------------------------------- the pipeline's side
class MemoryMixin:
    """``Pipeline``'s budget: the plan, applied to the parts, and the measured peaks (see the module doc)."""

    memory: int | None
    low_memory: bool | None
    _parts: dict[str, Part]
    _memory_plan: MemoryPlan | None
    _stage_peaks: dict[str, int]

    def memory_plan(self, *, base: int | None = None, calls: Mapping[str, list[dict[str, tuple[int, ...]]]] | None = None,
                    extras: Mapping[str, tuple[str, Any]] | None = None, twins: Mapping[str, Part] | None = None,
                    beside: Mapping[str, Iterable[str]] | None = None) -> MemoryPlan:
        """Each part's placement under the budget and the predicted peak (computed once per pipeline, or again
        when ``base`` is given: the bytes the process holds besides the models; default: its resident memory
        now on a CPU, 0 on an accelerator, whose memory the process's own does not share). ``calls``: each
        part's input shapes per call (``calls_of`` a run plan): the activations are then counted too. ``extras``:
        the parts the run uses besides the model's own (``sdrt.pipelines.plan.extra_parts`` of its dry run:
        ControlNets, an IP-Adapter's image encoder, the hires fix's model upscaler), counted and placed with them.
        ``beside``: which parts are loaded while each runs (``sdrt.pipelines.plan.held_beside``: the ControlNets beside
        the denoiser, the model upscaler between the hires fix's passes)."""
        plan = getattr(self, "_memory_plan", None)
        if plan is None or base is not None or calls is not None:
            plan = self._make_memory_plan(base, calls, extras, twins, beside)
            self._memory_plan = plan
        return plan

    def _resident_with_room(self) -> bool:
        """Whether this job's memory plan keeps every part resident with room in the budget beside its peak for the
        largest part's weights again, outside low-memory mode and a dry run: what holding something of that size
        until the job's end (a compile-cache store) or making it beside the job's own (a second compile at once,
        ``sdrt.pipelines.ahead``) needs."""
        plan = getattr(self, "_memory_plan", None)
        if getattr(self, "_dry", False) or self.is_low_memory or plan is None:  # type: ignore[attr-defined]
            return False
        if any(p.placement != "resident" for p in plan.parts):
            return False
        largest = max((p.weight_bytes for p in plan.parts), default=0)
        return plan.budget_bytes is None or plan.peak_bytes + largest <= plan.budget_bytes

    def _activations(self, calls: Mapping[str, list[dict[str, tuple[int, ...]]]], be: Any, dev: Any,
                     parts: Mapping[str, Part] | None = None) -> tuple[dict[str, int], dict[str, Any]]:
        """Each part's most activation bytes at once over its calls (``streaming.activation_peaks`` on its graph
        pinned to each call's shapes; halved where the backend keeps activations in 16 bits at the part's
        precision; kept across processes under the pinned structure, ``graph.pinned_store``), and each part's
        heaviest call as (part, name, shapes, scale): the denoiser's split pins its graph to it."""
        from ..graph import pinned_store
        from .streaming import PEAK_FACT, activation_peaks

        out: dict[str, int] = {}
        pinned: dict[str, Any] = {}
        for name, shapes_list in calls.items():
            part = (parts if parts is not None else self._parts).get(name)
            if part is None:
                continue
            precision = part.options.get("precision") or (be.precision_for(dev) if be is not None else "fp32")
            scale = 0.5 if precision in getattr(be, "half_activations", ()) else 1.0
            lean = None
            for shapes in shapes_list:
                lean = lean if lean is not None else self._run_graph(name, part)
                try:
                    g = lean.with_shapes(dict(shapes))
                except Exception as exc:  # noqa: BLE001 - an estimate: a graph that will not pin counts none
                    log.debug("memory: no activation estimate for %s: %s", name, exc)
                    continue
                raw = pinned_store.load_fact(g.pinned_as, PEAK_FACT)
                if raw is None:  # worked out now (and kept for the next process)
                    raw = int(activation_peaks(g)[0])
                    pinned_store.store_fact(g.pinned_as, PEAK_FACT, raw)
                peak = int(raw * scale)
                if peak >= out.get(name, -1):
                    out[name], pinned[name] = peak, (part, name, dict(shapes), scale)
        return out, pinned

    def _calibrated(self, pinned: Mapping[str, Any], be: Any, dev: Any, held: Mapping[str, tuple[int, int, int]],
                    asked: Mapping[str, str]) -> dict[str, Any]:
        """``{part: sdrt.cost.footprint.PartFootprint}`` for the model's own parts on a CPU that ``sdrt selftest
        --calibrate`` measured for the part's backend and precision, at the part's heaviest call (``pinned``, from
        ``_activations``). Not for parts whose weights the backend runs as their file stores them (a GGUF file's
        blocks, a float16 checkpoint's pages: ``held``), quantized ones, or parts asked onto another device: the
        calibration did not measure those, and their fixed footprint stands."""
        from ..cost.footprint import part_footprint
        from ..cost.model import is_calibrated, load_calibration

        if getattr(dev, "kind", "cpu") != "cpu":
            return {}
        cal = load_calibration()  # read once for every part
        if not is_calibrated(be.name, "cpu", cal):
            return {}
        roles = self.family.parts  # type: ignore[attr-defined]
        out = {}
        for name, (owner, gname, shapes, _) in pinned.items():
            part = self._parts.get(name)
            h, stored, narrow = held.get(name, (0, 0, 0))
            if (part is None or not h or stored or narrow or part.options.get("quantize")
                    or ":" in asked_place(name, roles.get(name, ""), asked)):
                continue
            precision = part.options.get("precision") or be.precision_for(dev)
            try:
                graph = self._run_graph(gname, owner).with_shapes(dict(shapes))
            except Exception as exc:  # noqa: BLE001 - an estimate: the fixed footprint then
                log.debug("memory: %s not costed: %s", name, exc)
                continue
            found = part_footprint(graph, dict(shapes), be.name, precision, cal)
            if found is not None:
                out[name] = found
        return out

    @staticmethod
    def _run_graph(name: str, part: Part) -> Any:
        """The graph a part runs: the file's, with the part's edit where the part has not loaded it yet (a dry
        twin's IP attention, a transformer's ControlNet residual inputs: the file's graph lacks the inputs it is
        fed)."""
        lean = _lean_graph(part)
        if part._graph is None and part.graph_edit is not None:
            try:
                lean = part.graph_edit(lean)
            except Exception as exc:  # noqa: BLE001 - an estimate: the file's graph then
                log.debug("memory: %s's graph edit for the activation estimate: %s", name, exc)
        return lean

    def _make_memory_plan(self, base: int | None, calls: Mapping[str, Any] | None = None,
                          extras: Mapping[str, tuple[str, Any]] | None = None,
                          twins: Mapping[str, Part] | None = None,
                          beside: Mapping[str, Iterable[str]] | None = None) -> MemoryPlan:
        from ..errors import SdrtError
        from ..runtime import select

        try:
            be, dev = select(self.backend, self.device)  # type: ignore[attr-defined]
            kept = be.weight_blocks()
        except SdrtError:  # a dry plan with no backend here (sdrt plan for another device): no device figure
            be, dev, kept = None, None, frozenset()
        accelerator = getattr(dev, "kind", "cpu") in ("gpu", "npu")
        asked = getattr(self, "placement", None) or {}
        host = cpu_host(be) if accelerator or any(":" in v for v in asked.values()) else None
        if base is None:
            base = current_rss() if not accelerator else 0
        denoiser = self.family.denoiser_part  # type: ignore[attr-defined]
        extras = dict(extras or {})
        # the run's parts besides the model's own: ControlNets and an image encoder (dry twins: graph and weights
        # as the run binds them), the hires fix's model upscaler (its file's tensors, run in float32)
        # and each model-backed preprocessor's detector (its file's tensors in float32: it makes the maps first)
        # and each T2I style adapter's arrays (its file's tensors in float32, held by numpy: footprint 1)
        parts = {**self._parts, **{n: e for n, (r, e) in extras.items() if r not in FILE_ROLES}}
        held = {name: part_memory(p, kept) for name, p in parts.items()}
        held.update({n: (upscaler_bytes(e), 0, 0) for n, (r, e) in extras.items() if r in ("upscaler", "style_adapter")})
        held.update({n: (e.weight_bytes(), 0, 0) for n, (r, e) in extras.items() if r == "preprocessor"})
        weights = {name: h for name, (h, _, _) in held.items()}
        # a part's stored blocks run from the mapped file (footprint 1); its float weights take FOOTPRINT (the
        # mapped file's pages and the backend's copy), less what their file stores narrower than the graph
        footprints = {name: (FOOTPRINT * (h - s) + s - n) / h for name, (h, s, n) in held.items() if (s or n) and h}
        footprints.update({n: DETECTOR_FOOTPRINT for n, (r, _) in extras.items() if r == "preprocessor"})
        footprints.update({n: 1.0 for n, (r, _) in extras.items() if r == "style_adapter"})
        if self.memory is not None:
            budget, source = self.memory, "memory="
        else:
            budget = available_memory(dev)
            source = memory_source(dev, budget)

        # the activations from the dry run's twins where given: their graphs as the run edits them
        activations, pinned = self._activations(calls, be, dev, {**parts, **(twins or {})}) if calls else ({}, {})
        # on a CPU calibrated for the part's backend and precision: the cost model's need and what the part keeps
        calibrated = {} if accelerator or be is None else self._calibrated(pinned, be, dev, held, asked)
        keeps: dict[str, float] = {}
        for name, cf in calibrated.items():
            footprints[name] = max(cf.peak_bytes, 1.0) / weights[name]
            activations[name] = 0  # the cost model's peak counts them
            keeps[name] = cf.resident_bytes
            base = max(base, int(cf.base_bytes))  # the runtime's base as calibrated: its libraries loaded

        def split_at(cap: int) -> list[Any]:
            from .streaming import activation_peaks, split

            part = self._parts[denoiser]
            scale = part_weight_bytes(part) / max(weights[denoiser], 1)  # graph bytes per held byte
            if denoiser in pinned:  # each group with its own activations (the heaviest call's graph pinned now)
                owner, name, shapes, half = pinned[denoiser]
                graph = self._run_graph(name, owner).with_shapes(shapes)
                groups = split(graph, max_weight_bytes=int(cap * scale))
                return [(int(g.weight_bytes / scale), int(a * half))
                        for g, a in zip(groups, activation_peaks(graph, groups))]
            graph = _lean_graph(part)
            return [int(g.weight_bytes / scale) for g in split(graph, max_weight_bytes=int(cap * scale))]

        give_back()  # the graphs read for their sizes go again
        roles = {**self.family.parts, **{n: r for n, (r, _) in extras.items()}}  # type: ignore[attr-defined]
        host_dev = host[1] if host is not None else None
        host_budget = available_memory(host_dev) if host_dev is not None else None
        plan = plan_placed(weights, roles, denoiser if denoiser in weights else None, budget, base=base,
                           accelerator=accelerator, device=f"{dev.backend}:{dev.id}" if dev is not None else "",
                           host=f"{host_dev.backend}:{host_dev.id}" if host_dev is not None else None,
                           host_budget=host_budget, host_base=current_rss(), asked=asked,
                           budget_source=source, host_budget_source=memory_source(host_dev, host_budget),
                           release_all=bool(self.low_memory) or False, split=split_at, footprints=footprints,
                           activations=activations, beside=beside, keeps=keeps)
        plan.calibrated = {name: cf.source for name, cf in calibrated.items()}
        for pl in plan.parts:
            pl.role = extras[pl.part][0] if pl.part in extras else ""
        self._hosts = {} if host is None else {f"{host[1].backend}:{host[1].id}": host}
        return plan

    def _apply_memory_plan(self, calls: Mapping[str, Any] | None = None,
                           check: Callable[[MemoryPlan], None] | None = None,
                           extras: Mapping[str, tuple[str, Any]] | None = None,
                           beside: Mapping[str, Iterable[str]] | None = None) -> None:
        """Tell the parts the plan: released and streamed ones keep their external data mapped; a streamed
        one compiles group by group (``Part.stream_bytes``); a part placed on another device compiles there.
        ``calls``: this job's input shapes per part (the plan is made again, with activations, when they change);
        ``check(plan)`` may refuse the job first (before anything is told or said); ``extras``: the job's parts besides
        the model's own (``memory_plan``), and ``beside`` what runs beside what. Starts the first stage's peak."""
        key = None if calls is None else (calls, sorted(extra_identity(n, r, e) for n, (r, e) in (extras or {}).items()),
                                          sorted((k, tuple(v)) for k, v in (beside or {}).items()))
        if key is not None and key != getattr(self, "_memory_calls", None):
            made = getattr(self, "_memory_plan", None)  # the process's base as first measured (or given) stays
            plan = self.memory_plan(base=made.base_bytes if made is not None else None, calls=calls, extras=extras,
                                    beside=beside)
            self._memory_calls = key
        else:
            plan = self.memory_plan()
        if check is not None:
            check(plan)
        gone = [p.part for p in plan.parts if p.placement == "released"]
        if gone and not self.low_memory and plan is not getattr(self, "_told_plan", None):  # why, once per plan
            log.info("memory: %s released after use; %s", ", ".join(gone), plan.format().splitlines()[0].removeprefix(
                "memory: "))
        self._told_plan = plan
        for p in plan.parts:
            control = getattr(self, "control_parts", {}).get(p.part)  # a ControlNet released after its last pass
            if control is not None:
                control.lazy_external = control.lazy_external or p.placement != "resident" or bool(self.low_memory)
            part = self._parts.get(p.part)
            if part is not None and p.device:
                self._place(part, p.device)
            if part is None or p.placement == "resident":
                continue
            part.lazy_external = True
            # the cap is in held bytes; the split counts the graph's (float32) initializer bytes
            cap = int(p.cap_bytes * part_weight_bytes(part) / max(p.weight_bytes, 1))
            if p.placement == "streamed" and part.stream_bytes != cap:
                part.close()  # a whole-graph session of an earlier plan goes
                part.stream_bytes = cap
                part.stream_share = bool(getattr(self, "share_blocks", False))
                log.info("memory: %s streams in %d group(s) of <= %s of weights (budget %s)", p.part, len(p.groups),
                         _size(p.cap_bytes), _size(plan.budget_bytes or 0))
        if not plan.fits:
            log.warning("memory: the plan does not fit the budget:\n%s", plan.format())
        self._stage_peaks = {}
        self._stage_started()

    def _release_preprocessors(self) -> None:
        """Close the job's model-backed preprocessor detectors the plan releases (``preprocessor:<kind>``): the maps
        are made (``_prepare``), before the denoiser loads; one another thread uses stays (``preprocessors.held``)."""
        for name, (role, extra) in (getattr(self, "_job_extras", None) or {}).items():
            if role == "preprocessor" and self._releases_extra(name):
                from .preprocessors import release

                if release(extra.kind, extra.files):
                    log.info("memory: %s closed once its maps were made", name)

    def _releases_extra(self, name: str) -> bool:
        """Whether a part the run uses besides the model's own (a ControlNet, the hires fix's model upscaler) is
        released once its last use in the run is over: in low-memory mode, or when the plan places it released (a
        plan that does not list it: when it releases any part)."""
        if self.is_low_memory:  # type: ignore[attr-defined]
            return True
        plan = getattr(self, "_memory_plan", None)
        if plan is None:
            return False
        placed = plan.placement(name)
        return placed.placement != "resident" if placed is not None else any(p.placement != "resident"
                                                                             for p in plan.parts)

    def _place(self, part: Part, device: str) -> None:
        """Compile ``part`` on ``device`` (``"openvino:CPU"``) from now on; options go with it only on its own
        backend (another backend's options are not this one's)."""
        from ..runtime import select

        found = getattr(self, "_hosts", {}).get(device)
        be, dev = found if found is not None else select("auto", device)
        if part.device is dev and part.backend == be.name:
            return
        part.close()  # a session compiled on the other device goes
        if be.name != part.backend:  # quantize= is sdrt's own; a precision goes along where that backend has it
            part.options = {k: v for k, v in part.options.items()
                            if k == "quantize" or (k == "precision" and v in (be.precisions or {"fp32": {}}))}
        part.backend, part.device = be.name, dev
        log.info("memory: %s runs on %s", part.name, dev)

    def _stage_started(self) -> None:
        # Restarting VmHWM also restarts what the OS reports as the process's peak (ru_maxrss, /usr/bin/time),
        # so it happens only when the caller set a budget (memory=); otherwise stages read the whole process.
        self._peak_reset = self.memory is not None and reset_peak()  # type: ignore[attr-defined]

    def _releases(self, names: Iterable[str], stage: bool = False) -> list[str]:
        """Of ``names``, the parts the plan releases after use; a ``stage`` end records its measured peak."""
        names = list(names)
        peaks = getattr(self, "_stage_peaks", None)
        if stage and peaks is not None:
            peak, source = peak_rss()
            label = "+".join(n for n in names if n in self._parts and self._parts[n].sessions) or None
            if label and peak:
                peaks[label] = max(peaks.get(label, 0), peak)
                self._peak_source = source if getattr(self, "_peak_reset", False) else f"{source}, whole process"
        plan = getattr(self, "_memory_plan", None)
        if plan is None:
            return []
        return [n for n in names if (pl := plan.placement(n)) is not None and pl.placement != "resident"]

    def _measured(self) -> MemoryPlan | None:
        """The plan with this job's measured peak per stage."""
        plan = getattr(self, "_memory_plan", None)
        if plan is None:
            return None
        plan.measured = dict(getattr(self, "_stage_peaks", None) or {})
        plan.measured_source = getattr(self, "_peak_source", "")
        return plan
