"""PyTorch checkpoints (``.ckpt``, ``.pt``, ``.pth``, ``.bin``) read with numpy only, running nothing from the file.

``torch.save`` writes a pickle whose tensors point at raw storages. Two layouts are read:

- the zip format (torch 1.6+): ``<prefix>/data.pkl`` (the pickle), ``<prefix>/data/<key>`` (each storage's
  bytes, stored uncompressed and 64-byte aligned), ``<prefix>/byteorder`` (``little`` when absent);
- the legacy format (``_use_new_zipfile_serialization=False``): five pickles in a row (magic number,
  protocol version, system info, the object, the storage keys), each storage's bytes after the last one,
  led by its element count (8 bytes).

Safety: the pickle is read by ``pickle.Unpickler`` with ``find_class`` and ``persistent_load`` replaced, after a
scan of its opcodes (``pickletools.genops``, which only parses). ``find_class`` answers from ``ALLOWED`` alone, a
table of sdrt's own stand-ins (records of tensor metadata, inert records of data containers, ``OrderedDict``,
``set``); nothing named in the file is imported, and no callable but those stand-ins exists for ``REDUCE``,
``NEWOBJ`` or ``BUILD`` to call. Any other global (``os.system``, ``builtins.eval``, an unknown class) is
refused before the first object is built. Every storage a tensor points at must be an entry of the file whose
size holds it, and every tensor's offset, shape and strides must stay inside its storage.

Tensors are not read: each is a ``TensorRef`` whose ``load`` maps the storage's bytes (``np.memmap``) and views
them (a strided view when they are not contiguous, copied to C order then). A storage written compressed
(never by torch itself) is read and inflated on access instead.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import re
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import WeightsError
from . import stfile

#: data.pkl (or a legacy file's pickles) larger than this is refused: real checkpoints hold a few MB of pickle
MAX_PICKLE = 100_000_000
#: dicts nested deeper than this are refused when flattening
MAX_DEPTH = 64
#: a view that repeats its storage (stride 0, as ``expand`` makes) is read into at most this many bytes, or 16 times
#: its storage: a 1 KB file could otherwise make gigabytes (real ones are small: CLIP's position_ids)
MAX_EXPANDED = 64 << 20
#: tuples nested deeper than this are refused before unpickling (hashing one recurses without a limit)
MAX_TUPLES = 100
#: the first pickle of a legacy (non-zip) file
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
SUFFIXES = frozenset({".ckpt", ".pt", ".pth", ".bin", ".pkl", ".pickle", ".th"})
UNTRUSTED_FIX = ("only load checkpoints from sources you trust, or download the file's .safetensors version; "
                 "sdrt reads tensors and plain containers from a pickle, nothing else")


def _bad(what: str, path: Path | str, fix: str = "re-download the file (it may be truncated)") -> WeightsError:
    return WeightsError(what, where=str(path), fix=fix)


class _Refused(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Malformed(Exception):
    pass


# -- stand-ins --------------------------------------------------------------------------------------------
def _ml(name: str) -> Callable[[], np.dtype]:
    def get() -> np.dtype:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return get


def _np(code: str) -> Callable[[], np.dtype]:
    return lambda: np.dtype(code)


#: torch dtype names -> numpy dtypes (bfloat16 and float8 from ml_dtypes, as the safetensors reader has them)
_DTYPES: dict[str, Callable[[], np.dtype]] = {
    "float64": _np("<f8"), "double": _np("<f8"), "float32": _np("<f4"), "float": _np("<f4"),
    "float16": _np("<f2"), "half": _np("<f2"), "bfloat16": lambda: stfile.st_dtype("BF16"),
    "int64": _np("<i8"), "long": _np("<i8"), "int32": _np("<i4"), "int": _np("<i4"), "int16": _np("<i2"),
    "short": _np("<i2"), "int8": _np("i1"), "uint8": _np("u1"), "bool": _np("?"),
    "uint16": _np("<u2"), "uint32": _np("<u4"), "uint64": _np("<u8"),
    "complex64": _np("<c8"), "complex128": _np("<c16"), "cfloat": _np("<c8"), "cdouble": _np("<c16"),
    "float8_e4m3fn": lambda: stfile.st_dtype("F8_E4M3"), "float8_e5m2": lambda: stfile.st_dtype("F8_E5M2"),
    "float8_e4m3fnuz": _ml("float8_e4m3fnuz"), "float8_e5m2fnuz": _ml("float8_e5m2fnuz"),
    "float8_e8m0fnu": _ml("float8_e8m0fnu"),
}
#: torch's typed storage classes -> the dtype names above
_STORAGES = {"DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
             "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
             "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
             "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128"}


class _Sealed(type):
    """The type of every stand-in class: a pickle's ``BUILD`` on the class itself cannot change it."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise _Malformed("the pickle tries to change a class")

    def __delattr__(cls, name: str) -> None:
        raise _Malformed("the pickle tries to change a class")


