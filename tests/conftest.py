"""Test-wide setup: entry-point autoload is off; tests register the plugins they use.

``registry`` gives a fresh registry with the reference backend registered
explicitly; ``inline_plugin`` registers an inline ``@hookimpl`` class and
unregisters it in ``finally`` (the llm pattern).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ["SDRT_LOAD_ENTRY_POINTS"] = "0"
# The tests compare against float32 references (onnxruntime, diffusers, k-diffusion), so every backend runs at
# float32 here whatever this CPU's default is (bf16 where it has AVX-512-BF16 or AMX: sdrt.precision_default):
# they hold on AVX2, AVX-512 and AMX CPUs alike. Tests of the default itself clear it (monkeypatch.delenv).
os.environ["SDRT_PRECISION"] = "fp32"
# Every cache sdrt keeps (compiled models, pinned shapes, converted checkpoints, the stored calibration that
# backend="auto" and the memory budget read) goes to a folder of this test process, not the user's: a test run
# neither fills nor reads the user's cache, and a calibration made on this machine does not change what the
# tests pick. Tests of the default location set or clear the variable themselves (monkeypatch).
_CACHE = tempfile.mkdtemp(prefix="sdrt-test-cache-")
os.environ["SDRT_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)

import pytest  # noqa: E402

from sdrt import plugins  # noqa: E402


@pytest.fixture
def registry():
    import sdrt_reference

    plugins.reset_registry()
    reg = plugins.get_registry()
    reg.register_plugin(sdrt_reference, "reference", distribution="sdrt-reference")
    try:
        yield reg
    finally:
        plugins.reset_registry()


@pytest.fixture(scope="module")
def demo_pipe():
    """The embedded demo model's pipeline on OpenVINO, one per test module (no pipeline state crosses modules)."""
    from backend_helpers import register

    from sdrt import pipelines

    register("openvino")
    with pipelines.load(pipelines.DEMO_MODEL, backend="openvino") as p:
        yield p


@pytest.fixture
def inline_plugin(registry):
    added: list[str] = []

    def add(obj, name: str):
        added.append(name)
        return registry.register_plugin(obj, name)

    try:
        yield add
    finally:
        for name in added:
            registry.unregister_plugin(name)
