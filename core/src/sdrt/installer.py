"""Install the one plugin that fits this machine, pinned to this core.

``sdrt.install()`` (this module's ``install`` function; and ``sdrt install``) asks ``sdrt.hardware`` which plugin
fits, then installs exactly that distribution with pip (or uv) into the
running interpreter's environment. It is all-or-nothing: pip first resolves
the install with ``--dry-run``; if the real install still fails, every
distribution it added is removed and every one it changed is put back to the
version it had, and the error says what pip said.

When sdrt comes from a source checkout (``core/`` beside ``plugin-<name>/``
folders), the plugin is installed from its folder in that checkout instead of
from a package index (nothing is published for a checkout): editable when the
core runs from there (``pip install -e ./core``), a plain install when the core
was copied from there (``pip install ./core``, found through pip's
``direct_url.json``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlparse
from urllib.request import url2pathname

from . import hardware
from .args import one_or_many
from .errors import InstallError
from .hardware.recommend import strength
from .plugins import compatible_requirement, reset_registry

if TYPE_CHECKING:  # pragma: no cover
    from .hardware import Hardware, Recommendation

log = logging.getLogger("sdrt.install")

PLUGINS = ("trt", "migraphx", "openvino", "coreml", "ggml")
#: ggml builds -> the CMake flag ggml-python's build reads from CMAKE_ARGS
GGML_BUILDS = {"cuda": "-DGGML_CUDA=ON", "vulkan": "-DGGML_VULKAN=ON", "metal": "-DGGML_METAL=ON",
               "hip": "-DGGML_HIP=ON", "cpu": None}
#: every ggml build gets llamafile's float32 GEMM kernels for its CPU backend: 1.3-1.8x faster
#: on the bench models than ggml-python's default build (docs/ggml.md)
GGML_CPU_FLAGS = "-DGGML_LLAMAFILE=ON"
GGML_PACKAGE = "ggml-python"


@dataclass
class InstallPlan:
    """Exactly what ``install`` will run."""

    plugin: str
    distribution: str
    requirement: str
    reason: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    build: str | None = None
    python: str = sys.executable
    tool: str = "pip"
    #: a plugin asked for by name that will run nothing on this machine: why (``hardware.cannot_run_here``)
    caveat: str | None = None

    @property
    def command(self) -> str:
        """The command as a user would type it in their shell."""
        if os.name == "nt":
            prefix = "".join(f'$env:{k}="{v}"; ' for k, v in self.env.items())
            return prefix + subprocess.list2cmdline(self.argv)
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        return prefix + shlex.join(self.argv)


@dataclass
class InstallResult:
    plan: InstallPlan
    added: dict[str, str] = field(default_factory=dict)      # distribution -> version
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)   # distribution -> (before, after)
    dry_run: bool = False


def plan(plugin: str | None = None, *, build: str | None = None, use_uv: bool = False,
         python: str | None = None, extra_args: Sequence[str] = (), hw: Hardware | None = None) -> InstallPlan:
    """Decide what to install and the exact command, without running anything."""
    if plugin is not None and plugin not in PLUGINS:
        raise InstallError(f"unknown plugin {plugin!r}", where="sdrt install --plugin",
                           fix=f"pick one of: {', '.join(PLUGINS)}")
    if build is not None and build not in GGML_BUILDS:
        raise InstallError(f"unknown ggml build {build!r}", where="sdrt install --build",
                           fix=f"pick one of: {', '.join(GGML_BUILDS)}")
    rec: Recommendation | None = None
    if plugin is None or (plugin == "ggml" and build is None):
        hw = hw or hardware.detect()
        rec = hardware.recommend(hw)
    if plugin is None:
        assert rec is not None
        plugin, reason = rec.plugin, rec.reason
        build = build or rec.build
    else:
        reason = "asked for with --plugin"
        hw = hw or hardware.detect()
    if plugin == "ggml":
        if build is None:
            assert rec is not None and hw is not None
            build = rec.build or ggml_build_for(hw)
    elif build is not None:
        raise InstallError(f"--build {build} applies to the ggml plugin only, not {plugin!r}",
                           where="sdrt install", fix="drop --build, or install with --plugin ggml")
    dist = hardware.distribution(plugin)
    folder = source_folder(plugin)
    req = compatible_requirement(dist) if folder is None else str(folder)
    if folder is not None:
        reason += f"; from this source checkout ({folder})"
    target = python or sys.executable
    env: dict[str, str] = {}
    extra = list(one_or_many(extra_args, str))
    if plugin == "ggml":
        flags = (os.environ.get("CMAKE_ARGS", ""), GGML_BUILDS.get(build or ""), GGML_CPU_FLAGS)
        env["CMAKE_ARGS"] = " ".join(filter(None, flags))
        # ggml-python is built from source; a cached CPU wheel would silently drop the flag
        extra += ["--no-binary-package", GGML_PACKAGE] if use_uv else ["--no-binary", GGML_PACKAGE]
    if use_uv:
        uv = shutil.which("uv")
        if uv is None:
            raise InstallError("--uv was given but the uv command is not on PATH", where="sdrt install --uv",
                               fix="install uv (pip install uv), or leave out --uv to use pip")
        argv = [uv, "pip", "install", "--python", target, *(["-e"] if folder and CHECKOUT_EDITABLE else []), req,
                *extra]
    else:
        argv = [*_pip(target), "install", *(["-e"] if folder and CHECKOUT_EDITABLE else []), req, *extra]
    caveat = None if rec is not None and rec.plugin == plugin else \
        hardware.cannot_run_here(plugin, build, hw or hardware.detect())
    return InstallPlan(plugin=plugin, distribution=dist, requirement=req, reason=reason, argv=argv, env=env,
                       build=build if plugin == "ggml" else None, python=target, tool="uv" if use_uv else "pip",
                       caveat=caveat)


def _checkout() -> tuple[Path | None, bool]:
    """(the source checkout sdrt comes from, whether it runs from there): an editable install runs
    from its checkout (this file is its ``core/src/sdrt/installer.py``); a plain ``pip install ./core``
    is a copy, whose source folder pip records in ``direct_url.json`` (PEP 610). (None, False) for a
    wheel from an index, or a folder that is gone."""
    root = Path(__file__).resolve().parents[3]
    if (root / "core" / "pyproject.toml").is_file():
        return root, True
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        record = json.loads(distribution("sdrt").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError, OSError):
        return None, False
    return checkout_of(record)


def checkout_of(record: dict) -> tuple[Path | None, bool]:
    """(the checkout, editable) that a ``direct_url.json`` record of the core points at, or (None, False)."""
    url = str(record.get("url", ""))
    if not url.startswith("file://") or not isinstance(record.get("dir_info"), dict):
        return None, False
    core = Path(url2pathname(urlparse(url).path))
    if core.name == "core" and (core.parent / "core" / "pyproject.toml").is_file():
        return core.parent, bool(record["dir_info"].get("editable"))
    return None, False


#: the source checkout sdrt was installed from (editable or not); None for a wheel from an index
CHECKOUT, CHECKOUT_EDITABLE = _checkout()


def source_folder(plugin: str) -> Path | None:
    """``<checkout>/plugin-<plugin>/`` when sdrt runs from a source checkout that has that folder, else None."""
    if CHECKOUT is None:
        return None
    folder = CHECKOUT / f"plugin-{plugin}"
    return folder if (folder / "pyproject.toml").is_file() else None


def ggml_build_for(hw: Hardware) -> str:
    """The ggml build for the strongest GPU here, when ggml is asked for by name."""
    if hw.os == "Darwin":
        return "metal"
    gpus = sorted((g for g in hw.gpus if g.vendor in ("nvidia", "amd", "intel")), key=strength, reverse=True)
    if not gpus:
        return "cpu"
    return "cuda" if gpus[0].vendor == "nvidia" else "vulkan"


def install(plugin: str | None = None, *, dry_run: bool = False, use_uv: bool = False, build: str | None = None,
            python: str | None = None, extra_args: Sequence[str] = (), hw: Hardware | None = None,
            echo: TextIO | None = None) -> InstallResult:
    """Install the plugin that fits (or ``plugin``), pinned to this core; all or nothing.

    ``dry_run`` only plans. ``echo`` receives pip's output as it runs (the CLI passes stderr).
    Raises ``InstallError`` with pip's own message when it fails; the environment is then as before.
    """
    extra_args = list(one_or_many(extra_args, str))
    p = plan(plugin, build=build, use_uv=use_uv, python=python, extra_args=extra_args, hw=hw)
    result = InstallResult(plan=p, dry_run=dry_run)
    if dry_run:
        return result
    before = snapshot(p.python)
    env = dict(os.environ, **p.env)
    rc, tail = _run(_dry_run_argv(p), env, None)
    if rc != 0:
        raise InstallError(
            f"{p.tool} cannot install {p.requirement}: {_pip_error(tail)}",
            where=f"{p.tool} --dry-run for {p.python}; nothing was changed",
            fix=_fix_for(p, tail),
        )
    log.info("installing %s: %s", p.requirement, p.command)
    rc, tail = _run(p.argv, env, echo)
    after = snapshot(p.python)
    if rc != 0:
        restored = restore(p.python, before, after, _source_args(extra_args))
        state = "the environment is as it was" if restored else \
            "and putting the environment back failed too; run `pip check` and reinstall what it lists"
        raise InstallError(
            f"{p.tool} failed to install {p.requirement}: {_pip_error(tail)}",
            where=f"{p.command}; {state}",
            fix=_fix_for(p, tail),
        )
    result.added = {k: v for k, v in after.items() if k not in before}
    result.changed = {k: (before[k], v) for k, v in after.items() if k in before and before[k] != v}
    reset_registry()
    return result


def snapshot(python: str) -> dict[str, str]:
    """{normalized distribution name: version} installed for ``python``."""
    code = ("import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version "
            "for d in m.distributions() if d.metadata['Name']}))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise InstallError(f"cannot list the distributions installed for {python}: {exc}",
                           where=python, fix="check that this Python interpreter runs") from exc
    return {normalize(k): v for k, v in json.loads(out).items()}


def restore(python: str, before: dict[str, str], after: dict[str, str], extra_args: Sequence[str] = ()) -> bool:
    """Undo an install: remove what was added, put back what changed. True when the env matches ``before``.

    ``extra_args`` (``--find-links``, ``--index-url``...) tell pip where the old versions come from.
    """
    added = sorted(k for k in after if k not in before)
    changed = sorted(k for k in before if k in after and after[k] != before[k])
    removed = sorted(k for k in before if k not in after)
    pip = _pip(python)
    if added:
        _run([*pip, "uninstall", "-y", *added], dict(os.environ), None)
    if changed or removed:
        _run([*pip, "install", "--no-deps", *(f"{k}=={before[k]}" for k in changed + removed), *extra_args],
             dict(os.environ), None)
    ok = snapshot(python) == before
    if not ok:
        log.error("could not restore the environment of %s after a failed install", python)
    return ok


def _pip(python: str) -> list[str]:
    """pip for ``python``: this interpreter's own, or this pip pointed at another (pip >= 22.3)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return [sys.executable, "-m", "pip"]
    return [sys.executable, "-m", "pip", "--python", python]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _source_args(args: Sequence[str]) -> list[str]:
    """The options of ``args`` that say where packages come from (for pip's restore run)."""
    out, it = [], iter(args)
    for a in it:
        if a in ("--find-links", "-f", "--index-url", "-i", "--extra-index-url"):
            out += [a, next(it, "")]
        elif a == "--no-index" or a.startswith(("--find-links=", "--index-url=", "--extra-index-url=")):
            out.append(a)
    return out


