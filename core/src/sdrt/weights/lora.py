"""LoRA: merge low-rank adapters into weights, and restore the originals bit for bit.

Formats (read from ``.safetensors``):

- kohya: ``lora_unet_<module_path_with_underscores>.lora_down.weight`` /
  ``.lora_up.weight`` / ``.alpha`` (and ``lora_te_``, ``lora_te1_``,
  ``lora_te2_`` for text encoders);
- diffusers / PEFT: ``<module.path>.lora_A.weight`` / ``.lora_B.weight``
  (optionally ``.alpha``; without it alpha = rank), and the older
  ``<module.path>.lora.down.weight`` / ``.lora.up.weight``.

Merge: ``W' = W + sum_i scale_i * (alpha_i / rank_i) * (up_i @ down_i)``,
computed in float32 and cast back to W's dtype; linear ([out, in]) and conv
(1x1 and kxk: down [r, in, kh, kw], up [out, r, 1, 1]; LyCORIS's Tucker LoCon: down
[r, in, 1, 1], ``lora_mid`` [r, r, kh, kw], up [out, r, 1, 1]) weights.

LyCORIS's whole changes: ``diff`` (``algo="full"``: the weight's change, any shape) and ``diff_b`` (its bias's),
``w_norm`` / ``b_norm`` (a GroupNorm / LayerNorm's weight and bias change, ``train_norm``): ``W' = W + scale * diff``,
as LyCORIS's ``merge_to`` and A1111's built-in Lora extension (``network_full.py``, ``network_norm.py``) merge them
(an ``.alpha`` beside them scales nothing). A bias layer is keyed by its file key (``<module>.diff_b``,
``<module>.b_norm``) and patches ``<module>.bias``; every other layer is keyed by its module and patches its weight.

DoRA (a ``dora_scale`` or ``lora_magnitude_vector`` beside a layer's factors) is not
additive: the layer rescales ``W + delta`` to the trained magnitude ``m``, norm per
output row (or per input column), see ``Dora``. The merged
``Weights`` keep the original arrays of every tensor they changed, and
``unmerge()`` gives those back: nothing is subtracted.

Finding the weight a LoRA module patches (in this order):

1. an explicit ``targets={lora module key: initializer name}`` map;
2. a weight named ``<module.path>.weight`` (kohya names are matched by
   flattening every weight name's dots to underscores, so the ambiguity of
   ``proj_in`` against ``proj.in`` never arises);
3. with a graph: torch's exporter names nodes by module scope
   (``/down_blocks.0/attentions.0/proj_in/MatMul``), so the weight input of a
   MatMul/Gemm/Conv node stands for that module even when the initializer is
   anonymous (``onnx::MatMul_1234``).

Layout: a MatMul weight (and Gemm with ``transB=0``) is stored transposed
relative to torch's Linear ([in, out]); with a graph this is known from the
consuming node and the delta is transposed, square weights included. Without
a graph a delta is transposed only when its shape says so (a square weight is
then assumed to be in torch layout).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import WeightsError
from ..graph import Graph
from .store import Weights

log = logging.getLogger("sdrt.lora")

#: kohya's flattened module names per model; ``lycoris_`` is LyCORIS's own wrapper (``create_lycoris``, as SimpleTuner
#: saves its LyCORIS files: ``lycoris_down_blocks_0_attentions_0_proj_in.lokr_w1``), on the UNet or transformer
KOHYA_PREFIXES = {"unet": ("lora_unet_", "lycoris_"), "te": ("lora_te_", "lora_te1_"), "te1": ("lora_te1_", "lora_te_"),
                  "te2": ("lora_te2_",)}
_KEY = re.compile(r"^(?:(?P<mod>.+?)\.(?P<kind>lora_down|lora_up|lora_mid|lora_A|lora_B|lora\.down|lora\.up)"
                  r"|(?P<xmod>.+?\.processor\.(?:qkv|proj)_lora\d?)\.(?P<xkind>down|up))(?:\.default)?\.weight$")
_ALPHA = re.compile(r"^(?P<mod>.+)\.alpha$")
#: DoRA's magnitude: LyCORIS / kohya ``<module>.dora_scale``; PEFT / diffusers ``<module>.lora_magnitude_vector``
_DORA = re.compile(r"^(?P<mod>.+?)\.(?P<kind>dora_scale|lora_magnitude_vector)(?:\.default)?(?:\.weight)?$")
#: diffusers' older LoRA files (attention processors, 2023): ``...attn1.processor.to_q_lora.down.weight`` (UNet) or
#: ``...self_attn.to_q_lora.down.weight`` (text encoder), and ``...q_proj.lora_linear_layer.down.weight``
_OLD_DIFFUSERS = re.compile(r"^(?P<mod>.+?)(?:\.processor)?\.(?P<which>to_q|to_k|to_v|to_out)_lora\.(?P<kind>down|up)"
                            r"\.weight$")
_LINEAR_LAYER = re.compile(r"^(?P<mod>.+?)\.lora_linear_layer\.(?P<kind>down|up)\.weight$")
_OLD_UNET = {"to_q": "to_q", "to_k": "to_k", "to_v": "to_v", "to_out": "to_out.0"}
_OLD_TE = {"to_q": "q_proj", "to_k": "k_proj", "to_v": "v_proj", "to_out": "out_proj"}


def _old_diffusers(key: str) -> tuple[str, str] | None:
    """``(module, "down" | "up")`` for a key of diffusers' older LoRA formats, else None."""
    m = _OLD_DIFFUSERS.match(key)
    if m:
        which = (_OLD_TE if m["mod"].endswith("self_attn") else _OLD_UNET)[m["which"]]
        return f"{m['mod']}.{which}", m["kind"]
    m = _LINEAR_LAYER.match(key)
    return (m["mod"], m["kind"]) if m else None


