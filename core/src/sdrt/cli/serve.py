"""``sdrt serve``: AUTOMATIC1111's and OpenAI's image APIs over HTTP (needs ``sdrt[serve]``)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from pathlib import Path
from typing import Any

from ..errors import InputError
from . import precision
from .generate_memory import quantize_option

log = logging.getLogger("sdrt.cli")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve", help="serve AUTOMATIC1111's /sdapi/v1 and OpenAI's /v1/images API over HTTP",
        description="Serve image generation over HTTP: AUTOMATIC1111's API (/sdapi/v1/txt2img, img2img, options, "
                    "progress, interrupt, ...) and OpenAI's /v1/images/generations. One worker per --device. "
                    "Needs the serve extra: pip install 'sdrt[serve]'. See docs/serve.md.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--models", default=None, metavar="DIR",
                   help="folder of model folders (diffusers/Optimum ONNX) and single-file .safetensors checkpoints; "
                        "default: the embedded demo model")
    p.add_argument("--default-model", default=None, metavar="NAME", help="model used until a client picks one")
    p.add_argument("--checkpoint-base", default=None, metavar="NAME",
                   help="a model folder that the .safetensors checkpoints in --models bind onto (default: none; each "
                        "complete checkpoint is served on its own on sdrt's shipped graphs)")
    p.add_argument("--lora-dir", default=None, metavar="DIR", help="where <lora:name:w> finds name.safetensors (or .pt, .ckpt)")
    p.add_argument("--embedding-dir", default=None, metavar="DIR", help="textual-inversion embeddings to load")
    p.add_argument("--vae-dir", default=None, metavar="DIR",
                   help="VAE files that sd_vae and forge_additional_modules name (default: --models' VAE folder)")
    p.add_argument("--text-encoder-dir", default=None, metavar="DIR",
                   help="text-encoder files that forge_additional_modules names (default: --models' text_encoder folder)")
    p.add_argument("--backend", default="auto")
    precision.add_flag(p, "every model")
    p.add_argument("--quantize", default=None, metavar="SCHEME",
                   help="store every model's matmul and conv weights as int8, int4 or fp8 (the VAE stays float); "
                        "as sdrt generate --quantize")
    p.add_argument("--device", action="append", default=None, metavar="D",
                   help="one worker per --device (repeatable; the same device twice runs two workers on it)")
    p.add_argument("--api-auth", default=None, metavar="USER:PASS[,USER:PASS]",
                   help="HTTP basic auth, A1111's flag (also $SDRT_API_AUTH)")
    p.add_argument("--api-token", action="append", default=None, metavar="TOKEN",
                   help="accept 'Authorization: Bearer TOKEN' (repeatable; also $SDRT_API_TOKEN)")
    p.add_argument("--cors-allow-origins", default=None, metavar="ORIGIN[,ORIGIN]",
                   help="browser origins allowed to call the API (A1111's flag; default: none)")
    p.add_argument("--max-size", type=int, default=2048, help="largest width and height (default 2048)")
    p.add_argument("--max-steps", type=int, default=150)
    p.add_argument("--max-batch", type=int, default=8, help="largest batch_size (default 8)")
    p.add_argument("--max-images", type=int, default=32, help="largest batch_size x n_iter (default 32)")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body (default 32 MB)")
    p.add_argument("--max-queue", type=int, default=64, help="queued jobs before new ones get 503 (default 64)")
    p.add_argument("--keep-models", type=int, default=2, help="pipelines each worker keeps loaded (default 2)")
    p.add_argument("--keep-preprocessors", type=int, default=1,
                   help="compiled model-backed preprocessors (DWPose, MiDaS, ...) kept loaded per device once idle, "
                        "the most recently used (default 1; 0: closed after each use)")
    p.add_argument("--low-memory", action="store_true", default=False, help="keep only the running part loaded")
    p.add_argument("--ray", action="store_true",
                   help="run as a Ray Serve deployment (one replica per --device; needs sdrt[ray])")
    p.add_argument("--ray-gpus", type=float, default=0.0, metavar="N",
                   help="GPUs Ray gives each replica (1: one GPU each, seen by the replica as device 0)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="join this Ray cluster (default: start a local one, or $RAY_ADDRESS)")
    return p


def _folder(value: str | None, flag: str) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if not path.is_dir():
        raise InputError(f"{flag} {value} is not a folder", where=flag, fix="give an existing folder")
    return path.resolve()


def _not_one_model(value: str | None) -> None:
    """--models names the folder that holds models: one model's folder or file there is the usual first mistake."""
    path = Path(value) if value is not None else None
    if path is None or not ((path / "model_index.json").is_file() or path.suffix.lower() in (".safetensors", ".ckpt")
                            and path.is_file()):
        return
    what = "a model folder (it holds model_index.json)" if path.is_dir() else "a checkpoint file"
    parent = path.resolve().parent
    raise InputError(f"--models {value} is {what}; --models takes the folder that holds models", where="--models",
                     fix=f"pass --models {parent} (every model there is served; --default-model {path.name} picks "
                         "this one)")


