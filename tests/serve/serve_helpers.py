"""Helpers of the serve tests: a live uvicorn server on a free localhost port."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

_MISSING = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
#: for tests that run a server: skipped, with the reason, without the serve extra
needs_server = pytest.mark.skipif(bool(_MISSING), reason=f"sdrt serve needs {' and '.join(_MISSING)}: "
                                                         "pip install 'sdrt[serve]'")


def png_b64(arr) -> str:
    """An HxW or HxWx3 uint8 array as a request sends a picture: a PNG, base64."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def png_rgb(b64: str):
    """A base64 picture an answer carries as an HxWx3 uint8 array."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(config) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a uvicorn server running ``create_app(config)`` in a thread."""
    from sdrt.serve import create_app

    with serve_app(create_app(config)) as url:
        yield url


@contextmanager
def serve_app(app) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a uvicorn server running the ASGI ``app`` in a thread (a test that reads the
    app's state, ``app.state.sdrt``, makes it with ``create_app``)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
