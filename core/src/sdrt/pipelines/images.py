"""Images in and out: HxWx3 uint8 numpy arrays; Pillow images and image files when Pillow is installed.

Pillow is not a core dependency (22 MB of the 200 MB budget): ``pip install pillow`` adds it (from a
checkout, ``pip install './core[images]'`` does the same), for reading JPEG/PNG inputs from paths,
writing JPEG/WebP outputs and passing ``PIL.Image`` objects. Numpy arrays always
work, and PNG output needs no Pillow (``sdrt.pipelines.png``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

ImageLike = Any  # np.ndarray | PIL.Image.Image | str | os.PathLike

#: how to get Pillow: the core's ``images`` extra is not on PyPI yet, the package is
PILLOW_HINT = "install Pillow: pip install pillow (from a checkout of sdrt: pip install './core[images]')"


def _open_file(path: Path, what: str, where: str | None = None) -> np.ndarray:
    """The picture at ``path`` as ``to_rgb`` (or, for a mask, ``mask_gray``) reads it."""
    with _reading(path, what, where) as img:  # without Pillow: the one-line PILLOW_HINT refusal
        from PIL import ImageOps

        img.load()
        frames = getattr(img, "n_frames", 1)
        if frames > 1:  # as A1111 and diffusers' load_image read it, and said: not silently one picture of several
            _say_once(_at(path, what, where), f"an animation of {frames} frames: its first frame is used")
        # a phone's JPEG stores its pixels sideways and says so in EXIF: the picture as viewers show it (as
        # diffusers' load_image and A1111's img2img tab read it)
        return _from_pil(ImageOps.exif_transpose(img), what)


def _read_through(path: Path, what: str, where: str | None = None) -> None:
    """Read the picture at ``path`` through, for ``check_path``: what ``_open_file`` would refuse is refused, a JPEG
    decoded at 1/8 scale, which reads every byte (a 24 MP photo: 0.13 s, against 0.37 s for ``_open_file``)."""
    with _reading(path, what, where) as img:
        if img.format == "JPEG":
            img.draft("RGB", (max(img.width // 8, 1), max(img.height // 8, 1)))
        img.load()


def _at(path: Path, what: str, where: str | None) -> str:
    """The ``where`` of an error about the file ``path`` given as ``what``: the argument it was given as (the flag on
    the command line: ``--init-image /x/a.png``), then the path. ``where``: that argument (default: the keyword
    ``what`` names); an identifier is rendered in the caller's words, an item (``controlnets[0]``) too."""
    where = where or _KEYWORD.get(what, what)
    return f"{{@{where}}} {path}" if where.isidentifier() else f"{where} {path}"


def _missing(path: Path, what: str, where: str | None) -> InputError:
    """The error for a ``path`` that is no regular file: a device or FIFO (``/dev/null``, which reading would take as
    empty, or a FIFO, which would wait for a writer forever) said as what it is; else "does not exist"."""
    from .png import _kind

    try:
        kind = _kind(path.stat().st_mode)
    except (OSError, ValueError):
        kind = None
    if kind is not None:
        return InputError(f"the {what} {path} is {kind}, not an image file", where=_at(path, what, where),
                          fix="pass a picture file (PNG, JPEG)")
    return InputError(f"the {what} file does not exist", where=_at(path, what, where), fix="check the path")


