"""PNG output with A1111's ``parameters`` text chunk, written and read with zlib and struct only.

:func:`format_parameters` builds the text A1111's ``create_infotext`` builds::

    a cat in the snow
    Negative prompt: blurry
    Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 512x512, Model: sd15

:func:`write_png` stores it in a ``tEXt`` chunk (``iTXt``, UTF-8, when the text
is not Latin-1), as Pillow does for A1111, before the image data, so A1111,
Forge, ComfyUI and image browsers read it. :func:`read_parameters` reads it back.
No Pillow is needed by either.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import SdrtError

SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: the order of A1111's ``create_infotext`` (modules/processing.py); other keys follow in the order given,
#: then ``Version`` and ``User``, which A1111 writes last
A1111_ORDER = (
    "Steps", "Sampler", "Schedule type", "CFG scale", "Image CFG scale", "Seed", "Face restoration", "Size",
    "Model hash", "Model", "FP8 weight", "Cache FP16 weight for LoRA", "VAE hash", "VAE", "Variation seed",
    "Variation seed strength", "Seed resize from", "Denoising strength", "Conditional mask weight", "Clip skip",
    "ENSD", "Token merging ratio", "Token merging ratio hr", "Init image hash", "RNG", "Tiling",
)
_LAST = ("Version", "User")
_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type (grey, grey+alpha, RGB, RGBA)


class PngError(SdrtError):
    """An image cannot be written as PNG, or a file is not a readable PNG."""


def quote(value: object) -> object:
    """A1111's ``infotext_utils.quote``: JSON-quote a value holding ``,``, ``:`` or a newline."""
    text = str(value)
    if "," not in text and "\n" not in text and ":" not in text:
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def format_parameters(prompt: str, negative_prompt: str | None, settings: Mapping[str, object]) -> str:
    """A1111's ``parameters`` text: prompt, ``Negative prompt:`` line (left out when empty), settings line.

    ``settings`` maps A1111's labels (``"Steps"``, ``"Sampler"``, ``"Schedule type"``,
    ``"CFG scale"``, ``"Seed"``, ``"Size"``, ``"Model hash"``, ``"Model"``, ...) to values;
    ``None`` values are left out, known labels are put in A1111's order, a value
    equal to its label is written bare, and values holding ``,``, ``:`` or a
    newline are JSON-quoted.
    """
    known = [k for k in A1111_ORDER if k in settings]
    rest = [k for k in settings if k not in A1111_ORDER and k not in _LAST]
    last = [k for k in _LAST if k in settings]
    items = [(k, settings[k]) for k in (*known, *rest, *last)]
    line = ", ".join(k if k == v else f"{k}: {quote(v)}" for k, v in items if v is not None)
    negative = f"\nNegative prompt: {negative_prompt}" if negative_prompt else ""
    return f"{prompt}{negative}\n{line}".strip()


# -- writing ------------------------------------------------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _text_chunk(key: str, value: str) -> bytes:
    """``tEXt`` for Latin-1 text, ``iTXt`` (UTF-8, uncompressed) otherwise: Pillow's ``PngInfo.add_text``."""
    try:
        name = key.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise PngError(f"the text key {key!r} is not Latin-1", where="write_png(extra=...)",
                       fix="use a plain ASCII key such as 'parameters'") from exc
    if not 1 <= len(name) <= 79 or b"\0" in name or name != name.strip():
        raise PngError(f"the text key {key!r} is not a PNG keyword (1-79 characters, no NUL, no edge spaces)",
                       where="write_png(extra=...)", fix="use a short plain key such as 'parameters'")
    try:
        return _chunk(b"tEXt", name + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        return _chunk(b"iTXt", name + b"\0\0\0" + b"\0" + b"\0" + value.encode("utf-8"))


def _paeth_rows(pixels: np.ndarray) -> bytes:
    """Filter every scanline with Paeth (type 4); vectorised, since encoding uses the unfiltered neighbours."""
    h, w, c = pixels.shape
    x = pixels.reshape(h, w * c).astype(np.int16)
    left = np.zeros_like(x)
    left[:, c:] = x[:, :-c]
    up = np.zeros_like(x)
    up[1:] = x[:-1]
    upleft = np.zeros_like(x)
    upleft[1:, c:] = x[:-1, :-c]
    p = left + up - upleft
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - upleft)
    predictor = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upleft))
    filtered = ((x - predictor) & 0xFF).astype(np.uint8)
    rows = np.empty((h, w * c + 1), np.uint8)
    rows[:, 0] = 4
    rows[:, 1:] = filtered
    return rows.tobytes()


