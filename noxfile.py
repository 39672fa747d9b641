"""nox sessions: tests, lint, conformance, bench, size, demo.

Every session builds its own virtualenv and installs sdrt from this checkout,
so what passes here passes from a fresh clone.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = False

CORE = str(ROOT / "core")
REFERENCE = str(ROOT / "plugins" / "template")
TEST_DEPS = ["pytest>=8", "setuptools>=70.1", "hypothesis>=6.100", "onnxruntime>=1.17", "safetensors>=0.4",
             # reads back the PNGs that sdrt.pipelines.png writes (the core itself does not need Pillow)
             "pillow>=10"]

#: vendor plugin folders whose vendor package installs from PyPI on a plain
#: Linux x86-64 machine; the test session installs each one that exists.
INSTALLABLE_PLUGINS: list[str] = ["plugin-openvino", "plugin-ggml", "plugin-migraphx"]


def _install_sdrt(session: nox.Session, *extra: str) -> None:
    plugins = [str(ROOT / p) for p in INSTALLABLE_PLUGINS if (ROOT / p / "pyproject.toml").exists()]
    session.install(CORE, REFERENCE, *plugins, *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """Install the core, the reference backend and the installable plugins; run pytest."""
    _install_sdrt(session, *TEST_DEPS)
    session.run("pytest", "-q", "-ra", *(session.posargs or ["tests"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def conformance(session: nox.Session) -> None:
    """ONNX backend tests (node suite and light models) against a backend: `nox -s conformance -- reference`."""
    _install_sdrt(session)
    args = session.posargs or ["reference"]
    session.run("sdrt", "conformance", *args)


@nox.session
def bench(session: nox.Session) -> None:
    """Time every installed sdrt backend against raw onnxruntime and OpenVINO: `nox -s bench -- --models unet`."""
    # ggml-python is built from source with llamafile's GEMM kernels, as `sdrt install` builds it;
    # no cache, so that a wheel built without the flag is never reused
    session.install("--no-cache-dir", "--no-binary", "ggml-python", "ggml-python>=0.0.45",
                    env={"CMAKE_ARGS": "-DGGML_LLAMAFILE=ON"})
    _install_sdrt(session, "onnxruntime>=1.17", "openvino>=2024.4", "platformdirs>=3")
    session.run("python", "-m", "bench", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Install the core and the reference backend, then run `sdrt demo`."""
    _install_sdrt(session)
    session.run("sdrt", "demo", *session.posargs)


@nox.session
def size(session: nox.Session) -> None:
    """The install-size promise: core + one plugin, per plugin, under 200 MB of site-packages."""
    import json

    session.install("pip")
    results = {}
    for plugin in ["plugins/template", *INSTALLABLE_PLUGINS]:
        if not (ROOT / plugin / "pyproject.toml").exists():
            continue
        target = Path(session.create_tmp()) / plugin.replace("/", "_")
        session.run("python", "-m", "pip", "install", "-q", "--target", str(target), CORE, str(ROOT / plugin),
                    silent=True)
        total = sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
        results[plugin] = round(total / 2**20, 1)
        session.log(f"{plugin}: core + plugin + dependencies = {results[plugin]} MB")
    print(json.dumps(results))
    too_big = {p: mb for p, mb in results.items() if mb > 200}
    if too_big:
        session.error(f"over the 200 MB install budget: {too_big}")
