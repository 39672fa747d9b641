"""Plans: which backend, precision and offload a model would run with on a device, and how fast.

``plan_parts`` turns a model into parts with shapes: a pipeline folder through its run plan
(``Pipeline.plan``: every part, its call signatures and counts), a single ``.onnx`` as one part named
after the file. ``make_plan`` costs every part (``sdrt.cost.nodes``), predicts each candidate (backend,
precision, offload) on the device (``sdrt.cost.model``), and picks, among the candidates whose peak
memory fits the budget, the best by quality tier (full precision, then 8-bit, then 4-bit) and then by
predicted time per image; the next one is the runner-up.

Offload kinds: ``none`` keeps every part resident; ``parts`` keeps one part resident at a time (as
``Pipeline(low_memory=True)`` does) and loads each part's weights once per image; ``stream`` (discrete
GPUs) keeps weights in host memory and streams each call's weights over PCIe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SdrtError
from .devices import DeviceSpec
from .model import Factors, calibrated_on, calibrated_precisions, factors_for, load_calibration, predict
from .nodes import GraphCost, graph_costs
from .shapes import single_file_shapes

log = logging.getLogger("sdrt.cost")

#: which precisions each backend can run (its plugin's vocabulary)
BACKEND_PRECISIONS = {
    "trt": ("fp32", "fp16", "bf16", "fp8", "int8"),
    "migraphx": ("fp32", "fp16", "int8"),
    "openvino": ("fp32", "fp16", "bf16", "int8"),
    "coreml": ("fp32", "fp16"),
    "ggml": ("fp32", "fp16", "bf16", "q8_0", "q4_0"),
}
TIER = {"fp32": 0, "fp16": 0, "bf16": 0, "fp8": 1, "int8": 1, "q8_0": 1, "q5_0": 2, "q4_0": 2, "q4_k": 2, "nf4": 2}
PCIE_BYTES_PER_S = 12e9  # PCIe 4.0 x16, as achieved
DISK_BYTES_PER_S = 2e9  # NVMe read of a part's weights


#: the NVIDIA architectures TensorRT-RTX builds for (RTX GPUs: compute 7.5, 8.x, 12.x); not the data-centre Hopper
TRT_RTX_ARCHS = frozenset({"turing", "ampere", "ada", "blackwell"})


def backends_for(device: DeviceSpec) -> list[str]:
    """The sdrt backends that can run on a device of this vendor and kind."""
    if device.kind == "cpu":
        return ["openvino", "ggml"] if device.vendor in ("intel", "amd") else ["ggml"]
    nvidia = ["trt", "ggml"] if device.extra.get("arch", "ampere") in TRT_RTX_ARCHS else ["ggml"]
    return {"nvidia": nvidia, "amd": ["migraphx", "ggml"] if device.kind != "npu" else [],
            "intel": ["openvino", "ggml"] if device.kind != "npu" else ["openvino"],
            "apple": ["coreml", "ggml"]}.get(device.vendor, ["ggml"])


def precisions_for(backend: str, device: DeviceSpec, calibration: dict[str, Any] | None = None) -> list[str]:
    """The precisions worth planning for ``backend`` on ``device``: the backend's vocabulary, less what the
    device has no rate for. On CPUs, OpenVINO computes fp16 weights in fp32; bf16 is planned with AMX, and on
    this machine's CPU where ``sdrt selftest --calibrate`` measured the backend at bf16 (it does where the CPU
    has bf16 dot products, AVX-512-BF16 or AMX: then bf16 is sdrt's default precision here, and its time and
    memory come from its own measured factors, not from fp32's)."""
    out = [p for p in BACKEND_PRECISIONS.get(backend, ("fp32", "fp16")) if device.supports(p)]
    if device.kind == "cpu":
        keep = {"fp32", "q8_0", "q4_0"} | ({"bf16", "int8"} if "amx_bf16" in device.isa else set())
        if calibrated_on(backend, device, calibration) and "bf16" in calibrated_precisions(backend, "cpu", calibration):
            keep.add("bf16")
        out = [p for p in out if p in keep] or ["fp32"]
    elif calibrated_on(backend, device, calibration):  # a GPU calibrated here: the precisions it was measured at
        # (fp32's factors would price fp16 at the tensor cores' peak, which ggml's CUDA build does not reach)
        out = [p for p in out if p in calibrated_precisions(backend, device.kind, calibration)] or out
    return out


