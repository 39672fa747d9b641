"""``sdrt generate [MODEL] "prompt" ...``: prompt -> PNG with A1111's ``parameters`` chunk."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError, ModelNotFoundError, SdrtError, printable
from . import generate_memory, generate_toolbox, generate_weights, precision

log = logging.getLogger("sdrt.cli")

#: the API's argument names that are not the dest of a flag of the same name (``sdrt.cli.flag_names``)
API_NAMES = {"negative_prompt": "--negative", "prompt": "PROMPT", "model": "MODEL", "args": "MODEL", "path": "--output",
             "loras": "--lora", "scale": "the scale of --lora FILE:SCALE", "text_encoders": "--text-encoder",
             "preview": "--preview-decoder", "controlnets": "--control-image", "union_mode": "--control-union-mode",
             "t5": "--no-t5", "@loras": "--lora FILE:WEIGHT", "@controlnets": "--controlnet FILE --control-image PNG",
             "@embeddings": "--embedding FILE", "@weights": "--weights FILE",
             "@hires_upscaler": "--hires-upscaler FILE (or sdrt upscale -m FILE)"}


#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
#: (an empty negative prompt is no negative prompt)
EMPTY_OK: frozenset[str] | set[str] = {"negative", "args"}  # an empty PROMPT is a prompt; MODEL: _split_args


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate", help="generate images from a prompt with a Stable Diffusion, SD3, Flux or Chroma model (an ONNX "
                         "or diffusers folder, or a single .safetensors file)",
        usage="sdrt generate [MODEL] PROMPT [options]",
        description="Generate an image. MODEL is a diffusers/Optimum ONNX model folder, a diffusers folder of "
                    ".safetensors (unet/ or transformer/, text_encoder/, vae/: no ONNX needed), or a single-file checkpoint "
                    "(.safetensors: SD 1.x, SD 2.x and SDXL with their inpainting models, InstructPix2Pix and CosXL Edit "
                    "(--init-image, --image-cfg), the SDXL refiner (img2img), "
                    "SD 3 Medium, SD 3.5 Medium and Large, Flux.1 dev and schnell, FLUX.1 Fill and Canny/Depth, Chroma; "
                    "add --vae/--text-encoder files where the checkpoint lacks them); without it, the tiny model that ships with sdrt is used. One prompt a "
                    "run: quote it.",
    )
    p.add_argument("args", nargs="+", metavar="[MODEL] PROMPT",
                   help="model folder or .safetensors file (optional) and the prompt")
    p.add_argument("--negative", "--negative-prompt", "-n", dest="negative", default="", help="negative prompt")
    p.add_argument("--steps", type=int, default=20, help="sampling steps (default 20)")
    p.add_argument("--cfg", type=float, default=None,
                   help="classifier-free guidance scale (1: no negative pass; default: 7 for SD and SD3, 5 for "
                        "Chroma, 1 for Flux, whose --cfg is diffusers' true_cfg_scale)")
    p.add_argument("--image-cfg", type=float, default=None,
                   help="image guidance scale of an InstructPix2Pix model, which edits the --init-image as the prompt "
                        "says (diffusers' image_guidance_scale, A1111's Image CFG Scale; default 1.5)")
    p.add_argument("--guidance", type=float, default=None,
                   help="distilled guidance of guidance-distilled models (Flux dev; default 3.5)")
    p.add_argument("--guidance-rescale", type=float, default=0.0, metavar="PHI",
                   help="CFG rescale (diffusers' guidance_rescale, 0 to 1; 0.7 is usual for v-prediction and "
                        "zero-terminal-SNR models; default 0, off; SD 1.x/2.x/XL)")
    p.add_argument("--shift", type=float, default=None,
                   help="flow-matching shift in place of the model's (SD3, Flux, Chroma)")
    p.add_argument("--max-sequence-length", type=int, default=None,
                   help="T5's token count (SD3, Flux, Chroma; default: 256 for SD3 and Flux schnell, 512 for Flux "
                        "dev and Chroma)")
    p.add_argument("--sampler", default=None,
                   help='A1111 or ComfyUI sampler name, e.g. "Euler a", "DPM fast", "DPM adaptive" or "dpmpp_2m" '
                        '(default: DPM++ 2M Karras for SD, Euler for the flow models); docs/samplers.md lists them, '
                        'and a name sdrt lacks is refused with the list')
    p.add_argument("--schedule", default=None, help='schedule for a sampler name without one, e.g. "karras"')
    p.add_argument("--seed", type=int, default=None, help="random when not given or -1")
    p.add_argument("--width", type=int, default=None,
                   help="a multiple of 8, 16 for SD3/Flux/Chroma (default: the model's size; with --init-image, the "
                        "picture's, each side down to that multiple; one side alone: the other in its aspect ratio)")
    p.add_argument("--height", type=int, default=None, help="as --width")
    p.add_argument("--init-image", default=None,
                   help="img2img / inpainting source (PNG/JPEG; needs Pillow), of any size: it is fitted to "
                        "--width/--height with --resize-mode")
    p.add_argument("--resize-mode", default=None, metavar="MODE",
                   help='how --init-image and --mask meet the size when theirs differs (A1111\'s img2img modes): '
                        '"Just Resize" (0, default: stretched), "Crop and Resize" (1: cover, centre crop), '
                        '"Resize and Fill" (2: fit inside, edges stretched into the bars), "Just Resize (latent '
                        'upscale)" (3: encoded at its own size, latents resized); any case, or the number')
    p.add_argument("--init-upscaler", default=None, metavar="NAME|FILE",
                   help="what enlarges an --init-image that grows to the size (A1111's upscaler_for_img2img): Lanczos, "
                        "Nearest, or a model upscaler's .safetensors/.pth file or name in $SDRT_UPSCALERS (default: a "
                        "Lanczos resize)")
    p.add_argument("--strength", type=float, default=None, help="img2img denoising strength (default 0.75; 1 with --mask)")
    p.add_argument("--strength-rule", default=None, metavar="RULE",
                   help="which steps --strength runs: diffusers (default: the last int(steps * strength) of the "
                        "schedule), a1111 (A1111's: int(min(strength, 0.999) * steps) + 1 of them) or a1111-fix-steps "
                        "(A1111's img2img_fix_steps option: a schedule stretched so that exactly --steps run)")
    p.add_argument("--mask", default=None, help="inpainting mask, white = repaint (needs --init-image)")
    p.add_argument("--masked-content", default=None, metavar="MODE",
                   help='what the area --mask repaints starts from (A1111\'s "Masked content"): original (default: '
                        'the init image), fill (the picture filled there from its surroundings, A1111\'s masking.fill), '
                        '"latent noise" (filled, then the run\'s noise there) or "latent nothing" (filled, then zeros)')
    p.add_argument("--mask-blur", default=None, metavar="PIXELS",
                   help="blur --mask by this many pixels at its own size, as A1111's \"Mask blur\" (a Gaussian of "
                        "that sigma, OpenCV's); X,Y blurs across and down apart (default 0; A1111's is 4)")
    p.add_argument("--mask-overlay", action="store_true", default=None,
                   help="composite the init image back over the result where --mask keeps it (A1111 always does; "
                        "--inpaint-area only-masked always pastes back)")
    p.add_argument("--inpaint-area", default=None, metavar="AREA",
                   help='which area a --mask run paints at --width/--height (A1111\'s "Inpaint area"): whole-picture '
                        '(default) or only-masked (the mask\'s box, --inpaint-padding pixels wider and grown to the '
                        'run\'s aspect ratio, cut out, run at the size and pasted back into the picture)')
    p.add_argument("--inpaint-padding", type=int, default=None, metavar="PIXELS",
                   help="with --inpaint-area only-masked: the pixels around the mask's box (default 32, A1111's "
                        '"Only masked padding")')
    p.add_argument("--reference", dest="reference_images", action="append", default=None, metavar="IMAGE",
                   help="FLUX.1 Kontext: a picture to edit or draw from (repeat for several; PNG/JPEG, needs Pillow); "
                        "the image takes the first one's size unless --width/--height say otherwise")
    p.add_argument("--no-reference-resize", dest="reference_resize", action="store_false",
                   help="keep the references' own sizes (cut to multiples of 16) instead of Kontext's preferred "
                        "resolution nearest each one's aspect ratio")
    p.add_argument("--batch", type=int, default=1, help="images per run")
    p.add_argument("--batch-count", type=int, default=1, help="runs, each with the next seed")
    p.add_argument("--clip-skip", type=int, default=1,
                   help="A1111's CLIP skip: 2 takes the text encoder's second-to-last layer (default 1: the last; SDXL "
                        "and SD3 read the second-to-last already, so 1 and 2 are alike there, as in A1111 and Forge, "
                        "and 3 takes the third-to-last)")
    p.add_argument("--backend", default="auto", help="a backend `sdrt info` lists (default: auto, the one sdrt picks here)")
    p.add_argument("--device", default=None, help="a device id as `sdrt info` lists it (default: the one sdrt picks for the backend)")
    precision.add_flag(p, "every part")
    p.add_argument("--dry-run", action="store_true",
                   help="print the run plan (every part, its input shapes and dtypes, its calls) and stop: "
                        "nothing compiles or runs and no weights load")
    p.add_argument("-o", "--output", default="sdrt-out.png",
                   help="image file: .png, or .jpg/.jpeg/.webp (needs Pillow), or - for a PNG on standard output; "
                   "a name without a suffix gets .png; with several images, -1, -2, ... are added")
    generate_weights.add_arguments(p)
    generate_toolbox.add_arguments(p)
    generate_memory.add_arguments(p)
    return p


def _outputs(path: Path, n: int) -> list[Path]:
    if n == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i + 1}{path.suffix}") for i in range(n)]


def _input_files(args: argparse.Namespace, model: str | None) -> dict[str, Any]:
    """Every file this run reads, by its flag (for ``check_writes``)."""
    loras = [s for spec in (args.lora or []) for s in (spec, spec.rpartition(":")[0]) if s]  # FILE[:SCALE]
    names = ("init_image", "mask", "reference_images", "control_image", "control_mask", "controlnet", "weights", "vae",
             "text_encoders", "embedding", "refiner", "preview_decoder", "ip_adapter", "ip_adapter_image", "image_encoder",
             "face_models", "hires_checkpoint")
    flags = {"reference_images": "--reference", "text_encoders": "--text-encoder"}
    files: dict[str, Any] = {"MODEL": model, "--lora": loras}
    for name in names:
        files[flags.get(name, "--" + name.replace("_", "-"))] = getattr(args, name, None)
    return files


def _flow_label(model: Path) -> str | None:
    """The family label of an SD3/Flux/Chroma model known without loading it (a diffusers folder's
    ``model_index.json`` ``_class_name``, a single .safetensors file's tensor names and shapes), else None."""
    import json

    from ..errors import SdrtError

    try:
        if model.is_dir() and (model / "model_index.json").is_file():
            from ..pipelines.families import registered

            name = json.loads((model / "model_index.json").read_text(encoding="utf-8")).get("_class_name")
            fam = next((f for f in registered().values() if name in f.class_names), None)
            return fam.label if fam is not None and fam.flow else None
        if model.is_file() and model.suffix.lower() == ".safetensors":
            from ..checkpoint.families import LABELS, identify
            from ..weights import Weights

            family = identify(Weights.open(model).shapes()).family  # the header only
            return LABELS[family] if family and family.startswith(("flux", "sd3", "sd35", "chroma")) else None
    except (SdrtError, OSError, ValueError, AttributeError):  # the load says what is wrong with the file
        return None
    return None


def _edit_model(model: str | None) -> bool:
    """Whether the model is an InstructPix2Pix one, known without loading it (a folder's ``model_index.json``
    ``_class_name``, a single file's tensor shapes); False when that cannot be told (the load says what is wrong)."""
    import json

    from ..errors import SdrtError

    if model is None:
        return False
    path = Path(model)
    try:
        if path.is_dir() and (path / "model_index.json").is_file():
            name = json.loads((path / "model_index.json").read_text(encoding="utf-8")).get("_class_name")
            return isinstance(name, str) and "InstructPix2Pix" in name
        if path.is_file() and path.suffix.lower() == ".safetensors":
            from ..checkpoint.families import identify
            from ..weights import Weights

            return (identify(Weights.open(path).shapes()).family or "").endswith("-ip2p")
    except (SdrtError, OSError, ValueError, AttributeError):
        return False
    return False


def _check_flow_size(model: str | None, args: argparse.Namespace) -> None:
    """--width/--height not a multiple of 16 on an SD3/Flux/Chroma model (VAE 8 x patch 2), refused before the
    model loads when its family is known from the file (the pipeline refuses it too, after the load)."""
    if model is None or not ((args.width or 0) % 16 or (args.height or 0) % 16):
        return
    from ..pipelines.flowparts import flow_size_error

    label = _flow_label(Path(model))
    error = None if label is None else flow_size_error(args.width, args.height, label)
    if error is not None:
        raise error


def _check_model_word(model: str | None, prompt: str) -> None:
    """A MODEL that is no path and names nothing here: most likely the first word of an unquoted prompt (``sdrt
    generate a cat``, ``sdrt generate "a cat" "a dog"``). Said so; a path (``x.safetensors``, ``dir/x``) that does
    not exist is the loader's own "does not exist"."""
    if model is None:
        return
    try:
        os.lstat(model)  # os.path.lexists is False for a name too long to look at: main says that one
        return
    except (FileNotFoundError, NotADirectoryError):
        pass
    pathlike = Path(model).suffix.lower() in (".safetensors", ".gguf", ".ckpt", ".onnx") or "/" in model \
        or "\\" in model
    if not pathlike:
        raise ModelNotFoundError(f"there is no model file or folder {model!r} (MODEL, the first of the two "
                                 "arguments)", where="MODEL",
                                 fix=f'check the path; a prompt of several words is one argument: quote it whole, '
                                     f'sdrt generate "{model} {prompt}" (or give a model before it)')


def _split_args(words: list[str]) -> tuple[str | None, str]:
    """(model, prompt) of ``[MODEL] PROMPT``; a lone model folder is a forgotten prompt, not a prompt."""
    if len(words) > 2:
        raise InputError(f"expected [MODEL] PROMPT, got {len(words)} words", where="sdrt generate",
                         fix='quote the prompt: sdrt generate MODEL "a red fox in snow"')
    if len(words) == 2:
        if not words[0]:  # Path("") is the current folder
            raise InputError("MODEL is given an empty value", where="MODEL",
                             fix='give the model folder or file, or leave it out for the demo model: sdrt generate "a '
                                 'red fox"')
        return words[0], words[1]
    lone = Path(words[0])
    # os.path: a 10,000-character prompt is ENAMETOOLONG to stat, which pathlib raises
    if os.path.isfile(lone) and lone.suffix.lower() in (".safetensors", ".gguf", ".ckpt", ".onnx"):
        raise InputError(f"{words[0]} is a model file, and no prompt follows it", where="PROMPT",
                         fix=f'give the prompt after the file: sdrt generate {words[0]} "a red fox in the snow"')
    if os.path.isdir(lone) and ((lone / "model_index.json").is_file() or (lone / "unet").is_dir()
                                or (lone / "transformer").is_dir()):
        raise InputError(f"{words[0]} is a model folder, and no prompt follows it", where="PROMPT",
                         fix=f'give the prompt after the folder: sdrt generate {words[0]} "a red fox in the snow"')
    text = words[0]
    # a tag prompt without spaces ("1girl,blue/red_hair,(smile:1.2)") is a prompt: tags come with commas
    pathlike = lone.suffix.lower() in (".safetensors", ".gguf", ".ckpt", ".onnx") or (
        not any(c.isspace() or c in ",()[]<>{}|" for c in text) and ("/" in text or "\\" in text))
    if pathlike and not os.path.lexists(lone):  # a mistyped model path, not a prompt for the demo model
        raise ModelNotFoundError(f"no model at {text}, and no prompt follows it", where="MODEL",
                                 fix=f'check the path; to use it as the prompt, give a model first: sdrt generate '
                                     f'MODEL "{text}"')
    return None, text


def _check_outputs(args: argparse.Namespace, n_images: int) -> list[Path] | None:
    """The files to write (None: standard output), every one checked before any model loads."""
    from ..pipelines.save import check_output

    if args.output == "-":
        if n_images > 1:
            raise InputError(f"-o - writes one PNG to standard output, and this run makes {n_images} images",
                             where="--output", fix="write them to files (-o out.png), or use --batch 1 --batch-count 1")
        if sys.stdout.isatty():
            raise InputError("-o - writes PNG bytes to standard output, which is a terminal", where="--output",
                             fix="pipe it (sdrt generate ... -o - | display), or write a file")
        return None
    if not args.output:
        check_output(args.output, "output")  # refuses the empty name
    if args.output.endswith(("/", "\\")):  # Path() drops the slash: "newdir/" was written as a file "newdir"
        raise InputError(f"-o {args.output!r} names a folder, not a file", where="--output",
                         fix=f"give a file name, such as {Path(args.output) / 'out.png'}")
    path = Path(args.output)
    if not path.suffix:  # as demo and run add theirs: -o noext writes noext.png
        if os.path.lexists(path):  # -o /dev/null or a folder: refused, not written as /dev/null.png beside it
            check_output(path, "output")
        path = path.with_name(path.name + ".png")
    paths = _outputs(path, n_images)
    for path in paths:
        if len(paths) == 1 or not os.path.lexists(path):  # a missing folder: its own words
            check_output(path, "output")
            continue
        try:
            check_output(path, "output")
        except SdrtError as exc:  # a numbered name: its "such as e-2.png/out.png" would make no sense
            raise InputError(f"-o {args.output} with {len(paths)} images writes {paths[0].name} to "
                             f"{paths[-1].name}, and {exc.what}", where="--output",
                             fix="pick another -o name, or move that out of the way") from None
    return paths


def run(args: argparse.Namespace) -> int:
    from .. import pipelines
    from ..pipelines.pipeline import validate

    folder, prompt = _split_args(args.args)
    if not args.reference_resize and not args.reference_images:  # it sizes the references: alone it would do nothing
        raise InputError("--no-reference-resize needs a --reference", where="--no-reference-resize",
                         fix="pass --reference IMAGE (FLUX.1 Kontext), or leave --no-reference-resize out")
    options = dict(steps=args.steps, cfg=args.cfg, sampler=args.sampler, schedule=args.schedule, seed=args.seed,
                   width=args.width, height=args.height, init_image=args.init_image, strength=args.strength,
                   strength_rule=args.strength_rule, init_upscaler=args.init_upscaler,
                   mask=args.mask, masked_content=args.masked_content, resize_mode=args.resize_mode, batch=args.batch, batch_count=args.batch_count,
                   inpaint_area=args.inpaint_area, inpaint_padding=args.inpaint_padding,
                   mask_blur=_mask_blur(args.mask_blur), mask_overlay=args.mask_overlay,
                   clip_skip=args.clip_skip,
                   guidance=args.guidance, shift=args.shift, max_sequence_length=args.max_sequence_length,
                   guidance_rescale=args.guidance_rescale, reference_images=args.reference_images,
                   reference_resize=args.reference_resize, image_cfg=args.image_cfg)
    options.update(generate_toolbox.options(args))  # ControlNet, hires fix, seeds, previews
    if args.init_image and args.image_cfg is None and args.strength is None and _edit_model(folder):
        from ..pipelines.edit import DEFAULT_IMAGE_CFG  # its default: without a strength, every step runs

        options["image_cfg"] = DEFAULT_IMAGE_CFG
    settings = validate(prompt, args.negative, **options)  # before any model loads
    from ..text import extract_loras
    from ..text.attention import unsupported_syntax

    for text, key in ((prompt, "prompt"), (args.negative, "negative_prompt")):
        tags = extract_loras(text, key)[1]  # a <lora:> tag whose weight is not a number, before any model loads
        if tags and not args.lora_dir:  # refused after the model loaded, in the API's words (pipe.weights.lora_dir)
            raise InputError(f"the {'prompt' if key == 'prompt' else 'negative prompt'} asks for "
                             f"<lora:{tags[0][0]}:...> and no --lora-dir says where LoRAs are",
                             where="PROMPT" if key == "prompt" else "--negative",
                             fix=f"pass --lora-dir DIR, the folder holding {tags[0][0]}.safetensors (or give the "
                                 "file as --lora FILE:SCALE and leave the tag out)")
        for line in unsupported_syntax(text):  # read as text, not refused: said, not silent
            log.warning("%s%s", "" if key == "prompt" else "--negative: ", line)
    _check_flow_size(folder, args)  # before the model loads, where its family is known from the file
    custom = generate_weights.check(args)
    memory = generate_memory.options(args)  # --memory, checked before any model loads
    compute = precision.option(args.precision, args.backend, args.device)  # checked before any model loads
    outputs = [] if args.dry_run else _check_outputs(args, args.batch * args.batch_count)
    if outputs and settings.width and settings.height:  # a WebP over 16383 pixels a side: said before the run
        from ..pipelines.save import check_size

        hires = getattr(settings.toolbox, "hires", None)
        size = hires.target(settings.width, settings.height) if hires is not None else (settings.width, settings.height)
        for path in outputs:
            check_size(path, *size, "output")
    if outputs:  # -o init.png (or the model, a LoRA) would destroy that input
        from .paths import check_writes

        check_writes({"-o": outputs}, _input_files(args, folder))
    if args.preview_dir and not args.dry_run:  # a preview written over an input (--init-image previews/preview-1-001.png)
        from .paths import check_folder_writes

        check_folder_writes("--preview-dir", args.preview_dir, generate_toolbox.PREVIEW_NAMES, _input_files(args, folder))
        previews = Path(args.preview_dir).resolve()
        for path in outputs or ():  # the last preview would be written over the image, or the image over it
            if Path(path).resolve().parent == previews and generate_toolbox.PREVIEW_NAMES.fullmatch(Path(path).name):
                raise InputError(f"-o {path} is a name the previews take in --preview-dir {args.preview_dir}",
                                 where="-o", fix="name the image otherwise, or write it outside --preview-dir")
    _check_model_word(folder, prompt)
    if folder is None:
        folder = pipelines.DEMO_MODEL
        if not (folder / "model_index.json").is_file():
            raise ModelNotFoundError("the embedded demo model is missing from this install", where=str(folder),
                                     fix="reinstall sdrt, or pass a model folder")
    from ..pipelines.png import format_parameters, write_png
    from ..pipelines.progress import ProgressBar
    from ..pipelines.save import save_image
    from ..runtime import select

    pipe = pipelines.load(folder, backend=args.backend, device=args.device,
                          **generate_weights.pipeline_options(custom), **memory, **compute)
    if args.dry_run:  # the model's graphs: a checkpoint or LoRA changes values, not shapes or calls, except a
        # Flux control LoRA's (BFL's Canny/Depth LoRA: the transformer takes 128 channels), which the plan shows
        if custom.lora_dir is not None:
            pipe.weights.lora_dir = custom.lora_dir
        pipe.weights.planned = [path for path, _ in custom.loras]
        if custom.weights is not None:  # a checkpoint that says v-prediction or zero terminal SNR is sampled so
            pipe.weights.plan_checkpoint(custom.weights)
        from ..weights.lora import Lora

        for path in pipe.weights.planned:  # a file that is no LoRA: refused as the run refuses it (mapped, not read)
            Lora.open(path)
        print(pipe.plan(settings).format())
        return 0
    backend, device = select(args.backend, args.device)
    print(f"backend {backend.name} on {device.id}" + (f" ({device.name})" if device.name else ""), file=sys.stderr)
    bar = ProgressBar()
    try:
        generate_weights.apply(pipe, custom, (prompt, args.negative))
        # checked once, above, before the model loaded
        writer = generate_toolbox.PreviewWriter(pipe, args.preview_dir, bar, args.preview_every)
        gen = pipe.generate(settings, callback=writer)
        from .interrupt import check

        check()  # pressed during the last step: no image
    finally:
        bar.close()
        pipe.close()
    generate_memory.report(args, gen)  # the plan's placements and predicted peak, the measured peak per stage
    for i, (image, info) in enumerate(zip(gen.images, gen.settings)):
        text = format_parameters(gen.prompt, gen.negative_prompt, info)
        if outputs is None:
            write_png(sys.stdout.buffer, image, text)
            sys.stdout.buffer.flush()
            print(f"wrote the PNG to standard output (seed {info['Seed']})", file=sys.stderr)
        else:
            save_image(outputs[i], image, text)
            through = f" (through the symlink, to {outputs[i].resolve()})" if outputs[i].is_symlink() else ""
            print(printable(f"wrote {outputs[i]}{through} (seed {info['Seed']})"))
    from ..cache import deferred, wait_for_stores
    from ..cache.store import CompileCache

    if deferred.pending():  # compiled in this run: the next one loads it
        if CompileCache(backend.name).unusable() is None:  # else the store says once why it writes nothing
            print(f"writing the compile cache for the next run ({deferred.pending()} part(s))", file=sys.stderr)
        wait_for_stores()
    return 0


def _mask_blur(text: str | None) -> object:
    """``--mask-blur N`` or ``X,Y`` as validate's ``mask_blur`` (an int or a pair); anything else goes as given, for
    validate to refuse by name."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) in (1, 2) and all(p.strip().isdecimal() for p in parts):
        values = [int(p) for p in parts]
        return values[0] if len(values) == 1 else tuple(values)
    return text