def _no_setstate(self: Any, state: Any) -> None:
    raise _Malformed(f"the pickle tries to change a {type(self).__name__.strip('_')}")


class _Fixed:
    """Stand-in objects and their records: ``BUILD`` (``__setstate__``) and attribute writes are refused, so what was
    checked when a rebuild function made a record stays as it was. (Each dataclass below names ``__setstate__``
    in its own body: a frozen slotted dataclass otherwise gets one that sets its fields from any state.)"""

    __slots__ = ()
    __setstate__ = _no_setstate


@dataclass(frozen=True, slots=True)
class _StorageType(_Fixed):
    """``torch.FloatStorage`` and the like (``dtype`` None: ``torch.storage.UntypedStorage``, counted in bytes)."""

    __setstate__ = _no_setstate

    dtype: str | None


@dataclass(frozen=True, slots=True)
class _DType(_Fixed):
    """``torch.float8_e4m3fn`` and the like, as ``_rebuild_tensor_v3`` takes them."""

    __setstate__ = _no_setstate

    name: str


@dataclass(eq=False, slots=True)
class _Storage(_Fixed):
    """A storage of the file; only this module's readers change it (no pickle op reaches it)."""

    __setstate__ = _no_setstate

    key: str
    nbytes: int              # what the pickle says the storage holds
    begin: int | None = None  # absolute offset of its bytes in the file (None: compressed, read via ``entry``)
    entry: str | None = None
    size: int = 0            # bytes available in the file


