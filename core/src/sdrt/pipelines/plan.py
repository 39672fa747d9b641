"""The run plan as data: what ``Pipeline.generate`` would run for given settings, computed by running it dry.

``dry_run`` runs the pipeline's own code (validation, conditioning, the sampling loop, the VAE) on
recording twins of its parts (:meth:`sdrt.pipelines.parts.Part.dry`): each call is recorded with its
input shapes and dtypes, and zeros in the shapes the graph infers come back. Nothing compiles, no
backend session opens and no weights are read into one, so the plan is cheap and it cannot drift from
what runs: a sampler that calls the model twice per step, CFG rows, tiles and prompt chunks all show
as they happen. This is the input for cost and memory planning; ``sdrt generate --dry-run`` prints it.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .pipeline import Pipeline

Signature = tuple[tuple[str, tuple[int, ...], str], ...]  # (input, shape, dtype) for every input of one call
#: a refiner's parts in a run plan: ``refiner.unet``, ``refiner.vae_decoder`` ...
REFINER_PREFIX = "refiner."
#: a hires checkpoint's parts in a run plan: ``hires.unet`` ...
HIRES_PREFIX = "hires."


@dataclass
class PartPlan:
    """One part's calls: ``calls`` in the whole run, each distinct input signature with its count."""

    part: str
    role: str
    path: str
    calls: int
    signatures: list[tuple[Signature, int]]
    outputs: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        """The largest batch (first dimension of the first input) of one call."""
        return max(_rows(sig) for sig, _ in self.signatures)


def _rows(sig: Signature) -> int:
    """The batch of one call: the first dimension of its first input that is not a scalar (else 1)."""
    return next((shape[0] for _, shape, _ in sig if shape), 1)


@dataclass
class RunPlan:
    """Every part that runs for these settings, in order of first use, with shapes, dtypes and call counts."""

    family: str
    label: str
    mode: str
    width: int
    height: int
    images: int
    batch: int
    batch_count: int
    steps: int
    sampler: str
    model_sampling: str
    guidance: str
    cfg: float
    latent: tuple[int, ...]
    parts: list[PartPlan] = field(default_factory=list)
    #: the toolbox's passes and add-ons (hires fix, ControlNets), one line each
    notes: list[str] = field(default_factory=list)
    #: each part's placement under the memory budget and the predicted peak (sdrt.pipelines.budget.MemoryPlan)
    memory: Any = None
    #: with a refiner: its parts' placement, planned beside the base's resident parts (both models stay loaded)
    refiner_memory: Any = None
    #: with a hires checkpoint: its parts' placement in the hires pass, planned beside the first model's resident
    #: parts, or on the process alone when those are released before it loads (``hires_first_released``)
    hires_memory: Any = None
    hires_first_released: bool | None = None
    #: where and at what precision the parts compile: "openvino on CPU, bf16 (the device's default)"
    compute: str = ""

    def part(self, name: str) -> PartPlan | None:
        return next((p for p in self.parts if p.part == name), None)

    def per_image(self, name: str) -> float:
        """Model evaluations per image: calls x rows, divided by the images the run makes."""
        p = self.part(name)
        return 0.0 if p is None else sum(_rows(sig) * n for sig, n in p.signatures) / self.images

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"{self.label} ({self.family}), {self.mode}, {self.width}x{self.height}, {self.images} image(s) "
                 f"({self.batch_count} x batch {self.batch}); latent {list(self.latent)}",
                 f"sampler {self.sampler}, {self.steps} step(s), model sampling {self.model_sampling}, "
                 f"guidance {self.guidance} (cfg {self.cfg:g})",
                 *([f"compute: {self.compute}"] if self.compute else []), *self.notes]
        for p in self.parts:
            lines.append(f"  {p.part} ({p.role}): {p.calls} call(s), {self.per_image(p.part):g} row(s) per image"
                         f"  [{p.path}]")
            for sig, n in p.signatures:
                shapes = ", ".join(f"{name} {list(shape)} {dtype}" for name, shape, dtype in sig)
                lines.append(f"    {n} x ({shapes})")
        if self.memory is not None:
            lines.append(self.memory.format())
        if self.hires_memory is not None:
            lines.append("hires checkpoint " + self.hires_memory.format() + (
                "\n  (its base: the process alone: the two models do not both fit, so the first model's parts are "
                "released before the hires pass loads this one)" if self.hires_first_released else
                "\n  (its base: the process and the first model's resident parts, which stay loaded beside it in the "
                "hires pass)"))
        if self.refiner_memory is not None:
            lines.append("refiner " + self.refiner_memory.format() + "\n  (its base: the process and the model's "
                         "resident parts, which stay loaded beside the refiner's)")
        return "\n".join(lines)


