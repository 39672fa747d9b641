"""What one server holds: its config, the registry, the job queue and A1111's options."""

from __future__ import annotations

import threading
from typing import Any

from .config import ServeConfig
from .errors import ApiError
from .jobs import JobQueue
from .registry import ModelEntry, Registry
from .spec import PipelineSpec

#: options a client may store and read back (Easy Diffusion sets a few); bounded so a client cannot grow them
_MAX_OPTIONS = 256


class ServerState:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.limits = config.limits
        self.registry = Registry(config.models, config.lora_dir, config.embedding_dir, config.checkpoint_base)
        self._lock = threading.Lock()
        first = self.registry.model(config.default_model, "--default-model") if config.default_model else None
        self._options: dict[str, Any] = {"samples_format": "png", "CLIP_stop_at_last_layers": 1,
                                         "sd_model_checkpoint": (first or self._first()).title if (
                                             first or self.registry.models) else None}
        self.queue = JobQueue(config.devices, self.spec_for, keep=config.keep_models,
                              max_queue=config.limits.max_queue)

    def _first(self) -> ModelEntry | None:
        models = self.registry.models
        return models[0] if models else None

    def spec_for(self, model: ModelEntry, device: str | None) -> PipelineSpec:
        return PipelineSpec(model.path, self.config.backend, device, self.config.lora_dir,
                            tuple(self.registry.embeddings.values()), self.config.low_memory, model.weights)

    # ---------------------------------------------------------------- A1111 options
    def options(self) -> dict[str, Any]:
        with self._lock:
            out = dict(self._options)
        current = out.get("sd_model_checkpoint")
        if current:
            try:
                entry = self.registry.model(current)
                out["sd_checkpoint_hash"] = entry.hash
            except ApiError:
                pass
        return out

    def set_options(self, body: Any) -> None:
        from .fields import get_int

        if not isinstance(body, dict):
            raise ApiError(422, "the options body must be a JSON object of option names to values")
        updates: dict[str, Any] = {}
        if body.get("sd_model_checkpoint") is not None:
            updates["sd_model_checkpoint"] = self.registry.model(body["sd_model_checkpoint"]).title
        clip = get_int(body, "CLIP_stop_at_last_layers", None, 1, 12)
        if clip is not None:
            updates["CLIP_stop_at_last_layers"] = clip
        for key, value in body.items():
            if key in ("sd_model_checkpoint", "CLIP_stop_at_last_layers"):
                continue
            if not isinstance(key, str) or len(key) > 100:
                raise ApiError(400, "option names are strings of at most 100 characters", field=str(key)[:100])
            if not isinstance(value, (str, int, float, bool, list, type(None))) or len(str(value)) > 10000:
                raise ApiError(422, f"option {key} must be a short string, number, boolean or list", field=key)
            updates[key] = value
        with self._lock:
            if len(set(self._options) | set(updates)) > _MAX_OPTIONS:
                raise ApiError(400, f"this server stores at most {_MAX_OPTIONS} options")
            self._options.update(updates)

    def close(self) -> None:
        self.queue.close()


__all__ = ["ServerState"]
