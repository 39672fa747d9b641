"""A real uvicorn server on a free localhost port, serving copies of the demo model on OpenVINO.

Skipped with the reason when the serve extra (starlette, uvicorn) is not installed.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="sdrt serve needs starlette: pip install 'sdrt[serve]'")
pytest.importorskip("uvicorn", reason="sdrt serve needs uvicorn: pip install 'sdrt[serve]'")

from sdrt import pipelines, plugins  # noqa: E402

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module", autouse=True)
def backends():
    """OpenVINO (installed by the tests session) and the reference backend, registered explicitly."""
    import sdrt_openvino
    import sdrt_reference

    plugins.reset_registry()
    reg = plugins.get_registry()
    reg.register_plugin(sdrt_reference, "reference", distribution="sdrt-reference")
    reg.register_plugin(sdrt_openvino, "openvino", distribution="sdrt-openvino", version="0.1.0")
    try:
        yield reg
    finally:
        plugins.reset_registry()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """Two model folders (copies of the 5 MB demo model), so a client can switch between them."""
    root = tmp_path_factory.mktemp("models")
    for name in ("demo-a", "demo-b"):
        shutil.copytree(pipelines.DEMO_MODEL, root / name)
    (root / "notes.txt").write_text("not a model")
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(config) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a uvicorn server running ``create_app(config)`` in a thread."""
    import uvicorn

    from sdrt.serve import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
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


@pytest.fixture(scope="module")
def server(models_dir) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models_dir, backend="openvino")) as url:
        yield url
