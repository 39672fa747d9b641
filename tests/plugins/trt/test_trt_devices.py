"""Which NVIDIA GPUs TensorRT-RTX can run on: captured machines through ``sdrt.hardware`` and the device plan."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sdrt.errors import SdrtError
from sdrt_trt.targets import KNOWN_TARGETS, CudaDevice, check_target, plan_devices, target_names

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hardware"))
from hw_machines import load_machine  # noqa: E402

TARGETS = list(KNOWN_TARGETS)


def _cuda_like(hw, ordinal: int = 0, cc: tuple[int, int] | None = None) -> CudaDevice:  # type: ignore[no-untyped-def]
    """The CUDA runtime's view of the machine's first NVIDIA GPU (what cudaGetDeviceProperties reports)."""
    gpu = next(g for g in hw.gpus if g.vendor == "nvidia")
    major, minor = (int(x) for x in gpu.compute_capability.split(".")) if cc is None else cc
    return CudaDevice(ordinal, gpu.name, (major, minor), gpu.vram_bytes, gpu.bus_id)


def test_installed_library_builds_for_the_targets_measured_here() -> None:
    assert target_names() == TARGETS


def test_rtx3060_is_a_device_with_its_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("rtx3060_linux", tmp_path)
    plan = plan_devices(hw, [_cuda_like(hw)], None, TARGETS)
    assert plan.unusable == []
    (dev,) = plan.devices
    assert dev.id == "cuda:0" and dev.kind == "gpu" and "3060" in dev.name
    assert dev.properties["target"] == "sm86" and dev.properties["compute_capability"] == "8.6"
    assert dev.properties["bf16"] is True


def test_rtx5090_is_sm120(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("rtx5090_linux", tmp_path)
    (dev,) = plan_devices(hw, [_cuda_like(hw)], None, TARGETS).devices
    assert dev.properties["target"] == "sm120"


def test_gtx1060_is_listed_with_the_reason_and_the_plugin_to_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("gtx1060_linux_driver_470", tmp_path)
    plan = plan_devices(hw, [_cuda_like(hw)], None, TARGETS)
    assert plan.devices == []
    (line,) = plan.unusable
    assert "1060" in line and "compute capability 6.1" in line
    assert "TensorRT-RTX builds for 7.5, 8.0, 8.6, 8.9, 12.0, 12.1" in line
    assert "use sdrt-ggml (its CUDA build)" in line


def test_h100_is_not_an_rtx_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("h100_server_linux", tmp_path)
    plan = plan_devices(hw, [_cuda_like(hw)], None, TARGETS)
    assert plan.devices == [] and "compute capability 9.0" in plan.unusable[0]


def test_supported_gpu_without_a_cuda_driver_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("rtx4090_linux", tmp_path)
    plan = plan_devices(hw, [], "cudaGetDeviceCount: cudaErrorInsufficientDriver", TARGETS)
    assert plan.devices == []
    assert "cudaErrorInsufficientDriver" in plan.unusable[0] and "driver 580" in plan.unusable[0]


def test_two_gpus_are_matched_by_bus_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("nvidia_and_amd_in_one_linux", tmp_path)
    plan = plan_devices(hw, [_cuda_like(hw, ordinal=0)], None, TARGETS)
    assert len(plan.devices) + len(plan.unusable) == 1, "the AMD GPU is not TensorRT-RTX's to report"


def test_no_nvidia_gpu_no_devices_and_nothing_to_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hw, _ = load_machine("no_gpu_amd_epyc_vm", tmp_path)
    plan = plan_devices(hw, [], "cudaGetDeviceCount: cudaErrorInsufficientDriver", TARGETS)
    assert plan.devices == [] and plan.unusable == []


def test_this_machine(backend) -> None:  # type: ignore[no-untyped-def]
    """Here: no NVIDIA GPU; the backend answers with no devices, and does not crash."""
    from sdrt import hardware

    nvidia = [g for g in hardware.detect().gpus if g.vendor == "nvidia"]
    if nvidia:
        pytest.skip("this machine has an NVIDIA GPU; the GPU tests cover it")
    assert backend.devices() == [] and backend.unusable() == []


@pytest.mark.parametrize(("given", "want"), [("sm86", "sm86"), ("SM_86", "sm86"), ("8.6", "sm86"), ("120", "sm120")])
def test_target_names_are_normalized(given: str, want: str) -> None:
    assert check_target(given, TARGETS) == want


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(SdrtError, match="unknown TensorRT-RTX target 'sm90'.*sm75, sm80, sm86, sm89, sm120, sm121"):
        check_target("sm90", TARGETS)
