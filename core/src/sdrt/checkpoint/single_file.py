"""``Checkpoint``: a single-file LDM checkpoint (or a diffusers folder) bound to a pipeline's graphs.

    ckpt = Checkpoint.open("model.safetensors")          # reads the header only
    arrays = ckpt.arrays({"unet": unet_graph, ...})      # {part: {initializer: array}}, or WeightsError

Everything is checked for every part before any array is made, so a checkpoint
of another architecture is refused before anything changes; the error names the
family the checkpoint looks like and the first keys that do not fit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import WeightsError
from ..weights import TensorRef, Weights, folder_files
from . import families, ldm
from .ldm import Source
from .onnxmap import Slot, _np_dtype, fit, fits_shape, param_map

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph

log = logging.getLogger("sdrt.checkpoint")

#: pipeline part -> checkpoint component, and the canonical-name prefixes that part uses
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "text_encoder": ("text_encoder", ()),
    "text_encoder_2": ("text_encoder_2", ()),
    "unet": ("unet", ()),
    "vae_decoder": ("vae", ("decoder.", "post_quant_conv.")),
    "vae_encoder": ("vae", ("encoder.", "quant_conv.")),
}
#: diffusers folder layout: component -> subfolder
DIFFUSERS_FOLDERS = {"unet": "unet", "vae": "vae", "text_encoder": "text_encoder", "text_encoder_2": "text_encoder_2"}
_SHOW = 6


@dataclass(frozen=True)
class Planned:
    """One initializer to write: from which checkpoint tensor, into which slot."""

    source: Source
    slot: Slot


class Checkpoint:
    """The converted parameters of one checkpoint, read lazily from its mmapped file(s)."""

    def __init__(self, weights: Weights, components: Mapping[str, Mapping[str, Source]], family: str,
                 path: Path, ignored: list[str] | None = None, unknown: list[str] | None = None) -> None:
        self.weights = weights
        self.components = {k: dict(v) for k, v in components.items()}
        self.family = family
        self.path = path
        self.ignored = ignored or []
        self.unknown = unknown or []

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A single-file ``.safetensors`` (or PyTorch ``.ckpt``) checkpoint in the LDM layout, or a diffusers folder
        (``unet/``, ``vae/``, ``text_encoder/``, ``text_encoder_2/`` holding ``.safetensors`` or ``.bin``)."""
        p = Path(path)
        if p.is_dir():
            return cls._open_folder(p)
        w = _unet_only(Weights.open(p))  # a .gguf opens as GGUFWeights: its tensors are dequantized on use
        shapes = {k: w.ref(k).shape for k in w}
        family = families.detect(shapes)
        conv = ldm.convert(w)
        if not conv.components and any(k.endswith("time_embedding.cond_proj.weight") for k in shapes):
            raise WeightsError(f"{p.name} is {families.LCM_UNET}", where=str(p),
                               fix="use the LCM-LoRA (with {@loras=}) on this model, or an LDM checkpoint")
        if not conv.components and families.diffusers_denoiser(shapes)[0] is not None:
            den = "transformer" if any(k.startswith("transformer_blocks.") for k in shapes) else "UNet"
            raise WeightsError(
                f"{p.name} is a {den} alone in diffusers' own tensor names (as "
                "SDXL-Lightning's unet file is), not a checkpoint to bind onto a model folder", where=str(p),
                fix="run the file itself as the {@model}, with its text encoders ({@text_encoders=}) and VAE "
                "({@vae=}), or pass a single-file LDM checkpoint (keys model.diffusion_model.*)")
        if not conv.components:
            raise WeightsError(
                f"no model weights in the LDM layout: this file looks like {families.with_use(family)}"
                f" (first keys: {', '.join(list(w)[:_SHOW])})", where=str(p),
                fix="pass a single-file checkpoint (keys model.diffusion_model.*, first_stage_model.*, "
                "cond_stage_model.* or conditioner.embedders.*), or a diffusers folder")
        if conv.unknown:
            log.warning("%s: %d keys not converted (ignored): %s", p.name, len(conv.unknown),
                        ", ".join(conv.unknown[:_SHOW]))
        return cls(w, conv.components, family, p, conv.ignored, conv.unknown)

    @classmethod
    def _open_folder(cls, root: Path) -> Checkpoint:
        comps: dict[str, dict[str, Source]] = {}
        refs = {}
        for comp, sub in DIFFUSERS_FOLDERS.items():
            files = folder_files(root / sub)  # .safetensors, else diffusion_pytorch_model.bin / pytorch_model.bin
            if not files:
                continue
            # a folder may hold fp16 and fp32 variants side by side: take one
            plain = [f for f in files if ".fp16." not in f.name] or files
            w = Weights.open(plain)
            conv: dict[str, Source] = {}
            for k in w:
                if "position_ids" in k:
                    continue
                name = k.removeprefix("text_model.") if comp.startswith("text_encoder") else k
                conv[name] = Source(f"{sub}/{k}")
                refs[f"{sub}/{k}"] = w.ref(k)
            comps[comp] = conv
        if not comps:
            raise WeightsError("the folder holds no diffusers model weights", where=str(root),
                               fix="pass a folder with unet/, vae/ and text_encoder/ subfolders of .safetensors "
                               "files, or a single-file checkpoint")
        w = Weights(refs, sources=[root])
        return cls(w, comps, "diffusers folder", root)

    # -- shapes and arrays ----------------------------------------------------
    def _shape(self, src: Source) -> tuple[int, ...]:
        return src.shape(tuple(self.weights.ref(src.key).shape))

    def array(self, src: Source) -> np.ndarray:
        try:
            span = src.rows(tuple(self.weights.ref(src.key).shape))
            part = None if span is None else self.weights.rows(src.key, *span)  # its rows alone, where cheaper
            return part if part is not None else src.load(self.weights.__getitem__)
        except WeightsError:
            raise
        except (OSError, ValueError) as exc:
            raise WeightsError(f"cannot read tensor {src.key!r}: {exc}", where=str(self.path),
                               fix="re-download the checkpoint; the file may be truncated") from exc

    def plan(self, parts: Mapping[str, Graph]) -> dict[str, dict[str, Planned]]:
        """``{part: {initializer: Planned}}`` for the given graphs, checked; ``WeightsError`` when anything
        does not fit (nothing has been read or changed then)."""
        out: dict[str, dict[str, Planned]] = {}
        problems: list[str] = []
        kept: list[str] = []  # parts without the file's VAE: said once the file is known to fit, not before a refusal
        for part, graph in parts.items():
            comp_name, prefixes = PARTS.get(part, (part, ()))
            comp = self.components.get(comp_name)
            if comp is None:
                if comp_name == "vae":
                    kept.append(part)
                    continue
                problems.append(f"{part}: the checkpoint has no {comp_name} weights")
                continue
            pmap = param_map(graph)
            plan: dict[str, Planned] = {}
            missing: list[str] = []
            for canon, slot in pmap.items():
                src = comp.get(canon)
                if slot.alias_of is not None and (src is not None or slot.alias_of in pmap):
                    continue  # checked for equal values once the arrays are read; unnamed: the owner's tensor
                if src is None:
                    missing.append(canon)
                    continue
                shape = self._shape(src)
                if not fits_shape(shape, slot):
                    problems.append(f"{part}: {src.key} {list(shape)} vs {slot.init} {list(slot.shape)}")
                    continue
                plan[slot.init] = Planned(src, slot)
            extra = [c for c in comp if c not in pmap and (not prefixes or c.startswith(prefixes))
                     and not _droppable(c, pmap)]
            if missing:
                problems.append(f"{part}: {len(missing)} weights of the graph are not in the checkpoint "
                                f"({', '.join(missing[:_SHOW])})")
            if extra:
                problems.append(f"{part}: {len(extra)} checkpoint weights have no place in the graph "
                                f"({', '.join(comp[c].key for c in extra[:_SHOW])})")
            out[part] = plan
        if problems:
            shown = problems[:_SHOW]
            more = f" (and {len(problems) - _SHOW} more)" if len(problems) > _SHOW else ""
            raise WeightsError(
                f"the checkpoint does not fit this model: it looks like {self.family}; first mismatches: "
                + "; ".join(shown) + more,
                where=str(self.path),
                fix="use a checkpoint of the same architecture as the ONNX export (or export that architecture)")
        for part in kept:
            log.warning("%s has no VAE weights; %s keeps its own", self.path.name, part)
        return out

    def lazy(self, parts: Mapping[str, Graph]) -> dict[str, dict[str, TensorRef]]:
        """Like ``arrays``, but each initializer is a ``TensorRef`` read (and converted) from the mmapped
        file when it is used, so nothing stays in memory between uses. Checked the same way first."""
        plan = self.plan(parts)
        self._check_aliases(parts, plan)
        out: dict[str, dict[str, TensorRef]] = {}
        for part, items in plan.items():
            out[part] = {init: TensorRef(init, _np_dtype(pl.slot.dtype), pl.slot.shape, str(self.path),
                                         (lambda pl=pl: self._fitted(pl)), self._origin(pl), self._blocks(pl))
                         for init, pl in items.items()}
        return out

    def _blocks(self, pl: Planned) -> Any:
        """For a tensor the file stores in a ggml block type (GGUF) that lands on a matmul weight: the reader of
        its blocks as the initializer takes them (``BlockMatrix``, transposed for a MatMul's [in, out] weight);
        None for anything else (norms, biases, convs, other files), which stays a float32 array."""
        ref = self.weights.ref(pl.source.key)
        src, slot = pl.source, pl.slot
        if ref.blocks is None or slot.dtype != "float32" or len(slot.shape) != 2 or len(ref.shape) != 2:
            return None
        if slot.layout not in ("T", "same") or not (src.op in ("copy", "swap") or src.op.startswith(("part:", "rows:"))):
            return None
        rows, cols = src.shape(tuple(ref.shape))
        if (slot.shape != (cols, rows)) if slot.layout == "T" else (slot.shape != (rows, cols)):
            return None

        def read() -> Any:
            bm = ref.blocks()
            if src.op.startswith("part:"):
                i, n = (int(v) for v in src.op[5:].split("/"))
                step = bm.rows // n
                bm = bm.row_range(i * step, (i + 1) * step)
            elif src.op.startswith("rows:"):
                lo, hi = (int(v) for v in src.op[5:].split(":"))
                bm = bm.row_range(lo, hi)
            elif src.op == "swap":
                bm = bm.swap_halves()
            return bm.T if slot.layout == "T" else bm

        return read

    def _origin(self, pl: Planned) -> tuple[Any, ...] | None:
        """Where a planned tensor's bytes are and how it is derived from them: the compile cache keys
        a checkpoint's weights by this instead of reading them."""
        origin = self.weights.ref(pl.source.key).origin
        how = f"checkpoint {pl.source.op} {pl.slot.layout} {pl.slot.dtype}"
        return None if origin is None else (*origin[:3], how)

    def _fitted(self, pl: Planned) -> np.ndarray:
        with np.errstate(over="ignore"):
            a = fit(self.array(pl.source), pl.slot)
        if a is None:  # shapes were checked; only a file that changed under us gets here
            raise WeightsError(f"{pl.source.key} no longer fits {pl.slot.init}", where=str(self.path),
                               fix="do not modify the checkpoint while it is loaded")
        return a

    def _check_aliases(self, parts: Mapping[str, Graph], plan: Mapping[str, Mapping[str, Planned]]) -> None:
        """Tensors the exporter merged must get equal values from the checkpoint."""
        for part, items in plan.items():
            comp = self.components[PARTS.get(part, (part, ()))[0]]
            for canon, slot in param_map(parts[part]).items():
                if slot.alias_of is None or slot.init not in items or canon not in comp:
                    continue
                a = fit(self.array(comp[canon]), slot)
                if a is None or not np.array_equal(a, self._fitted(items[slot.init])):
                    raise WeightsError(
                        f"the export stores {canon} and {slot.alias_of} as one tensor ({slot.init}, torch's "
                        "exporter merges equal weights), and this checkpoint gives them different values",
                        where=f"{self.path} -> {part}",
                        fix="re-export the model from weights that are not equal (or from this checkpoint)")

    def arrays(self, parts: Mapping[str, Graph]) -> dict[str, dict[str, np.ndarray]]:
        """``{part: {initializer: array in the graph's layout and dtype}}``; checks everything first."""
        return {part: {init: ref.load() for init, ref in refs.items()} for part, refs in self.lazy(parts).items()}

    def __repr__(self) -> str:
        comps = ", ".join(f"{k} ({len(v)})" for k, v in self.components.items())
        return f"Checkpoint({self.family}: {comps}; from {self.path.name})"


