"""The safetensors file format, read and written with numpy only.

A safetensors file is: 8 bytes little-endian header length N, N bytes of
JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}``, then the raw little-endian tensor bytes.

Reading parses and checks the header, then maps tensors with ``np.memmap``
(read-only): nothing is copied into memory until a caller converts or
writes to an array. Every problem is a ``WeightsError``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..cache.paths import DANGLING_FIX, replace_mode, write_target
from ..errors import WeightsError

#: headers larger than this are refused (the reference implementation uses the same bound)
MAX_HEADER = 100_000_000

_PLAIN = {
    "F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32", "I16": "int16",
    "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
}
_ML = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def st_dtype(code: str) -> np.dtype:
    """numpy dtype for a safetensors dtype code (BF16 and F8 come from ml_dtypes, installed with onnx)."""
    if code in _PLAIN:
        return np.dtype(_PLAIN[code])
    if code in _ML:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML[code]))
    raise KeyError(code)


def st_code(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    for table in (_PLAIN, _ML):
        for code, n in table.items():
            if n == name:
                return code
    raise WeightsError(f"dtype {name} cannot be stored in safetensors", where="safetensors writer",
                       fix="convert the array to float32, float16, bfloat16 or an integer type")


@dataclass(frozen=True)
class Entry:
    """One tensor in a safetensors file: where its bytes are, already checked against the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    length: int


