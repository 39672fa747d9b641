"""What the server is told at start: folders, backend, devices, auth and the request limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    """Per-request limits; a request over one gets a 4xx naming the field and the limit."""

    max_width: int = 2048
    max_height: int = 2048
    max_steps: int = 150
    max_batch: int = 8            # batch_size (images per run)
    max_images: int = 32          # batch_size * n_iter
    max_body_bytes: int = 32 * 2**20
    max_prompt_chars: int = 20000
    max_queue: int = 64           # queued jobs before new ones get 503


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``create_app`` needs; plain data, so it pickles (the Ray replicas get a copy).

    ``models``: a folder of model folders (diffusers/Optimum ONNX layout), each served under its
    folder name, and of single-file ``.safetensors`` checkpoints, served under their file name: each on its
    own on sdrt's shipped weight-free graphs when it holds a whole model, or, when ``checkpoint_base`` (a
    folder name) is set, bound onto that folder; None serves the embedded demo model. ``devices``: one worker each (a device id as
    ``sdrt.load`` takes it, e.g. ``"CPU"``, ``"openvino:CPU"``, ``"cuda:0"``; None: the backend's default).
    ``vae_dir`` / ``text_encoder_dir``: the separate VAE and text-encoder files requests choose (A1111's ``sd_vae``, Forge's
    ``forge_additional_modules``); by default the models folder's ``VAE/`` and ``text_encoder/``.
    ``auth``: ``("user", "pass")`` pairs for HTTP basic; ``tokens``: bearer tokens. No auth when both are empty.
    ``precision``: every model's compute precision (``"fp32"``...; None: each device's default); ``quantize``:
    every model's weight quantization (``"int8"``, ``"int4"``, ``"fp8"``; None: float weights).
    """

    models: Path | None = None
    lora_dir: Path | None = None
    embedding_dir: Path | None = None
    backend: str = "auto"
    devices: tuple[str | None, ...] = (None,)
    auth: tuple[tuple[str, str], ...] = ()
    tokens: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    keep_models: int = 2          # pipelines each worker keeps warm
    keep_preprocessors: int = 1   # idle compiled preprocessor models kept per device (pipelines.preprocessors)
    low_memory: bool | None = False
    #: the compute precision of every model (``sdrt.load``'s ``precision=``); None: each device's default
    precision: str | None = None
    #: every model's weight quantization (``pipelines.load``'s ``quantize=``: "int8", "int4", "fp8"); None: float
    quantize: str | None = None
    default_model: str | None = None
    checkpoint_base: str | None = None  # a model folder that .safetensors checkpoints bind onto (None: their own)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (A1111's --cors-allow-origins)
    vae_dir: Path | None = None  # VAE files (sd_vae, forge_additional_modules); None: the models folder's VAE/
    text_encoder_dir: Path | None = None  # text-encoder files (forge_additional_modules); None: its text_encoder/

    def __post_init__(self) -> None:
        """Folders given as strings become paths, and one device or token given as a string is one (a string
        iterated is its letters: three workers on 'C', 'P', 'U'; every letter of a token let in)."""
        from ..args import one_or_many
        from ..errors import InputError

        for name in ("models", "lora_dir", "embedding_dir", "vae_dir", "text_encoder_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        for name, none in (("devices", (None,)), ("tokens", ()), ("cors_origins", ())):
            value = getattr(self, name)
            object.__setattr__(self, name, none if value is None else tuple(one_or_many(value, str)))
        if isinstance(self.auth, str) or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in self.auth):
            raise InputError(f"auth takes (user, password) pairs, got {self.auth!r:.60}", where="ServeConfig(auth=...)",
                             fix="pass auth=[('alice', 's3cret')] (sdrt.serve.auth.parse_api_auth reads 'user:pass')")
        object.__setattr__(self, "auth", tuple(tuple(p) for p in self.auth))
        if self.precision is not None:  # a word that names no precision: now, not at the first request
            from ..precision import precision_name

            object.__setattr__(self, "precision", precision_name(self.precision, where="ServeConfig(precision=...)"))
        if self.quantize is not None:  # likewise
            from ..quantization import parse

            parse(self.quantize, "ServeConfig(quantize=...)")


__all__ = ["Limits", "ServeConfig"]
