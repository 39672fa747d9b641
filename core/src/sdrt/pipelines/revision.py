"""sd-webui-controlnet's Revision: an SDXL picture prompt through the pooled text vector, no ControlNet model.

``pipe.generate(prompt, controlnets=[ControlNet(None, picture, preprocessor="revision_clipvision", scale=1.0,
preprocessor_models="clip_g.pth")])`` (the extension's unit with ``model: "None"``; ``revision_ignore_prompt``
alike). ``preprocessor_models`` is the OpenCLIP ViT-bigG/14 image encoder: the extension's ``clip_g.pth``
(``annotator/downloads/clip_vision/``), ComfyUI's ``clip_vision_g.safetensors`` (``models/clip_vision/``), or
h94/IP-Adapter's ``sdxl_models/image_encoder`` folder, bound onto sdrt's shipped ``clip_vision_g`` graph
(:func:`sdrt.checkpoint.ipadapter.open_image_encoder`). ``low`` is the unit's ``threshold_a``, "Noise Augmentation"
(0 unless given, 0 to 1).

What the extension does (``annotator/clipvision``, ``UnetHook.forward``), and sdrt with it:

1. the picture is squashed to the encoder's size (224) with OpenCV's ``INTER_AREA`` (no crop), then through
   transformers' ``CLIPImageProcessor`` (the resize and centre crop keep that size; scaled to [0, 1], OpenAI CLIP's
   mean and std), and encoded: its ``image_embeds`` (1280 wide, the projection output, not normalized);
2. noise augmentation, once a job: ``sqrt(a_k) embeds + sqrt(1 - a_k) noise`` with ``k = int(low * 1000)`` clipped to
   0..999 and ``a`` the cumulative product of the linear schedule from 1e-4 to 2e-2 (1000 steps; its ``q_sample``);
   at ``low`` 0 that is still a hundredth of noise;
3. at each step a unit is on at (its window, as a ControlNet unit's; the hires fix's passes both, whatever its
   hr_option, as the extension), the first 1280 of the UNet's ``y`` (SDXL's pooled text vector, ``text_embeds``) are
   replaced by the sum over the units on of ``weight * embeds``, for the conditional rows; the unconditional rows get
   zeros there;
4. while any unit is on, the text context (``encoder_hidden_states``) of every row is zeros when any unit is
   ``revision_ignore_prompt``, or when the prompt and the negative prompt are both empty.

The noise: the extension draws it with ``torch.randn_like`` from torch's global generator, unseeded by the job, which
no other program reproduces; sdrt draws it from torch's CPU generator seeded with the job's seed, one draw of
``[1, 1280]`` a unit in the units' order (so a job is reproducible from its seed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, ModelError

if TYPE_CHECKING:  # pragma: no cover
    from .controlnet import ControlNet, ControlState

#: the extension's revision modules (``model: "None"``)
MODULES = ("revision_clipvision", "revision_ignore_prompt")
IGNORE_PROMPT = "revision_ignore_prompt"
#: the families whose UNet reads a pooled text vector the extension replaces (SDXL's ``y``; the refiner's too: the
#: extension's ``is_sdxl`` holds for a refiner checkpoint, whose ``y`` starts with the same 1280-wide pooled text)
FAMILIES = ("sdxl", "sdxl-refiner")
#: the noise augmentation slider's default (the extension's threshold_a)
NOISE = 0.0


def is_revision(unit: Any) -> bool:
    return getattr(unit, "preprocessor", None) in MODULES


def noise_levels(low: float | None) -> tuple[np.float32, np.float32]:
    """``(sqrt(a_k), sqrt(1 - a_k))`` of the extension's ``AbstractLowScaleModel.q_sample`` for a noise
    augmentation ``low``: the linear schedule (sqrt-spaced betas from 1e-4 to 2e-2, 1000 steps) in float64, cast to
    float32 as its buffers are."""
    k = min(max(int(float(NOISE if low is None else low) * 1000), 0), 999)
    betas = np.linspace(1e-4 ** 0.5, 2e-2 ** 0.5, 1000, dtype=np.float64) ** 2
    ac = np.cumprod(1.0 - betas)
    return np.float32(np.sqrt(ac[k])), np.float32(np.sqrt(1.0 - ac[k]))


def pixels(rgb: np.ndarray, size: int) -> np.ndarray:
    """The extension's ``ClipVisionDetector`` input: the picture squashed to ``size x size`` with OpenCV's
    INTER_AREA, then CLIP's scale and normalization: ``[1, 3, size, size]`` float32."""
    from .cvresize import resample
    from .ipadapter import CLIP_MEAN, CLIP_STD

    small = resample(np.ascontiguousarray(rgb[:, :, :3]), size, size, "area") \
        if rgb.shape[:2] != (size, size) else rgb[:, :, :3]
    arr = (small.astype(np.float64) * (1 / 255)).astype(np.float32)
    arr = (arr - CLIP_MEAN) / CLIP_STD
    return np.ascontiguousarray(arr.transpose(2, 0, 1)[None])


