"""``sdrt generate`` options for custom weights: --weights, --vae, --text-encoder, --lora, --lora-dir,
--embedding(-dir), --low-memory.

Everything is checked (files exist, scales parse) before any model loads; the pipeline then binds
the files through ``Session.update_weights`` (see ``sdrt.pipelines.weights``).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError

log = logging.getLogger("sdrt.cli")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("custom weights and memory")
    g.add_argument("--weights", default=None, metavar="FILE",
                   help="a single-file checkpoint (.safetensors, LDM layout) or diffusers folder for this architecture")
    g.add_argument("--vae", default=None, metavar="FILE",
                   help="a VAE file (.safetensors: ae.safetensors, sdxl_vae.safetensors, ...): fills or replaces the "
                        "model's VAE (on an ONNX folder too)")
    g.add_argument("--text-encoder", action="append", default=[], metavar="FILE", dest="text_encoders",
                   help="a text-encoder file (clip_l, clip_g, t5xxl_fp16.safetensors, ...), repeatable; which encoder "
                        "it is comes from its tensors; fills or replaces that encoder (on an ONNX folder too)")
    g.add_argument("--prediction", default=None, choices=("epsilon", "v_prediction", "sample"),
                   help="what the model predicts, in place of what the file implies (a single file or diffusers "
                        "folder): sample is x0, run with trailing timesteps (SDXL-Lightning's 1-step x0 UNet; a file "
                        "named *_x0.safetensors says so itself)")
    g.add_argument("--no-t5", action="store_false", dest="t5", default=True,
                   help="SD 3 / 3.5: run without the T5-XXL text encoder even when the model has one (CLIP-L and "
                        "CLIP-G alone, T5's states zeros, as diffusers' text_encoder_3=None): less memory, worse "
                        "prompt following")
    g.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]", help="a LoRA, repeatable (scale 1)")
    g.add_argument("--lora-dir", default=None, metavar="DIR", help="where <lora:name:scale> in the prompt finds "
                   "name.safetensors (or name.pt, name.ckpt)")
    g.add_argument("--embedding", action="append", default=[], metavar="FILE",
                   help="a textual-inversion embedding (.safetensors, or A1111's .pt); its trigger word is the "
                   "file's stem. diffusers' SDXL pair (learned_embeds.safetensors + learned_embeds_2.safetensors): "
                   "either file or their folder, triggered by its placeholder token")
    g.add_argument("--embedding-dir", default=None, metavar="DIR",
                   help="load every embedding there (.safetensors, .pt, .bin)")
    g.add_argument("--low-memory", action="store_true", default=None,
                   help="keep only the running part loaded (default: chosen from the device's memory)")
    g.add_argument("--vae-tile", type=int, default=None, metavar="N",
                   help="decode/encode the VAE in tiles of N latent pixels (blended seams)")


@dataclass
class WeightArgs:
    weights: Path | None = None
    vae: Path | None = None
    text_encoders: list[Path] = field(default_factory=list)
    loras: list[tuple[Path, float]] = field(default_factory=list)
    lora_dir: Path | None = None
    embeddings: list[Path] = field(default_factory=list)
    #: the .safetensors files of --embedding-dir: each one that cannot be used is skipped with a warning
    found_embeddings: list[Path] = field(default_factory=list)
    low_memory: bool | None = None
    vae_tile: int | None = None
    t5: bool = True
    prediction: str | None = None


def _existing(value: str, what: str, flag: str, *, folder: bool = False) -> Path:
    p = Path(value)
    ok = p.is_dir() if folder else p.exists()
    if folder and p.exists() and not ok:
        raise InputError(f"{value} is a file, and {flag} takes the {what}", where=f"{flag} {value}",
                         fix=f"pass the folder that holds it: {flag} {p.parent}")
    if not ok:
        raise InputError(f"the {what} does not exist", where=f"{flag} {value}", fix="check the path")
    if folder and not os.access(p, os.R_OK | os.X_OK):  # a PermissionError traceback when it is read
        raise InputError(f"cannot read the {what} (Permission denied)", where=f"{flag} {value}",
                         fix="check the folder's permissions (it needs read and search: chmod u+rx)")
    return p


def _one_file(value: str, what: str, flag: str) -> Path:
    p = _existing(value, what, flag)
    if p.is_dir():
        raise InputError(f"{value} is a folder, and {flag} takes one .safetensors file", where=f"{flag} {value}",
                         fix=f"pass the file itself, e.g. {flag} {p / 'diffusion_pytorch_model.safetensors'}")
    return p


def _readable(p: Path, flag: str, *, folder: bool = False) -> Path:
    """``p`` when it is a folder or a weights file whose header reads (``Weights.open`` reads headers only);
    else the reader's error, naming ``flag``, before any model loads (it came after the load, without the flag).
    ``folder``: a folder is read as weights too (a LoRA's: PEFT's adapter_model.safetensors)."""
    if p.is_dir() and not folder:
        return p
    if not p.is_file() and not p.is_dir():  # a FIFO or device: the reader would say "does not exist"
        raise InputError(f"{flag}: {p} is not a regular file", where=str(p), fix="pass the weights file itself")
    from ..checkpoint.files import open_fix
    from ..errors import SdrtError
    from ..weights import Weights

    try:
        Weights.open(p)
    except SdrtError as exc:
        raise type(exc)(f"{flag}: cannot open {p.name}: {exc.what}", where=str(p), fix=open_fix(p, exc)) from None
    except OSError as exc:  # unreadable: permissions, a FIFO
        raise InputError(f"{flag}: cannot read {p.name} ({exc.strerror or exc})", where=str(p),
                         fix="check the file and its permissions") from None
    return p


def _embedding(value: str) -> Path:
    """An ``--embedding`` path: a file whose header reads, or diffusers' SDXL pair (either file, or its folder) with
    both halves there, checked before any model loads."""
    from ..checkpoint.embeddings import embedding_files
    from ..errors import SdrtError

    p = _existing(value, "embedding file", "--embedding")
    try:
        files = embedding_files(p)
    except SdrtError as exc:
        raise type(exc)(f"--embedding {value}: {exc.what}", where=exc.where, fix=exc.fix) from None
    for f in files:
        if f is not None:
            _readable(f, "--embedding")
    return p


def parse_lora(spec: str) -> tuple[Path, float]:
    """``FILE`` or ``FILE:SCALE`` (a Windows drive letter's colon is not a scale); the scale must be a
    finite number of sane size (``check_lora_scale``)."""
    from ..pipelines.weights import check_lora_scale

    path, scale = spec, 1.0
    head, sep, tail = spec.rpartition(":")
    if sep and head and not tail.startswith(("\\", "/")) and not Path(spec).exists():
        try:
            scale = float(tail)
        except ValueError:
            if Path(head).is_file():  # the file is there: the scale is what is wrong
                raise InputError(f"the LoRA scale {tail!r} is not a number", where=f"--lora {spec}",
                                 fix=f"write FILE:SCALE with a number, e.g. --lora {head}:0.8") from None
        else:
            path = head
            check_lora_scale(scale, Path(head).stem, where=f"--lora {spec}")
            first, colon, rest = head.rpartition(":")
            if colon and first and not Path(head).exists() and Path(first).is_file():
                try:
                    float(rest)
                except ValueError:
                    pass
                else:  # FILE:1.5:2 (a prompt tag's <lora:name:te:unet>): read as a file "FILE:1.5" that is not there
                    raise InputError(f"--lora takes one scale, FILE:SCALE, and {spec!r} gives two", where=f"--lora {spec}",
                                     fix=f"write --lora {first}:{rest} (separate text-encoder and UNet scales are a "
                                         "prompt tag's, <lora:NAME:TE:UNET> with --lora-dir)")
    return _existing(path, "LoRA file", "--lora"), scale


def check(args: argparse.Namespace) -> WeightArgs:
    """The options, checked; raises ``InputError`` naming the flag."""
    out = WeightArgs(low_memory=args.low_memory, vae_tile=args.vae_tile, t5=getattr(args, "t5", True),
                     prediction=getattr(args, "prediction", None))
    if args.weights:
        out.weights = _readable(_existing(args.weights, "checkpoint", "--weights"), "--weights")
    if args.vae:
        out.vae = _one_file(args.vae, "VAE file", "--vae")
    out.text_encoders = [_one_file(t, "text-encoder file", "--text-encoder") for t in args.text_encoders]
    out.loras = [(_readable(path, "--lora", folder=True), scale) for path, scale in map(parse_lora, args.lora)]
    if args.lora_dir:
        out.lora_dir = _existing(args.lora_dir, "LoRA folder", "--lora-dir", folder=True)
    out.embeddings = [_embedding(e) for e in args.embedding]
    if args.embedding_dir:
        from ..checkpoint.embeddings import EMBEDDING_SUFFIXES

        d = _existing(args.embedding_dir, "embedding folder", "--embedding-dir", folder=True)
        for f in sorted(d.iterdir()):
            if f.suffix.lower() in EMBEDDING_SUFFIXES and f.is_file():  # A1111's formats
                out.found_embeddings.append(f)
    if out.vae_tile is not None and out.vae_tile < 8:
        raise InputError(f"--vae-tile {out.vae_tile} is below 8 latent pixels (8 image pixels each)",
                         where="--vae-tile", fix="pass --vae-tile 8 or more (64: tiles of 512 pixels)")
    return out


def pipeline_options(w: WeightArgs) -> dict[str, Any]:
    """``pipelines.load`` keywords: memory options, and the separate VAE / text-encoder files."""
    return {"low_memory": w.low_memory, "vae_tile": w.vae_tile, "vae": w.vae, "text_encoders": w.text_encoders,
            **({} if w.t5 else {"t5": False}), **({"prediction": w.prediction} if w.prediction else {})}


def apply(pipe: Any, w: WeightArgs, prompts: tuple[str, str | None] = ("", None)) -> None:
    """Bind the checkpoint, LoRAs and embeddings to a loaded pipeline.

    An embedding of ``--embedding-dir`` that cannot be used (a broken file, another model family's)
    is skipped with a warning, as A1111 does, unless one of ``prompts`` uses its trigger word: then
    its error stands."""
    from ..errors import SdrtError, in_caller_words_error

    if w.weights is not None:
        pipe.load_weights(w.weights)
    if w.lora_dir is not None:
        pipe.weights.lora_dir = w.lora_dir
    if w.loras:
        pipe.set_loras(w.loras)
    if w.embeddings:
        pipe.add_embedding(*w.embeddings)
    from ..text import extract_loras

    text = " ".join(extract_loras(p)[0] for p in prompts if p)  # <lora:name:w> names a LoRA, no trigger word
    for f in w.found_embeddings:
        try:
            pipe.add_embedding(f)
        except SdrtError as exc:
            if re.search(rf"(?<![\w]){re.escape(f.stem)}(?![\w])", text, flags=re.IGNORECASE):
                raise
            log.warning("skipping embedding %s (no prompt uses %r): %s", f, f.stem, in_caller_words_error(exc))
