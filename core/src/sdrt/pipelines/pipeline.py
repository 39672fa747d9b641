"""The generic pipeline: prompt (+ init image, mask) -> images, on any backend, for any model family.

Data flow: model folder -> ``Part`` graphs -> ``sdrt.load`` sessions (one per static shape)
-> the family's conditioner -> sampling loop around the family's denoiser call -> VAE decoder
-> HxWx3 uint8 images. What differs between SD 1.x, 2.x and SDXL lives in
:mod:`sdrt.pipelines.families`; this module owns the loop, validation, seeds, batching, callbacks,
interruption, the run plan (:meth:`Pipeline.plan`) and the PNG settings.

Threads: one pipeline runs one job at a time. ``generate``, ``__call__``, ``plan`` and the weight calls
(``set_loras``, ``load_weights``, ``add_embedding``, ``set_vae``, ``set_text_encoders``) hold the pipeline's lock, so
a second thread waits for the first job to end (``close`` interrupts it first; from the job's own step callback these are refused); ``interrupt()`` may be called
from any thread and stops the running job after its current step with ``sdrt.errors.Interrupted``
(a step callback that returns ``False`` does the same). Nothing is returned from a stopped job.

Seeds follow diffusers: one ``torch.Generator("cpu").manual_seed(seed)`` stream per run (reproduced
by ``sdrt.samplers.TorchGenerator``) draws, in diffusers' order, the VAE encoder's sample (img2img,
inpainting), the initial noise for the whole batch, and then each ancestral step's noise. Euler,
Euler a, DPM++ 2M (Karras) and DDIM run diffusers' own discretization and steps
(:mod:`sdrt.pipelines.loops`); every other sampler of ``sdrt.samplers`` runs k-diffusion's form on
the folder's sigma table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, Interrupted, ModelError, SdrtError, UnknownOptions, WeightsError, in_caller_words
from .bounds import MAX_SIDE
from .budget import MemoryMixin
from .extras import ToolboxMixin
from .families import ModelCall
from .flowparts import flow_size_error, largest_side, sd3_size_error
from .folder import ModelFolder, without_t5
from .images import from_nchw, nearest, to_nchw, to_rgb
from .inpaint import InpaintMixin
from .parts import Part
from .prompts import Conditioning, PromptEncoder
from .settings import Generation, Settings, check_keywords, validate
from .weights import WeightState

log = logging.getLogger("sdrt.pipelines")

Callback = Callable[[int, int, np.ndarray], "bool | None"]  # (step, total, latents); False stops the run

#: samplers whose diffusers scheduler the pipeline follows exactly: (sampler, schedule) -> loop kind
_DIFFUSERS_FORM = {
    ("euler", "normal"): "euler", ("euler", "karras"): "euler-karras",
    ("euler_ancestral", "normal"): "euler_a", ("euler_ancestral", "karras"): "euler_a-karras",
    ("dpmpp_2m", "karras"): "dpm-karras", ("dpmpp_2m", "normal"): "dpm",
    ("ddim", "ddim_uniform"): "ddim", ("ddim", "normal"): "ddim",
}


class Pipeline(ToolboxMixin, MemoryMixin, InpaintMixin):
    """A model folder ready to generate. Build one with :func:`sdrt.pipelines.load`.

    ``family`` is the folder's :class:`sdrt.pipelines.families.Family`. The parts are reachable as
    ``text_encoder``, ``text_encoder_2`` (SDXL), ``unet``, ``vae_encoder`` (None without one) and
    ``vae_decoder``: each a :class:`Part` with its ``graph``, its compiled ``sessions`` and ``update_weights``.
    """

    def __init__(self, folder: ModelFolder, *, backend: str = "auto", device: Any = None,
                 low_memory: bool | None = False, vae_tile: int | None = None, memory: int | str | None = None,
                 **options: Any) -> None:
        from .budget import parse_memory, parse_placement

        options = dict(options)
        for name, value, none_ok in (("low_memory", low_memory, True),
                                     ("share_blocks", options.get("share_blocks", False), False)):
            if not (isinstance(value, (bool, np.bool_)) or (none_ok and value is None)):
                raise InputError(f"{name} must be True or False{' or None' if none_ok else ''}, got "
                                 f"{type(value).__name__} {value!r:.40}", where=name,
                                 fix=f"pass {{@{name}=}}True or False" + (" (None: decide from the device's memory)"
                                                                          if none_ok else ""))
        quantize = options.get("quantize")
        if quantize is not None:
            from ..quantization import parse

            if not isinstance(quantize, str):
                raise InputError(f"quantize must be a name, got {type(quantize).__name__} {quantize!r:.40}",
                                 where="quantize", fix="pass {@quantize=}'int8', 'int4', 'int4-64' or 'fp8', or None")
            try:
                parse(quantize)
            except SdrtError as exc:
                raise InputError(exc.what, where="quantize", fix=exc.fix) from None
        if vae_tile is not None and (isinstance(vae_tile, (bool, np.bool_)) or not isinstance(vae_tile, (int, np.integer))
                                     or vae_tile < 8):
            raise InputError(f"vae_tile must be an int of 8 or more latent pixels (8 image pixels each), got "
                             f"{type(vae_tile).__name__} {vae_tile!r:.40}", where="vae_tile",
                             fix="pass {@vae_tile=}64 (512 pixels) or so, or None (the default) to decode whole images")
        #: the memory budget in bytes (None: what the device reports); the plan meets it (sdrt.pipelines.budget)
        self.memory = None if memory is None else parse_memory(memory, "memory")
        self._memory_plan = None
        #: a streamed denoiser compiles identical blocks once and swaps their weights (update_weights)
        self.share_blocks = bool(options.pop("share_blocks", False))
        self.folder = folder
        self.family = folder.family_class(folder)
        #: parts (or roles: text, vae) placed on a CPU device beside an accelerator (sdrt.pipelines.budget)
        self.placement = parse_placement(options.pop("placement", None),
                                         {p: r for p, r in self.family.parts.items() if p in folder.parts})
        #: keep only the running part loaded (None: decide from the device's reported memory)
        self.low_memory = None if low_memory is None else bool(low_memory)
        #: decode/encode the VAE by tiles of this many latent pixels (None: whole images)
        self.vae_tile = None if vae_tile is None else int(vae_tile)
        self.backend = backend
        self.device = device
        self.options = options
        #: ``quantize="int8" | "int4" | "fp8"``: the weights of these parts only (the VAE stays float: it
        #: writes the pixels, and it is a small share of the bytes); ``sdrt.quantization``
        self.quantize = options.pop("quantize", None)
        self._parts = {name: Part(name, folder.part_file(name), backend=backend, device=device,
                                  options={**options, "quantize": self.quantize}
                                  if self.quantize and not name.startswith("vae") else options)
                       for name in self.family.parts if name in folder.parts}
        for name, part in self._parts.items():
            part.label = f"{folder.name}/{name}"
        if vae_tile is not None:
            self._check_vae_tile(vae_tile)
        for name, bound in folder.weights.items():  # a single file: its weights on the shipped graphs
            part = self._parts.get(name)
            if part is not None:
                part.default_weights = part.weights = bound
                part.weights_factory = lambda bound=bound: bound  # low-memory mode drops and rebuilds them
        self.family.model_sampling(self.default_size, self.default_size)  # a bad scheduler config fails at load
        self._prompts: PromptEncoder | None = None
        self._tokenizers: dict[str, Any] | None = None
        self._weight_state: WeightState | None = None
        self._checked = False
        #: refiners loaded from a path (``refiner=``), by real path; shared with the run plan's dry copies
        self._refiners: dict[str, Pipeline] = {}
        self._refiner_job: Pipeline | None = None  # this job's refiner (sdrt.pipelines.refiner.resolve)
        #: the hires fix's second checkpoints loaded from a path (``hires_checkpoint=``; one at a time), by real path
        self._hires_models: dict[str, Pipeline] = {}
        self._dry = False
        self._lock = threading.Lock()  # one job at a time
        self._owner: int | None = None  # the thread that holds _lock (a step callback runs on it)
        # guards _running / _stop; re-entrant: a signal handler calling interrupt() runs on the main thread, maybe
        # while that thread holds it at a job's start or end
        self._state = threading.RLock()
        self._stop = threading.Event()
        self._running = False

    def _check_vae_tile(self, tile: int) -> None:
        """Tiles need a VAE whose spatial axes are dynamic: one exported for a fixed size takes that size only."""
        for part in (self._parts.get("vae_decoder"), self._parts.get("vae_encoder")):
            if part is None:
                continue
            info = next(iter(part.inputs.values()), None)
            dims = tuple(info.shape[2:]) if info is not None and len(info.shape) == 4 else ()
            if dims and all(isinstance(d, int) for d in dims):
                raise InputError(f"{{@vae_tile=}}{tile} needs a VAE with dynamic height and width, and this model's "
                                 f"{part.name} is exported for {'x'.join(map(str, dims))} only", where="vae_tile",
                                 fix="leave {@vae_tile} unset for this model, or export its VAE with dynamic axes")

    def __repr__(self) -> str:
        return f"Pipeline({str(self.folder.path)!r}, {self.folder.family}, backend={self.backend!r})"

    text_encoder = property(lambda self: self._parts.get("text_encoder"))
    text_encoder_2 = property(lambda self: self._parts.get("text_encoder_2"))
    unet = property(lambda self: self._parts.get("unet"))
    vae_encoder = property(lambda self: self._parts.get("vae_encoder"))
    vae_decoder = property(lambda self: self._parts.get("vae_decoder"))

    @property
    def parts(self) -> dict[str, Part]:
        return dict(self._parts)

    @property
    def schedule(self) -> Any:
        """The model sampling at the default size: the folder's scheduler, with what a checkpoint bound by
        ``load_weights`` decides (its prediction, zero terminal SNR: ``family.scheduler_overrides``)."""
        return self.family.model_sampling(self.default_size, self.default_size)

    @property
    def denoiser(self) -> Part:
        """The family's denoising part (``unet``; ``transformer`` for DiT families)."""
        return self._parts[self.family.denoiser_part]

    def close(self) -> None:
        """Free every compiled session (a later job compiles them again). A running job is interrupted and waited
        for: its sessions are never closed under it."""
        if self._owner != threading.get_ident():  # from the job's own callback, _job refuses it: no interrupt then
            self.interrupt()
        with self._job("close()"):
            self._close_parts()

    def _close_parts(self) -> None:
        for p in self._parts.values():
            p.close()
        self._close_extras()  # ControlNet parts, a preview decoder
        for ref in self._refiners.values():  # a refiner this pipeline loaded from a path
            ref.close()
        self._refiners.clear()
        for other in self.__dict__.get("_hires_models", {}).values():  # a hires checkpoint it loaded from a path
            other.close()
        self.__dict__.get("_hires_models", {}).clear()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ text
    @property
    def prompts(self) -> PromptEncoder:
        if self._prompts is None:
            if self._tokenizers is None:
                from ..text import CLIPTokenizer, T5Tokenizer

                kinds = {e.tokenizer: e.kind for e in self.family.encoders}
                self._tokenizers = {k: (T5Tokenizer if kinds.get(k) == "t5" else CLIPTokenizer).from_folder(v)
                                    for k, v in self.folder.tokenizers.items()}
            self._prompts = self.family.conditioner(self._parts, self._tokenizers)
        return self._prompts

    def _conditioning(self, s: Settings) -> tuple[Conditioning, Conditioning | None]:
        t5 = {"max_length": s.max_sequence_length} if s.max_sequence_length else {}
        cond = self._limit(self.prompts.encode(s.prompt, s.clip_skip, **t5), "prompt")
        negative = self.family.negative_pass(s.cfg, s.negative_prompt)
        if s.image_cfg is not None and self.instruct_pix2pix:  # its rule (sdrt.pipelines.edit.guidance)
            from .edit import guidance

            negative = guidance(s.cfg, s.image_cfg, s.strength_rule) != "none"
        if not negative:
            if s.negative_prompt and not self._dry:  # said, not dropped in silence (as diffusers and A1111 drop it)
                log.warning("the negative prompt is not used: CFG %g runs one pass, with the prompt only (a CFG "
                            "above 1 runs the negative pass%s)", s.cfg,
                            f"; {self.family.label}'s default is 1" if self.family.default_cfg == 1 else "")
            elif s.cfg != 1 and self.family.negative_pass(s.cfg, "x") and not self._dry:  # Flux: true CFG needs one
                log.warning(in_caller_words(
                    f"{{@cfg}} {s.cfg:g} is not used: {self.family.label} runs its true-CFG pass only with a negative "
                    "prompt (diffusers' true_cfg_scale rule), so this run makes one pass, with the prompt only; give "
                    "a {@negative_prompt} for the CFG pass, or leave {@cfg} at 1"))
            return cond, None
        if self.folder.force_zeros_for_empty_prompt and not s.negative_prompt:
            uncond = self.prompts.zeros_like(cond)
        else:
            try:
                uncond = self._limit(self.prompts.encode(s.negative_prompt, s.clip_skip, **t5), "negative_prompt")
            except InputError as exc:  # the text side speaks of "the prompt": say which one
                if exc.where != "prompt":
                    raise
                raise InputError(exc.what.replace("the prompt", "the negative prompt"), where="negative_prompt",
                                 fix=exc.fix) from None
            chunks = max(cond.chunks, uncond.chunks)
            cond = self.prompts.pad_to(cond, chunks, s.clip_skip, **t5)
            uncond = self.prompts.pad_to(uncond, chunks, s.clip_skip, **t5)
        return cond, uncond

    def _hires_conditioning(self, s: Settings) -> tuple[Conditioning, Conditioning | None] | None:
        """The conditioning of the hires fix's own prompts (``hires_prompt`` / ``hires_negative_prompt``), or None
        when the second pass has the first pass's."""
        hr = getattr(s.toolbox, "hires", None)
        if hr is None or (hr.prompt in (None, s.prompt) and hr.negative_prompt in (None, s.negative_prompt)):
            return None
        own = dataclasses.replace(s, prompt=s.prompt if hr.prompt is None else hr.prompt,
                                  negative_prompt=s.negative_prompt if hr.negative_prompt is None
                                  else hr.negative_prompt)
        try:
            return self._conditioning(own)
        except InputError as exc:  # said as the hires prompt's
            where = {"prompt": "hires_prompt", "negative_prompt": "hires_negative_prompt"}.get(exc.where or "")
            if where is None:
                raise
            raise InputError(exc.what.replace("the negative prompt", "the hires negative prompt").replace(
                "the prompt", "the hires prompt"), where=where, fix=exc.fix) from None

    def _limit(self, cond: Conditioning, where: str) -> Conditioning:
        """A prompt longer than a UNet exported for a fixed token count, said in tokens (not shapes)."""
        declared = self.denoiser.inputs.get(self.family.text_input)
        fixed = declared.shape[1] if declared is not None and len(declared.shape) == 3 else None
        if isinstance(fixed, int) and cond.hidden.shape[1] > fixed:
            what = "prompt" if where == "prompt" else "negative prompt"
            per, most = cond.chunk - 2, fixed // cond.chunk * (cond.chunk - 2)  # a chunk's start and end tokens
            raise InputError(f"the {what} needs {cond.chunks} chunks of {per} tokens and this model takes {most} "
                             f"tokens at most (its {self.denoiser.name} is exported for {fixed})", where=where,
                             fix=f"shorten the {what} to {most} tokens (roughly {most * 3 // 4} words), or use a "
                             "model exported with a dynamic sequence axis")
        return cond

    # ------------------------------------------------------------------ weights (sdrt.pipelines.weights)
    @property
    def weights(self) -> WeightState:
        """The checkpoint, LoRAs and embeddings in use (all bound through ``Session.update_weights``)."""
        if self._weight_state is None:
            self._weight_state = WeightState(self)
        return self._weight_state

    def load_weights(self, path: str | os.PathLike[str]) -> Any:
        """Bind a single-file LDM checkpoint (``.safetensors``) or a diffusers folder; no recompile.
        Waits for a running job to end (the weights never change under one)."""
        with self._job("load_weights()"):
            return self.weights.load_checkpoint(path)

    def set_loras(self, loras: Any) -> None:
        """``[(path_or_Lora, scale), ...]`` active from now on; ``[]`` removes them, bit for bit.
        Waits for a running job to end (the weights never change under one)."""
        with self._job("set_loras()"):
            self.weights.set_loras(loras)

    def add_embedding(self, *paths: str | os.PathLike[str]) -> Any:
        """A1111 textual-inversion embeddings; each file's stem is its trigger word.
        Waits for a running job to end (the weights never change under one)."""
        with self._job("add_embedding()"):
            return self.weights.add_embeddings(paths)

    def set_vae(self, vae: str | os.PathLike[str] | None) -> list[str]:
        """Run the VAE of this file from now on (``None``: the model's own), as ``pipelines.load(model, vae=...)``
        would: the UNet or transformer and the text encoders stay loaded, only the VAE parts are bound again (their
        next run compiles them). The file is checked before anything changes: a file that is no VAE, or of another
        family or widths, raises and leaves the VAE in use. Waits for a running job to end. Returns the parts that
        changed (none when the file already runs)."""
        return self.set_part_files(vae=vae)

    def set_text_encoders(self, text_encoders: Any) -> list[str]:
        """Run these text-encoder files from now on (each fills the part its tensors say; ``[]``: the model's
        own), as ``pipelines.load(model, text_encoders=...)`` would, keeping the other parts loaded. Checked before
        anything changes; waits for a running job to end. Returns the parts that changed."""
        return self.set_part_files(text_encoders=text_encoders)

    def set_part_files(self, **files: Any) -> list[str]:
        """``set_vae`` and ``set_text_encoders`` at once (``vae=``, ``text_encoders=``; one left out keeps what
        runs): both are checked before either changes."""
        from .singlefile import set_part_files

        unknown = sorted(set(files) - {"vae", "text_encoders"})
        if unknown:
            raise InputError(f"set_part_files() takes no keyword {', '.join(unknown)}", where=unknown[0],
                             fix="pass {@vae=} and/or {@text_encoders=}")
        _part_files(files.get("vae"), files.get("text_encoders"))  # the types, in the caller's words
        with self._job("set_vae()" if set(files) == {"vae"} else "set_part_files()"):
            return set_part_files(self, **files)

    def reread_part_files(self, *paths: str | os.PathLike[str]) -> list[str]:
        """Read these separate VAE / text-encoder files (``vae=``, ``set_vae``, ``text_encoders=``) again, written
        anew on disk under their name: the parts they fill are bound again (their next run compiles), as
        ``set_part_files`` binds another file; the UNet or transformer keeps its sessions. Waits for a running job
        to end. Returns the parts bound again."""
        from .singlefile import set_part_files

        with self._job("reread_part_files()"):
            return set_part_files(self, vae=self.vae_file, text_encoders=list(self.text_encoder_files), again=paths)

    def reread_parts(self, *names: str) -> list[str]:
        """Load these parts' graphs again from their files (a folder's ``vae_decoder/model.onnx`` and its data,
        written anew on disk): their sessions close and their next run compiles; the other parts keep theirs.
        Only parts that run their graph's own weights (nothing bound over them: no checkpoint, LoRA, embedding or
        separate file) can; ``WeightsError`` names one that cannot, and nothing changes. Waits for a running job."""
        state = self._weight_state
        with self._job("reread_parts()"):
            for name in names:
                part = self.parts.get(name)
                if part is None:
                    raise InputError(f"this pipeline has no part {name!r}", where="reread_parts",
                                     fix=f"name one of {', '.join(self.parts)}")
                bound = state is not None and (name in state.base or name in state._lora_parts or name in
                                               state.part_files or name in state._originals or name in state.own_base)
                if bound or part.default_weights is not None or part.graph_edit is not None or part.stream_bytes:
                    raise WeightsError(f"the {name} part runs weights bound over its graph's, which re-reading its "
                                       "file would not keep", where=str(part.path),
                                       fix="load the model again (sdrt serve does when this is refused)")
            for name in names:
                part = self.parts[name]
                part.close()
                part._graph = None
                part.weights, part.weights_factory = None, None
                self._weights_changed(name)
            log.info("%s: %s read again", self.folder.name, ", ".join(names))
            return list(names)

    def reread_embeddings(self, *paths: str | os.PathLike[str]) -> list[str]:
        """Read these textual-inversion embedding files again (written anew on disk), and add those not loaded
        yet: their rows of the token table are bound again (``update_weights``; the UNet is untouched). An
        embedding whose trigger word, vector count or widths changed cannot be swapped in place (its token ids
        are given): ``WeightsError``, and nothing changes. Waits for a running job. Returns the trigger words."""
        from ..checkpoint import load_embedding
        from ..checkpoint.embeddings import embedding_files

        with self._job("reread_embeddings()"):
            state = self.weights
            loaded = {str(Path(e.source)): i for i, e in enumerate(state.embeddings)}
            swap: dict[int, Any] = {}
            new = []
            for p in paths:
                # diffusers' SDXL pair is held under its learned_embeds file: learned_embeds_2 changed rereads it
                i = loaded.get(str(Path(p))) if str(Path(p)) in loaded else loaded.get(str(embedding_files(p)[0]))
                if i is None:
                    new.append(p)
                    continue
                old, e = state.embeddings[i], load_embedding(p)
                shapes = {k: v.shape for k, v in e.vectors.items()}
                was = {k: v.shape for k, v in old.vectors.items()}
                if e.name.lower() != old.name.lower() or shapes != was:
                    raise WeightsError(f"embedding {Path(p).name} holds {shapes} now, {was} when loaded: its token "
                                       "ids cannot hold it", where=str(p), fix="load the model again")
                swap[i] = e
            if swap:
                for i, e in swap.items():
                    state.embeddings[i] = e
                state._write_embeddings()
                state._apply({n for n in ("text_encoder", "text_encoder_2") if n in self.parts})
            added = state.add_embeddings(new) if new else []
            return [e.name for e in swap.values()] + [e.name for e in added]

    @property
    def vae_file(self) -> Path | None:
        """The separate VAE file the pipeline runs (``vae=``, ``set_vae``), or None for the model's own."""
        if self._weight_state is not None:
            return self._weight_state.part_files.get("vae_decoder") or self._weight_state.part_files.get("vae_encoder")
        return self.folder.vae_file

    @property
    def text_encoder_files(self) -> tuple[Path, ...]:
        """The separate text-encoder files the pipeline runs (``text_encoders=``, ``set_text_encoders``)."""
        if self._weight_state is None:
            return ()
        return tuple(dict.fromkeys(f for p, f in sorted(self._weight_state.part_files.items())
                                   if p.startswith("text_encoder")))

    def _weights_changed(self, part: str) -> None:
        if self._prompts is not None:
            self._prompts.weights_changed()

    # ------------------------------------------------------------------ VAE
    def _encode_image(self, image: np.ndarray, generator: Any) -> np.ndarray:
        """diffusers' ``retrieve_latents(vae.encode(image), generator)``, shifted and scaled as the family says."""
        generator = getattr(generator, "vae_generator", generator)  # A1111's per-image noise keeps its own
        if self.vae_encoder is None:
            self.folder.part_file("vae_encoder")  # raises, naming the part
            raise AssertionError  # pragma: no cover
        c = self.family.latent_channels
        outs = self.vae_encoder.outputs
        name = next((n for n in ("latent_parameters", "latent_sample", "latent_dist") if n in outs), next(iter(outs)))
        tile = self.vae_tile * 8 if self.vae_tile else None
        if tile and max(image.shape[2:]) > tile:
            from .tiling import encode_tiled

            enc = self.vae_encoder
            out = encode_tiled(lambda t: np.asarray(enc.run({"sample": t})[name], dtype=np.float32), image,
                               tile=tile, overlap=max(tile // 4 // 8 * 8, 8), channels=int(
                                   enc.outputs[name].shape[1]) if isinstance(enc.outputs[name].shape[1], int) else 2 * c)
        else:
            out = np.asarray(self.vae_encoder.run({"sample": image})[name], dtype=np.float32)
        if out.shape[1] == 2 * c:  # mean and log-variance: sample as DiagonalGaussianDistribution.sample does
            mean, logvar = out[:, :c], np.clip(out[:, c:], -30.0, 20.0)
            latent = mean + np.exp(np.float32(0.5) * logvar) * generator.randn(mean.shape)
        elif out.shape[1] == c:  # an export that samples (or returns the mean) itself
            generator.randn(out.shape)  # keep the stream where diffusers has it
            latent = out
        else:
            raise ModelError(f"the vae_encoder output {name!r} has {out.shape[1]} channels, not {2 * c} or {c}",
                             where=str(self.vae_encoder.path), fix="export the VAE encoder's latent parameters")
        return self.family.to_model_latents(latent)

    def _init_latents(self, init: np.ndarray, generator: Any, lh: int, lw: int) -> np.ndarray:
        """The init image's latents: ``init`` encoded; with the latent upscale resize mode, the picture encoded at
        its own size and its latents resized to ``lh x lw`` as A1111 does (``torch.nn.functional.interpolate``,
        bilinear, after the VAE's scale and shift, which commute with it)."""
        source = getattr(self, "_init_source", None)
        if source is None:
            return self._encode_image(to_nchw(init), generator)
        from .hires import interpolate

        return interpolate(self._encode_image(to_nchw(source), generator), lh, lw, "bilinear")

    def _decode(self, latents: np.ndarray) -> list[np.ndarray]:
        z = self.family.to_vae_latents(latents)

        def decode(t: np.ndarray) -> np.ndarray:
            out = self.vae_decoder.run({"latent_sample": t})
            return np.asarray(out.get("sample", next(iter(out.values()))))

        if self.vae_tile and max(z.shape[2:]) > self.vae_tile:
            from .tiling import decode_tiled

            return from_nchw(decode_tiled(decode, z, tile=self.vae_tile, overlap=max(self.vae_tile // 4, 1)))
        return from_nchw(decode(z))

    # ------------------------------------------------------------------ sampling setup
    def _loop(self, s: Settings, ms: Any, generator: Any, seed: int, start: int | None = None) -> Any:
        """The sampling loop for this sampler, from its first step (img2img's strength, or ``start``)."""
        from ..samplers import get_sampler, get_sigmas
        from .loops import DDIMLoop, DPMSolverLoop, EulerLoop, KLoop
        from .scheduling import FolderSchedule

        # diffusers' own scheduler arithmetic for the DDPM-trained families; k-diffusion's form otherwise
        kind = _DIFFUSERS_FORM.get((s.choice.sampler, s.choice.schedule)) if isinstance(ms, FolderSchedule) else None
        steps = s.steps  # the schedule's length: img2img under A1111's fixed steps stretches it
        hires_pass = start is not None
        if start is not None:  # the hires pass: A1111's steps rule (sdrt.pipelines.hires)
            pass
        elif s.strength is None:
            start = 0
        elif self.family.flow and s.strength_rule == "diffusers":
            start = None  # the flow pipelines' own cut, below
        else:  # img2img's rule (sdrt.pipelines.strength): diffusers' last int(steps * strength) steps, or A1111's
            from .strength import schedule

            steps, start = schedule(s.steps, s.strength, s.strength_rule)
        if self.family.flow and (s.choice.sampler, s.choice.schedule) == ("euler", "normal"):
            from ..samplers.flowmatch import img2img_timesteps
            from .loops import FlowLoop

            assert s.width is not None and s.height is not None
            ts, sigmas = self.family.flow_timesteps(steps, s.width, s.height, s.shift)
            if start is None:  # SD3's and Flux's img2img pipelines
                ts, sigmas, _ = img2img_timesteps(ts, sigmas, s.steps, s.strength)
            elif start:  # the hires pass or A1111's rule: the last steps of the schedule, from the noised image
                ts, sigmas = ts[start:], sigmas[start:]
            return FlowLoop(ts, sigmas, self.family.timestep_scale)
        if start is None:  # a flow model on another sampler: diffusers' rule as the other families
            start = max(s.steps - min(int(s.steps * s.strength), s.steps), 0)
        if (hires_pass or (s.strength is not None and s.strength_rule != "diffusers")) and isinstance(ms, FolderSchedule):
            from . import compvis  # A1111's DDIM and PLMS cut img2img their own way

            cut = compvis.loop(ms, s.choice, steps, start, seed=seed, generator=generator,
                               where="hires_denoise" if hires_pass else "strength",
                               fixed=not hires_pass and s.strength_rule == "a1111-fix-steps")
            if cut is not None:
                return cut
        if kind in ("euler", "euler-karras", "euler_a", "euler_a-karras"):
            plan = ms.euler_plan(steps, karras=kind.endswith("karras"), ancestral=kind.startswith("euler_a")).tail(start)
            return EulerLoop(ms, plan, ancestral=kind.startswith("euler_a"), generator=generator)
        if kind in ("dpm", "dpm-karras"):
            return DPMSolverLoop(ms, ms.dpm_plan(steps, karras=kind == "dpm-karras").tail(start), offset=start)
        if kind == "ddim":
            return DDIMLoop(ms, ms.ddim_plan(steps).tail(start))
        sigmas = [float(x) for x in get_sigmas(s.choice.schedule, steps, ms,
                                                discard_penultimate=s.choice.discard_penultimate)][start:]
        sampler, options = get_sampler(s.choice.sampler), dict(s.choice.options)
        # DPM fast/adaptive integrate over a range: A1111's txt2img passes the model's own (img2img and the hires
        # pass: the cut schedule's ends, the samplers' default); diffusers' rule at strength 1 kept the model's
        if start == 0 and s.strength_rule == "diffusers" and _takes_range(sampler) and math.isfinite(ms.sigma_max):
            options.update(sigma_min=float(ms.sigma_min), sigma_max=float(ms.sigma_max))
        return KLoop(ms, sigmas, sampler, options, seed=seed, generator=generator)

    # ------------------------------------------------------------------ generation
    def __call__(self, prompt: str, negative_prompt: str | None = "", **kwargs: Any) -> list[np.ndarray]:
        """Generate; returns HxWx3 uint8 images (``batch * batch_count`` of them). See :meth:`generate`."""
        return self.generate(prompt, negative_prompt, **kwargs).images

    def generate(self, prompt: str | Settings, negative_prompt: str | None = "", *,
                 callback: Callback | None = None, **kwargs: Any) -> Generation:
        """txt2img, img2img (``init_image``, ``strength``) or inpainting (``mask`` too).

        Keywords: ``steps=20, cfg=7.0, sampler="DPM++ 2M Karras", schedule=None (a ComfyUI scheduler or
        A1111 schedule label, for sampler names without one), seed=None (random), width, height
        (default: the init image's size, else the model's), init_image (any size), strength (0.75; 1.0 with a
        mask), mask (white = repaint), resize_mode ("Just Resize"; how the init image and mask meet width and height:
        ``sdrt.pipelines.RESIZE_MODES``), strength_rule ("diffusers", "a1111" or "a1111-fix-steps": which steps
        strength runs, sdrt.pipelines.strength), init_upscaler (A1111's upscaler_for_img2img: what enlarges an init
        image that grows), masked_content ("original", "fill", "latent noise" or "latent nothing": what the area a
        mask repaints starts from, A1111's inpainting_fill 1, 0, 2, 3; sdrt.pipelines.maskedcontent), mask_blur (0;
        pixels, or (x, y): A1111's mask blur, sdrt.pipelines.maskblur), mask_overlay (False; True: the init image
        composited back where the mask keeps it, as A1111), inpaint_area and inpaint_padding
        (sdrt.pipelines.onlymasked), image_cfg (an InstructPix2Pix model's image guidance, 1.5; without a strength
        it starts from noise alone: sdrt.pipelines.edit), batch=1, batch_count=1, clip_skip=1``; the toolbox's
        ``controlnets=[(net, image, scale, start, end)]``, ``hires_scale, hires_steps, hires_denoise,
        hires_upscaler``, ``rng="cpu"|"gpu"|"nv", subseed, subseed_strength``, ``preview`` and ``preview_size``
        (docs/toolbox.md). ``callback(step, total, latents)`` is called after every step (it may call
        :meth:`preview`); returning ``False`` stops the run (``sdrt.errors.Interrupted``).
        One job runs at a time per pipeline; :meth:`interrupt` stops it from another thread. ``prompt`` may
        also be the ``Settings`` of :func:`sdrt.pipelines.validate` (checked once, before any model loaded).
        """
        check_keywords(kwargs)
        if callback is not None and not callable(callback):
            raise InputError(f"callback must be a function (step, total, latents), got {type(callback).__name__}",
                             where="callback", fix="pass a function, or leave callback unset")
        _check_callback(callback)
        with self._job("generate()"):
            with self._state:
                self._stop.clear()
                self._running = True
            try:
                gen = self._generate(prompt, negative_prompt, callback, kwargs)
                gen.memory = self._measured()  # the plan, with the measured peak of each stage
                return gen
            finally:
                from .hiresmodel import release

                release(self)  # a loaded pipeline run as the hires checkpoint: free for other threads again
                self._references = None  # the job's encoded reference images
                self._init_source = self._init_sized = self._init_side = None  # the job's init image at its own size
                self._paste = None  # the job's only-masked paste (sdrt.pipelines.onlymasked)
                with self._state:
                    self._running = False
                    self._stop.clear()

    @contextlib.contextmanager
    def _job(self, call: str) -> Iterator[None]:
        """Hold the pipeline's lock for ``call``: a second thread waits for the running job; the job's own thread
        (a step callback calling back into this pipeline) is refused, as it would wait for itself forever."""
        if self._owner == threading.get_ident():
            raise InputError(f"{call} was called from inside this pipeline's running job (a step callback): it "
                             "would wait for that job to end, which waits for the callback", where="callback",
                             fix=f"return from the callback and call {call} after generate() returns, or use "
                             "pipe.interrupt() to stop the job")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    def interrupt(self) -> None:
        """Stop the running job after its current step (it raises ``sdrt.errors.Interrupted``); safe from any
        thread; does nothing when no job runs (a later job is not affected)."""
        with self._state:
            if self._running:
                self._stop.set()

    def _check_stop(self, step: int, total: int) -> None:
        if self._stop.is_set():
            raise Interrupted(f"the generation was interrupted after step {step} of {total}", step=step, total=total,
                              where="Pipeline.interrupt()", fix="generate again to run a new job")

    def _prepare(self, prompt: str | Settings, negative_prompt: str | None,
                 kwargs: dict[str, Any]) -> tuple[Settings, Any, Any]:
        """Settings checked once, the init image and mask read, the size settled, the family contract checked.

        ``prompt`` may be the ``Settings`` that :func:`validate` already made (the CLI checks them before
        any model loads): they are used as they are, not checked again."""
        given = prompt if isinstance(prompt, Settings) else None
        if given is not None:
            if kwargs:
                raise InputError("settings and keyword arguments were both given", where=", ".join(kwargs),
                                 fix="pass either validate(...)'s Settings or the keyword arguments")
            if negative_prompt not in (None, "", given.negative_prompt):  # it was dropped without a word
                raise InputError("settings and a negative_prompt were both given; the Settings carry their own "
                                 f"({given.negative_prompt!r:.60})", where="negative_prompt",
                                 fix="pass it to validate(...), or leave it out here")
            prompt, negative_prompt = given.prompt, given.negative_prompt
        raw = (prompt, negative_prompt)  # with their <lora:...> tags, for a hires checkpoint (hiresmodel.resolve)
        if self._dry:
            from ..text import extract_loras  # the plan names no LoRA file, and reads none

            prompt = extract_loras(prompt)[0] if isinstance(prompt, str) else prompt
            if isinstance(negative_prompt, str):
                negative_prompt = extract_loras(negative_prompt, "negative_prompt")[0]
        elif self._weight_state is not None or _has_lora_tag(prompt, negative_prompt):
            prompt, negative_prompt = self.weights.prepare(prompt, negative_prompt)  # type: ignore[arg-type]
        else:  # <hypernet:x:1>: removed as A1111 removes it (left in, its words were encoded as text)
            from ..text.loras import strip_tags

            prompt = strip_tags(prompt) if isinstance(prompt, str) else prompt
            negative_prompt = strip_tags(negative_prompt) if isinstance(negative_prompt, str) else negative_prompt
        if given is not None:
            s = dataclasses.replace(given, prompt=prompt, negative_prompt=negative_prompt or "")
        else:
            s = validate(prompt, negative_prompt, **self._edit_hint(kwargs))
        init = mask = None
        self._init_source = self._init_sized = self._init_side = self._paste = None
        if s.init_image is not None:
            init, mask = self._fit_init(s)
        if s.reference_images:  # FLUX.1 Kontext (sdrt.pipelines.reference): read and sized once, here
            from .reference import check_model, prepare

            check_model(self)
            s.reference_images = prepare(s.reference_images, s.reference_resize)
            if s.width is None and s.height is None:  # BFL's and ComfyUI's Kontext: the first reference's size
                s.height, s.width = s.reference_images[0].shape[:2]
        if s.masked_content not in ("original", "fill") and self.family.flow:  # the fill is pixels, any model's
            raise InputError(f"{{@masked_content}} {s.masked_content!r} is A1111's, for SD 1.x/2.x/XL inpainting; "
                             f"this is a {self.family.label} model", where="masked_content",
                             fix="leave {@masked_content} unset (\"original\")")
        if init is None and not self.family.txt2img:
            raise InputError(f"the {self.family.label} continues an image's latents and does not make images from "
                             "noise (diffusers runs it as img2img only)", where="init_image",
                             fix="pass {@init_image} with a low {@strength} (0.2-0.4), or run a base model with "
                                 "{@refiner} set to this model")
        if init is None and s.width is None and s.height is None and self.flux_tool == "control":
            from .fluxtools import control_size

            size = control_size(s)  # a Canny/Depth run without a size: the control image's (as an init image's)
            if size is not None:
                s.width, s.height = size
        unset = s.width is None and s.height is None
        s.width = s.width or self.default_size
        s.height = s.height or self.default_size
        if not self._checked:
            self.family.check(self._parts)
            self._checked = True
        if unset:  # no size asked: a graph fixed at another size than its config's sample_size ('x', 1e9) is right
            fixed = self.family.size_error(tuple(self.denoiser.inputs[self.family.sample_input].shape), s.width,
                                           s.height)
            if fixed is not None:
                s.width, s.height = fixed
        self._family_defaults(s)
        self._check_size(s, "init_image" if self._init_sized is not None else None)
        self._flux_tool_settings(s)
        self._prepare_extras(s)
        self._refiner_job = None
        self._refiner_took = False  # set when the refiner takes over in a run (its infotext: only then)
        if getattr(s.toolbox, "refiner", None) is not None:  # loaded and checked before anything runs
            from .refiner import resolve

            self._refiner_job = resolve(self, s, load)
        self._hires_job = None  # the hires fix's second model (sdrt.pipelines.hiresmodel), None: this one
        if getattr(s.toolbox, "hires_checkpoint", None) is not None:  # loaded and checked before anything runs
            from . import hiresmodel

            self._hires_job = hiresmodel.resolve(self, s, load, raw)
        return s, init, mask

    def latent_upscale_blocked(self, width: int, height: int) -> str | None:
        """Why the latent upscale resize mode cannot run on a ``width`` x ``height`` picture here (this model's VAE
        encoder is exported for one other size: it cannot take the picture at its own), or None when it can."""
        from .images import snap

        sample = self.vae_encoder.inputs.get("sample") if self.vae_encoder is not None else None
        encoder = tuple(sample.shape[2:]) if sample is not None else ()
        if len(encoder) == 2 and all(isinstance(d, int) for d in encoder) and encoder != snap(width, height, 8)[::-1]:
            return f"this model's VAE encoder is exported for {encoder[1]}x{encoder[0]} only"
        return None

    def _size_multiple(self) -> int:
        """The multiple of which every side this model runs is: 16 for the flow models (VAE 8 x patch 2); 8 for a
        UNet whose upsamplers take their skips' sizes (``sdrt.graph.upsample``: every export of diffusers' UNet);
        for another UNet export, 8 x 2 ** (down blocks - 1) (64 for SD 1.x and 2.x, 32 for SDXL:
        ``_unet_size_error``)."""
        if self.family.flow:
            return 16
        return 8 * 2 ** self._unet_halvings()

    def _unet_halvings(self) -> int:
        """How many times this model's UNet halves the latent with a fixed-scale way back up (0: none, or all its
        upsamplers take their skips' sizes, so any multiple of 8 runs)."""
        from ..graph.upsample import skip_sized

        blocks = self.folder.configs.get("unet", {}).get("block_out_channels")
        if self.family.flow or not isinstance(blocks, list) or len(blocks) < 2:
            return 0
        if self.denoiser.name == "unet" and skip_sized(self.denoiser.graph.model) >= len(blocks) - 1:
            return 0
        return len(blocks) - 1

    def _fit_init(self, s: Settings) -> tuple[np.ndarray, np.ndarray | None]:
        """The init image (and mask) fitted to the run's size, which it settles (``s.width``, ``s.height``).

        Sizes given: the picture is fitted to them with ``s.resize_mode``; one side given: the other keeps the
        picture's aspect ratio; none: the picture's own size, each side down to the multiple this model runs
        (``_size_multiple``; diffusers' ``VaeImageProcessor`` rounds down to 8 and resizes), or a fixed-size
        model's size. Any fit is said in one warning line. With the latent upscale mode the picture is also kept
        at its own size (down to a multiple of 8) for the VAE encoder (``_init_latents``); the pixels others read
        (a mask's, an inpainting model's masked image) are the plain resize's. A VAE encoder exported for one
        size cannot take the picture at its own: the latent upscale then runs as Just Resize, and says so."""
        from .images import JUST_RESIZE, LATENT_UPSCALE, binarize, describe_fit, fit_array, snap
        from .initupscaler import enlarge
        from .onlymasked import ONLY_MASKED

        picture = to_rgb(s.init_image, "init image")
        h, w = picture.shape[:2]
        multiple = self._size_multiple()
        if s.width is None and s.height is None:
            if w < 8 or h < 8:  # a size given fits any picture (a 1x1 one stretched, as A1111 and serve do)
                side = f"width ({w} pixels)" if w < 8 else f"height ({h} pixels)"
                raise InputError(f"the init image is {w}x{h}: its {side} is too small to take the run's size from "
                                 "(the smallest image is 8x8)", where="init_image",
                                 fix="pass {@width} and {@height} to fit it to a size, or use a picture of at least "
                                     "8x8 pixels")
            tw, th = snap(w, h, multiple)
            why = f" and this model makes sides that are multiples of {multiple}: it runs at {tw}x{th};"
            shape = tuple(self.denoiser.inputs[self.family.sample_input].shape)
            fixed = self.family.size_error(shape, tw, th)
            if fixed is not None:  # a graph exported for one size: the picture meets it
                tw, th = fixed
                why = f" and this model makes {tw}x{th} images only:"
            self._init_sized = (w, h)  # the size came from the picture (the memory check names it)
            self._check_init_area((w, h), tw, th)
        else:
            def other(given: int, side: int, across: int) -> int:
                return max(int(round(given * side / across / multiple)) * multiple, multiple)

            tw = s.width if s.width is not None else other(s.height, w, h)  # type: ignore[arg-type]
            th = s.height if s.height is not None else other(s.width, h, w)  # type: ignore[arg-type]
            if s.width is not None and s.height is not None:
                why = f" and {tw}x{th} was asked:"
            else:
                given = f"width {tw}" if s.width is not None else f"height {th}"
                self._init_side = ("width" if s.width is not None else "height", w, h)  # the other: the aspect
                why = f" and {given} was asked: it runs at {tw}x{th}, in the picture's aspect ratio;"
        mode, note = s.resize_mode, ""
        gray = self._mask_gray(s)
        if gray is not None and s.inpaint_area == ONLY_MASKED:  # the mask's area cut out, run, pasted back
            return self._fit_masked_area(s, picture, gray, tw, th)
        if gray is not None and gray.shape not in ((h, w), (th, tw)):
            raise InputError(f"the mask is {gray.shape[1]}x{gray.shape[0]}, the init image {w}x{h}", where="mask",
                             fix="give a mask of the init image's size (white = repaint)")
        source = snap(w, h, 8)
        if mode == LATENT_UPSCALE and (tw, th) != (w, h):
            fixed_encoder = self.latent_upscale_blocked(w, h)
            if fixed_encoder is not None:
                mode = JUST_RESIZE  # a VAE encoder exported for one size cannot take the picture at its own
                note = f" (not the latent upscale: {fixed_encoder})"
            elif source[0] * source[1] > max(self.MAX_INIT_AREA * self.default_size ** 2, tw * th):
                # the VAE encoder runs at the picture's own size: a 6000x4000 photo fitted to 512x512 would encode
                # 24 million pixels (SD 1.5's encoder: about 1.5 GB of activations per million)
                raise InputError(f"the init image is {w}x{h}, and {mode} VAE-encodes it at its own size: more than "
                                 f"{self.MAX_INIT_AREA} times the pixels of this model's {self.default_size}x"
                                 f"{self.default_size} and more than the {tw}x{th} run's", where="resize_mode",
                                 fix=f"use {{@resize_mode=}}'{JUST_RESIZE}' (the picture is resized in pixels), or "
                                     "pass a smaller picture")
        if (tw, th) != (w, h):
            fit = (f"the init image is {w}x{h}{why} {describe_fit(mode)}{note}"
                   f"{', and the mask with it' if gray is not None and gray.shape == (h, w) else ''}")
            if self._dry:  # a dry run (the memory plan's, plan()) says nothing: plan() lists it
                self._init_fit = fit
            else:
                log.warning("%s", fit)
        # A1111's upscaler_for_img2img (init_upscaler) for a picture that grows; the plan takes the sizes alone
        init = fit_array(picture, tw, th, mode,
                         enlarge=enlarge(s.init_upscaler, mode, None if self._dry else self._model_upscaler))
        if mode == LATENT_UPSCALE and (tw, th) != (w, h):
            self._init_source = fit_array(picture, *source, mode)
        mask = None
        if gray is not None:
            fitted = fit_array(gray, tw, th, mode, "mask", "mask")
            mask = binarize(fitted)
            init = self._masked_start(s, init, fitted, gray)
        s.width, s.height = tw, th
        return init, mask

    def fit_init_image(self, picture: Any, width: int, height: int, resize_mode: Any = None,
                       init_upscaler: Any = None) -> np.ndarray:
        """``picture`` fitted to ``width`` x ``height`` as a run fits its init image: ``resize_mode``, and
        ``init_upscaler`` (A1111's ``upscaler_for_img2img``) enlarging it (no mask, no fill: a run with
        ``masked_content="fill"`` fills the picture so fitted)."""
        from .images import fit_array
        from .images import resize_mode as resize_mode_of
        from .initupscaler import enlarge, parse

        mode = resize_mode_of(resize_mode)
        return fit_array(to_rgb(picture, "init image"), width, height, mode,
                         enlarge=enlarge(parse(init_upscaler), mode, None if self._dry else self._model_upscaler))

    @property
    def instruct_pix2pix(self) -> bool:
        """Whether the denoiser is an InstructPix2Pix editing UNet (its sample takes the picture's latent too:
        :mod:`sdrt.pipelines.edit`)."""
        fam = self.family
        if fam.flow or fam.packed or not fam.edit_channels:
            return False
        shape = self.denoiser.inputs[fam.sample_input].shape
        return len(shape) == 4 and shape[1] == fam.latent_channels + fam.edit_channels

    @property
    def flux_tool(self) -> str | None:
        """``"fill"`` or ``"control"`` for BFL's FLUX.1 Fill and Canny/Depth models, else None
        (:mod:`sdrt.pipelines.fluxtools`)."""
        from .fluxtools import tool_of

        return tool_of(self.family, self.denoiser, self.folder.configs)

    @property
    def control_lora(self) -> str | None:
        """The name of the Flux control LoRA (BFL's Canny/Depth dev LoRA) that makes this Flux.1 dev model a
        Canny/Depth one now (:mod:`sdrt.pipelines.fluxcontrollora`), or None."""
        planned = self.__dict__.get("_planned_control")  # a run plan's, for a LoRA the run will make active
        state = self._weight_state
        if planned is not None or state is None:
            return planned
        return next((a.name for a in state.loras if getattr(a.lora, "control", None) is not None), None)

    def _control_lora_said(self) -> str | None:
        """``control_lora`` for a message: its name, with "(at scale 0)" when it runs at 0 (diffusers' weight 0:
        still the Canny/Depth model)."""
        lora = self.control_lora
        state = self._weight_state
        if lora is not None and state is not None and any(
                a.name == lora and getattr(a.lora, "control", None) is not None and a.scale_for("transformer") == 0
                for a in state.loras):
            lora += " (at scale 0)"
        return lora

    def _flux_tool_settings(self, s: Settings) -> None:
        """A Canny/Depth model's control image (``--control-image`` comes as a ControlNet unit), checked."""
        from . import fluxtools

        tool = self.flux_tool
        tb = s.toolbox
        if tool == "control" and tb.controlnets and s.control_image is None:
            s.control_image = fluxtools.control_from_units(tb.controlnets)
            s.toolbox = dataclasses.replace(tb, controlnets=[])
        fluxtools.check(tool, s, self.family.label, self._control_lora_said())
        if tool is not None and s.toolbox.hires is not None:
            raise InputError(f"the hires fix is not supported with a {fluxtools.LABELS[tool]} model",
                             where="hires_scale", fix="leave {@hires_scale} unset")

    def _edit_hint(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` for ``validate``, on an InstructPix2Pix model with its default ``image_cfg`` when none is given:
        that tells validate the model runs every step without a strength (its default 0.75 is not this model's), so
        that ``steps=1`` is not refused for a strength it does not use (``_edit_defaults`` sets the same value)."""
        if kwargs.get("init_image") is None or kwargs.get("image_cfg") is not None or not self.instruct_pix2pix:
            return kwargs
        from .edit import DEFAULT_IMAGE_CFG

        return {**kwargs, "image_cfg": DEFAULT_IMAGE_CFG}

    def _edit_defaults(self, s: Settings) -> None:
        """An InstructPix2Pix model's settings: the picture to edit is needed, ``image_cfg`` defaults to 1.5, and
        without a ``strength`` the run starts from noise alone (diffusers'); ``image_cfg`` elsewhere is refused."""
        from .edit import DEFAULT_IMAGE_CFG

        if not self.instruct_pix2pix:
            if s.image_cfg is not None:
                raise InputError(f"{{@image_cfg}} guides an InstructPix2Pix editing model, and this {self.family.label} "
                                 "model is not one", where="image_cfg",
                                 fix="leave {@image_cfg} unset, or load an InstructPix2Pix model")
            return
        if s.init_image is None:
            raise InputError("this is an InstructPix2Pix editing model (8 input channels): it edits a picture",
                             where="init_image", fix="pass {@init_image=} (the picture) and a prompt saying the edit")
        if s.mask is not None:
            raise InputError("a mask with an InstructPix2Pix model is not supported", where="mask",
                             fix="leave {@mask} out (the prompt says what to change)")
        if s.image_cfg is None:
            s.image_cfg = DEFAULT_IMAGE_CFG
        if not s.strength_given:
            s.strength = None

    def _family_defaults(self, s: Settings) -> None:
        """CFG, sampler and distilled guidance the caller left unset, from the family; settings it cannot use refused."""
        fam = self.family
        if s.cfg is None:
            s.cfg = fam.default_cfg
        self._edit_defaults(s)
        if s.choice is None:
            from ..samplers import resolve

            s.sampler = fam.default_sampler
            s.choice = resolve(fam.default_sampler, None)
        distilled = "guidance" in self.denoiser.inputs
        if s.guidance is not None and not distilled:
            raise InputError(f"guidance (the distilled guidance scale) applies to guidance-distilled models such as "
                             f"Flux dev, and this {fam.label} model takes none", where="guidance",
                             fix="use {@cfg} for classifier-free guidance, or leave {@guidance} unset")
        if distilled and s.guidance is None:
            from .fluxtools import DEFAULT_GUIDANCE

            # diffusers' FluxPipeline default; FluxFillPipeline's is 30
            s.guidance = DEFAULT_GUIDANCE.get(self.flux_tool or "", 3.5)
        if s.shift is not None and not fam.flow:
            raise InputError(f"{{@shift}} applies to flow-matching models (SD3, Flux, Chroma), not {fam.label}",
                             where="shift", fix="leave {@shift} unset")
        if s.guidance_rescale and fam.flow:  # diffusers' SD3/Flux/Chroma pipelines have none: no reference to match
            raise InputError(f"{{@guidance_rescale}} rescales an eps or v prediction under CFG, and {fam.label} predicts a "
                             "flow velocity", where="guidance_rescale", fix="leave {@guidance_rescale} at 0 for this model")
        guided = fam.negative_pass(s.cfg, s.negative_prompt)
        if s.guidance_rescale and s.image_cfg is not None and self.instruct_pix2pix:  # its own rule (.edit)
            from .edit import guidance

            how = guidance(s.cfg, s.image_cfg, s.strength_rule)
            if how == "edit":  # EditCFGDenoiser has no rescale, as diffusers' and A1111's InstructPix2Pix have none
                raise InputError(f"{{@guidance_rescale}} rescales ordinary CFG, and this InstructPix2Pix model runs "
                                 f"{{@cfg}} {s.cfg:g} with {{@image_cfg}} {s.image_cfg:g} as its three-way image "
                                 "guidance, which has no rescale", where="guidance_rescale",
                                 fix="leave {@guidance_rescale} at 0 for this model")
            guided = how != "none"
        if s.guidance_rescale and not guided:  # diffusers: only under CFG
            if not self._dry:  # said, and not written into the PNG as if it had run
                log.warning(in_caller_words(
                    f"{{@guidance_rescale}} {s.guidance_rescale:g} is not used: {{@cfg}} {s.cfg:g} runs one pass, "
                    "with no CFG to rescale (diffusers rescales only under CFG); raise {@cfg} above 1, or leave "
                    "{@guidance_rescale} at 0"))
            s.guidance_rescale = 0.0
        if s.clip_skip > 1 and not fam.clip_skip:  # a ModelError starting "clip skip": serve runs it at 1, named
            why = ("reads only its CLIP encoder's pooled output" if any(e.kind == "clip" for e in fam.encoders)
                   else "has no CLIP text encoder")
            raise ModelError(f"clip skip {s.clip_skip} picks a CLIP layer's hidden states, and {fam.label} {why}",
                             where="clip_skip", fix="leave {@clip_skip} at 1 for this model")
        if s.max_sequence_length is not None and not any(e.kind == "t5" for e in fam.encoders):
            raise InputError(f"{{@max_sequence_length}} sets T5's token count, and {fam.label} has no T5 encoder",
                             where="max_sequence_length", fix="leave {@max_sequence_length} unset")

    def _check_size(self, s: Settings, source: str | None = None) -> None:
        """A size the denoiser was not exported for, said in pixels (not as a shape it cannot be pinned to).
        ``source``: the argument the size came from when not width and height (``init_image``, ``hires_scale``)."""
        assert s.width is not None and s.height is not None
        if source is not None and max(s.width, s.height) > MAX_SIDE:  # width and height themselves: validate
            what = "init image" if source == "init_image" else "hires fix's second pass"
            raise InputError(f"the {what} is {s.width}x{s.height}, above the limit of {MAX_SIDE} pixels a side",
                             where=source, fix="pass {@width} and {@height}: the picture is fitted to them "
                             "({@resize_mode})" if source == "init_image" else
                             "pass a smaller {@hires_scale} or {@width} and {@height}")
        wrong = flow_size_error(s.width, s.height, self.family.label, source) if self.family.flow else None
        if wrong is None and self.family.name == "sd3":  # its learned position table, cropped to the image
            config = self.folder.configs.get(self.family.denoiser_part, {})
            wrong = sd3_size_error(s.width, s.height, largest_side(config, self.denoiser.graph), self.family.label,
                                   source)
        if wrong is not None:
            raise wrong
        shape = tuple(self.denoiser.inputs[self.family.sample_input].shape)
        wrong = self.family.size_error(shape, s.width, s.height)
        if wrong is not None:
            w, h = wrong
            what = f"this model makes {w}x{h} images only (its {self.denoiser.name} is exported for that size)"
            if source == "init_image":
                raise InputError(f"{what}, and the init image is {s.width}x{s.height}", where="init_image",
                                 fix=f"resize or crop the image to {w}x{h}")
            if source == "hires_scale":
                raise InputError(f"{what}, and the hires fix's second pass is {s.width}x{s.height}",
                                 where="hires_scale", fix="leave {@hires_scale} unset: this model's size is fixed")
            side = getattr(self, "_init_side", None)
            if side is not None:  # one side given, the other from the init image's aspect ratio
                given, iw, ih = side
                raise InputError(f"{what}, and {given} {getattr(s, given)} with the init image's aspect ratio "
                                 f"({iw}x{ih}) asks for {s.width}x{s.height}", where=given,
                                 fix=f"pass {{@width=}}{w} and {{@height=}}{h}, or leave both unset: the picture is "
                                     f"fitted to {w}x{h} ({{@resize_mode}})")
            raise InputError(f"{what} and {s.width}x{s.height} was asked", where="width" if w != s.width else "height",
                             fix=f"pass {{@width=}}{w} and {{@height=}}{h}, or leave them unset")

    def _generate(self, prompt: str, negative_prompt: str | None, callback: Callback | None,
                  kwargs: dict[str, Any]) -> Generation:
        try:
            return self._generate_checked(prompt, negative_prompt, callback, kwargs)
        except ModelError as exc:
            # only a size the graphs' shape pinning refused (onnx's Concat inference failure); any other ModelError
            # (a clip skip the text encoder cannot give, say) is its own, at whatever size
            if not str(exc.where or "").startswith("Graph.with_shapes"):
                raise
            wrong = self._unet_size_error(prompt, negative_prompt, kwargs)
            if wrong is None:
                raise
            raise wrong from exc

    def _unet_size_error(self, prompt: Any, negative_prompt: str | None, kwargs: dict[str, Any]) -> InputError | None:
        """Why a UNet export refused a size, in pixels, when it did: diffusers' UNet halves the latent once per down
        block but the last and, in torch, pads an odd size back up on the way up; an ONNX export traced at an even
        size cannot (the skip connection's Concat then fails shape inference), so each side's latent must divide by
        2 ** (down blocks - 1): 64 pixels for SD 1.x and 2.x, 32 for SDXL. None when that is not what went wrong."""
        halvings = self._unet_halvings()
        if not halvings:
            return None
        step = 8 * 2 ** halvings
        try:
            s = prompt if isinstance(prompt, Settings) else validate(prompt, negative_prompt, **kwargs)
        except SdrtError:
            return None
        sizes = [("width", s.width), ("height", s.height)]
        hires = s.toolbox.hires if s.toolbox is not None else None
        if hires is not None and s.width and s.height:
            sizes += list(zip(("hires_scale", "hires_scale"), hires.target(s.width, s.height)))
        for where, side in sizes:
            if side and side % step:
                what = f"the hires fix's second pass ({side} pixels a side)" if where == "hires_scale" else \
                    f"{where} {side}"
                return InputError(f"{what} does not divide into this UNet's latent grid: its export halves the latent "
                                  f"{halvings} times and cannot pad an odd size as diffusers' torch code does, "
                                  f"so it makes sides that are multiples of {step} pixels", where=where,
                                  fix=f"use {max(side - side % step, step)} or {side - side % step + step}"
                                  if where != "hires_scale" else
                                  f"pick {{@hires_scale}} so that width and height times it are multiples of {step}")
        return None

    def _generate_checked(self, prompt: str, negative_prompt: str | None, callback: Callback | None,
                          kwargs: dict[str, Any]) -> Generation:
        original = prompt.prompt if isinstance(prompt, Settings) else prompt
        # this job's shapes per part, from a dry run made first (its ControlNet units get dry parts; this job's
        # own preparation below gives them the real ones again)
        if not self._dry and isinstance(original, str) and _has_lora_tag(
                original, prompt.negative_prompt if isinstance(prompt, Settings) else negative_prompt):
            # the prompt's LoRAs first: a Flux control LoRA changes the transformer's graph the dry run plans
            # (sdrt.pipelines.fluxcontrollora); _prepare below finds them active
            neg = prompt.negative_prompt if isinstance(prompt, Settings) else negative_prompt
            self.weights.prepare(original, neg)
        calls = None if self._dry else self._job_calls(prompt, negative_prompt, kwargs)
        s, init, mask = self._prepare(prompt, negative_prompt, kwargs)
        self._settings = s  # the last job's checked settings (the run plan reads them)
        _ = self.is_low_memory  # decided (and the parts told) before any part loads
        if not self._dry:  # each part resident, released after use or streamed, and where (budget.py)
            self._apply_memory_plan(calls, check=lambda plan: self._check_init_size(s, plan),
                                    extras=getattr(self, "_job_extras", None), beside=getattr(self, "_job_beside", None))
            if self._hires_job is not None and self._hires_job is not self:  # its parts as the plan's hires section
                from .hiresmodel import apply_memory_plan

                apply_memory_plan(self, self._hires_job, calls)
            if self._refiner_job is not None:  # its parts as the plan's refiner section
                from .refiner import apply_memory_plan as apply_refiner_plan

                apply_refiner_plan(self, self._refiner_job, calls)
            self._release_preprocessors()  # the maps are made: a detector the plan releases goes before the UNet
        from .ahead import for_job

        # the later parts compile ahead beside the first part's compile and run, inside the job's store hold
        with self._stores_after_job(), for_job(self, calls, getattr(self, "_job_outputs", {})):
            return self._generate_planned(s, init, mask, callback, original)

    #: how many times the model's own pixel count a picture given with no size may run at (A1111's UI stops at
    #: 2048x2048, 4 times SDXL's; attention's cost grows with the square of the pixels)
    MAX_INIT_AREA = 4

    def _nearer_size(self, width: int, height: int) -> tuple[int, int]:
        """A size of about the model's own pixel count in ``width:height``'s aspect ratio, in the sides it runs."""
        step = self._size_multiple()
        k = (self.default_size ** 2 / (width * height)) ** 0.5
        return max(int(round(width * k / step)), 1) * step, max(int(round(height * k / step)), 1) * step

    def _check_init_area(self, picture: tuple[int, int], width: int, height: int) -> None:
        """A size taken from an init image (no width or height given: diffusers keeps a picture's size) of more than
        ``MAX_INIT_AREA`` times the model's own pixels fails before anything runs, naming a size to ask for: a
        4032x3024 phone photo ran SD 1.5 at 4032x3008 (16 GB and counting after 16 minutes on 2 cores)."""
        if width * height <= self.MAX_INIT_AREA * self.default_size ** 2:
            return
        sw, sh = self._nearer_size(width, height)
        raise InputError(f"the init image is {picture[0]}x{picture[1]}, and with no width or height given it would "
                         f"run at {width}x{height}, more than {self.MAX_INIT_AREA} times the pixels of this model's "
                         f"{self.default_size}x{self.default_size}", where="init_image",
                         fix=f"pass {{@width=}}{sw} and {{@height=}}{sh} (about the model's own size, the picture's "
                             "aspect ratio; any width and height run): the picture is fitted to them ({@resize_mode})")

    def _check_init_size(self, s: Settings, plan: Any) -> None:
        """A size taken from an init image larger than the model's own, which the memory plan says does not fit
        the budget, fails now, naming the size to ask for, rather than running out of memory."""
        picture = getattr(self, "_init_sized", None)
        if picture is None or plan.fits or plan.budget_bytes is None:
            return
        assert s.width is not None and s.height is not None
        if s.width * s.height <= self.default_size ** 2:  # the model's own size or less: the plan's warning says it
            return
        from .budget import _size

        sw, sh = self._nearer_size(s.width, s.height)
        raise InputError(f"the init image is {picture[0]}x{picture[1]}, and with no width or height given it runs at "
                         f"{s.width}x{s.height}, for which the memory plan predicts a peak of {_size(plan.peak_bytes)}, "
                         f"above the budget of {_size(plan.budget_bytes)} ({plan.budget_source})", where="init_image",
                         fix=f"pass {{@width=}}{sw} and {{@height=}}{sh} (about the model's own size, the picture's "
                             "aspect ratio): the picture is fitted to them ({@resize_mode})")

    def _stores_after_job(self) -> Any:
        """Compile-cache stores wait until this job has returned (``sdrt.cache.deferred``), when every part stays
        resident (a part the plan releases must not be held alive by a store waiting for the job's end) and the
        budget has room beside the plan's peak for the largest part's weights: a store written later holds its
        whole entry in memory while it writes (about the part's weight bytes at most)."""
        import contextlib

        if not self._resident_with_room():
            return contextlib.nullcontext()
        from ..cache import deferred

        return deferred.hold()

    def _generate_planned(self, s: Settings, init: np.ndarray | None, mask: np.ndarray | None,
                          callback: Callback | None, original: str) -> Generation:
        cond, uncond = self._conditioning(s)
        #: the hires fix's own prompts, encoded with the first pass's (A1111's hr_c / hr_uc); None: the first pass's
        other = getattr(self, "_hires_job", None)  # a hires checkpoint encodes them with its own text encoders
        self._hires_conds = self._hires_conditioning(s) if other is None or other is self else None
        self._release(*self.family.text_parts, stage=True)
        cond, uncond = self._ip_conditioning(s, cond, uncond)  # an IP-Adapter's image tokens ride with the text
        from .reference import encode

        #: this job's reference images, encoded once (sdrt.pipelines.reference); every denoiser call reads them
        self._references = encode(self, s.reference_images) if s.reference_images else None
        images: list[np.ndarray] = []
        seeds: list[int] = []
        from .toolbox import image_seeds

        tb = s.toolbox
        for k in range(s.batch_count):
            seed = s.seed + k * s.batch * (0 if tb.subseed_strength else 1)  # A1111: variations keep the seed
            subseed = None if tb.subseed is None else tb.subseed + k * s.batch
            try:
                images += self._run(s, seed, cond, uncond, init, mask, callback, subseed)
            except Interrupted as stop:
                if images or self._denoised is not None:  # else stopped before any step: nothing to give
                    stop._partial = self._partial_result(s, images, seeds, seed, original)
                raise
            seeds += image_seeds(tb, seed, s.batch)
        return self._generation(s, images, seeds, original)

    def _generation(self, s: Settings, images: list[np.ndarray], seeds: list[int], original: str) -> Generation:
        infos = [] if self._dry else [{**self._infotext(s, seed, i % s.batch), **self._extras_infotext(s, i)}
                                      for i, seed in enumerate(seeds)]
        return Generation(images, seeds, infos, original, s.negative_prompt)

    def _partial_result(self, s: Settings, images: list[np.ndarray], seeds: list[int], seed: int,
                        original: str) -> Callable[[], Generation]:
        """``Interrupted.partial``: the finished runs' images, then the stopped run's batch decoded from its last
        step's denoised estimate (A1111 decodes it too); decoded when asked, under this pipeline's lock."""
        from .toolbox import image_seeds

        x, self._denoised = self._denoised, None
        done_images, done_seeds = list(images), list(seeds)
        paste = getattr(self, "_paste", None)  # the job's, gone when make() is called after it
        run = getattr(self, "_refiner_run", None)
        decoder = run.vae if run is not None else self  # the model loaded last decodes (refiner.Run.vae)
        decoder = getattr(self, "_hires_decoder", None) or decoder  # a hires checkpoint's pass (hiresmodel)

        def make() -> Generation:
            got, got_seeds = list(done_images), list(done_seeds)
            if x is not None:
                with self._lock:
                    got += self._pasted(decoder._decode(x), paste)
                    decoder._release("vae_decoder", stage=True)
                got_seeds += image_seeds(s.toolbox, seed, s.batch)
            return self._generation(s, got, got_seeds, original)

        return make

    @property
    def default_size(self) -> int:
        size = self.folder.configs.get(self.family.denoiser_part, {}).get("sample_size")
        if isinstance(size, int) and size > 0:
            return size * self.family.vae_factor
        return self.family.default_size

    def _run(self, s: Settings, seed: int, cond: Conditioning, uncond: Conditioning | None,
             init: np.ndarray | None, mask: np.ndarray | None, callback: Callback | None,
             subseed: int | None = None) -> list[np.ndarray]:
        from .hires import second_pass_steps
        from .loops import KLoop

        assert s.width is not None and s.height is not None
        self._current = self._denoised = None  # nothing of an earlier job's run is shown or given back
        self._hires_decoder = None  # a hires checkpoint's pipeline once its pass runs (sdrt.pipelines.hiresmodel)
        self._hires_tight = False  # its pass released the first model's parts (hiresmodel.tight)
        shape = self.family.latent_shape(s.batch, s.height, s.width)
        generator = self._noise(s, shape, seed, subseed, first=True)  # diffusers' stream, or A1111's per image
        ms = self.family.model_sampling(s.width, s.height, *([s.shift] if s.shift is not None else []))
        loop = self._loop(s, ms, generator, seed)
        unet_in = self.denoiser.inputs[self.family.sample_input].shape
        nine = (not self.family.flow and len(unet_in) == 4
                and unet_in[1] == self.family.latent_channels + self.family.inpaint_channels)
        tool = self.flux_tool  # FLUX.1 Fill / Canny / Depth: conditioning on channels (sdrt.pipelines.fluxtools)
        fill = tool == "fill"
        if nine and mask is None:
            what = "UNet" if self.denoiser.name == "unet" else self.denoiser.name
            raise InputError(f"this is an inpainting {what} ({unet_in[1]} input channels): it needs an "
                             "init image and a mask", where="mask", fix="pass {@init_image=} and {@mask=}, or use an "
                             "ordinary model")
        extra = None
        image_latents = None
        # diffusers starts from pure noise at strength 1; A1111 noises the image latent whatever the strength
        full = s.strength is None or (s.strength == 1.0 and s.strength_rule == "diffusers")
        lh, lw = shape[2], shape[3]
        # FLUX.1 Kontext (reference images): diffusers' FluxKontextInpaintPipeline encodes the init image by its
        # latent mean (sample_mode="argmax"), drawing nothing from the seed's stream before the noise
        init_gen = generator
        if getattr(self, "_references", None) is not None:
            from .reference import MEAN as init_gen
        # Flux / SD3 ControlNets: each control image VAE-encoded before the init image's and the noise
        self._encode_controls(s, uncond, generator)
        edit = None
        if s.image_cfg is not None and self.instruct_pix2pix:  # sdrt.pipelines.edit
            from .reference import MEAN

            assert init is not None
            # the picture as the model was trained on it: the VAE's mean, without the family's scale and shift
            # (InstructPix2Pix), or with it for an EDM-trained one (CosXL Edit: diffusers' is_cosxl_edit)
            edit = self._init_latents(init, MEAN, lh, lw)
            if getattr(ms, "kind", None) != "edm":
                edit = self.family.to_vae_latents(edit)
            edit = np.repeat(edit, s.batch, axis=0)
        if edit is not None and s.strength is None:  # diffusers' InstructPix2Pix: noise alone, the whole schedule
            noise = generator.randn(shape)
            x = loop.start(noise)
        elif s.mode == "img2img":
            assert init is not None
            image_latents = np.repeat(self._init_latents(init, init_gen, lh, lw), s.batch, axis=0)
            noise = generator.randn(shape)
            x = loop.start(noise, image_latents)
        elif s.mode == "inpaint":
            assert init is not None and mask is not None
            if not nine or not full or fill:  # FluxFillPipeline encodes the init image first, at any strength
                image_latents = np.repeat(self._init_latents(init, init_gen, lh, lw), s.batch, axis=0)
            noise = generator.randn(shape)
            start = image_latents
            if s.masked_content != "original" and image_latents is not None:  # A1111's masked content 2 / 3: the
                from .inpaintcn import unleaned  # the seeds' draw, not inpaint_only+lama's leaning one
                from .maskedcontent import start_latents  # start changes, not the blend (strength 1 under
                # diffusers' rule starts from noise alone)

                start = start_latents(s.masked_content, image_latents, unleaned(generator, noise), mask)
            x = loop.start(noise, None if full else start)
            masked = to_nchw(init) * (mask < 0.5)[None, None]
            masked_latents = np.repeat(self._encode_image(masked.astype(np.float32), generator), s.batch, axis=0)
            mask_lat = np.repeat(nearest(mask, lh, lw)[None, None], s.batch, axis=0)
            if nine:
                extra = np.concatenate([mask_lat, masked_latents], axis=1).astype(np.float32)
            elif fill:
                from .fluxtools import fill_conditioning

                extra = fill_conditioning(masked_latents, mask, s.batch)
        else:
            if tool == "control":  # FluxControlPipeline: the control image, one VAE sample per image, then noise
                from .fluxtools import control_image

                rgb = to_nchw(control_image(s.control_image, s.width, s.height))
                extra = self._encode_image(np.repeat(rgb, s.batch, axis=0), generator).astype(np.float32)
            noise = generator.randn(shape)
            x = loop.start(noise)
        call = ModelCall(s.width, s.height, s.batch, s.cfg, cond, uncond, extra, guidance=s.guidance,
                         guidance_rescale=s.guidance_rescale)
        if edit is not None:
            from .edit import guidance

            call.edit, call.image_cfg = edit, float(s.image_cfg or 0)
            call.edit_guidance = guidance(s.cfg, call.image_cfg, s.strength_rule)
        self._ref_generator = generator  # the reference units' noise (sdrt.pipelines.refattn)
        control = self._control(s, call, s.width, s.height, second=False)  # ControlNet residuals as more UNet inputs
        model = self.family.denoiser(self._model_part(), ms, call)
        refiner = None
        if getattr(s.toolbox, "refiner", None) is not None:  # it takes over at refiner_switch_at (pipelines.refiner)
            from .refiner import attach

            model, refiner = attach(self, s, model, ms, loop.steps)  # the model the first pass calls, the refiner's run
        self._refiner_run = refiner  # an interrupted run's partial image is decoded by the model loaded last
        first = loop.steps
        if control is not None:  # the window of step 0 is judged against the run's steps, as the later steps'
            control.total = first
        total = first
        if s.toolbox.hires:  # the second pass's steps; A1111's DDIM, PLMS and UniPC run fewer (compvis.run_steps)
            from .compvis import run_steps
            from .scheduling import FolderSchedule

            length, run = second_pass_steps(s.toolbox.hires, s.steps)
            choice = s.toolbox.hires.choice((s.sampler, s.choice))
            cut = run_steps(ms, choice, length, length - run) if isinstance(ms, FolderSchedule) else None
            total += run if cut is None else cut

        def on_step(i: int, latents: np.ndarray) -> None:
            if i < first:
                self._step_done(loop, latents, control, i, first)
            if callback is not None and callback(i + 1, total, latents) is False:
                raise Interrupted(f"the step callback stopped the generation after step {i + 1} of {total}",
                                  step=i + 1, total=total, where="callback", fix="return None or True to go on")
            self._check_stop(i + 1, total)

        self._check_stop(0, total)
        if s.mode == "inpaint" and not nine and not fill:
            assert image_latents is not None
            if not isinstance(loop, KLoop):  # diffusers-form loops blend after each step, as diffusers does
                def blend(index: int, latents: np.ndarray) -> np.ndarray:
                    # diffusers' inpaint pipeline: the known part re-noised to the next step, clean after the last
                    proper = loop.add_noise(image_latents, noise, index) if index < total else image_latents
                    return (1 - mask_lat) * proper + mask_lat * latents

                x = loop.run(model, x, after_step=blend, callback=on_step)
            else:
                x = loop.run(model, x, inpaint=(mask_lat, image_latents, noise), callback=on_step)
        else:
            x = loop.run(model, x, callback=on_step)
        self._release_nets(s, hires_next=s.toolbox.hires is not None)  # those the hires pass does not use
        if s.toolbox.hires is not None:
            x = self._hires_pass(s, x, seed, subseed, cond, uncond, on_step, first, refiner)
            self._release_nets(s, hires_next=False)
        self._current = self._denoised = None
        self._release(self.denoiser.name, "vae_encoder", stage=True)
        self.denoiser.release_scratch()  # its buffers' memory goes to the decode (docs/openvino.md, first image)
        if refiner is not None and refiner.active:
            refiner.ref._release(refiner.ref.denoiser.name, stage=True)
            refiner.ref.denoiser.release_scratch()  # the refiner's UNet ran last: its buffers too
        if not np.isfinite(x).all():
            raise SdrtError("the sampler produced NaN or infinite latents",
                            where=f"{self.denoiser.path} on {self.backend}",
                            fix="try another backend or sampler; report it with the command you ran")
        # the model loaded last decodes, as in A1111 (a refiner whose switch never came, switch_at past the last
        # step, was never loaded there), with the VAE file chosen for the run (refiner.Run.vae)
        decoder = refiner.vae if refiner is not None else self
        if self._hires_decoder is not None:  # the hires checkpoint ran last: its VAE decodes, as A1111's
            decoder = self._hires_decoder
        images = self._pasted(self._inpaint_blend(s, decoder._decode(x)))  # inpaint_only's blend (inpaintcn)
        decoder._release("vae_decoder", stage=True)
        if self._hires_decoder is not None and self._hires_tight:  # both do not fit: the second model goes as well
            from .hiresmodel import release_first  # (A1111 loads the first back), before the next image's first pass

            release_first(self._hires_decoder)
        return images

    def _model_part(self) -> Any:
        """The part the family's denoiser call runs: the denoiser, with this job's reference images' tokens
        appended to every call when it has them (FLUX.1 Kontext)."""
        refs = getattr(self, "_references", None)
        if refs is None:
            return self.denoiser
        from .reference import ReferenceTokens

        return ReferenceTokens(self.denoiser, refs, self.family.sample_input, self.family.output)

    # ------------------------------------------------------------------ the run plan (sdrt.pipelines.plan)
    def plan(self, prompt: str | Settings, negative_prompt: str | None = "", **kwargs: Any) -> Any:
        """What :meth:`generate` with these arguments would run: every part, its input shapes and dtypes, and
        its calls. Computed by running this pipeline's own code on recording parts that compile and run
        nothing (zeros come back), so it is what runs; no weights are read into a backend."""
        from .plan import dry_run

        check_keywords(kwargs)
        with self._job("plan()"):
            memory = self.memory_plan()  # before the dry run reads any graph: the process's own base
            rp = dry_run(self, prompt, negative_prompt, kwargs)
            from .budget import calls_of

            # with the activations, and the parts the run uses besides the model's own (ControlNets, an image
            # encoder, the hires fix's model upscaler)
            if getattr(self, "_auto_memory", None) is not None or self.low_memory is None:
                self._job_extras = rp._extras  # low_memory=None: decided with the parts this run adds
                _ = self.is_low_memory
            memory = self.memory_plan(base=memory.base_bytes, calls=calls_of(rp), extras=rp._extras, twins=rp._twins,
                                      beside=rp._beside)
            rp.refiner_memory = self._refiner_memory(rp, memory)
            rp.hires_memory, rp.hires_first_released = self._hires_memory(rp, memory)
        rp.memory = memory  # each part's placement under the budget, the predicted peak
        return rp

    def _refiner_memory(self, rp: Any, memory: Any) -> Any:
        """The refiner's parts' placement for the run plan (None without a refiner, or one that never runs):
        planned on a base of the process and this model's resident parts, which stay loaded beside it."""
        from .budget import calls_of
        from .plan import REFINER_PREFIX

        ref = getattr(rp, "_refiner", None)
        calls = {k.removeprefix(REFINER_PREFIX): v for k, v in calls_of(rp).items() if k.startswith(REFINER_PREFIX)}
        if ref is None or not calls:
            return None
        return ref._make_memory_plan(self._hires_base(memory, False), calls)  # the run's (refiner.apply_memory_plan)

    def _hires_memory(self, rp: Any, memory: Any) -> tuple[Any, bool | None]:
        """The hires checkpoint's parts' placement in its pass, and whether the first model's parts are released
        before it loads ((None, None) without a hires checkpoint): planned on a base of the process and this model's
        resident parts, which stay loaded beside it, unless the two models do not both fit (``hiresmodel.tight``:
        low-memory mode, or their files over the budget), when the first model's parts go first, as A1111 unloads
        one checkpoint to load the other."""
        from .budget import calls_of
        from .hiresmodel import tight
        from .plan import HIRES_PREFIX

        twin = getattr(rp, "_hires", None)
        calls = {k.removeprefix(HIRES_PREFIX): v for k, v in calls_of(rp).items() if k.startswith(HIRES_PREFIX)}
        if twin is None or not calls:
            return None, None
        real = twin.__dict__.get("_hires_real", twin)
        first_goes = tight(self, real)
        return twin._make_memory_plan(self._hires_base(memory, first_goes), calls), first_goes

    @staticmethod
    def _hires_base(memory: Any, first_goes: bool) -> int:
        """The hires pass's base under the first model's plan ``memory``: the process, and the first model's
        resident parts unless they go first (``hiresmodel.tight``)."""
        held = 0 if first_goes else sum(p.weight_bytes * memory.footprints.get(p.part, memory.footprint)
                                        for p in memory.parts if p.placement == "resident" and not p.device)
        return int(memory.base_bytes + held)

    def _job_calls(self, prompt: Any, negative_prompt: str | None, kwargs: dict[str, Any]) -> Any:
        """This job's input shapes per part, for the memory plan's activations: from a dry run, made again only
        when the arguments that can change a shape change (not the seeds, not the words; images by their shape)."""
        from .budget import calls_of
        from .plan import dry_run, job_identity

        fresh = isinstance(prompt, Settings) or kwargs.get("reference_images") is not None  # their sizes: read
        # Settings: made again each time; the parts a job names (ControlNets, an image encoder, an upscaler) by their
        # files' identity, so one swapped for another of the same count is planned anew (job_identity)
        key = (object() if fresh else None, tuple(sorted((k, job_identity(v)) for k, v in kwargs.items()
                                                         if "seed" not in k)))
        cached = getattr(self, "_calls_key", None)
        if cached is not None and cached[0] == key:
            self._job_extras, self._job_beside, self._job_outputs = cached[2], cached[3], cached[4]
            return cached[1]
        rp = dry_run(self, prompt, negative_prompt, dict(kwargs), share=True)  # the job loads the same graphs next
        calls = calls_of(rp)
        self._job_extras = rp._extras  # the job's ControlNets, image encoder, model upscaler (the memory plan's)
        self._job_beside = rp._beside  # which of them run beside which part (plan.held_beside)
        self._job_outputs = {p.part: p.outputs for p in rp.parts}  # parts run cut to some outputs (ahead.py)
        self._calls_key = (key, calls, self._job_extras, self._job_beside, self._job_outputs)
        return calls

    # ------------------------------------------------------------------ low memory (sdrt.pipelines.lowmem)
    @property
    def low_memory(self) -> bool | None:
        """Keep only the running part loaded (None: decided from the device's reported memory, for each job's
        parts: ``is_low_memory``)."""
        return self.__dict__.get("_low_memory")

    @low_memory.setter
    def low_memory(self, value: bool | None) -> None:
        self.__dict__["_low_memory"] = value
        self.__dict__.pop("_auto_memory", None)  # set by hand: that stands, even the value last decided

    @property
    def is_low_memory(self) -> bool:
        if self.low_memory is None:
            self._auto_memory = (_UNDECIDED,)  # low_memory=None: decided again for each job's parts
        auto = getattr(self, "_auto_memory", None)
        job = getattr(self, "_job_extras", None)
        if auto is not None and len(auto) > 1 and self.low_memory != auto[1]:  # set by hand since: that stands
            self._auto_memory = auto = None
        if auto is not None and auto[0] is not job and not self._dry:
            # this job's extra parts count too (its ControlNets, an image encoder, a model upscaler): a run that
            # fits only with them released picks low memory
            from ..runtime import select
            from .budget import extra_bytes
            from .lowmem import auto_low_memory, model_bytes

            be, dev = select(self.backend, self.device)
            if self._plan_calibrated(be, dev):  # the memory plan places the parts on the cost model's figures
                self.__dict__["_low_memory"] = False
                self._auto_memory = (job, self.low_memory)
                return False
            if self.folder.single_file is not None:  # the graphs hold no weights: the files do
                files = {Path(f) for f in self.folder.single_file.files.values()}
                files |= set(getattr(self.folder.single_file, "all_files", ()))  # a diffusers folder's shards
                size = sum(f.stat().st_size for f in files if f.is_file())
            else:
                size = model_bytes(p.path for p in self._parts.values())
            self.__dict__["_low_memory"] = auto_low_memory(dev.memory_bytes, size + (extra_bytes(job) if job else 0))
            self._auto_memory = (job, self.low_memory)  # decided, not set by hand: made again for the next job's parts
        if self.low_memory:
            for part in self._parts.values():
                part.lazy_external = True  # external data stays mapped from disk, never read in
        return bool(self.low_memory)

    def _plan_calibrated(self, be: Any, dev: Any) -> bool:
        """Whether this CPU was calibrated for the denoiser's backend and precision (``sdrt selftest --calibrate``):
        low-memory mode is then not chosen by the fixed rule (``auto_low_memory``: twice the files' size over half
        the device's memory) but left to the memory plan, which releases what the calibrated figures say does not
        fit (``MemoryMixin._calibrated``)."""
        from ..cost.footprint import calibrated_here

        part = self._parts.get(self.family.denoiser_part)
        if part is None or getattr(dev, "kind", "") != "cpu" or part.options.get("quantize"):
            return False
        return calibrated_here(be.name, part.options.get("precision") or be.precision_for(dev))

    def _release(self, *names: str, stage: bool = False) -> None:
        drop = self._releases(names, stage)  # the memory plan's released parts; a stage's measured peak
        if self.is_low_memory or drop:
            from .lowmem import release

            keep = self._weight_state._originals if self._weight_state is not None else {}
            release((self._parts.get(n) for n in (names if self.is_low_memory else drop)), keep_graph=keep)
        if stage:
            self._stage_started()

    # ------------------------------------------------------------------ metadata
    def _infotext(self, s: Settings, seed: int, position: int) -> dict[str, object]:
        from .names import sampler_labels

        sampler, schedule = sampler_labels(s.choice)
        info: dict[str, object] = {"Steps": s.steps, "Sampler": sampler}
        if schedule:
            info["Schedule type"] = schedule
        info.update({"CFG scale": _num(s.cfg), "Seed": seed, "Size": f"{s.width}x{s.height}",
                     "Model hash": self.model_hash, "Model": self.folder.name})
        if s.image_cfg is not None:  # A1111's infotext name (an InstructPix2Pix model's only: _edit_defaults)
            info["Image CFG scale"] = _num(s.image_cfg)
        if self._weight_state is None and self.folder.vae_file is not None:  # else the weight state names it
            from .weights import vae_infotext

            info.update(vae_infotext(self.folder.vae_file))
        if self._weight_state is not None:
            hires = s.toolbox.hires if s.toolbox is not None else None
            texts = [s.prompt, s.negative_prompt, *((hires.prompt, hires.negative_prompt) if hires else ())]
            info.update(self._weight_state.infotext(texts))
        info.update(self.family.infotext(s))
        if s.reference_images:
            from .reference import infotext

            info.update(infotext(s.reference_images, s.reference_resize))
        if s.init_image is not None:
            if s.strength is not None:  # None: an InstructPix2Pix run from noise alone (sdrt.pipelines.edit)
                info["Denoising strength"] = _num(s.strength)
            info["Strength rule"] = s.strength_rule  # sdrt's: A1111 writes no field for its own rule
            if s.init_upscaler is not None:
                info["Init upscaler"] = s.init_upscaler[0]  # sdrt's: A1111 writes none for upscaler_for_img2img
        if s.mask is not None:
            info.update(self._mask_infotext(s))  # in A1111's place: after the init image's, before CFG Rescale
        if s.guidance_rescale:
            info["CFG Rescale"] = _num(s.guidance_rescale)  # Forge's name (A1111's extension wrote "CFG Rescale phi")
        if s.clip_skip > 1:
            info["Clip skip"] = s.clip_skip
        if s.batch > 1:
            info["Batch size"] = s.batch
            info["Batch pos"] = position
        return info

    @property
    def model_hash(self) -> str:
        """First 10 hex digits of the SHA-256 of the denoiser's ``model.onnx`` (not its external data, for speed);
        for a single file, A1111's short hash of the file (cached by path, size and mtime)."""
        if self.folder.single_file is not None:
            return str(self.folder.single_file.model_hash)
        if not hasattr(self, "_hash"):
            import hashlib

            h = hashlib.sha256()
            with open(self.denoiser.path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._hash = h.hexdigest()[:10]
        return self._hash


def _takes_range(sampler: Any) -> bool:
    """A sampler that integrates over [sigma_min, sigma_max] (dpm_fast, dpm_adaptive) rather than visit each sigma."""
    try:
        return {"sigma_min", "sigma_max"} <= set(inspect.signature(sampler).parameters)
    except (TypeError, ValueError):
        return False


def _check_callback(callback: Callback | None) -> None:
    """A step callback that cannot take ``(step, total, latents)`` fails now, by name, not as a TypeError after the
    first step has run."""
    import inspect

    if callback is None:
        return
    try:
        sig = inspect.signature(callback)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: called as it is
        return
    try:
        sig.bind(1, 1, None)
    except TypeError:
        raise InputError(f"callback must take three arguments (step, total, latents), and its signature is {sig}",
                         where="callback", fix="define it as def callback(step, total, latents): ...") from None


def _num(value: float) -> object:
    return int(value) if float(value).is_integer() else round(float(value), 4)


def load(model: str | os.PathLike[str], backend: str = "auto", device: Any = None, *,
         vae: str | os.PathLike[str] | None = None, text_encoders: Any = (),
         graph_paths: Mapping[str, str | os.PathLike[str]] | None = None,
         tokenizers: Mapping[str, str | os.PathLike[str]] | None = None, prediction: str | None = None,
         family: str | None = None, t5: bool = True, **options: Any) -> Pipeline:
    """Open a model; the parts compile on first use, per shape.

    ``model``: a diffusers/Optimum ONNX model folder, or a single-file ``.safetensors`` checkpoint (A1111/LDM
    SD 1.x/2.x/XL, SD 3 Medium, SD 3.5, Flux.1 and Chroma as their publishers and ComfyUI ship them), which runs
    on sdrt's shipped weight-free graphs with the release's scheduler and tokenizers (docs/single-files.md).
    ``vae``: a VAE file; ``text_encoders``: text-encoder files (``clip_l``, ``clip_g``, ``t5xxl``...; which
    encoder each is comes from its tensors). With a single file they fill or replace its parts; on a folder
    they replace the weights of its own VAE / text encoders.
    A diffusers folder of ``.safetensors`` (``unet/`` or ``transformer/``, ``text_encoder*/``, ``vae/``, no ONNX
    parts) runs on the shipped graphs too, with its own scheduler, tokenizers and VAE scaling.
    ``t5=False`` (SD 3 / 3.5): run without the T5-XXL encoder even when the model has one (its states zeros, as
    diffusers' ``text_encoder_3=None``; the T5 part is not loaded). A model without T5 runs so anyway, with a warning.
    Advanced, single files and diffusers folders only: ``graph_paths={part: .onnx}`` binds onto other weight-free graphs than the
    shipped ones (same parameter names), ``tokenizers={"tokenizer": folder, ...}`` replaces the release's,
    ``prediction="epsilon"|"v_prediction"|"sample"`` overrides what the file implies (``"sample"``: x0, with trailing
    timesteps, as SDXL-Lightning's 1-step x0 UNet runs; a file named ``*_x0.safetensors`` says it itself), ``family="flux-dev"`` (a key of
    ``sdrt.checkpoint.FAMILY_GRAPHS``) takes a transformer whose keys say that family at other widths than its
    release (a reduced or test model on ``graph_paths``), with text-encoder files matched to those graphs.
    """
    from ..runtime import select
    from .singlefile import bind_part_files, folder_from_file, is_single_file, note_part_files

    if not isinstance(model, (str, os.PathLike)):  # ModelFolder.open named its own parameter, "folder"
        raise InputError(f"{{@model}} must be a path, got {type(model).__name__} {model!r:.40}", where="model",
                         fix="pass a model folder's or a checkpoint file's path, e.g. "
                             "pipelines.load('sd15-onnx/') or pipelines.load('model.safetensors')")
    # resolved once (a wrong name fails now, before any file is read); every part compiles on this device
    be, dev = select(backend, device)
    _check_options(be, dev, options)
    if be.caches and options.get("cache", True) is not False:  # a bad $SDRT_CACHE_MAX_SIZE: now, not at the first
        from ..cache.paths import max_bytes  # compile, after the model has loaded

        max_bytes()
    text_encoders = _part_files(vae, text_encoders)
    if is_single_file(model):
        folder = folder_from_file(model, vae, text_encoders, graph_paths=graph_paths, tokenizers=tokenizers,
                                  prediction=prediction, family=family)
        pipe = Pipeline(without_t5(folder, t5, text_encoders), backend=be.name, device=dev, **options)
        if vae is not None or text_encoders:
            note_part_files(pipe, [*([vae] if vae is not None else []), *text_encoders])
        return pipe
    from ..checkpoint.diffusers_folder import is_diffusers_folder

    if is_diffusers_folder(model):  # .safetensors parts and no ONNX: onto the shipped graphs
        folder = ModelFolder.from_diffusers(model, graph_paths=graph_paths, tokenizers=tokenizers,
                                            prediction=prediction)
        pipe = Pipeline(without_t5(folder, t5, text_encoders), backend=be.name, device=dev, **options)
        if vae is not None or text_encoders:
            bind_part_files(pipe, vae, text_encoders)
        return pipe
    advanced = {k: v for k, v in (("graph_paths", graph_paths), ("tokenizers", tokenizers),
                                  ("prediction", prediction), ("family", family)) if v is not None}
    if advanced:
        raise InputError(f"{', '.join('{@' + k + '}' for k in advanced)} applies to a single-file checkpoint or a "
                         "diffusers folder of "
                         f".safetensors, and {model} is an ONNX model folder",
                         where=next(iter(advanced)), fix="leave it unset for a folder")
    pipe = Pipeline(without_t5(ModelFolder.open(model), t5, text_encoders), backend=be.name, device=dev, **options)
    if vae is not None or text_encoders:
        bind_part_files(pipe, vae, text_encoders)
    return pipe


#: ``Pipeline.is_low_memory`` under ``low_memory=None`` before its first decision
_UNDECIDED = object()

#: load's keywords besides the backend's options (Pipeline's own: low_memory ... quantize)
LOAD_KEYWORDS = ("backend", "device", "vae", "text_encoders", "graph_paths", "tokenizers", "prediction", "family", "t5",
                 "low_memory", "vae_tile", "memory", "share_blocks", "placement", "quantize")
_PIPELINE_OPTIONS = frozenset(("low_memory", "vae_tile", "memory", "share_blocks", "placement", "quantize"))
#: what a keyword that load does not take is done with instead
_INSTEAD = {"lora": "pass LoRAs after loading with pipe.set_loras([(path, scale)])",
            "embedding": "add embeddings after loading with pipe.add_embedding(path)",
            "checkpoint": "bind a checkpoint after loading with pipe.load_weights(path)"}


def _check_options(be: Any, dev: Any, options: Mapping[str, Any]) -> None:
    """A keyword that neither load, the Pipeline nor the backend takes is an error now, naming it (the backend
    would refuse it at the first generate, listing only its own options)."""
    import difflib

    try:
        be.check_options({k: v for k, v in options.items() if k not in _PIPELINE_OPTIONS}, dev)
    except UnknownOptions as exc:  # (a known option with a bad value passes through: the backend's own error, now)
        theirs = [*exc.known, *(("cache", "cache_dir") if be.caches else ())]
        hints = []
        for name in exc.unknown:
            key = next((k for k in _INSTEAD if name.lower().rstrip("s") == k), None)
            if key is not None:
                hints.append(f"{name}: {_INSTEAD[key]}")
                continue
            close = difflib.get_close_matches(name, [*LOAD_KEYWORDS, *theirs], n=1, cutoff=0.7)
            if close:
                hints.append(f"did you mean {close[0]}= for {name}=")
        backend_says = (f"the {be.name} backend's options are {', '.join(theirs)}" if theirs else
                        f"the {be.name} backend takes no options")
        raise InputError(f"load() takes no keyword {', '.join(exc.unknown)}", where=exc.unknown[0],
                         fix="; ".join([*hints, f"load's own keywords are {', '.join(LOAD_KEYWORDS)}",
                                        backend_says])) from None


def _part_files(vae: Any, text_encoders: Any) -> list[Any]:
    """``text_encoders`` as a list of paths (one path alone is a list of one), each checked; ``vae`` checked."""
    if vae is not None and not isinstance(vae, (str, os.PathLike)):
        raise InputError(f"vae must be a file path, got {type(vae).__name__} {vae!r:.40}", where="vae",
                         fix="pass {@vae=}'vae.safetensors', or leave it unset for the model's own VAE")
    fix = "pass {@text_encoders=}['clip_l.safetensors', ...] (a list of file paths) or one path"
    if text_encoders is None:
        return []
    if isinstance(text_encoders, (str, os.PathLike)):
        return [text_encoders]
    if isinstance(text_encoders, Mapping) or not hasattr(text_encoders, "__iter__"):
        raise InputError(f"text_encoders must be a list of file paths, got {type(text_encoders).__name__} "
                         f"{text_encoders!r:.40}", where="text_encoders", fix=fix)
    files = list(text_encoders)
    for i, f in enumerate(files):
        if not isinstance(f, (str, os.PathLike)):
            raise InputError(f"text_encoders[{i}] must be a file path, got {type(f).__name__} {f!r:.40}",
                             where="text_encoders", fix=fix)
    return files


def _has_lora_tag(*texts: object) -> bool:
    from ..text.loras import has_lora_tag

    return has_lora_tag(*texts)