_DOWN = {"lora_down", "lora_A", "lora.down", "down"}  # "down": XLabs' Flux LoRAs (processor.qkv_lora1.down)
#: module prefixes that diffusers/PEFT files put before the model's own module path
PEFT_PREFIXES = ("base_model.model.", "unet.", "transformer.", "text_encoder.", "text_encoder_2.", "model.")


@dataclass(frozen=True)
class Dora:
    """DoRA's trained magnitude ``m`` of one layer, and whose convention merges it.

    ``"lycoris"`` (kohya / LyCORIS files, ``dora_scale``): ``m`` is [out, 1(, 1, 1)] for a norm per output row
    (LyCORIS's ``wd_on_out``, its default) or [1, in(, 1, 1)] for a norm per input column (the shape says which,
    as in ComfyUI). At strength ``s``: ``W' = W + s * (D(W + delta) - W)`` with ``D(X) = X * m / (||X|| + eps)``
    (float32's eps) and ``delta`` the layer's change at strength 1: LyCORIS's ``get_merged_weight()`` at
    multiplier 1, and ComfyUI's / A1111's strength (LyCORIS's own multiplier scales only ``m / ||X||``'s
    distance from 1, so strength 0 keeps ``delta``; ComfyUI's output-axis norm is taken of ``W``, not ``X``).

    ``"peft"`` (PEFT / diffusers files, ``lora_magnitude_vector``): ``m`` is [out] (linear) or [1, out, 1, 1]
    (conv), the norm per output row, and the strength goes inside: ``W' = m * X / ||X||`` with ``X = W + s *
    delta``, as peft's ``merge_and_unload()`` after ``scale_layer(s)`` (diffusers' ``fuse_lora(lora_scale=s)``)."""

    magnitude: np.ndarray = field(repr=False)
    convention: str  # "lycoris" or "peft"

    def axis(self, out: int, inp: int) -> str | None:
        """``"out"`` or ``"in"`` for a weight [out, in, ...] (torch's layout), None when ``m`` fits neither."""
        m = np.shape(self.magnitude)
        size = int(np.prod(m)) if m else 1
        if self.convention == "peft":
            return "out" if size == out else None
        if len(m) >= 1 and m[0] == out and size == out:
            return "out"
        if len(m) >= 2 and m[0] == 1 and m[1] == inp and size == inp:
            return "in"
        return None

    def apply(self, w: np.ndarray, delta: np.ndarray, strength: float | None) -> np.ndarray:
        """The DoRA-merged weight from ``w`` and ``delta`` (torch's layout, float32); ``strength``: the LyCORIS
        convention's ``s`` (None for PEFT's, whose strength is in ``delta`` already)."""
        calc = np.add(w, delta, dtype=np.float32)
        sq = np.square(calc)  # summed in float64, without a float64 copy of the weight
        axis = self.axis(int(w.shape[0]), int(w.shape[1]))
        if axis == "out":
            norm = np.sqrt(sq.reshape(sq.shape[0], -1).sum(axis=1, dtype=np.float64)).reshape(
                sq.shape[0], *[1] * (sq.ndim - 1))
        else:
            norm = np.sqrt(sq.sum(axis=(0, *range(2, sq.ndim)), dtype=np.float64, keepdims=True))
        del sq
        if self.convention == "lycoris":
            norm = norm + np.finfo(np.float32).eps
        m = np.asarray(self.magnitude, np.float64).reshape(norm.shape)
        with np.errstate(all="ignore"):  # in place: a Flux linear1 is 264 MB in float32
            calc *= (m / norm).astype(np.float32)
            if strength is not None and strength != 1.0:
                calc -= w
                calc *= np.float32(strength)
                calc += w
        return calc


def _tucker(core: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """LyCORIS's Tucker rebuild ``einsum("i j ..., i p, j r -> p r ...", core, a, b)``: [p, r, kh, kw] from a core
    [i, j, kh, kw], ``a`` [i, p] (the output side) and ``b`` [j, r] (the input side)."""
    return np.einsum("ijkl,ip,jr->prkl", core, a, b, optimize=True)


@dataclass(frozen=True)
class LoraLayer:
    """One adapted module: ``down`` [r, in(, kh, kw)], ``up`` [out, r(, 1, 1)], ``alpha``; LyCORIS's Tucker LoCon
    adds ``mid`` [r, r, kh, kw] (``down`` then [r, in, 1, 1]); ``dora`` when the file carries DoRA's magnitude."""

    key: str
    down: np.ndarray = field(repr=False)
    up: np.ndarray = field(repr=False)
    alpha: float
    mid: np.ndarray | None = field(default=None, repr=False)
    dora: Dora | None = None

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])

    def delta(self, scale: float = 1.0) -> np.ndarray:
        """``scale * alpha / rank * (up @ down)`` in float32, shaped [out, in] or [out, in, kh, kw]; with ``mid``
        ``up`` and ``down`` contract ``mid``'s two rank axes."""
        down = np.asarray(self.down, np.float32)
        up = np.asarray(self.up, np.float32)
        factor = np.float32(scale * self.alpha / self.rank)
        if self.mid is not None:
            d = _tucker(np.asarray(self.mid, np.float32), up.reshape(up.shape[0], -1).T,
                        down.reshape(down.shape[0], -1)).astype(np.float32)
            return d * factor
        d = up.reshape(up.shape[0], -1) @ down.reshape(down.shape[0], -1)
        d *= factor
        if down.ndim == 4:
            d = d.reshape(up.shape[0], *down.shape[1:])
        return d


