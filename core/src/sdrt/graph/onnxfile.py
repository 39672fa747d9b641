"""Safe reading of ONNX files: parse, validate, and resolve external data.

Everything here raises ``ModelError`` (never a protobuf or OS error) with the
file, what is wrong and what to do. External-data locations must stay inside
the model's folder: absolute paths, ``..`` and symbolic links that lead out of
the folder are refused (the class of bug behind onnx CVE-2024-27318/27319).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..errors import ModelError
from ..formats import FETCH_FIX, HTML_HINT, LFS_HINT, PICKLE_HINT, sniff

if TYPE_CHECKING:  # pragma: no cover
    import onnx

log = logging.getLogger("sdrt.graph")

#: Lowest default-domain opset sdrt accepts; the highest is what the installed onnx knows.
MIN_OPSET = 7


def max_opset() -> int:
    import onnx

    return int(onnx.defs.onnx_opset_version())


# -- dtypes ------------------------------------------------------------------

def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX element type (bfloat16 and float8 come from ml_dtypes)."""
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception as exc:
        raise ModelError(
            f"unknown or unsupported ONNX element type {elem_type}",
            fix="re-export the model with standard tensor types",
        ) from exc


def dtype_name(elem_type: int) -> str:
    try:
        return np_dtype(elem_type).name
    except ModelError:
        return "undefined"


def nbytes_of(elem_type: int, dims: Any) -> int | None:
    """Bytes of a dense tensor, or None for types without a fixed item size (strings)."""
    try:
        dt = np_dtype(elem_type)
    except ModelError:
        return None
    if dt.kind in "OSU" or dt.itemsize == 0:  # strings have no fixed size
        return None
    size = math.prod(int(d) for d in dims)
    # 4-bit types pack two per byte
    if elem_type in _PACKED_4BIT:
        return (size + 1) // 2
    return size * dt.itemsize


_PACKED_4BIT = {21, 22, 23}  # UINT4, INT4, FLOAT4E2M1


# -- parsing -----------------------------------------------------------------



def parse_model(data: bytes, where: str) -> onnx.ModelProto:
    """Parse serialized ONNX bytes, refusing what is not an ONNX model."""
    import onnx

    kind = sniff(data[:64])
    if kind is not None:
        fix = "pass an .onnx file"
        if kind == PICKLE_HINT:
            fix = ("pass this file as {@weights=}FILE (sdrt reads PyTorch checkpoints without running them), or as the "
                   "model of a pipeline (a single-file .ckpt); an .onnx graph comes from torch.onnx.export")
        elif kind.startswith("a safetensors"):
            fix = "pass this file as {@weights=}FILE, and the .onnx graph as the model"
        elif kind in (LFS_HINT, HTML_HINT):
            fix = FETCH_FIX
        raise ModelError(f"the file is not ONNX: it looks like {kind}", where=where, fix=fix)
    if not data:
        raise ModelError("the file is empty, not an ONNX model", where=where, fix="pass a complete .onnx file")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # DecodeError, RecursionError from hostile nesting, ...
        raise ModelError(
            f"the file is not a valid ONNX model: malformed or truncated protobuf ({type(exc).__name__}: {exc})",
            where=where,
            fix="check that it is a complete .onnx file (re-download or re-export it)",
        ) from exc
    try:
        bad = _bad_string(model)
    except UnicodeDecodeError as exc:
        bad = exc.object[:40] if isinstance(exc.object, bytes) else b"?"
    if bad is not None:
        raise ModelError(
            f"the file is not a valid ONNX model: a name or text field is not UTF-8 ({bad[:40]!r})",
            where=where,
            fix="the file is corrupt; re-download or re-export it",
        )
    validate(model, where)
    return model


def _bad_string(msg: Any) -> bytes | None:
    """The first string field that is not valid UTF-8, or None.

    protobuf parses ONNX's (proto2) string fields without checking them and
    hands invalid UTF-8 back as ``bytes``; such a value fails later in any code
    that copies or formats it, so it is caught here. Numeric and bytes fields
    (tensor data) are not walked.
    """
    from google.protobuf.descriptor import FieldDescriptor

    string, message = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    stack = [msg]
    while stack:
        m = stack.pop()
        for field, value in m.ListFields():
            if field.type == message:
                if _is_repeated(field):
                    stack.extend(value)
                else:
                    stack.append(value)
            elif field.type == string:
                for v in (value if _is_repeated(field) else (value,)):
                    if not isinstance(v, str):
                        return bytes(v)
    return None


