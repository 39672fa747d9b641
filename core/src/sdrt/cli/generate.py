"""``sdrt generate [FOLDER] "prompt" ...``: prompt -> PNG with A1111's ``parameters`` chunk."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import InputError, ModelNotFoundError
from . import generate_toolbox, generate_weights


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate", help="generate images from a prompt with a Stable Diffusion model folder",
        description="Generate an image. FOLDER is a diffusers/Optimum ONNX model folder; without it, the tiny "
                    "model that ships with sdrt is used.",
    )
    p.add_argument("args", nargs="+", metavar="[FOLDER] PROMPT", help="model folder (optional) and the prompt")
    p.add_argument("--negative", "-n", default="", help="negative prompt")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cfg", type=float, default=7.0, help="classifier-free guidance scale (1: no negative pass)")
    p.add_argument("--sampler", default="DPM++ 2M Karras", help='A1111 or ComfyUI sampler name, e.g. "Euler a"')
    p.add_argument("--schedule", default=None, help='schedule for a sampler name without one, e.g. "karras"')
    p.add_argument("--seed", type=int, default=None, help="random when not given or -1")
    p.add_argument("--width", type=int, default=None, help="a multiple of 8 (default: the model's size)")
    p.add_argument("--height", type=int, default=None, help="a multiple of 8 (default: the model's size)")
    p.add_argument("--init-image", default=None, help="img2img / inpainting source (PNG/JPEG; needs sdrt[images])")
    p.add_argument("--strength", type=float, default=None, help="img2img denoising strength (default 0.75)")
    p.add_argument("--mask", default=None, help="inpainting mask, white = repaint (needs --init-image)")
    p.add_argument("--batch", type=int, default=1, help="images per run")
    p.add_argument("--batch-count", type=int, default=1, help="runs, each with the next seed")
    p.add_argument("--clip-skip", type=int, default=1)
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--dry-run", action="store_true",
                   help="print the run plan (every part, its input shapes and dtypes, its calls) and stop: "
                        "nothing compiles or runs and no weights load")
    p.add_argument("-o", "--output", default="sdrt-out.png", help="PNG path; with several images, -1, -2, ... are added")
    generate_weights.add_arguments(p)
    generate_toolbox.add_arguments(p)
    return p


def _outputs(path: Path, n: int) -> list[Path]:
    if n == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i + 1}{path.suffix or '.png'}") for i in range(n)]


def run(args: argparse.Namespace) -> int:
    from .. import pipelines
    from ..pipelines.pipeline import validate

    if len(args.args) > 2:
        raise InputError(f"expected [FOLDER] PROMPT, got {len(args.args)} words", where="sdrt generate",
                         fix='quote the prompt: sdrt generate FOLDER "a red fox in snow"')
    folder, prompt = (args.args[0], args.args[1]) if len(args.args) == 2 else (None, args.args[0])
    options = dict(steps=args.steps, cfg=args.cfg, sampler=args.sampler, schedule=args.schedule, seed=args.seed,
                   width=args.width, height=args.height, init_image=args.init_image, strength=args.strength,
                   mask=args.mask, batch=args.batch, batch_count=args.batch_count, clip_skip=args.clip_skip)
    options.update(generate_toolbox.options(args))  # ControlNet, hires fix, seeds, previews
    settings = validate(prompt, args.negative, **options)  # before any model loads
    custom = generate_weights.check(args)
    out = Path(args.output)
    if not args.dry_run and not out.parent.is_dir():
        raise InputError("the output folder does not exist", where=str(out.parent), fix="create it, or pick another -o")
    if folder is None:
        folder = pipelines.DEMO_MODEL
        if not (folder / "model_index.json").is_file():
            raise ModelNotFoundError("the embedded demo model is missing from this install", where=str(folder),
                                     fix="reinstall sdrt, or pass a model folder")
    from ..pipelines.png import format_parameters, write_png
    from ..pipelines.progress import ProgressBar

    pipe = pipelines.load(folder, backend=args.backend, device=args.device,
                          **generate_weights.pipeline_options(custom))
    if args.dry_run:  # the folder's own graphs: a checkpoint or LoRA changes values, not shapes or calls
        print(pipe.plan(settings).format())
        return 0
    bar = ProgressBar()
    try:
        generate_weights.apply(pipe, custom)
        # checked once, above, before the model loaded
        gen = pipe.generate(settings, callback=generate_toolbox.PreviewWriter(pipe, args.preview_dir, bar))
    finally:
        bar.close()
        pipe.close()
    for path, image, info in zip(_outputs(out, len(gen.images)), gen.images, gen.settings):
        write_png(path, image, format_parameters(gen.prompt, gen.negative_prompt, info))
        print(f"wrote {path} (seed {info['Seed']})")
    return 0
