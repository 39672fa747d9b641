"""Entry-point discovery with real installed distributions.

A deliberately broken plugin (its module raises on import) and a plugin built
for a future API are pip-installed into a scratch target directory; a child
process with that directory on its path runs ``sdrt info`` and ``sdrt.load``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent.parent / "fixtures" / "plugins"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    for name in ("sdrt-broken-fixture", "sdrt-future-fixture"):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--target", str(target), str(FIXTURES / name)],
            check=True, capture_output=True, text=True,
        )
    return target


def run_child(plugin_site, code, **env):
    child_env = {**os.environ, "SDRT_LOAD_ENTRY_POINTS": "1", **env}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_site), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=120)


INFO_JSON = "import json, sdrt.cli.info as i; print(json.dumps(i.collect()))"


def plugins_by_name(proc):
    assert proc.returncode == 0, proc.stderr
    return {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}


def test_info_shows_broken_plugin_with_its_error(plugin_site):
    plugins = plugins_by_name(run_child(plugin_site, INFO_JSON))
    broken = plugins["broken"]
    assert broken["state"] == "broken" and broken["distribution"] == "sdrt-broken-fixture"
    assert "RuntimeError" in broken["error"] and "broken on purpose" in broken["error"]
    assert plugins["reference"]["state"] == "loaded"


def test_info_text_lists_reference_and_broken(plugin_site):
    proc = run_child(plugin_site, "from sdrt.cli import main; raise SystemExit(main(['info']))")
    assert proc.returncode == 0, proc.stderr
    assert "reference  [sdrt-reference" in proc.stdout
    assert "broken  [sdrt-broken-fixture 0.1.0]  broken" in proc.stdout
    assert "error: import failed: RuntimeError('sdrt_broken_fixture is broken on purpose')" in proc.stdout


def test_load_on_other_backends_still_works_beside_broken_plugin(plugin_site, tmp_path):
    code = f"""
import numpy as np, onnx, sdrt
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node('Mul', ['a', 'b'], ['c'])], 'g',
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in 'ab'],
    [helper.make_tensor_value_info('c', TensorProto.FLOAT, [3])])
onnx.save(helper.make_model(g), {str(tmp_path / 'mul.onnx')!r})
s = sdrt.load({str(tmp_path / 'mul.onnx')!r})
print(s.run({{'a': np.arange(3, dtype=np.float32), 'b': np.full(3, 2, np.float32)}})['c'].tolist())
"""
    proc = run_child(plugin_site, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0.0, 2.0, 4.0]"


def test_incompatible_installed_plugin_is_refused_naming_package_and_version(plugin_site):
    future = plugins_by_name(run_child(plugin_site, INFO_JSON))["future"]
    assert future["state"] == "incompatible"
    assert "sdrt-future-fixture 9.0.0" in future["error"] and "plugin API 2.0" in future["error"]
    assert 'pip install "sdrt-future-fixture==0.1.*"' in future["error"]


def test_loading_incompatible_backend_by_name_fails_loudly(plugin_site, tmp_path):
    code = "import sdrt\ntry:\n    sdrt.load(b'', backend='future')\nexcept sdrt.SdrtError as e: print(type(e).__name__, e)"
    proc = run_child(plugin_site, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("BackendUnavailable backend 'future' cannot be used: plugin is incompatible")
    assert "sdrt-future-fixture" in proc.stdout


def test_allow_list_loads_only_named_plugins(plugin_site):
    plugins = plugins_by_name(run_child(plugin_site, INFO_JSON, SDRT_PLUGINS="reference"))
    assert plugins["reference"]["state"] == "loaded"
    assert plugins["broken"]["state"] == "disabled" and plugins["future"]["state"] == "disabled"


def test_block_list_disables_named_plugins(plugin_site):
    plugins = plugins_by_name(run_child(plugin_site, INFO_JSON, SDRT_DISABLE_PLUGINS="broken,reference"))
    assert plugins["broken"]["state"] == "disabled" and "SDRT_DISABLE_PLUGINS" in plugins["broken"]["error"]
    assert plugins["reference"]["state"] == "disabled"
    assert plugins["future"]["state"] == "incompatible"


def test_trace_env_logs_hook_calls(plugin_site):
    code = "import logging; logging.basicConfig(level=logging.INFO); from sdrt.plugins import get_registry; get_registry()"
    proc = run_child(plugin_site, code, SDRT_TRACE="1", SDRT_PLUGINS="reference")
    assert "hook register_backends -> ['reference']" in proc.stderr


def test_import_sdrt_stays_light():
    code = "import sys, time; t=time.perf_counter(); import sdrt; dt=time.perf_counter()-t; " \
           "print(sorted(m for m in ('onnx', 'numpy', 'onnxruntime', 'openvino', 'ggml') if m in sys.modules), dt)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    heavy, _ = proc.stdout.split("] ")
    assert heavy == "[", f"import sdrt pulled in heavy modules: {proc.stdout}"
