"""Saving generated images: the format follows the file's suffix, with the generation's text as A1111 stores it.

- ``.png`` (and a name without a suffix): PNG with the ``parameters`` text chunk, no Pillow needed
  (:mod:`sdrt.pipelines.png`).
- ``.jpg``/``.jpeg``/``.webp``: written by Pillow, with the text in EXIF ``UserComment`` (tag 0x9286
  of the Exif IFD) as ``UNICODE\\0`` + UTF-16-BE, which is how A1111's ``save_image_with_geninfo``
  writes it (``piexif.helper.UserComment.dump(text, encoding="unicode")``) and reads it back.

:func:`check_output` does every check (suffix, Pillow, the target file) before any long work.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .png import PngError, output_target, write_file, write_png

#: suffix -> Pillow's format name (None: sdrt's own PNG writer)
FORMATS = {".png": None, "": None, ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}
#: A1111's defaults (``jpeg_quality`` 80, used for WebP too; ``webp_lossless`` off)
QUALITY = 80
#: the largest side each Pillow format can store (WebP's is 14 bits; JPEG's header holds 16-bit sides)
MAX_SIDE = {"WEBP": 16383, "JPEG": 65535}
EXIF_IFD, USER_COMMENT = 0x8769, 0x9286


def image_format(path: str | os.PathLike[str], arg: str = "path") -> str | None:
    """Pillow's format name for ``path``'s suffix (None for PNG); refuses a suffix sdrt cannot write."""
    suffix = Path(os.fspath(path)).suffix.lower()
    if suffix not in FORMATS:
        raise PngError(f"cannot write images as {suffix!r} files", where=f"{{@{arg}}} {os.fspath(path)}",
                       fix="end the file name in .png, .jpg, .jpeg or .webp")
    return FORMATS[suffix]


def _pillow(arg: str = "path") -> Any:
    from .images import PILLOW_HINT

    try:
        from PIL import Image
    except ImportError as exc:
        raise PngError("writing JPEG or WebP needs Pillow, which is not installed", where=f"{{@{arg}}}",
                       fix=PILLOW_HINT + ", or write a .png") from exc
    return Image


def check_output(path: str | os.PathLike[str], arg: str = "path") -> Path:
    """Everything that could stop :func:`save_image` from writing ``path``, checked now: the suffix,
    Pillow for JPEG/WebP, and the target (a regular file or a new one, see ``output_target``)."""
    fmt = image_format(path, arg)
    if fmt is not None:
        _pillow(arg)
    target = output_target(path, arg)
    if FORMATS.get(target.suffix.lower(), "") != fmt:  # only through a link (link.png to notes.txt): it would be replaced
        raise PngError(f"{os.fspath(path)} is a symlink to {target}, and an image written through it would replace "
                       f"that {target.suffix or 'suffix-less'} file with a {fmt or 'PNG'} image",
                       where=f"{{@{arg}}}", fix="point the link at an image file of its own suffix, or pick another "
                                                  "file name")
    return target


def check_size(path: str | os.PathLike[str], width: int, height: int, arg: str = "path") -> None:
    """Refuses a ``width x height`` image that ``path``'s format cannot store (WebP: 16383 pixels a side, JPEG:
    65535), so that a caller can say so before the run that makes it, not after."""
    fmt = image_format(path, arg)
    limit = MAX_SIDE.get(fmt or "")
    if limit is not None and max(width, height) > limit:
        name = "WebP" if fmt == "WEBP" else fmt
        raise PngError(f"a {name} image is at most {limit} pixels a side, and this one is {width}x{height}",
                       where=f"{{@{arg}}} {os.fspath(path)}",
                       fix="write a .png (no such limit)" + (", or a .jpg (65535 a side)" if fmt == "WEBP" else "")
                       + ", or make a smaller image")


def user_comment(text: str) -> bytes:
    """EXIF ``UserComment`` bytes for ``text`` as A1111 writes them: the ``UNICODE`` code and UTF-16-BE."""
    return b"UNICODE\0" + text.encode("utf-16-be")


def encode_image(image: Any, fmt: str | None, parameters: str | None = None) -> bytes:
    """The file bytes of ``image`` (HxWx3 uint8) in ``fmt`` (None: PNG), with ``parameters`` stored."""
    from .png import encode_png

    if fmt is None:
        return encode_png(image, parameters)
    Image = _pillow()
    pixels = np.asarray(image)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise PngError(f"the image has shape {pixels.shape} and dtype {pixels.dtype}, not HxWx3 uint8",
                       where="save_image", fix="pass one RGB image as a uint8 array")
    limit = MAX_SIDE.get(fmt)
    if limit is not None and max(pixels.shape[:2]) > limit:  # Pillow's own error was a traceback (ValueError, OSError)
        name = "WebP" if fmt == "WEBP" else fmt
        raise PngError(f"a {name} image is at most {limit} pixels a side, and this one is "
                       f"{pixels.shape[1]}x{pixels.shape[0]}", where="save_image",
                       fix="write it as a .png (no such limit), or make a smaller image")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, quality=QUALITY, exif=exif_block(parameters) if parameters else b"")
    return buf.getvalue()


def exif_block(text: str) -> bytes:
    """An EXIF block (``Exif\\0\\0`` and a big-endian TIFF) holding only ``UserComment`` = ``text``, typed
    UNDEFINED as the EXIF standard says (Pillow would type raw bytes BYTE, which piexif, and so A1111,
    cannot read back): IFD0 points to the Exif IFD, whose one entry points to the comment."""
    comment = user_comment(text)
    ifd0 = struct.pack(">H", 1) + struct.pack(">HHII", EXIF_IFD, 4, 1, 8 + 18) + struct.pack(">I", 0)
    exif_ifd = struct.pack(">H", 1) + struct.pack(">HHII", USER_COMMENT, 7, len(comment), 8 + 18 + 18)
    exif_ifd += struct.pack(">I", 0)
    return b"Exif\0\0" + b"MM\0*" + struct.pack(">I", 8) + ifd0 + exif_ifd + comment


def save_image(path: str | os.PathLike[str], image: Any, parameters: str | None = None) -> Path:
    """Write ``image`` to ``path`` in the format its suffix names, atomically; returns ``path``."""
    if not isinstance(path, (str, os.PathLike)):  # save_image(image, path): os.fspath's TypeError, a traceback
        hint = " (the image first? the path comes first)" if isinstance(image, (str, os.PathLike)) else ""
        raise PngError(f"path must be a file path (str or pathlib.Path), got {type(path).__name__}{hint}",
                       where="path", fix="call save_image(path, image)")
    fmt = image_format(path)
    if fmt is None:
        out = write_png(path, image, parameters)
        assert out is not None
        return out
    return write_file(path, encode_image(image, fmt, parameters))


def read_user_comment(path: str | os.PathLike[str]) -> str | None:
    """The text of a JPEG/WebP's EXIF ``UserComment`` (A1111's ``parameters``), or None."""
    Image = _pillow()
    with Image.open(path) as img:
        raw = img.getexif().get_ifd(EXIF_IFD).get(USER_COMMENT)
    if not isinstance(raw, bytes):
        return raw
    code, body = raw[:8], raw[8:]
    if code == b"UNICODE\0":
        return body.decode("utf-16-be", errors="replace")
    return body.decode("ascii" if code == b"ASCII\0\0\0" else "latin-1", errors="replace")


__all__ = ["FORMATS", "MAX_SIDE", "check_output", "check_size", "encode_image", "exif_block", "image_format", "read_user_comment",
           "save_image", "user_comment"]