#: LyCORIS's whole changes (``DeltaLayer``): the full algo's ``diff`` / ``diff_b``, the norm algo's ``w_norm`` / ``b_norm``
_WHOLE = re.compile(r"^(?P<mod>.+?)\.(?P<kind>diff|diff_b|w_norm|b_norm)$")
#: the file key endings of a whole change to a module's bias (its layer patches ``<module>.bias``)
BIAS_KEYS = (".diff_b", ".b_norm")


def bias_module(key: str) -> str | None:
    """The module whose bias a layer key changes (``<module>.diff_b`` / ``<module>.b_norm``), else None."""
    for end in BIAS_KEYS:
        if key.endswith(end):
            return key[: -len(end)]
    return None


#: LyCORIS LoHa / LoKr tensor names (with Tucker's ``hada_t1``/``hada_t2``/``lokr_t2`` for conv layers)
_LYCORIS = re.compile(r"^(?P<mod>.+?)\.(?P<kind>hada_w1_a|hada_w1_b|hada_w2_a|hada_w2_b|hada_t1|hada_t2|lokr_w1|"
                      r"lokr_w1_a|lokr_w1_b|lokr_w2|lokr_w2_a|lokr_w2_b|lokr_t2)$")


@dataclass(frozen=True)
class LycorisLayer:
    """A LyCORIS LoHa (``hada_w1_a @ hada_w1_b`` times ``hada_w2_a @ hada_w2_b``, element-wise) or LoKr
    (``kron(w1, w2)``, each factor whole or ``*_a @ *_b``) layer. Scale as ComfyUI and A1111's LyCORIS code
    apply it: LoHa ``alpha / rank`` (rank: ``hada_w1_b``'s rows); LoKr ``alpha / rank`` when a factor is
    decomposed (rank: its ``*_b``'s rows), else 1. Tucker conv factors (LyCORIS's ``use_tucker``, peft's
    ``use_effective_conv2d``): LoHa's ``hada_t1`` [r, r, kh, kw] with ``hada_w1_a`` [r, out] and ``hada_w1_b``
    [r, in] make ``w1`` (``hada_t2`` likewise ``w2``); LoKr's ``lokr_t2`` with ``lokr_w2_a`` [r, out2] and
    ``lokr_w2_b`` [r, in2] make ``w2``."""

    key: str
    kind: str
    tensors: Mapping[str, np.ndarray] = field(repr=False)
    alpha: float | None
    dora: Dora | None = None
    #: peft's scaling (``alpha / r`` of a PEFT LoHa/LoKr config), which replaces the LyCORIS factor when set
    scaling: float | None = None

    @property
    def rank(self) -> int:
        t = self.tensors
        for k in ("hada_w1_b", "lokr_w2_b", "lokr_w1_b"):
            if k in t:
                return int(t[k].shape[0])
        return 0

    def shape_problem(self) -> str | None:
        """Why the factors cannot make a delta (shapes only, nothing multiplied), or None."""
        s = {k: tuple(np.shape(v)) for k, v in self.tensors.items()}
        if self.kind == "loha":
            (a1, b1, a2, b2) = (s[k] for k in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"))
            if "hada_t1" in s:
                t1, t2 = s["hada_t1"], s["hada_t2"]
                if len(t1) != 4 or t2 != t1 or len(a1) != 2 or len(b1) != 2 or (a1[0], b1[0]) != t1[:2] \
                        or a2 != a1 or b2 != b1:
                    return (f"Tucker factors hada_t1 {t1}, hada_w1_a {a1}, hada_w1_b {b1} (and hada_t2 {t2}, "
                            f"hada_w2_a {a2}, hada_w2_b {b2}) do not make one [out, in, kh, kw] delta")
                return None
            if len(a1) != 2 or len(b1) != 2 or a1[1] != b1[0] or a2 != a1 or b2 != b1:
                return f"factors {a1} @ {b1} and {a2} @ {b2} do not make one [out, in] delta"
            return None
        if "lokr_t2" in s:
            t, a, b = s["lokr_t2"], s.get("lokr_w2_a"), s.get("lokr_w2_b")
            if a is None or b is None or len(t) != 4 or len(a) != 2 or len(b) != 2 or (a[0], b[0]) != t[:2]:
                return f"Tucker factors lokr_t2 {t}, lokr_w2_a {a} and lokr_w2_b {b} do not make one delta"
        for w in ("lokr_w1", "lokr_w2"):
            if w == "lokr_w2" and "lokr_t2" in s:
                continue
            if w not in s and (len(s[w + "_a"]) != 2 or s[w + "_a"][1] != s[w + "_b"][0]):
                return f"{w}_a {s[w + '_a']} and {w}_b {s[w + '_b']} do not multiply"
        w1 = s.get("lokr_w1") or (s["lokr_w1_a"][0], *s["lokr_w1_b"][1:])
        if len(w1) != 2:
            return f"lokr_w1 is {w1}, expected 2 dimensions"
        return None

    def delta(self, scale: float = 1.0) -> np.ndarray:
        t = {k: np.asarray(v, np.float32) for k, v in self.tensors.items()}
        if self.kind == "loha" and "hada_t1" in t:
            d = _tucker(t["hada_t1"], t["hada_w1_a"], t["hada_w1_b"]) * _tucker(t["hada_t2"], t["hada_w2_a"],
                                                                               t["hada_w2_b"])
            factor = (self.alpha / self.rank) if self.alpha is not None else 1.0
        elif self.kind == "loha":
            d = (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"])
            factor = (self.alpha / self.rank) if self.alpha is not None else 1.0
        else:
            dim = None
            w1 = t.get("lokr_w1")
            if w1 is None:
                dim = int(t["lokr_w1_b"].shape[0])
                w1 = t["lokr_w1_a"] @ t["lokr_w1_b"]
            w2 = t.get("lokr_w2")
            if w2 is None and "lokr_t2" in t:
                dim = int(t["lokr_w2_b"].shape[0])
                w2 = _tucker(t["lokr_t2"], t["lokr_w2_a"], t["lokr_w2_b"])
            elif w2 is None:
                dim = int(t["lokr_w2_b"].shape[0])
                w2 = t["lokr_w2_a"] @ t["lokr_w2_b"].reshape(dim, -1)
                b = t["lokr_w2_b"]
                if b.ndim == 4:
                    w2 = w2.reshape(w2.shape[0], *b.shape[1:])
            if w2.ndim == 4:
                w1 = w1.reshape(*w1.shape, 1, 1)
            d = np.kron(w1, w2)
            factor = (self.alpha / dim) if (self.alpha is not None and dim) else 1.0
        if self.scaling is not None:
            factor = self.scaling
        return (d * np.float32(scale * factor)).astype(np.float32)


def _alpha(value: Any) -> float | str:
    """A layer's alpha tensor as a number, or what is wrong with it."""
    with np.errstate(all="ignore"):
        a = np.asarray(value).astype(np.float64)
    if a.size != 1 or not np.isfinite(a).all():
        return f"alpha is {a.tolist()!r}, expected one finite number"
    return float(a.reshape(()))


@dataclass(frozen=True)
class DeltaLayer:
    """A layer whose change is given whole (LyCORIS's ``diff`` / ``diff_b`` / ``w_norm`` / ``b_norm``, or rows of a
    LyCORIS layer on a fused module, split): ``delta`` is ``scale * diff``."""

    key: str
    diff: np.ndarray = field(repr=False)
    rank: int = 0
    dora: Dora | None = None

    def delta(self, scale: float = 1.0) -> np.ndarray:
        return (np.asarray(self.diff, np.float32) * np.float32(scale)).astype(np.float32)


#: Flux.1's image input (``x_embedder``, BFL's ``img_in``) takes 64 channels (16 latent channels, 2x2 patches);
#: Black Forest Labs' Canny/Depth control LoRAs widen it to 128 (the control image's latents beside the noise)
_FLUX_CONTROL_IN = re.compile(r"(?:^|[._])(?:x_embedder|img_in)\.(?:lora_A|lora_down|lora\.down)(?:\.default)?\.weight$")
#: what a control LoRA replaces whole: BFL's qk-norm scales (``double_blocks.0.img_attn.norm.query_norm.scale``,
#: ``single_blocks.0.norm.key_norm.scale``) or diffusers' (``transformer.transformer_blocks.0.attn.norm_added_q.weight``)
_FLUX_CONTROL_SET = re.compile(r"(?:(?:query|key)_norm\.scale|\.attn\.norm_(?:added_)?[qk]\.weight)$")
#: a LoRA's bias on its up layer (PEFT's ``lora_bias=True``): BFL's control LoRAs have one on every layer
_LORA_B_BIAS = re.compile(r"^(?P<mod>.+?)\.(?:lora_B|lora_up)(?:\.default)?\.bias$")


def _flux_control(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """What shows a Flux Control LoRA (BFL's Canny/Depth LoRA, or diffusers' conversion of one), else None."""
    for k, shape in shapes.items():
        if _FLUX_CONTROL_IN.search(k) and len(shape) == 2 and shape[1] == 128:
            return f"{k} takes {shape[1]} input channels where Flux.1's image input has 64"
    norms = [k for k in shapes if k.endswith(("query_norm.scale", "key_norm.scale"))]
    if norms and any(k.startswith(("img_in.", "double_blocks.", "single_blocks.")) for k in shapes):
        return f"it replaces the attention norms whole, {norms[0]} and {len(norms) - 1} more, as BFL's control LoRAs do"
    return None


@dataclass(frozen=True)
class FluxControl:
    """What a Flux Control LoRA (BFL's FLUX.1 Canny/Depth dev LoRA) holds beside its low-rank layers.

    ``why``: what showed it (for messages); ``sets``: tensors that replace the model's whole, at any scale (the
    qk-norm scales: diffusers' ``load_lora_weights`` loads them into the transformer directly, ComfyUI's
    ``set_weight`` patch); ``biases``: ``{module: lora_B.bias}``, merged as ``scale * alpha / rank * bias`` into
    the module's bias (peft's ``lora_bias``, ComfyUI's ``diff_b``). The image input's LoRA takes 128 channels:
    the model's ``img_in`` / ``x_embedder`` weight is zero-padded to 128 inputs before the merge (diffusers'
    ``_maybe_expand_transformer_param_shape_or_error_``, ComfyUI's ``reshape_weight``)."""

    why: str
    sets: Mapping[str, np.ndarray] = field(repr=False)
    biases: Mapping[str, np.ndarray] = field(repr=False)


class Lora:
    """The layers of one LoRA file. Build with ``Lora.open(path)`` or ``Lora.from_arrays``."""

    def __init__(self, layers: Mapping[str, LoraLayer | LycorisLayer], fmt: str, source: str = "<memory>") -> None:
        self.layers = dict(layers)
        self.format = fmt
        self.source = source
        #: a Flux Control LoRA's whole-tensor replacements and biases (``FluxControl``), else None
        self.control: FluxControl | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, alpha: float | None = None) -> Lora:
        """Read a LoRA ``.safetensors`` (or a PyTorch ``.pt``/``.ckpt``, read by ``torchfile`` like any weights).
        Layers without an ``.alpha`` tensor (PEFT's) are scaled as the file's PEFT configuration says
        (``sdrt.weights.peftconfig``: diffusers' ``lora_adapter_metadata`` header, or peft's
        ``adapter_config.json`` beside the file), else by ``alpha`` when given, else alpha = rank."""
        from . import peftconfig

        w = Weights.open(path)
        # diffusers keeps PEFT's lora_alpha / r in the safetensors header (lora_adapter_metadata); a PyTorch file
        # has none
        headers = getattr(w, "file_metadata", {})  # as Weights.open read them (a GGUF file: none)
        meta = next(iter(headers.values())) if len(headers) == 1 and os.path.isfile(path) else {}
        return cls.from_arrays(w, alpha=alpha, source=str(path), peft=peftconfig.configs_for(path, meta))

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], *, alpha: float | None = None,
                    source: str = "<memory>", peft: Mapping[str, Mapping[str, Any]] | None = None) -> Lora:
        """The layers of ``arrays``; ``peft``: ``{component prefix: PEFT adapter config}``
        (``peftconfig.configs_for``), which scales layers without an ``.alpha`` tensor, as peft does."""
        from .peftconfig import layer_scaling

        shapes = arrays.shapes() if isinstance(arrays, Weights) else {k: tuple(np.shape(v)) for k, v in arrays.items()}
        control = _flux_control(shapes)
        sets: dict[str, np.ndarray] = {}
        biases: dict[str, np.ndarray] = {}
        if control:  # the tensors it replaces whole, and its up layers' biases, are not low-rank layers
            keys = list(arrays)
            for key in keys:
                b = _LORA_B_BIAS.match(key)
                if b:
                    biases[b["mod"]] = np.asarray(arrays[key])
                elif _FLUX_CONTROL_SET.search(key):
                    sets[key] = np.asarray(arrays[key])
            arrays = {k: arrays[k] for k in keys if k not in sets and not _LORA_B_BIAS.match(k)}
        parts: dict[str, dict[str, Any]] = {}
        unknown: list[str] = []
        lyco: dict[str, dict[str, str]] = {}
        doras: dict[str, str] = {}
        whole: dict[str, dict[str, str]] = {}
        for key in arrays:
            wm = _WHOLE.match(key)
            if wm:
                whole.setdefault(wm["mod"], {})[wm["kind"]] = key
                continue
            dm = _DORA.match(key)
            if dm:
                doras[dm["mod"]] = key
                continue
            ly = _LYCORIS.match(key)
            if ly:
                lyco.setdefault(ly["mod"], {})[ly["kind"]] = key
                continue
            m = _KEY.match(key)
            old_format = None if m else _old_diffusers(key)
            if m or old_format:
                mod, kind = old_format or ((m["mod"], m["kind"]) if m["mod"] else (m["xmod"], m["xkind"]))
                parts.setdefault(mod, {})["mid" if kind == "lora_mid" else "down" if kind in _DOWN else "up"] = key
                continue
            a = _ALPHA.match(key)
            if a:
                parts.setdefault(a["mod"], {})["alpha"] = key
                continue
            unknown.append(key)
        problems = [f"{k} (not a lora_down/lora_up/lora_A/lora_B/alpha key)" for k in unknown]
        layers: dict[str, LoraLayer | LycorisLayer] = {}
        for mod, names in lyco.items():
            alpha_key = parts.pop(mod, {}).get("alpha")
            kind = "loha" if any(n.startswith("hada") for n in names) else "lokr"
            need = ({"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"} if kind == "loha" else set())
            if kind == "loha" and {"hada_t1", "hada_t2"} & set(names):
                need |= {"hada_t1", "hada_t2"}
            if kind == "lokr" and not (("lokr_w1" in names or {"lokr_w1_a", "lokr_w1_b"} <= set(names))
                                       and ("lokr_w2" in names or {"lokr_w2_a", "lokr_w2_b"} <= set(names))):
                need = {"lokr_w1 (or lokr_w1_a, lokr_w1_b)", "lokr_w2 (or lokr_w2_a, lokr_w2_b)"}
            if need - set(names):
                problems.append(f"{mod} ({kind}: has {', '.join(sorted(names))}, needs {', '.join(sorted(need))})")
                continue
            al = None if alpha_key is None else _alpha(arrays[alpha_key])
            if isinstance(al, str):
                problems.append(f"{mod} ({al})")
                continue
            scaling = layer_scaling(peft, mod) if (peft and al is None) else None  # PEFT's LoHa / LoKr
            layer = LycorisLayer(mod, kind, {n: arrays[k] for n, k in names.items()}, al, scaling=scaling)
            bad = layer.shape_problem()
            if bad:
                problems.append(f"{mod} ({kind}: {bad})")
                continue
            layers[mod] = layer
        for mod, kinds in whole.items():
            other = {k for k in parts.get(mod, {}) if k != "alpha"}  # an alpha beside a full diff scales nothing
            if other or mod in lyco or mod in layers or ("diff" in kinds) + ("w_norm" in kinds) > 1 \
                    or ("diff_b" in kinds) + ("b_norm" in kinds) > 1:
                have = sorted({*kinds, *other, *lyco.get(mod, {})})
                problems.append(f"{mod} (has {', '.join(have)}: a full diff or norm delta goes alone on a module)")
                parts.pop(mod, None)
                continue
            parts.pop(mod, None)
            for kind, key in sorted(kinds.items()):
                arr = np.asarray(arrays[key])
                if kind != "diff" and arr.ndim != 1 or arr.size == 0:
                    problems.append(f"{key} ({list(arr.shape)}: expected one vector)" if kind != "diff" else
                                    f"{key} (empty)")
                    continue
                name = f"{mod}.{kind}" if kind in ("diff_b", "b_norm") else mod
                layers[name] = DeltaLayer(name, arr)
        for mod, p in parts.items():
            if "down" not in p or "up" not in p:
                problems.append(f"{mod} (has {', '.join(sorted(p))} but needs both down and up)")
                continue
            down, up = np.asarray(arrays[p["down"]]), np.asarray(arrays[p["up"]])
            mid = np.asarray(arrays[p["mid"]]) if "mid" in p else None
            if mid is not None and (mid.ndim != 4 or up.ndim not in (2, 4) or down.ndim not in (2, 4)
                                    or mid.shape[:2] != (up.shape[1], down.shape[0])
                                    or down.shape[2:] not in ((), (1, 1)) or up.shape[2:] not in ((), (1, 1))):
                problems.append(f"{mod} (Tucker lora_mid {list(mid.shape)} does not join down {list(down.shape)} "
                                f"and up {list(up.shape)})")
                continue
            if down.ndim not in (2, 4) or up.ndim not in (2, 4) or up.shape[1] != down.shape[0] \
                    or (up.ndim == 4 and up.shape[2:] != (1, 1)):
                problems.append(f"{mod} (down {list(down.shape)} and up {list(up.shape)} do not make a LoRA pair)")
                continue
            if "alpha" in p:
                al = _alpha(arrays[p["alpha"]])
                if isinstance(al, str):
                    problems.append(f"{mod} ({al})")
                    continue
            else:
                scaling = layer_scaling(peft, mod) if peft else None
                al = (scaling * float(down.shape[0]) if scaling is not None else
                      float(alpha) if alpha is not None else float(down.shape[0]))
            layers[mod] = LoraLayer(mod, down, up, al, mid)
        for mod, key in doras.items():
            m = np.asarray(arrays[key])
            conv = "peft" if key[len(mod):].startswith(".lora_magnitude_vector") else "lycoris"
            with np.errstate(all="ignore"):
                finite = bool(np.isfinite(m.astype(np.float32)).all())
            if mod not in layers:
                if mod not in parts and mod not in lyco:  # (a broken layer is reported above)
                    problems.append(f"{key} (a DoRA magnitude without a LoRA/LoHa/LoKr layer of that module)")
            elif m.size == 0 or not finite or sum(n != 1 for n in m.shape) > 1:
                problems.append(f"{key} (DoRA magnitude {list(m.shape)}: expected one finite vector)")
            else:
                layers[mod] = replace(layers[mod], dora=Dora(m, conv))
        if unknown and not layers and not parts and not lyco and not whole:  # nothing in it is a LoRA: say what it is
            from ..checkpoint.families import NOT_CHECKPOINTS, detect, identify, with_use

            plain = detect(shapes)  # names and shapes only: a 6 GB checkpoint is not read
            what = with_use(plain, "a LoRA") if plain in NOT_CHECKPOINTS else identify(shapes).label
            raise WeightsError(f"{os.path.basename(source)} is not a LoRA: it looks like {what}", where=source,
                               fix="pass a LoRA file here (keys ending in lora_down.weight / lora_A.weight / "
                               "hada_w1_a / lokr_w1 / diff); a checkpoint is the model ({@@model}, or {@@weights} "
                               "onto a loaded one), an embedding goes in with {@@embeddings}")
        if problems:
            raise WeightsError(
                f"{len(problems)} LoRA keys cannot be used: " + "; ".join(problems),
                where=source,
                fix="sdrt reads LoRA (kohya lora_down/lora_up/lora_mid, PEFT lora_A/lora_B) and LyCORIS LoHa/LoKr "
                "(with Tucker factors and DoRA magnitudes), full diffs (diff/diff_b) and norms (w_norm/b_norm); other "
                "LyCORIS formats ((IA)^3, OFT/BOFT, GLoRA) must be merged elsewhere",
            )
        if not layers:
            raise WeightsError("the file holds no LoRA layers", where=source,
                               fix="pass a LoRA .safetensors (keys ending in lora_down.weight or lora_A.weight)")
        fmt = "kohya" if all(k.startswith("lora_") for k in layers) else "peft"
        if lyco or whole:
            fmt = "lycoris"
        out = cls(layers, fmt, source)
        if control:
            stray = sorted(m for m in biases if m not in layers)
            if stray:
                raise WeightsError(f"{os.path.basename(source)}: {len(stray)} lora_B.bias tensors belong to no LoRA "
                                   f"layer of the file: {', '.join(stray[:4])}", where=source,
                                   fix="use the control LoRA as Black Forest Labs or diffusers saved it")
            out.control = FluxControl(control, sets, biases)
        return out

    def __repr__(self) -> str:
        ranks = sorted({layer.rank for layer in self.layers.values()})
        return f"Lora({len(self.layers)} layers, {self.format}, rank {ranks}, from {self.source})"


