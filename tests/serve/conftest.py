"""The serve tests: a real uvicorn server on a free localhost port, serving copies of the demo
model on OpenVINO. The tests that need a server are skipped, with the reason, when the serve extra
(starlette, uvicorn) is not installed (serve_helpers.needs_server).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import live_server

from sdrt import pipelines, plugins


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


@pytest.fixture(scope="module")
def server(models_dir) -> Iterator[str]:
    from sdrt.serve import ServeConfig

    with live_server(ServeConfig(models=models_dir, backend="openvino")) as url:
        yield url
