"""The same server as a Ray Serve deployment: one replica per device, each with one worker.

Started by ``sdrt serve --ray`` or by Ray's own CLI with a config::

    serve run sdrt.serve.ray_app:app_builder models=/srv/models replicas=2 gpus_per_replica=1 device=cuda:0

Each replica receives the picklable :class:`ServeConfig` and builds its own app, queue and
pipelines (from :class:`PipelineSpec`) on the node Ray places it on; Ray's HTTP proxy spreads
requests over the replicas. Needs ``sdrt[ray]``. See docs/serve.md, "Past one machine".
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .config import ServeConfig

log = logging.getLogger("sdrt.serve.ray")

#: how often a replica reads the shared interrupt/skip counters and reports its progress
POLL_SECONDS = 0.2
STALE_SECONDS = 10.0


class SharedState:
    """One per deployment (a named Ray actor): A1111's options, interrupt and skip counters, and
    each replica's last progress report, so that every replica answers as one server."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = dict(options)
        self.interrupts = 0
        self.skips = 0
        self.reports: dict[str, tuple[float, dict[str, Any]]] = {}

    def get_options(self) -> dict[str, Any]:
        return dict(self.options)

    def update_options(self, updates: dict[str, Any]) -> str | None:
        from .state import MAX_OPTIONS

        if len(set(self.options) | set(updates)) > MAX_OPTIONS:
            return f"this server stores at most {MAX_OPTIONS} options"
        self.options.update(updates)
        return None

    def interrupt(self) -> int:
        self.interrupts += 1
        return self.interrupts

    def skip(self) -> int:
        self.skips += 1
        return self.skips

    def poll(self, replica: str, report: dict[str, Any]) -> tuple[int, int]:
        self.reports[replica] = (time.time(), report)
        return self.interrupts, self.skips

    def progress(self, replica: str) -> list[dict[str, Any]]:
        now = time.time()
        # a live replica reports every POLL_SECONDS; one silent for STALE_SECONDS is gone (or hung)
        return [r for name, (t, r) in self.reports.items() if name != replica and now - t < STALE_SECONDS]


class RayCluster:
    """A replica's side of :class:`SharedState` (``sdrt.serve.state.Cluster``): calls the actor, and
    a thread that applies other replicas' interrupts and skips and reports this replica's progress."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._seen: tuple[int, int] | None = None
        self._state: Any = None

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=30)

    def get_options(self) -> dict[str, Any]:
        return self._get(self.actor.get_options.remote())

    def update_options(self, updates: dict[str, Any]) -> None:
        from .errors import ApiError

        problem = self._get(self.actor.update_options.remote(updates))
        if problem:
            raise ApiError(400, problem)

    def interrupt(self) -> None:
        self._seen = (self._get(self.actor.interrupt.remote()), self._seen[1] if self._seen else 0)

    def skip(self) -> None:
        self._seen = (self._seen[0] if self._seen else 0, self._get(self.actor.skip.remote()))

    def others_progress(self) -> list[dict[str, Any]]:
        return self._get(self.actor.progress.remote(self.replica))

    def attach(self, state: Any) -> None:
        self._state = state
        state.queue.on_change = self.push
        threading.Thread(target=self._loop, name="sdrt-serve-cluster", daemon=True).start()

    def push(self) -> None:
        """Report now (a job started or ended), without waiting: Ray runs one caller's actor calls in order."""
        self.actor.poll.remote(self.replica, self._state.progress_report())

    def _loop(self) -> None:
        while True:
            try:
                counts = self._get(self.actor.poll.remote(self.replica, self._state.progress_report()))
                if self._seen is not None:
                    if counts[0] > self._seen[0]:
                        self._state.queue.interrupt()
                    if counts[1] > self._seen[1]:
                        self._state.queue.skip()
                self._seen = (max(counts[0], self._seen[0] if self._seen else 0),
                              max(counts[1], self._seen[1] if self._seen else 0))
            except Exception as exc:  # noqa: BLE001 - a lost actor must not end the replica
                log.warning("shared state unreachable: %s", exc)
            time.sleep(POLL_SECONDS)