def config_from_args(args: argparse.Namespace) -> Any:
    from ..serve.auth import parse_api_auth
    from ..serve.config import Limits, ServeConfig

    for flag, value, low in (("--port", args.port, 0), ("--max-size", args.max_size, 8), ("--max-steps", args.max_steps, 1),
                             ("--max-batch", args.max_batch, 1), ("--max-images", args.max_images, 1),
                             ("--max-queue", args.max_queue, 1), ("--keep-models", args.keep_models, 1),
                             ("--keep-preprocessors", args.keep_preprocessors, 0)):
        if value < low:
            raise InputError(f"{flag} {value} is below {low}", where=flag, fix=f"pass {low} or more")
    from ..pipelines.bounds import MAX_BATCH, MAX_SIDE, MAX_STEPS

    for flag, value, high in (("--max-size", args.max_size, MAX_SIDE), ("--max-steps", args.max_steps, MAX_STEPS),
                              ("--max-batch", args.max_batch, MAX_BATCH)):
        if value > high:  # what any generation takes (sdrt.pipelines.validate)
            raise InputError(f"{flag} {value} is above {high}, the most sdrt generates", where=flag,
                             fix=f"pass {high} or less")
    if args.port > 65535:
        raise InputError(f"--port {args.port} is not a TCP port", where="--port", fix="pass a port from 0 to 65535")
    if not 0 < args.max_body_mb <= 4096:
        raise InputError(f"--max-body-mb {args.max_body_mb:g} is out of range", where="--max-body-mb",
                         fix="pass a size in MB above 0 and at most 4096 (e.g. 0.5 or 200)")
    if not args.ray:  # Ray's own flags would do nothing without it
        for flag, value in (("--ray-gpus", args.ray_gpus), ("--ray-address", args.ray_address)):
            if value:
                raise InputError(f"{flag} applies to a Ray Serve deployment, and --ray was not given", where=flag,
                                 fix=f"add --ray, or leave {flag} out")
    if args.checkpoint_base is not None:  # a name in --models, checked now, not warned about at each refresh
        if args.models is None:
            raise InputError("--checkpoint-base names a model folder in --models, and no --models was given",
                             where="--checkpoint-base", fix="pass --models DIR too, or leave --checkpoint-base out")
        if not (Path(args.models) / args.checkpoint_base).is_dir():
            names = sorted(p.name for p in Path(args.models).iterdir() if p.is_dir()) if Path(args.models).is_dir() \
                else []
            raise InputError(f"--models {args.models} holds no model folder named {args.checkpoint_base!r}",
                             where="--checkpoint-base",
                             fix=f"pass one of: {', '.join(names)}" if names else "put the model folder in --models")
    auth_text = args.api_auth or os.environ.get("SDRT_API_AUTH")
    auth = parse_api_auth(auth_text) if auth_text else ()
    tokens = tuple(args.api_token or ([os.environ["SDRT_API_TOKEN"]] if os.environ.get("SDRT_API_TOKEN") else []))
    if any(not t.strip() for t in tokens):
        raise InputError("an empty --api-token would let anyone in", where="--api-token", fix="give a long random token")
    limits = Limits(max_width=args.max_size, max_height=args.max_size, max_steps=args.max_steps,
                    max_batch=args.max_batch, max_images=max(args.max_images, args.max_batch),
                    max_body_bytes=int(args.max_body_mb * 2**20), max_queue=args.max_queue)
    _not_one_model(args.models)
    return ServeConfig(models=_folder(args.models, "--models"), lora_dir=_folder(args.lora_dir, "--lora-dir"),
                       embedding_dir=_folder(args.embedding_dir, "--embedding-dir"), backend=args.backend,
                       vae_dir=_folder(args.vae_dir, "--vae-dir"),
                       text_encoder_dir=_folder(args.text_encoder_dir, "--text-encoder-dir"),
                       devices=tuple(args.device) if args.device else (None,), auth=auth, tokens=tokens,
                       limits=limits, keep_models=args.keep_models,
                       keep_preprocessors=args.keep_preprocessors, low_memory=args.low_memory or False,
                       precision=precision.option(args.precision, args.backend,
                                                  args.device[0] if args.device else None).get("precision"),
                       quantize=None if args.quantize is None else quantize_option(args.quantize),
                       default_model=args.default_model, checkpoint_base=args.checkpoint_base,
                       cors_origins=tuple(o.strip() for o in (args.cors_allow_origins or "").split(",") if o.strip()))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(host: str, port: int) -> None:
    """Bind ``host:port`` once, as the server will (``SO_REUSEADDR``), and let it go: an address this machine
    does not have, or a port another server holds, is an error about ``--host`` or ``--port``."""
    import errno
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise InputError(f"--host {host!r} is not an address of this machine ({exc})", where="--host",
                         fix="pass 127.0.0.1 (this machine only), 0.0.0.0 (every network) or one of its addresses"
                         ) from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise InputError(f"port {port} on {host} is in use", where="--port",
                                 fix="stop the server that holds it, or pass another --port") from None
            if exc.errno == errno.EACCES:
                raise InputError(f"no permission to listen on port {port}", where="--port",
                                 fix="pass a port above 1023 (7860 is the default)") from None
            raise InputError(f"cannot listen on {host}:{port} ({exc.strerror or exc})", where="--host",
                             fix="pass 127.0.0.1, 0.0.0.0 or an address of this machine") from None


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if not args.ray:  # a wrong backend or device fails now, not at the first request (Ray replicas check their own)
        from ..runtime import select

        for device in config.devices:
            select(config.backend, device)
    if not _loopback(args.host) and not (config.auth or config.tokens):
        log.warning("serving on %s with no --api-auth or --api-token: anyone who can reach this port can use it",
                    args.host)
    check_listen(args.host, args.port)  # a port in use fails now, in the flags' words, not in the server's log
    if args.ray:
        from ..serve.ray_app import run_ray

        return run_ray(config, host=args.host, port=args.port, address=args.ray_address,
                       gpus_per_replica=args.ray_gpus)
    try:
        import uvicorn
    except ImportError:
        raise InputError("sdrt serve needs uvicorn and starlette", where="sdrt serve",
                         fix="pip install 'sdrt[serve]'") from None
    from ..serve.app import create_app

    app = create_app(config)
    if config.models is not None and not app.state.sdrt.registry.models:
        app.state.sdrt.close()
        # every generation would be a 503: say it now, once, in the flag's words (a folder may be added later
        # through the Python API and /refresh-checkpoints; from the command line, an empty folder is a mistake)
        raise InputError(f"--models {config.models} holds no model: no subfolder with model_index.json (a "
                         "diffusers or Optimum ONNX model) and no complete .safetensors checkpoint (any skipped "
                         "are named above)", where="--models",
                         fix="put a model folder or checkpoint there, or leave --models out to serve the demo model")
    print(f"sdrt serve: http://{args.host}:{args.port} (A1111 /sdapi/v1, OpenAI /v1/images/generations); "
          f"{len(config.devices)} worker(s); Ctrl-C stops", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if not args.verbose else "info")
    return 0
