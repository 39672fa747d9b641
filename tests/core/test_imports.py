"""The import structure of the core: no cycles (imports inside functions count), and layers point down.

Imports under ``if TYPE_CHECKING:`` are left out: they never run. An import of a module
inside a package counts as an edge to that module, not to the package's ``__init__``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sdrt

CORE = Path(sdrt.__file__).parent


def module_imports(root: Path, package: str = "sdrt") -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, top-level and function-level imports alike."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)

    def known(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    edges: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            for t in targets:
                hit = known(t) if t.split(".")[0] == package else None
                if hit is not None and hit != mod:
                    found.add(hit)
        edges[mod] = found
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_core_modules():
    edges = module_imports(CORE)
    assert len(edges) > 40 and "sdrt.graph.graph" in edges and "sdrt.weights.store" in edges
    assert cycles(edges) == []


def test_the_check_sees_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    edges = module_imports(pkg, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.b"} and edges["pkg.sub.b"] == {"pkg.a"} and edges["pkg.c"] == set()
    assert cycles(edges) == [["pkg.a", "pkg.sub.b"]]


#: the one module of a forbidden layer a module may import: the compile template resolves weights with it
ALLOWED = {"sdrt.backend": {"sdrt.weights.resolve"}}


@pytest.mark.parametrize(("module", "forbidden"), [
    ("sdrt.backend", {"sdrt.graph", "sdrt.weights"}),      # the contract speaks to them through objects (and resolve)
    ("sdrt.tensors", {"sdrt"}),                           # the bottom layer
    ("sdrt.runtime", {"sdrt.hardware", "sdrt.installer", "sdrt.cli"}),  # load() never probes hardware
    ("sdrt.hardware", {"sdrt.installer", "sdrt.cli", "sdrt.runtime"}),  # tools point down
    ("sdrt.graph", {"sdrt.backend", "sdrt.runtime", "sdrt.plugins"}),
    ("sdrt.weights", {"sdrt.backend", "sdrt.runtime", "sdrt.plugins"}),
    ("sdrt.pipelines", {"sdrt.serve", "sdrt.cli"}),                # the server sits on the pipelines
    ("sdrt.serve", {"sdrt.cli"}),
])
def test_layers_point_down(module, forbidden):
    edges = module_imports(CORE)
    own = [m for m in edges if m == module or m.startswith(module + ".")]
    bad = sorted(f"{m} -> {t}" for m in own for t in edges[m]
                 if any(t == f or t.startswith(f + ".") for f in forbidden) and not t.startswith(module)
                 and t not in ALLOWED.get(module, ()))
    assert bad == []


# packages only: an install from the folder leaves build metadata (sdrt_x.egg-info) beside them
# the checkout's plugin sources (sdrt itself may be installed from it, not in place: CORE is then in site-packages)
REPO = Path(__file__).resolve().parents[2]
PLUGINS = sorted(p for p in (REPO / "plugins" / "template" / "src").glob("sdrt_*")
                 if (p / "__init__.py").is_file()) + sorted(
    p for p in REPO.glob("plugin-*/src/sdrt_*") if (p / "__init__.py").is_file())


def test_every_plugin_is_checked():
    assert {p.name for p in PLUGINS} >= {"sdrt_reference", "sdrt_openvino", "sdrt_ggml", "sdrt_trt", "sdrt_migraphx",
                                          "sdrt_coreml"}


@pytest.mark.parametrize("src", PLUGINS, ids=[p.name for p in PLUGINS])
def test_no_import_cycle_in_a_plugin(src):
    """Each plugin package on its own: no cycle among its modules, function-level imports counted."""
    edges = module_imports(src, src.name)
    assert len(edges) >= 2
    assert cycles(edges) == []


def test_import_sdrt_stays_light():
    code = ("import sys, sdrt; heavy = [m for m in ('numpy', 'onnx', 'sdrt.graph', 'sdrt.weights', 'sdrt.hardware')"
            " if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