def _dry_run_argv(p: InstallPlan) -> list[str]:
    if p.tool == "uv":
        return [*p.argv, "--dry-run"]
    return [*p.argv, "--dry-run", "--quiet"]


#: what a source build without a working C/C++ compiler prints (CMake, setuptools, MSVC, Xcode)
_NO_COMPILER = ("No CMAKE_C_COMPILER could be found", "No CMAKE_CXX_COMPILER could be found",
                "CMAKE_C_COMPILER not set", "CMAKE_CXX_COMPILER not set",
                "Could not find the compiler specified in the environment variable",
                "Could not find compiler set in environment variable",
                "is not a full path to an existing compiler tool", "is not able to compile a simple test program",
                "Microsoft Visual C++ 14.0 or greater is required", "xcrun: error: invalid active developer path",
                "command 'gcc' failed", "command 'cc' failed", "gcc: not found", "cc: not found")


def _run(argv: list[str], env: dict[str, str], echo: TextIO | None) -> tuple[int, list[str]]:
    """Run a command, streaming to ``echo``; return the exit code and its last lines (after any line
    that says a compiler is missing, which a long build log would push out of the tail)."""
    tail: deque[str] = deque(maxlen=60)
    marks: list[str] = []
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
    except OSError as exc:
        return 127, [f"could not run {argv[0]}: {exc}"]
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line.rstrip("\n"))
        if len(marks) < 3 and any(marker in line for marker in _NO_COMPILER):
            marks.append(line.rstrip("\n"))
        if echo is not None:
            echo.write(line)
            echo.flush()
    return proc.wait(), [m for m in marks if m not in tail] + list(tail)