def _is_repeated(field: Any) -> bool:
    rep = getattr(field, "is_repeated", None)
    if rep is not None:
        return bool(rep)
    return bool(field.label == field.LABEL_REPEATED)


def validate(model: onnx.ModelProto, where: str) -> None:
    """Structural checks that catch non-ONNX data, truncation and unsupported opsets."""
    import onnx

    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelError(
            "the file is not an ONNX model (no IR version or no graph)",
            where=where,
            fix="pass a .onnx file exported by torch.onnx.export or another ONNX exporter",
        )
    if model.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"the model uses ONNX IR version {model.ir_version}, newer than this onnx ({onnx.IR_VERSION})",
            where=where,
            fix="upgrade onnx (pip install -U onnx) or export with an older opset",
        )
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not default:
        raise ModelError(
            "the model imports no default-domain (ai.onnx) opset",
            where=where,
            fix="re-export the model; every ONNX model names the opset it was written for",
        )
    hi = max_opset()
    if not MIN_OPSET <= default[0] <= hi:
        raise ModelError(
            f"opset {default[0]} is outside the supported range {MIN_OPSET}..{hi}",
            where=where,
            fix=f"re-export with an opset between {MIN_OPSET} and {hi} (torch.onnx.export(..., opset_version=17)), "
            "or convert it with onnx.version_converter",
        )
    _check_wiring(model.graph, where)


def _check_wiring(g: Any, where: str) -> None:
    """Every top-level node input and graph output must be produced by something.

    A truncated file can still parse when it ends on a field boundary; this is
    what catches it.
    """
    known = {""}
    known.update(i.name for i in g.input)
    known.update(t.name for t in g.initializer)
    known.update(s.values.name for s in g.sparse_initializer)
    for node in g.node:
        for name in node.input:
            if name not in known:
                raise ModelError(
                    f"node {node.name or node.op_type!r} ({node.op_type}) reads {name!r}, which nothing produces "
                    "(the file may be truncated, or the graph is malformed)",
                    where=where,
                    fix="re-export the model, or check it with onnx.checker.check_model",
                )
        known.update(node.output)
    for out in g.output:
        if out.name not in known:
            raise ModelError(
                f"graph output {out.name!r} is produced by no node (the file may be truncated)",
                where=where,
                fix="re-export the model, or check it with onnx.checker.check_model",
            )


# -- external data ------------------------------------------------------------

@dataclass(frozen=True)
class ExternalRef:
    """Where the bytes of one externally stored tensor live (already checked)."""

    path: Path
    offset: int
    length: int
    #: the file's version (``sdrt.stamps.file_stamp``) when the range was checked: a read or map of a file
    #: that is another version since is refused (``FileChanged``); None: not checked
    stamp: tuple[int, int, int, int] | None = dc_field(default=None, compare=False)


def iter_tensors(g: Any, *, top_initializers: bool = True) -> Iterator[Any]:
    """Every TensorProto of a graph and its subgraphs: initializers and attribute tensors."""
    if top_initializers:
        yield from g.initializer
    for s in g.sparse_initializer:
        yield s.values
        yield s.indices
    for node in g.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from iter_tensors(attr.g)
            for sub in attr.graphs:
                yield from iter_tensors(sub)


def uses_external(t: Any) -> bool:
    return t.data_location == 1  # TensorProto.EXTERNAL


def _hub_blob(base_dir: Path, target: Path) -> bool:
    """Whether ``target`` is a file of the Hugging Face cache that ``base_dir`` is a snapshot folder of: the hub
    stores a repository's files once, as ``REPO/blobs/HASH``, and each revision's folder ``REPO/snapshots/REV/...``
    holds symbolic links to them (``hf download``, ``snapshot_download``), so the external data of every cached ONNX
    export leads out of its folder into ``REPO/blobs/``. Only a regular file directly in that ``blobs/`` counts."""
    parts = base_dir.absolute().parts
    if "snapshots" not in parts[:-1]:
        return False
    k = len(parts) - 1 - parts[::-1].index("snapshots")  # the last "snapshots" above the folder
    blobs = Path(*parts[:k]) / "blobs"
    try:
        return target.parent == blobs.resolve() and target.is_file()
    except OSError:
        return False