def _import_serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        from ..errors import InputError

        raise InputError("sdrt serve --ray needs Ray Serve", where="--ray", fix="pip install 'sdrt[ray]'") from None
    return serve


def deployment(config: ServeConfig, *, replicas: int | None = None, gpus_per_replica: float = 0.0,
               cpus_per_replica: float = 1.0, name: str = "sdrt") -> Any:
    """A bound Ray Serve application: ``replicas`` copies (default: one per ``config.devices``),
    each serving ``config`` with one worker on ``config.devices[0]`` as that replica sees it
    (Ray gives a replica with ``gpus_per_replica=1`` its own GPU as device 0)."""
    serve = _import_serve()
    count = replicas or len(config.devices)
    replica_config = dataclasses.replace(config, devices=(config.devices[0],))
    shared_name = f"sdrt-shared-{name}"  # one per deployment name, kept across redeploys (detached)

    def build() -> Any:
        import ray

        from .app import create_app
        from .registry import Registry

        entry = Registry(replica_config.models).first()  # as ServerState picks it
        first = replica_config.default_model or (entry.title if entry else None)
        actor = ray.remote(num_cpus=0)(SharedState).options(name=shared_name, get_if_exists=True,
                                                             lifetime="detached").remote(
            {"samples_format": "png", "CLIP_stop_at_last_layers": 1, "sd_model_checkpoint": first})
        return create_app(replica_config, RayCluster(actor))

    @serve.deployment(name=name, num_replicas=count,
                      ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
                      max_ongoing_requests=config.limits.max_queue + 8)
    @serve.ingress(build)
    class SdrtReplica:
        pass

    return SdrtReplica.bind()


def app_builder(args: dict[str, str]) -> Any:
    """For ``serve run sdrt.serve.ray_app:app_builder key=value ...``: models, lora_dir, embedding_dir, vae_dir,
    text_encoder_dir, backend, device, precision, quantize, replicas, gpus_per_replica, api_auth, api_token."""
    from .auth import parse_api_auth

    def folder(key: str) -> Path | None:
        return Path(args[key]).resolve() if args.get(key) else None

    config = ServeConfig(models=folder("models"), lora_dir=folder("lora_dir"), embedding_dir=folder("embedding_dir"),
                         vae_dir=folder("vae_dir"), text_encoder_dir=folder("text_encoder_dir"),
                         backend=args.get("backend", "auto"), devices=(args.get("device"),),
                         precision=args.get("precision") or None, quantize=args.get("quantize") or None,
                         auth=parse_api_auth(args["api_auth"]) if args.get("api_auth") else (),
                         tokens=(args["api_token"],) if args.get("api_token") else ())
    return deployment(config, replicas=int(args.get("replicas", 1)),
                      gpus_per_replica=float(args.get("gpus_per_replica", 0)))


def run_ray(config: ServeConfig, *, host: str, port: int, address: str | None = None,
            gpus_per_replica: float = 0.0, block: bool = True) -> int:
    """``sdrt serve --ray``: connect to (or start) a Ray cluster, deploy, and serve until Ctrl-C."""
    serve = _import_serve()  # first: without Ray, one line naming the extra, not import ray's traceback
    import ray

    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(config, gpus_per_replica=gpus_per_replica), name="sdrt", route_prefix="/")
    print(f"sdrt serve --ray: http://{host}:{port} ({len(config.devices)} replica(s)); Ctrl-C stops", flush=True)
    if not block:
        return 0
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        try:  # the shared-state actor is detached (it outlives a replica); it goes with the deployment
            ray.kill(ray.get_actor("sdrt-shared-sdrt"))
        except ValueError:
            pass
        ray.shutdown()
    return 0


__all__ = ["app_builder", "deployment", "run_ray"]
