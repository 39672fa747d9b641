"""The time and memory model: a roofline per op class, with efficiency factors that measurements fit.

Uncalibrated (the device kinds' round defaults, below), a node of class ``c`` takes
``overhead[c] + max(flops / peak, bytes / bandwidth) / efficiency[c]`` seconds (a fused elementwise
epilogue: ``flops / peak``), where ``peak`` is the device's dense FLOP/s at the precision. Calibrated
(``sdrt selftest --calibrate`` on this machine's CPU, ``sdrt.cost.calibrate``), the terms add, as on a
CPU that moves data while it computes: ``overhead + flops / (peak x efficiency[timing class]) +
activation bytes / (bandwidth x its efficiency: convs, data movement and the rest apart) + weight
bytes / (bandwidth x the weights' efficiency: 3x3-and-wider conv kernels apart)``, an epilogue's bytes at their own efficiency, and a
fixed cost per call. A part's peak memory is the larger of two phases (``memory_phases``): compiling,
``compile factors x weights (conv kernels, lookup tables, small tensors apart) + transient factors x the
largest conv kernel and the largest other weight + the inputs``, and running, ``factors x the weights as
held + what compiling small tensors left + activation_factor x the activations the run adds + the
outputs``, each ``+ node_bytes x nodes + base``, with their own weight factors for a graph compiled with
dynamic dims; calibrated, ``base`` is the whole process's runtime base, so the figure is the process's
peak resident memory. An older (one-phase) calibration adds weights, transients and activations.
The factors belong to a (backend, device kind, precision) triple and are stored in sdrt's cache folder
(``calibration/calibration.json``); where no calibration exists, the defaults stand in and the plan
says it is uncalibrated.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .devices import DeviceSpec
from .nodes import VIEW_OPS, GraphCost

log = logging.getLogger("sdrt.cost")

#: the most float32 weight bytes that a backend making a half copy of file-mapped weights holds at once: OpenVINO's bf16
#: twin hands the pages it read back every 256 MiB (``sdrt_openvino.bf16``); a smaller graph holds all of them
HALF_COPY_CHUNK_BYTES = 256 * 2**20

#: the timing classes, each with a FLOPs efficiency of its own (``sdrt.cost.nodes``: a time class that a calibration
#: lacks, ``matmul_narrow`` or ``conv_large`` in one stored before it, takes its op class's)
TIME_CLASSES = ("matmul", "matmul_narrow", "conv", "conv_large", "conv1x1", "dwconv", "attention", "softmax", "norm",
                "groupnorm", "elementwise", "data")
#: time classes that a calibration may lack (its cases had none of them): their nodes take their op class's efficiency
OPTIONAL_CLASSES = ("matmul_narrow", "conv_large")
#: the timing classes of dense convs wider than 1x1: kernels read per image, kept transformed or repacked
DENSE_CONVS = ("conv", "conv_large")
#: the conv time classes a half precision runs in half kernels on a backend that keeps activations float32
HALF_CONVS = (*DENSE_CONVS, "conv1x1")


@dataclass
class Factors:
    """Efficiency per op class (fraction of the roofline reached), fixed cost per node (s), memory factors."""

    efficiency: dict[str, float]
    overhead_s: dict[str, float]
    weight_factor: float = 1.0
    activation_factor: float = 1.0
    base_bytes: float = 0.0
    calibrated: bool = False
    bandwidth_bytes_per_s: float | None = None  # measured, for CPUs
    source: str = "defaults"
    fit: dict[str, Any] = field(default_factory=dict)
    #: attention runs as one fused kernel (flash attention: the scores never reach memory), so its
    #: matmuls and softmax cost their FLOPs only; calibrated CPU factors measure the backend as it is
    fused_attention: bool = False
    #: calibrated factors add the compute and memory terms (``flops / (peak x efficiency[c]) + bytes /
    #: (bandwidth x bandwidth_efficiency)``), as a CPU that streams weights from memory while it computes
    #: does; the defaults take the larger of the two (the classic roofline)
    additive: bool = False
    bandwidth_efficiency: float = 1.0
    #: calibrated: activation traffic of data-movement nodes (transposes, resizes, concats: strided copies)
    data_bandwidth_efficiency: float = 1.0
    #: calibrated: the layout copies of narrow convs' outputs that a Reshape regroups across channels
    #: (``GraphCost.relayout_bytes``: 17-127 channels, ``relayout_narrow_bytes``: 16 or fewer); None: no such cost
    relayout_bandwidth_efficiency: float | None = None
    relayout_narrow_bandwidth_efficiency: float | None = None
    #: calibrated at a half precision: the graph's inputs and outputs (``GraphCost.io_bytes``), which the runtime
    #: converts from and to float32 every call (OpenVINO's and ggml's bf16 take and give float32); None: no such cost
    io_bandwidth_efficiency: float | None = None
    #: calibrated on a device with memory of its own (a GPU): the graph's inputs and outputs cross between the host's
    #: memory and the device's every call, at any precision (``io_bandwidth_efficiency`` is then that copy's)
    host_transfers: bool = False
    #: calibrated on a GPU: the traffic of dense convs run through im2col (``GraphCost.im2col_bytes``, written and read);
    #: None: no such cost
    im2col_bandwidth_efficiency: float | None = None
    #: the memory a GPU runtime that convolves through im2col holds for the largest conv's buffer
    #: (``GraphCost.largest_im2col_bytes``; 1 for ggml on a GPU, whose compute buffer holds it beside the activations)
    im2col_memory_factor: float = 0.0
    #: calibrated: activation traffic of attention's matmuls and softmax (the scores); None: ``bandwidth_efficiency``
    attention_bandwidth_efficiency: float | None = None
    #: calibrated: activation traffic of convs (a conv over few channels pays per pixel, not per FLOP)
    conv_bandwidth_efficiency: float | None = None
    #: memory held per byte of conv kernels where it differs from ``weight_factor`` (a backend that keeps
    #: them transformed or repacked); None: ``weight_factor``
    conv_weight_factor: float | None = None
    #: dense conv kernels (wider than 1x1) whose convs write at most this many output pixels an image are held as
    #: stored, with the other weights' factors, not ``conv_weight_factor``'s: the backend's routes for small maps
    #: (``Backend.plain_conv_pixels``: ggml's implicit GEMM and cols routes, where larger maps take Winograd and hold
    #: its transformed kernels, 16/9 of a 3x3 kernel). 0: every such kernel with the conv factors
    plain_conv_pixels: int = 0
    #: memory per compiled node (a runtime's per-node kernels and descriptors), bytes
    node_bytes: float = 0.0
    #: calibrated: weight traffic (a matmul at few rows streams its weights; a CPU packs them per call);
    #: None in an older calibration that had one traffic term
    weight_bandwidth_efficiency: float | None = None
    #: calibrated: weight traffic of dense conv kernels wider than 1x1 (a Winograd conv reads its kernel
    #: transformed, 16/9 x as large, every call: on a small map that, not the FLOPs, is its time); None: the
    #: weights' efficiency (an older calibration)
    conv_weight_bandwidth_efficiency: float | None = None
    #: calibrated: the same kernels' traffic for each image after the first (a conv that loops over the
    #: batch outside its kernel loop reads the kernel once per image); None: once per call
    conv_weight_batch_bandwidth_efficiency: float | None = None
    #: calibrated: traffic of elementwise epilogues (0: fused for free, as a compiler that fuses does)
    fused_bandwidth_efficiency: float = 0.0
    #: calibrated: the arithmetic of elementwise epilogues, as a fraction of the peak (a fused SiLU still computes
    #: its exponentials); None: at the peak (an older calibration)
    fused_flops_efficiency: float | None = None
    #: fixed time of one call of a compiled part (input/output copies, dispatch), seconds
    call_s: float = 0.0
    #: calibrated: seconds per row of an attention's softmax (``NodeCost.rows``: one per query, head and image), a fused
    #: attention kernel's work per query row whatever the row's length (cross-attention over 77 text tokens: few scores
    #: a row, OpenVINO's bf16 0.55 ns a score where self-attention over 1024 took 0.17)
    attention_row_s: float = 0.0
    #: memory per byte of lookup tables (weights that Gather reads: token embeddings); None: ``weight_factor``
    table_factor: float | None = None
    #: memory per byte of the largest conv kernel and of the largest other weight: the compile-time transient
    transient_conv_factor: float = 0.0
    transient_factor: float = 0.0
    #: calibrated: ``base_bytes`` is the whole process's runtime base (the interpreter, sdrt, the backend's
    #: libraries and per-op-kind code, measured after compiling a graph of every op kind), and
    #: ``imports_bytes`` what the process held after importing sdrt, before the backend compiled anything
    process_base: bool = False
    #: calibrated: the runtime runs attention as one fused kernel, so its scores take no memory
    #: (``GraphCost.peak_activation_bytes_fused``)
    fused_attention_memory: bool = False
    imports_bytes: float = 0.0
    #: calibrated: activations counted with elementwise nodes in place (``GraphCost.peak_activation_bytes_inplace``)
    inplace_activations: bool = False
    #: calibrated: seconds per node of shape arithmetic in a graph compiled with dynamic dims (the runtime
    #: infers shapes and runs those nodes every call); 0 for a runtime that pins the shapes
    shape_node_s: float = 0.0
    #: calibrated: seconds per timed node of a graph compiled with dynamic dims (shapes inferred every call)
    dynamic_node_s: float = 0.0
    #: calibrated in two phases (the child's peak reset between compiling and the runs): the peak is the larger
    #: of the compile phase's, ``compile_*`` factors x the weights (conv kernels, lookup tables apart) + the
    #: transients + ``compile_input_factor`` x the graph's inputs (held while it compiles), and the run phase's,
    #: the weights as held after compiling (``weight_factor`` ...) + ``activation_factor`` x the activations
    #: the run adds (the live peak less the inputs) + ``output_factor`` x the outputs (the runtime's buffers and
    #: the arrays handed back); both + ``node_bytes`` x nodes + ``base_bytes``. None: one phase (an older
    #: calibration)
    compile_weight_factor: float | None = None
    compile_conv_weight_factor: float = 0.0
    compile_table_factor: float = 0.0
    compile_input_factor: float = 0.0
    output_factor: float = 0.0
    #: the run phase's bytes per byte of small weights (``GraphCost.small_weight_bytes``) on top of the weights as
    #: held: what compiling them left in the C heap
    retained_factor: float = 0.0
    #: the compile phase's bytes per byte of small weights on top of the weights' factors (many small allocations)
    compile_small_factor: float = 0.0
    #: the run phase's bytes per byte of the largest layout copy (``GraphCost.largest_relayout_bytes``) in a graph
    #: compiled with dynamic dims: a runtime that runs narrow convs channels-last copies the maps it regroups for a norm
    #: (OpenVINO: a planar copy before the norm, one back to channels-last after it), and with dims dynamic it allocates
    #: them as it runs, beside the in-place activations (a static graph's memory plan shares their memory: the
    #: ``resblock_dyn`` case held 195 MiB, its static twin 165); None or 0: no such cost
    dynamic_relayout_memory_factor: float | None = None
    #: a graph compiled with dynamic dims (``GraphCost.dynamic``): weights and conv kernels per phase where the
    #: runtime prepares them differently (OpenVINO repacks a dynamic graph's weights at its first run, when the
    #: shapes are known, not while compiling); None: as a static graph's
    dynamic_compile_weight_factor: float | None = None
    dynamic_compile_conv_weight_factor: float | None = None
    dynamic_run_weight_factor: float | None = None
    dynamic_run_conv_weight_factor: float | None = None
    dynamic_compile_table_factor: float | None = None
    dynamic_run_table_factor: float | None = None
    #: ... and of matmuls with a fused activation (``GraphCost.epilogue_weight_bytes``): OpenVINO prepares those at
    #: a dynamic graph's first run (the others while compiling); None: as the other weights
    dynamic_compile_epilogue_weight_factor: float | None = None
    dynamic_run_epilogue_weight_factor: float | None = None
    #: calibrated at a half precision on a backend that keeps its activations float32 and makes only the matmul and
    #: conv weights half (ggml: ``sdrt_ggml.half``): activation traffic and memory count 4 bytes an element, not the
    #: precision's 2 (``activation_scale``)
    float32_activations: bool = False
    #: the compile phase's bytes per byte of float32 weights in flight while a half copy is made, at most
    #: ``HALF_COPY_CHUNK_BYTES`` of them at once (``GraphCost.half_source_bytes``), for a graph compiled with dynamic
    #: dims: OpenVINO's bf16 binds a bf16 copy of the file-mapped float32 weights (``sdrt_openvino.bf16.twin``) and hands
    #: their pages back every 256 MiB read; such a graph's weights are packed only at its first run. None or 0: none
    dynamic_compile_inflight_factor: float | None = None
    #: the runtime converts its weights one at a time as it lowers the nodes, in their order (ggml: each matmul's bf16
    #: panels, each kernel's Winograd transform, made as the node is lowered, their temporaries freed before the next):
    #: the compile transient is one weight's, less what the weights read after it hold (``transient_bytes``: a weight
    #: read early is covered by those after it; the full-size SD 1.5 UNet at bf16 held 3.06 x its weights compiling, the
    #: source pages and the copy, not the 0.36 GB of its largest kernel's temporaries). False: the largest conv kernel's
    #: and the largest other weight's transients add, wherever they come (an older calibration)
    sequential_transients: bool = False
    #: at a half precision the runtime keeps the graph's tail float32 (``sdrt.cost.nodes.float32_tail_values``: the nodes after
    #: the last conv, matmul or resize on the way to each output; OpenVINO's CPU plugin, for accuracy), so a graph
    #: without such ops runs wholly in float32 and its activations take 4 bytes an element, not 2
    #: (``GraphCost.peak_activation_bytes_tail``). False: every activation at the precision's bytes
    float32_tail: bool = False
    #: what pinning a part's shapes first adds to the process (``Graph.with_shapes``: shape inference and constant
    #: folding, their modules and heap; a pipeline pins every part, ``Part.session``): the one-node case's peak pinned
    #: less unpinned, in bytes. Counted once per process, by ``predict(pinned=True)`` and the planner
    pin_bytes: float = 0.0
    #: calibrated, on a backend that keeps activations float32 at a half precision (``float32_activations``): the
    #: efficiency of converting each weight matmul's float32 input to the half type before its half kernel
    #: (``GraphCost`` nodes' activation bytes read, as float32). sdrt-ggml's bf16 matmuls do so per call: the
    #: conversion is per input element, not per FLOP, so a fit without it charged the 320-640-wide calibration
    #: matmuls' conversions to the FLOPs and put the SDXL UNet, 640-5120 wide, at 1.31-1.46x its time. None or 100: none
    matmul_convert_bandwidth_efficiency: float | None = None
    #: calibrated, likewise: a half-precision dense conv's fixed cost a call, on top of a node's (``half_convs``)
    half_conv_node_s: float = 0.0
    #: calibrated on a CPU whose last-level cache is known (``DeviceSpec.cache_bytes``): the efficiency of reading
    #: weights from memory, on top of their other terms, for a part whose weights (lookup tables apart) pass what stays
    #: cached between calls (``stream_cache_bytes``), so that every call streams them (the ``mm_stream`` case, sized
    #: past the reported cache). The other cases' weights stay cached between their calls; without this term ggml's
    #: bf16 SD 1.5 UNet (1.7 GB) was predicted at 0.67 of its time at 128 px on a Xeon. None or 100: none
    stream_weight_bandwidth_efficiency: float | None = None
    #: the weight bytes past which a part streams them (``stream_weight_bandwidth_efficiency``): what the calibration's
    #: ladder of weight sizes found cached between calls (``calibrate.effective_cache``), at most the cache the OS
    #: reports; 0: the device's reported last-level cache (``DeviceSpec.cache_bytes``)
    stream_cache_bytes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Factors:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


#: round default efficiencies per device kind, used until calibrated
DEFAULTS: dict[str, Factors] = {
    "gpu": Factors({"matmul": 0.6, "conv": 0.5, "attention": 0.35, "norm": 0.6, "elementwise": 0.7, "data": 0.6},
                   {c: 8e-6 for c in TIME_CLASSES}, 1.0, 1.0, 400 * 2**20, fused_attention=True),
    "igpu": Factors({"matmul": 0.45, "conv": 0.4, "attention": 0.25, "norm": 0.5, "elementwise": 0.6, "data": 0.5},
                    {c: 15e-6 for c in TIME_CLASSES}, 1.0, 1.0, 300 * 2**20, fused_attention=True),
    "npu": Factors({"matmul": 0.35, "conv": 0.35, "attention": 0.15, "norm": 0.3, "elementwise": 0.4, "data": 0.3},
                   {c: 30e-6 for c in TIME_CLASSES}, 1.0, 1.0, 200 * 2**20),
    "cpu": Factors({"matmul": 0.5, "conv": 0.4, "attention": 0.3, "norm": 0.4, "elementwise": 0.5, "data": 0.4},
                   {c: 5e-6 for c in TIME_CLASSES}, 1.0, 1.0, 150 * 2**20),
}


def calibration_path() -> Path:
    from ..cache import cache_dir

    return cache_dir("calibration") / "calibration.json"


def _key(backend: str, kind: str, precision: str) -> str:
    return f"{backend}/{kind}/{precision}"


def load_calibration(path: Path | None = None) -> dict[str, Any]:
    """The stored calibration: ``{"entries": {"backend/kind/precision": Factors dict}, "device": ...}``."""
    p = path or calibration_path()
    try:
        data = json.loads(p.read_text())
    except (FileNotFoundError, NotADirectoryError):  # none yet, or a file where the cache folder goes (the compile
        return {"entries": {}}                       # cache says that once, naming SDRT_CACHE_DIR)
    except (OSError, ValueError) as exc:
        log.warning("ignoring the unreadable calibration %s: %s", p, exc)
        return {"entries": {}}
    return data if isinstance(data.get("entries"), dict) else {"entries": {}}


def save_calibration(entries: dict[str, Factors], device: dict[str, Any], path: Path | None = None) -> Path:
    """Merge ``entries`` into the stored calibration (atomically) and return its path. ``device``: the library spec
    (``DeviceSpec.to_dict``) they were measured on: this CPU (``"device"``), or a device of another kind
    (``"devices"``, one per kind: calibrating another GPU drops the entries of the one before)."""
    p = path or calibration_path()
    data = load_calibration(p)
    kind = device.get("kind", "cpu")
    if kind == "cpu":
        data["device"] = device
    else:
        held = data.setdefault("devices", {})
        if held.get(kind, {}).get("name") != device.get("name"):
            data["entries"] = {k: v for k, v in data["entries"].items() if k.split("/")[1:2] != [kind]}
        held[kind] = device
    data["entries"].update({k: f.to_dict() for k, f in entries.items()})
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, p)
    return p


def factors_for(backend: str, device: DeviceSpec, precision: str, calibration: dict[str, Any] | None = None
                ) -> Factors:
    """The factors for (backend, device kind, precision): calibrated ones when stored for this device (this
    machine's CPU, or the library device that ``sdrt selftest --calibrate --device`` measured), any precision of
    the backend if not this one, else the device kind's defaults."""
    cal = calibration if calibration is not None else load_calibration()
    entries = cal.get("entries", {})
    if calibrated_on(backend, device, cal):  # calibration describes this machine's devices only
        for key in (_key(backend, device.kind, precision), _key(backend, device.kind, "fp32")):
            if key in entries:
                return _at_peak(Factors.from_dict(entries[key]), cal, device, precision)
    return DEFAULTS.get(device.kind, DEFAULTS["gpu"])


def _at_peak(f: Factors, cal: dict[str, Any], device: DeviceSpec, precision: str) -> Factors:
    """Calibrated factors against ``device``'s peak of now. Their compute efficiencies are fractions of the peak the
    calibration assumed (its stored device); where this one differs (another FLOPs-a-cycle rule, as AVX-512 on
    AMD Zen 4's 256-bit units, or another clock reading) they scale by old / new, so predictions stay what was fitted."""
    stored = (cal.get("device") if device.kind == "cpu" else (cal.get("devices") or {}).get(device.kind)) or {}
    peaks = stored.get("peak_flops") if isinstance(stored, dict) else None
    if not isinstance(peaks, dict) or not peaks:
        return f
    try:
        old = DeviceSpec("", "", device.kind, 0, 1.0, {k: float(v) for k, v in peaks.items()}).peak(precision)
    except (TypeError, ValueError):
        return f
    new = device.peak(precision)
    if not old or not new or abs(old / new - 1.0) < 1e-9:
        return f
    r = old / new
    ff = f.fused_flops_efficiency
    return replace(f, efficiency={c: e * r if e < 100.0 else e for c, e in f.efficiency.items()},
                   fused_flops_efficiency=ff * r if ff and ff < 100.0 else ff)


def calibrated_on(backend: str, device: DeviceSpec, calibration: dict[str, Any] | None = None) -> bool:
    """Whether ``backend`` was calibrated on ``device``: this machine's CPU, or the library device that
    ``sdrt selftest --calibrate --device`` measured (``factors_for`` then returns measured factors)."""
    cal = calibration if calibration is not None else load_calibration()
    if not is_calibrated(backend, device.kind, cal):
        return False
    return device.source.startswith("sdrt.hardware.detect") or (
        device.kind != "cpu" and (cal.get("devices") or {}).get(device.kind, {}).get("name") == device.name)


def calibrated_precisions(backend: str, kind: str = "cpu", calibration: dict[str, Any] | None = None) -> set[str]:
    """The precisions that ``sdrt selftest --calibrate`` measured ``backend`` at on this machine's ``kind``."""
    cal = calibration if calibration is not None else load_calibration()
    return {k.split("/")[2] for k in cal.get("entries", {}) if k.count("/") == 2 and k.startswith(f"{backend}/{kind}/")}


def is_calibrated(backend: str, kind: str = "cpu", calibration: dict[str, Any] | None = None) -> bool:
    cal = calibration if calibration is not None else load_calibration()
    return any(k.startswith(f"{backend}/{kind}/") for k in cal.get("entries", {}))


def activation_scale(precision: str, f: Factors) -> float:
    """What the activation bytes costed at ``precision`` (``GraphCost``: 2 bytes an element at a half precision)
    are multiplied by for a runtime that keeps its activations float32 (``Factors.float32_activations``); else 1."""
    if not f.float32_activations:
        return 1.0
    from .nodes import ACT_BYTES

    return 4.0 / ACT_BYTES.get(precision, 4)


def tail_conversions(cost: GraphCost, precision: str, f: Factors) -> int:
    """The conversion nodes that a runtime keeping the graph's tail float32 (``Factors.float32_tail``) runs each call at a
    half precision: one per activation crossing between the tail and the half body (``GraphCost.tail_conversions``)."""
    return int(getattr(cost, "tail_conversions", 0)) if f.float32_tail and precision != "fp32" else 0


#: the floor on a fraction of the device's peak FLOP/s (a guard against a zero, not a bound on the figure): an
#: elementwise kernel runs at a tiny fraction of a matrix unit's peak, ggml's at bf16 at 4.2e-4 of the AMX peak on a
#: Xeon family 6 model 167 (2026-12-07), where a floor of 1e-3 predicted its float32 elementwise nodes 2.4x faster at
#: bf16 than at fp32 and the tiny SDXL VAE decoder at 0.69 of its measured time
MIN_FLOPS_EFFICIENCY = 1e-6


def node_time_s(op_class: str, flops: float, nbytes: float, device: DeviceSpec, precision: str, f: Factors,
                fused: bool = False, weight_bytes: float = 0.0, time_class: str | None = None, batch: int = 1
                ) -> float:
    """One node's predicted seconds. ``time_class`` refines ``op_class`` (``dwconv``, ``softmax``; their
    efficiency falls back to the op class's); ``weight_bytes`` is the part of ``nbytes`` that is weights;
    ``batch`` the images a conv processes."""
    if op_class == "view":
        return 0.0
    scale = activation_scale(precision, f)
    if scale != 1.0:  # the activations as the runtime holds them (float32)
        nbytes = weight_bytes + scale * (nbytes - weight_bytes)
    tc = time_class or op_class
    bw = f.bandwidth_bytes_per_s or device.bandwidth_bytes_per_s
    if fused:  # an epilogue: its arithmetic at the device's peak (calibrated: at a fitted fraction of it), and,
        # calibrated, its traffic as fitted
        t = flops / (device.peak(precision) * max(f.fused_flops_efficiency or 1.0, MIN_FLOPS_EFFICIENCY))
        if f.additive and f.fused_bandwidth_efficiency:
            return t + nbytes / (bw * f.fused_bandwidth_efficiency)
        return t
    if op_class == "attention" and f.fused_attention:
        nbytes = 0.0
    eff = max(f.efficiency.get(tc, f.efficiency.get(op_class, 0.5)), MIN_FLOPS_EFFICIENCY)
    if f.additive:
        t = f.overhead_s.get(tc, f.overhead_s.get(op_class, 0.0)) + flops / (device.peak(precision) * eff)
        if f.weight_bandwidth_efficiency is None:  # an older calibration: one traffic term
            return t + nbytes / (bw * max(f.bandwidth_efficiency, 1e-3))
        act_eff = (f.data_bandwidth_efficiency if op_class == "data" else f.conv_bandwidth_efficiency
                   if op_class == "conv" and f.conv_bandwidth_efficiency else f.attention_bandwidth_efficiency
                   if op_class == "attention" and f.attention_bandwidth_efficiency else f.bandwidth_efficiency)
        kernel = tc in DENSE_CONVS and bool(f.conv_weight_bandwidth_efficiency)
        w_eff = f.conv_weight_bandwidth_efficiency if kernel else f.weight_bandwidth_efficiency
        t += (nbytes - weight_bytes) / (bw * max(act_eff, 1e-3)) + weight_bytes / (bw * max(w_eff, 1e-3))
        if kernel and batch > 1 and f.conv_weight_batch_bandwidth_efficiency:
            t += (batch - 1) * weight_bytes / (bw * max(f.conv_weight_batch_bandwidth_efficiency, 1e-3))
        return t
    roof = max(flops / device.peak(precision), nbytes / bw)
    return f.overhead_s.get(tc, f.overhead_s.get(op_class, 0.0)) + roof / eff


@dataclass
class Prediction:
    ms: float
    peak_bytes: float
    weight_bytes: float
    activation_bytes: float
    by_class_ms: dict[str, float]
    calibrated: bool
    #: the two phases' peaks (both ``peak_bytes`` for a one-phase calibration or the defaults) and what the part
    #: holds once compiled, without activations or the base (its weights as the runtime keeps them, its nodes)
    compile_peak_bytes: float = 0.0
    run_peak_bytes: float = 0.0
    resident_bytes: float = 0.0


#: backends that make a matmul's operands dense before they multiply on a GPU (ggml's CUDA and Vulkan matmuls take
#: contiguous operands: ``ggml_cont``, sdrt_ggml.gpu), so that a head transpose there is a copy, not strides
DENSE_HEADS_GPU_BACKENDS = frozenset({"ggml"})


def copies_heads(backend: str, kind: str) -> bool:
    """Whether ``backend`` on a device of ``kind`` copies attention's head transposes (``NodeCost.head``) dense."""
    return kind != "cpu" and backend in DENSE_HEADS_GPU_BACKENDS


def timed_node(n: Any, dense: bool = False) -> bool:
    """Whether node ``n`` runs as a node of its own: not a view, nor a head transpose the backend runs as strides."""
    return n.op_class != "view" and (dense or not getattr(n, "head", False))


def memory_nodes(cost: GraphCost) -> int:
    """The nodes a runtime compiles (the view ops excluded), for the per-node memory term. A head transpose or a
    no-op Cast, free in time (views there), counts: the runtime reads it in and fuses it away while it compiles."""
    return sum(1 for n in cost.nodes if n.op not in VIEW_OPS)


def activation_bytes(cost: GraphCost, f: Factors) -> float:
    """The peak of live activations as the factors' runtime holds them (fused attention: without its scores)."""
    inplace = getattr(cost, "peak_activation_bytes_inplace", None)
    tail = getattr(cost, "peak_activation_bytes_tail", None)
    if f.inplace_activations and f.float32_tail and tail is not None:
        return tail
    if f.inplace_activations and inplace is not None:
        return inplace
    fused = getattr(cost, "peak_activation_bytes_fused", None)
    return fused if f.fused_attention_memory and fused is not None else cost.peak_activation_bytes


def conv_weight_bytes(cost: GraphCost, plain_pixels: int = 0) -> float:
    """The bytes of dense conv kernels wider than 1x1 among a part's weights (as their nodes read them): the
    kernels a backend may keep transformed (Winograd) or repacked beside the originals; those of convs on maps of at
    most ``plain_pixels`` output pixels (``Factors.plain_conv_pixels``) left out."""
    return min(cost.weight_bytes, sum(n.weight_bytes for n in cost.nodes if n.op_class == "conv"
                                      and n.time_class in DENSE_CONVS
                                      and not 0 < getattr(n, "pixels", 0) <= plain_pixels))


def held_order(cost: GraphCost, plain_pixels: int = 0) -> tuple[tuple[float, str], ...]:
    """``GraphCost.weight_order`` with the kernels of convs on maps of at most ``plain_pixels`` output pixels as
    plain weights (``Factors.plain_conv_pixels``)."""
    order = getattr(cost, "weight_order", ())
    px = getattr(cost, "weight_order_pixels", ())
    if not plain_pixels or len(px) != len(order):
        return order
    return tuple((size, "weight" if kind == "kernel" and 0 < p <= plain_pixels else kind)
                 for (size, kind), p in zip(order, px))


def largest_weights(cost: GraphCost, plain_pixels: int = 0) -> tuple[float, float]:
    """(the largest dense conv kernel, the largest other weight but a lookup table) in bytes, the kernels of convs
    on maps of at most ``plain_pixels`` output pixels counted with the other weights."""
    conv, other = getattr(cost, "largest_conv_bytes", 0.0), getattr(cost, "largest_weight_bytes", 0.0)
    order = getattr(cost, "weight_order", ())
    held = held_order(cost, plain_pixels)
    if held is order:
        return conv, other
    moved = [size for (size, kind), (_, now) in zip(order, held) if kind != now]
    return (max((size for size, kind in held if kind == "kernel"), default=0.0),
            max([other, *moved]))


def stream_candidate_bytes(cost: GraphCost) -> float:
    """A part's weight bytes that a call reads in full: lookup tables apart (a Gather reads only the rows looked up)."""
    return max(0.0, float(cost.weight_bytes) - float(getattr(cost, "table_bytes", 0.0)))


def past_cache(weight_bytes: float, cache_bytes: float) -> float:
    """Of ``weight_bytes`` read each call, those read from memory where ``cache_bytes`` stay cached between calls: all
    of them when they do not fit (0: an unknown cache), else none."""
    return weight_bytes if cache_bytes and weight_bytes > cache_bytes else 0.0


def streamed_bytes(cost: GraphCost, cache_bytes: float) -> float:
    """``past_cache`` of a part's ``stream_candidate_bytes``."""
    return past_cache(stream_candidate_bytes(cost), cache_bytes)


def streamed_weight_bytes(cost: GraphCost, device: DeviceSpec, f: Factors) -> float:
    """``streamed_bytes`` on ``device`` where its factors charge them (``Factors.stream_weight_bandwidth_efficiency``)."""
    eff = f.stream_weight_bandwidth_efficiency
    if not eff or eff >= 100.0 or device.kind != "cpu":
        return 0.0
    return streamed_bytes(cost, f.stream_cache_bytes or getattr(device, "cache_bytes", 0))


#: output channels below which a dense conv stays float32 at a half precision on a backend that keeps activations
#: float32: sdrt-ggml's ``conv_kernels.BF16_MIN_OC`` (under one 16-row tile, packing the columns costs more than the
#: bf16 products save), such as a VAE decoder's last conv to 3 channels
HALF_CONV_MIN_CHANNELS = 16


def half_convs(cost: GraphCost) -> int:
    """A part's dense convs (depthwise apart) of at least ``HALF_CONV_MIN_CHANNELS`` outputs (a conv whose channels
    the costs do not know counts): each a half-precision kernel's fixed cost a call on a backend that keeps
    activations float32 (``Factors.half_conv_node_s``)."""
    return sum(1 for n in cost.nodes if n.op_class == "conv" and not n.fused and n.time_class in HALF_CONVS
               and not 0 < getattr(n, "channels", 0) < HALF_CONV_MIN_CHANNELS)


def matmul_input_bytes(cost: GraphCost) -> float:
    """The activation bytes that a part's weight matmuls read (as its nodes count them): what a backend that keeps
    activations float32 at a half precision converts to the half type per call (``matmul_convert_ms``)."""
    return sum(n.bytes_read - n.weight_bytes for n in cost.nodes if n.op_class == "matmul" and n.weight_bytes)


def predict(cost: GraphCost, device: DeviceSpec, backend: str, precision: str, factors: Factors | None = None,
            pinned: bool = False) -> Prediction:
    """Predicted time of one call and peak memory of one part (its ``GraphCost``) on ``device``; ``pinned``: the
    process pinned the part's shapes before compiling it (``Factors.pin_bytes`` on both peaks), as a pipeline does."""
    f = factors or factors_for(backend, device, precision)
    dense = copies_heads(backend, device.kind)
    by: dict[str, float] = {}
    for n in cost.nodes:
        if not timed_node(n, dense):
            continue
        by[n.op_class] = by.get(n.op_class, 0.0) + node_time_s(n.op_class, n.timed_flops, n.bytes, device, precision, f,
                                                                 n.fused, n.weight_bytes, n.time_class, n.batch)
    rows = sum(getattr(n, "rows", 0) for n in cost.nodes) if f.attention_row_s else 0
    if rows:  # a fused attention's work per query row
        by["attention"] = by.get("attention", 0.0) + rows * f.attention_row_s
    if f.call_s:
        by["call"] = f.call_s
    bw = f.bandwidth_bytes_per_s or device.bandwidth_bytes_per_s
    scale = activation_scale(precision, f)
    relayout = sum(scale * b / (bw * e) for b, e in ((getattr(cost, "relayout_bytes", 0.0), f.relayout_bandwidth_efficiency),
                                             (getattr(cost, "relayout_narrow_bytes", 0.0),
                                              f.relayout_narrow_bandwidth_efficiency)) if b and e and e < 100.0)
    if relayout:
        by["relayout"] = relayout
    convert_eff = f.matmul_convert_bandwidth_efficiency
    if convert_eff and convert_eff < 100.0 and scale != 1.0:  # float32 activations into half matmuls
        by["matmul_convert"] = scale * matmul_input_bytes(cost) / (bw * convert_eff)
    if f.half_conv_node_s and scale != 1.0:  # half convs over float32 activations: a fixed cost each
        by["half_conv"] = f.half_conv_node_s * half_convs(cost)
    io_eff = f.io_bandwidth_efficiency
    if io_eff and io_eff < 100.0 and (precision != "fp32" or f.host_transfers):
        by["io"] = getattr(cost, "io_bytes", 0.0) / (bw * io_eff)
    im2col_eff = f.im2col_bandwidth_efficiency
    if im2col_eff and im2col_eff < 100.0 and getattr(cost, "im2col_bytes", 0.0):
        by["im2col"] = 2 * cost.im2col_bytes / (bw * im2col_eff)
    streamed = streamed_weight_bytes(cost, device, f)
    if streamed:  # weights past the cache, read from memory every call
        by["stream"] = streamed / (bw * f.stream_weight_bandwidth_efficiency)
    conversions = tail_conversions(cost, precision, f)
    if conversions:  # the float32 tail's conversions: a node each (their traffic, a copy in cache, left out)
        by["convert"] = conversions * f.overhead_s.get("data", 0.0)
    if getattr(cost, "dynamic", False) and (f.shape_node_s or f.dynamic_node_s):
        timed = sum(1 for n in cost.nodes if timed_node(n, dense) and not n.fused) + conversions
        by["shapes"] = f.shape_node_s * cost.dynamic_shape_nodes + f.dynamic_node_s * timed
    ms = 1000 * sum(by.values())
    activations = activation_bytes(cost, f) * scale
    compile_peak, run_peak, resident = memory_phases(without_mapped_tables(cost, MAPPED_TABLE_BACKENDS[backend]) if (
        backend in MAPPED_TABLE_BACKENDS and device.kind == "cpu") else cost, f)
    if pinned:
        compile_peak, run_peak = compile_peak + f.pin_bytes, run_peak + f.pin_bytes
    return Prediction(ms, max(compile_peak, run_peak), cost.weight_bytes, activations,
                      {k: 1000 * v for k, v in sorted(by.items(), key=lambda kv: -kv[1])}, f.calibrated,
                      compile_peak, run_peak, resident)


#: CPU backends that run a lookup table (a Gather's weights) from its mapped file where its offset is a multiple of
#: this, reading only the rows looked up (``GraphCost.mapped_tables``; ggml: ``sdrt_ggml.lower.Lowering.const``, else
#: it copies the table): ggml's SDXL text encoder 2 (its 253 MB token table at offset 0 of ``model.onnx_data``) held
#: 302 MiB (bf16) and 308 MiB (fp32) less than the model counted with the table resident, Xeon family 6 model 167,
#: 2026-12-07; CLIP-L's (inline in ``model.onnx``, offset 49 mod 64) is copied. OpenVINO copies every table.
MAPPED_TABLE_BACKENDS = {"ggml": 64}


def without_mapped_tables(cost: GraphCost, align: int) -> GraphCost:
    """``cost`` without the lookup tables a backend runs from their mapped file (``MAPPED_TABLE_BACKENDS``)."""
    sizes = [size for size, offset in getattr(cost, "mapped_tables", ()) if offset % align == 0]
    if not sizes:
        return cost
    import dataclasses

    mapped = sum(sizes)
    px = list(cost.weight_order_pixels)
    keep = []
    for i, (size, kind) in enumerate(cost.weight_order):
        if kind == "table" and size in sizes:
            sizes.remove(size)  # each mapped table's entry once
        else:
            keep.append(i)
    return dataclasses.replace(cost, weight_bytes=cost.weight_bytes - mapped,
                               table_bytes=max(0.0, cost.table_bytes - mapped),
                               weight_order=tuple(cost.weight_order[i] for i in keep),
                               weight_order_pixels=tuple(px[i] for i in keep) if len(px) == len(cost.weight_order)
                               else cost.weight_order_pixels, mapped_tables=())


def inflight_bytes(cost: GraphCost) -> float:
    """The float32 weight bytes in flight at once while a half copy of them is made (``HALF_COPY_CHUNK_BYTES``)."""
    return min(getattr(cost, "half_source_bytes", 0.0), float(HALF_COPY_CHUNK_BYTES))


def transient_bytes(cost: GraphCost, f: Factors, conv_factor: float = 0.0, other_factor: float = 0.0,
                    table_factor: float = 0.0, table_transient: float = 0.0) -> float:
    """The bytes a runtime holds in flight while it transforms or repacks weights at compile time, on top of the
    weights' own factors: ``transient_conv_factor`` x the largest conv kernel + ``transient_factor`` x the largest
    other weight; with ``Factors.sequential_transients`` (weights converted one at a time in the nodes' order,
    ``GraphCost.weight_order``), the largest over the weights of one weight's transient less what the weights read
    after it hold compiling (``conv_factor`` x kernels, ``table_factor`` x lookup tables, ``other_factor`` x the rest):
    the compile peak comes where the sum of held weights and one transient is largest, and a weight read early is
    covered by those after it. A lookup table is kept as stored; its transient, ``table_transient`` x its bytes, is the
    source it is copied from (the file's pages, handed back once it is copied)."""
    order = held_order(cost, f.plain_conv_pixels)
    if not (f.sequential_transients and order):
        conv, other = largest_weights(cost, f.plain_conv_pixels)
        return f.transient_conv_factor * conv + f.transient_factor * other
    worst = after = 0.0
    for size, kind in reversed(order):
        if kind == "table":  # kept as stored: its source in flight while it is copied
            worst = max(worst, table_transient * size - after)
            after += table_factor * size
            continue
        worst = max(worst, (f.transient_conv_factor if kind == "kernel" else f.transient_factor) * size - after)
        after += (conv_factor if kind == "kernel" else other_factor) * size
    return worst


def memory_phases(cost: GraphCost, f: Factors) -> tuple[float, float, float]:
    """(compile phase's peak, run phase's peak, resident once compiled) of one part, in bytes (the peaks with
    ``base_bytes``). The process's peak is the larger peak: a runtime that transforms its weights while
    compiling (ggml's Winograd kernels: 4-8 x a 3x3 kernel in flight) peaks there, and its activations come
    later, in memory the compile left; one that defers the work to the first run peaks there."""
    scale = activation_scale(getattr(cost, "precision", "fp32"), f)  # float32 activations at a half precision
    conv_w = conv_weight_bytes(cost, f.plain_conv_pixels) if f.conv_weight_factor is not None else 0.0
    table = min(getattr(cost, "table_bytes", 0.0), cost.weight_bytes - conv_w) if f.table_factor is not None else 0.0
    other = cost.weight_bytes - conv_w - table
    nodes = f.node_bytes * memory_nodes(cost)
    live = scale * activation_bytes(cost, f)
    inputs, outputs = scale * getattr(cost, "input_bytes", 0.0), scale * getattr(cost, "output_bytes", 0.0)
    dyn = bool(getattr(cost, "dynamic", False))

    def pick(dynamic: float | None, static: float) -> float:
        return dynamic if dyn and dynamic is not None else static

    # a lookup table while compiling: ``compile_table_factor`` x its bytes, fitted on a case that holds the table alone
    # (``embedding``). A backend that copies its weights one at a time (ggml) holds the copy it keeps, as it runs
    # (``table_factor``), and the rest of that is the source in flight while the table is copied, handed back before the
    # weights after it are read: CLIP's text encoders peaked 145 MiB (their token table) under a held 2.1 x the table
    # (fp32 on Zen 5), the table being their first weight
    table_c = pick(f.dynamic_compile_table_factor, f.compile_table_factor)
    order = getattr(cost, "weight_order", ())
    table_held = min(table_c, pick(f.dynamic_run_table_factor, f.table_factor or 0.0)) if (
        f.sequential_transients and order and f.table_factor is not None) else table_c
    transient = transient_bytes(cost, f, pick(f.dynamic_compile_conv_weight_factor, f.compile_conv_weight_factor),
                                pick(f.dynamic_compile_weight_factor, f.compile_weight_factor or 0.0),
                                table_held, table_c - table_held)

    # a dynamic graph's matmuls with a fused activation, where the factors tell them apart
    epi = min(getattr(cost, "epilogue_weight_bytes", 0.0), other) if dyn and (
        f.dynamic_run_epilogue_weight_factor is not None) else 0.0
    other -= epi
    run_w = (pick(f.dynamic_run_epilogue_weight_factor, 0.0) * epi + pick(f.dynamic_run_weight_factor, f.weight_factor) * other
             + pick(f.dynamic_run_conv_weight_factor, f.conv_weight_factor or 0.0) * conv_w
             + pick(f.dynamic_run_table_factor, f.table_factor or 0.0) * table)
    if f.compile_weight_factor is None:  # one phase: weights, transients and activations add
        peak = run_w + transient + f.activation_factor * live + nodes + f.base_bytes
        return peak, peak, run_w + nodes
    run_peak = run_w + f.output_factor * outputs + nodes + f.base_bytes + f.im2col_memory_factor * getattr(
        cost, "largest_im2col_bytes", 0.0) + (
        f.retained_factor * getattr(cost, "small_weight_bytes", 0.0)) + (
        pick(f.dynamic_relayout_memory_factor, 0.0) * scale * getattr(cost, "largest_relayout_bytes", 0.0)) + (
        f.activation_factor * max(0.0, live - inputs))
    compile_w = (pick(f.dynamic_compile_epilogue_weight_factor, 0.0) * epi
                 + pick(f.dynamic_compile_weight_factor, f.compile_weight_factor) * other
                 + pick(f.dynamic_compile_conv_weight_factor, f.compile_conv_weight_factor) * conv_w)
    # the float32 pages read while a half copy is made are handed back before the runtime compiles it, reads the lookup
    # tables and transforms kernels: the larger of the two is in flight, not both
    inflight = pick(f.dynamic_compile_inflight_factor, 0.0) * inflight_bytes(cost)
    compiling = table_held * table + transient
    compile_peak = (compile_w + max(inflight, compiling) + f.compile_input_factor * inputs + nodes
                    + f.compile_small_factor * getattr(cost, "small_weight_bytes", 0.0) + f.base_bytes)
    return compile_peak, run_peak, run_w + f.retained_factor * getattr(cost, "small_weight_bytes", 0.0) + nodes