@dataclass
class LoraReport:
    """Which LoRA module went to which weight, and what matched nothing."""

    applied: dict[str, list[str]] = field(default_factory=dict)  # weight name -> lora keys
    unmatched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # other components (te keys when merging a unet)
    mismatched: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        s = f"{sum(len(v) for v in self.applied.values())} LoRA layers merged into {len(self.applied)} weights"
        if self.unmatched:
            s += f"; {len(self.unmatched)} match no weight: " + ", ".join(self.unmatched)
        if self.mismatched:
            s += f"; {len(self.mismatched)} do not fit: " + "; ".join(self.mismatched)
        if self.skipped:
            s += f"; {len(self.skipped)} belong to another component"
        return s


class MergedWeights(Weights):
    """Base weights with LoRAs merged in. ``merged_names``: the weights a LoRA changed; ``originals`` holds them as
    they were (empty when ``merge`` was told not to keep them)."""

    def __init__(self, base: Weights, merged: Mapping[str, np.ndarray], originals: Mapping[str, np.ndarray],
                 report: LoraReport) -> None:
        over = base.replaced(merged)
        super().__init__(over._refs, dtype=base.dtype, sources=base.sources)
        self.base = base
        self.merged_names = tuple(merged)
        self.originals = dict(originals)
        self.report = report

    def unmerge(self) -> Weights:
        """The base weights, from the kept originals: bit for bit what was there before merging."""
        if self.merged_names and not self.originals:
            raise WeightsError("these merged weights kept no originals to unmerge", where="MergedWeights.unmerge",
                               fix="merge with keep_originals=True (the default), or bind the base weights again")
        return self.base.replaced(self.originals)


