"""ControlNet files as people download them, bound onto sdrt's shipped weight-free ControlNet graphs.

Two layouts are in circulation:

- **LDM** (lllyasviel's ``control_v11p_sd15_canny.safetensors`` and the other v1.1 files, and the
  ControlNet 1.0 files, which hold the ControlNet under ``control_model.``): the UNet encoder in the
  LDM names (``input_blocks``, ``middle_block``, ``time_embed``, SDXL's ``label_emb``), plus
  ``input_hint_block.{0,2,...}`` (the conditioning embedding: its convolutions at the even indices,
  SiLUs between), ``zero_convs.N.0`` (one 1x1 convolution per down residual) and ``middle_block_out.0``;
- **diffusers** (``diffusion_pytorch_model.safetensors`` of ``ControlNetModel``, e.g.
  ``diffusers/controlnet-canny-sdxl-1.0``): the state-dict names already, ``controlnet_cond_embedding.*``,
  ``controlnet_down_blocks.N``, ``controlnet_mid_block``.

Both become diffusers' ``ControlNetModel`` names (``ldm.convert_unet`` converts the UNet encoder, the
control-specific keys are mapped here, as diffusers' ``convert_controlnet_checkpoint`` and ComfyUI's
``load_controlnet`` do), and each tensor is a lazy ``TensorRef`` read and converted when a backend asks
for it (fp16 files stay fp16 on disk). Which base a file is made for (SD 1.x, SD 2.x, SDXL) comes from its
shapes: the text width its cross-attention reads (768, 1024, 2048) and SDXL's added embedding.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError, SdrtError, WeightsError
from ..weights import Weights, folder_files
from . import ldm
from .files import open_weights
from .fluxcontrolnet import FluxNetLayout
from .graphs import shipped_graph
from .ldm import Source
from .sd3controlnet import SD3NetLayout
from .single_file import with_own_constants

log = logging.getLogger("sdrt.checkpoint.controlnet")

PathLike = str | os.PathLike[str]
#: the prefix of a ControlNet inside an LDM file (ControlNet 1.0, and some re-saved 1.1 files)
LDM_PREFIX = "control_model."
#: base family -> its shipped weight-free ControlNet graph
CONTROLNET_GRAPHS = {"sd1": "sd1_controlnet", "sdxl": "sdxl_controlnet"}
#: base family -> its shipped UNet graph that takes ControlNet residuals (``down_block_additional_residual_0..N``,
#: ``mid_block_additional_residual``): a single-file checkpoint's UNet binds onto it (``open_single_file(...,
#: graph_paths={"unet": shipped_graph(...)})``) when ControlNets are used
CONTROLNET_UNET_GRAPHS = {"sd1": "sd1_unet_controlnet", "sdxl": "sdxl_unet_controlnet"}
BASE_LABELS = {"sd1": "SD 1.x", "sd2": "SD 2.x", "sdxl": "SDXL", "flux": "Flux.1", "sd3": "SD3"}
#: what to pass, by base, in messages
EXAMPLES = {"sd1": "control_v11p_sd15_canny.safetensors", "sdxl": "diffusers/controlnet-canny-sdxl-1.0's "
            "diffusion_pytorch_model.safetensors", "sd2": "an SD 2.x ControlNet",
            "flux": "InstantX/FLUX.1-dev-Controlnet-Canny's diffusion_pytorch_model.safetensors",
            "sd3": "a diffusers SD3ControlNetModel's diffusion_pytorch_model.safetensors"}
_CONTEXT = {768: "sd1", 1024: "sd2", 2048: "sdxl"}


@dataclass(frozen=True)
class ControlNetIdentity:
    """What a file holds: ``base`` (``sd1``/``sd2``/``sdxl``, None when not a ControlNet sdrt can read),
    ``layout`` (``ldm``/``diffusers``; ``xlabs`` for XLabs' Flux nets in their own names), the key ``prefix`` and a
    ``label`` in words."""

    base: str | None
    layout: str | None
    prefix: str
    label: str
    hint_channels: int = 3
    #: ``sdxl`` with SDXL's added embedding, else ``sd1``: what an export of another width (``graph=``) is
    shape_of: str | None = None
    #: a ControlNet Union's number of control types (xinsir's controlnet-union-sdxl-1.0: 6, its promax file: 8); 0 else
    union: int = 0


@dataclass
class OpenedControlNet:
    """A ControlNet file bound onto a weight-free graph: ``graph`` (the .onnx path) and ``weights`` (its
    initializers, lazy) are what ``sdrt.load(graph, weights=weights)`` takes."""

    path: Path
    ident: ControlNetIdentity
    graph: Path
    weights: Weights
    #: a Flux ControlNet's layout (block counts, union modes); None for SD ones
    flux: FluxNetLayout | None = None
    #: an SD3 ControlNet's layout (block count, width, pooled projections); None for others
    sd3: SD3NetLayout | None = None

    @property
    def base(self) -> str:
        assert self.ident.base is not None
        return self.ident.base

    @property
    def name(self) -> str:
        return self.path.stem


def identify(shapes: Mapping[str, tuple[int, ...]]) -> ControlNetIdentity:
    """A file's ControlNet identity from its tensor names and shapes (no data read)."""
    keys = list(shapes)

    def has(p: str) -> bool:
        return any(k.startswith(p) for k in keys)

    from . import fluxcontrolnet, sd3controlnet

    if sd3controlnet.is_sd3(shapes):
        sd3 = sd3controlnet.layout(shapes)
        if isinstance(sd3, str):
            return ControlNetIdentity(None, None, "", sd3)
        return ControlNetIdentity("sd3", "diffusers", "", sd3.label)
    if fluxcontrolnet.is_flux(shapes):
        lay = fluxcontrolnet.layout(shapes)
        if isinstance(lay, str):
            return ControlNetIdentity(None, None, "", lay)
        return ControlNetIdentity("flux", "xlabs" if lay.bfl else "diffusers", "", lay.label)
    from . import controllora

    if controllora.is_control_lora(shapes):
        hint0 = shapes.get("input_hint_block.0.weight")
        ch = int(hint0[1]) if hint0 is not None and len(hint0) == 4 else 3
        if not controllora.is_sdxl(shapes):
            return ControlNetIdentity(None, "controllora", "", "an SD 1.x Control-LoRA, which sdrt does not run "
                                      "(it runs Stability AI's SDXL Control-LoRA files)", ch)
        return ControlNetIdentity("sdxl", "controllora", "", "an SDXL Control-LoRA (Stability AI's control-lora)", ch)
    if has("controlnet_cond_embedding.") and has("controlnet_down_blocks."):
        layout, prefix = "diffusers", ""
        hint = shapes.get("controlnet_cond_embedding.conv_in.weight")
        xl = has("add_embedding.")
    else:
        prefix = LDM_PREFIX if has(LDM_PREFIX + "zero_convs.") else ""
        if not (has(prefix + "zero_convs.") and has(prefix + "input_hint_block.")):
            return ControlNetIdentity(None, None, "", _not_controlnet(shapes))
        layout = "ldm"
        hint = shapes.get(prefix + "input_hint_block.0.weight")
        xl = has(prefix + "label_emb.")
    ctx = next((int(s[1]) for k, s in shapes.items() if k.startswith(prefix) and k.endswith("attn2.to_k.weight")
                and len(s) == 2), None)
    channels = int(hint[1]) if hint is not None and len(hint) == 4 else 3
    base = ("sdxl" if ctx in (None, 2048) else None) if xl else _CONTEXT.get(ctx or 0)
    from . import unioncontrolnet

    types = unioncontrolnet.type_count(shapes) if layout == "diffusers" and unioncontrolnet.is_union(shapes) else 0
    if base is None:
        return ControlNetIdentity(None, layout, prefix, f"a ControlNet{' Union' if types else ''} for a "
                                  f"{ctx or 'unknown'}-wide text encoder ({'SDXL-like' if xl else 'SD-like'}; not SD "
                                  "1.x, SD 2.x or SDXL)", channels, "sdxl" if xl else "sd1", union=types)
    if types:
        if base != "sdxl":
            return ControlNetIdentity(None, layout, prefix, f"a ControlNet Union for {BASE_LABELS[base]} (sdrt runs "
                                      "SDXL's)", channels)
        return ControlNetIdentity(base, layout, prefix, f"an SDXL ControlNet Union ({types} control types)", channels,
                                  union=types)
    label = f"an {BASE_LABELS[base]} ControlNet ({'diffusers' if layout == 'diffusers' else 'LDM'} layout)"
    return ControlNetIdentity(base, layout, prefix, label, channels)


def _not_controlnet(shapes: Mapping[str, tuple[int, ...]]) -> str:
    """What a file given as a ControlNet is instead, from its names and shapes (a vision encoder, a LoRA...)."""
    from .families import detect, with_use
    from .foreign import recognise

    keys = list(shapes)
    shown = recognise(dict(shapes)) or with_use(detect(dict(shapes)), "a ControlNet")
    if shown == "unknown":
        shown = f"unknown (first keys: {', '.join(keys[:4])})"
    return f"not a ControlNet: it looks like {shown}"


def convert(keys: list[str], ident: ControlNetIdentity) -> tuple[dict[str, Source], list[str]]:
    """``({diffusers ControlNetModel name: Source}, keys not used)`` for a file's keys."""
    prefix = ident.prefix
    if ident.layout == "diffusers":
        return {k: Source(k) for k in keys}, []
    mine = [k for k in keys if k.startswith(prefix)]
    other = [k for k in keys if not k.startswith(prefix)]  # ControlNet 1.0 files also hold the whole SD model
    hint = sorted(int(m[1]) for k in mine if (m := re.match(re.escape(prefix) + r"input_hint_block\.(\d+)\.weight$", k)))
    out: dict[str, Source] = {}
    encoder: list[str] = []
    for full in mine:
        k = full[len(prefix):]
        if m := re.match(r"zero_convs\.(\d+)\.0\.(weight|bias)$", k):
            out[f"controlnet_down_blocks.{m[1]}.{m[2]}"] = Source(full)
        elif m := re.match(r"middle_block_out\.0\.(weight|bias)$", k):
            out[f"controlnet_mid_block.{m[1]}"] = Source(full)
        elif m := re.match(r"input_hint_block\.(\d+)\.(weight|bias)$", k):
            pos = hint.index(int(m[1])) if int(m[1]) in hint else -1
            conv = ("conv_in" if pos == 0 else "conv_out" if pos == len(hint) - 1 else f"blocks.{pos - 1}")
            out[f"controlnet_cond_embedding.{conv}.{m[2]}"] = Source(full)
        else:
            encoder.append(full)
    unet, unknown = ldm.convert_unet(encoder, prefix)
    out.update(unet)
    return out, unknown + other


def open_controlnet(path: PathLike, *, base: str | None = None, graph: PathLike | None = None,
                    unet: Callable[[], tuple[Any, Weights]] | None = None) -> OpenedControlNet:
    """Open a ControlNet ``.safetensors`` (LDM or diffusers layout) onto sdrt's shipped ControlNet graph of
    its base (or onto ``graph``, an export of your own with the same parameter names).

    ``base``: the family of the model it will run with (``"sd1"``, ``"sdxl"``): a ControlNet made for
    another base is refused. Raises one ``SdrtError`` naming the file for anything that cannot run.

    ``unet``: returns ``(graph, weights)`` of the SDXL UNet the model runs, which a Control-LoRA's ControlNet is built
    from (its UNet copy is that UNet's encoder plus the file's low-rank differences).
    """
    from ..graph import Graph
    from .single_file import Checkpoint

    p = Path(path)
    w = open_weights(p, "ControlNet", "pass the file (or the folder as a ControlNet folder holding model.onnx)",
                     "ControlNet .safetensors file")
    shapes = w.shapes()
    ident = identify(shapes)
    if ident.base is None and graph is not None and ident.shape_of is not None:
        ident = dataclasses.replace(ident, base=ident.shape_of)  # a reduced/other width: the graph given decides
    if ident.base is None:
        from .fluxcontrolnet import is_flux

        sd3 = "SD3" in ident.label
        raise ModelError(f"{p.name} is {ident.label}", where=str(p),
                         fix="pass an SD3 ControlNet (Stability's sd3.5_large_controlnet_*.safetensors, a diffusers "
                             "SD3ControlNetModel, or alimama's SD3-Controlnet-Inpainting)" if sd3 else
                         "pass a Flux.1 dev ControlNet in diffusers' layout (e.g. "
                         "InstantX/FLUX.1-dev-Controlnet-Canny) or XLabs' (e.g. flux-canny-controlnet-v3"
                         ".safetensors)" if is_flux(shapes) else
                         "pass a ControlNet file for SD 1.x (e.g. control_v11p_sd15_canny.safetensors) or SDXL "
                         "(e.g. diffusers/controlnet-canny-sdxl-1.0), or a ControlNet ONNX folder")
    if base is not None and base != ident.base:
        want = BASE_LABELS.get(base, base)
        raise ModelError(f"{p.name} is {ident.label}, and the model is {want}", where=str(p),
                         fix=f"pass a ControlNet made for {want}" + (f" (e.g. {EXAMPLES[base]})" if base in EXAMPLES
                                                                     else ""))
    if ident.base == "flux":
        return _open_flux(p, w, shapes, ident, graph)
    if ident.base == "sd3":
        from .sd3controlnet import open_sd3

        gpath, bound, lay = open_sd3(p, w, shapes, ident, graph)
        return OpenedControlNet(p, ident, gpath, bound, sd3=lay)
    if graph is None and ident.base not in CONTROLNET_GRAPHS:
        raise ModelError(f"{p.name} is {ident.label}; sdrt ships ControlNet graphs for SD 1.x and SDXL only",
                         where=str(p), fix="export this ControlNet to an ONNX folder (model.onnx) and pass the folder")
    if graph is not None:
        gpath = Path(graph)
    elif ident.union:
        from .unioncontrolnet import graph_for

        gpath = graph_for(ident.union)
    else:
        gpath = shipped_graph(CONTROLNET_GRAPHS[ident.base])
    if ident.layout == "controllora":
        if unet is None:
            raise ModelError(f"{p.name} is {ident.label}: its ControlNet is built from the SDXL model's own UNet, "
                             "which was not given", where=str(p),
                             fix="pass it as a ControlNet unit of an SDXL pipeline (ControlNet(file, image) / "
                                 "--controlnet FILE)")
        from . import controllora
        from .onnxmap import param_map

        read, _ = controllora.base_reader(*unet())
        needed = {k: v.shape[::-1] if v.layout == "T" else v.shape
                  for k, v in param_map(Graph.load(gpath, load_external=False)).items() if v.alias_of is None}
        as_ldm = dataclasses.replace(ident, layout="ldm", prefix="")
        w, srcs, unused = controllora.sources(w, needed, read, p.name, lambda keys: convert(keys, as_ldm))
        if ident.hint_channels == 1:
            w = controllora.widen_hint(w, srcs)
            ident = dataclasses.replace(ident, hint_channels=3)
    else:
        srcs, unused = convert(list(shapes), ident)
    if unused:
        log.info("%s: %d keys not used (%s)", p.name, len(unused), ", ".join(unused[:4]))
    ck = Checkpoint(w, {"controlnet": srcs}, ident.label, p)
    try:
        cgraph = Graph.load(gpath)
        (refs,) = ck.lazy({"controlnet": cgraph}).values()
    except WeightsError as exc:
        what = (f"the shipped {BASE_LABELS[ident.base]} ControlNet graph (the architecture of "
                f"{'lllyasviel/control_v11p_sd15_canny' if ident.base == 'sd1' else 'xinsir/controlnet-union-sdxl-1.0' if ident.union else 'diffusers/controlnet-canny-sdxl-1.0'})"
                if graph is None else f"the graph {gpath.name}")
        raise ModelError(f"{p.name} is {ident.label} of another size than {what}: {exc.what}"[:1500],
                         where=str(p), fix="pass a full-size ControlNet (not a -mid/-small/LoRA variant), or export "
                                           "this one to an ONNX folder and pass the folder") from exc
    if ident.hint_channels != 3:
        log.warning("%s takes a %d-channel control image; sdrt feeds RGB", p.name, ident.hint_channels)
    log.info("%s: %s, %d tensors bound onto %s", p.name, ident.label, len(refs), gpath.name)
    return OpenedControlNet(p, ident, gpath, with_own_constants(cgraph, refs, p))


def _open_flux(p: Path, w: Weights, shapes: Mapping[str, tuple[int, ...]], ident: ControlNetIdentity,
               graph: PathLike | None) -> OpenedControlNet:
    """A Flux ControlNet (diffusers' or XLabs' layout) bound onto the graph cut from the shipped Flux transformer
    graph (dev, or schnell for a net without guidance embeddings), or from ``graph`` (a weight-free Flux transformer
    graph)."""
    from ..graph import Graph
    from . import fluxcontrolnet as fcn
    from .single_file import Checkpoint

    lay = fcn.layout(shapes)
    assert isinstance(lay, fcn.FluxNetLayout)
    base = Path(graph) if graph is not None else shipped_graph(fcn.BASES[lay.guidance])
    what = f"the graph {base.name}" if graph is not None else f"sdrt's Flux.1 graph ({fcn.BASES[lay.guidance]})"
    try:
        gpath = fcn.derived_controlnet_graph(base, lay)
    except ModelError as exc:
        raise ModelError(f"{p.name} is {ident.label}, which {what} cannot take: {exc.what}", where=str(p),
                         fix="pass a ControlNet made for Flux.1 dev (e.g. InstantX/FLUX.1-dev-Controlnet-Canny)"
                         if graph is None else exc.fix) from exc
    dead = fcn.unused_keys(lay)
    if lay.bfl:  # XLabs' own names
        from .xlabscontrolnet import sources

        srcs, unused = sources(shapes)
        if unused:
            log.info("%s: %d keys not used (%s)", p.name, len(unused), ", ".join(unused[:4]))
    else:
        srcs = {k: Source(k) for k in shapes}
    srcs = {k: v for k, v in srcs.items() if not k.startswith(dead)}
    ck = Checkpoint(w, {"controlnet": srcs}, ident.label, p)
    try:
        cgraph = Graph.load(gpath)
        (refs,) = ck.lazy({"controlnet": cgraph}).values()
    except WeightsError as exc:
        raise ModelError(f"{p.name} is {ident.label} of another size than {what}: {exc.what}"[:1500], where=str(p),
                         fix="pass a ControlNet made for Flux.1 dev (its widths)") from exc
    log.info("%s: %s, %d tensors bound onto %s", p.name, ident.label, len(refs), gpath.name)
    return OpenedControlNet(p, ident, gpath, with_own_constants(cgraph, refs, p), lay)


def reads_mask(path: Path) -> bool:
    """Whether the ControlNet at ``path`` (its ``.safetensors``, or the diffusers folder holding it) is an SD3
    inpainting net (alimama's: 17 control channels), which reads a mask of its picture; from the file's header."""
    shapes = _header_shapes(path)
    emb = shapes.get("pos_embed_input.proj.weight") if shapes is not None else None
    return emb is not None and len(emb) == 4 and int(emb[1]) == 17 and \
        any(k.startswith("context_embedder.") for k in shapes or ())


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """The tensor shapes in the header of the ControlNet's ``.safetensors`` at ``path`` (the file, or the diffusers
    folder holding it); None for another kind of file or a broken one (its own load says what is wrong)."""
    from ..weights.stfile import read_header

    weights = folder_file(path) if path.is_dir() else path
    if weights is None or weights.suffix.lower() != ".safetensors":
        return None
    try:
        entries, _ = read_header(weights)
    except SdrtError:
        return None
    return {k: tuple(e.shape) for k, e in entries.items()}


def names_union(path: Path) -> bool:
    """Whether the ControlNet at ``path`` (a ``.safetensors`` file, a diffusers folder, an ONNX folder or file) is an
    SDXL ControlNet Union: from the file's header, or the graph's ``control_type`` input (its weights not read)."""
    onnx_file = path / "model.onnx" if path.is_dir() else path
    if onnx_file.suffix.lower() == ".onnx" and onnx_file.is_file():
        import onnx

        try:
            model = onnx.load(str(onnx_file), load_external_data=False)
        except Exception:  # noqa: BLE001 - a broken graph: its own load says what is wrong
            return False
        return any(i.name == "control_type" for i in model.graph.input)
    from .unioncontrolnet import is_union

    shapes = _header_shapes(path)
    return shapes is not None and is_union(shapes)


def folder_file(folder: Path) -> Path | None:
    """The weights file of a diffusers ControlNet folder (``diffusion_pytorch_model.safetensors``, or its
    fp16 variant, or an older folder's ``.bin``), when the folder holds no ``model.onnx``."""
    for name in ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors",
                 "diffusion_pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    files = folder_files(folder)
    return files[0] if len(files) == 1 else None
