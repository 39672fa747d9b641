"""nox sessions: tests, lint, conformance, bench, size, demo.

Every session builds its own virtualenv and installs sdrt from this checkout,
so what passes here passes from a fresh clone.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = False

CORE = str(ROOT / "core")
REFERENCE = str(ROOT / "plugins" / "template")
TEST_DEPS = ["pytest>=8", "setuptools>=70.1", "hypothesis>=6.100", "onnxruntime>=1.17", "safetensors>=0.4",
             # reads back the PNGs that sdrt.pipelines.png writes (the core itself does not need Pillow)
             "pillow>=10",
             # `sdrt serve` (the serve extra) and the clients its tests drive: an A1111 API client,
             # an HTTP client, and a reader of A1111/ComfyUI PNG metadata (tests/serve, about a minute)
             "starlette>=0.37", "uvicorn>=0.29", "httpx>=0.25", "webuiapi>=0.9", "sd-parsers>=0.5",
             # the serve extra's form reader (/v1/images/edits), and OpenAI's own SDK as that route's client
             "python-multipart>=0.0.9", "openai>=1.50",
             # GGUF files (the gguf extra): tests/gguf reads every quantized type against gguf's own dequantizer
             "gguf>=0.10"]

#: vendor plugin folders whose vendor package installs from PyPI on a plain
#: Linux x86-64 machine; the test session installs each one that exists.
INSTALLABLE_PLUGINS: list[str] = ["plugin-openvino", "plugin-ggml", "plugin-trt", "plugin-coreml", "plugin-migraphx"]
#: installable plugins that build and test here but offer no device on a CPU-only Linux machine:
#: TensorRT-RTX runs engines only on RTX GPUs, Core ML only on macOS, MIGraphX needs ROCm's module
#: (not on PyPI). The device requirement skips them; their tests import them unconditionally, so a
#: broken install still fails the run.
NO_DEVICE_HERE: set[str] = {"plugin-trt", "plugin-coreml", "plugin-migraphx"}


def _install_sdrt(session: nox.Session, *extra: str) -> None:
    plugins = [str(ROOT / p) for p in INSTALLABLE_PLUGINS if (ROOT / p / "pyproject.toml").exists()]
    session.install(CORE, REFERENCE, *plugins, *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """ruff, then pytest with the core, the reference backend and the installable plugins (README; .ci/run).

    ruff runs first, as in the lint session, so the README's one test command checks both."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    _install_sdrt(session, *TEST_DEPS)
    # the plugins installed here must import and run: tests/core/test_required_plugins.py fails otherwise
    required = ",".join(p.removeprefix("plugin-") for p in INSTALLABLE_PLUGINS
                        if (ROOT / p / "pyproject.toml").exists() and p not in NO_DEVICE_HERE)
    env = {"SDRT_REQUIRE_PLUGINS": required}
    if session.posargs:
        session.run("pytest", "-q", "-ra", *session.posargs, env=env)
        return
    # one pytest process per test folder: a single process over the whole suite ran out of memory maps
    # (vm.max_map_count, 65530) at 95%, anonymous maps of compiled models and server threads adding up module by module
    # each folder's ten slowest tests printed: CI's margin is thinnest on the slowest CPU (81-93 of 90 min on a
    # 2-core Zen 3 with the folders in turn)
    folders = [str(d.relative_to(ROOT)) for d in sorted((ROOT / "tests").iterdir())
               if d.is_dir() and any(d.rglob("test_*.py"))]
    beside = [f for f in folders if Path(f).name in BESIDE] if os.environ.get("SDRT_TEST_LANES", "2") != "1" else []
    log, failed = Path(session.create_tmp()) / "beside.log", []
    lane = threading.Thread(target=_pytest_lane, args=(session, beside, env, log, failed))
    lane.start()
    try:
        for folder in (f for f in folders if f not in beside):
            try:
                session.run(*PYTEST, folder, env=env)
            except CommandFailed:
                failed.append(folder)
    finally:
        lane.join()
        if beside:
            print(log.read_text(errors="replace"), flush=True)
    if failed:
        session.error(f"tests failed in {', '.join(sorted(failed))}")


#: test folders run at the same time as the others, in a pytest process of their own (``SDRT_TEST_LANES=1``: all in
#: turn): tests/pipelines is half of the suite's time (37-41 of 81-93 min on a 2-core Zen 3) and kept one core busy,
#: the other idle, most of it
BESIDE = ("pipelines",)
#: each folder's pytest command (its ten slowest tests printed)
PYTEST = ("pytest", "-q", "-ra", "--durations=10")


