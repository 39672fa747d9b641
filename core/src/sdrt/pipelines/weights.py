"""The weights a pipeline runs with: a checkpoint, LoRAs on top, textual-inversion embeddings.

Every change reaches the compiled sessions through ``Session.update_weights``
(``Part.update_weights``): nothing is re-exported or recompiled. The one
exception is the first embedding: the text encoder's token table gets spare
rows once (``RESERVED_ROWS`` or more), which compiles that small graph again;
every later embedding only fills rows.

State per part:

- ``base``: ``{initializer: array}`` that replace the graph's own (from a
  checkpoint, and the token table with embedding rows); empty means "the
  export's weights";
- the LoRAs' merged arrays, computed from ``base`` each time the set of LoRAs
  changes. Removing LoRAs binds ``base`` again: the arrays that were there
  before, bit for bit (nothing is subtracted).
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, WeightsError, in_caller_words
from ..weights import TensorRef, Weights
from . import fluxcontrollora

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint, Embedding
    from ..graph import Graph
    from ..lora import Lora
    from .parts import Part
    from .pipeline import Pipeline

log = logging.getLogger("sdrt.pipelines.weights")

RESERVED_ROWS = 16
#: the largest LoRA scale taken (A1111 users pass -2 to 2; far past this the merged weights are noise or overflow)
MAX_LORA_SCALE = 100.0
#: a LoRA folder's files, as A1111 lists them (``<lora:NAME:w>`` takes the first that exists)
LORA_SUFFIXES = (".safetensors", ".pt", ".ckpt")


def check_lora_scale(scale: object, name: str, where: str = "{@loras}") -> float:
    """A LoRA's scale as a float: a finite number with ``|scale| <= MAX_LORA_SCALE``, else ``WeightsError``
    (before any merge, so that a bad scale is not blamed on the file or on the sampler)."""
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        # float() would read the text '0.8' (or a one-element array) as a number, silently
        raise WeightsError(f"the scale of LoRA {name!r} is {type(scale).__name__} {scale!r:.40}, not a number",
                           where=where, fix="use a number such as 0.8")
    value = float(scale)
    if not np.isfinite(value) or abs(value) > MAX_LORA_SCALE:
        raise WeightsError(f"the scale of LoRA {name!r} is {scale!r}; a scale must be a finite number between "
                           f"-{MAX_LORA_SCALE:g} and {MAX_LORA_SCALE:g}", where=where,
                           fix="use a scale such as 0.8 (LoRAs are made for about 0 to 1.5)")
    return value
#: part -> (kohya prefixes, PEFT prefixes, embedding vector key)
_LORA_ROUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "unet": (("lora_unet_", "lora_transformer_", "lycoris_"),
             ("unet.", "base_model.model.", "transformer.", "diffusion_model.", "model.diffusion_model.")),
    "text_encoder": (("lora_te_", "lora_te1_"), ("text_encoder.",)),
    "text_encoder_2": (("lora_te2_",), ("text_encoder_2.",)),
    "text_encoder_3": (("lora_te3_",), ("text_encoder_3.",)),
}
#: where a LoRA's key of one route goes in a family whose parts are named otherwise: SD 3.x, Flux and Chroma
#: denoise with a ``transformer``; kohya's Flux LoRAs name T5 ``lora_te3_`` (SD 3's third encoder), which is
#: Flux's ``text_encoder_2``
_ROUTE_FALLBACK = {"unet": ("transformer",), "text_encoder_3": ("text_encoder_2",)}
_EMB_KEYS = {"text_encoder": "clip_l", "text_encoder_2": "clip_g"}


@dataclass
class ActiveLora:
    lora: Lora
    scale: float
    name: str
    path: Path | None = None
    #: the UNet's (or transformer's) scale where a prompt tag gives its own (``<lora:name:te:unet>``); None: ``scale``
    unet_scale: float | None = None

    def scale_for(self, part: str) -> float:
        """The scale on ``part``: ``scale`` on the text encoders, ``unet_scale`` (when set) on the denoiser."""
        return self.scale if self.unet_scale is None or part.startswith("text_encoder") else self.unet_scale


def _folder_scheduler(root: Path) -> dict[str, Any]:
    """A diffusers folder's ``scheduler/scheduler_config.json`` ({} without a readable one)."""
    import json

    try:
        config = json.loads((root / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _folder_prediction(root: Path) -> tuple[str | None, bool]:
    """(prediction_type, rescale_betas_zero_snr) a diffusers folder's ``scheduler/scheduler_config.json`` says
    (diffusers' default ``"epsilon"`` where the config has no prediction_type); (None, False) without a readable one."""
    config = _folder_scheduler(root)
    if not config:
        return None, False
    kind = config.get("prediction_type", "epsilon")
    return (kind if kind in ("epsilon", "v_prediction", "sample") else None), bool(config.get("rescale_betas_zero_snr"))


@dataclass
class WeightState:
    """What ``pipe.load_weights``, ``pipe.set_loras`` and ``pipe.add_embedding`` changed."""

    pipe: Pipeline
    checkpoint: Checkpoint | None = None
    base: dict[str, dict[str, np.ndarray | TensorRef]] = field(default_factory=dict)
    loras: list[ActiveLora] = field(default_factory=list)
    embeddings: list[Embedding] = field(default_factory=list)
    lora_dir: Path | None = None
    fixed: list[ActiveLora] = field(default_factory=list)
    _originals: dict[str, Graph] = field(default_factory=dict)  # graphs before rows were reserved
    _vocab: dict[str, int] = field(default_factory=dict)
    #: LoRA file -> (its version, ``sdrt.weights.store.file_stamp``, and what it held then)
    _cache: dict[Path, tuple[Any, Lora]] = field(default_factory=dict)
    #: separate files bound onto parts (``vae=`` / ``text_encoders=`` on an ONNX folder): part -> file
    part_files: dict[str, Path] = field(default_factory=dict)
    #: part -> the base a separate file replaced (the model's own weights for it: a checkpoint's, or None for the
    #: graph's or single file's own), bound again when the part goes back to them (``Pipeline.set_vae(None)``)
    own_base: dict[str, Any] = field(default_factory=dict)
    #: parts running merged LoRA weights now
    _lora_parts: set[str] = field(default_factory=set)
    #: part -> whether its base weights (no LoRA) last ran freshly compiled (else rebound on live sessions)
    _base_fresh: dict[str, bool] = field(default_factory=dict)
    #: a Flux Control LoRA is active: the transformer's own (64-input) graph, which it runs again without one
    _plain_graph: Path | None = None
    #: the transformer graph the last ``_merge`` merged for (the 128-input twin with a control LoRA, else None)
    _want_graph: Path | None = None
    #: LoRA files a run will make active, for a run plan made before they are (the CLI's ``--dry-run --lora``)
    planned: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the pipeline owns this state (and its parts hold weights_factory closures over it): a strong reference
        # back made a cycle, so a pipeline dropped without close() kept its sessions' memory until the cyclic
        # garbage collector happened to run
        if not isinstance(self.pipe, weakref.ProxyTypes):
            self.pipe = weakref.proxy(self.pipe)

    # -- helpers --------------------------------------------------------------
    def _parts(self) -> dict[str, Part]:
        return {k: v for k, v in self.pipe.parts.items()}

    def _graph(self, name: str) -> Graph:
        return self._originals.get(name) or self._parts()[name].graph

    def _weights(self, name: str, overrides: Mapping[str, np.ndarray | TensorRef]) -> Weights:
        """The part's graph weights with ``overrides`` (arrays, or lazy refs into a checkpoint) on top."""
        own = self._parts()[name].own_weights()
        refs = {n: own.ref(n) for n in own}
        for init, v in overrides.items():
            refs[init] = v if isinstance(v, TensorRef) else TensorRef(init, v.dtype, tuple(v.shape), "<override>",
                                                                       (lambda a=v: a))
        return Weights(refs)

    def _bind(self, name: str, overrides: Mapping[str, np.ndarray | TensorRef], lora: bool = False) -> None:
        """Bind ``overrides`` on the part's own weights; ``lora``: they hold merged LoRA weights.

        A session rebound to weights is not always the program a fresh compile makes with them: OpenVINO's
        swappable form feeds biases and norm vectors as inputs, which its CPU plugin adds after the kernel instead
        of fusing them as constants (1 level of 255 off in fp32, up to 22 in bf16 on tiny SD 1.x). So a part's
        LoRA weights always come through ``update_weights``: a session compiled while LoRAs are active compiles
        the base weights and then binds the merged ones (``Part.compile_factory``), as a LoRA bound on a live
        session does, or compiles the merged ones at once into the program that binding makes where the backend
        offers it (``Backend.rebind_options``: OpenVINO's swappable form), and a LoRA's image does not depend on
        what ran before (in low-memory mode every compile is
        fresh, sessions being closed after use, so LoRAs are compiled in there). Removing the last LoRA binds the base
        weights as they ran before: a base that first ran freshly compiled (at load, a checkpoint or embedding
        bound before any session existed) is compiled fresh again."""
        part = self._parts()[name]
        if lora:
            self._lora_parts.add(name)
            # not for a control LoRA's 128-input twin (its base is merged: the padded img_in), nor in low-memory mode,
            # where every session is closed after use: no LoRA is ever bound on a live one, each compile is fresh
            if not (name == "transformer" and self._want_graph is not None) and not self.pipe.is_low_memory \
                    and not _rebinds_as_compiled(part.backend):
                base = self._weights(name, self.base.get(name, {}))
                part.compile_factory = lambda: base
            else:
                part.compile_factory = None
        elif name in self._lora_parts:
            self._lora_parts.discard(name)
            part.compile_factory = None
            if self._base_fresh.get(name, True):
                part.close()
                part.weights = part.default_weights
                default = part.default_weights
                part.weights_factory = None if default is None else (lambda: default)
        else:
            self._base_fresh[name] = not part.sessions
        if overrides or part.weights is not part.default_weights:
            part.update_weights(self._weights(name, overrides))
            part.weights_factory = lambda: self._weights(name, overrides)
        self.pipe._weights_changed(name)

    # -- checkpoints ------------------------------------------------------------
    def load_checkpoint(self, path: str | os.PathLike[str] | Checkpoint) -> Checkpoint:
        """Bind a single-file checkpoint (or diffusers folder) to every part; active LoRAs and
        embeddings are applied again on top, and a part a separate VAE / text-encoder file fills keeps that file.
        Checked for every part before anything changes."""
        from ..checkpoint import Checkpoint

        if not isinstance(path, (str, os.PathLike, Checkpoint)):
            raise InputError(f"the checkpoint must be a file path or an sdrt.checkpoint.Checkpoint, got "
                             f"{type(path).__name__} {path!r:.40}", where="load_weights",
                             fix="pass pipe.load_weights('model.safetensors') (a str or pathlib.Path)")
        family = self.pipe.family
        if family.name in ("sd3", "flux", "chroma"):  # Checkpoint reads LDM files: it named the file's layout as wrong
            raise InputError(f"a checkpoint bound onto a loaded model ({{@@weights}}) must be SD 1.x, "
                             f"SD 2.x or SDXL, and this model is {family.label}", where=str(path),
                             fix=f"run a {family.label} checkpoint as the model itself ({{@@model}}), with "
                                 "{@text_encoders} / {@vae} files where it holds the transformer only")
        ckpt = path if isinstance(path, Checkpoint) else Checkpoint.open(path)
        self._check_edm(ckpt)
        parts = self._parts()
        arrays = ckpt.lazy({name: self._graph(name) for name in parts})  # read on use: nothing held
        for name, arr in arrays.items():
            if name in self.part_files:  # a separate VAE / text-encoder file stays: the checkpoint's is its own now
                self.own_base[name] = dict(arr)
            else:
                self.base[name] = dict(arr)
        self.checkpoint = ckpt
        if self.embeddings:  # the new token table gets the embedding rows again
            self._write_embeddings()
        self._apply(set(arrays))
        log.info("loaded %s", ckpt)
        self._follow_prediction(ckpt)
        return ckpt

    def plan_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """What a checkpoint decides of the sampling (its prediction, zero terminal SNR: ``_follow_prediction``),
        without binding its weights: a dry run's plan (``sdrt generate --weights FILE --dry-run``) says the model
        sampling the run will have."""
        from ..checkpoint import Checkpoint

        if self.pipe.family.name in ("sd3", "flux", "chroma"):  # the run refuses these (load_checkpoint)
            return
        ckpt = Checkpoint.open(path)
        self._check_edm(ckpt)
        self._follow_prediction(ckpt)

    def _check_edm(self, ckpt: Any) -> None:
        """An EDM-trained checkpoint (Playground v2.5's ``edm_mean``/``edm_std``, CosXL's ``edm_vpred.*``; a diffusers
        folder with an EDM scheduler) samples and scales its latents unlike a DDPM-trained model: bound onto a model
        of the other kind, or onto an EDM model of another prediction or sigma_data (CosXL onto Playground), it would
        give noise, so that is refused before anything changes."""
        from ..checkpoint.edm import edm_key, edm_label
        from ..checkpoint.files import release_defaults
        from .scheduling import EDM_SCHEDULERS

        path = Path(getattr(ckpt, "path", "") or "")
        if path.is_dir():
            sched = _folder_scheduler(path)
            theirs = sched.get("_class_name") in EDM_SCHEDULERS
            what = f"an EDM-trained model (its scheduler is {sched.get('_class_name')})"
        else:
            key = edm_key(ckpt.weights)
            theirs = key is not None
            sched = release_defaults("sdxl")["edm"][key]["scheduler"] if key is not None else {}
            what = edm_label(ckpt.weights) or ""
        mine = self.pipe.folder.scheduler
        ours = mine.get("_class_name") in EDM_SCHEDULERS
        if theirs and ours:
            def form(config: dict[str, Any]) -> tuple[str, float]:
                return str(config.get("prediction_type", "epsilon")), float(config.get("sigma_data", 0.5))

            if form(sched) != form(mine):
                raise InputError(f"{path.name} is {what}, predicting {form(sched)[0]} with sigma_data {form(sched)[1]:g}, "
                                 f"and this model ({self.pipe.folder.name}) is EDM-trained with {form(mine)[0]} and "
                                 f"sigma_data {form(mine)[1]:g}: it would give noise", where=str(path),
                                 fix=f"run it as the model itself: sdrt generate {path.name} \"prompt\" "
                                     "(pipelines.load(FILE) in the API)")
        if theirs == ours:
            return
        if theirs:
            raise InputError(f"{path.name} is {what}, and this model samples as {self.pipe.family.label} does: its "
                             "noise schedule and latents would not fit", where=str(path),
                             fix=f"run it as the model itself: sdrt generate {path.name} \"prompt\" "
                                 "(pipelines.load(FILE) in the API)")
        raise InputError(f"{path.name} is not EDM-trained, and this model ({self.pipe.folder.name}) samples with an "
                         f"EDM schedule ({self.pipe.folder.scheduler.get('_class_name')}): it would give noise",
                         where=str(path), fix=f"run it as the model itself: sdrt generate {path.name} \"prompt\" "
                                              "(pipelines.load(FILE) in the API)")

    def _follow_prediction(self, ckpt: Any) -> None:
        """Sample the checkpoint as A1111 does when it says its own prediction: its ``<stem>.yaml``, SDXL's
        ``v_pred`` key or, for SD 2.x, its weights (as ComfyUI tells them apart); a ``ztsnr`` key rescales the
        betas to zero terminal SNR. A diffusers folder's own scheduler config says both. Each bound checkpoint
        decides anew: one that says nothing runs with the folder's scheduler."""
        from ..checkpoint.files import SD2_V_KEY, X0_SCHEDULER, name_prediction, sd2_prediction, yaml_prediction

        family = self.pipe.family
        family.scheduler_overrides = {}
        path = Path(getattr(ckpt, "path", "") or "")
        folder = {"eps": "epsilon", "v": "v_prediction", "x0": "sample"}.get(self.pipe.folder.prediction)
        if folder is None or not (path.is_file() or path.is_dir()):
            return
        if path.is_dir():  # a diffusers folder: its own scheduler config says both, as diffusers reads it
            said, zero_snr = _folder_prediction(path)
            why, zero_why = "its scheduler/scheduler_config.json", "its scheduler config"
        else:
            said, why = name_prediction(path), "its name says x0"  # SDXL-Lightning's 1-step x0 UNet, as the model does
            if said is None:
                said, why = yaml_prediction(path), path.with_suffix(".yaml").name
            zero_snr, zero_why = "ztsnr" in ckpt.weights, "its ztsnr key"
            if said is None and "v_pred" in ckpt.weights:
                said, why = "v_prediction", "its v_pred key"
            # ComfyUI's weight test is for 4-channel SD 2.x UNets: an inpainting one (A1111's config_sd2_inpainting)
            # is eps
            elif said is None and str(ckpt.family).startswith("SD 2") and \
                    not str(ckpt.family).endswith("inpainting") and SD2_V_KEY in ckpt.weights:
                said, why = sd2_prediction(path, ckpt.weights), "its weights, as ComfyUI tells SD 2.x files apart"
        overrides: dict[str, Any] = {}
        if said is not None and said != folder:
            overrides["prediction_type"] = said
            if said == "sample":  # with the trailing timesteps it is run with, as when it is the model itself
                overrides.update(X0_SCHEDULER)
        if zero_snr and not self.pipe.folder.scheduler.get("rescale_betas_zero_snr"):
            overrides["rescale_betas_zero_snr"] = True
        if not overrides:
            return
        family.scheduler_overrides = overrides
        words = {"epsilon": "eps", "v_prediction": "v", "sample": "x0"}
        what = [f"{words[said]}-prediction ({why}; the model folder's scheduler says {words[folder]})"] \
            if "prediction_type" in overrides else []
        what += [f"with zero terminal SNR ({zero_why})"] if "rescale_betas_zero_snr" in overrides else []
        log.info("%s is sampled as %s, as A1111 samples it", path.name, " and ".join(what))

    # -- LoRA -------------------------------------------------------------------
    def lora(self, path: str | os.PathLike[str]) -> Lora:
        from ..lora import Lora
        from ..weights.store import file_stamp

        p = Path(path)
        stamp = file_stamp(p)
        cached = self._cache.get(p)
        if cached is None or cached[0] != stamp:  # a file written again is read again (A1111 reloads on its mtime)
            if cached is not None:
                log.info("LoRA %s changed on disk: reading it again", p.name)
            self._cache[p] = (stamp, Lora.open(p))
        return self._cache[p][1]

    def set_loras(self, loras: Sequence[tuple[Lora | str | os.PathLike[str], float]]) -> None:
        """Make exactly these LoRAs active (each with its scale) for every generation from now on;
        ``[]`` removes them all. Prompt tags (``<lora:name:w>``) add to these for one generation."""
        self.fixed = self._activate(check_lora_list(loras))

    def prepare(self, prompt: str, negative_prompt: str | None) -> tuple[str, str | None]:
        """Remove A1111's ``<lora:name:w>`` tags from both prompts and make those LoRAs (from
        ``lora_dir``) active, with the ones given to ``set_loras``; refuses an unknown name first."""
        wanted: list[tuple[Lora | str | os.PathLike[str], float] | tuple[Any, float, float | None]] = [
            (a.path if a.path is not None else a.lora, a.scale, a.unet_scale) for a in self.fixed]
        out = []
        for text, key in ((prompt, "prompt"), (negative_prompt, "negative_prompt")):
            if isinstance(text, str) and "<" in text:
                text, tags = self.resolve_tags(text, key)
                for name, w, u in tags:
                    check_lora_scale(w, name, where=f"<lora:{name}:{w}> in {{@{key}}}")
                    check_lora_scale(u, name, where=f"<lora:{name}:{w}:{u}> in {{@{key}}}")
                wanted += [(self._tag_lora(name, w, key), w, None if u == w else u) for name, w, u in tags]
            out.append(text)
        current = [(id(a.lora), a.scale, a.unet_scale) for a in self.loras]  # a changed file's Lora is another
        want_keys = [(id(self.lora(x[0]) if isinstance(x[0], (str, os.PathLike)) else x[0]), x[1],
                      x[2] if len(x) > 2 else None) for x in wanted]
        if want_keys != current:
            self._activate(wanted)
        return out[0], out[1]

    def _tag_lora(self, name: str, scale: float, key: str) -> Path:
        """The file of a prompt's ``<lora:name:...>`` tag, read (and cached) here so that a file that is no LoRA
        (a picture, a truncated download) is said as that tag's, not as a file the caller never named."""
        from ..errors import SdrtError

        path = self.lora_file(name, key)
        try:
            self.lora(path)
        except SdrtError as exc:
            raise type(exc)(f"<lora:{name}:{scale:g}> in {{@{key}}}: {path.name} cannot be read as a LoRA: "
                            f"{exc.what}", where=key,  # the argument (a server's field) the tag is in
                            fix=f"replace {path.name} in the LoRA folder with the LoRA file itself (.safetensors), "
                                f"or take the tag out of {{@{key}}}") from None
        return path

    def _activate(self, loras: Sequence[tuple[Any, ...]]) -> list[ActiveLora]:
        """``(path or Lora, scale)`` pairs, or ``(path or Lora, scale, unet_scale)`` from a prompt tag."""
        active = []
        for item, scale, *rest in loras:
            unet = rest[0] if rest else None
            source = item if isinstance(item, (str, os.PathLike)) else item.source
            scale = check_lora_scale(scale, Path(source).stem)
            if isinstance(item, (str, os.PathLike)):
                lora = self.lora(item)
                active.append(ActiveLora(lora, float(scale), Path(item).stem, Path(item), unet))
            else:
                active.append(ActiveLora(item, float(scale), Path(item.source).stem,
                                         Path(item.source) if Path(item.source).is_file() else None, unet))
        # every part a LoRA can reach (SD 3.x/Flux/Chroma's transformer takes the unet route's keys)
        touched = {name for name in self._parts() if name in _LORA_ROUTES or name == "transformer"}
        if not self.loras and not active:
            return active
        merged = self._merge(active)  # checks everything before anything changes
        self.loras = active
        self._apply(touched, merged)
        return active

    def resolve_prompt(self, text: str, where: str = "prompt") -> tuple[str, list[tuple[str, float]]]:
        """A1111's ``<lora:name:scale>`` tags: removed from the text, resolved in ``lora_dir``."""
        from ..text import extract_loras

        clean, tags = extract_loras(text, where)
        return clean, tags

    def resolve_tags(self, text: str, where: str = "prompt") -> tuple[str, list[tuple[str, float, float]]]:
        """As :meth:`resolve_prompt`, each tag with its text-encoder and UNet weights (``<lora:name:te:unet>``)."""
        from ..text import extract_lora_tags

        return extract_lora_tags(text, where)

    def lora_file(self, name: str, where: str = "prompt") -> Path:
        """The file of a prompt's ``<lora:name:...>`` tag in ``lora_dir``; ``where``: the prompt it is in
        (``prompt`` or ``negative_prompt``), which the errors name."""
        said = "the negative prompt" if where == "negative_prompt" else "the prompt"
        if self.lora_dir is None:
            raise WeightsError(f"{said} asks for <lora:{name}:...> but no LoRA folder is set", where=where,
                               fix="set {@@lora_dir} to a folder holding NAME.safetensors")
        if not isinstance(self.lora_dir, (str, os.PathLike)):
            raise InputError(f"pipe.weights.lora_dir must be a folder path, got {type(self.lora_dir).__name__} "
                             f"{self.lora_dir!r:.40}", where="lora_dir", fix="set pipe.weights.lora_dir = 'loras/'")
        folder = Path(self.lora_dir)  # docs/checkpoints.md sets a str: it was a TypeError at the first tag
        root = folder.resolve()
        for cand in [folder / f"{name}{ext}" for ext in LORA_SUFFIXES] + [folder / name]:
            if not cand.resolve().is_relative_to(root):  # '../x' or '/abs/x' in a prompt: any file on the machine
                raise WeightsError(f"the LoRA name {name!r} leads out of the LoRA folder {folder}",
                                   where=f"<lora:{name}:...> in {said}",
                                   fix="name a LoRA file in the LoRA folder (or a folder in it), without '..' or a "
                                   "leading '/'")
            if cand.is_file():
                return cand
        parent = (folder / name).parent  # the suffix in another case (X.PT, Y.SafeTensors), as the server lists it
        stem = (folder / name).name
        if parent.is_dir():
            for p in sorted(parent.iterdir()):
                if p.stem == stem and p.suffix.lower() in LORA_SUFFIXES and p.is_file():
                    return p
        have = sorted(p.stem for p in folder.iterdir() if p.suffix.lower() in LORA_SUFFIXES)
        raise WeightsError(f"no LoRA named {name!r} in {folder}", where=f"<lora:{name}:...> in {said}",
                           fix=f"put {name}.safetensors there, or use one of: {', '.join(have[:12]) or 'none'}")

    def _merge(self, active: list[ActiveLora]) -> dict[str, dict[str, np.ndarray]]:
        from ..lora import Lora, merge

        out: dict[str, dict[str, np.ndarray]] = {}
        parts = self._parts()
        self._want_graph = None
        controls = fluxcontrollora.control_loras(active)
        if controls:  # BFL's Canny/Depth LoRA: the transformer takes 128 channels (sdrt.pipelines.fluxcontrollora)
            part = parts.get("transformer")
            plain = self._plain_graph or (part.path if part is not None else None)
            fluxcontrollora.check(self.pipe, part, plain, [(a.name, a.lora.control.why) for a in controls])
            self._want_graph = fluxcontrollora.widened_graph(plain)  # type: ignore[arg-type]
            for a in controls:
                if a.scale_for("transformer") == 0:  # diffusers' weight 0; ComfyUI's strength 0 drops the LoRA
                    log.warning(in_caller_words(
                        f"{a.name} is a Flux Control LoRA at scale 0: the model still runs as FLUX.1 Canny/Depth "
                        "(its 128-channel input, which needs a control image, and the LoRA's qk-norm scales), as "
                        "diffusers runs one at weight 0; leave the LoRA out to run Flux.1 dev"))
        if not active:
            return out
        graphs: dict[str, Graph] = {}  # per part, read once for every LoRA routed to it (a widened twin is loaded)

        def graph_of(part: str) -> Graph:
            if part not in graphs:
                graphs[part] = self._denoiser_graph(part)
            return graphs[part]

        routed: dict[str, list[tuple[Lora, float]]] = {}
        unrouted: list[str] = []
        for a in active:
            by_part: dict[str, dict] = {}
            for key, layer in a.lora.layers.items():
                target = _route(key)
                if target is not None and target not in parts:
                    target = next((t for t in _ROUTE_FALLBACK.get(target, ()) if t in parts), None)
                    if target == "text_encoder_2" and _graph_kind(parts[target].graph) != "t5":
                        target = None  # lora_te3_ is T5's; SDXL's text_encoder_2 is CLIP-G
                if target is None:
                    unrouted.append(f"{key} ({a.name})")
                    continue
                by_part.setdefault(target, {})[key] = layer
            for part, layers in by_part.items():
                sub = Lora(layers, a.lora.format, a.lora.source)
                if part == "transformer":  # Black Forest Labs' / Stability's fused layers, split as the graph has them
                    sub = transformer_lora(sub, graph_of(part))
                routed.setdefault(part, []).append((sub, a.scale_for(part)))
        if unrouted:
            fams = {f for a in active if (f := lora_family(a.lora.layers)) is not None}
            looks = f" (the file looks like a LoRA for {' / '.join(sorted(fams))})" if fams else ""
            raise WeightsError(f"{len(unrouted)} LoRA layers are for no part of this {self.pipe.family.label} "
                               f"model{looks}: " + ", ".join(unrouted[:8])
                               + (f", ... ({len(unrouted)} in all)" if len(unrouted) > 8 else ""),
                               where=", ".join(a.name for a in active),
                               fix=f"use a LoRA made for {self.pipe.family.label} (SD 1.x/2.x LoRAs have lora_unet_/lora_te_ "
                               "keys, SDXL's lora_te1_/lora_te2_, SD 3.x/Flux/Chroma's transformer. or "
                               "lora_unet_double_blocks_ keys)")
        for part, pairs in routed.items():
            graph = graph_of(part)
            base = self._weights(part, self.base.get(part, {}))
            padded: dict[str, np.ndarray] = {}
            if part == "transformer" and self._want_graph is not None:  # dev's img_in, zeros on the control inputs
                padded = fluxcontrollora.padded_input(graph, base, self._plain_part_graph())
                base = base.replaced(padded)
            targets = _targets(graph, [key for lora, _ in pairs for key in lora.layers], part)
            targets.update({k: v for lora, _ in pairs for k, v in getattr(lora, "targets", {}).items()})
            try:
                m = merge(base, pairs, graph=graph, targets=targets, strict=True, keep_originals=False)
            except WeightsError as exc:  # merge's fix speaks of merge's own arguments; a pipeline has none
                report = getattr(exc, "report", None)
                if report is None:
                    raise
                raise WeightsError(_lora_mismatch(report, pairs, self.pipe.family.label), where=exc.where,
                                   fix=f"use a LoRA made for {self.pipe.family.label}: each of its layers must "
                                   "match a weight of the model, in name and shape") from exc
            out[part] = {**padded, **{name: m[name] for name in m.merged_names}}
            if part == "transformer":
                for a in controls:
                    out[part].update(fluxcontrollora.extras(a.lora, a.scale_for(part), graph, base))
        return out

    def _plain_part_graph(self) -> Graph:
        """The transformer's own (64-input) graph."""
        from ..graph import Graph

        part = self._parts()["transformer"]
        if self._plain_graph is None or part.path == self._plain_graph:
            return part.graph
        return Graph.load(self._plain_graph, load_external=False)

    def _denoiser_graph(self, part: str) -> Graph:
        """The graph a part's LoRAs merge into: the transformer's 128-input twin while a control LoRA is asked."""
        if part == "transformer" and self._want_graph is not None:
            from ..graph import Graph

            current = self._parts()[part]
            return current.graph if current.path == self._want_graph else Graph.load(self._want_graph)
        return self._parts()[part].graph

    # -- embeddings -------------------------------------------------------------
    def add_embeddings(self, items: Iterable[str | os.PathLike[str] | Embedding]) -> list[Embedding]:
        """Load embeddings (A1111 ``.safetensors``); their trigger words work in prompts from now on."""
        from ..checkpoint import Embedding, load_embedding
        from ..checkpoint.embeddings import missing_half

        items = list(items)
        for i, e in enumerate(items):
            if not isinstance(e, (str, os.PathLike, Embedding)):
                raise InputError(f"an embedding must be a file path or an sdrt.checkpoint.Embedding, got "
                                 f"{type(e).__name__} {e!r:.40} (argument {i + 1})", where="add_embedding",
                                 fix="pass pipe.add_embedding('name.safetensors', ...); the file's stem is its "
                                 "trigger word")
        new = [e if isinstance(e, Embedding) else load_embedding(e) for e in items]
        names = {e.name.lower() for e in self.embeddings}
        # once each: diffusers' SDXL pair given as both its files is one embedding (either file reads the pair)
        new = [e for e in new if e.name.lower() not in names and not names.add(e.name.lower())]
        if not new:
            return []
        encoders = [n for n in ("text_encoder", "text_encoder_2") if n in self._parts()]
        keys = {_EMB_KEYS[n] for n in encoders}
        label = self.pipe.family.label
        for e in new:  # check widths first: nothing changes for an embedding of another family
            other = sorted(set(e.vectors) - keys)
            if other:  # an SDXL embedding (clip_l + clip_g) on SD 1.x would use its clip_l half silently
                raise WeightsError(
                    f"embedding {e.name!r} is made for a model with the text encoders "
                    + ", ".join(f"{k} {list(a.shape)}" for k, a in e.vectors.items())
                    + f", and this {label} model has only {', '.join(sorted(keys))}", where=e.source,
                    fix=f"use an embedding made for {label} (SD 1.x/2.x: emb_params [n, width]; SDXL: clip_l and "
                    "clip_g)")
            half = missing_half(e) if "text_encoder_2" in encoders else None
            if half is not None and _graph_kind(self._graph("text_encoder_2")) != "t5":  # SDXL's CLIP-G
                raise WeightsError(f"embedding {e.name!r} ({Path(e.source).name}) is the text_encoder half of diffusers' "
                                   f"SDXL textual inversion, and its text_encoder_2 half {half} is not beside it",
                                   where=str(Path(e.source).parent), fix="put the learned_embeds_2 file "
                                   "textual_inversion_sdxl.py saved with it beside it, or pass an SDXL embedding")
            for n in encoders:
                v = e.for_encoder(_EMB_KEYS[n])
                width = _table_width(self._graph(n))
                if v is None or v.shape[1] != width:
                    has = ", ".join(f"{k} {list(a.shape)}" for k, a in e.vectors.items())
                    raise WeightsError(
                        f"embedding {e.name!r} has no vectors for {n} ({_EMB_KEYS[n]}): it has {has}, made for "
                        f"another model family" if v is None else
                        f"embedding {e.name!r} does not fit {n}: it has {has}, the encoder's tokens are {width} wide",
                        where=e.source,
                        fix="use an embedding made for this model family (SD 1.x: emb_params [n, 768], "
                        "SD 2.x: [n, 1024], SDXL: clip_l [n, 768] and clip_g [n, 1280])")
        self.embeddings += new
        self._write_embeddings()
        self._apply(set(encoders))
        return new

    def _write_embeddings(self) -> None:
        from ..checkpoint import extend_table, reserve_rows, token_table

        prompts = self.pipe.prompts
        needed = sum(e.count for e in self.embeddings)
        for enc, name in zip(prompts.encoders, ("text_encoder", "text_encoder_2")):
            part = self._parts()[name]
            if name not in self._originals:
                self._originals[name] = part.graph
                self._vocab[name] = token_table(part.graph)[1][0]
            vocab = self._vocab[name]
            init, (rows, _), _ = token_table(part.graph)
            if rows - vocab < needed:  # room for more rows: the one recompile of this small graph
                part.close()
                part._graph = reserve_rows(self._originals[name], max(RESERVED_ROWS, 2 * needed))
                rows = token_table(part.graph)[1][0]
            base_table = self.base.get(name, {}).get(init)
            if isinstance(base_table, TensorRef):
                base_table = base_table.load()
            if base_table is None and part.default_weights is not None and init in part.default_weights:
                base_table = part.default_weights[init]  # a single file's table (the graph has no weights)
            if base_table is None:
                base_table = self._originals[name].initializer_arrays([init])[init]
            ids: dict[str, list[int]] = {}
            for e in self.embeddings:
                ids.update(enc.tokenizer.add_tokens(e.name, vectors=e.count))
            order = sorted(self.embeddings, key=lambda e: ids[e.name][0])
            if order and ids[order[0].name][0] != vocab:
                raise WeightsError(f"the tokenizer gives the first embedding id {ids[order[0].name][0]}, the "
                                   f"table has {vocab} rows", where=name,
                                   fix="use the tokenizer that belongs to this text encoder")
            table, _ = extend_table(np.asarray(base_table)[:vocab], order, _EMB_KEYS[name], capacity=rows,
                                    vocab=vocab)
            self.base.setdefault(name, {})[init] = table

    # -- binding ----------------------------------------------------------------
    def _apply(self, names: set[str], merged: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> None:
        if merged is None:
            merged = self._merge(self.loras)
        part = self._parts().get("transformer")
        if part is not None and "transformer" in names:  # a control LoRA's 128-input graph, or back to the model's
            if self._want_graph is not None:
                self._plain_graph = self._plain_graph or part.path
                part.retarget(self._want_graph)
            elif self._plain_graph is not None:
                part.retarget(self._plain_graph)
                self._plain_graph = None
        for name in sorted(names):
            overrides = {**self.base.get(name, {}), **merged.get(name, {})}
            self._bind(name, overrides, lora=bool(merged.get(name)))
        self.pipe._release(*names)  # low-memory mode: the graphs read for mapping are dropped again

    def infotext(self, texts: Iterable[str | None] | None = None) -> dict[str, object]:
        """A1111's PNG fields for what is loaded: ``Model``/``Model hash``, ``Lora hashes``, ``TI hashes`` (of the
        embeddings whose trigger word one of ``texts``, the run's prompts, holds; None: every one loaded)."""
        from ..checkpoint.embeddings import sha256_file

        info: dict[str, object] = {}
        if self.checkpoint is not None and self.checkpoint.path.is_file():
            info["Model hash"] = sha256_file(self.checkpoint.path)[:10]
            info["Model"] = self.checkpoint.path.stem
        vae = self.part_files.get("vae_decoder")
        if vae is not None and vae.is_file():
            info.update(vae_infotext(vae))
        if self.loras:
            info["Lora hashes"] = ", ".join(f"{a.name}: {lora_hash(a.path)}" for a in self.loras if a.path)
        if self.embeddings:  # A1111 names the embeddings its prompts used, not every one it loaded
            from ..text.tokenizer import mentions

            used = [e for e in self.embeddings if texts is None or any(mentions(t, e.name) for t in texts if t)]
            if used:
                info["TI hashes"] = ", ".join(f"{e.name}: {e.shorthash()}" for e in used)
        return info


def vae_infotext(path: Path) -> dict[str, object]:
    """A1111's ``VAE hash`` (the first 10 hex digits of the file's SHA-256, cached) and ``VAE`` (its file name)."""
    from ..checkpoint import model_hash

    return {"VAE hash": model_hash(path)[:10], "VAE": path.name}


def lora_hash(path: Path) -> str:
    """A1111's LoRA short hash, 12 digits: sha256 of a safetensors file after its header (the "addnet" hash), of
    the whole file for another format (a ``.pt``)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        if path.suffix.lower() == ".safetensors":
            n = int.from_bytes(f.read(8), "little")
            f.seek(8 + n)
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def _route(key: str) -> str | None:
    for part, (kohya, peft) in _LORA_ROUTES.items():
        if key.startswith(kohya) or key.startswith(peft):
            return part
    if key.startswith("lora_"):
        return None
    return "unet"  # a bare PEFT key (diffusers' unet-only files)


def _targets(graph: Graph, keys: Iterable[str], part: str) -> dict[str, str]:
    """``{LoRA module key: initializer}`` from the graph's own parameter map (kohya and PEFT names); a LyCORIS bias
    key (``<module>.diff_b`` / ``<module>.b_norm``) maps to the module's bias."""
    from ..checkpoint import param_map
    from ..lora import bias_module

    pmap = param_map(graph)
    index = {param: _module_names(pmap, param, part) for param in (".weight", ".bias")}
    # the route already chose the part (lora_te3_ is Flux's text_encoder_2): any kohya prefix names a module of it
    kohya = tuple(sorted({p for k, _ in _LORA_ROUTES.values() for p in k}, key=len, reverse=True))
    peft = _LORA_ROUTES["unet" if part == "transformer" else part][1]
    out: dict[str, str] = {}
    for key in keys:
        bmod = bias_module(key)
        modules, flat = index[".weight" if bmod is None else ".bias"]
        key_mod = key if bmod is None else bmod
        mod = None
        for p in kohya:
            if key_mod.startswith(p):
                rest = key_mod[len(p):]
                rest = rest.removeprefix("text_model_")
                mod = flat.get(rest)
                break
        else:
            rest = key_mod
            for p in (*peft, "base_model.model."):
                rest = rest.removeprefix(p)
            rest = re.sub(r"^text_model\.", "", rest)
            # ComfyUI saves UNet LoRAs in LDM's dotted names (diffusion_model.input_blocks.4.1...): the flat index has them
            mod = modules.get(rest) or (flat.get(rest.replace(".", "_")) if part == "unet" else None)
        if mod is not None:
            out[key] = mod
    return out


def _module_names(pmap: Mapping[str, Any], param: str, part: str) -> tuple[dict[str, str], dict[str, str]]:
    """``({dotted module: initializer}, {underscored module: initializer})`` of the graph's ``param`` tensors
    (``".weight"`` or ``".bias"``); a UNet's modules also under their LDM names."""
    modules = {c[: -len(param)]: s.init for c, s in pmap.items() if c.endswith(param)}
    flat = {m.replace(".", "_"): init for m, init in modules.items()}
    if part == "unet":  # kohya's SDXL LoRAs name UNet modules the LDM way (input_blocks_4_1_...)
        from ..checkpoint.ldm import unet_ldm_layout, unet_to_ldm

        lpb, attn_up = unet_ldm_layout(pmap)
        for m, init in modules.items():
            ldm_name = unet_to_ldm(m, lpb, attn_up)
            if ldm_name is not None:
                flat.setdefault(ldm_name.replace(".", "_"), init)
    return modules, flat


def lora_family(keys: Iterable[str]) -> str | None:
    """Which model family a LoRA's module keys are for, in words (for messages), or None when they do not say."""
    keys = list(keys)

    def has(*parts: str) -> bool:
        return any(p in k for k in keys for p in parts)

    if has("double_blocks", "single_blocks", "single_transformer_blocks"):
        return "Flux.1 / Chroma"
    if has("joint_blocks", "context_block"):
        return "SD 3.x"
    joined = " ".join(keys)
    unet = re.search(r"(down_blocks|up_blocks|mid_block|input_blocks|output_blocks|middle_block)", joined)
    if not unet and (has("add_q_proj", "add_k_proj", "ff_context", "norm1_context", "to_add_out")
                     or re.search(r"transformer_blocks[._]\d+[._]", joined)):
        # diffusers' MMDiT names (an SDXL UNet's transformer_blocks sit in down/mid/up blocks): SD 3.x has a
        # second attention (3.5 Medium's attn2), pos_embed and up to 38 blocks; Flux.1's double blocks are 19
        blocks = [int(b) for b in re.findall(r"(?<!single_)transformer_blocks[._](\d+)[._]", joined)]
        if has("pos_embed") or re.search(r"transformer_blocks[._]\d+[._]attn2[._]", joined) or max(blocks, default=0) >= 19:
            return "SD 3.x"
        if has("guidance_embedder", "x_embedder"):
            return "Flux.1 / Chroma"
        return "SD 3.x / Flux.1"
    if has("lora_te2_", "lora_te1_", "text_encoder_2.") or re.search(
            r"(transformer_blocks[._][1-9]|add_embedding|label_emb)", " ".join(keys)):
        return "SDXL"
    if has("down_blocks_0_attentions", "down_blocks.0.attentions", "input_blocks_1_1", "input_blocks.1.1",
           "lora_te_"):
        return "SD 1.x/2.x"
    return None


def _lora_mismatch(report: Any, pairs: Sequence[tuple[Lora, float]], label: str) -> str:
    """One line for a LoRA whose layers do not fit this model: what it looks like, how many fit, a few names."""
    keys = [k for lora, _ in pairs for k in lora.layers]
    files = ", ".join(dict.fromkeys(Path(lora.source).name for lora, _ in pairs))
    bad = [m.split(" (")[0] for m in report.unmatched] + [m.split(":")[0] for m in report.mismatched]
    fam = lora_family(keys)
    same = {"Flux.1 / Chroma": ("Flux", "Chroma"), "SD 3.x": ("SD 3",), "SD 3.x / Flux.1": ("SD 3", "Flux", "Chroma"),
            "SDXL": ("SDXL",), "SD 1.x/2.x": ("SD 1", "SD 2")}.get(fam or "", ())
    looks = f" looks like a LoRA for {fam}, and" if fam and not label.startswith(same) else ":"
    shown = ", ".join(bad[:3]) + (f", ... ({len(bad)} in all)" if len(bad) > 3 else "")
    return (f"{files}{looks} {len(bad)} of its {len(set(keys))} layers do not fit this {label} model "
            f"(no weight of that name and shape): {shown}")


def _graph_kind(graph: Graph) -> str:
    """``"t5"`` for a T5 encoder's graph, else ``"clip"``."""
    from ..checkpoint import param_map

    return "t5" if any(c.startswith("encoder.block.") for c in param_map(graph)) else "clip"


_TRANSFORMER_PEFT = ("base_model.model.", "model.diffusion_model.", "diffusion_model.", "transformer.", "unet.")
#: XLabs' Flux LoRAs (``double_blocks.0.processor.qkv_lora1.down.weight``): their modules in BFL's names, as diffusers'
#: ``_convert_xlabs_flux_lora_to_diffusers`` places them (1: the image stream, 2: the text stream)
_XLABS = re.compile(r"^(?:diffusion_model\.)?(?P<block>double|single)_blocks\.(?P<i>\d+)\.processor\."
                    r"(?P<what>qkv_lora|proj_lora)(?P<n>[12]?)$")
_XLABS_BFL = {("double", "qkv_lora", "1"): "double_blocks.{i}.img_attn.qkv",
              ("double", "qkv_lora", "2"): "double_blocks.{i}.txt_attn.qkv",
              ("double", "proj_lora", "1"): "double_blocks.{i}.img_attn.proj",
              ("double", "proj_lora", "2"): "double_blocks.{i}.txt_attn.proj",
              ("single", "proj_lora", ""): "single_blocks.{i}.linear2"}


def transformer_lora(lora: Lora, graph: Graph) -> Lora:
    """A LoRA for an SD 3.x / Flux / Chroma transformer with its layers in the graph's (diffusers') modules.

    Files name the modules three ways: diffusers' (``transformer.single_transformer_blocks.0.attn.to_q``,
    PEFT ``lora_A``/``lora_B``), Black Forest Labs' / Stability's as ComfyUI saves them
    (``diffusion_model.double_blocks.0.img_attn.qkv``), and kohya's (``lora_unet_double_blocks_0_img_attn_qkv``,
    ``lora_transformer_single_transformer_blocks_0_attn_to_q``). A publisher's fused layer becomes one layer per
    diffusers module, each with its rows of the up matrix (``flow.publisher_lora_modules``: q, k, v thirds of a
    ``qkv``, ``linear1`` at (d, d, d, 4d), the final adaLN's halves swapped), as diffusers'
    ``_convert_kohya_flux_lora_to_diffusers`` splits them. The result carries ``targets``
    (``{layer key: initializer}``) for ``merge``; a key it cannot place is kept, so ``merge`` names it."""
    from ..checkpoint import flow, param_map
    from ..lora import DeltaLayer, Lora, LoraLayer, bias_module

    pmap = param_map(graph)
    modules = {c[: -len(".weight")]: s.init for c, s in pmap.items() if c.endswith(".weight")}
    biases = {c[: -len(".bias")]: s.init for c, s in pmap.items() if c.endswith(".bias")}
    flat = {m.replace(".", "_"): m for m in {**modules, **biases}}

    def count(prefix: str) -> int:  # the index right after the prefix (Chroma's "distilled_guidance_layer.layers.N")
        return 1 + max((int(c[len(prefix):].split(".")[0]) for c in pmap if c.startswith(prefix)), default=-1)

    double, single = count("transformer_blocks."), count("single_transformer_blocks.")
    approx = count("distilled_guidance_layer.layers.")
    sd3 = "pos_embed.proj.weight" in pmap
    publisher = flow.publisher_module_names(0 if sd3 else double, single, double if sd3 else 0, approx)
    flat_publisher = {m.replace(".", "_"): m for m in publisher}
    inner_ref = pmap.get("x_embedder.bias") or pmap.get("context_embedder.bias")
    inner = int(inner_ref.shape[0]) if inner_ref is not None else 3072

    kept: dict[str, LoraLayer] = {}
    targets: dict[str, str] = {}
    fused: dict[str, LoraLayer] = {}
    fused_bias: dict[str, tuple[str, DeltaLayer]] = {}  # publisher module -> (key ending, LyCORIS diff_b / b_norm)
    for key, layer in lora.layers.items():
        bmod = bias_module(key) if isinstance(layer, DeltaLayer) else None
        if bmod is not None:  # LyCORIS's whole bias change: the module's bias, rows split as its weight's
            rest = _transformer_module(bmod, flat, flat_publisher)
            if rest is not None and rest in biases:
                kept[key] = layer
                targets[key] = biases[rest]
            elif rest is not None and rest in publisher:
                fused_bias[rest] = (key[len(bmod):], layer)
            else:
                kept[key] = layer
            continue
        x = _XLABS.match(key)
        if x and isinstance(layer, LoraLayer):  # XLabs: attention-only layers on BFL blocks, no alpha (scale 1)
            if x["block"] == "single" and x["what"] == "qkv_lora":  # q, k, v only (not linear1's MLP rows)
                for i, n in enumerate(("to_q", "to_k", "to_v")):
                    sub = f"{key}->{n}"
                    canon = f"single_transformer_blocks.{x['i']}.attn.{n}"
                    kept[sub] = LoraLayer(sub, layer.down, ldm_source_rows(layer.up, f"part:{i}/3"), layer.alpha)
                    if canon in modules:
                        targets[sub] = modules[canon]
                continue
            bfl = _XLABS_BFL.get((x["block"], x["what"], x["n"]))
            if bfl is not None:
                fused[bfl.format(i=x["i"])] = layer
                continue
        rest = _transformer_module(key, flat, flat_publisher)
        if rest is not None and rest in modules:
            kept[key] = layer
            targets[key] = modules[rest]
        elif rest is not None and rest in publisher:
            fused[rest] = layer
        else:
            kept[key] = layer
    if fused:
        whole = {m: v.delta(1.0) for m, v in fused.items() if not isinstance(v, LoraLayer)}  # LyCORIS
        sizes = {m: (int(v.up.shape[0]), int(v.down.shape[1])) if m not in whole else
                 (int(whole[m].shape[0]), int(whole[m].shape[1])) for m, v in fused.items()}
        split = flow.publisher_lora_modules(sizes, inner, double - 1 if sd3 else -1)
        for mod, layer in fused.items():
            if mod not in split:
                kept[mod] = layer
                continue
            dora = getattr(layer, "dora", None)
            if dora is not None and dora.axis(*sizes[mod]) != "out":  # a column's norm spans q, k and v
                raise WeightsError(f"{Path(lora.source).name}: layer {mod} is DoRA with a magnitude "
                                   f"{list(np.shape(dora.magnitude))} per input column of a fused weight, which "
                                   "cannot be split into the model's separate modules", where=lora.source,
                                   fix="use a DoRA LoRA saved with its magnitude per output row (LyCORIS's "
                                   "wd_on_out, its default), or merge it into the checkpoint elsewhere")
            for canon, op in split[mod]:
                key = f"{mod}->{canon}"
                part_dora = None
                if dora is not None:  # an output row's magnitude goes with the row
                    m = np.asarray(dora.magnitude)
                    rows = ldm_source_rows(m.reshape(-1, 1), op)  # [rows, 1], kept as [rows, 1(, 1, 1)] or [rows]
                    part_dora = replace(dora, magnitude=rows.reshape(-1, *m.shape[1:]) if m.ndim > 1 and m.shape[0] != 1
                                        else rows.reshape(-1))
                if mod in whole:
                    kept[key] = DeltaLayer(key, ldm_source_rows(whole[mod], op), layer.rank, part_dora)
                else:
                    kept[key] = replace(layer, key=key, up=ldm_source_rows(layer.up, op), dora=part_dora)
                if canon in modules:
                    targets[key] = modules[canon]
    if fused_bias:  # the same row ops as the module's weight (q, k, v thirds, linear1's (d, d, d, 4d), swapped halves)
        split = flow.publisher_lora_modules({m: (int(np.shape(b.diff)[0]), inner) for m, (_, b) in fused_bias.items()},
                                            inner, double - 1 if sd3 else -1)
        for mod, (end, layer) in fused_bias.items():
            if mod not in split:
                kept[mod + end] = layer
                continue
            for canon, op in split[mod]:
                key = f"{mod}->{canon}{end}"
                rows = ldm_source_rows(np.asarray(layer.diff).reshape(-1, 1), op).reshape(-1)
                kept[key] = DeltaLayer(key, rows)
                if canon in biases:
                    targets[key] = biases[canon]
    out = Lora(kept, lora.format, lora.source)
    out.targets = targets  # type: ignore[attr-defined]
    return out


def _transformer_module(key: str, flat: Mapping[str, str], flat_publisher: Mapping[str, str]) -> str | None:
    """The module a transformer LoRA key names: diffusers' (dotted, after a PEFT prefix) or, after a kohya /
    OneTrainer / LyCORIS prefix, diffusers' or the publisher's flattened (None when neither knows it)."""
    for p in ("lora_unet_", "lora_transformer_", "lycoris_"):  # kohya, OneTrainer, LyCORIS (SimpleTuner)
        if key.startswith(p):
            flat_name = key[len(p):]
            return flat.get(flat_name) or flat_publisher.get(flat_name)
    for p in _TRANSFORMER_PEFT:
        if key.startswith(p):
            return key[len(p):]
    return key


def ldm_source_rows(up: np.ndarray, op: str) -> np.ndarray:
    """The rows of a LoRA's up matrix that one diffusers module of a fused layer takes (``Source``'s ops)."""
    from ..checkpoint.ldm import Source

    return np.ascontiguousarray(Source("up", op).load(lambda _k: np.asarray(up)))


def _table_width(graph: Graph) -> int:
    from ..checkpoint import token_table

    return token_table(graph)[1][1]


def check_lora_list(loras: Any) -> list[tuple[Any, Any]]:
    """``loras`` as ``set_loras`` takes it (a list of ``(path or Lora, scale)`` pairs), or a one-line error."""
    from ..lora import Lora

    fix = "pass {@loras=}[('file.safetensors', 0.8), ...] (pairs of a path or an sdrt.lora.Lora and a scale), or [] for none"
    if isinstance(loras, (str, os.PathLike, Mapping)) or not isinstance(loras, Iterable):
        raise InputError(f"loras must be a list of (path, scale) pairs, got {type(loras).__name__} {loras!r:.40}",
                         where="loras", fix=fix)
    out = list(loras)
    for i, item in enumerate(out):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], (str, os.PathLike, Lora))):
            raise InputError(f"loras[{i}] must be a (path, scale) pair, got {type(item).__name__} {item!r:.40}",
                             where="loras", fix=fix)
    return [(a, b) for a, b in out]


def _rebinds_as_compiled(backend: str) -> bool:
    """Whether the backend named ``backend`` runs a rebound session as it runs a fresh compile
    (``Backend.rebinds_as_compiled``); an unknown name (not resolved yet) takes the safe answer, False."""
    from .parts import backend_trait

    return bool(backend_trait(backend, "rebinds_as_compiled", False))