def _module_index(names: Iterable[str], graph: Graph | None,
                  param: str = ".weight") -> tuple[dict[str, str], dict[str, str]]:
    """``(dotted module -> weight name, underscored module -> weight name)``; ``param=".bias"``: bias names."""
    dotted: dict[str, str] = {}
    for n in names:
        if n.endswith(param):
            dotted[n[: -len(param)]] = n
    if graph is not None:
        for node in graph.model.graph.node:
            if node.op_type in ("MatMul", "Gemm", "Conv") and len(node.input) > 1 and node.name.startswith("/"):
                parts = node.name.strip("/").split("/")
                module = ".".join(parts[:-1])
                if module and node.input[1] in names:
                    dotted.setdefault(module, node.input[1])
    flat = {k.replace(".", "_"): v for k, v in dotted.items()}
    return dotted, flat


def _transposed_names(graph: Graph | None) -> set[str]:
    """Weights stored [in, out]: the B input of MatMul, and of Gemm without transB."""
    if graph is None:
        return set()
    out = set()
    for node in graph.model.graph.node:
        if len(node.input) < 2:
            continue
        if node.op_type == "MatMul":
            out.add(node.input[1])
        elif node.op_type == "Gemm" and not any(a.name == "transB" and a.i for a in node.attribute):
            out.add(node.input[1])
    return out


