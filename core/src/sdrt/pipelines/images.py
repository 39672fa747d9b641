"""Images in and out: HxWx3 uint8 numpy arrays; Pillow images and image files when Pillow is installed.

Pillow is not a core dependency (22 MB of the 200 MB budget): ``pip install pillow`` adds it (from a
checkout, ``pip install './core[images]'`` does the same), for reading JPEG/PNG inputs from paths,
writing JPEG/WebP outputs and passing ``PIL.Image`` objects. Numpy arrays always
work, and PNG output needs no Pillow (``sdrt.pipelines.png``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

ImageLike = Any  # np.ndarray | PIL.Image.Image | str | os.PathLike

#: how to get Pillow: the core's ``images`` extra is not on PyPI yet, the package is
PILLOW_HINT = "install Pillow: pip install pillow (from a checkout of sdrt: pip install './core[images]')"


def _open_file(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise InputError(f"the {what} file does not exist", where=str(path), fix="check the path")
    try:
        from PIL import Image
    except ImportError as exc:
        raise InputError(f"reading the {what} from a file needs Pillow, which is not installed", where=str(path),
                         fix=PILLOW_HINT) from exc
    try:
        with Image.open(path) as img:
            img.load()
            return _from_pil(img, what)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InputError(f"cannot read the {what} as an image ({exc})", where=str(path),
                         fix="use a PNG or JPEG file") from exc


#: the keyword each image is given as (its errors name it): the label otherwise
_KEYWORD = {"init image": "init_image"}


def _path(value: Any) -> Path | None:
    """``value`` as a path when it is one: ``str``, ``os.PathLike`` or ``bytes`` (as ``open`` takes them)."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    if isinstance(value, bytes):
        return Path(os.fsdecode(value))
    return None


def _array(value: Any, what: str, where: str) -> np.ndarray:
    """``np.asarray(value)``, an ``InputError`` for what numpy cannot make one array of (ragged nested lists)."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise InputError(f"the {what} is not an image array: numpy cannot read a {type(value).__name__} of this "
                         f"shape as one ({str(exc).split('.')[0]})", where=where,
                         fix="pass an HxWx3 uint8 numpy array, a Pillow image or an image file path") from None


def _from_pil(img: Any, what: str) -> np.ndarray:
    mode = "L" if what == "mask" else "RGB"
    return np.asarray(img.convert(mode))


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "convert")


def check_path(value: Any, what: str) -> None:
    """Fail early (before any model loads) on a path that does not exist."""
    path = _path(value)
    if path is not None and path.is_dir():
        raise InputError(f"the {what} {path} is a folder, not an image file", where=str(path),
                         fix="pass an image file (PNG, JPEG) in that folder")
    if path is not None and not path.is_file():
        raise InputError(f"the {what} file does not exist", where=str(path), fix="check the path")


def to_rgb(value: ImageLike, what: str = "init image", where: str | None = None) -> np.ndarray:
    """HxWx3 uint8 from an array (HxW, HxWx1/3/4; uint8, or float in [0, 1]), a Pillow image or a path.
    ``where``: the argument the image was given as (default: the keyword ``what`` names)."""
    where = where or _KEYWORD.get(what, what)
    path = _path(value)
    if path is not None:
        return _open_file(path, what)
    if _is_pil(value):
        return _from_pil(value, what)
    arr = _array(value, what, where)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4) or 0 in arr.shape:
        raise InputError(f"the {what} has shape {arr.shape}", where=where,
                         fix="pass an HxWx3 uint8 array (HxW, HxWx1 and HxWx4 are accepted too)")
    arr = _to_uint8(arr, what, where)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    return np.ascontiguousarray(arr[..., :3])


def to_mask(value: ImageLike, height: int, width: int) -> np.ndarray:
    """HxW float32 in {0, 1}, 1 where the image is repainted (diffusers: grayscale, then binarized at 0.5)."""
    path = _path(value)
    if path is not None:
        gray = _open_file(path, "mask").astype(np.float32) / 255
    elif _is_pil(value):
        gray = np.asarray(value.convert("L")).astype(np.float32) / 255
    else:
        arr = _array(value, "mask", "mask")
        if arr.dtype == bool:
            arr = arr.astype(np.uint8) * 255
        if arr.ndim == 3 and arr.shape[-1] in (3, 4):
            rgb = _to_uint8(arr[..., :3], "mask").astype(np.uint32)
            arr = ((rgb[..., 0] * 299 + rgb[..., 1] * 587 + rgb[..., 2] * 114 + 500) // 1000).astype(np.uint8)
        elif arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.ndim != 2 or 0 in arr.shape:
            raise InputError(f"the mask has shape {_array(value, 'mask', 'mask').shape}", where="mask",
                             fix="pass an HxW array (white = repaint), or an HxWx3 image")
        gray = _to_uint8(arr[..., None], "mask")[..., 0].astype(np.float32) / 255
    if gray.shape != (height, width):
        raise InputError(f"the mask is {gray.shape[1]}x{gray.shape[0]}, the image {width}x{height}", where="mask",
                         fix="give a mask of the image's size")
    return (gray >= 0.5).astype(np.float32)


def _to_uint8(arr: np.ndarray, what: str, where: str | None = None) -> np.ndarray:
    where = where or _KEYWORD.get(what, what)
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == bool:  # True as 1 of 255 would be a black image; as 255, a guess the caller did not make
        raise InputError(f"the {what} is a bool array", where=where,
                         fix="pass uint8 values 0..255 or float values 0..1 (e.g. arr.astype(np.uint8) * 255)")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise InputError(f"the {what} holds NaN or infinite values", where=where, fix="pass finite values")
        lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 1.0)
        if lo < -1e-3 or hi > 1 + 1e-3:  # 0..255 (or -1..1) floats: clipping would make them white or black
            raise InputError(f"the {what}'s float values run from {lo:g} to {hi:g}; a float image takes 0..1",
                             where=where, fix="divide 0..255 values by 255 (or pass them as uint8)")
        return (np.clip(arr, 0, 1) * 255).round().astype(np.uint8)
    if arr.dtype.kind in "iu" and arr.size and (arr.min() < 0 or arr.max() > 255):
        raise InputError(f"the {what} has values outside 0..255", where=where, fix="pass uint8 values")
    if arr.dtype.kind in "iu":
        return arr.astype(np.uint8)
    raise InputError(f"the {what} has dtype {arr.dtype}", where=where,
                     fix="pass uint8 values 0..255 or float values 0..1")


def to_nchw(rgb: np.ndarray) -> np.ndarray:
    """uint8 HxWx3 -> float32 1x3xHxW in [-1, 1] (diffusers' VaeImageProcessor.preprocess)."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    return (np.float32(2.0) * x - np.float32(1.0)).transpose(2, 0, 1)[None]


def from_nchw(decoded: np.ndarray) -> list[np.ndarray]:
    """VAE output (Bx3xHxW in [-1, 1]) -> list of HxWx3 uint8 (diffusers' postprocess)."""
    x = np.clip(decoded.astype(np.float32) / np.float32(2.0) + np.float32(0.5), 0, 1)
    x = (x.transpose(0, 2, 3, 1) * np.float32(255)).round().astype(np.uint8)
    return [np.ascontiguousarray(img) for img in x]


def to_pil(image: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(image)