@dataclass
class PartCalls:
    """One part of a model: its graph, and each distinct input signature with its calls per image."""

    name: str
    path: Path
    signatures: list[tuple[dict[str, tuple[int, ...]], float]]  # (shapes, calls per image)

    @property
    def calls(self) -> float:
        return sum(n for _, n in self.signatures)


@dataclass
class PartCost:
    name: str
    calls: float
    costs: list[tuple[GraphCost, float]]  # per signature: cost, calls per image


@dataclass
class Candidate:
    backend: str
    precision: str
    offload: str
    fits: bool
    ms_per_image: float
    peak_bytes: float
    parts: list[dict[str, Any]]
    calibrated: bool

    def label(self) -> str:
        return f"{self.backend}, {self.precision}, offload {self.offload}"


@dataclass
class Plan:
    model: str
    device: DeviceSpec
    budget_bytes: float
    width: int
    height: int
    steps: int
    chosen: Candidate | None
    runner_up: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    #: parts where shape inference lost some values' shapes (a custom-domain op, control flow): their nodes are not
    #: costed, so the figures are low; [{"part", "values", "ops"}] (``GraphCost.unknown``, ``unknown_ops``)
    unknown_shapes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        c = self.chosen or (min(self.candidates, key=lambda x: x.peak_bytes) if self.candidates else None)
        return {
            "model": self.model, "device": self.device.name, "device_kind": self.device.kind,
            "memory_budget_bytes": int(self.budget_bytes), "width": self.width, "height": self.height,
            "steps": self.steps,
            "parts": c.parts if c else [],
            "predicted_ms_per_image": c.ms_per_image if c else None,
            "predicted_peak_bytes": int(c.peak_bytes) if c else None,
            "fits": bool(self.chosen is not None),
            "plan": _cand(self.chosen),
            "runner_up": _cand(self.runner_up),
            "calibrated": bool(c and c.calibrated),
            "candidates": [_cand(x) for x in self.candidates],
            "unknown_shapes": self.unknown_shapes,
        }

    def format(self) -> str:
        d = self.to_dict()
        gib = 2**30
        lines = [f"{self.model} on {self.device.name} ({self.device.kind}, {self.device.memory_bytes / gib:.0f} GiB"
                 f"{', shared' if self.device.shared_memory else ''}), budget {self.budget_bytes / gib:.1f} GiB, "
                 f"{self.width}x{self.height}, {self.steps} steps"
                 + ("" if d["calibrated"] else "  [uncalibrated: default efficiencies]")]
        if not self.chosen:
            lines.append("  does NOT fit under any plan; the smallest:")
        c = self.chosen or (min(self.candidates, key=lambda x: x.peak_bytes) if self.candidates else None)
        if c is None:
            return "\n".join(lines + ["  no backend can run on this device"])
        lines.append(f"  plan: {c.label()}: {c.ms_per_image / 1000:.2f} s per image, peak "
                     f"{c.peak_bytes / gib:.2f} GiB" + ("" if self.chosen else "  (too big)"))
        width = max([16, *(len(p["name"]) for p in c.parts)])  # a refiner's parts: refiner.text_encoder_2
        for p in c.parts:
            lines.append(f"    {p['name']:<{width}} {p['calls']:>6g} call(s) x {p['predicted_ms_per_call']:>10.1f} ms"
                         f" = {p['predicted_ms_per_image'] / 1000:>8.2f} s   peak {p['predicted_peak_bytes'] / gib:6.2f} GiB"
                         f"  (weights {p['weight_bytes'] / gib:.2f} GiB)")
        if self.runner_up:
            r = self.runner_up
            lines.append(f"  runner-up: {r.label()}: {r.ms_per_image / 1000:.2f} s per image, peak "
                         f"{r.peak_bytes / gib:.2f} GiB")
        for u in self.unknown_shapes:
            if u["values"]:
                lines.append(f"  note: {u['part']}: shape inference could not tell the shapes of {u['values']} value(s) "
                             f"(from {', '.join(u['ops']) or 'some node'}); the nodes that use them are not counted, so "
                             "its time and memory are underestimated")
            if u.get("subgraph_matmuls"):
                lines.append(f"  note: {u['part']}: {u['subgraph_matmuls']} matmul/conv node(s) inside If/Loop/Scan "
                             "subgraphs are not counted (how often they run is known only at run time), so its time "
                             "is underestimated")
        return "\n".join(lines)


def _cand(c: Candidate | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"backend": c.backend, "precision": c.precision, "offload": c.offload, "fits": c.fits,
            "predicted_ms_per_image": c.ms_per_image, "predicted_peak_bytes": int(c.peak_bytes)}


