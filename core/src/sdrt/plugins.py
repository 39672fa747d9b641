"""Plugin discovery: entry points in the group ``sdrt``, loaded one at a time.

Unlike pluggy's own ``load_setuptools_entrypoints``, each entry point is
imported and asked to register on its own, inside its own ``try``: a plugin
that raises is recorded as broken, with its error, and the host goes on.

Environment:

- ``SDRT_PLUGINS=a,b``: load only these entry points (allow-list).
- ``SDRT_DISABLE_PLUGINS=a,b``: never load these (block-list).
- ``SDRT_TRACE=1``: log every hook call (logger ``sdrt.plugins``, level INFO).
- ``SDRT_LOAD_ENTRY_POINTS=0``: load no entry points at all (the test suite
  sets this and registers the plugins it wants explicitly).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import __version__, hookspecs
from .backend import API_VERSION, Backend, check_api_version
from .errors import PluginError, PluginVersionError

log = logging.getLogger("sdrt.plugins")

GROUP = "sdrt"


@dataclass
class PluginRecord:
    """What sdrt knows about one plugin: where it came from and whether it works."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    #: "loaded", "broken", "incompatible", "disabled"
    state: str = "loaded"
    error: str | None = None
    backends: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state == "loaded"


def _split_env(name: str) -> set[str]:
    return {p.strip() for p in os.environ.get(name, "").split(",") if p.strip()}


def compatible_requirement(distribution: str) -> str:
    """The pip requirement for a plugin distribution that fits this core.

    Plugins are released in step with the core: plugin ``X.Y.*`` is built for
    core ``X.Y``.
    """
    major_minor = ".".join(__version__.split(".")[:2])
    return f"{distribution}=={major_minor}.*"


