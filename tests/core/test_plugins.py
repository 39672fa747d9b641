"""Plugin discovery: isolation, API versions, allow/block lists, tracing."""

from __future__ import annotations

import logging

import pytest

import sdrt
from sdrt.backend import Backend, Device
from sdrt.errors import PluginVersionError
from sdrt.plugins import Registry


class _Tiny(Backend):
    name = "tiny"

    def devices(self):
        return [Device("tiny", "CPU")]

    def compile(self, graph, weights, device, **options):  # pragma: no cover
        raise AssertionError


def test_inline_plugin_registers_backend(registry, inline_plugin):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(_Tiny())

    record = inline_plugin(Plugin(), "tiny-plugin")
    assert record.ok and record.backends == ["tiny"]
    assert registry.backend_plugin["tiny"] == "tiny-plugin"


def test_unregister_removes_its_backends(registry):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(_Tiny())

    registry.register_plugin(Plugin(), "tiny-plugin")
    registry.unregister_plugin("tiny-plugin")
    assert "tiny" not in registry.backends and "tiny-plugin" not in registry.plugins


def test_registering_a_non_backend_marks_plugin_broken_and_keeps_host(registry, inline_plugin):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(_Tiny())  # registered first, must be rolled back
            register("not a backend")

    record = inline_plugin(Plugin(), "weird")
    assert record.state == "broken" and "not an sdrt.Backend" in record.error
    assert "tiny" not in registry.backends
    assert "reference" in registry.backends


def test_duplicate_backend_name_is_refused(registry, inline_plugin):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            from sdrt_reference import ReferenceBackend

            register(ReferenceBackend())

    record = inline_plugin(Plugin(), "copycat")
    assert record.state == "broken" and "already registered by plugin 'reference'" in record.error


def test_incompatible_module_api_version_is_refused_with_install_hint(registry):
    import types

    mod = types.ModuleType("sdrt_future")
    mod.SDRT_API_VERSION = (2, 0)
    record = registry.register_plugin(mod, "future", distribution="sdrt-future", version="9.0.0")
    assert record.state == "incompatible"
    assert "sdrt-future 9.0.0" in record.error and "API 2.0" in record.error
    assert 'pip install "sdrt-future==0.1.*"' in record.error


def test_incompatible_backend_api_version_raises_plugin_version_error(registry, inline_plugin):
    class Newer(_Tiny):
        api_version = (1, 99)

    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(Newer())

    record = inline_plugin(Plugin(), "newer")
    assert record.state == "incompatible" and "1.99" in record.error
    err = Registry.version_error(record, (1, 99))
    assert isinstance(err, PluginVersionError)


def test_trace_logs_every_hook_call(registry, caplog):
    class Plugin:
        @sdrt.hookimpl
        def register_backends(self, register):
            register(_Tiny())

    registry.set_trace(True)
    try:
        with caplog.at_level(logging.INFO, logger="sdrt.plugins"):
            registry.register_plugin(Plugin(), "traced")
    finally:
        registry.set_trace(False)
    assert "hook register_backends -> ['traced']" in caplog.text
    assert "hook register_samplers" in caplog.text


def test_samplers_hook_registers_named_functions(registry, inline_plugin):
    def my_schedule(n):
        return list(range(n))

    class Plugin:
        @sdrt.hookimpl
        def register_samplers(self, register):
            register("my_schedule", my_schedule, kind="schedule")

    inline_plugin(Plugin(), "sched")
    assert registry.samplers["my_schedule"] == ("schedule", my_schedule)


@pytest.mark.parametrize("kind", ["sampler", "schedule"])
def test_samplers_hook_rejects_non_callables(registry, inline_plugin, kind):
    class Plugin:
        @sdrt.hookimpl
        def register_samplers(self, register):
            register("bad", 42, kind=kind)

    record = inline_plugin(Plugin(), "badsampler")
    assert record.state == "broken" and "register_samplers" in record.error


def test_failing_plugin_keeps_no_samplers_it_registered_before_failing(registry, inline_plugin):
    class Plugin:
        @sdrt.hookimpl
        def register_samplers(self, register):
            register("half_done", lambda n: n, kind="schedule")
            raise RuntimeError("then it fails")

    record = inline_plugin(Plugin(), "halfway")
    assert record.state == "broken" and "then it fails" in record.error
    assert "half_done" not in registry.samplers and record.samplers == []