def dry_run(pipe: Pipeline, prompt: Any, negative_prompt: str | None, kwargs: dict[str, Any], *,
            share: bool = False) -> RunPlan:
    """Run ``pipe.generate`` on recording twins of its parts and collect the calls (see the module doc). ``share``:
    the job about to run loads the graphs the twins read (``Part.dry``)."""
    from .names import sampler_labels

    dry = copy.copy(pipe)
    dry._parts = {name: part.dry(share) for name, part in pipe._parts.items()}
    dry._prompts = None
    dry._weight_state = None
    dry._memory_plan, dry._stage_peaks = None, None  # the budget's plan is the real pipeline's (Pipeline.plan)
    dry.low_memory = False
    dry._dry = True
    dry._init_fit = None  # how the init image is fitted to the run's size (Pipeline._fit_init), a line of the plan
    dry._lock, dry._state, dry._stop, dry._owner = threading.Lock(), threading.RLock(), threading.Event(), None
    from . import fluxcontrollora

    texts = [prompt.prompt, prompt.negative_prompt] if hasattr(prompt, "negative_prompt") else [prompt, negative_prompt]
    state = pipe._weight_state
    control = fluxcontrollora.pending(pipe, texts, getattr(state, "planned", ()) if state is not None else ())
    if control is not None:  # a control LoRA the run brings: the 128-input transformer (BFL's Canny/Depth LoRA)
        fluxcontrollora.plan_graph(pipe, dry._parts, control)
        dry.__dict__["_planned_control"] = control[0]
    elif pipe.control_lora is not None:  # active now: the twin has no weight state, and names it all the same
        dry.__dict__["_planned_control"] = pipe._control_lora_said()
    steps: list[int] = []
    from .controlnet import PLANNING

    token = PLANNING.set(True)  # a model-backed preprocessor's map: its size only, no network compiled or run
    try:
        dry._generate(prompt, negative_prompt, lambda i, n, x: steps.append(n) if i == 1 else None, kwargs)
    finally:
        PLANNING.reset(token)
    s = dry._settings
    parts = []
    # the refiner's parts (sdrt.pipelines.refiner.Run), named "refiner.<part>", in one order of first use
    twin = dry.__dict__.get("_refiner_dry")
    every = [(name, part, pipe.family) for name, part in dry._parts.items()]
    every += [(f"{REFINER_PREFIX}{name}", part, twin.family) for name, part in twin._parts.items()] if twin else []
    hires = dry.__dict__.get("_hires_dry") if dry.__dict__.get("_hires_job") is not None else None
    # a hires checkpoint's parts (sdrt.pipelines.hiresmodel), named "hires.<part>"
    every += [(f"{HIRES_PREFIX}{name}", part, hires.family) for name, part in hires._parts.items()] if hires else []
    for name, part, family in sorted(every, key=lambda e: getattr(e[1], "first_use", 1 << 62)):
        if not part.record:
            continue
        counts = Counter(tuple((k, shape, dtype) for k, (shape, dtype) in sorted(feeds.items()))
                         for feeds, _ in part.record)
        outputs = tuple(dict.fromkeys(o for _, outs in part.record for o in outs))
        own = name.removeprefix(REFINER_PREFIX).removeprefix(HIRES_PREFIX) if family is not pipe.family else name
        role = family.parts.get(own) or ("controlnet" if name.startswith("controlnet") else
                                         "image_encoder" if name.startswith(IMAGE_ENCODERS) else "?")
        parts.append(PartPlan(name, role, str(part.path), len(part.record),
                              sorted(counts.items(), key=lambda kv: -kv[1]), outputs))
    ms = pipe.family.model_sampling(s.width, s.height, *([s.shift] if s.shift is not None else []))
    kind = getattr(ms, "prediction", "?")
    if getattr(ms, "kind", "") == "flow":
        kind = f"flow (shift {ms.shift:g})" if ms.mu is None else f"flow (mu {ms.mu:.3f})"
    elif getattr(ms, "kind", "") == "edm":  # Playground v2.5, CosXL
        kind = f"edm {ms.prediction} (sigma {ms.sigma_min:g}..{ms.sigma_max:g}, sigma_data {ms.sigma_data:g})"
    label = " ".join(x for x in sampler_labels(s.choice) if x)
    modes = [f"distilled {s.guidance:g}"] if s.guidance is not None else []
    if pipe.family.negative_pass(s.cfg, s.negative_prompt):
        modes.append(pipe.family.guidance)
    elif pipe.family.guidance != "cfg":
        modes.append(pipe.family.guidance)
    if s.image_cfg is not None and pipe.instruct_pix2pix:  # its own rule (sdrt.pipelines.edit), not negative_pass's
        from .edit import guidance as edit_guidance

        how = edit_guidance(s.cfg, s.image_cfg, s.strength_rule)
        modes = [] if how == "none" else [f"cfg and image cfg {s.image_cfg:g} (InstructPix2Pix, three rows)"
                                           if how == "edit" else "cfg"]
    guidance = ", ".join(modes) or "none"  # the line adds "(cfg 1)"
    from .fluxtools import LABELS as TOOLS

    tool = getattr(dry, "flux_tool", None)  # FLUX.1 Fill / Canny / Depth: their conditioning rides on the noise
    what = TOOLS[tool] if tool else pipe.family.label
    control = control[0] if control is not None else getattr(pipe, "control_lora", None)
    if tool == "control" and control:  # BFL's Canny/Depth LoRA on Flux.1 dev (sdrt.pipelines.fluxcontrollora)
        what += f" (Flux.1 dev + control LoRA {control})"
    rp = RunPlan(pipe.family.name, what, s.mode, s.width, s.height,
                 s.batch * s.batch_count, s.batch, s.batch_count, steps[0] if steps else 0, label, kind, guidance,
                 s.cfg, pipe.family.latent_shape(s.batch, s.height, s.width), parts,
                 [*([dry._init_fit] if dry._init_fit else []), *_notes(s), *_stored_notes(pipe)])
    rp.compute = _compute(pipe)
    rp._refiner = dry._refiner_job  # type: ignore[attr-defined]  # the job's refiner pipeline (its memory plan)
    rp._hires = hires  # type: ignore[attr-defined]  # the job's hires checkpoint's twin (its memory plan)
    rp._extras = extra_parts(pipe, dry, s)  # type: ignore[attr-defined]  # what the memory plan counts besides
    rp._beside = held_beside(pipe, dry, s, rp._extras)  # type: ignore[attr-defined]  # what runs beside what
    # the model's parts as the run edits their graphs (IP attention, ControlNet residual inputs): for activations
    rp._twins = {n: p for n, p in dry._parts.items() if n in pipe._parts and p.graph_edit is not None}  # type: ignore[attr-defined]
    return rp