# ---------------------------------------------------------------------------- parts
def plan_parts(model: str | Path, *, width: int | None = None, height: int | None = None, steps: int = 20,
               cfg: float | None = None, batch: int = 1, refiner: str | Path | None = None,
               refiner_switch_at: float | None = None) -> tuple[str, list[PartCalls], tuple[int, int]]:
    """The parts of ``model`` (a pipeline folder or one ``.onnx``) with their shapes and calls per image, and the
    image size planned. ``width``/``height`` None: the model's own size (a folder's, as generate takes it; a lone
    graph's fixed size, else 512); one of them alone: a square, unless a lone graph fixes the other. ``refiner``:
    a refiner model (a folder or a single file) after a folder's model: its parts join as ``refiner.<part>``, with
    the calls it takes over at ``refiner_switch_at`` (0.8)."""
    from ..pipelines.singlefile import is_single_file

    path = Path(model)
    if refiner_switch_at is not None and refiner is None:  # it was ignored, whatever its value (nan too)
        raise SdrtError("--refiner-switch-at without --refiner", where="sdrt plan --refiner-switch-at",
                        fix="pass --refiner (the refiner model) too, or leave --refiner-switch-at out")
    if refiner is not None and not (path.is_dir() or is_single_file(path)):
        raise SdrtError("a refiner follows a model folder's pipeline, not one .onnx graph", where="sdrt plan --refiner",
                        fix="pass the base model's folder, or leave --refiner out")
    if path.is_dir():
        path = _lone_graph(path)
    if path.is_dir() or is_single_file(path):  # a model folder, or a checkpoint file as sdrt generate takes it
        if (width is None) != (height is None):  # one side given: a square
            width = height = width if width is not None else height
        from ..pipelines.folder import ModelFolder
        from ..pipelines.pipeline import Pipeline
        from ..pipelines.singlefile import folder_from_file

        folder = ModelFolder.open(path) if path.is_dir() else folder_from_file(path)
        pipe = Pipeline(folder, backend="auto", device=None)  # dry: nothing compiles
        ref = _refiner_pipeline(refiner) if refiner is not None else None
        try:
            kw: dict[str, Any] = {"steps": steps, "batch": batch}
            kw.update({k: v for k, v in (("width", width), ("height", height)) if v is not None})
            if cfg is not None:
                kw["cfg"] = cfg
            kw.update(_images_needed(pipe, width, height))
            if ref is not None:
                # 0 too: the pipeline refuses it, as generate does (it was read as not given: the default 0.8)
                kw.update(refiner=ref, **({"refiner_switch_at": refiner_switch_at} if refiner_switch_at is not None
                                          else {}))
            rp = pipe.plan("a photograph of an astronaut riding a horse", "", **kw)
        finally:
            pipe.close()
            if ref is not None:
                ref.close()
        parts = []
        for p in rp.parts:
            sigs = [({name: tuple(shape) for name, shape, _ in sig}, n / rp.images) for sig, n in p.signatures]
            parts.append(PartCalls(p.part, Path(p.path), sigs))
        return f"{rp.label} ({path.name})", parts, (rp.width, rp.height)
    if path.suffix.lower() != ".onnx" or not path.is_file():
        raise SdrtError(f"{str(path)!r} is neither a model folder, a checkpoint file nor an .onnx file",
                        where="sdrt plan MODEL", fix="pass a model folder, a .safetensors checkpoint or one .onnx file")
    from ..errors import InputError
    from ..graph import Graph
    from .shapes import fixed_size, takes_pixels

    g = Graph.load(path, load_external=False)
    fixed = fixed_size(g)
    if fixed:  # a side not given is the graph's own; one that contradicts it is refused below
        width, height = width if width is not None else fixed[0], height if height is not None else fixed[1]
    else:
        width = width if width is not None else height if height is not None else 512
        height = height if height is not None else width
    pixels = takes_pixels(g)  # an image in pixels (a classifier's, a VAE encoder's) takes any size; latents x 8
    for name, value in (("width", width), ("height", height)):  # as a pipeline folder's (pipelines.settings)
        if not pixels and (value < 8 or value % 8):
            raise InputError(f"{{@{name}}} {value} is not a multiple of 8 of at least 8", where=name,
                             fix=f"use {max(8, value - value % 8)}" + (f" or {value - value % 8 + 8}" if value > 8 else ""))
    if fixed and fixed != (width, height):
        raise InputError(f"{path.name} is fixed at {fixed[0]}x{fixed[1]} pixels (its image input has a fixed height and width); "
                         f"{width}x{height} cannot be planned", where="width" if fixed[0] != width else "height",
                         fix=f"leave out {{@width}} and {{@height}} (the graph's own size is taken), or pass "
                             f"{{@width=}}{fixed[0]} {{@height=}}{fixed[1]}")
    return path.name, [PartCalls(path.stem, path, [(single_file_shapes(g, width, height, batch), 1.0)])], (width, height)


