"""``sdrt selftest``: each backend runs in a child; crashes and hangs are recorded, the others still run."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from sdrt import selftest
from sdrt.cli import main
from sdrt.errors import InputError, SdrtError
from sdrt.selftest import checks, report

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_plugins(monkeypatch):
    """Children find the fixture module through PYTHONPATH (they load no entry points in tests)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    return ["sdrt_selftest_fixture", "sdrt_reference"]


def test_a_backend_that_aborts_is_recorded_and_the_next_backend_still_runs(fixture_plugins):
    rep = selftest.run(["crashy", "reference"], quick=True, only=["accuracy"], plugin_modules=fixture_plugins)
    by_name = {b["backend"]: b for b in rep["backends"]}
    crashy, ref = by_name["crashy"], by_name["reference"]
    assert crashy["status"] == "crashed"
    assert "SIGABRT" in crashy["errors"][0] and "'accuracy'" in crashy["errors"][0]
    assert ref["status"] == "passed"
    assert [c["name"] for c in ref["checks"]] == [f"{m} fp32" for m in checks.MODELS]
    assert all(c["figures"]["rel_err"] < 1e-4 for c in ref["checks"])
    assert rep["passed"] is False
    assert "CRASHED" in selftest.render_text(rep) and "| accuracy |" in selftest.render_markdown(rep)


def test_a_backend_that_hangs_is_stopped_at_the_timeout(fixture_plugins):
    rep = selftest.run(["hangs"], quick=True, only=["accuracy"], timeout=15, plugin_modules=fixture_plugins)
    (hangs,) = rep["backends"]
    assert hangs["status"] == "timeout"
    assert "no answer after 15 s during check 'accuracy'" in hangs["errors"][0]


def test_features_on_the_reference_backend(fixture_plugins):
    rep = selftest.run(["reference"], quick=True, only=["features"], plugin_modules=fixture_plugins)
    checks_by_name = {c["name"]: c for c in rep["backends"][0]["checks"]}
    uw = checks_by_name["update_weights"]
    assert uw["status"] == "passed" and uw["figures"]["rel_err"] < 1e-4 and uw["figures"]["tensors"] > 5
    assert checks_by_name["compile cache"]["figures"]["cold_s"] > 0
    assert checks_by_name["ahead-of-time build"]["status"] == "unsupported"


def test_a_backend_that_is_not_installed_is_refused_naming_the_installed_ones(fixture_plugins):
    # it was a report of nothing tested, ending "no backend could be tested: install a plugin"
    with pytest.raises(InputError, match=r"no backend 'nonesuch' is installed here\. Where: backends\. "
                                         r"What to do: pass one of: .*crashy.*reference"):
        selftest.run(["nonesuch"], quick=True, plugin_modules=fixture_plugins)


def test_one_backend_or_group_given_as_a_string_is_one_not_its_letters(fixture_plugins):
    """``selftest.run("openvino")`` was read as the backends 'o', 'p', 'e', 'n', ... ("no backend 'o' or 'p' ...")
    and ``only="accuracy"`` as the groups 'a', 'c', ...: one string is one name, as the CLI's flags give it."""
    with pytest.raises(InputError, match=r"no backend 'nonesuch' is installed here"):
        selftest.run("nonesuch", quick=True, plugin_modules=fixture_plugins)
    with pytest.raises(SdrtError, match=r"unknown check groups \['nope'\]"):
        selftest.run(quick=True, only="nope")
    with pytest.raises(SdrtError, match="no module named 'nonesuch_module'"):
        selftest.run(quick=True, plugin_modules="nonesuch_module")


def test_report_has_schema_machine_versions_and_nothing_personal(fixture_plugins, tmp_path):
    rep = selftest.run(["reference"], quick=True, only=["accuracy"], plugin_modules=fixture_plugins)
    json_path, md_path = report.write(rep, tmp_path / "r.json")
    text = json_path.read_text()
    data = json.loads(text)
    assert data["schema"] == report.SCHEMA and data["machine"]["os"] and data["sdrt"]
    assert data["backends"][0]["runtime"].get("onnx")  # the reference plugin's runtime
    host = socket.gethostname()
    for personal in {str(Path.home()), str(tmp_path), os.getcwd(), *(x for x in [host] if len(host) >= 3)}:
        assert personal not in text and personal not in md_path.read_text()


def test_scrub_replaces_home_host_and_absolute_paths():
    home = str(Path.home())
    out = report.scrub({"e": [f"failed reading {home}/models/x.onnx on {socket.gethostname()}",
                              "C:\\Users\\ann\\sd\\unet.onnx", "ratio 1/2 is fine"]})
    assert out["e"][0].startswith("failed reading ~/models/x.onnx")
    assert out["e"][1] == "<path>/unet.onnx" and out["e"][2] == "ratio 1/2 is fine"


def test_rel_err_and_precisions():
    a = np.ones((2, 3), np.float32)
    assert checks.rel_err(a, a) == 0
    assert checks.rel_err(a * 1.01, a) == pytest.approx(0.01, rel=1e-3)
    assert checks.rel_err(a[:1], a) == float("inf") and checks.rel_err(a * np.nan, a) == float("inf")

    class Half:
        precisions = {"fp32": {"precision": "f32"}, "fp16": {}}
        default_precision = "fp16"

    assert checks.precisions(Half()) == {"fp32": {"precision": "f32"}, "fp16": {}}
    assert checks.precisions(object()) == {"fp32": {}}


