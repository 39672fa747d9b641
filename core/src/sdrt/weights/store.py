"""``Weights``: named tensors from ``.safetensors`` files, opened lazily with mmap.

``Weights.open(path_or_paths, mapping=...)`` reads only the JSON headers.
``w[name]`` returns a read-only ``np.memmap``-backed array: the operating
system pages bytes in when they are touched, and nothing is copied into the
process's memory. (We parse the safetensors header ourselves, ``stfile``,
instead of using the ``safetensors`` package, whose numpy API reads each
tensor into a fresh array.)

dtypes: float32, float16, bfloat16 (and float64, float8, integer and bool)
are supported. numpy has no bfloat16, so a bf16 tensor is returned with the
``ml_dtypes.bfloat16`` dtype (installed with onnx; zero-copy, exact, and
``.astype(np.float32)`` upcasts it). ``Weights.open(..., dtype="float32")``
or ``weights.astype("float16")`` convert every floating tensor on access.

PyTorch checkpoints (``.ckpt``, ``.pt``, ``.pth``, ``.bin``, or a torch zip/pickle under any name) are read
by ``torchfile`` without torch and without running anything from the file: its tensors (a ``state_dict``'s
when it has one, nested dicts joined with ``.``) are mapped from the file like a safetensors file's.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import stamps
from ..errors import WeightsError
from ..formats import PICKLE_HINT, sniff
from ..stamps import Stamp, file_stamp
from ..tensors import TensorInfo
from . import bnb, comfyquant, keymap, stfile, torchfile
from .keymap import KeyMap

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph

log = logging.getLogger("sdrt.weights")

#: PyTorch checkpoint suffixes, read by ``torchfile`` (a zip or pickle under another name is sniffed too)
PICKLE_SUFFIXES = set(torchfile.SUFFIXES)
#: what to do about a pickle that holds more than tensors and plain containers
CONVERT_HINT = torchfile.UNTRUSTED_FIX

PathLike = str | os.PathLike[str]
#: readers of other file formats by suffix (``sdrt.weights`` registers ``.gguf``: ``weights.gguf.open_gguf``)
OPENERS: dict[str, Callable[..., Weights]] = {}


@dataclass(frozen=True)
class TensorRef:
    """One named tensor and how to get it, without reading it."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    source: str
    load: Callable[[], np.ndarray] = field(repr=False, compare=False)
    #: where the bytes are when they are in a file: ``(path, byte offset, byte length)``, and optionally a
    #: fourth item saying how the array is derived from those bytes (a checkpoint's transpose, say); None
    #: for arrays in memory. The compile cache keys a file's tensors by this, without reading them.
    origin: tuple[Any, ...] | None = None
    #: for a tensor stored in a ggml block type (a GGUF file's Q8_0, Q4_K...) and bound where those blocks serve
    #: as they are: the reader of its ``BlockMatrix`` (``sdrt.weights.blocks``), which a backend that runs the
    #: type (``Backend.weight_blocks``) receives instead of the float32 array ``load`` makes
    blocks: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    #: how the file stores a tensor that ``load`` decodes into ``dtype`` (``"nf4"``, ``"fp4"``: bitsandbytes 4-bit,
    #: ``sdrt.weights.bnb``); None when the file holds ``dtype`` itself
    stored: str | None = None
    #: reads rows ``lo:hi`` (of the first axis) alone, when that is cheaper than the whole tensor (a bitsandbytes
    #: 4-bit weight decodes only their blocks): a fused qkv's thirds, Flux's ``linear1`` split
    rows: Callable[[int, int], np.ndarray] | None = field(default=None, repr=False, compare=False)


