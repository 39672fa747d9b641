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
import time
from pathlib import Path
from typing import Any

from .config import ServeConfig

log = logging.getLogger("sdrt.serve.ray")


def _import_serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        from ..errors import InputError

        raise InputError("sdrt serve --ray needs Ray Serve", where="--ray", fix="pip install 'sdrt[ray]'") from None
    return serve


def deployment(config: ServeConfig, *, replicas: int | None = None, gpus_per_replica: float = 0.0,
               cpus_per_replica: float = 1.0) -> Any:
    """A bound Ray Serve application: ``replicas`` copies (default: one per ``config.devices``),
    each serving ``config`` with one worker on ``config.devices[0]`` as that replica sees it
    (Ray gives a replica with ``gpus_per_replica=1`` its own GPU as device 0)."""
    serve = _import_serve()
    count = replicas or len(config.devices)
    replica_config = dataclasses.replace(config, devices=(config.devices[0],))

    def build() -> Any:
        from .app import create_app

        return create_app(replica_config)

    @serve.deployment(name="sdrt", num_replicas=count,
                      ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
                      max_ongoing_requests=config.limits.max_queue + 8)
    @serve.ingress(build)
    class SdrtReplica:
        pass

    return SdrtReplica.bind()


def app_builder(args: dict[str, str]) -> Any:
    """For ``serve run sdrt.serve.ray_app:app_builder key=value ...``: models, lora_dir, embedding_dir,
    backend, device, replicas, gpus_per_replica, api_auth, api_token."""
    from .auth import parse_api_auth

    def folder(key: str) -> Path | None:
        return Path(args[key]).resolve() if args.get(key) else None

    config = ServeConfig(models=folder("models"), lora_dir=folder("lora_dir"), embedding_dir=folder("embedding_dir"),
                         backend=args.get("backend", "auto"), devices=(args.get("device"),),
                         auth=parse_api_auth(args["api_auth"]) if args.get("api_auth") else (),
                         tokens=(args["api_token"],) if args.get("api_token") else ())
    return deployment(config, replicas=int(args.get("replicas", 1)),
                      gpus_per_replica=float(args.get("gpus_per_replica", 0)))


def run_ray(config: ServeConfig, *, host: str, port: int, address: str | None = None,
            gpus_per_replica: float = 0.0, block: bool = True) -> int:
    """``sdrt serve --ray``: connect to (or start) a Ray cluster, deploy, and serve until Ctrl-C."""
    import ray

    serve = _import_serve()
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
        ray.shutdown()
    return 0


__all__ = ["app_builder", "deployment", "run_ray"]