def _bad(what: str, path: Path | str, fix: str = "re-download the file, or re-save it with safetensors") -> WeightsError:
    return WeightsError(what, where=str(path), fix=fix)


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """Parse and check the header; return the entries and the ``__metadata__``."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(f"file too short for a safetensors header ({size} bytes)", path)
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER or 8 + n > size:
                from ..formats import FETCH_FIX, HTML_HINT, LFS_HINT, sniff

                kind = sniff(head + f.read(56))
                if kind in (LFS_HINT, HTML_HINT):  # a clone without git-lfs, a download that got a web page
                    raise _bad(f"the file is not safetensors: it looks like {kind}", path, FETCH_FIX)
                if kind is not None and kind.endswith(" image"):  # `sdrt generate in.png "..."`: "re-download" it?
                    raise _bad(f"{path.name} is {kind}, not a model or weights file", path,
                               "pass the model or weights file this takes; a picture is an input: {@init_image} "
                               "for img2img")
                if kind is not None and kind != "a safetensors weights file":  # a .npy feed, a pickle, a GGUF file
                    raise _bad(f"{path.name} is not safetensors: it looks like {kind}", path,
                               "pass a .safetensors weights file here")
                raise _bad(f"header length {n} does not fit the file ({size} bytes): truncated or not safetensors", path)
            raw = f.read(n)
    except OSError as exc:
        raise _bad(f"cannot read the file ({exc.strerror or exc})", path, "check the path and permissions") from exc
    return parse_header(raw, size - 8 - n, 8 + n, path)


def parse_header(raw: bytes, data_size: int, data_start: int, path: Path | str) -> tuple[dict[str, Entry], dict[str, str]]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(f"the header is not valid JSON ({type(exc).__name__}): not a safetensors file, or corrupt", path) from exc
    if not isinstance(header, dict):
        raise _bad("the header is not a JSON object", path)
    meta_raw = header.pop("__metadata__", {})
    if not isinstance(meta_raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta_raw.items()):
        raise _bad("__metadata__ must map strings to strings", path)
    entries: dict[str, Entry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, spec in header.items():
        if not isinstance(spec, dict):
            raise _bad(f"tensor {name!r}: entry is not an object", path)
        code, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        try:
            dtype = st_dtype(code) if isinstance(code, str) else None
        except KeyError:
            dtype = None
        if dtype is None:
            raise _bad(f"tensor {name!r}: unknown dtype {code!r}", path,
                       "supported: " + ", ".join(sorted({*_PLAIN, *_ML})))
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise _bad(f"tensor {name!r}: shape {shape!r} is not a list of non-negative ints", path)
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            raise _bad(f"tensor {name!r}: data_offsets {offsets!r} fall outside the data ({data_size} bytes): "
                       "truncated or corrupt file", path)
        expected = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != expected:
            raise _bad(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes stored but shape {shape} of "
                       f"{code} needs {expected}", path)
        entries[name] = Entry(name, dtype, tuple(shape), data_start + offsets[0], expected)
        if expected:
            spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise _bad(f"tensors {n0!r} and {n1!r} overlap in the file", path)
    return entries, dict(meta_raw)


def map_entry(path: Path, entry: Entry) -> np.ndarray:
    """A read-only memory-mapped view of one tensor (no copy)."""
    if entry.length == 0:
        return np.zeros(entry.shape, entry.dtype)
    try:
        # by its name as a str: numpy resolves a Path's symbolic links on every map
        raw = np.memmap(os.fspath(path), dtype=np.uint8, mode="r", offset=entry.begin, shape=(entry.length,))
    except (OSError, ValueError) as exc:
        raise _bad(f"cannot map tensor {entry.name!r} ({exc})", path) from exc
    return np.asarray(raw).view(entry.dtype).reshape(entry.shape)


@dataclass(frozen=True)
class FileSlice:
    """Tensor bytes that already sit in a file (little-endian, C order): copied file to file
    by ``write``, so a multi-GB tensor never passes through memory or the page-cache mapping."""

    path: Path
    offset: int
    length: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.length


Tensor = np.ndarray | FileSlice


def write(path: str | os.PathLike[str], tensors: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
          metadata: Mapping[str, str] | None = None) -> dict[str, tuple[int, int]]:
    """Write a safetensors file (atomically: temporary file, then rename; a symlink is written through).

    Tensors are written largest item size first, so every tensor stays aligned
    to its item size. Returns ``name -> (absolute offset, length)`` in the file.
    """
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    items.sort(key=lambda kv: -np.dtype(kv[1].dtype).itemsize)
    header: dict[str, Any] = {}
    pos = 0
    for name, arr in items:
        n = int(arr.nbytes)
        if isinstance(arr, FileSlice) and n != math.prod(arr.shape) * np.dtype(arr.dtype).itemsize:
            raise WeightsError(f"tensor {name!r}: {n} bytes for shape {list(arr.shape)} of {arr.dtype}",
                               where=str(arr.path), fix="check the source file")
        header[name] = {"dtype": st_code(arr.dtype), "shape": [int(d) for d in arr.shape], "data_offsets": [pos, pos + n]}
        pos += n
    if metadata:
        header["__metadata__"] = dict(metadata)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    start = 8 + len(blob)
    path = Path(path)
    try:  # a rename over the link put a file in its place, and a graph naming the link's target lost its weights
        target = write_target(path)
    except FileNotFoundError as exc:
        raise WeightsError(exc.strerror, where=str(path), fix=DANGLING_FIX) from None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        mode = replace_mode(target)  # refuses a read-only file
        with open(tmp, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for _, arr in items:
                _write_array(f, arr)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except KeyboardInterrupt:  # Ctrl-C mid-write: no half file left beside the output
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fix = "create the folder first" if not target.parent.is_dir() else "check free disk space and permissions"
        raise WeightsError(f"cannot write weights ({exc.strerror or exc})", where=str(path), fix=fix) from exc
    return {name: (start + header[name]["data_offsets"][0], int(arr.nbytes)) for name, arr in items}


def _write_array(f: BinaryIO, arr: Tensor, chunk: int = 64 << 20) -> None:
    if isinstance(arr, FileSlice):
        with open(arr.path, "rb") as src:
            src.seek(arr.offset)
            left = arr.length
            while left > 0:
                block = src.read(min(chunk, left))
                if not block:
                    raise OSError(f"{arr.path} ended {left} bytes early")
                f.write(block)
                left -= len(block)
        return
    a = np.asarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    for i in range(0, flat.size, chunk):  # chunked: a mapped tensor is never copied whole
        f.write(flat[i:i + chunk].tobytes())