def encode_png(image: Any, parameters: str | None = None, extra: Mapping[str, str] | None = None) -> bytes:
    """The bytes of a PNG of ``image`` (HxWx3 uint8; HxW, HxWx1, HxWx2 and HxWx4 also work) with text chunks."""
    pixels = np.asarray(image)
    if pixels.dtype != np.uint8:
        raise PngError(f"the image has dtype {pixels.dtype}, not uint8", where="image",
                       fix="convert it first, e.g. (x.clip(0, 1) * 255).round().astype(np.uint8)")
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.ndim != 3 or pixels.shape[2] not in _COLOR_TYPES or 0 in pixels.shape[:2]:
        raise PngError(f"the image has shape {tuple(np.shape(image))}, not HxWx3 (or HxW, HxWx4) with H, W > 0",
                       where="image", fix="pass one image as height x width x channels; index a batch first")
    h, w, c = pixels.shape
    if h >= 2**31 or w >= 2**31:
        raise PngError(f"the image is {w}x{h}, larger than PNG allows", where="image", fix="tile it")
    texts = {} if parameters is None else {"parameters": parameters}
    for key, value in (extra or {}).items():
        texts[str(key)] = str(value)
    parts = [SIGNATURE, _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, _COLOR_TYPES[c], 0, 0, 0))]
    parts += [_text_chunk(k, v) for k, v in texts.items()]
    parts += [_chunk(b"IDAT", zlib.compress(_paeth_rows(np.ascontiguousarray(pixels)), 6)), _chunk(b"IEND", b"")]
    return b"".join(parts)


