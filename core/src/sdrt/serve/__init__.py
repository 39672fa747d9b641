"""``sdrt serve``: the HTTP API that image apps already speak (AUTOMATIC1111's ``/sdapi/v1`` and
OpenAI's ``/v1/images/generations``), on a queue with one worker per device.

Needs the ``serve`` extra (Starlette, uvicorn, Pillow for init images): ``pip install "sdrt[serve]"``.

    from sdrt.serve import ServeConfig, create_app
    app = create_app(ServeConfig(devices=["CPU"]))      # an ASGI app; ``sdrt serve`` runs it with uvicorn

Modules, one job each: ``config`` (settings, limits), ``errors`` (``ApiError``: status + message),
``auth`` (HTTP basic / bearer token), ``registry`` (model, LoRA and embedding names, resolved only
inside the configured folders), ``spec`` (the picklable pipeline spec), ``stopping`` (how a running
job is stopped), ``jobs`` (queue, workers, progress), ``state`` (one server's registry, queue and
options), ``fields`` (typed reads of JSON fields), ``b64images`` (base64 init images and masks),
``a1111`` (request parsing for ``/sdapi/v1``), ``responses`` (PNG, infotext and A1111's response
fields), ``http`` (body limits, error bodies), ``routes_a1111`` and ``routes_openai`` (the HTTP
routes), ``app`` (the Starlette app, auth and CORS), ``ray_app`` (the Ray Serve deployment).
See docs/serve.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .app import create_app
    from .config import Limits, ServeConfig
    from .spec import PipelineSpec

_LAZY = {"create_app": "app", "ServeConfig": "config", "Limits": "config", "PipelineSpec": "spec"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sdrt.serve' has no attribute {name!r}")


__all__ = ["Limits", "PipelineSpec", "ServeConfig", "create_app"]