#: the names of the image encoders a run uses once a job, before its steps: an IP-Adapter's (image_encoder,
#: image_encoder_2, ...), Revision's (revision_encoder, ...) and the T2I style adapter's (style_encoder)
IMAGE_ENCODERS = ("image_encoder", "revision_encoder", "style_encoder")
#: the roles of the parts a run uses besides the model's own (``extra_parts``)
EXTRA_ROLES = ("controlnet", "image_encoder", "upscaler", "preprocessor", "style_adapter")


def extra_parts(pipe: Pipeline, dry: Any, s: Any) -> dict[str, tuple[str, Any]]:
    """``{name: (role, Part twin | upscaler file)}``: the parts this run uses that are not the model's own, for the
    memory plan: its ControlNets and an IP-Adapter's image encoder (the dry run's recording twins) and the hires
    fix's model upscaler (its file: no part runs in the plan) and each model-backed preprocessor's detector
    (``preprocessor:<kind>``: its files, ``preprocessors.Detector``; it makes the maps before anything else runs) and
    each T2I style adapter's own weights (``style_adapter:<file name>``: its file; numpy runs it after the style
    encoder, once a job)."""
    out: dict[str, tuple[str, Any]] = {}
    for name, part in dry._parts.items():
        if name in pipe._parts or not part.record:
            continue
        # an image encoder (IMAGE_ENCODERS: one per distinct encoder, shared ones once), run once before the steps
        out[name] = ("image_encoder" if name.startswith(IMAGE_ENCODERS) else "controlnet", part)
    hr = s.toolbox.hires if s.toolbox is not None else None
    if hr is not None and hr.model is not None and not hr.latent:
        out["upscaler"] = ("upscaler", hr.model)
    from .preprocessors import WITH_MODELS, detector
    from .styleadapter import adapter_name, is_style

    tb = s.toolbox
    for unit in [*tb.controlnets, *tb.adapters] if tb is not None else []:  # T2I-Adapter units' maps too
        if unit.preprocessor in WITH_MODELS and unit.preprocessor_models is not None:
            found = detector(unit.preprocessor, unit.preprocessor_models)
            out.setdefault(f"preprocessor:{found.kind}", ("preprocessor", found))
    for unit in (s.toolbox.styles if s.toolbox is not None else None) or []:  # its arrays, in numpy (float32)
        if is_style(unit) and isinstance(unit.net, (str, os.PathLike)):
            out.setdefault(adapter_name(unit.net), ("style_adapter", Path(unit.net)))
    return out