def resolve_location(base_dir: Path, location: str, tensor: str, where: str) -> Path:
    """The file that ``location`` names, refused unless it stays inside ``base_dir``."""
    bad = None
    if not location:
        bad = "an empty location"
    elif "\x00" in location:
        bad = "a location with a NUL byte"
    elif PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() \
            or PureWindowsPath(location).drive or location.startswith(("/", "\\")):
        bad = f"an absolute path {location!r}"
    elif ".." in re.split(r"[\\/]+", location):
        bad = f"a path with '..' {location!r}"
    if bad is None and "\\" in location and os.sep == "/" and not (base_dir / location).exists():
        location = location.replace("\\", "/")  # written on Windows (os.path.join there): weights\model.onnx_data
    if bad is None:
        try:
            base = base_dir.resolve()
            target = (base_dir / location).resolve()
        except (OSError, RuntimeError) as exc:  # name too long, symlink loop
            raise ModelError(f"tensor {tensor!r} names an external-data file that cannot be resolved ({exc})",
                             where=where, fix="re-export the model; keep external-data names short and plain") from exc
        if target != base and base not in target.parents and not _hub_blob(base_dir, target):
            bad = f"{location!r}, which leads out of the model folder (through a symbolic link) to {target}"
    if bad is not None:
        raise ModelError(
            f"tensor {tensor!r} points its external data at {bad}; locations must stay inside the model folder",
            where=where,
            fix="keep external-data files next to the .onnx file and name them by relative path; "
            "do not load models from untrusted sources",
        )
    return base_dir / location


def external_ref(t: Any, base_dir: Path | None, where: str, *, must_exist: bool = True,
                 files: dict[str, tuple[Path, bool, Any, int]] | None = None) -> ExternalRef | None:
    """Check one external tensor: safe location, file present, range inside the file.

    Returns None when the file is missing and ``must_exist`` is False. ``files``: what was found for each location
    already, filled here (one model's tensors share one or a few files: the full-size SD 1.5 UNet's 1,420 tensors
    resolved and stat'ed one file 1,420 times, 0.1 s of each load).
    """
    info = {e.key: e.value for e in t.external_data}
    if base_dir is None:
        if not must_exist:
            return None
        raise ModelError(
            f"tensor {t.name!r} stores its data in an external file, but the model was given as bytes",
            where=where,
            fix="load the model from its path, or pass base_dir= to say which folder holds the external data",
        )
    location = info.get("location", "")
    known = files.get(location) if files is not None else None
    path = known[0] if known is not None else resolve_location(base_dir, location, t.name, where)
    try:
        offset = int(info.get("offset", "0") or 0)
        length_s = info.get("length")
        length = int(length_s) if length_s else -1
    except ValueError as exc:
        raise ModelError(
            f"tensor {t.name!r} has a non-numeric external-data offset or length",
            where=where, fix="re-export the model",
        ) from exc
    from ..stamps import file_stamp

    if known is not None:
        _, present, stamp, size = known
    else:
        try:
            present = path.is_file()
            stamp = file_stamp(path) if present else None  # the size checked below is this version's
            size = stamp[0] if stamp is not None else path.stat().st_size if present else 0
        except OSError as exc:
            raise ModelError(f"cannot access external-data file for tensor {t.name!r} ({exc.strerror or exc})",
                             where=f"{where} (looked for {path})", fix="check the file and its permissions") from exc
        if files is not None:
            files[location] = (path, present, stamp, size)
    if not present:
        if not must_exist:
            return None
        raise ModelError(
            f"external-data file {info.get('location')!r} for tensor {t.name!r} is missing",
            where=f"{where} (looked for {path})",
            fix="copy every file that came with the model into the model's folder",
        )
    if length < 0:
        length = size - offset
    expected = nbytes_of(t.data_type, t.dims)
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelError(
            f"tensor {t.name!r} wants bytes {offset}..{offset + length} of {path.name}, which has only {size} bytes "
            "(truncated external-data file?)",
            where=where, fix="re-download or re-export the model with its external data",
        )
    if expected is not None and expected != length:
        raise ModelError(
            f"tensor {t.name!r} has shape {list(t.dims)} ({expected} bytes) but its external data is {length} bytes",
            where=where, fix="re-export the model",
        )
    return ExternalRef(path, offset, length, stamp)