class Registry:
    """The plugin manager plus what each plugin registered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginRecord] = {}
        self.backends: dict[str, Backend] = {}
        self.backend_plugin: dict[str, str] = {}
        self.samplers: dict[str, tuple[str, Any]] = {}
        self._undo_trace: Any = None
        if os.environ.get("SDRT_TRACE", "") not in ("", "0"):
            self.set_trace(True)

    # -- tracing -------------------------------------------------------
    def set_trace(self, enabled: bool) -> None:
        """Log every hook call and its result (``sdrt.plugins`` at INFO)."""
        if enabled and self._undo_trace is None:

            def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
                log.info("hook %s -> %s", hook_name, [i.plugin_name for i in impls])

            def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
                exc = outcome.exception
                log.info("hook %s done%s", hook_name, f" with error: {exc!r}" if exc else "")

            self._undo_trace = self.pm.add_hookcall_monitoring(before, after)
        elif not enabled and self._undo_trace is not None:
            self._undo_trace()
            self._undo_trace = None

    # -- loading -------------------------------------------------------
    def load_builtins(self) -> None:
        """Register the core's own plugins (``BUILTIN_PLUGINS``); they use the hooks a plugin uses."""
        for name, module in BUILTIN_PLUGINS.items():
            self.register_plugin(importlib.import_module(module), name, distribution="sdrt", version=__version__)

    def load_entry_points(self) -> None:
        allow, block = _split_env("SDRT_PLUGINS"), _split_env("SDRT_DISABLE_PLUGINS")
        found = sorted(md.entry_points(group=GROUP), key=lambda e: e.name)
        for var, names in (("SDRT_PLUGINS", allow), ("SDRT_DISABLE_PLUGINS", block)):
            unknown = sorted(set(names) - {ep.name for ep in found})
            if unknown:  # a typo allowed nothing or blocked nothing, without a word
                log.warning("%s names %s, which no installed plugin is called (installed: %s); names are "
                            "case-sensitive", var, ", ".join(map(repr, unknown)),
                            ", ".join(sorted({ep.name for ep in found})) or "none")
        for ep in found:
            dist = getattr(ep, "dist", None)
            record = PluginRecord(
                name=ep.name,
                module=ep.value,
                distribution=dist.metadata["Name"] if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
            if ep.name in self.plugins:
                log.warning("plugin %s declared twice; keeping the first", ep.name)
                continue
            self.plugins[ep.name] = record
            if (allow and ep.name not in allow) or ep.name in block:
                record.state = "disabled"
                record.error = "SDRT_DISABLE_PLUGINS blocks it" if ep.name in block else "not in SDRT_PLUGINS"
                log.info("plugin %s disabled: %s", ep.name, record.error)
                continue
            try:
                module = ep.load()
            except BaseException as exc:  # noqa: BLE001 - a plugin must never break the host
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self._mark_broken(record, f"import failed: {exc!r}", exc)
                continue
            self._register(module, record)

    def register_plugin(self, plugin: Any, name: str | None = None, *, distribution: str | None = None,
                        version: str | None = None) -> PluginRecord:
        """Register a plugin object or module directly (tests, built-ins, embedders)."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        record = PluginRecord(name=name, module=getattr(plugin, "__name__", type(plugin).__name__),
                              distribution=distribution, version=version)
        self.plugins[name] = record
        self._register(plugin, record)
        return record

    def unregister_plugin(self, name: str) -> None:
        record = self.plugins.pop(name, None)
        if record is None:
            return
        self._forget(record)
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)

    def _forget(self, record: PluginRecord) -> None:
        """Remove every backend and sampler that ``record``'s plugin registered."""
        for backend in record.backends:
            self.backends.pop(backend, None)
            self.backend_plugin.pop(backend, None)
        for sampler in record.samplers:
            self.samplers.pop(sampler, None)
        record.backends.clear()
        record.samplers.clear()

    def _mark_broken(self, record: PluginRecord, message: str, exc: BaseException | None = None) -> None:
        record.state = "broken"
        record.error = message
        if exc is not None:
            log.warning("plugin %s is broken: %s\n%s", record.name, message,
                        "".join(traceback.format_exception(exc)).rstrip())
        else:
            log.warning("plugin %s is broken: %s", record.name, message)

    def _register(self, plugin: Any, record: PluginRecord) -> None:
        declared = getattr(plugin, "SDRT_API_VERSION", None)
        if declared is not None and not self._version_ok(tuple(declared), record):
            return
        try:
            self.pm.register(plugin, name=record.name)
        except Exception as exc:  # noqa: BLE001
            self._mark_broken(record, f"registration failed: {exc!r}", exc)
            return
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        try:
            self.pm.subset_hook_caller("register_backends", remove_plugins=others)(
                register=lambda backend: self._add_backend(backend, record)
            )
            self.pm.subset_hook_caller("register_samplers", remove_plugins=others)(
                register=lambda name, fn, kind="sampler": self._add_sampler(name, fn, kind, record)
            )
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._forget(record)  # a failed plugin keeps nothing it registered before failing
            if isinstance(exc, PluginVersionError):
                record.state, record.error = "incompatible", str(exc)
            else:
                self._mark_broken(record, f"registration failed: {exc!r}", exc)
            self.pm.unregister(plugin)

    def _version_ok(self, declared: tuple[int, ...], record: PluginRecord) -> bool:
        if len(declared) == 2 and check_api_version((int(declared[0]), int(declared[1]))):
            return True
        err = self.version_error(record, declared)
        record.state, record.error = "incompatible", str(err)
        log.warning("%s", err)
        return False

    @staticmethod
    def version_error(record: PluginRecord, declared: tuple[int, ...]) -> PluginVersionError:
        dist = record.distribution or record.module
        have = f" {record.version}" if record.version else ""
        return PluginVersionError(
            f"plugin {record.name!r} ({dist}{have}) was built for sdrt plugin API "
            f"{'.'.join(map(str, declared))}, but this core (sdrt {__version__}) speaks "
            f"{API_VERSION[0]}.{API_VERSION[1]}",
            where=f"entry point {record.name} = {record.module}",
            fix=f"pip install \"{compatible_requirement(dist)}\" (or upgrade sdrt if the plugin is newer)",
        )

    def _add_backend(self, backend: Any, record: PluginRecord) -> None:
        if not isinstance(backend, Backend):
            raise PluginError(
                f"register_backends got {type(backend).__name__}, not an sdrt.Backend instance",
                where=f"plugin {record.name}",
                fix="register an instance of a subclass of sdrt.Backend",
            )
        declared = tuple(getattr(backend, "api_version", API_VERSION))
        if not check_api_version((int(declared[0]), int(declared[1]))):
            raise self.version_error(record, declared)
        if backend.name in self.backends:
            raise PluginError(
                f"backend name {backend.name!r} is already registered by plugin "
                f"{self.backend_plugin[backend.name]!r}",
                where=f"plugin {record.name}",
                fix="uninstall one of the two plugins, or block one with SDRT_DISABLE_PLUGINS",
            )
        self.backends[backend.name] = backend
        self.backend_plugin[backend.name] = record.name
        record.backends.append(backend.name)

    def _add_sampler(self, name: str, fn: Any, kind: str, record: PluginRecord) -> None:
        if kind not in ("sampler", "schedule") or not callable(fn):
            raise PluginError(
                f"register_samplers got {name!r} of kind {kind!r}",
                where=f"plugin {record.name}",
                fix="call register(name, function, kind='sampler' or 'schedule')",
            )
        self.samplers[name] = (kind, fn)
        record.samplers.append(name)


_registry: Registry | None = None
_lock = threading.Lock()


#: plugins that ship with the core, registered before any entry point through the same hooks
#: (as llm's default plugins are): {plugin name: module}
BUILTIN_PLUGINS = {"samplers": "sdrt.samplers.builtin"}


def get_registry() -> Registry:
    """The process-wide registry: the built-in plugins, then the entry points, on first use."""
    global _registry
    with _lock:
        if _registry is None:
            reg = Registry()
            reg.load_builtins()
            if os.environ.get("SDRT_LOAD_ENTRY_POINTS", "1") != "0":
                reg.load_entry_points()
            _registry = reg
        return _registry


def reset_registry() -> None:
    """Forget every plugin; the next ``get_registry`` loads them again."""
    global _registry
    with _lock:
        _registry = None