def _pytest_lane(session: nox.Session, folders: list[str], env: dict[str, str], log: Path,
                 failed: list[str]) -> None:
    """pytest on each of ``folders`` in turn, in the session's virtualenv, its output into ``log``."""
    child = {**os.environ, **env, "VIRTUAL_ENV": str(session.virtualenv.location),
             "PATH": os.pathsep.join([str(session.bin), os.environ.get("PATH", "")])}
    with log.open("w") as out:
        for folder in folders:
            out.write(f"nox > {' '.join(PYTEST)} {folder} (beside the other folders)\n")
            out.flush()
            done = subprocess.run([str(Path(session.bin) / PYTEST[0]), *PYTEST[1:], folder],
                                  cwd=ROOT, env=child, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode:
                failed.append(folder)


@nox.session
def serve_ray(session: nox.Session) -> None:
    """`sdrt serve` as a Ray Serve deployment on a local single-node Ray cluster (not in CI: Ray
    installs about 450 MB): the webuiapi client's txt2img, img2img, options, progress and interrupt."""
    _install_sdrt(session, *TEST_DEPS, "ray[serve]>=2.9")
    session.run("pytest", "-q", "-ra", *(session.posargs or ["tests/serve/test_serve_ray.py"]))


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
    """Time every installed sdrt backend against raw onnxruntime and OpenVINO: `nox -s bench -- --models unet`.

    With no arguments: every model at bench size, then the VAE decoder and the UNet at full (SD 1.x)
    size with 3 timed rounds each (`--no-full` skips those; bench/README.md says how long they take)."""
    # a plain install: sdrt-ggml builds its own float32 GEMM (plugin-ggml/native), so ggml-python
    # needs no build flags (docs/ggml.md, "The fast CPU build from pip")
    _install_sdrt(session, "onnxruntime>=1.17", "openvino>=2024.4", "platformdirs>=3")
    session.run("python", "-m", "bench", *session.posargs)  # the full-size rows come from bench's defaults
    # checkpoint swap / LoRA on-off against a fresh pipelines.load, peak RSS normal vs low-memory (issue 14)
    session.run("python", "-m", "bench.checkpoint_swap")


@nox.session
def bench_e2e(session: nox.Session) -> None:
    """End to end on a full-size SD 1.5 (not in CI): sdrt's backends against OpenVINO GenAI, stable-diffusion.cpp
    and diffusers: `nox -s bench_e2e -- --size 256 --rounds 1`.

    The model comes from `scripts/make_sd15_full.py` (run with a torch venv; `--model DIR` or $SDRT_E2E_MODEL,
    default /work/models/sd15-full) and `scripts/make_ldm_single_file.py` (the LDM file stable-diffusion.cpp
    reads). The peers install here; diffusers runs in $SDRT_E2E_TORCH_PYTHON when set (torch stays out of this
    venv). bench/README.md says what it prints."""
    _install_sdrt(session, "onnxruntime>=1.17", "openvino>=2024.4", "platformdirs>=3", "openvino-genai",
                  "openvino-tokenizers", "transformers", "stable-diffusion-cpp-python", "pillow>=10")
    python = str(Path(session.bin) / "python")
    session.run("python", "-m", "bench.e2e", "--peer-python", python, *session.posargs)


@nox.session
def ggml_fuzz(session: nox.Session) -> None:
    """Random graphs on the ggml backend in child processes, against onnxruntime: `nox -s ggml_fuzz -- --graphs 21000`."""
    _install_sdrt(session, "hypothesis>=6.100", "onnxruntime>=1.17")
    session.run("python", "scripts/ggml_fuzz.py", *(session.posargs or ["--graphs", "21000"]))


@nox.session
def ggml_vulkan(session: nox.Session) -> None:
    """ggml's Vulkan backend on this machine, not in CI: on a CPU-only Linux box, Mesa's lavapipe.

    `nox -s ggml_vulkan [-- DEVICE]` (default Vulkan0). Needs glslc, the Vulkan loader, SPIR-V
    headers and a Vulkan driver (Debian/Ubuntu: apt install glslc libvulkan-dev spirv-headers
    mesa-vulkan-drivers libtinyxml2-dev g++), and Vulkan 1.4 headers: $VULKAN_SDK, else
    scripts/vulkan_headers.py assembles them (from checkouts in $VULKAN_HEADERS_DIR /
    $VULKAN_HPP_DIR, else it clones them) into $SDRT_VK_WORK (default: the session's tmp folder).
    Builds ggml-python with GGML_VULKAN, then runs `sdrt info`, the conformance kit, the real
    exports (scripts/ggml_device_check.py) and tests/plugins/ggml/test_ggml_devices.py on DEVICE.
    """
    import os
    import shutil

    device = session.posargs[0] if session.posargs else "Vulkan0"
    missing = [tool for tool in ("glslc", "g++", "cmake") if not shutil.which(tool)]
    if missing:
        session.error(f"missing {', '.join(missing)}: apt install glslc g++ cmake (see this session's docstring)")
    if os.environ.get("VULKAN_SDK"):
        include = str(Path(os.environ["VULKAN_SDK"]) / "include")
    else:
        work = Path(os.environ.get("SDRT_VK_WORK") or session.create_tmp()) / "vk"
        args = ["--out", str(work)]
        for flag, env in (("--headers", "VULKAN_HEADERS_DIR"), ("--hpp", "VULKAN_HPP_DIR")):
            if os.environ.get(env):
                args += [flag, os.environ[env]]
        session.run("python", str(ROOT / "scripts" / "vulkan_headers.py"), *args)
        include = str(work / "include")
    # llamafile's GEMM for the CPU fallback too; no cache: a CPU-only wheel must never be reused
    session.install("--no-cache-dir", "--force-reinstall", "--no-binary", "ggml-python", "ggml-python>=0.0.45",
                    env={"CMAKE_ARGS": f"-DGGML_VULKAN=ON -DGGML_LLAMAFILE=ON -DVulkan_INCLUDE_DIR={include}"})
    _install_sdrt(session, *TEST_DEPS)
    # ggml lists only dedicated and integrated GPUs unless told which Vulkan devices to use;
    # lavapipe is a CPU-type device, the first (0) on a machine without a GPU
    session.env.setdefault("GGML_VK_VISIBLE_DEVICES", os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"))
    session.run("sdrt", "info")
    out = Path(session.create_tmp())
    session.run("python", str(ROOT / "scripts" / "ggml_device_check.py"), "--device", device, "--limit", "5e-3",
                "--json", str(out / f"exports-{device}.json"))
    session.run("pytest", "-q", "-ra", str(ROOT / "tests" / "plugins" / "ggml" / "test_ggml_devices.py"))
    session.run("sdrt", "conformance", "ggml", "--device", device, "--json", str(out / f"conformance-{device}.json"))
    session.log(f"JSON results in {out}")


@nox.session
def demo(session: nox.Session) -> None:
    """Install the core and the reference backend, then run `sdrt demo`."""
    _install_sdrt(session)
    session.run("sdrt", "demo", *session.posargs)


def _largest(target: Path, top: int = 5) -> list[tuple[str, float]]:
    """The ``top`` largest top-level entries (packages) of an install target, in MB."""
    sizes: dict[str, int] = {}
    for f in target.rglob("*"):
        if f.is_file() and not f.is_symlink():
            head = f.relative_to(target).parts[0]
            sizes[head] = sizes.get(head, 0) + f.stat().st_size
    return [(name, round(b / 2**20, 1)) for name, b in sorted(sizes.items(), key=lambda kv: -kv[1])[:top]]


@nox.session
def size(session: nox.Session) -> None:
    """The install-size promise (not run in CI): core alone, and core + each plugin, in installed MB,
    with the largest packages of each; fails above the 200 MB budget. The README's table comes from it."""
    import json

    session.install("pip")
    results = {}
    for plugin in [None, "plugins/template", *INSTALLABLE_PLUGINS]:
        if plugin is not None and not (ROOT / plugin / "pyproject.toml").exists():
            continue
        label = plugin or "core alone"
        target = Path(session.create_tmp()) / (plugin or "core").replace("/", "_")
        session.run("python", "-m", "pip", "install", "-q", "--target", str(target), CORE,
                    *([str(ROOT / plugin)] if plugin else []), silent=True)
        total = sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
        largest = _largest(target)
        results[label] = {"mb": round(total / 2**20, 1), "largest": largest}
        session.log(f"{label}: {results[label]['mb']} MB; largest: "
                    + ", ".join(f"{name} {mb} MB" for name, mb in largest))
    print(json.dumps(results))
    too_big = {p: r["mb"] for p, r in results.items() if r["mb"] > 200}
    if too_big:
        session.error(f"over the 200 MB install budget: {too_big}")