def _unchanged(ref: ExternalRef) -> None:
    """``FileChanged`` when the file of ``ref`` is another version than the one its range was checked on (replaced
    or written again since the model was read): its bytes at the old offsets would be wrong weights, or past its end."""
    if ref.stamp is not None:
        from ..stamps import check, file_stamp

        if file_stamp(ref.path) is not None:  # a file gone is said by the read, with the tensor's name
            check(ref.path, ref.stamp, "since the model was read")


def read_external(ref: ExternalRef, where: str) -> bytes:
    _unchanged(ref)
    try:
        with open(ref.path, "rb") as f:
            f.seek(ref.offset)
            data = f.read(ref.length)
    except OSError as exc:
        raise ModelError(f"cannot read external data ({exc})", where=f"{where}: {ref.path}",
                         fix="check the file's permissions") from exc
    if len(data) != ref.length:
        raise ModelError("external-data file ended early", where=f"{where}: {ref.path}",
                         fix="re-download or re-export the model")
    return data


def inline(t: Any, data: bytes) -> None:
    """Move bytes into a TensorProto and drop its external-data entries."""
    t.raw_data = data
    del t.external_data[:]
    t.data_location = 0  # TensorProto.DEFAULT


def map_external(ref: ExternalRef, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A read-only view of external bytes through mmap (nothing is copied)."""
    if ref.length == 0:
        return np.zeros(shape, dtype)
    _unchanged(ref)
    try:
        # by its name as a str: numpy resolves a Path's symbolic links on every map (0.05 s of the SD 1.5 UNet's
        # 585), and ``ref.path`` was checked when the model was read
        arr = np.memmap(os.fspath(ref.path), dtype=np.uint8, mode="r", offset=ref.offset, shape=(ref.length,))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot map external data ({exc})", where=f"{where}: {ref.path}",
                         fix="check the file") from exc
    from ..stamps import mark

    if dtype.name in _PACKED_4BIT_NAMES:  # two values a byte, the first in the low nibble: unpacked (a copy)
        return mark(_unpack_4bit(np.asarray(arr), dtype, shape, where), ref.path, ref.stamp)
    return mark(np.asarray(arr).view(dtype).reshape(shape), ref.path, ref.stamp)


#: numpy (ml_dtypes) names of the 4-bit types ONNX stores two to a byte
_PACKED_4BIT_NAMES = frozenset({"int4", "uint4", "float4_e2m1fn"})


def _unpack_4bit(packed: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
    """The 4-bit values of ``packed`` bytes as ``dtype`` (one byte each, as numpy holds them), in ``shape``."""
    count = math.prod(shape)
    if packed.size != (count + 1) // 2:
        raise ModelError(f"external data of {packed.size} bytes does not hold {count} 4-bit values",
                         where=where, fix="re-export the model (the file may be corrupt)")
    out = np.empty(packed.size * 2, np.uint8)
    np.bitwise_and(packed, 0x0F, out=out[0::2])
    np.right_shift(packed, 4, out=out[1::2])
    return out[:count].view(dtype).reshape(shape)


def tensor_array(t: Any, where: str) -> np.ndarray:
    """Decode an inline TensorProto, wrapping onnx's errors."""
    from onnx import numpy_helper

    expected = nbytes_of(t.data_type, t.dims)
    if t.HasField("raw_data") and expected is not None and len(t.raw_data) != expected:
        raise ModelError(
            f"tensor {t.name!r} has shape {list(t.dims)} ({expected} bytes) but holds {len(t.raw_data)} bytes",
            where=where, fix="re-export the model (the file may be corrupt)",
        )
    try:
        return numpy_helper.to_array(t)
    except Exception as exc:
        raise ModelError(f"cannot decode tensor {t.name!r}: {exc}", where=where,
                         fix="re-export the model (the file may be corrupt)") from exc


#: an inline initializer at least this large is left in the .onnx file and mapped from it (``inline_spans``)
MAP_INLINE_MIN_BYTES = 1 << 20


def _varint(buf: Any, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """``(field number, wire type, tag start, value start, value end)`` of each field of the message at
    ``buf[start:end]`` (for a varint, the end is where it stops)."""
    i = start
    while i < end:
        at = i
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, j = _varint(buf, i)
        elif wire == 1:
            j = i + 8
        elif wire == 2:
            length, i = _varint(buf, i)
            j = i + length
        elif wire == 5:
            j = i + 4
        else:  # groups: not in ONNX
            raise ValueError(f"wire type {wire}")
        if j > end:
            raise ValueError("field past the end of its message")
        yield number, wire, at, i, j
        i = j


def _scan(data: Any, min_bytes: int) -> tuple[tuple[int, int, int], dict[str, tuple[int, int, int, int, int]]]:
    """The graph field (tag start, value start, value end) and, per large initializer, (tensor tag start, value
    start, value end, raw_data tag start, raw_data value start); raises ValueError for any other layout."""
    graphs = [(at, a, b) for n, w, at, a, b in _fields(data, 0, len(data)) if n == 7 and w == 2]  # ModelProto.graph
    if len(graphs) != 1:
        raise ValueError("not one graph field")
    found: dict[str, tuple[int, int, int, int, int]] = {}
    for n, w, at, a, b in _fields(data, *graphs[0][1:]):
        if n != 5 or w != 2:  # GraphProto.initializer
            continue
        fields = list(_fields(data, a, b))
        names = [f for f in fields if f[0] == 8 and f[1] == 2]  # TensorProto.name
        raws = [f for f in fields if f[0] == 9 and f[1] == 2]  # TensorProto.raw_data
        if len(names) != 1 or len(raws) != 1 or any(f[0] in (13, 14) for f in fields):  # already external
            continue
        raw = raws[0]
        if raw[4] - raw[3] >= min_bytes:
            name = bytes(data[names[0][3]:names[0][4]]).decode("utf-8")
            if name in found:  # the same name twice: leave the model as it is
                raise ValueError(f"initializer {name!r} twice")
            found[name] = (at, a, b, raw[2], raw[3])
    return graphs[0], found


def inline_spans(data: Any, min_bytes: int = MAP_INLINE_MIN_BYTES) -> dict[str, tuple[int, int]]:
    """``{name: (offset, length)}`` of the ``raw_data`` of each top-level initializer of serialized ONNX
    ``data`` holding at least ``min_bytes``: where those bytes lie in the file, so they can be mapped from it
    instead of held in the parsed model. Empty when the layout is not the plain one (one graph field, one
    name and one raw_data per tensor)."""
    try:
        _, found = _scan(data, min_bytes)
    except (ValueError, IndexError, UnicodeDecodeError):
        return {}
    return {name: (f[4], f[2] - f[4]) for name, f in found.items()}


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint_bytes(number << 3 | 2) + _varint_bytes(len(payload)) + payload


def without_inline(data: Any, location: str, min_bytes: int = MAP_INLINE_MIN_BYTES, *,
                   source: BinaryIO | None = None) -> tuple[bytes | bytearray, dict[str, tuple[int, int]]]:
    """Serialized ONNX ``data`` (the bytes of the file ``location`` names) rewritten so that each top-level
    initializer holding ``min_bytes`` or more of ``raw_data`` refers to those bytes where they lie in that file
    (ONNX external data: location, offset, length) instead of carrying them, and ``{name: (offset, length)}``
    of those. Parsing the result never copies the weights. ``(data, {})`` when there is none, or the layout
    is not the plain one.

    The result is written once, into one buffer sized ahead. ``source``: the open file that ``data`` reads (a
    ``FileBytes`` over it, or a map of it); the kept spans are read from it (``readinto``) straight into the buffer.
    The bench UNet (150 MB, 50 MB of it in weights under ``min_bytes``): 304 MiB over the process's start while each
    piece was sliced, joined and prefixed in turn through a map of the file; its 50 MB result alone now."""
    try:
        (g_at, g_start, g_end), found = _scan(data, min_bytes)
    except (ValueError, IndexError, UnicodeDecodeError):
        return bytes(data), {}
    if not found:
        return bytes(data), {}
    loc = location.encode("utf-8")
    pieces: list[bytes | tuple[int, int]] = []  # new bytes, or a span (start, end) of data kept as it is
    cursor = g_start
    spans: dict[str, tuple[int, int]] = {}
    for name, (t_at, t_start, t_end, r_at, r_start) in sorted(found.items(), key=lambda kv: kv[1][0]):
        raw_end = next(f[4] for f in _fields(data, t_start, t_end) if f[2] == r_at)
        length = raw_end - r_start
        tail = b"".join(_len_field(13, _len_field(1, k) + _len_field(2, v))  # TensorProto.external_data
                        for k, v in ((b"location", loc), (b"offset", str(r_start).encode()),
                                     (b"length", str(length).encode()))) + b"\x70\x01"  # data_location
        tensor_len = (r_at - t_start) + (t_end - raw_end) + len(tail)
        pieces += [(cursor, t_at), _varint_bytes(5 << 3 | 2) + _varint_bytes(tensor_len),  # GraphProto.initializer
                   (t_start, r_at), (raw_end, t_end), tail]
        cursor = t_end
        spans[name] = (r_start, length)
    pieces.append((cursor, g_end))
    graph_len = sum(p[1] - p[0] if isinstance(p, tuple) else len(p) for p in pieces)
    pieces = [(0, g_at), _varint_bytes(7 << 3 | 2) + _varint_bytes(graph_len), *pieces, (g_end, len(data))]
    out = bytearray(sum(p[1] - p[0] if isinstance(p, tuple) else len(p) for p in pieces))
    view, src, at = memoryview(out), (memoryview(data) if source is None else None), 0
    try:
        for p in pieces:
            if not isinstance(p, tuple):
                view[at:at + len(p)] = p
                at += len(p)
                continue
            n = p[1] - p[0]
            if source is not None:
                source.seek(p[0])
                if source.readinto(view[at:at + n]) != n:
                    raise OSError("the model file changed while it was read")
            else:
                assert src is not None
                view[at:at + n] = src[p[0]:p[1]]
            at += n
    finally:
        view.release()
        if src is not None:
            src.release()
    return out, spans


class FileBytes:
    """Read-only indexing over an open file, read a block at a time: what ``_scan`` reads of a large .onnx file (its
    fields' tags and lengths, the tensors' names) without mapping it. A map of the file put every page the scan
    touched in the process's resident set: 137 MiB of the full-size SD 1.5 text encoder's 470 (the kernel maps whole
    page-cache folios around each fault), for tags a few bytes long."""

    BLOCK = 1 << 16

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f, self._size = f, size
        self._block, self._buf = -1, b""

    def __len__(self) -> int:
        return self._size

    def _read(self, start: int, n: int) -> bytes:
        self._f.seek(start)
        data = self._f.read(n)
        if len(data) != n:
            raise ValueError("the file is shorter than when it was opened")
        return data

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            start, stop, step = k.indices(self._size)
            if step != 1:
                raise ValueError("a step is not supported")
            return self._read(start, max(0, stop - start))
        if k < 0:
            k += self._size
        if not 0 <= k < self._size:
            raise IndexError("index out of range")
        block = k // self.BLOCK
        if block != self._block:
            self._buf = self._read(block * self.BLOCK, min(self.BLOCK, self._size - block * self.BLOCK))
            self._block = block
        return self._buf[k - block * self.BLOCK]

    def __bytes__(self) -> bytes:
        return self._read(0, self._size)


def read_model_file(path: Path, *, map_inline: bool) -> tuple[bytes | bytearray, dict[str, tuple[int, int]]]:
    """The bytes of the .onnx file ``path`` to parse; with ``map_inline``, without the large inline weights
    (``without_inline``: they stay in the file, to be mapped from it, so they never enter the process's memory),
    with where they lie. The file is scanned and read with plain reads (``FileBytes``), never mapped whole."""
    if map_inline:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size >= MAP_INLINE_MIN_BYTES:
                    return without_inline(FileBytes(f, size), path.name, source=f)
        except (OSError, ValueError):  # a folder, no permission, changed while read: read_file says what is wrong
            pass
    return read_file(path), {}


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError as exc:
        raise ModelError("the model path is a folder, not an .onnx file", where=str(path),
                         fix="pass the path of the .onnx file inside it") from exc
    except OSError as exc:
        raise ModelError(f"cannot read the model file ({exc.strerror or exc})", where=str(path),
                         fix="check the path and its permissions") from exc


def same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return Path(a).resolve().parent == Path(b).resolve().parent
