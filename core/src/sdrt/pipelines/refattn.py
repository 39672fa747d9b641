"""sd-webui-controlnet's reference modules: a picture guides the UNet through its own statistics, no model file.

``pipe.generate(prompt, controlnets=[ControlNet(None, picture, preprocessor="reference_only", scale=1.0, low=0.5)])``
(the extension's unit with ``model: "None"``; ``low`` is its ``threshold_a``, "Style Fidelity (only for Balanced
mode)", 0.5 unless given; ``reference_adain`` and ``reference_adain+attn`` alike). Per UNet call of a step the unit
is on at (its window and hires option, as a ControlNet unit's), as the extension's ``UnetHook.forward`` does it:

1. the picture, resized to the pass's size with the unit's resize mode, is VAE-encoded once per size (the latent
   distribution's mean; the extension samples it with torch's global generator) and noised to the call's
   timestep, rounded: ``sqrt(a_t) latent + sqrt(1 - a_t) noise`` (``ref_xt``), one noise row per row of the call;
2. the *write* pass: the UNet on ``ref_xt`` with the call's timestep, text and extra inputs (no ControlNet
   residuals: the extension runs the UNet's own forward) keeps each self-attention layer's normalized input
   (``reference_only``, ``reference_adain+attn``) and the mean and variance of the wrapped blocks' outputs
   (``reference_adain``, ``reference_adain+attn``);
3. the *read* pass, the call itself: each layer whose threshold the unit's weight passes attends to
   ``[its own tokens, the bank]``, and each such block's output is renormalized to the written statistics
   (:mod:`sdrt.checkpoint.refattention`), the unconditional rows mixed with their plain result:
   ``fidelity * plain + (1 - fidelity) * guided``.

The weight picks the layers: the extension sorts the transformer blocks by width, widest first (in its module
order: input, middle, output blocks), gives block ``i`` of ``n`` the threshold ``i / n``, and a unit writes to the
blocks whose threshold is below its weight (1: all of them; 0.5: the wider half); the AdaIN blocks have thresholds
of their own (:func:`sdrt.checkpoint.refattention.gn_blocks`). The style fidelity is the slider's, clamped to
0..1; cubed on SDXL; 1 with "ControlNet is more important"; 0 with "My prompt is more important" and in the hires
fix's second pass. Several units write into the same banks (concatenated; the statistics averaged), their
fidelities averaged per layer.

The noise: the extension draws it with ``torch.randn_like`` from torch's global generator (A1111 seeds it with the
image's seed before the initial noise; what else draws from it in between varies), which no other program
reproduces. sdrt draws it from the run's generator at each call, as diffusers' community
``StableDiffusionReferencePipeline`` does (with diffusers' seeds, ``rng="cpu"``, the order that pipeline draws in);
with A1111's per-image seeds from torch's CPU generator seeded with the last image's seed, after one latent's draw
(where A1111's global generator is once the initial noise is drawn).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from .controlnet import CONTROL_MODES, REFERENCE

if TYPE_CHECKING:  # pragma: no cover
    from .controlnet import ControlNet, ControlState
    from .parts import Part

#: the extension's reference modules (``model: "None"``); the ones sdrt runs
MODULES = REFERENCE
RUNS = MODULES
#: the families whose UNet has the extension's transformer blocks
FAMILIES = ("sd1", "sdxl")
#: the style fidelity slider's default (the extension's threshold_a)
FIDELITY = 0.5


def is_reference(unit: Any) -> bool:
    return getattr(unit, "preprocessor", None) in MODULES


def fidelity(unit: ControlNet, family: str, hires: bool) -> float:
    """The extension's ``current_style_fidelity`` of a unit."""
    sf = min(max(float(FIDELITY if unit.low is None else unit.low), 0.0), 1.0)
    if family == "sdxl":  # "sdxl's attention hacking is highly unstable": 0.5 ** 3 = 0.125 by default
        sf = sf ** 3.0
    if unit.control_mode == CONTROL_MODES[2]:
        return 1.0
    if unit.control_mode == CONTROL_MODES[1] or hires:
        return 0.0
    return sf


ATTN = ("reference_only", "reference_adain+attn")  #: the modules that write the self-attention banks
ADAIN = ("reference_adain", "reference_adain+attn")  #: the modules that write the blocks' statistics


