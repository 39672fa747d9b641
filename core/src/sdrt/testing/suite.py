"""``BackendTest``: onnx's backend test runner, bound to one sdrt backend and device."""

from __future__ import annotations

import json
import re
import unittest
from collections import defaultdict
from typing import Any

from onnx.backend.test.runner import Runner

from ..backend import Backend, Device
from ..errors import InputError, SdrtError
from ..plugins import get_registry
from ..runtime import device_of, select
from . import isolation
from .adapter import device_tag, make_onnx_backend
from .cases import light_cases, node_cases, op_of_case, single_node_ops
from .report import Summary, collect


class _Runner(Runner):
    """onnx's Runner with its cases supplied by us and test names for one device."""

    def __init__(self, onnx_backend: Any, tag: str, cases: list[Any], test_kwargs: dict[str, Any]) -> None:
        # Runner.__init__ would regenerate the node suite in memory; set up its state ourselves.
        self.backend = onnx_backend
        self._parent_module = __name__
        self._include_patterns = set()
        self._exclude_patterns = set()
        self._xfail_patterns = set()
        self._test_kwargs = test_kwargs
        self._test_items = defaultdict(dict)
        self._tag = tag
        for case in cases:
            self._add_model_test(case, "Node" if case.kind == "node" else "Real")

    def _add_test(self, category: str, test_name: str, test_func: Any, report_item: Any,
                  devices: Any = None, **kwargs: Any) -> None:
        super()._add_test(category, test_name, test_func, report_item, devices=(self._tag,), **kwargs)