#: the strength a plan runs a model that only continues an image at (the SDXL refiner: 0.2-0.4 is usual)
REFINER_STRENGTH = 0.3


def _images_needed(pipe: Any, width: int | None, height: int | None) -> dict[str, Any]:
    """The images a model cannot run without, as blank pictures of the planned size: an inpainting UNet's (or
    FLUX.1 Fill's) init image and mask, the SDXL refiner's init image (at :data:`REFINER_STRENGTH`), a FLUX.1
    Canny/Depth model's control image. ``sdrt plan`` has no flags for them, and every other model runs without."""
    import numpy as np

    w, h = width or pipe.default_size, height or pipe.default_size
    picture = np.zeros((h, w, 3), np.uint8)
    fam = pipe.family
    unet_in = pipe.denoiser.inputs[fam.sample_input].shape
    nine = (not fam.flow and len(unet_in) == 4 and unet_in[1] == fam.latent_channels + fam.inpaint_channels)
    tool = pipe.flux_tool
    if nine or tool == "fill":
        return {"init_image": picture, "mask": np.full((h, w), 255, np.uint8)}
    if tool == "control":
        return {"control_image": picture}
    if not fam.txt2img:
        return {"init_image": picture, "strength": REFINER_STRENGTH}
    return {}


#: the subfolders that make a folder a pipeline (diffusers/Optimum layout), not one exported graph
_PART_DIRS = ("unet", "transformer", "text_encoder", "text_encoder_2", "vae_decoder", "vae")


def _lone_graph(folder: Path) -> Path:
    """A folder that holds one exported graph and no pipeline (``optimum-cli export onnx`` of a classifier, a text
    encoder alone: ``model.onnx`` and its configs): that ``.onnx`` file, planned as one; several graphs and no
    pipeline are refused naming them; anything else is the folder itself (a pipeline)."""
    if (folder / "model_index.json").is_file() or any((folder / d).is_dir() for d in _PART_DIRS):
        return folder
    graphs = sorted(f for f in folder.glob("*.onnx") if f.is_file())
    if len(graphs) == 1:
        return graphs[0]
    if len(graphs) > 1:
        names = ", ".join(f.name for f in graphs[:4]) + (", ..." if len(graphs) > 4 else "")
        raise SdrtError(f"the folder holds {len(graphs)} .onnx files ({names}) and no pipeline (no model_index.json, "
                        f"no {'/'.join(_PART_DIRS[:2])}/ or text_encoder/ folder)", where=str(folder),
                        fix=f"pass one of the files: sdrt plan {graphs[0]}")
    return folder


def cost_parts(parts: Sequence[PartCalls], precision: str, pinned: dict[Any, Any] | None = None) -> list[PartCost]:
    """Each part's cost per signature at ``precision``; ``pinned`` caches the shape-inferred graphs."""
    from ..graph import Graph

    pinned = {} if pinned is None else pinned
    out = []
    for p in parts:
        costs = []
        for shapes, n in p.signatures:
            key = (str(p.path), tuple(sorted(shapes.items())))
            if key not in pinned:
                # onnxruntime's contrib ops costed as the standard ops the backends run (sdrt.graph.contrib)
                pinned[key] = Graph.load(p.path, load_external=False).without_contrib_ops().with_shapes(shapes)
            costs.append((graph_costs(pinned[key], None, precision, inferred=True), n))
        out.append(PartCost(p.name, p.calls, costs))
    return out