def _target(key: str, fmt: str, component: str | None, dotted: dict[str, str], flat: dict[str, str],
            targets: Mapping[str, str]) -> str | None | bool:
    """The weight name for one LoRA key; None when nothing matches, False when skipped."""
    if key in targets:
        return targets[key]
    if key.startswith(("lora_", "lycoris_")):
        allowed = KOHYA_PREFIXES.get(component, ()) if component else tuple(p for v in KOHYA_PREFIXES.values()
                                                                             for p in v)
        for prefix in sorted({p for v in KOHYA_PREFIXES.values() for p in v}, key=len, reverse=True):
            if key.startswith(prefix):
                if prefix not in allowed:
                    return False
                rest = key[len(prefix):]
                return flat.get(rest) or dotted.get(rest)
        return None
    candidates = [key]
    for prefix in PEFT_PREFIXES:
        if key.startswith(prefix):
            candidates.append(key[len(prefix):])
    for c in candidates:
        if c in dotted:
            return dotted[c]
    return None


def merge(
    base: Weights | Graph,
    loras: Lora | Sequence[Lora | tuple[Lora, float]],
    *,
    graph: Graph | None = None,
    component: str | None = None,
    targets: Mapping[str, str] | None = None,
    strict: bool = True,
    keep_originals: bool = True,
) -> MergedWeights:
    """Merge one or several LoRAs (each ``(lora, scale)``, or a Lora for scale 1) into ``base``.

    ``base`` is a ``Weights`` or a ``Graph`` (its own initializers). ``graph``
    tells which weights are stored transposed and lets anonymous initializers
    be found through node names. ``component`` (``"unet"``, ``"te"``, ``"te1"``,
    ``"te2"``) keeps only that model's kohya keys; the others are listed as
    skipped. ``targets`` maps LoRA module keys to initializer names
    explicitly. With ``strict`` (default) a LoRA key that matches no weight, or
    whose delta does not fit its weight, raises ``WeightsError`` listing all of them. ``keep_originals``: copy
    each changed weight as it was, for ``unmerge`` (a pipeline, which binds its base weights again itself, passes
    False: the copies doubled the merge's memory, 1.2 GB for a rank-16 LoRA on SD 1.5's 232 attention layers).
    """
    if isinstance(base, Graph):
        graph = graph or base
        base = Weights.from_graph(base)
    pairs = [(item, 1.0) if isinstance(item, Lora) else (item[0], float(item[1]))
             for item in ([loras] if isinstance(loras, Lora) else loras)]
    names = set(base)
    dotted, flat = _module_index(names, graph)
    bias_index = _module_index(names, None, ".bias")
    transposed = _transposed_names(graph)
    report = LoraReport()
    deltas: dict[str, list[np.ndarray | _DoraStep]] = {}
    for lora, scale in pairs:
        for key, layer in lora.layers.items():
            bmod = bias_module(key) if isinstance(layer, DeltaLayer) else None
            if bmod is not None and key not in (targets or {}):  # LyCORIS's diff_b / b_norm: the module's bias
                name = _target(bmod, lora.format, component, *bias_index, {})
            else:
                name = _target(key, lora.format, component, dotted, flat, targets or {})
            if name is False:
                report.skipped.append(key)
                continue
            if name is None or name not in names:
                report.unmatched.append(f"{key} ({lora.source})")
                continue
            dora = getattr(layer, "dora", None)
            with np.errstate(all="ignore"):  # DoRA's LyCORIS convention: the change at strength 1, then interpolated
                raw = layer.delta(1.0 if dora is not None and dora.convention == "lycoris" else scale)
            if not np.isfinite(raw).all():
                report.mismatched.append(f"{key}: the LoRA holds NaN/Inf values or overflows float32")
                continue
            shape = tuple(base.ref(name).shape)
            fitted = _fit(raw, shape, name in transposed)
            if fitted is None:
                report.mismatched.append(f"{key}: delta {list(raw.shape)} vs {name} {list(shape)}")
                continue
            delta, flipped = fitted
            if dora is not None:
                torch_shape = delta.T.shape if flipped else delta.shape
                if dora.axis(int(torch_shape[0]), int(torch_shape[1])) is None:
                    report.mismatched.append(f"{key}: DoRA magnitude {list(np.shape(dora.magnitude))} fits neither "
                                             f"the output ({torch_shape[0]}) nor the input ({torch_shape[1]}) axis "
                                             f"of {name} {list(shape)}")
                    continue
                deltas.setdefault(name, []).append(_DoraStep(delta, flipped, dora, scale))
            else:
                deltas.setdefault(name, []).append(delta)
            report.applied.setdefault(name, []).append(key)
    if strict and (report.unmatched or report.mismatched):
        err = WeightsError(
            f"LoRA merge failed: {report}",
            where=", ".join(lora.source for lora, _ in pairs),
            fix="pass component='unet' or 'te' to skip other models' keys, map keys to initializer names "
            "with targets={lora_key: name}, or strict=False to merge what matches",
        )
        err.report = report  # type: ignore[attr-defined]
        raise err
    for msg in report.unmatched + report.mismatched:
        log.warning("LoRA key not merged: %s", msg)
    merged: dict[str, np.ndarray] = {}
    originals: dict[str, np.ndarray] = {}
    for name, ds in deltas.items():
        orig = base[name]
        if not (orig.dtype.kind == "f" or orig.dtype.name == "bfloat16"):
            report.mismatched.append(f"{name}: dtype {orig.dtype} cannot take a LoRA")
            continue
        acc = np.array(orig, dtype=np.float64 if orig.dtype == np.float64 else np.float32)
        for d in ds:  # in the order given: a DoRA layer rescales what the layers before it made
            if isinstance(d, _DoraStep):
                acc = d.apply(acc)
            else:
                acc += d
        if any(isinstance(d, _DoraStep) for d in ds) and not np.isfinite(acc).all():
            report.mismatched.append(f"{name}: DoRA made NaN/Inf values (a row or column of norm 0)")
            if strict:
                raise WeightsError(f"LoRA merge failed: {report.mismatched[-1]}",
                                   where=", ".join(lora.source for lora, _ in pairs),
                                   fix="the DoRA layer cannot be merged into this weight; remove that LoRA")
            continue
        if keep_originals:
            originals[name] = np.array(orig, copy=True)
        merged[name] = acc.astype(orig.dtype, copy=False)  # acc is this loop's own: no second copy
    log.info("%s", report)
    return MergedWeights(base, merged, originals, report)