def check(pipe: Any, units: Sequence[ControlNet], names: Sequence[str]) -> None:
    """Revision units against the model, before anything runs: SDXL only (one line naming the unit otherwise), a
    UNet that reads ``text_embeds``, units that run on both passes in Balanced mode (the extension reads neither)."""
    from .controlnet import CONTROL_MODES, HR_OPTIONS

    family = pipe.family
    for unit, where in zip(units, names):
        if family.name not in FAMILIES:
            raise InputError(f"{where}: {unit.preprocessor} replaces SDXL's pooled text vector with a picture's "
                             f"CLIP embedding, and this model is {family.label}", where=where,
                             fix="use an SDXL model, or an IP-Adapter for this one ({@ip_adapter})")
        if unit.control_mode != CONTROL_MODES[0] or unit.guess_mode:
            raise InputError(f"{where}: {unit.preprocessor} has no control mode (it adds no residuals)",
                             where=f"{where} control_mode", fix="leave control_mode Balanced")
        if unit.hr_option != HR_OPTIONS[0]:
            raise InputError(f"{where}: {unit.preprocessor} runs on both passes of the hires fix, as the extension "
                             "runs it", where=f"{where} hr_option", fix="leave hr_option 'Both'")
    if "text_embeds" not in pipe.denoiser.inputs:
        raise InputError(f"{names[0]}: this model's {pipe.denoiser.name} takes no text_embeds (SDXL's pooled "
                         "vector), which revision replaces", where=names[0], fix="use an SDXL model")


class Prepared:
    """A job's revision: each unit's noised embeds ``[1, width]`` and whether the context is zeroed."""

    def __init__(self, units: list[ControlNet], embeds: list[np.ndarray], zero_context: bool) -> None:
        self.units, self.embeds, self.zero_context = units, embeds, zero_context


def _encoder(pipe: Any, unit: ControlNet, where: str) -> Any:
    from ..checkpoint.ipadapter import open_image_encoder
    from .annotators import encoder_path

    arg = f"{where} {unit.models_arg}"
    path = encoder_path(unit.preprocessor, unit.preprocessor_models, arg)
    bigg = ("pass OpenCLIP ViT-bigG/14 (the extension's clip_g.pth, ComfyUI's clip_vision_g.safetensors, "
            "h94/IP-Adapter's sdxl_models/image_encoder)")
    try:
        enc = open_image_encoder(path, what=arg)
    except ModelError as exc:  # an encoder of another size: ViT-bigG/14 is the one (the IP-Adapters' advice names ViT-H)
        fix = bigg if "of another size" in exc.what else (exc.fix or "").replace("{@" + arg + "}", arg)
        raise ModelError(exc.what, where=arg, fix=fix) from exc
    width = pipe.denoiser.inputs["text_embeds"].shape[-1]
    if isinstance(width, int) and enc.embed_dim is not None and enc.embed_dim != width:
        raise ModelError(f"the image encoder {path.name} gives {enc.embed_dim}-wide image embeds and the UNet's "
                         f"pooled text vector (text_embeds) is {width} wide", where=arg, fix=bigg)
    return enc