def graph_kinds(units: Sequence[Any]) -> tuple[bool, bool]:
    """Whether the run's reference units need the attention banks, the blocks' statistics."""
    return any(u.preprocessor in ATTN for u in units), any(u.preprocessor in ADAIN for u in units)


def use_graph(part: Part, adapters: int, heads: Any, attention: bool, adain: bool = False,
              t2i: str | None = None) -> None:
    """The UNet part runs its graph with IP attention for ``adapters`` IP-Adapters and, as asked, the reference
    attention and AdaIN of :mod:`sdrt.checkpoint.refattention` (none: as its file has it). They are counts and
    switches only, so the compiled graph is kept between jobs that ask the same. ``t2i``: the T2I-Adapter feature
    inputs of :mod:`sdrt.checkpoint.adapterresiduals` ("sd" or "sdxl" places; None: none)."""
    if not adapters and not attention and not adain and not t2i:
        part.edit_graph(None)
        return
    where = str(part.path)

    def edit(graph: Any) -> Any:
        import onnx

        from ..checkpoint.ipattention import ip_attention_graph
        from ..checkpoint.refattention import adain_graph, reference_graph

        model = onnx.ModelProto()
        model.CopyFrom(graph.model)
        if adapters:
            model = ip_attention_graph(model, heads, where, adapters=adapters)
        if attention:
            model = reference_graph(model, heads, where)
        if adain:
            model = adain_graph(model, where)
        if t2i:
            from ..checkpoint.adapterresiduals import adapter_graph

            model = adapter_graph(model, t2i, where)
        return graph.derive(model)

    from ..checkpoint.refattention import written

    keys = []
    if adapters:
        keys.append("ip_adapter" if adapters == 1 else f"ip_adapter*{adapters}")
    if attention:
        keys.append("reference_only")
    if adain:
        keys.append("reference_adain")
    if t2i:
        keys.append(f"t2i_adapter_{t2i}")
    # an ordinary call (the read pass) returns the UNet's own outputs only: the banks and statistics (about 200 MiB
    # a row on SDXL at 1024 in float16) are the write pass's, which asks for them (hook: Part.run(select=))
    part.edit_graph(edit, "+".join(keys), hidden=written)