# ---------------------------------------------------------------------------- choosing
def budget_for(device: DeviceSpec, memory: float | None) -> float:
    """The memory a plan may use: ``memory`` if given (more than the device has is refused), else 90% of a discrete
    device's memory or 70% of shared memory (the OS and apps keep the rest); for this machine's own CPU, what a
    pipeline here would take as its budget (``sdrt.pipelines.budget.cpu_budget``: 90% of what the OS has
    available), so that ``sdrt plan`` and ``sdrt generate`` agree on what fits now."""
    usable = device.memory_bytes * (0.7 if device.shared_memory else 0.9)
    if not memory and device.kind == "cpu" and device.source.startswith("sdrt.hardware.detect"):
        from ..pipelines.budget import cpu_budget

        usable = float(cpu_budget(int(device.memory_bytes)) or usable)
    if memory and memory > device.memory_bytes:  # a plan cannot use memory the device does not have
        gib = device.memory_bytes / 2**30
        raise SdrtError(f"the memory budget {memory / 2**30:.1f} GiB is more than {device.name} has "
                        f"({gib:.1f} GiB)", where="memory",
                        fix=f"pass at most {gib:.1f}GiB, or leave {{@memory}} unset (default: "
                            f"{70 if device.shared_memory else 90}% of the device's memory)")
    return float(memory) if memory else usable


def evaluate(costs: Sequence[PartCost], device: DeviceSpec, backend: str, precision: str, offload: str,
             budget: float, factors: Factors | None = None, calibration: dict[str, Any] | None = None) -> Candidate:
    f = factors or factors_for(backend, device, precision, calibration)
    parts = []
    total_ms = 0.0
    resident_sum = 0.0  # what each part holds whatever runs: its weights (and compiled nodes) as the factors count them
    extra = 0.0
    for pc in costs:
        ms_img = 0.0
        peak_part = 0.0
        ms_call = 0.0
        w = 0.0
        a = 0.0
        resident = 0.0
        for cost, n in pc.costs:
            pr = predict(cost, device, backend, precision, f, pinned=True)  # a pipeline pins every part
            resident = max(resident, pr.resident_bytes)
            # what the part adds over its resident weights while it compiles or runs (transients, activations, and
            # the pin's own memory once: extra is the largest of them)
            extra = max(extra, pr.peak_bytes - f.base_bytes - pr.resident_bytes)
            ms_img += pr.ms * n
            ms_call = max(ms_call, pr.ms)
            w = max(w, pr.weight_bytes)
            a = max(a, pr.activation_bytes)
            peak_part = max(peak_part, pr.peak_bytes)
        load_ms = 0.0
        if offload == "stream":  # resident: activations and two blocks' weights in flight
            peak_part = f.activation_factor * a + 2 * f.weight_factor * w / 20 + f.base_bytes + f.pin_bytes
        if offload == "parts":
            load_ms = 1000 * w / DISK_BYTES_PER_S
        elif offload == "stream":
            load_ms = 1000 * w / PCIE_BYTES_PER_S * pc.calls
        parts.append({"name": pc.name, "calls": pc.calls, "predicted_ms_per_call": ms_call,
                      "predicted_ms_per_image": ms_img + load_ms, "predicted_peak_bytes": peak_part,
                      "weight_bytes": w, "activation_bytes": a, "load_ms_per_image": load_ms})
        total_ms += ms_img + load_ms
        resident_sum += resident
    base = f.base_bytes
    if offload == "none":  # every part resident, and the largest transient or activations of any one on top
        peak = resident_sum + extra + base
    elif offload == "parts":
        peak = max((p["predicted_peak_bytes"] for p in parts), default=0.0)
    else:  # stream: activations plus two blocks' weights in flight (a block ~ 1/20 of the largest part)
        peak = max((p["predicted_peak_bytes"] for p in parts), default=0.0)
    return Candidate(backend, precision, offload, peak <= budget, total_ms, peak, parts, f.calibrated)