def prepare(pipe: Any, units: list[ControlNet], names: list[str], seed: int, prompt: Any, negative: Any
            ) -> Prepared:
    """Encode each unit's picture (one encoder call per distinct encoder) and noise it (module doc, steps 1-2)."""
    from ..samplers import TorchGenerator
    from .images import to_rgb
    from .ipadapter import encoder_key

    embeds: list[np.ndarray | None] = [None] * len(units)
    groups: dict[Any, list[int]] = {}
    encs = {}
    for j, unit in enumerate(units):
        enc = _encoder(pipe, unit, names[j])
        key = encoder_key(enc)
        encs[key] = enc
        groups.setdefault(key, []).append(j)
    own = pipe.__dict__.setdefault("_revision_encoders", {})
    for g, (key, js) in enumerate(groups.items()):
        enc = encs[key]
        rows = [pixels(to_rgb(units[j].image, "revision image", names[j]), enc.image_size) for j in js]
        name = "revision_encoder" if g == 0 else f"revision_encoder_{g + 1}"
        out = run_encoder(pipe, own, key, enc, np.concatenate(rows), name)
        got = np.asarray(out["image_embeds"] if "image_embeds" in out else next(iter(out.values())), np.float32)
        for r, j in enumerate(js):
            embeds[j] = got[r:r + 1]
    for key in [k for k in own if k not in groups] if not pipe._dry else []:  # one set of encoders held at a time
        own.pop(key).close()
    gen = TorchGenerator(int(seed))
    noised = []
    for unit, e in zip(units, embeds):
        assert e is not None
        a, b = noise_levels(unit.low)
        noise = gen.randn(e.shape).astype(np.float32)
        noised.append((a * e + b * noise).astype(np.float32))
    empty = _empty(prompt) and _empty(negative)
    return Prepared(list(units), noised, empty or any(u.preprocessor == IGNORE_PROMPT for u in units))


def _empty(text: Any) -> bool:
    if text is None:
        return True
    if isinstance(text, str):
        return text == ""
    return all(_empty(t) for t in text) if isinstance(text, (list, tuple)) else False


def run_encoder(pipe: Any, own: dict, key: Any, enc: Any, rows: np.ndarray, name: str) -> dict[str, Any]:
    """The image encoder ``enc`` on ``rows`` as the pipeline's part ``name``, kept in ``own`` by ``key`` (a dry run:
    its call recorded on a twin, zeros back); released after its one call a job in low-memory mode or where the
    memory plan does not keep it resident, as an IP-Adapter's encoder."""
    from .parts import Part

    if pipe._dry:
        part = Part(name, Path(enc.graph), backend=pipe.backend, device=pipe.device, options=pipe.options)
        part = pipe._parts[name] = part.dry()
        return part.run({"pixel_values": rows})
    from .ipadapter import kept_encoder

    part = kept_encoder(pipe, own, key, enc, name)
    out = part.run({"pixel_values": rows})
    plan = getattr(pipe, "_memory_plan", None)  # it counts the encoder as an image encoder (plan.IMAGE_ENCODERS)
    placed = plan.placement(name) if plan is not None else None
    if pipe.is_low_memory or (placed.placement != "resident" if placed is not None else
                              plan is not None and any(p.placement != "resident" for p in plan.parts)):
        from .lowmem import release  # used once a job, as the IP-Adapters' encoders: not held through the denoising

        release([part])
    return out


def hook(prep: Prepared, state: ControlState, *, batch: int, text_input: str) -> Any:
    """The denoiser hook (module doc, steps 3-4): a call of ``2 * batch`` rows is a batched CFG call (``[uncond,
    cond]``), one of ``3 * batch`` an InstructPix2Pix one (``[cond, uncond, uncond]``), else all rows are
    conditional."""
    from .controlnet import active

    def run(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        on = [j for j, u in enumerate(prep.units) if active(u, state.step, state.total)]
        if not on:
            return {}
        y: Any = 0
        for j in on:
            y = y + prep.embeds[j] * np.float32(prep.units[j].scale)
        pooled = feeds["text_embeds"]
        rows = pooled.shape[0]
        new = np.repeat(np.asarray(y, np.float32), rows, axis=0).astype(pooled.dtype)
        if rows == 2 * batch:
            new[:batch] = 0
        elif rows == 3 * batch:
            new[batch:] = 0
        out = {"text_embeds": new}
        if prep.zero_context:
            out[text_input] = np.zeros_like(feeds[text_input])
        return out

    return run


def close(pipe: Any) -> None:
    for part in pipe.__dict__.pop("_revision_encoders", {}).values():
        part.close()