def held_beside(pipe: Pipeline, dry: Any, s: Any, extras: dict[str, tuple[str, Any]]) -> dict[str, list[str]]:
    """``{part: [parts loaded while it runs]}`` for the memory plan (``plan_memory``'s ``beside``): the ControlNets
    run beside the denoiser at every step of the passes they take part in, and are released only after the last
    of them; the hires fix's model upscaler runs between the passes, while the denoiser, the VAE decoder (which
    decoded the first pass for it) and the ControlNets the hires pass uses are still loaded."""
    from .controlnet import on_pass

    den = pipe.family.denoiser_part
    nets = [n for n, (role, _) in extras.items() if role == "controlnet"]
    out: dict[str, list[str]] = {}
    if nets:
        out[den] = list(nets)
        for n in nets:
            out[n] = [den, *(m for m in nets if m != n)]
    encoders = [n for n in extras if n.startswith("style_encoder")]
    for n, (role, _) in extras.items():
        if role == "style_adapter":  # it reads the style encoder's output: both held at once
            out[n] = list(encoders)
    if "upscaler" in extras:
        tb = s.toolbox
        units = (tb.controlnets if tb is not None else None) or getattr(dry, "_silent_units", None) or []
        later = [u.part.name for u in units if u.part is not None and on_pass(u, True) and u.part.name in nets]
        out["upscaler"] = [den, "vae_decoder", *dict.fromkeys(later)]
    return out