class _Call(_Fixed):
    """A stand-in function, as ``find_class`` hands it out: callable, and nothing else about it can change."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        object.__setattr__(self, "fn", fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _Malformed("the pickle tries to change a function")


@dataclass(frozen=True, eq=False, slots=True)
class _Tensor(_Fixed):
    """What a rebuild function was given: a view of ``storage``, validated against it."""

    __setstate__ = _no_setstate

    storage: _Storage
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, tuple) or len(v) > 64 or not all(type(d) is int and 0 <= d < 2**63 for d in v):
        raise _Malformed(f"a tensor's {what} {str(v)[:80]} is not a tuple of non-negative ints")
    return v


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None = None) -> _Tensor:
    if not isinstance(storage, tuple) or len(storage) != 2 or not isinstance(storage[0], _Storage):
        raise _Malformed("a tensor's storage is not a storage of the file")
    st, stype = storage
    dtype = dtype or stype
    if dtype is None:
        raise _Malformed("a tensor on an untyped storage has no dtype")
    if type(offset) is not int or not 0 <= offset < 2**63:
        raise _Malformed(f"a tensor's storage offset {str(offset)[:40]} is not a non-negative int")
    shape, strides = _ints(size, "shape"), _ints(stride, "stride")
    if len(shape) != len(strides):
        raise _Malformed(f"a tensor's shape {shape} and stride {strides} differ in length")
    itemsize = _DTYPES[dtype]().itemsize
    if math.prod(max(n, 1) for n in shape) * itemsize >= 2**63:  # numpy cannot make it, even with a 0 in it
        raise _Malformed(f"a tensor of shape {list(shape)} is larger than any array can be")
    if math.prod(shape):
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
        if (last + 1) * itemsize > st.nbytes:
            raise _Malformed(f"a tensor of shape {list(shape)} (offset {offset}, stride {list(strides)}) reaches "
                             f"past its storage {st.key!r} ({st.nbytes} bytes)")
        size = math.prod(shape) * itemsize  # what reading it makes: a view with stride 0 repeats its storage
        if size > max(MAX_EXPANDED, 16 * st.nbytes):
            raise _Malformed(f"a tensor of shape {list(shape)} (stride {list(strides)}) repeats its storage "
                             f"{st.key!r} ({st.nbytes} bytes) into {size} bytes")
    return _Tensor(st, dtype, offset, shape, strides)


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, *_: Any) -> _Tensor:
    return _rebuild(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                       backward_hooks: Any = None, dtype: Any = None, *_: Any) -> _Tensor:
    if not isinstance(dtype, _DType):
        raise _Malformed("_rebuild_tensor_v3 was given no torch dtype")
    return _rebuild(storage, storage_offset, size, stride, dtype.name)


def _rebuild_parameter(data: Any, *_: Any) -> _Tensor:
    if not isinstance(data, _Tensor):
        raise _Malformed("a Parameter holds no tensor")
    return data


class _TensorClass(_Fixed, metaclass=_Sealed):
    """``torch.Tensor`` / ``torch.nn.Parameter``: only ever a marker for ``_rebuild_from_type_v2``."""

    def __new__(cls, data: Any = None, *_: Any) -> Any:  # Parameter(tensor) is the tensor
        return _rebuild_parameter(data)


class _Parameter(_TensorClass):
    pass


_REBUILDS = (_rebuild_tensor, _rebuild_tensor_v3, _rebuild_parameter)


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any = None) -> _Tensor:
    if not (isinstance(func, _Call) and func.fn in _REBUILDS and new_type in (_TensorClass, _Parameter)
            and isinstance(args, tuple)):
        raise _Malformed("_rebuild_from_type_v2 was given something other than a tensor rebuild")
    return func(*args)


class Inert(metaclass=_Sealed):
    """A data object the file holds beside its tensors (a Lightning callback's settings, an omegaconf or argparse
    container, a numpy array): its arguments and state are kept as data, nothing of it runs, and flattening
    skips it (except a ``ParameterDict``'s parameters)."""

    global_name = "?"

    __slots__ = ("args", "state")

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:
        self = object.__new__(cls)
        self.args = args
        self.state = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.global_name} (inert)>"


def _inert(module: str, name: str) -> type[Inert]:
    return _Sealed(name, (Inert,), {"global_name": f"{module}.{name}", "__module__": __name__, "__slots__": ()})


class _NpDType(metaclass=_Sealed):
    """``numpy.dtype(code)`` for a plain numeric code, its byte order from ``BUILD``."""

    __slots__ = ("dtype",)

    def __init__(self, code: Any, *_: Any) -> None:
        if not isinstance(code, str) or not re.fullmatch(r"[<>|=]?[biuf?][0-9]{0,2}", code):
            raise _Malformed(f"numpy dtype {code!r:.40} is not a plain number type")
        self.dtype = np.dtype(code)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">", "|", "="):
            self.dtype = self.dtype.newbyteorder(state[1])


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, _NpDType) or not isinstance(data, bytes) or len(data) != dtype.dtype.itemsize:
        raise _Malformed("a numpy scalar that is not a plain number")
    return np.frombuffer(data, dtype.dtype)[0]


def _encode(obj: Any, encoding: Any = "utf-8", *_: Any) -> bytes:
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise _Malformed("_codecs.encode of something other than latin-1 text")
    return obj.encode("latin1")


def _size(dims: Any = ()) -> tuple[int, ...]:
    """``torch.Size(dims)``: a flat tuple of ints (the only way a stand-in makes a tuple)."""
    if not isinstance(dims, (tuple, list)) or not all(type(d) is int for d in dims):
        raise _Malformed("torch.Size of something other than ints")
    return tuple(dims)


