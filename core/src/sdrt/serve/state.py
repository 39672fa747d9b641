"""What one server holds: its config, the registry, the job queue and A1111's options.

A1111's options, interrupts and skips are server-wide. On one machine they live here; in the Ray
deployment every replica is given a :class:`Cluster` (``sdrt.serve.ray_app``) that shares them with
the other replicas, so a model switch, an interrupt or a progress query reaches the whole deployment.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from .config import ServeConfig
from .errors import ApiError
from .jobs import JobQueue
from .registry import ModelEntry, Registry
from .spec import PipelineSpec

log = logging.getLogger("sdrt.serve")

#: options a client may store and read back (Easy Diffusion sets a few); bounded so a client cannot grow them
MAX_OPTIONS = 256


class Cluster(Protocol):
    """What a replica shares with the others (the Ray deployment's shared-state actor)."""

    def get_options(self) -> dict[str, Any]: ...
    def update_options(self, updates: dict[str, Any]) -> None: ...
    def interrupt(self) -> None: ...
    def skip(self) -> None: ...
    def others_progress(self) -> list[dict[str, Any]]: ...
    def attach(self, state: ServerState) -> None: ...


class ServerState:
    def __init__(self, config: ServeConfig, cluster: Cluster | None = None) -> None:
        self.config = config
        self.limits = config.limits
        self.registry = Registry(config.models, config.lora_dir, config.embedding_dir, config.checkpoint_base,
                                 config.vae_dir, config.text_encoder_dir)
        self._lock = threading.Lock()
        first = self._named(config.default_model) if config.default_model else self._first()
        if first is None:
            log.warning("no model to serve in %s: put model folders (with model_index.json) there", config.models)
        # randn_source: sdrt's default noise is diffusers' CPU stream (A1111's is GPU: set it to get A1111's)
        self._options: dict[str, Any] = {"samples_format": "png", "CLIP_stop_at_last_layers": 1, "randn_source": "CPU",
                                         "sd_model_checkpoint": first.title if first else None,
                                         "sd_vae": "Automatic", "forge_additional_modules": [],
                                         "hires_fix_refiner_pass": "second pass", "img2img_fix_steps": False,
                                         "refiner_switch_by_sample_steps": False, "upscaler_for_img2img": None}
        self.cluster = cluster
        from ..pipelines.preprocessors import keep_preprocessors

        keep_preprocessors(config.keep_preprocessors)  # the compiled detectors kept once idle (one process-wide cache)
        self.queue = JobQueue(config.devices, self.spec_for, keep=config.keep_models,
                              max_queue=config.limits.max_queue)
        if cluster is not None:
            cluster.attach(self)

    def _named(self, name: str) -> ModelEntry:
        from ..errors import InputError

        try:
            return self.registry.model(name, "--default-model")
        except ApiError as exc:
            raise InputError(exc.message, where="--default-model", fix="pass a model folder's name") from None

    def _first(self) -> ModelEntry | None:
        return self.registry.first()  # one that runs on its own and answers txt2img, before the others

    def spec_for(self, model: ModelEntry, device: str | None) -> PipelineSpec:
        return PipelineSpec(model.path, self.config.backend, device, self.config.lora_dir,
                            tuple(self.registry.embeddings.values()), self.config.low_memory, model.weights,
                            model.vae, model.text_encoders, self.config.precision, self.config.quantize)

    # ---------------------------------------------------------------- A1111 options
    def default_options(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._options)

    def options(self) -> dict[str, Any]:
        out = self.cluster.get_options() if self.cluster is not None else self.default_options()
        current = out.get("sd_model_checkpoint")
        if current:
            try:
                out["sd_checkpoint_hash"] = self.registry.model(current).hash
            except ApiError:
                pass
        return out

    def set_options(self, body: Any) -> None:
        from . import modules
        from .fields import get_int

        if not isinstance(body, dict):
            raise ApiError(422, "the options body must be a JSON object of option names to values")
        updates: dict[str, Any] = {}
        if body.get("sd_model_checkpoint") is not None:
            updates["sd_model_checkpoint"] = self.registry.model(body["sd_model_checkpoint"]).title
        elif "sd_model_checkpoint" in body and self.options().get("sd_model_checkpoint") is not None:
            # null was a 200 that changed nothing; it is taken only as the read-back of a server without models
            raise ApiError(400, "sd_model_checkpoint must name a model of this server, got null; "
                                "GET /sdapi/v1/sd-models lists them", field="sd_model_checkpoint")
        if "samples_format" in body and body["samples_format"] != "png":
            # it was stored and read back while every image stayed a PNG
            shown = repr(body["samples_format"])
            shown = shown if len(shown) <= 60 else shown[:60] + "..."  # echoed, not whole
            raise ApiError(400, f"samples_format {shown} is not supported: this server writes "
                                "png only; pass \"png\" or leave it out", field="samples_format")
        if body.get("randn_source") is not None:
            from .a1111 import randn_source

            updates["randn_source"] = randn_source(body["randn_source"], "randn_source")
        if body.get("hires_fix_refiner_pass") is not None:
            from .a1111 import hires_refiner_pass

            updates["hires_fix_refiner_pass"] = hires_refiner_pass(body["hires_fix_refiner_pass"],
                                                                   "hires_fix_refiner_pass")
        if "sd_vae" in body:  # A1111's: Automatic, None or a file of the VAE folder
            updates["sd_vae"] = modules.vae_option(self.registry, body["sd_vae"])
        if "forge_additional_modules" in body:  # Forge's: VAE and text-encoder files, stored by their names
            updates["forge_additional_modules"] = [e.name for e in modules.check_modules(
                self.registry, body["forge_additional_modules"], "forge_additional_modules")]
        from .a1111 import BOOL_OPTIONS
        from .fields import get_bool

        for key in BOOL_OPTIONS:
            if body.get(key) is not None:
                updates[key] = get_bool(body, key, False)
        if "upscaler_for_img2img" in body:  # A1111's: an upscaler's name (None: a Lanczos resize), read per request
            value = body["upscaler_for_img2img"]
            if value is not None and (not isinstance(value, str) or len(value) > 500):
                raise ApiError(422, "upscaler_for_img2img must be an upscaler's name (GET /sdapi/v1/upscalers lists "
                                    "them) or null", field="upscaler_for_img2img")
            updates["upscaler_for_img2img"] = value
        clip = get_int(body, "CLIP_stop_at_last_layers", None, 1, 12, fixed=True)
        if clip is not None:
            updates["CLIP_stop_at_last_layers"] = clip
        for key, value in body.items():
            if key in ("sd_model_checkpoint", "CLIP_stop_at_last_layers", "sd_checkpoint_hash", "randn_source", "sd_vae",
                       "forge_additional_modules", "hires_fix_refiner_pass", "upscaler_for_img2img", *BOOL_OPTIONS):
                continue
            if not isinstance(key, str) or len(key) > 100:
                raise ApiError(400, "option names are strings of at most 100 characters", field=str(key)[:100])
            if not isinstance(value, (str, int, float, bool, list, type(None))) or len(str(value)) > 10000:
                raise ApiError(422, f"option {key} must be a short string, number, boolean or list", field=key)
            updates[key] = value
        if self.cluster is not None:
            self.cluster.update_options(updates)
            return
        with self._lock:
            if len(set(self._options) | set(updates)) > MAX_OPTIONS:
                raise ApiError(400, f"this server stores at most {MAX_OPTIONS} options")
            self._options.update(updates)

    def refresh(self) -> None:
        """Read the folders again; when the current model is gone (its folder renamed or removed), the first one
        becomes current, as every request without its own model would otherwise be a 400 "no model named"."""
        from . import modules

        modules.forget()  # the VAE / text-encoder folders too, whatever their mtimes say
        self.registry.refresh()
        current = self.options().get("sd_model_checkpoint")
        entry = None
        if current:
            try:
                entry = self.registry.model(current)
            except ApiError:
                pass
        if entry is not None:
            if entry.title == current:
                return
            # the same model under a new title (its file replaced: another hash): the option reads as /sd-models
            # lists it, which clients match to show the current model
            log.info("the current model %s is %s now", current, entry.title)
        else:
            entry = self._first()
            if entry is None:
                return
            log.warning("the current model %s is gone from %s; %s is current now", current, self.config.models,
                        entry.title)
        updates = {"sd_model_checkpoint": entry.title}
        if self.cluster is not None:
            self.cluster.update_options(updates)
        else:
            with self._lock:
                self._options.update(updates)

    # ---------------------------------------------------------------- control
    def interrupt(self) -> int:
        if self.cluster is not None:
            self.cluster.interrupt()
        return self.queue.interrupt()

    def skip(self) -> int:
        if self.cluster is not None:
            self.cluster.skip()
        return self.queue.skip()

    def unload(self) -> int:
        """``POST /sdapi/v1/unload-checkpoint``: this server's loaded models closed, their memory given back (A1111
        moves its model off the GPU); the next request loads its model again."""
        n = self.queue.unload()
        log.info("unloaded %d pipeline(s)", n)
        return n

    def reload(self) -> None:
        """``POST /sdapi/v1/reload-checkpoint``: the current model loaded now, not at the next request."""
        current = self.options().get("sd_model_checkpoint")
        if not current:
            raise ApiError(400, "no current model to load: this server has no model", field="sd_model_checkpoint")
        from . import modules

        notes: list[str] = []  # the sd_vae and forge_additional_modules options, as a request without overrides
        model = modules.choose(self.registry, self.registry.model(current, "sd_model_checkpoint"), {}, self.options(),
                               notes)
        for note in notes:
            log.info("reload-checkpoint: %s", note)
        self.queue.reload(model)

    def progress_report(self) -> dict[str, Any]:
        """This server's running and queued jobs, as a replica reports them to the others."""
        return {"queued": self.queue.queued(),
                "running": [{"id": j.id, "worker": j.worker, "progress": round(j.progress, 4), "eta": round(j.eta, 3),
                             "iteration": j.iteration, "runs": j.work.n_iter, "started": j.started,
                             "step": j.step, "total": j.total,
                             "skipped": j.skip.is_set(), "interrupted": j.interrupt.is_set()}
                            for j in self.queue.running() if j.state == "running"]}

    def close(self) -> None:
        self.queue.close()


__all__ = ["Cluster", "MAX_OPTIONS", "ServerState"]