def _float_kind(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _convert(arr: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    if dtype is None or arr.dtype == dtype or not _float_kind(arr.dtype):
        return arr
    return arr.astype(dtype)


def _as_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    name = getattr(dtype, "name", None) or str(dtype)
    ml = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
    try:
        return stfile.st_dtype(ml[name]) if name in ml else np.dtype(dtype)
    except (TypeError, KeyError) as exc:
        raise WeightsError(f"unknown dtype {dtype!r}", where="Weights dtype",
                           fix="use float32, float16 or bfloat16") from exc


@dataclass
class BindReport:
    """What fits and what does not when binding weights to a graph."""

    graph: str
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def problems(self) -> int:
        return len(self.missing) + len(self.unexpected) + len(self.mismatched)

    def __str__(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing (in the graph, not in the weights): " + ", ".join(self.missing))
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected (in the weights, not in the graph): "
                         + ", ".join(self.unexpected))
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} mismatched: " + "; ".join(self.mismatched))
        return "; ".join(parts) or "all weights fit"


class Weights(Mapping[str, np.ndarray]):
    """Named tensors, read on access. Build with ``open``, ``from_arrays`` or ``from_graph``."""

    def __init__(self, refs: Mapping[str, TensorRef], *, dtype: Any = None, sources: Iterable[Path] = (),
                 file_metadata: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self._refs = dict(refs)
        self.dtype = _as_dtype(dtype)
        self.sources = list(sources)
        #: each safetensors file's ``__metadata__`` as ``open`` read it, by path (PyTorch files have none)
        self.file_metadata: dict[str, dict[str, str]] = {k: dict(v) for k, v in (file_metadata or {}).items()}

    # -- construction ----------------------------------------------------
    @classmethod
    def open(cls, paths: PathLike | Iterable[PathLike], mapping: keymap.MappingLike = None, *,
             dtype: Any = None) -> Weights:
        """Open one or several ``.safetensors`` files or PyTorch checkpoints (or a folder of them) lazily.

        ``mapping`` renames checkpoint keys to initializer names: a
        ``KeyMap``, a dict (explicit map) or a callable. A single ``.gguf`` file opens as
        ``GGUFWeights`` (``sdrt.weights.gguf``).
        """
        if isinstance(paths, (str, os.PathLike)) and str(paths).lower().endswith(".gguf") and ".gguf" in OPENERS:
            return OPENERS[".gguf"](paths, mapping)
        files = _expand(paths)
        raw: dict[str, TensorRef] = {}
        dups: list[str] = []
        headers: dict[str, dict[str, str]] = {}
        for path in files:
            stamp = file_stamp(path)
            if is_torch_file(path):
                found = {name: TensorRef(name, dt, shape, str(path), _checked(path, stamp, load), origin)
                         for name, (dt, shape, load, origin) in torchfile.open_tensors(path).items()}
            else:
                entries, headers[str(path)] = stfile.read_header(path)
                found = {name: TensorRef(name, e.dtype, e.shape, str(path), _checked(path, stamp, _mapper(path, e)),
                                         (str(path), e.begin, e.length)) for name, e in entries.items()}
            stamps.check(path, stamp, "while its header was read")
            for name, ref in found.items():
                if name in raw:
                    dups.append(f"{name!r} ({raw[name].source} and {path})")
                raw[name] = ref
        if dups:
            raise WeightsError(f"the same tensor name is in several files: {', '.join(dups)}",
                               where="{@weights}", fix="give each tensor in one file only: drop one of the files "
                               "that hold it (a file given twice, or two exports of one part)")
        raw = comfyquant.fold(raw, headers)  # ComfyUI's per-layer fp8/int8 (X.comfy_quant, X.weight_scale)
        raw = _fold_fp8_scales(raw)
        raw, packed = bnb.fold(raw)  # bitsandbytes NF4/FP4 weights: each read as its bf16/fp16 values
        if packed:
            log.info("%s: %s bitsandbytes weights, dequantized when read", ", ".join(p.name for p in files),
                     ", ".join(f"{n} {kind}" for kind, n in sorted(packed.items())))
        log.debug("opened %d tensors from %d files", len(raw), len(files))
        return cls(_remap(raw, mapping, "Weights.open"), dtype=dtype, sources=files, file_metadata=headers)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], mapping: keymap.MappingLike = None, *,
                    source: str = "<memory>", dtype: Any = None) -> Weights:
        refs = {}
        for name, value in arrays.items():
            arr = np.asarray(value)
            refs[name] = TensorRef(name, arr.dtype, tuple(arr.shape), source, (lambda a=arr: a))
        return cls(_remap(refs, mapping, source), dtype=dtype)

    @classmethod
    def from_graph(cls, graph: Graph) -> Weights:
        """The graph's own initializers (external ones mapped lazily, not copied)."""
        infos = graph.initializer_info()
        refs = {}
        for t in graph.model.graph.initializer:
            info = infos[t.name]
            ext = graph.external_refs.get(t.name)
            origin = (str(ext.path), ext.offset, ext.length) if ext is not None else None
            refs[t.name] = TensorRef(t.name, _as_dtype(info.dtype), tuple(int(d) for d in t.dims), graph.name,
                                     (lambda t=t: graph.tensor_array(t)), origin)
        return cls(refs)

    # -- access ------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        ref = self._refs.get(name)
        if ref is None:
            raise KeyError(name)
        return _convert(ref.load(), self.dtype)

    def get_array(self, name: str, dtype: Any = None) -> np.ndarray:
        """``w[name]``, converted to ``dtype`` when given (floating tensors only)."""
        if name not in self._refs:
            raise WeightsError(f"no tensor named {name!r}", where=self._where(), fix="see weights.keys()")
        return _convert(self[name], _as_dtype(dtype))

    def rows(self, name: str, lo: int, hi: int) -> np.ndarray | None:
        """Rows ``lo:hi`` of tensor ``name`` read alone, when its reader can (``TensorRef.rows``: a bitsandbytes
        4-bit weight decodes only their blocks); None when it cannot (then ``self[name][lo:hi]`` is the way)."""
        ref = self._refs[name]
        return None if ref.rows is None else _convert(ref.rows(lo, hi), self.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, name: object) -> bool:
        return name in self._refs

    def info(self, name: str) -> TensorInfo:
        ref = self._refs[name]
        dt = self.dtype if self.dtype is not None and _float_kind(ref.dtype) else ref.dtype
        return TensorInfo(name, dt.name, ref.shape)

    def ref(self, name: str) -> TensorRef:
        return self._refs[name]

    def blocks(self, name: str) -> Any:
        """Tensor ``name`` as a ``BlockMatrix`` (its stored ggml blocks, not decoded) when it has one, else None."""
        ref = self._refs[name]
        return ref.blocks() if ref.blocks is not None else None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of every tensor, from the headers (nothing is read)."""
        return {name: tuple(int(d) for d in self.ref(name).shape) for name in self}

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(r.shape)) * r.dtype.itemsize for r in self._refs.values())

    def _where(self) -> str:
        return ", ".join(str(s) for s in self.sources) or "<weights>"

    # -- derived weights ----------------------------------------------------
    def astype(self, dtype: Any) -> Weights:
        """The same tensors, floating ones converted to ``dtype`` on access."""
        return Weights(self._refs, dtype=dtype, sources=self.sources)

    def renamed(self, mapping: keymap.MappingLike) -> Weights:
        return Weights(_remap(self._refs, mapping, self._where()), dtype=self.dtype, sources=self.sources)

    def replaced(self, arrays: Mapping[str, np.ndarray]) -> Weights:
        """A copy where the named tensors are replaced (or added) by ``arrays``."""
        refs = dict(self._refs)
        for name, value in arrays.items():
            arr = np.asarray(value)
            refs[name] = TensorRef(name, arr.dtype, tuple(arr.shape), "<replaced>", (lambda a=arr: a))
        return Weights(refs, dtype=self.dtype, sources=self.sources)

    def overlaid(self, other: Weights) -> Weights:
        """A copy where ``other``'s tensors replace (or add to) these, read when used as ``other`` reads them
        (a checkpoint's tensors stay in its file, a GGUF tensor keeps its blocks)."""
        if other.dtype is not None and other.dtype != self.dtype:
            return self.replaced({name: other[name] for name in other})
        refs = dict(self._refs)
        refs.update({name: other.ref(name) for name in other})
        return Weights(refs, dtype=self.dtype, sources=self.sources)

    def save(self, path: PathLike, metadata: Mapping[str, str] | None = None) -> Path:
        """Write every tensor to one ``.safetensors`` file (streamed tensor by tensor)."""
        stfile.write(path, ((name, self[name]) for name in self), metadata)
        return Path(path)

    # -- binding ------------------------------------------------------------
    def check(self, graph: Graph, *, convert: bool = False) -> BindReport:
        """Compare these weights with the graph's initializers; raise nothing."""
        infos = graph.initializer_info()
        rec = graph.folded_initializers()
        derived, consumed = set(rec["added"]), set(rec["removed"])
        report = BindReport(graph.name)
        report.missing = [n for n in infos if n not in self._refs and n not in derived]
        report.unexpected = [k for k in self._refs if k not in infos and k not in consumed]
        for name, want in infos.items():
            if name not in self._refs:
                continue
            have = self.info(name)
            same_dtype = have.dtype == want.dtype or (
                convert and _float_kind(self._refs[name].dtype) and _is_float_name(want.dtype))
            if tuple(have.shape) != tuple(want.shape) or not same_dtype:
                report.mismatched.append(
                    f"{name}: weights {have.dtype}{list(have.shape)} vs graph {want.dtype}{list(want.shape)}")
        return report

    def fits(self, graph: Graph, *, strict: bool = True, convert: bool = False) -> None:
        """What ``bind`` refuses (every missing, unexpected or mismatched tensor, one ``WeightsError``), checked
        from names, dtypes and shapes alone: nothing is read."""
        report = self.check(graph, convert=convert)
        if not strict:
            report.unexpected = []
            report.missing = [n for n in report.missing if not graph.has_data(n)]
        if not report.ok:
            err = WeightsError(
                f"the weights do not fit graph {graph.name}: {report}",
                where=f"{self._where()} -> {graph.name}",
                fix="map checkpoint keys to initializer names with Weights.open(..., mapping=KeyMap(...)); "
                "pass convert=True for dtype differences; see docs/graphs-and-weights.md",
            )
            err.report = report  # type: ignore[attr-defined]
            raise err

    def bind(self, graph: Graph | None, *, strict: bool = True, convert: bool = False,
             blocks: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """``{initializer name: array}`` for the graph, or a ``WeightsError`` listing every problem.

        ``blocks``: ggml block types (``"Q8_0"``, ``"Q4_K"``...) the caller runs as they are stored: a tensor
        that has a ``BlockMatrix`` of one of them (``TensorRef.blocks``) is given as that, not decoded.

        ``strict=False`` tolerates unexpected keys (ignored) and missing names
        for which the graph holds its own data. ``convert=True`` converts
        floating tensors to the graph's dtype instead of reporting a mismatch.
        ``graph=None`` checks nothing and returns every tensor by name.
        """
        if graph is None:
            return {name: self[name] for name in self._refs}
        self.fits(graph, strict=strict, convert=convert)
        infos = graph.initializer_info()
        keep = frozenset(blocks)
        out: dict[str, np.ndarray] = {}
        kept: dict[str, int] = {}
        decoded: dict[str, int] = {}
        for name, want in infos.items():
            if name in self._refs:
                ref = self._refs[name]
                if ref.blocks is not None and want.dtype == "float32" and self.dtype in (None, np.float32):
                    bm = ref.blocks()
                    if bm.ggml_type in keep:
                        out[name] = bm
                        kept[bm.ggml_type] = kept.get(bm.ggml_type, 0) + 1
                        continue
                    decoded[bm.ggml_type] = decoded.get(bm.ggml_type, 0) + 1
                arr = self[name]
                out[name] = _convert(arr, _as_dtype(want.dtype)) if convert else arr
        if kept or decoded:
            log.info("%s: matmul weights in ggml block types: %s", graph.name, "; ".join(
                [f"{n} {t} kept as blocks" for t, n in sorted(kept.items())]
                + [f"{n} {t} dequantized to float32" for t, n in sorted(decoded.items())]))
        return out

    def __repr__(self) -> str:
        return f"Weights({len(self)} tensors, {self.nbytes / 2**20:.1f} MiB, from {self._where()})"


def _fold_fp8_scales(raw: dict[str, TensorRef]) -> dict[str, TensorRef]:
    """ComfyUI's "scaled fp8" files (``t5xxl_fp8_e4m3fn_scaled``, ``*_fp8_scaled`` checkpoints): each
    ``X.weight`` stored as fp8 with a ``X.scale_weight`` beside it is ``weight * scale_weight`` (a scalar, or
    one value per output row), as ComfyUI dequantizes it; the ``scaled_fp8`` marker and the ``scale_input``
    tensors (used only by fp8 matmuls) are dropped. A weight read without its scale would be garbage."""
    scales = [n for n in raw if n.endswith(".scale_weight")]
    if not scales and not any(n.rsplit(".", 1)[-1] == "scaled_fp8" for n in raw):
        return raw
    out = dict(raw)
    for sname in scales:
        wname = sname[: -len("scale_weight")] + "weight"
        w, sref = raw.get(wname), raw[sname]
        n = math.prod(sref.shape)
        if w is None or not (n == 1 or (w.shape and n == w.shape[0])):
            raise WeightsError(f"{sname} has shape {list(sref.shape)} and {wname} "
                               f"{'is missing' if w is None else list(w.shape)}: not a scaled-fp8 pair",
                               where=sref.source, fix="re-download the file, or use its fp16/bf16 version")

        def load(w: TensorRef = w, sref: TensorRef = sref) -> np.ndarray:
            a = np.asarray(w.load()).astype(np.float32)
            sc = np.asarray(sref.load()).astype(np.float32)
            return a * (sc.reshape(()) if sc.size == 1 else sc.reshape((-1,) + (1,) * (a.ndim - 1)))

        origin = None if w.origin is None else (*w.origin[:3], f"x {sname}")
        out[wname] = TensorRef(wname, np.dtype(np.float32), w.shape, w.source, load, origin)
        del out[sname]
    for n in list(out):
        if n.rsplit(".", 1)[-1] in ("scaled_fp8", "scale_input"):
            del out[n]
    return out


def _is_float_name(name: str) -> bool:
    return name.startswith("float") or name == "bfloat16"


def _mapper(path: Path, entry: stfile.Entry) -> Callable[[], np.ndarray]:
    return lambda: stfile.map_entry(path, entry)


def _checked(path: Path, stamp: Stamp | None, load: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """``load``, refused once the file is another version than the one whose header gave its offsets (a VAE or
    checkpoint replaced in place while a pipeline holds its tensors unread: they read half old, half new); the
    mapped array is marked with that version (``stamps.mark``), so a session holding it checks it before reading
    it again."""

    def read() -> np.ndarray:
        stamps.check(path, stamp, "since it was opened")
        return stamps.mark(load(), path, stamp)

    return read


def _remap(refs: Mapping[str, TensorRef], mapping: keymap.MappingLike, where: str) -> dict[str, TensorRef]:
    if mapping is None:
        return dict(refs)
    targets = keymap.apply(refs, mapping, where)
    return {t: TensorRef(t, refs[k].dtype, refs[k].shape, refs[k].source, refs[k].load, refs[k].origin,
                         refs[k].blocks, refs[k].stored, refs[k].rows) for t, k in targets.items()}


def _expand(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise WeightsError("no weights files given", where="Weights.open", fix="pass a .safetensors path")
    files: list[Path] = []
    for item in items:
        p = Path(item)
        try:
            p.is_dir() and p.is_file()
        except OSError as exc:  # name too long, permission denied on a parent
            raise WeightsError(f"cannot access the weights path ({exc.strerror or exc})", where=str(p)[:300],
                               fix="check the path") from exc
        if p.is_dir():
            found = folder_files(p)
            if not found:
                raise WeightsError("the folder holds no .safetensors files (nor PyTorch checkpoints)", where=str(p),
                                   fix="pass the .safetensors file(s) directly")
            files.extend(found)
            continue
        refuse_unsafe(p)
        if not p.is_file():
            raise WeightsError("the weights file does not exist", where=str(p), fix="check the path")
        files.append(p)
    return files


#: what a training run saves beside the weights (transformers' Trainer, accelerate's save_state): pickles of arguments,
#: optimizer, scheduler, data-loader sampler and random states, never weights, each of which would refuse the folder
#: (they name classes torchfile does not take); accelerate numbers the second and later ones (optimizer_1.bin,
#: sampler_1.bin) and writes register_for_checkpointing's objects as custom_checkpoint_0.pkl
TRAINING_STATE = re.compile(r"(training_args|(optimizer|scheduler|sampler|scaler)(_\d+)?|rng_state.*|random_states.*"
                            r"|custom_checkpoint_\d+)\.[a-z]+", re.IGNORECASE)


def folder_files(folder: Path) -> list[Path]:
    """A folder's weights files: its ``.safetensors``, else its PyTorch checkpoints (a diffusers or transformers
    folder of ``diffusion_pytorch_model.bin`` / ``pytorch_model.bin``, not a training run's ``training_args.bin`` or
    ``optimizer.pt``), sorted; [] when none or not a folder."""
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.safetensors")) or sorted(
        f for f in folder.iterdir()
        if f.suffix.lower() in PICKLE_SUFFIXES and not TRAINING_STATE.fullmatch(f.name) and f.is_file())


def _head(p: Path) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(16)
    except OSError as exc:
        raise WeightsError(f"cannot read the file ({exc.strerror or exc})", where=str(p),
                           fix="check permissions") from exc


def is_torch_file(p: Path) -> bool:
    """Whether ``Weights.open`` reads ``p`` as a PyTorch checkpoint: by its suffix (unless its bytes are a
    safetensors header), or by its bytes (a zip or a pickle) whatever its name."""
    kind = sniff(_head(p)) if p.is_file() else None
    return kind == PICKLE_HINT or (p.suffix.lower() in PICKLE_SUFFIXES and kind != "a safetensors weights file")


def refuse_unsafe(p: Path) -> None:
    """Refuse what ``Weights.open`` cannot read as weights: an ONNX graph. (PyTorch pickles are read by
    ``torchfile``, which refuses any that would run code; the name stays for callers.)"""
    if not p.is_file():
        return
    _head(p)
    if p.suffix.lower() == ".onnx":
        raise WeightsError("this is an ONNX graph, not a weights file", where=str(p),
                           fix="pass it as the model; weights come from .safetensors files")


__all__ = ["BindReport", "KeyMap", "TensorRef", "Weights", "file_stamp", "folder_files", "is_torch_file",
           "refuse_unsafe"]