def _np_reconstruct(*args: Any) -> Inert:
    return _NDARRAY(*args)


_NDARRAY = _inert("numpy", "ndarray")
ParameterDict = _inert("torch.nn.modules.container", "ParameterDict")

#: every global a checkpoint's pickle may name, and what it gets instead of the real thing
ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor"): _Call(_rebuild_tensor),
    ("torch._utils", "_rebuild_tensor_v2"): _Call(_rebuild_tensor),
    ("torch._utils", "_rebuild_tensor_v3"): _Call(_rebuild_tensor_v3),
    ("torch._utils", "_rebuild_parameter"): _Call(_rebuild_parameter),
    ("torch._utils", "_rebuild_parameter_with_state"): _Call(_rebuild_parameter),
    ("torch._tensor", "_rebuild_from_type_v2"): _Call(_rebuild_from_type_v2),
    ("torch._tensor", "Tensor"): _TensorClass,
    ("torch", "Tensor"): _TensorClass,
    ("torch.nn.parameter", "Parameter"): _Parameter,
    ("torch.storage", "UntypedStorage"): _StorageType(None),
    **{("torch", n): _StorageType(d) for n, d in _STORAGES.items()},
    **{("torch.cuda", n): _StorageType(d) for n, d in _STORAGES.items()},
    **{("torch", n): _DType(n) for n in _DTYPES},
    ("torch", "Size"): _Call(_size),
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set, ("__builtin__", "set"): set,
    ("builtins", "frozenset"): frozenset, ("__builtin__", "frozenset"): frozenset,
    ("_codecs", "encode"): _Call(_encode),
    ("numpy", "dtype"): _NpDType,
    ("numpy.core.multiarray", "scalar"): _Call(_np_scalar), ("numpy._core.multiarray", "scalar"): _Call(_np_scalar),
    ("numpy.core.multiarray", "_reconstruct"): _Call(_np_reconstruct),
    ("numpy._core.multiarray", "_reconstruct"): _Call(_np_reconstruct),
    ("numpy", "ndarray"): _NDARRAY,
    ("torch.nn.modules.container", "ParameterDict"): ParameterDict,
    **{(m, n): _inert(m, n) for m, n in (
        ("pytorch_lightning.callbacks.model_checkpoint", "ModelCheckpoint"),
        ("lightning.pytorch.callbacks.model_checkpoint", "ModelCheckpoint"),
        ("pytorch_lightning.callbacks.early_stopping", "EarlyStopping"),
        ("argparse", "Namespace"), ("typing", "Any"), ("torch.torch_version", "TorchVersion"),
        ("omegaconf.dictconfig", "DictConfig"), ("omegaconf.listconfig", "ListConfig"),
        ("omegaconf.base", "ContainerMetadata"), ("omegaconf.base", "Metadata"),
        ("omegaconf.nodes", "AnyNode"), ("omegaconf.nodes", "StringNode"), ("omegaconf.nodes", "IntegerNode"),
        ("omegaconf.nodes", "FloatNode"), ("omegaconf.nodes", "BooleanNode"))},
}
#: opcodes that reach objects without ``find_class`` (the copyreg extension registry) are refused outright
_REFUSED_OPS = {"EXT1", "EXT2", "EXT4"}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storage: Callable[[tuple[Any, ...]], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._storage = storage

    def find_class(self, module: str, name: str) -> Any:
        obj = ALLOWED.get((module, name))
        if obj is None:
            raise _Refused(f"{module}.{name}")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        return self._storage(pid)


def _scan(data: bytes) -> None:
    """Parse the pickle's opcodes (nothing runs) before the unpickler builds anything: refuse a global outside
    ``ALLOWED``, the extension opcodes, and tuples nested deeper than ``MAX_TUPLES``.

    The nesting: hashing a tuple (a dict key, a set element) recurses into the tuples it holds with no recursion
    limit in CPython, so a tuple nested a million deep (a 1 MB pickle) crashes the process. Tuples are immutable
    and only ``TUPLE*`` opcodes make them here (no stand-in returns a nested tuple), so following each stack
    item's tuple depth through the opcodes, and the memo, is exact."""
    depths: list[int] = []  # tuple nesting of each stack item
    marks: list[int] = []
    memo: dict[Any, int] = {}
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in _REFUSED_OPS:
                raise _Refused(f"copyreg extension {arg}")
            if name in ("GLOBAL", "INST"):
                module, _, gname = str(arg).partition(" ")
                if (module, gname) not in ALLOWED:
                    raise _Refused(f"{module}.{gname}")
            if name == "MARK":
                marks.append(len(depths))
                continue
            if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):  # the top of the stack, left there
                if not depths:
                    raise _Malformed("the pickle memoizes an empty stack")
                memo[arg if name != "MEMOIZE" else len(memo)] = depths[-1]
                continue
            before = op.stack_before
            if pickletools.markobject in before:  # the items above the last mark, and those listed below it
                if not marks:
                    raise _Malformed("the pickle pops a mark it never set")
                k = marks.pop() - before.index(pickletools.markobject)
            else:
                k = len(depths) - len(before)
            if k < 0:
                raise _Malformed("the pickle pops more than its stack holds")
            items = depths[k:]
            del depths[k:]
            if name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
                new = [1 + max(items, default=0)]
                if new[0] > MAX_TUPLES:
                    raise _Malformed(f"tuples nested deeper than {MAX_TUPLES} levels: not a checkpoint")
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                new = [memo.get(arg, 0)]
            elif name == "DUP":
                new = items * 2
            elif name in ("APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"):
                new = items[:1]  # the container (a list, dict, set or object; never a tuple) stays
            else:
                new = [0] * len(op.stack_after)
            depths.extend(new)
    except (ValueError, EOFError) as exc:  # genops: a truncated or garbled pickle
        raise _Malformed(f"the pickle is not readable ({exc})") from exc


