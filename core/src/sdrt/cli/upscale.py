"""``sdrt upscale IMAGE -m MODEL [--scale S] -o OUT``: an ESRGAN-family model upscaler on one image."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..errors import printable
from . import precision

#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
EMPTY_OK: frozenset[str] | set[str] = frozenset()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "upscale", help="upscale an image with an ESRGAN-family model (RRDBNet, Real-ESRGAN, SRVGGNetCompact)",
        description="Upscale IMAGE with a model upscaler file (.safetensors; .pth where sdrt reads PyTorch files): "
                    "ESRGAN and Real-ESRGAN (RRDBNet, as 4x-UltraSharp, RealESRGAN_x4plus, x2plus) and "
                    "SRVGGNetCompact (realesr-general-x4v3, realesr-animevideov3). It runs in tiles (A1111's 192 px, "
                    "8 px overlap); --scale other than the model's factor resizes its result with Lanczos, as "
                    "A1111's extras tab does.")
    p.add_argument("image", help="the image to upscale (PNG; JPEG/WebP with Pillow)")
    p.add_argument("-m", "--model", required=True, help="the upscaler model file (a path, or a name in $SDRT_UPSCALERS)")
    p.add_argument("-o", "--output", required=True, help="the image to write (.png, .jpg, .webp)")
    p.add_argument("--scale", type=float, default=None,
                   help="the overall factor, 1 to 8 (default: the model's own, 2 or 4)")
    p.add_argument("--tile", type=int, default=192, help="tile size in input pixels (default 192; 0: untiled)")
    p.add_argument("--tile-overlap", type=int, default=None, help="tile overlap in input pixels (default 8)")
    p.add_argument("--backend", default="auto", help="a backend `sdrt info` lists (default: auto)")
    p.add_argument("--device", default=None, help="a device id as `sdrt info` lists it")
    precision.add_flag(p, "the upscaler")
    return p


def run(args: argparse.Namespace) -> int:
    import math

    from ..errors import InputError
    from ..pipelines.hires import model_file
    from ..pipelines.images import to_rgb
    from ..pipelines.save import check_output, check_size, save_image
    from ..pipelines.upscaler import ModelUpscaler
    from .paths import check_writes, refuse_stdout

    refuse_stdout(args.output, "upscale", ".png")
    out = check_output(args.output, "output")
    path = model_file(args.model)
    if path is None and Path(args.model).exists():  # a file or folder, not an upscaler file: say so, not "no model"
        kind = "a folder" if Path(args.model).is_dir() else "not a .safetensors or .pth file"
        raise InputError(f"--model {args.model} is {kind}; an upscaler model is one .safetensors or .pth file",
                         where="--model", fix="give the path of an ESRGAN-family .safetensors/.pth file (4x-UltraSharp, "
                                              "RealESRGAN_x4plus, ...), or a model's name in a folder of $SDRT_UPSCALERS")
    if path is None:
        from ..pipelines.hires import model_files

        env, known = os.environ.get("SDRT_UPSCALERS"), model_files()
        held = (f"model upscalers in $SDRT_UPSCALERS: {', '.join(known)}" if known else
                f"$SDRT_UPSCALERS ({env}) holds no .safetensors/.pth model upscaler" if env else
                "$SDRT_UPSCALERS is not set")
        raise InputError(f"no upscaler model {args.model!r} ({held})", where="--model",
                         fix="give the path of a .safetensors/.pth file, or a model's name in a folder of $SDRT_UPSCALERS")
    check_writes({"-o": out}, {"IMAGE": args.image, "--model": path})  # upscale IN -o IN: the input is kept
    if args.scale is not None and not (math.isfinite(args.scale) and 1 <= args.scale <= 8):
        raise InputError(f"--scale must be from 1 to 8, got {args.scale}", where="--scale", fix="give e.g. --scale 2")
    if args.tile < 0 or 0 < args.tile < 16:  # 1 to 15 were raised to 16 in silence
        raise InputError(f"--tile must be 0 (untiled) or a size of at least 16 pixels, got {args.tile}", where="--tile",
                         fix="give --tile 192 (A1111's), or 0")
    if args.tile == 0 and args.tile_overlap is not None:  # untiled: the overlap was ignored in silence
        raise InputError("--tile-overlap applies to tiles, and --tile 0 runs the picture whole", where="--tile-overlap",
                         fix="leave --tile-overlap out, or give --tile a size (192, A1111's)")
    args.tile_overlap = 8 if args.tile_overlap is None else args.tile_overlap
    if not 0 <= args.tile_overlap <= (args.tile or 1 << 30) // 2:
        raise InputError(f"--tile-overlap must be from 0 to half the tile ({(args.tile or 1 << 30) // 2}), got "
                         f"{args.tile_overlap}", where="--tile-overlap", fix="give --tile-overlap 8 (A1111's)")
    tile = args.tile or 1 << 30
    compute = precision.option(args.precision, args.backend, args.device)
    up = ModelUpscaler(path, backend=args.backend, device=args.device, tile=tile, overlap=args.tile_overlap,
                       options=compute)
    image = to_rgb(Path(args.image), "image", "IMAGE")
    h, w = image.shape[:2]
    size = (w * up.scale, h * up.scale) if args.scale is None else (int(w * args.scale), int(h * args.scale))
    check_size(out, *size, "output")  # a WebP over 16383 pixels a side: said now, not after the whole upscale
    if args.scale is None:
        result = up.upscale(image)
    else:
        result = up.upscale_to(image, *size)
    save_image(out, result)
    print(printable(f"{out}: {result.shape[1]}x{result.shape[0]} ({up.name}: {up.arch.describe()})"))
    return 0