class Layers:
    """The reference inputs of the part's graph: attention layer ``k`` -> width, level and write threshold; AdaIN
    block ``i`` -> channels and write threshold."""

    def __init__(self, part: Part) -> None:
        from ..checkpoint.refattention import bank_layers, gn_blocks, gn_layers, layer_places, ldm_order, self_layers

        inputs = part.inputs
        model = part.graph.model
        self.widths = bank_layers(inputs)
        self.threshold: dict[int, float] = {}
        self.level: dict[int, int] = {}
        if self.widths:
            paths = list(self_layers(model))
            places = layer_places(paths)
            walk = sorted(paths, key=ldm_order)  # the extension's torch_dfs order, then widest first (a stable sort)
            ranked = sorted(walk, key=lambda p: -self.widths.get(places[p], 0))
            self.threshold = {places[p]: i / len(ranked) for i, p in enumerate(ranked)}
            levels = 1 + max((int(p.split(".")[1]) for p in paths if p.startswith("down_blocks.")), default=0)
            levels = max(levels, 1 + max((int(p.split(".")[1]) for p in paths if p.startswith("up_blocks.")),
                                         default=0))
            for p in paths:
                head, b = p.split(".")[0], p.split(".")[1]
                self.level[places[p]] = (int(b) if head == "down_blocks" else levels - 1 - int(b)
                                         if head == "up_blocks" else levels - 1)
        self.blocks = gn_layers(inputs)
        self.gn_threshold = {i: t for i, (_, _, t, _) in enumerate(gn_blocks(model))} if self.blocks else {}
        self.channels = {i: inputs[f"ref_gn_mean_in_{i}"].shape[1] for i in self.blocks}
        mix = next((n for n in inputs if n.startswith(("ref_mix_", "ref_gn_mix_"))), None)
        self.dtype = np.dtype(inputs[mix].dtype) if mix is not None else np.dtype(np.float32)

    def tokens(self, k: int, h: int, w: int) -> int:
        """Layer ``k``'s tokens for a latent of ``h x w`` (each level halves it, rounding up)."""
        for _ in range(self.level.get(k, 0)):
            h, w = -(-h // 2), -(-w // 2)
        return h * w


def hook(pipe: Any, units: Sequence[ControlNet], part: Part, state: ControlState, generator: Any, *,
         width: int, height: int, batch: int, hires: bool, sample_name: str = "sample",
         slots: Sequence[int] | None = None) -> Any:
    """The denoiser hook of a pass: the write pass on the noised reference latents, then the read call's banks.

    Every call of a pass feeds banks of one shape (zeros and a mix of 0 where nothing is written), so that a
    backend compiles the edited UNet once: the write pass attends over as many zero tokens as the read pass has
    banked ones. (Units with different windows change the shape on the steps where only some are on.) ``slots``:
    each unit's place among the run's ``controlnets`` (what an error about its picture names)."""
    from ..checkpoint.refattention import gn_names, names
    from .controlnet import residual_inputs
    from .scheduling import alpha_at

    layers = Layers(part)
    family = pipe.family.name
    ms = pipe.family.model_sampling(width, height)
    c = pipe.family.latent_channels
    latents = [latent(pipe, u, width, height, slots[k] if slots is not None else k) for k, u in enumerate(units)]
    residuals = residual_inputs(part)
    noise = noise_source(pipe, generator)
    attn_units = [u for u in units if u.preprocessor in ATTN]
    zeros: dict[tuple[Any, ...], np.ndarray] = {}

    def zero(shape: tuple[int, ...]) -> np.ndarray:
        if shape not in zeros:
            zeros[shape] = np.zeros(shape, layers.dtype)
        return zeros[shape]

    def idle(rows: int, h: int, w: int) -> dict[str, np.ndarray]:
        out = {}
        for k, width_ in layers.widths.items():
            writers = sum(1 for u in attn_units if u.scale > layers.threshold[k])
            _, bank_in, mix = names(k)
            out[bank_in] = zero((rows, layers.tokens(k, h, w) * writers or 1, width_))
            out[mix] = zero((rows, 1, 1))
        for i in layers.blocks:
            _, _, mean_in, var_in, mix = gn_names(i)
            ch = layers.channels[i]
            out[mean_in] = out[var_in] = zero((rows, ch if isinstance(ch, int) and ch > 0 else 1, 1, 1))
            out[mix] = zero((rows, 1, 1, 1))
        return out

    def mixes(rows: int, fids: list[float]) -> np.ndarray:
        m = np.ones((rows, 1, 1), np.float32)
        if rows == 2 * batch:  # rows [uncond, cond], as the batched CFG denoiser stacks them
            m[:batch] = 1.0 - sum(fids) / len(fids)
        return m

    def run(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        sample = feeds[sample_name]
        rows, h, w = sample.shape[0], sample.shape[2], sample.shape[3]
        base = idle(rows, h, w)
        on = [(u, lat) for u, lat in zip(units, latents) if state.on(u)]
        if not on:
            return base
        a = alpha_at(ms.alphas_cumprod, float(np.asarray(feeds["timestep"]).reshape(-1)[0]))
        banks: dict[int, list[np.ndarray]] = {k: [] for k in layers.widths}
        fids: dict[int, list[float]] = {k: [] for k in layers.widths}
        stats: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {i: [] for i in layers.blocks}
        gn_fids: dict[int, list[float]] = {i: [] for i in layers.blocks}
        for unit, lat in on:
            draw = noise.randn((rows, *lat.shape[1:])).astype(np.float32)
            ref_xt = (np.float32(a ** 0.5) * lat + np.float32((1 - a) ** 0.5) * draw).astype(np.float32)
            if sample.shape[1] > c:  # an inpainting UNet: the extension's zero mask and the picture's latent
                ref_xt = np.concatenate([ref_xt, np.zeros_like(ref_xt[:, :1]), np.repeat(lat, rows, axis=0)], axis=1)
            write = dict(feeds)
            write.update(base)
            write[sample_name] = ref_xt.astype(sample.dtype)
            for name in residuals:
                if name in write:
                    write[name] = np.zeros_like(write[name])
            attn = [k for k in layers.widths if unit.preprocessor in ATTN and unit.scale > layers.threshold[k]]
            adain = [i for i in layers.blocks if unit.preprocessor in ADAIN and unit.scale > layers.gn_threshold[i]]
            want = tuple(names(k)[0] for k in attn) + tuple(x for i in adain for x in gn_names(i)[:2])
            if not want:  # a weight that passes no layer's threshold writes nothing: no write pass to run
                continue
            out = part.run(write, select=want)  # the banks it writes, nothing else copied out
            sf = fidelity(unit, family, hires)
            for k in attn:
                banks[k].append(np.asarray(out[names(k)[0]]))
                fids[k].append(sf)
            for i in adain:
                mean_out, var_out = gn_names(i)[:2]
                stats[i].append((np.asarray(out[mean_out]), np.asarray(out[var_out])))
                gn_fids[i].append(sf)
        got = dict(base)
        for k in layers.widths:
            if banks[k]:
                _, bank_in, mix = names(k)
                got[bank_in] = np.concatenate(banks[k], axis=1).astype(layers.dtype, copy=False)
                got[mix] = mixes(rows, fids[k]).astype(layers.dtype)
        for i in layers.blocks:
            if stats[i]:
                _, _, mean_in, var_in, mix = gn_names(i)
                got[mean_in] = (sum(m for m, _ in stats[i]) / len(stats[i])).astype(layers.dtype)
                got[var_in] = (sum(v for _, v in stats[i]) / len(stats[i])).astype(layers.dtype)
                got[mix] = mixes(rows, gn_fids[i]).reshape(rows, 1, 1, 1).astype(layers.dtype)
        return got

    return run


def latent(pipe: Any, unit: ControlNet, width: int, height: int, k: int) -> np.ndarray:
    """The unit's picture at the pass's size (its resize mode), VAE-encoded (the mean), once per size."""
    from .reference import MEAN

    key = ("reference", width, height)
    if key in unit.origin and not pipe._dry:
        return unit.origin[key]
    pixels = pipe._control_tensor(unit, width, height, k)  # [1, 3, H, W] in [0, 1]
    got = pipe._encode_image(pixels * np.float32(2.0) - np.float32(1.0), MEAN).astype(np.float32)
    if pipe._dry:  # the plan's dry run encodes to zeros, 1 wide where the graph does not say its output's size (an
        # ORT-optimized VAE's): the pass's latent size, never kept for the run
        return np.zeros(pipe.family.latent_shape(1, height, width), np.float32)
    unit.origin[key] = got
    return got


def noise_source(pipe: Any, generator: Any) -> Any:
    """What draws the reference's noise: the run's generator (diffusers' stream), or torch's CPU generator of the
    last image's seed past one latent (A1111's per-image seeds)."""
    from ..samplers import TorchGenerator
    from .inpaintcn import LeanNoise

    if isinstance(generator, LeanNoise):  # an inpaint_only+lama unit's lean is the run's draws', not the reference's
        generator = generator.inner
    if isinstance(generator, TorchGenerator) or generator is None:
        return generator if generator is not None else TorchGenerator(0)
    seeds = getattr(getattr(generator, "noise", None), "seeds", None) or [0]
    own = TorchGenerator(int(seeds[-1]))
    own.randn(tuple(getattr(generator, "shape", (1, 4, 8, 8)))[1:])
    return own


def check(pipe: Any, units: Sequence[ControlNet], where: Sequence[str]) -> None:
    """The reference units of a run, checked against the model (one line each)."""
    family = pipe.family.name
    for unit, w in zip(units, where):
        if unit.preprocessor not in RUNS:
            raise InputError(f"{w}: sdrt runs reference_only, not yet {unit.preprocessor}", where=w,
                             fix="use preprocessor='reference_only'")
        if family not in FAMILIES:
            raise InputError(f"{w}: {unit.preprocessor} guides an SD 1.x or SDXL UNet, and this model is "
                             f"{pipe.family.label}", where=w, fix="use an SD 1.x or SDXL model, or leave the unit out")
        if getattr(pipe, "instruct_pix2pix", False):
            raise InputError(f"{w}: {unit.preprocessor} runs on an ordinary UNet, and this is an InstructPix2Pix "
                             "model", where=w, fix="leave the reference unit out")