@pytest.mark.parametrize("argv, message", [
    (["selftest", "--report", "r.txt"], "the report file must end in .json"),
    (["selftest", "--report", "/nonexistent-dir/r.json"], "it is not a writable folder"),
    (["selftest", "--only", "nonsense", "--backend", "nonesuch"], "unknown check groups ['nonsense']"),
    # a missing plugin module was a child's traceback advising SDRT_DISABLE_PLUGINS, without the flag
    (["selftest", "--plugin-module", "nonexistent_mod_xyz"],
     "--plugin-module: no module named 'nonexistent_mod_xyz' can be imported here. Where: --plugin-module."),
    (["selftest", "--plugin-module", "no_such_pkg.sub"], "no module named 'no_such_pkg.sub'"),
    (["selftest", "--timeout", "0"], "--timeout must be above 0 seconds, got 0"),
    (["selftest", "--timeout", "-1"], "--timeout must be above 0 seconds, got -1"),
    (["selftest", "--repeats", "3"], "--repeats sets the timed runs of --calibrate, and does nothing without it"),
    (["selftest", "--passes", "1"], "--passes sets the passes of --calibrate, and does nothing without it"),
    (["selftest", "--calibrate", "--passes", "0"], "--passes must be at least 1, got 0"),
    (["selftest", "--calibrate", "--device", "NOPE"], "nothing calibrated: no installed backend has device 'NOPE'. "
                                                      "Where: --device."),
    (["selftest", "--calibrate", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    # an unknown backend or device ended in "no backend could be tested: install a plugin"
    (["selftest", "--backend", "nope", "--only", "features"], "no backend 'nope' is installed here. Where: --backend."),
    (["selftest", "--calibrate", "--backend", "nope"], "no backend 'nope' is installed here. Where: --backend."),
    (["selftest", "--plugin-module", "sdrt_reference", "--backend", "reference", "--device", "nope", "--only", "features"],
     "no device 'nope' among those of the backends tested. Where: --device. What to do: pass one of: CPU"),
])
def test_cli_errors_are_one_line_before_any_work(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_end_to_end_generates_with_the_demo_model(fixture_plugins):
    rep = selftest.run(["reference"], quick=True, only=["end-to-end"], plugin_modules=fixture_plugins)
    (check,) = rep["backends"][0]["checks"]
    assert check["status"] == "passed" and check["figures"]["shape"] == [64, 64, 3]


def test_openvino_passes_at_its_own_default_precision(monkeypatch, tmp_path):
    """Run as a user runs it, without the suite's SDRT_PRECISION=fp32: bf16 on a CPU with AVX-512-BF16 or AMX.
    Conformance holds float32's tolerances, so it runs at fp32; accuracy and the demo image at the default."""
    pytest.importorskip("openvino", reason="the openvino package is not installed (pip install openvino)")
    monkeypatch.delenv("SDRT_PRECISION", raising=False)
    monkeypatch.setenv("SDRT_CACHE_DIR", str(tmp_path / "cache"))
    rep = selftest.run(["openvino"], device="CPU", quick=True, only=["conformance", "accuracy", "end-to-end"],
                       plugin_modules=["sdrt_openvino", "sdrt_reference"])
    (backend,) = rep["backends"]
    bad = [(c["group"], c["name"], c.get("message")) for c in backend["checks"] if c["status"] != "passed"]
    assert backend["checks"] and not bad, bad


@pytest.mark.parametrize("argv", [["selftest", "--quick"], ["conformance", "reference", "-k", "Relu"]])
def test_a_plugin_module_that_raises_on_import_is_one_line(tmp_path, monkeypatch, capsys, argv):
    """--plugin-module naming a module whose import raises: one line quoting its error, in the flag's words (it was a
    child's traceback under "listing backends failed" advising SDRT_DISABLE_PLUGINS, and a traceback of sdrt
    conformance itself)."""
    import sys

    from sdrt.cli import main

    (tmp_path / "raises_on_import.py").write_text('raise RuntimeError("boom at import")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main([*argv, "--plugin-module", "raises_on_import"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: --plugin-module: importing 'raises_on_import' failed: RuntimeError: boom at import. "
                       "Where: --plugin-module. What to do: run `python -c \"import raises_on_import\"` to see the "
                       "traceback, and fix the module."), err
    assert "Traceback" not in "\n".join(err)
    sys.modules.pop("raises_on_import", None)


def test_a_calibration_report_says_what_it_fitted_not_failed():
    """The report the lent H200 wrote (`selftest --calibrate --device CUDA0 --report`) ran no checks: its Markdown
    says it calibrated, names the device's peak and, per backend/kind/precision, the cases measured and the fitted
    FLOPs efficiencies (it used to say `result: **FAILED**` and nothing else)."""
    report = json.loads((Path(__file__).resolve().parents[2] / "docs" / "plan-gpu" / "h200-calibration-report.json").read_text())
    md = selftest.render_markdown(report)
    assert "**calibrated**" in md and "FAILED" not in md
    assert "H200" in md and "fp32" in md.split("peak", 1)[1]
    (row,) = [line for line in md.splitlines() if line.startswith("| ggml/gpu/fp32 |")]
    cases = len(report["calibration_measurements"]["ggml/gpu"])
    assert f"| {cases} |" in row and "matmul 0.38" in row
    # a term the fit found free (stored as 100) reads "free", a small efficiency keeps its figures, not "0.00"
    assert "softmax free" in row and "100.00" not in row and "elementwise 0.00012" in row