def _unpickle(data: bytes, storage: Callable[[tuple[Any, ...]], Any], path: Path, scan: bool = True) -> Any:
    try:
        if scan:
            _scan(data)
        return _Unpickler(data, storage).load()
    except _Refused as exc:
        from ..checkpoint.foreign import pickle_class

        what = pickle_class(exc.name)
        if what is not None:  # still refused (nothing of it ran): named, as a file of a tool sdrt does not run
            raise _bad(f"{path.name} is {what}, which sdrt does not run (its pickle holds an object of {exc.name}, "
                       "not a state dict of tensors)", path, "pass a checkpoint of SD 1.x, SD 2.x, SDXL, SD 3.5, "
                       "Flux.1 or Chroma (a .safetensors file)") from None
        raise _bad(f"refusing to load {path.name}: its pickle calls {exc.name}, which is not a tensor or a plain "
                   "container (the file can run code, or it is not a weights file)", path, UNTRUSTED_FIX) from None
    except _Malformed as exc:
        raise _bad(f"{path.name} is not a readable PyTorch checkpoint: {exc}", path) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, RecursionError, OverflowError, UnicodeDecodeError) as exc:
        raise _bad(f"{path.name} is not a readable PyTorch checkpoint ({type(exc).__name__}: {str(exc)[:120]})",
                   path) from None


def _storage_pid(pid: Any) -> tuple[_StorageType, str, int]:
    if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"
            and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[3], str)
            and type(pid[4]) is int and pid[4] >= 0):
        raise _Malformed(f"persistent id {pid!r:.80} is not a storage")
    if len(pid) == 6 and pid[5] is not None:
        raise _Malformed("storage views (torch < 0.4) are not supported")
    stype, key, numel = pid[1], pid[2], pid[4]
    itemsize = 1 if stype.dtype is None else _DTYPES[stype.dtype]().itemsize
    return stype, key, numel * itemsize


# -- the two layouts ------------------------------------------------------------------------------------------
#: what a damaged zip file raises from ``zipfile`` (or from reading it)
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError, NotImplementedError, RuntimeError,
               UnicodeDecodeError, zlib.error, struct.error)