def make_plan(model: str | Path, device: DeviceSpec, *, backends: Sequence[str] | None = None,
              precisions: Sequence[str] | None = None, memory: float | None = None, width: int | None = None,
              height: int | None = None, steps: int = 20, offloads: Sequence[str] | None = None,
              refiner: str | Path | None = None, refiner_switch_at: float | None = None) -> Plan:
    """Cost ``model`` on ``device`` for every candidate and pick one (see the module doc); ``width``/``height``
    None: the model's own size (``plan_parts``); ``refiner``: its parts too (both models stay loaded)."""
    label, parts, (width, height) = plan_parts(model, width=width, height=height, steps=steps, refiner=refiner,
                                               refiner_switch_at=refiner_switch_at)
    budget = budget_for(device, memory)
    bes = list(backends) if backends else backends_for(device)
    for be in backends or ():
        if be not in BACKEND_PRECISIONS:
            known = be in {"reference"}  # sdrt's own backends, which run anything slowly: nothing to plan
            raise SdrtError(f"the planner has no cost model for the {be} backend (onnx's evaluator in numpy, the "
                            "tests' backend)" if known else f"unknown backend {be!r}", where="backends",
                            fix=f"use one of: {', '.join(BACKEND_PRECISIONS)}")
        if be not in backends_for(device):
            raise SdrtError(f"the {be} backend does not run on {device.name}", where="backends",
                            fix=f"use one of: {', '.join(backends_for(device)) or 'none'}, or leave {{@backends}} "
                                "unset")
    if not bes:
        raise SdrtError(f"no sdrt backend runs on {device.name}", where="sdrt plan --device",
                        fix="pick a GPU or CPU from the library")
    calibration = load_calibration()
    cache: dict[str, list[PartCost]] = {}
    pinned: dict[Any, Any] = {}
    cands: list[Candidate] = []
    if precisions:  # each backend plans the asked precisions it runs (ggml's blocks are not OpenVINO's), on this device
        runs = {be: [p for p in precisions if p in BACKEND_PRECISIONS.get(be, ()) and device.supports(p)] for be in bes}
        if not any(runs.values()):
            offer = "; ".join(f"{be}: {', '.join(p for p in BACKEND_PRECISIONS.get(be, ()) if device.supports(p))}"
                              for be in bes)
            raise SdrtError(f"no backend runs {', '.join(precisions)} on {device.name}", where="precisions",
                            fix=f"ask for a precision one of them runs ({offer}), or leave {{@precisions}} unset")
        bes = [be for be in bes if runs[be]]
    for be in bes:
        for prec in (runs[be] if precisions else precisions_for(be, device, calibration)):
            if prec not in cache:
                cache[prec] = cost_parts(parts, prec, pinned)
            kinds = offloads or (("none", "parts", "stream") if device.kind == "gpu" else ("none", "parts"))
            for off in kinds:
                cands.append(evaluate(cache[prec], device, be, prec, off, budget, calibration=calibration))
    rank = {"none": 0, "parts": 1, "stream": 2}
    order = sorted((c for c in cands if c.fits),
                   key=lambda c: (TIER.get(c.precision, 1), round(c.ms_per_image, 3), rank.get(c.offload, 3)))
    chosen = order[0] if order else None
    runner = next((c for c in order[1:] if chosen and (c.backend, c.offload) != (chosen.backend, chosen.offload)
                   or abs(c.ms_per_image - chosen.ms_per_image) > 0.01 * chosen.ms_per_image), None)
    cands.sort(key=lambda c: (not c.fits, TIER.get(c.precision, 1), c.ms_per_image))
    unknown = []
    for pc in next(iter(cache.values()), []):
        lost = sorted({v for cost, _ in pc.costs for v in cost.unknown})
        looped = max((cost.subgraph_heavy for cost, _ in pc.costs), default=0)
        if (lost and any(cost.uncosted_heavy for cost, _ in pc.costs)) or looped:  # not a mask's lost dims alone
            unknown.append({"part": pc.name, "values": len(lost),
                            "ops": sorted({op for cost, _ in pc.costs for op in cost.unknown_ops}),
                            "subgraph_matmuls": looped})
    return Plan(label, device, budget, width, height, steps, chosen, runner, cands, unknown)


def _refiner_pipeline(spec: str | Path) -> Any:
    """A refiner model opened for a dry plan, as ``sdrt.pipelines.load`` opens it, on no backend (nothing compiles)."""
    from ..checkpoint.diffusers_folder import is_diffusers_folder
    from ..pipelines.folder import ModelFolder
    from ..pipelines.pipeline import Pipeline
    from ..pipelines.singlefile import folder_from_file, is_single_file

    if not Path(spec).exists():
        raise SdrtError(f"the refiner model {str(spec)!r} does not exist", where="sdrt plan --refiner",
                        fix="pass the refiner's .safetensors file or model folder")
    if is_single_file(spec):
        folder = folder_from_file(spec, None, ())
    elif is_diffusers_folder(spec):
        folder = ModelFolder.from_diffusers(spec)
    else:
        folder = ModelFolder.open(spec)
    return Pipeline(folder, backend="auto", device=None)


def parse_memory(text: str) -> float:
    """``"8G"``/``"8GiB"`` (2^30), ``"12GB"`` (10^9), ``"512M"`` or bytes -> bytes: the one reading of a size,
    shared with ``sdrt generate --memory`` (``sdrt.pipelines.budget.parse_memory``)."""
    from ..pipelines.budget import parse_memory as parse

    return float(parse(text, "sdrt plan --memory"))
