"""The I/O side: real commands with timeouts, and detection surviving every kind of probe failure."""

from __future__ import annotations

import json
import sys

import pytest
from hw_machines import MACHINES, build_root, load_machine

from sdrt.hardware import collect, detect, recommend
from sdrt.hardware.probe import Context, ProbeFailed, ProbeUnavailable, run_command

PY = sys.executable


def test_run_command_returns_stdout_of_a_real_process():
    assert run_command("python", [PY, "-c", "print('hi')"], 10) == "hi\n"


def test_run_command_times_out():
    with pytest.raises(ProbeFailed, match="timed out after 0.3s"):
        run_command("sleeper", [PY, "-c", "import time; time.sleep(5)"], 0.3)


def test_run_command_reports_exit_status_and_every_line_it_printed():
    with pytest.raises(ProbeFailed, match="exit status 3: x; boom$"):
        run_command("failer", [PY, "-c", "import sys; sys.stderr.write('x\\n\\nboom\\n'); sys.exit(3)"], 10)


def test_a_real_nvidia_smi_failure_keeps_its_cause_line(tmp_path):
    """nvidia-smi prints the cause first and "NVML library version" last (captured in intel/llvm#17614)."""
    text = (MACHINES / "rtx3080_nvidia_smi_broken_linux" / "nvidia-smi.error").read_text()
    script = tmp_path / "fake_nvidia_smi.py"
    script.write_text(f"import sys\nsys.stdout.write({text!r})\nsys.exit(18)\n")
    with pytest.raises(ProbeFailed) as err:
        run_command("nvidia-smi", [PY, str(script)], 10)
    assert str(err.value) == ("exit status 18: Failed to initialize NVML: Driver/library version mismatch; "
                              "NVML library version: 550.144")


def test_run_command_on_a_missing_tool_is_unavailable_not_failed():
    with pytest.raises(ProbeUnavailable):
        run_command("nope", ["sdrt-no-such-tool-here"], 10)


def test_context_notes_failures_and_skips_missing_tools(tmp_path):
    def runner(name, argv, timeout):
        if name == "missing":
            raise ProbeUnavailable("not here")
        if name == "failing":
            raise ProbeFailed("exit status 1")
        raise RuntimeError("a bug in a probe")

    ctx = Context(tmp_path, runner)
    assert ctx.cmd("missing", ["x"]) is None and ctx.notes == []
    assert ctx.cmd("failing", ["x"]) is None and ctx.notes == ["failing: exit status 1"]
    assert ctx.cmd("buggy", ["x"]) is None and "a bug in a probe" in ctx.notes[-1]
    assert ctx.read("no/such/file") is None


def test_every_command_failing_still_detects_the_gpu_from_sysfs(tmp_path):
    folder = MACHINES / "rtx4090_linux"
    root = build_root(folder, json.loads((folder / "platform.json").read_text()), tmp_path)

    def runner(name, argv, timeout):
        raise ProbeFailed("timed out after 10s")

    hw = collect(system="Linux", machine="x86_64", root=root, runner=runner)
    assert [d.name for d in hw.gpus] == ["Intel UHD Graphics 770", "NVIDIA GeForce RTX 4090"]
    assert hw.notes == ["nvidia-smi: timed out after 10s"]
    assert recommend(hw).plugin == "trt"


def test_a_probe_that_crashes_outright_still_returns_hardware(tmp_path):
    def runner(name, argv, timeout):
        raise MemoryError("simulated crash inside a probe")

    hw = collect(system="Darwin", machine="arm64", root=tmp_path, runner=runner)
    assert hw.os == "Darwin" and hw.arch == "arm64" and hw.devices == []
    assert any("simulated crash" in n for n in hw.notes)


def test_an_unreadable_cpuinfo_and_empty_root_give_an_empty_but_valid_machine(tmp_path):
    hw = collect(system="Linux", machine="x86_64", root=tmp_path, runner=lambda *a: (_ for _ in ()).throw(
        ProbeUnavailable("none")))
    assert hw.devices == [] and hw.cpu.model == "unknown"
    assert recommend(hw).plugin == "openvino"          # an x86 CPU with no GPU


def test_an_os_without_probes_reports_its_architecture(tmp_path):
    hw = collect(system="FreeBSD", machine="amd64", root=tmp_path)
    assert (hw.os, hw.arch) == ("FreeBSD", "x86_64") and hw.notes


def test_probes_get_a_timeout(tmp_path):
    hw, runner = load_machine("rx7900xtx_linux_rocm", tmp_path)
    assert [name for name, _ in runner.calls] == ["rocminfo"]      # and CapturedOutputs asserts timeout > 0


def test_detect_on_this_machine_is_cached_and_describes_the_cpu():
    hw = detect()
    assert detect() is hw and detect(refresh=True) is not hw
    assert hw.cpu.threads and hw.cpu.arch in ("x86_64", "arm64")
    assert recommend(hw).plugin in ("trt", "migraphx", "openvino", "coreml", "ggml")
