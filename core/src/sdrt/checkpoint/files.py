"""A model as people download it: one ``.safetensors`` file (plus separate encoder/VAE files), bound
onto sdrt's shipped weight-free graphs. No ONNX export is needed.

    model = open_single_file("dreamshaper_8.safetensors")
    model = open_single_file("flux1-dev.safetensors", ["clip_l.safetensors", "t5xxl_fp16.safetensors",
                                                       "ae.safetensors"])
    model.family                      # "sd1", "sdxl", "flux-dev", ...
    graph, weights = model.parts["unet"]
    session = sdrt.load(graph, weights=weights)

``open_single_file`` reads headers only (and, for SD 2.x, one small bias tensor), identifies what
each file holds from its tensor names and shapes (``families.identify``), assigns every part of
the family to the file that holds it (``extra_files`` fill or replace parts: which part each file
is comes from its tensors), and checks every part against its shipped graph before anything is
compiled: a file sdrt cannot run, a truncated file, a transformer-only file with no text
encoders given, a VAE of the wrong channel count, each raise one ``SdrtError`` naming the file,
what it looks like and what to pass.

Weights stay in the files as they are (fp32, fp16, bf16, fp8 e4m3fn): each initializer is a
``TensorRef`` that reads its tensor from the mmapped file and converts it to the graph's dtype
when a backend asks for it, one tensor at a time, so binding never holds a float32 copy of the
whole model.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..args import one_or_many
from ..errors import ModelError, ModelNotFoundError, SdrtError, WeightsError
from ..weights import Weights
from . import components, edm, families, flow, ldm
from .families import FAMILY_GRAPHS, LABELS, PART_KINDS, Identity
from .graphs import shipped_graph
from .hashing import model_hash
from .ldm import Source
from .single_file import Checkpoint, with_own_constants

log = logging.getLogger("sdrt.checkpoint.files")

PathLike = str | os.PathLike[str]
FP8 = ("float8_e4m3fn", "float8_e5m2")
#: SD 2.x v-prediction, as ComfyUI tells it from weights: this bias's spread (std > 0.09 -> v)
SD2_V_KEY = "model.diffusion_model.output_blocks.11.1.transformer_blocks.0.norm1.bias"
SD2_V_STD = 0.09


@dataclass
class OpenedModel:
    """A family, its release defaults, and each part's shipped graph with the weights bound to it."""

    family: str
    label: str
    prediction: str                         # "epsilon", "v_prediction" or "flow"
    release: dict[str, Any]                  # scheduler config, tokenizers, VAE scaling of the release
    parts: dict[str, tuple[Path, Weights]]   # part -> (shipped graph path, weights in its names)
    files: dict[str, Path]                   # part -> the file its weights come from
    path: Path                               # the main file
    #: part -> the types its file stores its tensors in ("bfloat16", "float8_e4m3fn"; "nf4"/"fp4": bitsandbytes 4-bit)
    dtypes: dict[str, set[str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """A1111's ``Model:`` value: the file's stem."""
        return self.path.stem

    @property
    def model_hash(self) -> str:
        """A1111's ``Model hash:``: the first 10 hex digits of the file's SHA-256 (cached)."""
        return model_hash(self.path)[:10]

    def scheduler_config(self) -> dict[str, Any]:
        return dict(self.release["scheduler"])

    def tokenizer_dirs(self) -> dict[str, Path]:
        """``{tokenizer: folder}`` of the release's tokenizers, as sdrt ships them (CLIP's and T5's), each ready
        for ``CLIPTokenizer.from_folder`` / ``T5Tokenizer.from_folder`` (``release_tokenizer``)."""
        return {k: release_tokenizer(v) for k, v in self.release["tokenizers"].items()}

    def require_dtypes(self, supported: Iterable[str], backend: str) -> None:
        """Raise before compiling when a part's file holds fp8 and the backend takes no fp8 (callers that
        keep weights in the file's dtype; sdrt's own binding converts per tensor to the graph's dtype)."""
        ok = set(supported)
        for part, dts in self.dtypes.items():
            bad = sorted(d for d in dts if d in FP8 and d not in ok)
            if bad:
                raise WeightsError(f"{self.files[part].name} ({part}) holds {', '.join(bad)} tensors and the "
                                   f"{backend} backend has no fp8",
                                   where=str(self.files[part]),
                                   fix="pass an fp16/bf16 version of this file, or let sdrt convert it "
                                       "(precision='fp16')")


def stored_type(ref: Any) -> str:
    """The type a tensor is stored as in its file: its dtype's name, or the bitsandbytes 4-bit type (``"nf4"``,
    ``"fp4"``) it is dequantized from."""
    return getattr(ref, "stored", None) or str(ref.dtype)


#: families whose release ships another's scheduler, tokenizers and VAE: FLUX.1-Fill-dev's and
#: FLUX.1-Canny/Depth-dev's scheduler_config.json and vae/config.json are FLUX.1-dev's
RELEASE_OF = {"flux-fill": "flux-dev", "flux-control": "flux-dev", "sdxl-ip2p": "sdxl"}


def release_defaults(family: str) -> dict[str, Any]:
    """The release's scheduler config, tokenizer folders and VAE scaling for ``family``."""
    data = json.loads((Path(str(resources.files("sdrt") / "data" / "release")) / "families.json").read_text())
    return data[RELEASE_OF.get(family, family)]


#: release tokenizer folders that hold only their settings take CLIP's vocabulary and merges
_CLIP_VOCAB = ("vocab.json.gz", "merges.txt.gz")


def _release_tokenizers() -> Path:
    return Path(str(resources.files("sdrt") / "data" / "release" / "tokenizers"))


def release_tokenizer(name: str) -> Path:
    """The folder of a shipped release tokenizer (``clip``, ``clip-pad-bang``, ``t5``), ready for ``from_folder``.

    ``clip-pad-bang`` (SD 2.x's and CLIP-G's: CLIP's vocabulary, padded with ``!``) ships only its settings;
    its folder is put together once in sdrt's cache, with CLIP's vocabulary beside them."""
    folder = _release_tokenizers() / name
    if not folder.is_dir():
        raise ModelNotFoundError(f"sdrt ships no tokenizer named {name!r}", where=str(folder), fix="reinstall sdrt")
    if not name.startswith("clip") or all((folder / f).is_file() for f in _CLIP_VOCAB):
        return folder
    import hashlib
    import shutil

    from ..cache import cache_dir

    vocab = _release_tokenizers() / "clip"
    files = sorted(folder.iterdir()) + [vocab / f for f in _CLIP_VOCAB]
    digest = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:16]
    out = cache_dir("tokenizers") / f"{name}-{digest}"
    if not out.is_dir():
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(f, tmp / f.name)
            os.replace(tmp, out)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not out.is_dir():
                raise ModelError(f"cannot write the {name} tokenizer into the cache ({exc})", where=str(out),
                                 fix="check free space and permissions of the cache folder ($SDRT_CACHE_DIR)") from exc
    return out


# -- reading files ---------------------------------------------------------------------------------
@dataclass
class _File:
    path: Path
    weights: Weights
    shapes: dict[str, tuple[int, ...]]
    ident: Identity


def open_weights(path: PathLike, what: str, folder_fix: str, folder_what: str = ".safetensors file") -> Weights:
    """A weights file's ``Weights`` (headers only), or one ``SdrtError`` naming the file: a folder given for a
    file (``folder_fix`` says what to do), a file that cannot be opened (truncated, not safetensors/GGUF)."""
    p = Path(path)
    if p.is_dir():
        raise ModelError(f"a folder was given where a {folder_what} was expected", where=str(p), fix=folder_fix)
    try:
        return Weights.open(p)
    except SdrtError as exc:
        if exc.what.startswith(f"{p.name} is "):  # the reader named the file and what it is (a YOLO .pt)
            raise type(exc)(exc.what, where=str(p), fix=open_fix(p, exc)) from exc
        raise type(exc)(f"cannot open the {what} {p.name}: {exc.what}", where=str(p), fix=open_fix(p, exc)) from exc


def open_fix(path: Path, exc: SdrtError, vae: bool = False) -> str:
    """What to do about a weights file ``Weights.open`` refused: for an .onnx graph, what to pass instead (a
    .safetensors file; for a VAE, or the model folder's own VAE); else the reader's own advice, which knows the
    format (a truncated .gguf, a pickle to convert), or a re-download of a file of that suffix."""
    if path.suffix.lower() == ".onnx":
        if vae:
            return ("pass a VAE .safetensors file (e.g. vae/diffusion_pytorch_model.safetensors), or leave {@vae} out "
                    "to use the model folder's own VAE")
        return "pass a .safetensors or .gguf weights file; an .onnx graph is a model, passed as the model"
    return exc.fix or f"re-download the {path.suffix or 'weights'} file (it may be truncated)"


def _open(path: PathLike, what: str, family: str | None = None) -> _File:
    w = open_weights(path, what, "pass the folder to pipelines.load (a diffusers/Optimum folder), or one file here")
    shapes = w.shapes()
    return _File(Path(path), w, shapes, families.identify(shapes, family, gguf_arch(w)))


def gguf_arch(weights: Weights) -> str | None:
    """A GGUF file's ``general.architecture`` (None for other files)."""
    arch = (getattr(weights, "metadata", None) or {}).get("general.architecture")
    return arch if isinstance(arch, str) else None


def is_t5_file(path: PathLike) -> bool:
    """Whether a text-encoder file's tensors (headers only) are a T5-XXL encoder's."""
    try:
        w = Weights.open(path)
        return families.identify(w.shapes(), arch=gguf_arch(w)).kind == "t5xxl"
    except (SdrtError, OSError):
        return False  # an unreadable file is named by the code that binds it


def runs_elsewhere(label: str) -> bool:
    """Whether a foreign file's label says where sdrt runs it instead (an upscaler, an IP-Adapter, a T2I-Adapter)."""
    return "(not an image generator: pass it" in label or label.endswith(", not as one)")


def unrunnable(name: str, ident: Identity) -> str:
    """The one line for a file of a family sdrt does not run (``Identity.foreign``), or runs elsewhere (an upscaler
    or an adapter, whose label says where it goes: not "which sdrt does not run" after "pass it as ...")."""
    if runs_elsewhere(ident.label):
        return f"{name} is {ident.label}, not a model"
    return f"{name} is {ident.label}, which sdrt does not run"


def _fit_text_encoder(f: _File, fam: str, graph_paths: Mapping[str, PathLike]) -> tuple[_File, list[str]]:
    """A text-encoder file that is no release width (a reduced or test model), given with ``family=``: the
    family's text-encoder parts on ``graph_paths`` whose graph it binds onto, every initializer, and the file
    seen as that kind. A T5 tower (``encoder.block.*``) is tried on the T5 parts, a CLIP tower on the CLIP parts."""
    from ..graph import Graph

    keys = list(f.shapes)
    t5 = any(k.startswith("encoder.block.0.layer.0.SelfAttention.") for k in keys)
    clip = any(k.startswith(("text_model.encoder.layers.", "encoder.layers.", "transformer.resblocks."))
               for k in keys)
    graphs = FAMILY_GRAPHS[fam]
    fits: list[str] = []
    for part, g in graphs.items():
        kind = graph_kind(g)
        if not part.startswith("text_encoder") or part not in graph_paths or not (
                (kind == "t5xxl" and t5) or (kind in ("clip_l", "clip_g", "openclip_h") and clip)):
            continue
        ident = Identity(None, kind, PART_KINDS[kind], {"text_encoder": ""})
        g_file = _File(f.path, f.weights, f.shapes, ident)
        srcs, _ = _sources(g_file, "text_encoder", "", fam)
        try:
            Checkpoint(f.weights, {part: srcs}, ident.label, f.path).lazy({part: Graph.load(graph_paths[part])})
        except WeightsError:
            continue
        fits.append(part)
    if not fits:
        raise ModelError(f"{f.path.name} is not a text encoder of {LABELS[fam]}'s release widths, and it fits none "
                         f"of the text-encoder graphs given in graph_paths: it looks like {f.ident.label}",
                         where=str(f.path), fix="pass the text-encoder files that belong to these graphs (the same "
                         "architecture and widths), or leave family unset for release files")
    if len(fits) > 1:
        raise ModelError(f"{f.path.name} binds onto the graphs of {' and '.join(fits)} alike, so which text encoder "
                         "it is cannot be told", where=str(f.path),
                         fix="pass text-encoder graphs of different widths, or release files with family unset")
    kind = graph_kind(graphs[fits[0]])
    return _File(f.path, f.weights, f.shapes, Identity(None, kind, PART_KINDS[kind], {"text_encoder": ""})), fits


def _supported() -> str:
    return ", ".join(LABELS[f] for f in ("sd1", "sd2", "sdxl", "sdxl-refiner", "sd3-medium", "sd35-medium", "sd35-large",
                                         "flux-dev", "flux-schnell", "flux-fill", "flux-control", "chroma"))


def _sources(f: _File, comp: str, prefix: str, family: str | None) -> tuple[dict[str, Source], list[str]]:
    """``({canonical: Source}, unknown keys)`` for one component of a file."""
    keys = [k for k in f.shapes if k.startswith(prefix)]
    if comp in ("unet", "transformer") and f.ident.layout == "diffusers":  # the graphs' own names
        return {k: Source(k) for k in keys}, []
    if comp == "transformer":
        return (flow.convert_sd3 if family and family.startswith("sd3") else flow.convert_flux)(
            {k: f.shapes[k] for k in keys})
    if comp == "unet":
        return ldm.convert_unet(keys)
    if comp == "vae":
        return components.convert_vae_any(f.shapes, prefix)
    # text encoders
    if "t5xxl" in prefix or f.ident.kind == "t5xxl":
        return components.convert_t5(keys, prefix)
    return components.convert_clip(keys, prefix)


def _part_kind(f: _File, comp: str, prefix: str) -> str:
    """The kind (``clip_l``, ``t5xxl``, ``vae16``...) of one component of a checkpoint file."""
    if comp == "vae":
        ch = components.vae_latent_channels(f.shapes, prefix)
        return {4: "vae4", 16: "vae16"}.get(ch or 0, f"vae{ch}")
    if "t5xxl" in prefix:
        return "t5xxl"
    return families.clip_kind(f.shapes, prefix) or "unknown"


def graph_kind(graph_name: str) -> str:
    """The file kind (``clip_l``, ``t5xxl``, ``vae4``, ``vae16``...) a shipped graph of this name takes."""
    return {"clip_l_proj": "clip_l", "vae4_decoder": "vae4", "vae4_encoder": "vae4", "vae16_decoder": "vae16",
            "vae16_encoder": "vae16"}.get(graph_name, graph_name)


#: an x0-prediction UNet's name (SDXL-Lightning's ``sdxl_lightning_1step_unet_x0.safetensors``): its tensors are
#: those of any UNet of its family, so only its name tells it, as ByteDance and diffusers' docs name it
_X0_NAME = re.compile(r"(?:^|[_.-])x0(?:$|[_.-])", re.IGNORECASE)
#: how diffusers runs an x0 UNet, as ByteDance's model card does: EulerDiscreteScheduler(timestep_spacing="trailing",
#: prediction_type="sample") (a few-step distilled model: leading spacing's one step would be at t = 1)
X0_SCHEDULER = {"prediction_type": "sample", "timestep_spacing": "trailing"}
#: the predictions a model file or ``prediction=`` may say (diffusers' ``prediction_type`` names)
PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


def name_prediction(path: Path) -> str | None:
    """``"sample"`` (x0) when the file's name says ``x0`` as a word (``..._unet_x0.safetensors``), else None."""
    if _X0_NAME.search(Path(path).stem):
        # a guess from a name, so said where a user sees it (warning): a file merely named so would sample wrong
        log.warning("%s: sampled as x0-prediction with trailing timesteps, because its name says x0 (as "
                    "SDXL-Lightning's 1-step UNet); if it is an eps or v model, set its prediction (epsilon or "
                    "v_prediction)", Path(path).name)
        return "sample"
    return None


def yaml_prediction(path: Path) -> str | None:
    """What A1111's ``<stem>.yaml`` beside a checkpoint says: ``"v_prediction"`` for ``parameterization: "v"`` (LDM's
    configs) or an SGM ``VScaling`` denoiser (SDXL's), else ``"epsilon"``; None without a yaml."""
    yaml = path.with_suffix(".yaml")
    if not yaml.is_file():
        return None
    try:
        text = yaml.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    v = (re.search(r"parameterization\s*:\s*[\"']?v[\"']?\s*(#.*)?$", text, re.M) is not None
         or re.search(r"denoiser_scaling\.VScaling", text) is not None)
    log.info("%s: %s-prediction from %s", path.name, "v" if v else "eps", yaml.name)
    return "v_prediction" if v else "epsilon"


def sd2_prediction(path: Path, weights: Weights, prefix: str = "model.diffusion_model.", diffusers: bool = False) -> str:
    """``"v_prediction"`` or ``"epsilon"`` for an SD 2.x file: A1111's ``<stem>.yaml`` beside it when
    present (``parameterization: "v"``), else ComfyUI's test on the weights (the spread of the last
    transformer's first norm bias: std > 0.09 is v)."""
    from_yaml = yaml_prediction(path)
    if from_yaml is not None:
        return from_yaml
    key = SD2_V_KEY.replace("model.diffusion_model.", prefix)
    if diffusers:  # the same tensor in a diffusers UNet: output_blocks.11.1 is the last up block's third attention
        key = prefix + "up_blocks.3.attentions.2.transformer_blocks.0.norm1.bias"
    if key not in weights:
        return "epsilon"
    std = float(np.asarray(weights[key], dtype=np.float32).std())
    log.info("%s: %s-prediction (std of %s = %.3f; > %.2f is v)", path.name, "v" if std > SD2_V_STD else "eps",
             key, std, SD2_V_STD)
    return "v_prediction" if std > SD2_V_STD else "epsilon"


# -- the API ---------------------------------------------------------------------------------------
def open_single_file(path: PathLike, extra_files: Iterable[PathLike] = (), *, prediction: str | None = None,
                     parts: Iterable[str] | None = None, graph_paths: Mapping[str, PathLike] | None = None,
                     family: str | None = None) -> OpenedModel:
    """Open a single-file checkpoint (and separate text-encoder/VAE files) onto sdrt's shipped graphs.

    ``extra_files``: ``clip_l.safetensors``, ``clip_g.safetensors``, ``t5xxl_fp16.safetensors``,
    ``ae.safetensors``, ``sdxl_vae.safetensors``...: each fills (or replaces) the part its tensors say
    it is. ``prediction``: ``"epsilon"``, ``"v_prediction"`` or ``"sample"`` (x0, run with trailing timesteps as
    ``X0_SCHEDULER``) to override what the file implies (SD 2.x 768 vs 512, SDXL v-pred finetunes; a name with
    ``x0`` as a word, SDXL-Lightning's ``sdxl_lightning_1step_unet_x0.safetensors``, says ``"sample"``). ``parts``: bind only these parts (default: every part
    of the family; ``vae_encoder`` is bound when the VAE is there). ``graph_paths``: ``{part: .onnx}``
    to bind onto other graphs than the shipped ones (an export of your own with the same names).
    ``family``: a ``FAMILY_GRAPHS`` key (``"flux-dev"``, ``"sd35-medium"``, ``"chroma"``...) for a model at other
    widths than its release (a reduced or test model) bound onto ``graph_paths``: the file's keys must still say
    that family, and text-encoder files of other widths are matched to the parts whose graphs they bind onto.
    Raises ``SdrtError`` (before anything is compiled) for anything that cannot run.
    """
    if family is not None and family not in FAMILY_GRAPHS:
        raise ModelError(f"unknown family {family!r}", where="family",
                         fix=f"use one of {', '.join(FAMILY_GRAPHS)}, or leave it unset (sdrt reads it from the file)")
    extra_files = one_or_many(extra_files)  # one file, not the letters of its name
    main = _open(path, "checkpoint", family)
    if family is not None and main.ident.family != family and main.ident.kind not in PART_KINDS:
        raise ModelError(f"{main.path.name} is not {LABELS[family]}: it looks like {main.ident.label}",
                         where=str(main.path),
                         fix="leave family unset (sdrt reads it from the file's tensors), or pass a "
                             f"{LABELS[family]} file")
    if main.ident.family is None:
        if main.ident.kind in PART_KINDS:
            raise ModelError(f"{main.path.name} is {main.ident.label}, not a model", where=str(main.path),
                             fix="pass the checkpoint (UNet or transformer) as the model, and this file with "
                                 f"{'{@vae}' if main.ident.kind.startswith('vae') else '{@text_encoders}'}")
        if main.ident.foreign:
            raise ModelError(unrunnable(main.path.name, main.ident), where=str(main.path),
                             fix=f"sdrt runs {_supported()}: pass a checkpoint of one of those")
        raise ModelError(f"{main.path.name} is not a model sdrt can run: it looks like {main.ident.label}",
                         where=str(main.path), fix=f"pass a checkpoint of one of: {_supported()}")
    fam = main.ident.family
    graphs = FAMILY_GRAPHS[fam]
    wanted = list(parts) if parts is not None else list(graphs)
    # part -> (file, component prefix)
    chosen: dict[str, tuple[_File, str, str]] = {}
    for comp, prefix in main.ident.components.items():
        if comp == "vae":
            for part in ("vae_decoder", "vae_encoder"):
                chosen[part] = (main, "vae", prefix)
        else:
            chosen[comp] = (main, comp, prefix)
    for extra in extra_files:
        ef = _open(extra, "file")
        if family is not None and ef.ident.kind == "unknown" and graph_paths:
            ef, fits = _fit_text_encoder(ef, fam, graph_paths)
            for part in fits:
                chosen[part] = (ef, part, "")
            continue
        kind = ef.ident.kind
        if ef.ident.foreign:
            raise ModelError(unrunnable(ef.path.name, ef.ident), where=str(ef.path),
                             fix=f"{LABELS[fam]} takes " + ", ".join(dict.fromkeys(
                                 PART_KINDS[graph_kind(g)] for p, g in graphs.items() if p.startswith(("text", "vae")))))
        if kind not in PART_KINDS:
            raise ModelError(f"{ef.path.name} is not a text encoder or VAE: it looks like {ef.ident.label}",
                             where=str(ef.path), fix="pass CLIP-L/CLIP-G/T5-XXL text encoders with {@text_encoders} "
                             "and VAEs with {@vae}")
        targets = [p for p, g in graphs.items() if graph_kind(g) == kind]
        if not targets:
            need = sorted({PART_KINDS[graph_kind(g)] for p, g in graphs.items() if not p.startswith("unet")
                           and p != "transformer"})
            if kind.startswith("vae"):
                raise ModelError(f"{ef.path.name} is {PART_KINDS[kind]}, and {LABELS[fam]} needs "
                                 f"{PART_KINDS['vae16' if families.FAMILY_LATENT_CHANNELS[fam] == 16 else 'vae4']}",
                                 where=str(ef.path), fix="pass the VAE that belongs to this model family")
            raise ModelError(f"{ef.path.name} is {PART_KINDS[kind]}, which {LABELS[fam]} does not use",
                             where=str(ef.path), fix=f"{LABELS[fam]} takes: {', '.join(need)}")
        comp = next(iter(ef.ident.components))
        for part in targets:
            chosen[part] = (ef, "vae" if kind.startswith("vae") else part, ef.ident.components[comp])
    # check kinds of baked parts against the family (a 4-channel VAE in a Flux file, ...)
    for part, (f, comp, prefix) in chosen.items():
        if part not in graphs:
            continue
        kind = _part_kind(f, comp, prefix) if f is main and comp != "transformer" and comp != "unet" else None
        if kind in PART_KINDS and kind != graph_kind(graphs[part]):
            raise ModelError(f"{f.path.name} holds {PART_KINDS.get(kind, kind)} as its {part}, and {LABELS[fam]} "
                             f"needs {PART_KINDS[graph_kind(graphs[part])]}", where=str(f.path),
                             fix="pass the right part with {@vae}" if part.startswith("vae") else
                             "pass the right part with {@text_encoders}")
    missing = [p for p in wanted if p not in chosen and p != "vae_encoder"]
    if fam.startswith("sd3") and "text_encoder_3" in missing:  # SD 3 without T5 (sd3_medium_incl_clips): zeros
        missing.remove("text_encoder_3")  # in its place, as diffusers' text_encoder_3=None; the pipeline warns
    if missing:
        kinds = [PART_KINDS[graph_kind(graphs[p])] for p in missing]
        raise ModelError(f"{main.path.name} is {main.ident.label}; {LABELS[fam]} also needs {', '.join(kinds)}, "
                         "and no file given holds them", where=str(main.path), fix=_missing_fix(fam, missing))
    if prediction is None:
        if fam in ("sdxl", "sdxl-ip2p") and (key := edm.edm_key(main.shapes)) is not None:  # Playground v2.5: eps; CosXL: v
            prediction = "epsilon" if key == "edm_mean" else "v_prediction"
        elif not fam.startswith(("sd3", "flux", "chroma")) and (from_name := name_prediction(main.path)) is not None:
            prediction = from_name
        elif fam == "sd2":
            prediction = sd2_prediction(main.path, main.weights, main.ident.components["unet"],
                                        diffusers=main.ident.layout == "diffusers")
        # A1111 reads a v-prediction SD 1.x/SDXL finetune's yaml too. An SD 2.x inpainting file without one is eps
        # (Stability's v2-inpainting-inference.yaml), as A1111 (config_sd2_inpainting for every 9-channel SD 2.x
        # file) and diffusers (inpainting_v2) read it: no bias test
        elif fam.startswith(("sd1", "sdxl", "sd2-inpaint")) and (from_yaml := yaml_prediction(main.path)) is not None:
            prediction = from_yaml
        elif fam.startswith("sdxl") and "v_pred" in main.shapes:
            prediction = "v_prediction"
        elif fam.startswith(("sd3", "flux", "chroma")):
            prediction = "flow"
        else:
            prediction = "epsilon"
    elif prediction not in (*PREDICTION_TYPES, "flow"):
        raise ModelError(f"unknown prediction {prediction!r}", where="open_single_file(prediction=...)",
                         fix="use 'epsilon', 'v_prediction' or 'sample'")
    elif prediction in PREDICTION_TYPES and fam.startswith(("sd3", "flux", "chroma")):
        raise ModelError(f"{LABELS[fam]} is a flow-matching model: prediction {prediction!r} does not apply",
                         where="prediction", fix="leave prediction unset for this model")
    release = release_defaults(fam)
    if fam in ("sdxl", "sdxl-ip2p") and (with_edm := edm.edm_release(release, main.weights, main.path)) is not None:
        # EDM-trained (Playground v2.5, CosXL): its scheduler (and latent normalization) from its keys
        if prediction not in ("epsilon", "v_prediction"):  # EDM's preconditioning is for eps or v outputs
            raise ModelError(f"{main.path.name} is {with_edm['edm_label']}: prediction {prediction!r} does not apply "
                             "to its EDM sampling", where="prediction", fix="use 'epsilon' or 'v_prediction', or "
                             "leave prediction unset (its keys say which)")
        log.info("%s: %s: %s", main.path.name, with_edm["edm_label"], with_edm["scheduler"]["_class_name"])
        release = {**with_edm, "scheduler": {**with_edm["scheduler"], "prediction_type": prediction}}
    elif fam == "sd2" and prediction == "epsilon":
        release = {**release, "scheduler": release["scheduler_eps"], "sample_size": release["sample_size_eps"]}
    elif prediction == "v_prediction" and release["scheduler"].get("prediction_type") != "v_prediction":
        release = {**release, "scheduler": {**release["scheduler"], "prediction_type": "v_prediction"}}
    elif prediction == "sample":
        release = {**release, "scheduler": {**release["scheduler"], **X0_SCHEDULER}}
    if "ztsnr" in main.shapes and "scheduler" in release:  # zero terminal SNR (NoobAI-XL v-pred), as A1111/ComfyUI read it
        log.info("%s: zero terminal SNR (its ztsnr key): rescaled betas", main.path.name)
        release = {**release, "scheduler": {**release["scheduler"], "rescale_betas_zero_snr": True}}
    bound: dict[str, tuple[Path, Weights]] = {}
    files: dict[str, Path] = {}
    dtypes: dict[str, set[str]] = {}
    from ..graph import Graph

    problems: list[str] = []
    for part in wanted:
        if part not in chosen:
            continue  # vae_encoder without a VAE
        f, comp, prefix = chosen[part]
        srcs, unknown = _sources(f, comp, prefix, fam)
        if unknown:
            log.warning("%s: %d %s keys not used: %s", f.path.name, len(unknown), part, ", ".join(unknown[:5]))
        gpath = Path(graph_paths[part]) if graph_paths and part in graph_paths else shipped_graph(graphs[part])
        graph = Graph.load(gpath)
        ck = Checkpoint(f.weights, {comp: srcs}, f.ident.label, f.path)
        try:
            refs = ck.lazy({part: graph})
        except WeightsError as exc:  # Checkpoint.plan speaks of "this model"; here it is the shipped graph
            problems.append(exc.what.split("first mismatches: ", 1)[-1])
            continue
        (only,) = refs.values()
        bound[part] = (gpath, with_own_constants(graph, only, f.path))
        files[part] = f.path
        dtypes[part] = {stored_type(f.weights.ref(s.key)) for s in srcs.values()}
    if problems:
        listed = "; ".join(problems)
        if len(listed) > 1200:
            listed = listed[:1200].rsplit("; ", 1)[0] + "; ..."
        raise WeightsError(f"{main.path.name} has {LABELS[fam]}'s tensor names, but does not fit the {LABELS[fam]} "
                           f"architecture sdrt ships (its release's): {listed}", where=str(main.path),
                           fix="a pruned, distilled or resized variant (BK-SDM, small-sd, ...) runs from an ONNX "
                               "export of its own (optimum-cli export onnx); otherwise check the file loads in "
                               "diffusers or ComfyUI (it may be damaged)")
    log.info("%s: %s (%s), parts %s", main.path.name, LABELS[fam], prediction, ", ".join(bound))
    return OpenedModel(fam, main.ident.label, prediction, release, bound, files, main.path, dtypes)


def part_file_refs(path: PathLike, graphs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A separate VAE or text-encoder file bound onto ``graphs`` (``{part: Graph}``, e.g. an ONNX folder's
    ``vae_decoder`` and ``vae_encoder``): ``{part: {initializer: TensorRef}}``, every part checked first
    (``WeightsError`` naming the first mismatches). Which kind the file is comes from its tensors."""
    f = _open(path, "file")
    kind = f.ident.kind
    if f.ident.foreign:
        raise ModelError(unrunnable(f.path.name, f.ident), where=str(f.path),
                         fix="pass a CLIP-L/CLIP-G/T5-XXL text encoder or a VAE file")
    if kind not in PART_KINDS:
        raise ModelError(f"{f.path.name} is not a text encoder or VAE: it looks like {f.ident.label}",
                         where=str(f.path), fix="pass a CLIP-L/CLIP-G/T5-XXL text encoder or a VAE file")
    comp = "vae" if kind.startswith("vae") else "text_encoder"
    srcs, unknown = _sources(f, comp, next(iter(f.ident.components.values())), None)
    if unknown:
        log.warning("%s: %d keys not used: %s", f.path.name, len(unknown), ", ".join(unknown[:5]))
    comps = {"vae": srcs} if comp == "vae" else {part: srcs for part in graphs}
    return Checkpoint(f.weights, comps, f.ident.label, f.path).lazy(graphs)


def _missing_fix(fam: str, missing: list[str]) -> str:
    """What to pass for the parts a file lacks, with the usual file names, its arguments as ``{@text_encoders}`` and
    ``{@vae}``: each caller reads its own (``--text-encoder`` on the command line, ``text_encoders`` in
    ``pipelines.load``, a request's field in sdrt serve)."""
    names = {"clip_l": "clip_l.safetensors", "clip_l_proj": "clip_l.safetensors", "clip_g": "clip_g.safetensors",
             "t5xxl": "t5xxl_fp16.safetensors", "openclip_h": "sd2_text_encoder.safetensors",
             "vae4_decoder": "sdxl_vae.safetensors" if fam.startswith("sdxl") else "vae-ft-mse-840000.safetensors",
             "vae16_decoder": "ae.safetensors" if fam.startswith(("flux", "chroma")) else "sd3_vae.safetensors"}
    files = {p: names.get(FAMILY_GRAPHS[fam][p], FAMILY_GRAPHS[fam][p]) for p in missing}
    texts = list(dict.fromkeys(f for p, f in files.items() if not p.startswith("vae")))
    vaes = list(dict.fromkeys(f for p, f in files.items() if p.startswith("vae")))
    said = []
    if len(texts) > 1:
        said.append(f"the text encoders with {{@text_encoders}} (one file each: {', '.join(texts)})")
    elif texts:
        said.append(f"the text encoder with {{@text_encoders}} ({texts[0]})")
    if vaes:
        said.append(f"the VAE with {{@vae}} ({vaes[0]})")
    return "pass " + " and ".join(said)


def open_parts(path: PathLike, extra_files: Iterable[PathLike] = (), **kw: Any) -> tuple[str, Mapping[str, tuple[
        Path, Weights]]]:
    """``(family, {part: (shipped graph path, Weights)})``: the short form of ``open_single_file``."""
    m = open_single_file(path, extra_files, **kw)
    return m.family, m.parts