def with_own_constants(graph: Graph, refs: Mapping[str, TensorRef], source: Path) -> Weights:
    """``refs`` (a checkpoint's tensors bound onto a weight-free graph) plus the small constants the graph
    keeps itself (position ids, scalars its exporter made initializers), so the weights cover every
    initializer and binding them stays strict."""
    inline = [n for n in graph.initializer_names if n not in refs and graph.has_data(n)]
    whole = Weights.from_graph(graph) if inline else None
    own = {n: whole.ref(n) for n in inline} if whole is not None else {}
    return Weights({**own, **refs}, sources=[source])


def _droppable(canon: str, pmap: Mapping[str, Slot]) -> bool:
    """Checkpoint weights a correct export may leave out: text-encoder layers past the one the export
    stops at (SD 2.x uses the penultimate of 24), a projection the export does not have, and SD 3's fixed
    sin-cos position table (a buffer of the config's values, which an export may fold into a constant)."""
    import re

    if canon in ("text_projection.weight", "pos_embed.pos_embed"):
        return True
    m = re.match(r"encoder\.layers\.(\d+)\.", canon)
    if m:
        layers = {int(x[1]) for c in pmap if (x := re.match(r"encoder\.layers\.(\d+)\.", c))}
        return bool(layers) and int(m[1]) > max(layers)
    return False


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    return Checkpoint.open(path)


_LDM_UNET_KEYS = ("input_blocks.", "middle_block.", "output_blocks.", "time_embed.")


def _unet_only(w: Weights) -> Weights:
    """A UNet-only file in the LDM layout without its ``model.diffusion_model.`` prefix (city96's GGUF
    conversions of SD 1.x/SDXL, stable-diffusion.cpp's UNet files) read as if the prefix were there."""
    keys = list(w)
    if any(k.startswith(ldm.UNET_PREFIX) for k in keys) or not any(k.startswith(_LDM_UNET_KEYS) for k in keys):
        return w
    return w.renamed(lambda k: ldm.UNET_PREFIX + k if k.startswith(_LDM_UNET_KEYS) or k.startswith("out.")
                     or k.startswith("label_emb.") else k)