def job_identity(value: Any, depth: int = 0) -> Any:
    """What of one ``generate`` argument the run plan depends on, as a key: numbers and words as they are, arrays
    and pictures by their shape, and files by path and version (``stamps.file_stamp``: size, mtime, inode; a folder:
    each file in it), so that a ControlNet, image encoder or upscaler file swapped for another of the same count, or
    written anew, is planned anew. Lists, mappings and dataclasses (``ControlNet``, ``IPAdapter``) by their items and
    the fields they show; other objects by their ``path``, else by themselves."""
    import dataclasses
    import os

    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        return repr(value), _path_version(os.fspath(value))
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return "array", tuple(value.shape), str(value.dtype)
    if hasattr(value, "size") and hasattr(value, "mode") and hasattr(value, "getpixel"):  # a PIL image
        return "image", tuple(value.size), str(value.mode)
    if depth >= 4:
        return type(value).__name__, id(value)
    if isinstance(value, (list, tuple)):
        return tuple(job_identity(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), job_identity(v, depth + 1)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, tuple((f.name, job_identity(getattr(value, f.name), depth + 1))
                                           for f in dataclasses.fields(value) if f.repr)
    path = getattr(value, "path", None)
    if isinstance(path, (str, os.PathLike)):
        return type(value).__name__, job_identity(path, depth + 1)
    return type(value).__name__, id(value)


def _path_version(text: str) -> Any:
    """A file's ``file_stamp``, a folder's files' (one level down too: a diffusers folder's part folders), or None
    when ``text`` names nothing on disk (a sampler's name, a prompt)."""
    import os

    from ..stamps import file_stamp

    if not text or len(text) > 4096 or "\n" in text:
        return None
    try:
        if not os.path.isdir(text):
            return file_stamp(text)
        out = []
        for entry in sorted(os.scandir(text), key=lambda e: e.name):
            if entry.is_file():
                out.append((entry.name, file_stamp(entry.path)))
            elif entry.is_dir():
                out += [(f"{entry.name}/{e.name}", file_stamp(e.path)) for e in sorted(os.scandir(entry.path),
                                                                                     key=lambda e: e.name)
                        if e.is_file()]
        return tuple(out)
    except (OSError, ValueError):
        return None


#: file storage types that are not the dtype a part's weights are bound in, and what they are
PACKED = {"nf4": "bitsandbytes 4-bit", "fp4": "bitsandbytes 4-bit"}


def _compute(pipe: Pipeline) -> str:
    """The backend, device and precision the parts compile at: the one asked for (``precision=``), else
    ``$SDRT_PRECISION``'s, else the device's default (``Backend.precision_for``; fp32 on a backend that offers no
    other)."""
    from ..errors import SdrtError
    from ..precision import precision_name
    from ..runtime import select

    try:
        be, dev = select(pipe.backend, pipe.device)
    except SdrtError:  # nothing runs here (sdrt plan costs a pipeline for a device it is not on): no line
        return ""
    quantized = f"; weights {pipe.quantize} (the VAE's float)" if getattr(pipe, "quantize", None) else ""
    asked = (pipe.options or {}).get("precision")
    if asked:
        return f"{be.name} on {dev.id}, {precision_name(asked)} (asked for){quantized}"
    from ..precision_default import ENV, override

    why = f"${ENV}" if be.precisions and override(be.precisions) else "the device's default"
    return f"{be.name} on {dev.id}, {be.precision_for(dev) if be.precisions else 'fp32'} ({why}){quantized}"


def _stored_notes(pipe: Pipeline) -> list[str]:
    """One line per part whose checkpoint stores weights packed (bitsandbytes NF4/FP4): the run reads them
    dequantized, so the plan says so where the file's precision would otherwise not show."""
    opened = getattr(getattr(pipe, "folder", None), "single_file", None)
    out = []
    fam = pipe.family
    for e in fam.encoders:  # SD3 without T5: the part that is not there, and what stands for it
        if e.kind == "t5" and e.part not in pipe._parts and e.part in fam.optional:
            out.append(f"{e.part}: none (no T5 text encoder): T5's states are zeros after CLIP's, as diffusers' "
                       "text_encoder_3=None")
    for part, types in sorted((getattr(opened, "dtypes", None) or {}).items()):
        packed = sorted(t for t in types if t in PACKED)
        if packed:
            plain = sorted(t for t in types if t not in PACKED)
            name = getattr(opened.files.get(part), "name", "its file")
            out.append(f"{part} weights: {', '.join(packed)} ({PACKED[packed[0]]}) in {name}, dequantized when bound"
                       + (f"; the rest {', '.join(plain)}" if plain else ""))
    return out


def _notes(s: Any) -> list[str]:
    """The toolbox's lines of the plan: the hires fix's two passes, each ControlNet and its window."""
    from .hires import second_pass_steps

    tb = s.toolbox
    notes = []
    if tb is not None and tb.hires is not None:
        hr = tb.hires
        tw, th = hr.target(s.width, s.height)
        length, run = second_pass_steps(hr, s.steps)
        how = f"x{hr.scale:g}" if not any(hr.resize) else "to {}x{}".format(*hr.upscaled(s.width, s.height)) + (
            ", cropped" if any(hr.crop(s.width, s.height)) else "")
        notes.append(f"hires fix: pass 1 at {s.width}x{s.height}, {hr.upscaler} upscale {how}, pass 2 at "
                     f"{tw}x{th}: the last {run} of {length} step(s) (denoise {hr.denoise:g})")
        other = getattr(tb, "hires_checkpoint", None)
        if other is not None:
            import os

            name = os.fspath(other) if isinstance(other, (str, os.PathLike)) else other.folder.name
            notes.append(f"hires checkpoint: pass 2 runs {name} (its text encoders, UNet and VAE); its parts are the "
                         "hires.* below")
    if getattr(tb, "refiner", None) is not None:
        import os

        ref = tb.refiner
        name = os.fspath(ref) if isinstance(ref, (str, os.PathLike)) else ref.folder.name
        where = f"timesteps under {round(1000 * (1 - tb.refiner_switch_at))}" if tb.refiner_switch_at < 1 else \
            "never: no timestep is past 1"
        if tb.hires is not None:
            where += {"second pass": ", in the hires pass only", "first pass": ", in the first pass only, then runs "
                      "all of the hires pass", "both passes": ", in either pass; from the first, all of the hires "
                      "pass"}[tb.hires_refiner_pass]
        notes.append(f"refiner: {name} takes over at {tb.refiner_switch_at:g} ({where}); its parts are the "
                     "refiner.* below")
    control = getattr(s, "control_image", None)
    if control is not None:
        notes.append("control image: VAE-encoded and concatenated to the noise at every step, preprocessor "
                     f"{getattr(control, 'preprocessor', 'none')}")
    for k, u in enumerate(tb.controlnets if tb is not None else []):
        k = tb.place(u, k)  # noqa: PLW2901 - numbered among all the units given (reference units too)
        notes.append(f"controlnet {k}: {u.part.name if u.part is not None else u.net}, scale {u.scale:g}, "
                     f"steps {u.start:g}-{u.end:g}, preprocessor {u.preprocessor}"
                     + (f" at {u.made_at}" + (" (pixel perfect)" if u.pixel_perfect else "") if u.made_at else "")
                     + (", guess mode" if u.guess_mode else f", mode {u.control_mode}" if u.control_mode != "Balanced"
                        else ""))
    for u in (tb.references if tb is not None else []):  # sdrt.pipelines.refattn: a write pass a step
        k = next(j for j, v in enumerate(tb.units) if v is u)
        notes.append(f"controlnet {k}: {u.preprocessor} (no net: the picture's latent runs the UNet once more on each "
                     f"step it is on), weight {u.scale:g}, steps {u.start:g}-{u.end:g}")
    refs = getattr(s, "reference_images", None)
    if refs:  # FLUX.1 Kontext: their tokens ride along in every transformer call
        sizes = ", ".join(f"{im.shape[1]}x{im.shape[0]}" for im in refs)
        tokens = sum((im.shape[0] // 16) * (im.shape[1] // 16) for im in refs)
        notes.append(f"reference images: {len(refs)} ({sizes}), {tokens} tokens beside the image's "
                     f"{(s.width // 16) * (s.height // 16)} in every transformer call")
    return notes