@contextlib.contextmanager
def _reading(path: Path, what: str, where: str | None = None) -> Iterator[Any]:
    """The opened Pillow picture at ``path``; what Pillow cannot read, in one ``InputError`` naming the argument
    (``where``) and the file."""
    if not path.is_file():
        raise _missing(path, what, where)
    where = _at(path, what, where)
    try:
        from PIL import Image
    except ImportError as exc:
        raise InputError(f"reading the {what} from a file needs Pillow, which is not installed", where=str(path),
                         fix=PILLOW_HINT) from exc
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Pillow warns (two lines on stderr) above 89 million pixels and refuses above twice that: the refusal
            # is the limit here, said in one line below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                yield img
        _pillow_said(caught, where)
    except Image.DecompressionBombError as exc:
        raise InputError(f"the {what} is too large to read: {exc}".rstrip("."), where=where,
                         fix="use a smaller picture (Pillow reads up to about 179 million pixels)") from exc
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:  # Pillow's plugins raise all of them
        # on a broken file (a PNG chunk it cannot follow: SyntaxError "broken PNG file", which was a traceback)
        truncated = "truncated" in str(exc).lower()  # PNG: "image file is truncated"; JPEG: "Truncated File Read"
        raise InputError(f"cannot read the {what} as an image ({exc})", where=where,
                         fix="the file is incomplete: save or download it again" if truncated else
                         "use a PNG or JPEG file (or another format Pillow reads)") from exc


#: the Pillow warnings logged already, (where, message): a picture is read more than once a run
_SAID: set[tuple[str, str]] = set()


def _pillow_said(caught: list[Any], where: str) -> None:
    """Pillow's warnings while it read a picture (damaged metadata: "Corrupt EXIF data", "Tag data larger than
    file. Skipping tag 284"), each logged once, one line in the caller's words: they were Python warnings, two lines
    each on stderr (the file and line in Pillow, then its source), once per read."""
    for w in caught:
        _say_once(where, f"Pillow read the picture past damaged data ({' '.join(str(w.message).split())})")


def _say_once(where: str, text: str) -> None:
    """Log ``where: text`` once (a picture is read more than once a run), ``where`` in the caller's words."""
    from ..errors import in_caller_words

    if (where, text) in _SAID:
        return
    if len(_SAID) > 256:
        _SAID.clear()
    _SAID.add((where, text))
    logging.getLogger("sdrt.pipelines").warning("%s: %s", in_caller_words(where), text)


#: the keyword each image is given as (its errors name it): the label otherwise
_KEYWORD = {"init image": "init_image", "mask": "mask", "control image": "control_image",
            "control mask": "control_mask", "IP-Adapter image": "ip_adapter_image"}


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


#: Pillow's modes of 16-bit (and 32-bit integer) grey levels: a 16-bit greyscale PNG opens as one of them
_WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _eight_bit(img: Any) -> Any:
    """A 16-bit greyscale picture's levels scaled to 8 bits (v / 257, rounded); Pillow's ``convert`` clips them at
    255, which turned all but the darkest 0.4% of a 16-bit PNG white. A 32-bit integer picture (mode I: older
    Pillows open a 16-bit PNG so) is taken as 8-bit levels when none is above 255. Other pictures unchanged."""
    from PIL import Image

    if img.mode == "F":  # 32-bit float grey (a TIFF): levels in [0, 1] as float images hold them, else 0-255
        levels = np.nan_to_num(np.asarray(img, dtype=np.float64))
        levels = levels * 255 if levels.max() <= 1 else levels
        return Image.fromarray(np.rint(np.clip(levels, 0, 255)).astype(np.uint8), "L")
    if img.mode not in _WIDE_GREY:
        return img

    levels = np.clip(np.asarray(img).astype(np.float64), 0, 65535)
    if img.mode == "I" and levels.max() <= 255:  # 32-bit integers holding 8-bit levels (Image.fromarray of int32)
        return Image.fromarray(levels.astype(np.uint8), "L")
    return Image.fromarray(np.rint(levels / 257).astype(np.uint8), "L")


def _has_alpha(img: Any) -> bool:
    return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info


def pil_rgb(img: Any) -> Any:
    """A Pillow picture in RGB as A1111's img2img reads it: transparency flattened on white (its
    ``img2img_background_color``; Pillow's ``convert`` gave the colour under the transparent pixels, black
    mostly), 16-bit and float grey levels scaled (``_eight_bit``)."""
    img = _eight_bit(img)
    if _has_alpha(img):
        from PIL import Image

        rgba = img.convert("RGBA")
        flat = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        flat.alpha_composite(rgba)
        img = flat
    return img.convert("RGB")