def _read_zip(path: Path) -> tuple[Any, str]:
    try:
        return _read_zip_entries(path)
    except _ZIP_ERRORS as exc:
        raise _bad(f"{path.name} is not a readable PyTorch checkpoint (zip: {str(exc)[:120]})", path) from None


def _read_zip_entries(path: Path) -> tuple[Any, str]:
    with open(path, "rb") as raw, zipfile.ZipFile(path) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        pkls = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise _bad(f"{path.name} is a zip file but not a PyTorch checkpoint (no single <name>/data.pkl)", path)
        prefix = pkls[0][: -len("data.pkl")]
        order = b"little"
        if prefix + "byteorder" in infos:
            with zf.open(prefix + "byteorder") as f:  # 16 bytes at most: a deflated entry may inflate to GBs
                order = f.read(16).strip()
            if order not in (b"little", b"big"):
                raise _bad(f"{path.name}: unknown byte order {order!r}", path)
        info = infos[pkls[0]]
        if info.file_size > MAX_PICKLE:
            raise _bad(f"{path.name}: its pickle is {info.file_size} bytes (more than {MAX_PICKLE}): not a "
                       "checkpoint", path)
        with zf.open(info) as f:
            data = f.read(MAX_PICKLE + 1)
        if len(data) > MAX_PICKLE:
            raise _bad(f"{path.name}: its pickle inflates past {MAX_PICKLE} bytes: not a checkpoint", path)
        size = path.stat().st_size
        storages: dict[str, _Storage] = {}

        def storage(pid: Any) -> tuple[_Storage, str | None]:
            stype, key, nbytes = _storage_pid(pid)
            st = storages.get(key)
            if st is None:
                zi = infos.get(f"{prefix}data/{key}")
                if zi is None:
                    raise _Malformed(f"storage {key!r} is not in the file")
                st = _Storage(key, nbytes, entry=zi.filename, size=zi.file_size)
                if zi.compress_type == zipfile.ZIP_STORED and not zi.flag_bits & 1:
                    st.begin = _stored_begin(raw, zi, size)
                storages[key] = st
            if nbytes > st.size:
                raise _Malformed(f"storage {key!r} holds {st.size} bytes, its tensors say {nbytes}")
            st.nbytes = max(st.nbytes, nbytes)
            return st, stype.dtype

        obj = _unpickle(data, storage, path)
    return obj, order.decode()


def _stored_begin(f: Any, zi: zipfile.ZipInfo, size: int) -> int:
    """Where an uncompressed entry's bytes start: after its local header (whose name and extra field lengths
    may differ from the central directory's)."""
    if not 0 <= zi.header_offset < size:
        raise _Malformed(f"entry {zi.filename} starts outside the file")
    f.seek(zi.header_offset)
    head = f.read(30)
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise _Malformed(f"entry {zi.filename} has no local header")
    n, m = struct.unpack("<HH", head[26:30])
    begin = zi.header_offset + 30 + n + m
    if begin + zi.file_size > size or zi.compress_size != zi.file_size:
        raise _Malformed(f"entry {zi.filename} reaches past the end of the file (truncated)")
    return begin


class _Bounded:
    """A file read from its current position, at most ``limit`` bytes on (what ``pickletools.genops`` reads with)."""

    def __init__(self, f: Any, limit: int) -> None:
        self.f, self.end = f, f.tell() + limit

    def read(self, n: int = -1) -> bytes:
        left = self.end - self.f.tell()
        if n < 0 or n > left:
            raise _Malformed(f"a pickle longer than {MAX_PICKLE} bytes: not a checkpoint")
        return self.f.read(n)

    def readline(self) -> bytes:
        return self.f.readline(max(self.end - self.f.tell(), 0))

    def tell(self) -> int:
        return self.f.tell()


def _read_legacy(path: Path) -> Any:
    with open(path, "rb") as f:
        return _read_legacy_from(path, f, path.stat().st_size)


