"""Rebinding the weights of a compiled model without compiling it again: OpenVINO's weightless blobs.

OpenVINO's CPU plugin has no call that replaces the constants of a compiled model,
and its compile is mostly graph transformations and kernel generation that do not
depend on the weights' values. What it has is a *weightless* export
(``CACHE_MODE=OPTIMIZE_SIZE``): the blob keeps the transformed graph and refers to
each constant that came unchanged from an IR weights file by its offset there.
Importing that blob with another weights file of the same layout (``WEIGHTS_PATH``)
rebuilds the runtime graph with the new values and skips the transformations: about
half the time of a compile, and the outputs are those of a fresh compile with the
same weights (tested bit for bit).

``build`` makes a session swappable, once (at its first ``update_weights``):

1. the graph is converted with every float initializer as an input; the weights that
   a transformation could fold into a new constant stay inputs (``Parameter``s) that
   the session feeds once per infer request: vectors (biases, norm scales, at most one
   dimension above 1, which the frontend reshapes) and weights whose consumer has no
   input other than constants and weights (a ``Gather`` of position ids, a ``Concat``
   of weights). A folded constant would lose its weights-file offset and be baked into
   the blob with the old values;
2. the other weights become ``Constant``s, the model is saved as IR (``ov.serialize``)
   and read back, which gives every constant its offset in the ``.bin``;
3. the model is compiled and exported weightless. A blob that still holds the bytes of
   one of those weights (a transformation copied it) is refused: the session keeps
   compiling on every swap instead.

``Rebinder.compile`` then writes a new ``.bin`` (the weights at their offsets, the graph's
other constants as they were) to a RAM-backed temporary folder where there is one
(``/dev/shm``) and imports the blob with it. The file is removed right after: OpenVINO
has its own copy (or mapping) by then.

The swappable form holds no weight, so it is kept in the compile cache across processes
(``Store``): keyed by the graph, the initializers' names, dtypes and shapes, the values of
the non-float ones (baked in), the device, OpenVINO's version and the compile properties, never
by the float weights' values. A hit imports the stored blob with the weights of the call, as
every later swap does (``obtain``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sdrt.weights.pages import release as release_pages

from . import convert

if TYPE_CHECKING:  # pragma: no cover
    import openvino as ov

    from sdrt.cache import CompileCache
    from sdrt.graph import Graph

log = logging.getLogger("sdrt.openvino.swap")

#: compile and import properties of a weightless blob
_WEIGHTLESS_PROPS = {"CACHE_MODE": "OPTIMIZE_SIZE"}
#: how many leading bytes of each weight are looked for in the exported blob
_PROBE_BYTES = 64
_MIN_PROBE = 8
#: ops whose inputs after the first set output shapes (Interpolate scales, Reshape shape...): a float
#: weight read there stays a constant baked into the blob, and a new value compiles again
_SHAPE_OPS = {"Interpolate", "Reshape", "Broadcast", "Tile", "Pad", "Slice", "StridedSlice", "Range", "TopK",
              "Squeeze", "Unsqueeze", "Split", "VariadicSplit"}
#: dtypes a weight fed as an input may have (others, like bfloat16, make the session recompile instead)
_INPUT_DTYPES = {"float16", "float32", "float64"}
#: devices whose plugin imports weightless blobs with WEIGHTS_PATH (tested)
SUPPORTED_DEVICES = ("CPU",)
#: bump to orphan every stored swappable form (``Store``)
FORMAT = "1"
#: the files of a stored swappable form: the weightless blob, the graph's other constants, the layout
BLOB, EXTRAS, LAYOUT = "weightless.blob", "extras.bin", "swap.json"


class NotSwappable(Exception):
    """This graph or device cannot be rebound through a weightless blob (the caller recompiles instead)."""


@dataclass
class Rebinder:
    """A weightless blob and the layout of the weights file it expects."""

    blob: bytes
    device_id: str
    props: dict[str, Any]
    #: weight name -> (offset, byte size, numpy dtype of the bytes) in the weights file
    layout: dict[str, tuple[int, int, np.dtype[Any]]]
    #: the graph's other constants (shapes, axes, non-initializer data): (offset, bytes)
    extras: list[tuple[int, bytes]]
    size: int
    #: weights fed to the compiled model as inputs, with the dtype the graph declares
    inputs: dict[str, np.dtype[Any]] = field(default_factory=dict)
    #: non-float initializers (shapes, axes, indices), baked into the blob with these values
    fixed: dict[str, np.ndarray] = field(default_factory=dict)

    def fits(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Whether the blob can take ``arrays``: its baked shape and index initializers are unchanged."""
        for name, value in self.fixed.items():
            new = np.asarray(arrays.get(name, value))
            if new.shape != value.shape or not np.array_equal(new, value):
                return False
        return True

    def input_arrays(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The weights fed as inputs: C-contiguous and writable (OpenVINO shares their memory)."""
        out = {}
        for name, dtype in self.inputs.items():
            arr = np.asarray(arrays[name])
            if arr.dtype != dtype and arr.dtype.kind != "V":
                arr = arr.astype(dtype)
            if not (arr.flags.c_contiguous and arr.flags.writeable):
                arr = np.array(arr, order="C")
            out[name] = arr
        return out

    def compile(self, core: ov.Core, arrays: Mapping[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
        """The compiled model with ``arrays`` as its weights: the blob imported with a new weights file.

        Also returns each weight of the file as a read-only view of its mapping: OpenVINO's constants
        keep that mapping, so a session that holds these views instead of ``arrays`` holds the
        weights once.
        """
        start = time.perf_counter()
        fd, path = tempfile.mkstemp(prefix="sdrt-ov-", suffix=".bin", dir=_ram_dir())
        try:
            with os.fdopen(fd, "wb") as f:
                f.truncate(self.size)
                for offset, data in self.extras:
                    f.seek(offset)
                    f.write(data)
                for name, (offset, nbytes, dtype) in self.layout.items():
                    raw = _raw(arrays[name], dtype)
                    if raw.nbytes != nbytes:
                        raise NotSwappable(f"weight {name!r} has {raw.nbytes} bytes, the compiled model {nbytes}")
                    f.seek(offset)
                    f.write(memoryview(raw).cast("B"))
                    release_pages([arrays[name]])  # a mapped weight's pages read for the file leave the RSS
            written = time.perf_counter()
            compiled = core.import_model(self.blob, self.device_id, {**self.props, **_WEIGHTLESS_PROPS,
                                                                     "WEIGHTS_PATH": path})
            views = _views(path, self.layout, arrays)
        finally:
            _remove(path)
        log.debug("weights file %.3f s, import %.3f s", written - start, time.perf_counter() - written)
        return compiled, views

    def write(self, folder: Path) -> None:
        """Write this swappable form into ``folder`` (a compile cache entry): the blob, the bytes of the graph's
        other constants, and the layout, with a digest of each value baked into the blob (``fixed``)."""
        (folder / BLOB).write_bytes(self.blob)
        spans = []
        with open(folder / EXTRAS, "wb") as f:
            for offset, data in self.extras:
                f.write(data)
                spans.append([offset, len(data)])
        layout = {"size": self.size, "extras": spans,
                  "weights": {k: [o, n, d.name] for k, (o, n, d) in self.layout.items()},
                  "inputs": {k: d.name for k, d in self.inputs.items()},
                  "fixed": {k: _digest(v) for k, v in self.fixed.items()}}
        (folder / LAYOUT).write_text(json.dumps(layout, sort_keys=True))

    @classmethod
    def read(cls, folder: Path, arrays: Mapping[str, np.ndarray], device_id: str,
             props: Mapping[str, Any]) -> Rebinder | None:
        """The swappable form ``write`` put in ``folder``, for ``arrays``; None when a value baked into its blob
        (a float weight that sets a shape) differs from ``arrays``'. Raises ``ValueError`` for an entry that does
        not fit the graph (other initializers, sizes that disagree)."""
        data = json.loads((folder / LAYOUT).read_text())
        layout = {k: (int(o), int(n), _dtype(d)) for k, (o, n, d) in data["weights"].items()}
        inputs = {k: _dtype(d) for k, d in data["inputs"].items()}
        if set(layout) | set(inputs) | set(data["fixed"]) != set(arrays) or set(layout) & set(inputs):
            raise ValueError("its weights are not the graph's initializers")
        for k, (offset, nbytes, dtype) in layout.items():
            arr = arrays[k]
            if nbytes != int(np.prod(np.shape(arr), dtype=np.int64)) * dtype.itemsize or offset + nbytes > data["size"]:
                raise ValueError(f"weight {k!r} does not fit its place in the weights file")
        fixed = {k: np.array(arrays[k]) for k in data["fixed"]}
        changed = [k for k, v in fixed.items() if _digest(v) != data["fixed"][k]]
        if changed:
            log.info("the stored swappable form has other values baked in (%s): compiling it again", changed[0])
            return None
        extras, raw = [], (folder / EXTRAS).read_bytes()
        at = 0
        for offset, length in data["extras"]:
            if at + length > len(raw) or offset + length > data["size"]:
                raise ValueError("its constants do not fit the weights file")
            extras.append((int(offset), raw[at:at + length]))
            at += length
        if at != len(raw):
            raise ValueError("its constants file has bytes no constant takes")
        return cls((folder / BLOB).read_bytes(), device_id, dict(props), layout, extras, int(data["size"]), inputs,
                   fixed)

    @property
    def weight_bytes(self) -> int:
        """The bytes of the weights the blob takes from the weights file (those it does not hold)."""
        return sum(n for _, n, _ in self.layout.values())


class Store:
    """Where swappable forms are kept across processes: entries of the compile cache whose key is the graph,
    the device, OpenVINO's version and the compile properties (``key_of``) and the values baked into the blob
    (non-float initializers), not the float weights, which every import binds anew."""

    def __init__(self, cache: CompileCache, key_of: Callable[[Mapping[str, Any], Mapping[str, np.ndarray]], str],
                 meta: Mapping[str, Any]) -> None:
        self.cache = cache
        self._key_of = key_of
        self._meta = dict(meta)

    def load(self, arrays: Mapping[str, np.ndarray], device_id: str, props: Mapping[str, Any]) -> Rebinder | None:
        """The stored swappable form for ``arrays``, or None (a miss; an unreadable entry is discarded). None at
        once for weights mostly non-float (int8 weights, baked in): such a form is not stored (``save``), and its
        key would hash them all."""
        if _baked_bytes(arrays) > sum(np.asarray(a).nbytes for a in arrays.values()) // 2:
            return None
        key = self._key_of(props, arrays)
        entry = self.cache.lookup(key)
        if entry is None:
            return None
        try:
            return Rebinder.read(entry.path, arrays, device_id, props)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.cache.discard(key, f"its swappable form is unreadable: {exc}")
            return None

    def discard(self, arrays: Mapping[str, np.ndarray], props: Mapping[str, Any], reason: str) -> None:
        self.cache.discard(self._key_of(props, arrays), reason)

    def save(self, rebinder: Rebinder, arrays: Mapping[str, np.ndarray], props: Mapping[str, Any]) -> None:
        """Store ``rebinder`` (replacing an entry whose baked values differ). The blob holds no weight (``build``
        refuses one that does); the graph's other constants it needs are stored beside it, and when those are more
        bytes than the weights it binds from the file (int8 weights, which stay constants), it is not stored: the
        cache is to stay no larger than the model it holds, and the model's own compiled entry holds them already."""
        extras = sum(len(d) for _, d in rebinder.extras)
        if extras > rebinder.weight_bytes or _baked_bytes(arrays) > sum(np.asarray(a).nbytes
                                                                        for a in arrays.values()) // 2:
            log.info("not caching the swappable form: it would hold %d bytes of constants against %d of weights",
                     extras, rebinder.weight_bytes)
            return
        self.cache.store(self._key_of(props, arrays), rebinder.write, {**self._meta, "form": "swappable"},
                         replace=True)


def obtain(core: ov.Core, graph: Graph, arrays: Mapping[str, np.ndarray], device_id: str, props: Mapping[str, Any],
           store: Store | None) -> tuple[Any, Rebinder, dict[str, np.ndarray], bool]:
    """The swappable form with ``arrays`` bound: imported from ``store`` when it holds it, else compiled
    (``build``) and stored. Returns what ``build`` does and whether it came from the store. Raises
    ``NotSwappable`` as ``build`` does."""
    stored = store.load(arrays, device_id, props) if store is not None else None
    if stored is not None:
        try:
            compiled, views = stored.compile(core, arrays)
            return compiled, stored, views, True
        except (RuntimeError, NotSwappable) as exc:  # a blob OpenVINO refuses: rebuilt below
            assert store is not None
            store.discard(arrays, props, f"OpenVINO could not import its swappable form ({exc})")
    compiled, rebinder, views = build(core, graph, arrays, device_id, props)
    if store is not None:
        store.save(rebinder, arrays, props)
    return compiled, rebinder, views, False


def key_values(arrays: Mapping[str, np.ndarray]) -> str:
    """A digest of the values a swappable form bakes in whatever the weights: every non-float initializer."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        if arr.dtype.kind in "iub":
            h.update(f"{name}|{_digest(arr)}|".encode())
    return h.hexdigest()


def _baked_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """The bytes of the non-float initializers, which a swappable form bakes in (``key_values``)."""
    return sum(np.asarray(a).nbytes for a in arrays.values() if np.asarray(a).dtype.kind in "iub")


def _digest(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr)
    h = hashlib.sha256(f"{a.dtype.name}|{a.shape}|".encode())
    h.update(a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _dtype(name: str) -> np.dtype[Any]:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16, float8: ml_dtypes' names
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def build(core: ov.Core, graph: Graph, arrays: Mapping[str, np.ndarray], device_id: str,
          props: Mapping[str, Any]) -> tuple[Any, Rebinder, dict[str, np.ndarray]]:
    """Compile ``graph`` with ``arrays`` in the swappable form; return the compiled model, its rebinder
    and the weights read back from the weights file (see ``Rebinder.compile``).

    Raises ``NotSwappable`` (nothing compiled is kept) when the device or the graph does not allow it.
    """
    import openvino as ov

    if device_id.split(".")[0].upper() not in SUPPORTED_DEVICES:
        raise NotSwappable(f"weightless import is used on {', '.join(SUPPORTED_DEVICES)} only, not {device_id}")
    model, promoted = convert.promote(graph, arrays)
    try:
        ov_model = core.read_model(convert.graph_bytes(model, graph.name))
    except RuntimeError as exc:
        raise NotSwappable(f"the graph does not convert: {convert.first_line(str(exc))}") from exc
    as_input, shaping = _inputs_to_keep(ov_model, promoted)
    odd = sorted(k for k in as_input if promoted[k].dtype.name not in _INPUT_DTYPES)
    if odd:  # numpy cannot hand OpenVINO these as input tensors (ml_dtypes' bfloat16...)
        raise NotSwappable(f"weights of type {promoted[odd[0]].dtype} would be fed as inputs: {', '.join(odd[:3])}")
    consts = {k: a for k, a in promoted.items() if k not in as_input}
    if not consts:
        raise NotSwappable("no weight can stay a constant")
    ir = tempfile.TemporaryDirectory(prefix="sdrt-ov-ir-", dir=_ram_dir(), ignore_cleanup_errors=True)
    with ir as d:
        xml, bin_ = Path(d) / "model.xml", Path(d) / "model.bin"
        for _ in range(2):
            candidate = ov_model.clone()
            convert.bind_parameters(candidate, consts)
            ov.serialize(candidate, str(xml), str(bin_))
            layout, extras, size, shared = _layout(xml, bin_, consts)
            if not shared:
                break
            # ov.serialize stores equal constants once: such weights are fed as inputs instead
            as_input |= shared
            consts = {k: a for k, a in consts.items() if k not in shared}
        else:
            raise NotSwappable(f"weights still share bytes in the IR: {', '.join(sorted(shared)[:3])}")
        compiled = core.compile_model(core.read_model(str(xml)), device_id, {**props, **_WEIGHTLESS_PROPS})
        views = _views(str(bin_), layout, arrays)
    blob = bytes(compiled.export_model().getvalue())
    _check_weightless(blob, {k: consts[k] for k in layout if k not in shaping})
    dtypes = {k: np.dtype(p.get_element_type().to_dtype()) for p in ov_model.get_parameters()
              for k in p.output(0).get_names() if k in as_input}
    log.info("%s: swappable (%d weights in a %.1f MB file, %d fed as inputs; blob %.1f MB)", graph.name,
             len(layout), size / 1e6, len(dtypes), len(blob) / 1e6)
    fixed = {n: np.array(a) for n, a in arrays.items() if n not in promoted or n in shaping}
    return compiled, Rebinder(blob, device_id, dict(props), layout, extras, size, dtypes, fixed), views


def _inputs_to_keep(ov_model: ov.Model, weights: Mapping[str, np.ndarray]) -> tuple[set[str], set[str]]:
    """The weights that stay model inputs (vectors, and those a transformation could fold), and those
    that set shapes (they stay constants whatever their size, and must not change)."""
    params: dict[str, Any] = {}
    for p in ov_model.get_parameters():
        for n in p.output(0).get_names():
            params[n] = p
    weight_params = {params[n] for n in weights if n in params}
    keep, shaping = set(), set()
    for name, arr in weights.items():
        param = params.get(name)
        if param is None:
            continue
        targets = list(param.output(0).get_target_inputs())
        if any(t.get_node().get_type_name() in _SHAPE_OPS and t.get_index() > 0 for t in targets):
            shaping.add(name)
            continue
        if sum(1 for d in arr.shape if d > 1) <= 1:
            keep.add(name)
            continue
        if any(not _has_runtime_input(t.get_node(), weight_params) for t in targets):
            keep.add(name)
    return keep, shaping


def _has_runtime_input(node: Any, weight_params: set[Any]) -> bool:
    """Whether ``node`` reads something other than constants and weights (so it cannot be folded)."""
    for value in node.input_values():
        src = value.get_node()
        if src.get_type_name() == "Constant":
            continue
        if src.get_type_name() == "Parameter" and src in weight_params:
            continue
        return True
    return False


def _layout(xml: Path, bin_: Path, consts: Mapping[str, np.ndarray]
            ) -> tuple[dict[str, tuple[int, int, np.dtype[Any]]], list[tuple[int, bytes]], int, set[str]]:
    """Where ``ov.serialize`` put each weight in the ``.bin``, the bytes of every other constant, and
    the weights whose bytes are shared (``ov.serialize`` stores equal constants once)."""
    layout: dict[str, tuple[int, int, np.dtype[Any]]] = {}
    regions: list[tuple[int, int]] = []
    for layer in ET.parse(xml).getroot().iter("layer"):
        if layer.get("type") != "Const":
            continue
        data = layer.find("data")
        if data is None or data.get("offset") is None:
            continue
        offset, nbytes = int(data.get("offset", 0)), int(data.get("size", 0))
        name = layer.get("name", "")
        if name not in consts:  # OpenVINO may rename a layer; the output port keeps the tensor name
            port = layer.find("output/port")
            names = (port.get("names", "") if port is not None else "").split(",")
            name = next((n for n in names if n in consts), name)
        if name in consts:
            layout[name] = (offset, nbytes, np.dtype(consts[name].dtype))
        else:
            regions.append((offset, nbytes))
    missing = sorted(set(consts) - set(layout))
    if missing:
        raise NotSwappable(f"weights missing from the IR: {', '.join(missing[:5])}")
    spans = sorted((o, o + n, name) for name, (o, n, _) in layout.items())
    shared: set[str] = set()
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if end > start:
            shared |= {name, other}
    shared |= {name for o, e, name in spans if any(r < e and o < r + n for r, n in regions)}
    if shared:
        return layout, [], 0, shared
    size = bin_.stat().st_size
    with open(bin_, "rb") as f:
        extras = []
        for offset, nbytes in sorted(set(regions)):
            f.seek(offset)
            extras.append((offset, f.read(nbytes)))
    return layout, extras, size, set()


def _check_weightless(blob: bytes, weights: Mapping[str, np.ndarray]) -> None:
    """Refuse a blob that holds a copy of a weight (it would keep the old values after a swap)."""
    copied = [name for name, probe in _probes(weights) if probe in blob]
    if copied:
        raise NotSwappable(f"the compiled model holds its own copy of {len(copied)} weights ({', '.join(copied[:3])})")


def _probes(weights: Mapping[str, np.ndarray]) -> Iterable[tuple[str, bytes]]:
    for name, arr in weights.items():
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        probe = raw[:_PROBE_BYTES]
        if probe.size >= _MIN_PROBE and np.any(probe):  # zeros are everywhere in a blob
            yield name, probe.tobytes()


def _views(path: str, layout: Mapping[str, tuple[int, int, np.dtype[Any]]], arrays: Mapping[str, np.ndarray]
           ) -> dict[str, np.ndarray]:
    """Each weight of the file at ``path`` as a read-only array over its mapping (shape from ``arrays``)."""
    if not layout:
        return {}
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, (offset, nbytes, dtype) in layout.items():
        out[name] = mapped[offset:offset + nbytes].view(dtype).reshape(np.shape(arrays[name]))
    return out


def _raw(arr: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype != dtype and arr.dtype.kind != "V":
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _ram_dir() -> str | None:
    """A RAM-backed folder for the weights file (``/dev/shm`` on Linux), else the default temp folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:  # Windows keeps a mapped file open: it goes with the temp folder
        log.debug("cannot remove %s yet: %s", path, exc)