def _pip_error(lines: list[str]) -> str:
    errors = [ln.strip() for ln in lines if ln.strip().startswith("ERROR:") or ln.strip().startswith("error:")]
    chosen = errors or [ln.strip() for ln in lines if ln.strip()][-3:]
    return " | ".join(chosen)[:1500] or "no output"


def _fix_for(p: InstallPlan, lines: list[str]) -> str:
    text = "\n".join(lines)
    if any(marker in text for marker in _NO_COMPILER):
        return ("this build needs a C/C++ compiler (ggml-python builds ggml from source): install one (Debian/Ubuntu: "
                "apt install build-essential; Fedora: dnf install gcc-c++; macOS: xcode-select --install; Windows: "
                "Visual Studio Build Tools with 'Desktop development with C++') and run the same command again: "
                f"{p.command}")
    if "No matching distribution" in text or "not found in the package registry" in text:
        return (f"check that {p.distribution} is published for this platform and Python {sys.version_info[0]}."
                f"{sys.version_info[1]}, or pass --find-links/--index-url pointing at where it is")
    if p.build and p.build != "cpu":
        return (f"ggml-python is compiled with {p.env.get('CMAKE_ARGS')}; install a compiler, CMake and the "
                f"{p.build.upper()} SDK, or install the CPU build: sdrt install --plugin ggml --build cpu")
    return f"read the {p.tool} error above, fix its cause, and run the same command again: {p.command}"