def pil_mask(img: Any) -> Any:
    """A Pillow mask's grey levels (mode L), white = repaint, as A1111 reads a mask (``create_binary_mask``): an
    RGBA mask with transparency is its alpha channel (painted = opaque), else its luma (an opaque RGBA mask too);
    16-bit levels scaled."""
    img = _eight_bit(img)
    if img.mode == "RGBA" and img.getchannel("A").getextrema() != (255, 255):
        return img.getchannel("A")
    return img.convert("L")


def _from_pil(img: Any, what: str) -> np.ndarray:
    return np.asarray(pil_mask(img) if what == "mask" else pil_rgb(img))


def _decoded(img: Any, what: str, where: str) -> np.ndarray:
    """``_from_pil`` of a Pillow image an app passes: one opened lazily (``Image.open``) is decoded only now, and a
    broken file's error ("broken data stream", "image file is truncated") was Pillow's OSError, a traceback."""
    from PIL import Image

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            rgb = _from_pil(img, what)
        _pillow_said(caught, where)
        return rgb
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        name = getattr(img, "filename", "") or ""
        truncated = "truncated" in str(exc).lower()
        raise InputError(f"cannot decode the {what}, a Pillow image{f' of {name}' if name else ''} ({exc})",
                         where=where, fix="the file is incomplete: save or download it again" if truncated else
                         "pass a picture Pillow can decode (open a PNG or JPEG file, or pass a numpy array)") from exc


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "convert")


def check_path(value: Any, what: str, where: str | None = None) -> None:
    """Fail early (before any model loads) on a path that does not exist or is not a picture Pillow can read;
    ``where``: the argument it was given as (default: the keyword ``what`` names), which the errors name."""
    path = _path(value)
    if path is not None and path.is_dir():
        raise InputError(f"the {what} {path} is a folder, not an image file", where=_at(path, what, where),
                         fix="pass an image file (PNG, JPEG) in that folder")
    if path is not None and not path.is_file():
        raise _missing(path, what, where)
    if path is not None:  # read now: a 0-byte or truncated file found before the model loads, not after
        _read_through(path, what, where)