@dataclass(frozen=True)
class _DoraStep:
    """One DoRA layer's merge into a weight: its change in the weight's layout (``flipped``: stored [in, out])."""

    delta: np.ndarray
    flipped: bool
    dora: Dora
    scale: float

    def apply(self, acc: np.ndarray) -> np.ndarray:
        w = np.asarray(acc.T if self.flipped else acc, np.float32)
        d = self.delta.T if self.flipped else self.delta
        strength = self.scale if self.dora.convention == "lycoris" else None
        out = self.dora.apply(w, d, strength).astype(acc.dtype)
        return np.ascontiguousarray(out.T) if self.flipped else out


def _fit(delta: np.ndarray, shape: tuple[int, ...], transposed: bool) -> tuple[np.ndarray, bool] | None:
    """The delta in the weight's layout and whether that is transposed from torch's, or None when it cannot fit."""
    if delta.ndim == 2 and len(shape) == 2:
        if transposed:
            return (delta.T, True) if delta.T.shape == shape else None
        if delta.shape == shape:
            return delta, False
        return (delta.T, True) if delta.T.shape == shape else None  # shape says it is stored [in, out]
    if delta.shape == shape:
        return delta, False
    if delta.ndim == 2 and len(shape) == 4 and delta.shape == (shape[0], int(np.prod(shape[1:]))):
        return delta.reshape(shape), False  # LoHa on a kxk conv: [out, in * kh * kw]
    if delta.size == int(np.prod(shape)) and (len(shape) == 4 and shape[2:] == (1, 1) or delta.ndim == 4
                                             and delta.shape[2:] == (1, 1)):
        return delta.reshape(shape), False  # a linear LoRA on a 1x1 conv, or the other way round
    if delta.ndim == 1 and delta.size == int(np.prod(shape)) and sum(n != 1 for n in shape) <= 1:
        return delta.reshape(shape), False  # a norm's vector kept [C, 1, 1] for a GroupNorm's Mul / Add
    return None


__all__ = ["BIAS_KEYS", "KOHYA_PREFIXES", "bias_module", "PEFT_PREFIXES", "Dora", "Lora", "LoraLayer", "LoraReport", "LycorisLayer", "DeltaLayer", "FluxControl", "MergedWeights",
           "merge"]