def _pattern(pattern: str, name: str) -> str:
    """``pattern`` checked to be a regular expression, else an InputError naming the argument ``name``."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InputError(f"the {{@{name}}} pattern {pattern!r} is not a regular expression ({exc})", where=name,
                         fix="fix the pattern (escape ( [ * + ? with a backslash to match them literally)") from None
    return pattern


class BackendTest:
    """Conformance tests for one sdrt backend on one device, with chainable patterns.

    ``include``/``exclude``/``xfail`` take regexes matched against test names
    (``test_conv_with_strides_padding_cpu``); ``tolerance`` sets rtol/atol for
    matching tests.
    """

    def __init__(self, backend: str | Backend, device: str | Device | None = None, *, suites: tuple[str, ...] = ("node", "light"),
                 use_backend_expectations: bool = True, **compile_options: Any) -> None:
        if isinstance(backend, Backend):
            be = backend
            dev = device if isinstance(device, Device) else device_of(be, device)
        else:
            be, dev = select(backend, device, get_registry())
        self.backend, self.device = be, dev
        self.tag = device_tag(dev).upper()
        self.suites = suites
        self.compile_options = compile_options
        if compile_options:  # checked once here (no compile: the backend's own parsing), not failed in every test
            try:
                be.check_options(compile_options, dev)
            except SdrtError as exc:
                raise InputError(f"{{@compile_options}}: {exc.what}", where="compile_options",
                                 fix=exc.fix or f"see the {be.name} backend's options") from exc
        self._include: list[str] = []
        self._exclude: dict[str, str] = {}
        self._xfail: dict[str, str] = {}
        self._tolerances: dict[str, tuple[float, float]] = {}
        if use_backend_expectations:
            expect = getattr(be, "conformance", {}) or {}
            for pattern, reason in dict(expect.get("exclude", {})).items():
                self.exclude(pattern, reason)
            for pattern, reason in dict(expect.get("xfail", {})).items():
                self.xfail(pattern, reason)
            for pattern, (rtol, atol) in dict(expect.get("tolerances", {})).items():
                self.tolerance(pattern, rtol=rtol, atol=atol)

    # -- chainable configuration --------------------------------------
    def include(self, pattern: str) -> BackendTest:
        self._include.append(_pattern(pattern, "include"))
        return self

    def exclude(self, pattern: str, reason: str = "excluded") -> BackendTest:
        self._exclude[_pattern(pattern, "exclude")] = reason
        return self

    def xfail(self, pattern: str, reason: str) -> BackendTest:
        self._xfail[_pattern(pattern, "xfail")] = reason
        return self

    def tolerance(self, pattern: str, *, rtol: float, atol: float) -> BackendTest:
        self._tolerances[_pattern(pattern, "tolerance")] = (rtol, atol)
        return self

    # -- building and running -----------------------------------------
    def cases(self) -> list[Any]:
        cases = []
        if "node" in self.suites:
            cases += node_cases()
        if "light" in self.suites:
            cases += light_cases()
        return cases

    def selected(self, names: set[str] | None = None) -> list[Any]:
        """The cases the include patterns select (or, with ``names``, the cases of those test names)."""
        suffix = "_" + self.tag.lower()
        if names is not None:
            return [c for c in self.cases() if c.name + suffix in names]
        return [c for c in self.cases()
                if not self._include or any(re.search(p, c.name + suffix) for p in self._include)]

    def runner(self, cases: list[Any]) -> _Runner:
        """onnx's runner over ``cases`` with our tolerances, exclusions and xfails applied."""
        kwargs = {}
        for case in cases:
            for pattern, (rtol, atol) in self._tolerances.items():
                if re.search(pattern, f"{case.name}_{self.tag.lower()}"):
                    kwargs[case.name] = {"rtol": rtol, "atol": atol}
        adapter = make_onnx_backend(self.backend, self.device, **self.compile_options)
        runner = _Runner(adapter, self.tag, cases, kwargs)
        for pattern in self._exclude:
            runner.exclude(pattern)
        for pattern in self._xfail:
            runner.xfail(pattern)
        return runner

    def build(self) -> tuple[_Runner, dict[str, str]]:
        """onnx's runner with our patterns applied, and a map of test name -> op."""
        suffix = "_" + self.tag.lower()
        cases = self.selected()
        if self._include and not cases:
            # a filter that selects nothing is a typo far more often than a wish: a run of 0 tests that
            # exits 0 would read as a pass
            raise InputError(f"no test of the {'/'.join(self.suites)} suite matches {{@include}} "
                             f"{' or '.join(map(repr, self._include))} (names read like test_relu{suffix})",
                             where="include", fix="check the pattern against the test names (onnx's node tests: "
                                                  "test_<op>_..., light models: test_<model>...)")
        single = single_node_ops(cases)
        return self.runner(cases), {f"{c.name}{suffix}": op_of_case(c, single) for c in cases}

    @property
    def test_cases(self) -> dict[str, type[unittest.TestCase]]:
        """unittest classes to put in a test module's globals, as with onnx's own runner."""
        return self.build()[0].test_cases

    def run(self, progress: Any = None, *, isolate: bool = False, plugin_modules: tuple[str, ...] = (),
            timeout: float = isolation.TIMEOUT, batch: int = isolation.BATCH) -> Summary:
        """Run every selected test and return a per-op summary.

        ``isolate`` runs the tests in child processes, ``batch`` tests per
        child: a test that kills its process (a C ``abort()`` or segfault in a
        vendor library) or gives no answer for ``timeout`` seconds is recorded
        as ``crashed`` (or ``timeout``), and a new child goes on with the next test. The
        children find the backend by name among the installed plugins and
        ``plugin_modules`` (importable modules to register as plugins), so
        compile options must be JSON values. See ``isolation.py``.
        """
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
            raise InputError(f"{{@timeout=}}{timeout!r} is not a number of seconds above 0", where="timeout",
                             fix="pass {@timeout=}900 (the default), or more for a slow backend")
        if not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
            raise InputError(f"{{@batch=}}{batch!r} is not a number of tests of 1 or more", where="batch",
                             fix="pass {@batch=}1000 (the default), or 1 to run each test in its own process")
        runner, ops = self.build()
        if isolate:
            return isolation.run(self, runner, ops, progress, plugin_modules=plugin_modules, timeout=timeout,
                                 batch=batch)
        import warnings

        with warnings.catch_warnings():  # numpy's "invalid value" on the suites' NaN/inf inputs: noise between the
            warnings.simplefilter("ignore", RuntimeWarning)  # progress lines (an isolated run keeps it in the child)
            return collect(runner.test_suite, ops, self.backend.name, str(self.device), self._xfail, progress)

    # -- the job of an isolated child ---------------------------------
    def job(self, plugin_modules: tuple[str, ...] = ()) -> dict[str, Any]:
        """What a child process needs to rebuild this suite (``from_job``), as JSON values."""
        job = {"backend": self.backend.name, "device": self.device.id, "suites": list(self.suites),
               "exclude": self._exclude, "xfail": self._xfail,
               "tolerances": {p: list(t) for p, t in self._tolerances.items()},
               "compile_options": self.compile_options, "plugin_modules": list(plugin_modules)}
        try:
            json.dumps(job)
        except (TypeError, ValueError) as exc:
            raise SdrtError(f"the compile options {sorted(self.compile_options)} cannot be sent to a child "
                            f"process: {exc}", where="BackendTest.run(isolate=True)",
                            fix="pass compile options that are JSON values (str, numbers, bool, lists, dicts), "
                                "or run with isolate=False") from exc
        return job

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> BackendTest:
        """The suite of ``job()``, in a child: the backend found by name, plugin modules registered first."""
        from ..child import plugin_registry

        reg = plugin_registry(job["plugin_modules"])
        name = job["backend"]
        if name not in reg.backends:
            raise SdrtError(f"backend {name!r} is not registered in the child process "
                            f"(registered: {', '.join(sorted(reg.backends)) or 'none'})",
                            where="sdrt.testing isolated run",
                            fix="install the backend's plugin, or name an importable module that registers it "
                                "with plugin_modules=[...] (sdrt conformance --plugin-module MODULE)")
        be = reg.backends[name]
        suite = cls(be, device_of(be, job["device"]), suites=tuple(job["suites"]), use_backend_expectations=False,
                    **job["compile_options"])
        for pattern, reason in job["exclude"].items():
            suite.exclude(pattern, reason)
        for pattern, reason in job["xfail"].items():
            suite.xfail(pattern, reason)
        for pattern, (rtol, atol) in job["tolerances"].items():
            suite.tolerance(pattern, rtol=rtol, atol=atol)
        return suite