def _read_legacy_from(path: Path, f: Any, size: int) -> Any:
    storages: dict[str, _Storage] = {}
    itemsizes: dict[str, int] = {}

    def storage(pid: Any) -> tuple[_Storage, str | None]:
        stype, key, nbytes = _storage_pid(pid)
        st = storages.setdefault(key, _Storage(key, nbytes))
        itemsizes.setdefault(key, nbytes // pid[4] if pid[4] else 1)
        if st.nbytes != nbytes:
            raise _Malformed(f"storage {key!r} is given two sizes")
        return st, stype.dtype

    def no_storage(pid: Any) -> Any:
        raise _Malformed("a persistent id outside the object pickle")

    def next_pickle(persistent: Callable[[Any], Any]) -> Any:
        start = f.tell()
        try:
            for _ in pickletools.genops(_Bounded(f, MAX_PICKLE)):  # parses up to and with STOP; runs nothing
                pass
        except (ValueError, EOFError, UnicodeDecodeError, _Malformed) as exc:
            raise _bad(f"{path.name} is not a readable PyTorch checkpoint (pickle: {str(exc)[:120]})", path) from None
        end = f.tell()
        f.seek(start)
        data = f.read(end - start)
        return _unpickle(data, persistent, path)

    if f.read(1) != b"\x80":
        raise _bad(f"{path.name} is not a PyTorch checkpoint", path)
    f.seek(0)
    if next_pickle(no_storage) != LEGACY_MAGIC:
        raise _bad(f"{path.name} is a pickle but not a PyTorch checkpoint (no torch magic number)", path,
                   UNTRUSTED_FIX)
    if next_pickle(no_storage) != 1001:
        raise _bad(f"{path.name}: unknown legacy PyTorch protocol", path)
    info = next_pickle(no_storage)
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise _bad(f"{path.name}: a big-endian legacy checkpoint is not supported", path)
    obj = next_pickle(storage)
    keys = next_pickle(no_storage)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or set(keys) != set(storages):
        raise _bad(f"{path.name}: the storage list does not match the tensors (corrupt file)", path)
    pos = f.tell()
    for key in keys:
        st = storages[key]
        f.seek(pos)
        head = f.read(8)
        if len(head) < 8:
            raise _bad(f"{path.name} is truncated (storage {key!r} is missing)", path)
        count = int.from_bytes(head, "little")
        if count * itemsizes[key] != st.nbytes:
            raise _bad(f"{path.name}: storage {key!r} holds {count} items, its tensors say {st.nbytes} bytes",
                       path)
        st.begin = pos + 8
        st.size = st.nbytes
        pos = st.begin + st.nbytes
        if pos > size:
            raise _bad(f"{path.name} is truncated (storage {key!r} ends past the end of the file)", path)
    return obj


def read(path: Path) -> tuple[dict[str, _Tensor], str]:
    """The flattened tensors of a checkpoint (``state_dict`` when it has one) and its byte order."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise _bad(f"cannot read the file ({exc.strerror or exc})", path, "check the path and permissions") from exc
    if head[:4] == b"PK\x03\x04":
        obj, order = _read_zip(path)
    else:
        obj, order = _read_legacy(path), "little"
    return flatten(obj, path), order


def flatten(obj: Any, path: Path | str = "<pickle>") -> dict[str, _Tensor]:
    """A1111's view of a checkpoint: ``obj.get("state_dict", obj)``, nested dicts joined with ``.`` (a
    ``ParameterDict`` is its parameters), everything but tensors dropped. Iterative, cycles skipped."""
    if isinstance(obj, dict) and isinstance(dict.get(obj, "state_dict"), dict):
        obj = dict.get(obj, "state_dict")
    if isinstance(obj, _Tensor):
        return {"": obj}
    out: dict[str, _Tensor] = {}
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = []  # depth first, in the file's order, as a recursive walk would go

    def enter(prefix: str, node: Any) -> None:
        if isinstance(node, ParameterDict):
            state = node.state[0] if isinstance(node.state, tuple) and node.state else node.state
            node = dict.get(state, "_parameters") if isinstance(state, dict) else None
        if not isinstance(node, dict) or id(node) in seen:
            return
        if len(stack) >= MAX_DEPTH:
            raise _bad(f"dicts nested deeper than {MAX_DEPTH} levels: not a checkpoint", path)
        seen.add(id(node))
        stack.append((prefix, iter(list(dict.items(node)))))

    enter("", obj)
    while stack:
        prefix, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            continue
        k, v = item
        if not isinstance(k, (str, int)) or isinstance(k, bool):
            continue
        if isinstance(v, _Tensor):
            out.setdefault(f"{prefix}{k}", v)
        else:
            enter(f"{prefix}{k}.", v)
    return out


# -- tensors ------------------------------------------------------------------------------------------------
def _load(path: Path, t: _Tensor, order: str) -> np.ndarray:
    dt = _DTYPES[t.dtype]()
    if order == "big" and dt.itemsize > 1:
        dt = dt.newbyteorder(">")
    st = t.storage
    if math.prod(t.shape) == 0:
        return np.zeros(t.shape, dt.newbyteorder("="))
    if st.begin is not None:
        try:
            raw = np.memmap(path, dtype=np.uint8, mode="r", offset=st.begin, shape=(st.nbytes,))
        except (OSError, ValueError) as exc:
            raise _bad(f"cannot map storage {st.key!r} ({exc})", path) from exc
        raw = np.asarray(raw)
    else:  # a compressed entry: read and inflated
        try:
            with zipfile.ZipFile(path) as zf, zf.open(st.entry or "") as f:
                raw = np.frombuffer(f.read(st.nbytes), np.uint8)
        except _ZIP_ERRORS as exc:
            raise _bad(f"cannot read storage {st.key!r} ({str(exc)[:120]})", path) from None
        if raw.size < st.nbytes:
            raise _bad(f"storage {st.key!r} is truncated", path)
    flat = raw[: st.nbytes - st.nbytes % dt.itemsize].view(dt)
    if _contiguous(t):
        arr = flat[t.offset: t.offset + math.prod(t.shape)].reshape(t.shape)
    else:
        view = np.lib.stride_tricks.as_strided(flat[t.offset:], t.shape, [s * dt.itemsize for s in t.stride],
                                               writeable=False)
        arr = np.ascontiguousarray(view)
    return arr.astype(dt.newbyteorder("=")) if order == "big" and dt.itemsize > 1 else arr


def _contiguous(t: _Tensor) -> bool:
    want = 1
    for n, s in zip(reversed(t.shape), reversed(t.stride)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _origin(path: Path, t: _Tensor) -> tuple[Any, ...]:
    itemsize = _DTYPES[t.dtype]().itemsize
    st = t.storage
    if st.begin is None:
        return (str(path), 0, st.nbytes, f"zip entry {st.entry} {t.dtype} {t.offset} {t.shape} {t.stride}")
    if _contiguous(t):
        return (str(path), st.begin + t.offset * itemsize, math.prod(t.shape) * itemsize)
    return (str(path), st.begin, st.nbytes, f"as_strided {t.dtype} {t.offset} {t.shape} {t.stride}")


def open_tensors(path: Path) -> dict[str, tuple[np.dtype, tuple[int, ...], Callable[[], np.ndarray], tuple[Any, ...]]]:
    """``{name: (dtype, shape, load, origin)}`` of a PyTorch checkpoint (``store`` makes them ``TensorRef``s);
    nothing is read but its pickle."""
    tensors, order = read(path)
    refs = {}
    for name, t in tensors.items():
        try:  # once more, now that the pickle is done with: nothing it did after a rebuild changed the records
            if not (isinstance(t.storage, _Storage) and type(t.storage.nbytes) is int and t.dtype in _DTYPES
                    and t.storage.nbytes <= t.storage.size):
                raise _Malformed(f"tensor {name!r} lost its storage")
            _rebuild((t.storage, None), t.offset, t.shape, t.stride, t.dtype)
        except _Malformed as exc:
            raise _bad(f"{path.name} is not a readable PyTorch checkpoint: {exc}", path) from None
        refs[name] = (_DTYPES[t.dtype](), t.shape, (lambda t=t: _load(path, t, order)), _origin(path, t))
    return refs