def write_png(
    path_or_file: str | os.PathLike[str] | IO[bytes],
    image: Any,
    parameters: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path | None:
    """Write ``image`` as PNG with A1111's ``parameters`` chunk and any ``extra`` text chunks.

    A path is written atomically (a temporary file in the same folder, then a
    rename) and returned; it must name a regular file or a new one (see
    :func:`output_target`: a folder, device, FIFO or socket is refused, a symlink
    is written through to its target). A binary file object is written to, and
    its ``name`` is returned as a Path when it has one (else None).
    """
    if not hasattr(path_or_file, "write"):
        output_target(path_or_file)  # type: ignore[arg-type]
    data = encode_png(image, parameters, extra)
    if hasattr(path_or_file, "write"):
        path_or_file.write(data)  # type: ignore[union-attr]
        name = getattr(path_or_file, "name", None)
        return Path(name) if isinstance(name, str) else None
    return write_file(path_or_file, data)  # type: ignore[arg-type]


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    return next((word for test, word in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def output_target(path: str | os.PathLike[str], arg: str = "path", suffix: str = ".png") -> Path:
    """The regular file that writing an image to ``path`` replaces (or creates); refuses every other target.

    A path that exists must be a regular file: a folder, device, FIFO or socket is refused, since
    writing replaces the file by renaming a new one over it. A symlink is written through to its
    target, as ``cp`` does: the link stays and its target gets the image; a dangling symlink, or
    one to a non-regular file, is refused, and so are a read-only file and a folder this user cannot write
    in. ``arg`` names the argument in the error (``{@arg}``), ``suffix`` the kind of file its fix suggests.
    """
    where = f"{{@{arg}}}"
    text = os.fspath(path)
    if not text:
        raise PngError("the output path is empty", where=where, fix="name a file, such as out.png")
    from ..cache.paths import DANGLING_FIX, write_target

    try:
        target = write_target(text)
    except FileNotFoundError as exc:
        raise PngError(exc.strerror, where=where, fix=DANGLING_FIX) from None
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise PngError(f"cannot look at {text} ({exc.strerror or exc})", where=where, fix="pick another file") from exc
    if mode is not None and _kind(mode):
        shown = text if target == Path(text) else f"{text} (a symlink to {target})"
        raise PngError(f"{shown} is {_kind(mode)}, not a regular file; sdrt writes its outputs only to regular "
                       "files", where=where, fix="give a file name, such as " + str(Path(text) / f"out{suffix}" if
                                                                                   stat.S_ISDIR(mode) else f"out{suffix}"))
    if not target.parent.is_dir():
        raise PngError(f"the output folder does not exist: {target.parent}", where=where,
                       fix=f"create it first (mkdir -p {target.parent}) or write somewhere else")
    if mode is not None and (not mode & 0o222 or not os.access(target, os.W_OK)):  # as replace_mode refuses it
        raise PngError(f"{text} is a read-only file; it is not replaced", where=where,
                       fix=f"make it writable (chmod u+w {text}), or pick another file name")
    if not os.access(target.parent, os.W_OK | os.X_OK):  # the new file is made there, then renamed
        raise PngError(f"cannot write into the folder {target.parent}: it is not writable", where=where,
                       fix="pick a folder you can write to")
    _probe(target.parent, where)
    return target


def _probe(folder: Path, where: str) -> None:
    """Create and remove a file in ``folder``: permissions can say yes where no file can be made (``/proc``,
    ``/sys``, a read-only mount, a full disk's inode table), which would otherwise be found after the run."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".sdrt-probe-")
    except OSError as exc:
        raise PngError(f"cannot write into the folder {folder} ({exc.strerror or exc})", where=where,
                       fix="pick a folder you can write to") from None
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass


def write_file(path: str | os.PathLike[str], data: bytes | memoryview) -> Path:
    """Write ``data`` to the regular file ``path`` atomically (``sdrt.cache.write_atomic``: a temporary file,
    synced, then a rename; written over, a file keeps its mode as a plain ``open`` would keep it, and the
    target is checked again right before the rename); returns ``path``."""
    from ..cache.paths import write_atomic

    path = Path(path)
    output_target(path)
    try:
        write_atomic(path, [data])
    except OSError as exc:
        raise PngError(f"cannot write {path} ({exc.strerror or exc})", where=str(path),
                       fix="check that the folder exists and is writable, and that the disk has room") from exc
    return path


# -- reading ------------------------------------------------------------------------------------------------------


#: the most text (bytes of it, after inflating) ``read_text_chunks`` reads from one PNG
MAX_TEXT = 16 * 2**20


def read_text_chunks(path_or_file: str | os.PathLike[str] | IO[bytes] | bytes) -> dict[str, str]:
    """Every ``tEXt``, ``zTXt`` and ``iTXt`` chunk of a PNG as ``{key: text}`` (the first of a repeated key)."""
    data, where = _read_bytes(path_or_file)
    if not data.startswith(SIGNATURE):
        from ..formats import image_kind

        kind = image_kind(data[:16])
        if kind in ("a JPEG image", "a WebP image"):  # what sdrt generate -o x.jpg / x.webp writes
            raise PngError(f"the file is {kind}, not a PNG: its generation parameters are in EXIF UserComment",
                           where=where, fix="read them with sdrt.pipelines.save.read_user_comment(path)")
        raise PngError("the file is not a PNG (no PNG signature)", where=where, fix="give a .png file")
    texts: dict[str, str] = {}
    left = MAX_TEXT  # compressed text is inflated within this budget: a few KB of zTXt can hold gigabytes
    pos = len(SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if len(body) < length:
            raise PngError(f"the PNG is truncated inside a {kind.decode('latin-1')!r} chunk at byte {pos}",
                           where=where, fix="the file is incomplete; write it again")
        pos += 12 + length
        if kind == b"IEND":
            break
        if kind in (b"zTXt", b"iTXt") and body.split(b"\0", 1)[0].decode("latin-1") in texts:
            continue  # a repeated key: the first is kept, the rest is not inflated
        parsed = _parse_text(kind, body, left)
        if parsed is not None and parsed[0] not in texts:
            texts[parsed[0]] = parsed[1]
            left -= len(parsed[1])
            if left < 0:
                raise PngError(f"the PNG's text chunks hold over {MAX_TEXT // 2**20} MB of text, which is no "
                               "generation parameters", where=where, fix="give a PNG with its parameters text")
    return texts


def read_parameters(path_or_file: str | os.PathLike[str] | IO[bytes] | bytes) -> str | None:
    """The A1111 ``parameters`` text of a PNG, or None when it has none."""
    return read_text_chunks(path_or_file).get("parameters")


def _read_bytes(source: str | os.PathLike[str] | IO[bytes] | bytes) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>"
    if hasattr(source, "read"):
        return source.read(), str(getattr(source, "name", "<stream>"))  # type: ignore[union-attr]
    path = Path(source)  # type: ignore[arg-type]
    try:
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise PngError(f"cannot read the file ({exc.strerror or exc})", where=str(path),
                       fix="check the path") from exc


def _inflate(raw: bytes, limit: int = MAX_TEXT) -> str | None:
    """The text of a compressed chunk, inflated up to ``limit`` bytes and one more (the caller's budget: one past it
    says the text is over it)."""
    try:
        out = zlib.decompressobj()
        text = out.decompress(raw, max(limit, 0) + 1)
        return text.decode("utf-8", errors="replace")
    except zlib.error:
        return None


def _parse_text(kind: bytes, body: bytes, limit: int = MAX_TEXT) -> tuple[str, str] | None:
    """``(key, text)`` of a text chunk (a compressed one inflated up to ``limit`` bytes and one more); None for other
    chunks and for text chunks too broken to read."""
    if kind not in (b"tEXt", b"zTXt", b"iTXt") or b"\0" not in body:
        return None
    name, rest = body.split(b"\0", 1)
    key = name.decode("latin-1")
    if kind == b"tEXt":
        return key, rest.decode("latin-1")
    if kind == b"zTXt":
        text = _inflate(rest[1:], limit) if rest[:1] == b"\0" else None
        return None if text is None else (key, text)
    if len(rest) < 2 or rest[2:].count(b"\0") < 2:
        return None
    compressed, method = rest[0], rest[1]
    _language, _translated, text_bytes = rest[2:].split(b"\0", 2)
    if compressed:
        text = _inflate(text_bytes, limit) if method == 0 else None
        return None if text is None else (key, text)
    return key, text_bytes.decode("utf-8", errors="replace")


__all__ = [
    "A1111_ORDER",
    "PngError",
    "encode_png",
    "format_parameters",
    "output_target",
    "quote",
    "read_parameters",
    "read_text_chunks",
    "write_file",
    "write_png",
]



