"""Odd and broken picture files for the picture-input fuzz tests (tests/fuzz/test_fuzz_pictures.py).

``KINDS`` names each kind of file and how sdrt treats it: ``"used"`` (read as a picture: the run goes on) or
``"refused"`` (a one-line error naming the flag or argument and the file). ``make(kind, path)`` writes one.
Every picture is tiny (at most 16x16 pixels), so a run on it stays cheap.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def _rgb(w: int = 16, h: int = 16) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    return Image.fromarray(np.stack([x * 16 % 256, y * 16 % 256, (x + y) * 8 % 256], -1).astype(np.uint8))


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (8-bit grey) over one tiny compressed row: a decompression
    bomb's shape, without its bytes."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(b"\x00" * (min(width, 64) + 1))) + _chunk(b"IEND", b""))


def _exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 clockwise to view
    return _save(_rgb(16, 8), "JPEG", exif=exif.tobytes())


def _animated(fmt: str) -> bytes:
    frames = [_rgb(), Image.new("RGB", (16, 16), (255, 0, 0)), Image.new("RGB", (16, 16), (0, 0, 255))]
    return _save(frames[0], fmt, save_all=True, append_images=frames[1:], duration=50, loop=0)


def _sixteen_bit_rgb() -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow writes none: built by hand)."""
    w = h = 8
    rows = b"".join(b"\x00" + np.full((w, 3), 0x8000 + 300 * r, ">u2").tobytes() for r in range(h))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))


def _good() -> dict[str, bytes]:
    rgb = _rgb()
    grey16 = Image.fromarray(np.arange(256, dtype=np.uint16).reshape(16, 16) * 257)
    la = rgb.convert("LA")
    return {
        "png": _save(rgb, "PNG"),
        "jpeg": _save(rgb, "JPEG"),
        "webp": _save(rgb, "WEBP"),
        "gif": _save(rgb, "GIF"),
        "bmp": _save(rgb, "BMP"),
        "tiff": _save(rgb, "TIFF"),
        "rgba.png": _save(rgb.convert("RGBA"), "PNG"),
        "la.png": _save(la, "PNG"),
        "l.png": _save(rgb.convert("L"), "PNG"),
        "1bit.png": _save(rgb.convert("1"), "PNG"),
        "palette.png": _save(rgb.convert("P"), "PNG"),
        "palette-transparent.png": _save(rgb.convert("P"), "PNG", transparency=0),
        "i16.png": _save(grey16, "PNG"),
        "rgb16.png": _sixteen_bit_rgb(),
        "cmyk.jpg": _save(rgb.convert("CMYK"), "JPEG"),
        "cmyk.tiff": _save(rgb.convert("CMYK"), "TIFF"),
        "f.tiff": _save(Image.fromarray(np.linspace(0, 1, 256, dtype=np.float32).reshape(16, 16)), "TIFF"),
        "exif-rotated.jpg": _exif_rotated(),
        "animated.gif": _animated("GIF"),
        "animated.png": _animated("PNG"),
        "animated.webp": _animated("WEBP"),
        "progressive.jpg": _save(rgb, "JPEG", progressive=True),
        "1x1.png": _save(_rgb(1, 1), "PNG"),
        "1x16.png": _save(_rgb(1, 16), "PNG"),
        "16x1.png": _save(_rgb(16, 1), "PNG"),
        "png-named.jpg": _save(rgb, "PNG"),  # a suffix that lies: read by its bytes, as every viewer does
    }


def _bad() -> dict[str, bytes]:
    good = _good()
    return {
        "empty.png": b"",
        "text.png": b"this is not a picture\n",
        "truncated.png": good["png"][: len(good["png"]) // 2],
        "truncated.jpg": good["jpeg"][: len(good["jpeg"]) // 2],
        "truncated.webp": good["webp"][: len(good["webp"]) // 2],
        "header-only.png": good["png"][:33],
        "bad-crc.png": good["png"][:29] + bytes([good["png"][29] ^ 0xFF]) + good["png"][30:],
        "bomb.png": png_declaring(20000, 20000),  # 400 million pixels: past Pillow's limit (2 x 89 million)
        "zero-width.png": png_declaring(0, 16),
    }


GOOD = _good()
BAD = _bad()
#: every kind: "used" or "refused"
KINDS = {**{k: "used" for k in GOOD}, **{k: "refused" for k in BAD}}
SEEDS = [GOOD[k] for k in ("png", "jpeg", "webp", "gif", "animated.png", "palette-transparent.png", "rgb16.png",
                           "exif-rotated.jpg", "tiff")]


def make(kind: str, folder: Path) -> Path:
    """The file of ``kind`` in ``folder``, named after it (``.png`` when the kind has no suffix)."""
    data = GOOD.get(kind, BAD.get(kind))
    path = folder / (kind if "." in kind else f"{kind}.{kind}")
    path.write_bytes(data)
    return path