def to_rgb(value: ImageLike, what: str = "init image", where: str | None = None) -> np.ndarray:
    """HxWx3 uint8 from an array (HxW, HxWx1/3/4; uint8, or float in [0, 1]), a Pillow image or a path.
    ``where``: the argument the image was given as (default: the keyword ``what`` names)."""
    where = where or _KEYWORD.get(what, what)
    path = _path(value)
    if path is not None:
        return _open_file(path, what, where)
    if _is_pil(value):
        return _decoded(value, what, where)
    arr = _array(value, what, where)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4) or 0 in arr.shape:
        # torch's layouts, as a tensor's .numpy() gives them: say how to turn them into HxWxC
        hint = ("; it looks channels-first (CxHxW): pass arr.transpose(1, 2, 0)" if arr.ndim == 3 and
                arr.shape[0] in (1, 3, 4) and 0 not in arr.shape else
                "; it has a batch axis: pass one image, arr[0]" if arr.ndim == 4 and arr.shape[0] == 1 and
                arr.shape[-1] in (1, 3, 4) else "")
        raise InputError(f"the {what} has shape {arr.shape}{hint}", where=where,
                         fix="pass an HxWx3 uint8 array (HxW, HxWx1 and HxWx4 are accepted too)")
    arr = _to_uint8(arr, what, where)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    if arr.shape[-1] == 4:  # alpha over white, as a Pillow RGBA image and a file are read (``pil_rgb``)
        alpha = arr[..., 3:].astype(np.uint32)
        arr = ((arr[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)
    return np.ascontiguousarray(arr[..., :3])


def mask_gray(value: ImageLike, where: str = "mask") -> np.ndarray:
    """The mask's grey levels, HxW uint8 (white = repaint), at its own size: a path, a Pillow image, an HxW array
    (bool, uint8, or float in [0, 1]) or an HxWx3/4 image (luma, as Pillow's ``convert("L")``; an HxWx4 one with
    transparency: its alpha, as ``pil_mask`` reads an RGBA Pillow mask); ``where``: the argument it was given as
    (its errors name it)."""
    path = _path(value)
    if path is not None:
        return _open_file(path, "mask", where)
    if _is_pil(value):
        return _decoded(value, "mask", where)
    arr = _array(value, "mask", where)
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    if arr.ndim == 3 and arr.shape[-1] == 4:  # as pil_mask: with transparency, the alpha (painted = opaque)
        rgba = _to_uint8(arr, "mask", where)
        arr = rgba[..., 3] if (rgba[..., 3] != 255).any() else rgba[..., :3]
    if arr.ndim == 3 and arr.shape[-1] == 3:
        rgb = _to_uint8(arr, "mask", where).astype(np.uint32)
        arr = ((rgb[..., 0] * 299 + rgb[..., 1] * 587 + rgb[..., 2] * 114 + 500) // 1000).astype(np.uint8)
    elif arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim != 2 or 0 in arr.shape:
        raise InputError(f"the mask has shape {_array(value, 'mask', where).shape}", where=where,
                         fix="pass an HxW array (white = repaint), or an HxWx3 image")
    return np.ascontiguousarray(_to_uint8(arr[..., None], "mask", where)[..., 0])


def binarize(gray: np.ndarray) -> np.ndarray:
    """HxW float32 in {0, 1}, 1 where the image is repainted (diffusers: grayscale, then binarized at 0.5)."""
    return (gray.astype(np.float32) / 255 >= 0.5).astype(np.float32)


def to_mask(value: ImageLike, height: int, width: int) -> np.ndarray:
    """The mask of an ``width x height`` image, binarized (``binarize``); its size must be the image's."""
    gray = mask_gray(value)
    if gray.shape != (height, width):
        raise InputError(f"the mask is {gray.shape[1]}x{gray.shape[0]}, the image {width}x{height}", where="mask",
                         fix="give a mask of the image's size")
    return binarize(gray)


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


def nearest(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """torch.nn.functional.interpolate(mode="nearest") to (h, w): source index floor(i * in / out)."""
    rows = (np.arange(h) * mask.shape[0] // h).astype(np.int64)
    cols = (np.arange(w) * mask.shape[1] // w).astype(np.int64)
    return mask[rows][:, cols].astype(np.float32)


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


# ------------------------------------------------------------------ fitting a picture to the generation's size
#: how an init image (and its mask) meets the generation's size: A1111's img2img ``resize_mode`` 0 to 3, spelt as
#: sd-webui-controlnet spells its first three (``ControlNet(resize=...)``); matched without case
RESIZE_MODES = ("Just Resize", "Crop and Resize", "Resize and Fill", "Just Resize (latent upscale)")
JUST_RESIZE, CROP_AND_RESIZE, RESIZE_AND_FILL, LATENT_UPSCALE = RESIZE_MODES
#: what each mode does, in a word or two (the log line that says a picture was fitted)
_DOES = {JUST_RESIZE: "stretched to the size", CROP_AND_RESIZE: "scaled to cover the size, the overflow cropped",
         RESIZE_AND_FILL: "scaled to fit inside the size, its edges stretched into the bars",
         LATENT_UPSCALE: "encoded at its own size, its latents resized bilinearly"}
#: sd-webui-controlnet's other names for its modes (its API takes them too)
ALIASES = {"inner fit (scale to fit)": CROP_AND_RESIZE, "scale to fit (inner fit)": CROP_AND_RESIZE,
           "outer fit (shrink to fit)": RESIZE_AND_FILL, "envelope (outer fit)": RESIZE_AND_FILL}


def resize_mode(value: Any, where: str = "resize_mode", modes: tuple[str, ...] = RESIZE_MODES) -> str:
    """The canonical name of a resize mode: one of ``modes`` (any case, ``_`` or ``-`` for spaces), a ControlNet
    alias, or A1111's index (0 just resize, 1 crop and resize, 2 resize and fill, 3 latent upscale); None is
    Just Resize, A1111's default."""
    if value is None:
        return JUST_RESIZE
    if isinstance(value, str) and value.strip().isdecimal():  # the number, as a command line gives it
        value = int(value.strip())
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and 0 <= value < len(modes):
        return modes[int(value)]
    if isinstance(value, str):
        key = " ".join(value.replace("_", " ").replace("-", " ").split()).casefold()
        key = key.replace("( ", "(").replace(" )", ")")
        for mode in modes:
            if key == mode.casefold():
                return mode
        alias = ALIASES.get(key)
        if alias in modes:
            return alias
    raise InputError(f"unknown resize mode {value!r:.60}", where=where,
                     fix="use one of " + ", ".join(repr(m) for m in modes) + f" (or 0 to {len(modes) - 1}, A1111's "
                     "numbers)")


def describe_fit(mode: str) -> str:
    """How ``mode`` fitted a picture, for the line that says so: ``"Crop and Resize fits it (scaled to ...)"``."""
    return f"{mode} fits it ({_DOES[mode]})"


def snap(width: int, height: int, multiple: int) -> tuple[int, int]:
    """Each side down to a multiple of ``multiple`` (at least one multiple), as diffusers' ``VaeImageProcessor``
    sizes a picture given without a size."""
    return max(width - width % multiple, multiple), max(height - height % multiple, multiple)


def _scaled(iw: int, ih: int, width: int, height: int, cover: bool) -> tuple[int, int]:
    """The picture's size once scaled to cover (``cover``) or to fit inside ``width x height``, aspect kept, in
    A1111's integer arithmetic: the matched side exact, the other floored (at least 1)."""
    wider = width * ih > iw * height  # the target is wider than the picture (exact: integers, not float ratios)
    narrower = width * ih < iw * height
    if (wider if cover else narrower):
        return width, max(ih * width // iw, 1)
    return max(iw * height // ih, 1), height


#: A1111's ``Upscaler.upscale(img, scale)`` for an upscaler: the picture enlarged to ``int(side * scale) // 8 * 8``
Enlarge = Any  # Callable[[PIL.Image.Image, float], PIL.Image.Image]


def _resized(img: Any, width: int, height: int, enlarge: Enlarge | None) -> Any:
    """A1111's ``resize_image`` inner ``resize``: with an upscaler (``upscaler_for_img2img``) a picture that grows
    (and is no mask, mode ``L``) is first enlarged by it (by ``max(width / w, height / h)``), then any size left
    over is a Lanczos resize; without one, a Lanczos resize."""
    from PIL import Image

    if enlarge is not None and img.mode != "L":
        scale = max(width / img.width, height / img.height)
        if scale > 1.0:
            img = enlarge(img, scale)
    if img.size != (width, height):
        img = img.resize((width, height), Image.Resampling.LANCZOS)
    return img


def upscaler_enlarge(do_upscale: Any) -> Enlarge:
    """A1111's ``Upscaler.upscale`` around one upscale step ``do_upscale(img, scale)``: the target is
    ``int(side * scale) // 8 * 8``; the step runs until the picture reaches it (3 times at most, and no more once a
    step leaves the size as it was), then a Lanczos resize makes it exactly that size."""
    from PIL import Image

    def enlarge(img: Any, scale: float) -> Any:
        dest = (int((img.width * scale) // 8 * 8), int((img.height * scale) // 8 * 8))
        if 0 in dest:  # a side under 8 pixels even enlarged (a thin picture filled): A1111 fails; Lanczos resizes it
            return img
        for _ in range(3):
            if img.width >= dest[0] and img.height >= dest[1]:
                break
            size = img.size
            img = do_upscale(img, scale)
            if img.size == size:
                break
        return img if img.size == dest else img.resize(dest, Image.Resampling.LANCZOS)

    return enlarge


def plain_upscale(name: str) -> Any:
    """A1111's ``Lanczos`` and ``Nearest`` upscalers' step: the picture resized to ``int(side * scale)``."""
    from PIL import Image

    resample = Image.Resampling.LANCZOS if name == "Lanczos" else Image.Resampling.NEAREST
    return lambda img, scale: img.resize((int(img.width * scale), int(img.height * scale)), resample)


def fit_image(img: Any, width: int, height: int, mode: str, what: str = "init image",
              where: str = "init_image", enlarge: Enlarge | None = None) -> Any:
    """A Pillow image at ``width x height``, fitted as A1111's ``images.resize_image`` does (Lanczos throughout;
    ``enlarge``: an upscaler for a picture that grows, A1111's ``upscaler_for_img2img``, :func:`_resized`):

    - Just Resize (and its latent upscale, whose pixels it gives for a mask): stretched to the size;
    - Crop and Resize: scaled (aspect kept) to cover the size, centred, the overflow cropped;
    - Resize and Fill: scaled to fit inside, centred, and each bar filled with the picture's nearest edge
      stretched across it (a bicubic resample of the edge row or column).

    The picture keeps its Pillow mode (RGB, or L for a mask)."""
    from PIL import Image

    mode = resize_mode(mode)
    if img.size == (width, height):
        return img
    if mode in (JUST_RESIZE, LATENT_UPSCALE):
        return _resized(img, width, height, enlarge)
    iw, ih = img.size
    cover = mode == CROP_AND_RESIZE
    sw, sh = _scaled(iw, ih, width, height, cover)
    from .bounds import MAX_SIDE

    if max(sw, sh) > MAX_SIDE:  # a 1x4000 strip cropped to 2048x2048 would be 8 million pixels long on the way
        raise InputError(f"the {what} is {iw}x{ih}: scaled to cover {width}x{height} it would be {sw}x{sh}, above "
                         f"the limit of {MAX_SIDE} pixels a side", where=where,
                         fix=f"crop it nearer to the shape of {width}x{height}, or use {{@resize_mode=}}'{JUST_RESIZE}'")
    scaled = _resized(img, sw, sh, enlarge)
    out = Image.new(img.mode, (width, height))
    left, top = width // 2 - sw // 2, height // 2 - sh // 2  # negative when cropping: the paste crops
    out.paste(scaled, (left, top))
    if cover or (sw, sh) == (width, height):
        return out
    bicubic = Image.Resampling.BICUBIC
    if sw == width and top > 0:  # bars above and below: the top and bottom rows, stretched down and up
        out.paste(scaled.resize((width, top), bicubic, box=(0, 0, width, 0)), (0, 0))
        out.paste(scaled.resize((width, top), bicubic, box=(0, sh, width, sh)), (0, top + sh))
    elif sh == height and left > 0:  # bars left and right: the first and last columns
        out.paste(scaled.resize((left, height), bicubic, box=(0, 0, 0, height)), (0, 0))
        out.paste(scaled.resize((left, height), bicubic, box=(sw, 0, sw, height)), (left + sw, 0))
    return out


def fit_array(image: np.ndarray, width: int, height: int, mode: str, what: str = "init image",
              where: str = "init_image", enlarge: Enlarge | None = None) -> np.ndarray:
    """``fit_image`` for an HxWx3 (or HxW, a mask) uint8 array; Pillow does the resampling."""
    if image.shape[:2] == (height, width):
        return image
    try:
        from PIL import Image
    except ImportError as exc:
        raise InputError(f"the {what} is {image.shape[1]}x{image.shape[0]} and is fitted to {width}x{height}, which "
                         "needs Pillow", where=where, fix=PILLOW_HINT + f", or pass a {width}x{height} {what}") from exc
    return np.asarray(fit_image(Image.fromarray(image), width, height, mode, what, where, enlarge), dtype=np.uint8)
