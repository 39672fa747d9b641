"""One test per machine: captured outputs in, detected hardware and the recommended plugin out."""

from __future__ import annotations

import pytest
from hw_machines import MACHINES, load_machine

from sdrt.hardware import Hardware, Recommendation, recommend

GIB = 2**30


def gpu(hw: Hardware, vendor: str, index: int = 0):
    found = [d for d in hw.gpus if d.vendor == vendor]
    assert len(found) > index, f"no {vendor} GPU #{index} in {[d.describe() for d in hw.devices]}"
    return found[index]


def passed_names(rec: Recommendation) -> list[str]:
    return [d.name for d, _ in rec.passed_over]


def test_there_are_at_least_25_machines():
    assert len([d for d in MACHINES.iterdir() if (d / "platform.json").exists()]) >= 25


# -- NVIDIA ------------------------------------------------------------------

def test_rtx3060_on_linux_with_nvidia_smi_gets_trt(machine):
    hw = machine("rtx3060_linux")
    g = gpu(hw, "nvidia")
    assert (g.vendor_id, g.device_id, g.name) == ("10de", "2503", "NVIDIA GeForce RTX 3060")
    assert (g.architecture, g.compute_capability, g.integrated) == ("Ampere", "8.6", False)
    assert g.vram_bytes == 12288 * 2**20 and g.driver_version == "550.120"
    assert g.driver is None                 # the captured `lspci -nn` line names no driver, so sysfs has no link
    assert g.chip == "GA106" and g.bus_id == "0000:03:00.0"
    rec = recommend(hw)
    assert (rec.plugin, rec.distribution, rec.build) == ("trt", "sdrt-trt", None)
    assert rec.devices == [g] and "TensorRT-RTX" in rec.reason


def test_rtx4090_on_linux_passes_over_the_intel_igpu(machine):
    hw = machine("rtx4090_linux")
    g = gpu(hw, "nvidia")
    assert (g.name, g.compute_capability, g.architecture) == ("NVIDIA GeForce RTX 4090", "8.9", "Ada Lovelace")
    assert g.vram_bytes == 24564 * 2**20
    igpu = gpu(hw, "intel")
    assert igpu.integrated is True and igpu.architecture == "Xe-LP (Gen12)" and igpu.driver == "i915"
    rec = recommend(hw)
    assert rec.plugin == "trt" and rec.devices == [g]
    assert passed_names(rec) == ["Intel UHD Graphics 770"]
    assert "openvino" in rec.passed_over[0][1]


def test_rtx5090_blackwell_compute_12_gets_trt_over_the_raphael_igpu(machine):
    hw = machine("rtx5090_linux")
    g = gpu(hw, "nvidia")
    assert (g.device_id, g.architecture, g.compute_capability) == ("2b85", "Blackwell", "12.0")
    apu = gpu(hw, "amd")
    assert apu.integrated is True and apu.gfx_target == "gfx1036" and apu.vram_bytes == 512 * 2**20
    rec = recommend(hw)
    assert rec.plugin == "trt" and passed_names(rec) == ["AMD Radeon 610M"]


def test_gtx1060_with_driver_470_retries_nvidia_smi_without_compute_cap_and_gets_ggml_cuda(tmp_path):
    hw, runner = load_machine("gtx1060_linux_driver_470", tmp_path)
    asked = [name for name, _ in runner.calls]
    assert asked.count("nvidia-smi") == 1 and asked.count("nvidia-smi-old") == 1
    assert "compute_cap" not in runner.calls[asked.index("nvidia-smi-old")][1][1]
    g = gpu(hw, "nvidia")
    assert (g.architecture, g.compute_capability, g.driver_version) == ("Pascal", "6.1", "470.256.02")
    assert hw.notes == []                      # the expected first failure is not reported
    assert (hw.cpu.model, hw.cpu.cores, hw.cpu.threads) == ("Intel(R) Core(TM) i9-9900K CPU @ 3.60GHz", 8, 16)
    assert "AVX2" in hw.cpu.isa and "AVX-512" not in hw.cpu.isa
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "cuda")
    assert "older than Turing" in rec.reason


def test_nvidia_laptop_with_intel_igpu_and_no_nvidia_driver_yet_still_gets_trt(tmp_path):
    """Dell XPS 16 9640 as captured: the RTX 4060 is on the bus but no NVIDIA driver is bound or installed."""
    hw, runner = load_machine("laptop_rtx4060_with_meteor_lake_igpu_linux", tmp_path)
    g = gpu(hw, "nvidia")
    assert (g.device_id, g.chip, g.compute_capability, g.driver) == ("28a0", "AD107M", "8.9", None)
    assert g.vram_bytes is None and g.source == "sysfs" and hw.notes == []    # no nvidia-smi: not a failure
    assert "nvidia-smi" in [name for name, _ in runner.calls]
    igpu = gpu(hw, "intel")
    assert (igpu.name, igpu.integrated, igpu.driver) == ("Intel Arc Graphics", True, "i915")   # Meteor Lake iGPU
    assert hw.npus[0].driver == "intel_vpu"
    rec = recommend(hw)
    assert rec.plugin == "trt" and rec.devices == [g]
    assert passed_names(rec) == ["Intel Arc Graphics", "Intel Meteor Lake NPU"]


def test_h100_compute_9_is_not_a_tensorrt_rtx_target_so_ggml_cuda(machine):
    hw = machine("h100_server_linux")
    g = gpu(hw, "nvidia")
    assert (g.architecture, g.compute_capability) == ("Hopper", "9.0")
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "cuda")
    assert "9.0" in rec.reason
    assert any("ASPEED" in n for n in passed_names(rec))


def test_container_without_lspci_or_nvidia_smi_finds_both_rtx3090s_in_sysfs(tmp_path):
    hw, runner = load_machine("container_no_lspci_two_rtx3090", tmp_path)
    assert "lspci" not in [name for name, _ in runner.calls]
    cards = [d for d in hw.gpus if d.vendor == "nvidia"]
    assert [d.bus_id for d in cards] == ["0000:05:00.0", "0000:0a:00.0"]     # the HDMI audio functions left out
    for g in cards:
        assert (g.name, g.chip, g.compute_capability, g.driver) == ("NVIDIA GeForce RTX 3090", "GA102", "8.6",
                                                                     "nvidia")
        assert g.vram_bytes is None and g.source == "sysfs"
    # the host's /proc/cpuinfo as pasted in archspec's tests: spaces where the kernel prints tabs
    assert (hw.cpu.model, hw.cpu.cores, hw.cpu.threads) == ("AMD Ryzen 9 9950X 16-Core Processor", 16, 32)
    assert {"avx512f", "avx512_bf16", "avx_vnni"} <= set(hw.cpu.features)
    rec = recommend(hw)
    assert rec.plugin == "trt" and rec.devices == cards and rec.passed_over == []


def test_no_sysfs_pci_falls_back_to_lspci_for_a_gtx1650_mobile(tmp_path):
    hw, runner = load_machine("no_sysfs_pci_lspci_fallback_gtx1650_mobile", tmp_path)
    assert ("lspci", ["lspci", "-nnk"]) in runner.calls
    assert [d.name for d in hw.devices] == ["NVIDIA GeForce GTX 1650 Mobile / Max-Q"]   # audio left out
    g = hw.devices[0]
    assert (g.chip, g.compute_capability, g.driver, g.source) == ("TU117M", "7.5", "nvidia", "lspci")
    assert recommend(hw).plugin == "trt"


def test_broken_nvidia_smi_is_noted_and_detection_goes_on(machine):
    hw = machine("rtx3080_nvidia_smi_broken_linux")
    # nvidia-smi prints the cause and then "NVML library version: ..."; both survive, on one line
    assert hw.notes == ["nvidia-smi: exit status 18: Failed to initialize NVML: Driver/library version mismatch; "
                        "NVML library version: 550.144"]
    g = gpu(hw, "nvidia")
    assert g.name == "NVIDIA GeForce RTX 3080" and g.compute_capability == "8.6"
    assert recommend(hw).plugin == "trt"


def test_wsl2_with_nvidia_uses_the_wsl_nvidia_smi(tmp_path):
    hw, runner = load_machine("wsl2_rtx4070", tmp_path)
    assert hw.wsl is True
    argv = dict(runner.calls)["nvidia-smi"]
    assert argv[0].endswith("usr/lib/wsl/lib/nvidia-smi")
    g = gpu(hw, "nvidia")
    assert (g.name, g.device_id, g.compute_capability) == ("NVIDIA GeForce RTX 4070", "2786", "8.9")
    assert g.vram_bytes == 12282 * 2**20 and g.source == "nvidia-smi"
    rec = recommend(hw)
    assert rec.plugin == "trt" and rec.devices == [g]
    assert any("Basic Render Driver" in n for n in passed_names(rec))


# -- AMD ---------------------------------------------------------------------

def test_rx7900xtx_on_linux_with_rocm_gets_migraphx(machine):
    hw = machine("rx7900xtx_linux_rocm")
    g = gpu(hw, "amd")
    assert g.name == "AMD Radeon RX 7900 XTX"            # rocminfo's marketing name, not the PCI db's list
    assert (g.gfx_target, g.architecture, g.integrated) == ("gfx1100", "RDNA 3", False)
    assert g.vram_bytes == 25753026560 and g.source == "sysfs+kfd+rocminfo"
    rec = recommend(hw)
    assert rec.plugin == "migraphx" and rec.devices == [g]


def test_rx7900xtx_on_windows_gets_ggml_vulkan(machine):
    hw = machine("rx7900xtx_windows")
    g = gpu(hw, "amd")
    assert (g.name, g.device_id, g.gfx_target) == ("AMD Radeon RX 7900 XTX", "744c", "gfx1100")
    assert g.vram_bytes == 25753026560               # from the registry: AdapterRAM stops at 4 GiB
    assert g.driver_version == "32.0.12033.1030"
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "vulkan")
    assert "Windows" in rec.reason and passed_names(rec) == ["AMD Radeon Graphics"]


def test_rx6800_on_linux_gfx1030_gets_ggml_vulkan(machine):
    hw = machine("rx6800_linux_no_rocm")
    g = gpu(hw, "amd")
    assert (g.gfx_target, g.architecture, g.vram_bytes) == ("gfx1030", "RDNA 2", 17163091968)
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "vulkan") and "gfx1030" in rec.reason


def test_radeon_780m_apu_gfx1103_gets_ggml_vulkan_and_its_npu_is_listed(machine):
    hw = machine("radeon_780m_apu_linux")
    g = gpu(hw, "amd")
    assert (g.device_id, g.gfx_target, g.integrated, g.driver) == ("15bf", "gfx1103", True, "amdgpu")
    assert g.bus_id == "0000:c1:00.0" and len(hw.devices) == 2       # 40 PCI functions in the capture
    npu = hw.npus[0]
    # captured on Linux 6.11, before the amdxdna driver was merged: the NPU is there, unbound
    assert (npu.vendor, npu.device_id, npu.driver, npu.bus_id) == ("amd", "1502", None, "0000:c2:00.1")
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "vulkan")
    assert [d for d, _ in rec.passed_over] == [npu]


def test_four_mi300x_in_the_accelerator_class_get_migraphx_on_all(machine):
    hw = machine("mi300x_server_linux_rocm")
    mi = [d for d in hw.gpus if d.vendor == "amd"]
    # a captured rocminfo (4 agents, BDFIDs 9728..34048) and no KFD sysfs: gfx target, name and
    # VRAM all come from rocminfo, matched to the PCI functions by bus id
    assert len(mi) == 4 and all(d.kind == "gpu" and d.gfx_target == "gfx942" for d in mi)
    assert [d.bus_id for d in mi] == ["0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0"]
    assert all(d.name == "AMD Instinct MI300X" and d.vram_bytes == 206141652992 for d in mi)
    assert all(d.source == "sysfs+rocminfo" for d in mi)
    rec = recommend(hw)
    assert rec.plugin == "migraphx" and rec.devices == mi


def test_nvidia_and_amd_in_one_machine_picks_the_stronger_rtx4090(machine):
    hw = machine("nvidia_and_amd_in_one_linux")
    rec = recommend(hw)
    assert rec.plugin == "trt" and rec.devices == [gpu(hw, "nvidia")]
    (passed, why), = rec.passed_over
    assert passed is gpu(hw, "amd") and "ggml (vulkan build)" in why


# -- Intel -------------------------------------------------------------------

def test_intel_arc_a770_gets_openvino(machine):
    hw = machine("arc_a770_linux")
    g = gpu(hw, "intel")
    assert (g.name, g.architecture, g.integrated) == ("Intel Arc A770", "Xe-HPG (Alchemist)", False)
    rec = recommend(hw)
    assert rec.plugin == "openvino" and rec.devices == [g] and rec.uses_cpu


def test_intel_igpu_with_core_ultra_npu_on_linux_gets_openvino_on_both(machine):
    hw = machine("meteor_lake_igpu_and_npu_linux")
    g = gpu(hw, "intel")
    assert g.name == "Intel Graphics"
    assert (g.device_id, g.integrated, g.architecture) == ("7d45", True, "Xe-LPG (Meteor Lake)")
    npu = hw.npus[0]
    assert npu.name == "Intel Meteor Lake NPU"                                  # named by the distro's pci.ids
    assert npu.driver is None    # the capture lists the intel_vpu module but no driver bound to the NPU
    rec = recommend(hw)
    assert rec.plugin == "openvino" and rec.devices == [g, npu] and rec.passed_over == []


def test_intel_arc_igpu_and_ai_boost_npu_on_windows_get_openvino(machine):
    hw = machine("core_ultra_arc_igpu_and_npu_windows")
    g = gpu(hw, "intel")
    assert (g.name, g.integrated) == ("Intel Arc Graphics", True)   # Meteor Lake's iGPU, though named "Arc"
    npu = hw.npus[0]
    assert (npu.name, npu.device_id) == ("Intel AI Boost", "7d1d")
    assert (hw.cpu.model, hw.cpu.cores, hw.cpu.threads) == ("Intel(R) Core(TM) Ultra 7 155H", 16, 22)
    rec = recommend(hw)
    assert rec.plugin == "openvino" and rec.devices == [g, npu]


def test_laptop_rtx3060_with_intel_uhd_on_windows_without_nvidia_smi(machine):
    hw = machine("laptop_rtx3060_with_intel_uhd_windows")
    g = gpu(hw, "nvidia")
    assert (g.chip, g.compute_capability, g.driver_version) == ("GA106M", "8.6", "552.22")
    assert g.vram_bytes is None                       # AdapterRAM saturated at 4 GiB: unknown, not 4 GiB
    rec = recommend(hw)
    assert rec.plugin == "trt" and passed_names(rec) == ["Intel UHD Graphics"]


def test_rtx4090_on_windows_with_nvidia_smi_gets_trt(machine):
    hw = machine("rtx4090_windows")
    g = gpu(hw, "nvidia")
    assert (g.compute_capability, g.driver_version, g.vram_bytes) == ("8.9", "566.36", 24564 * 2**20)
    assert g.source == "cim+nvidia-smi"
    assert recommend(hw).plugin == "trt"


def test_gtx1060_on_windows_from_cim_alone_gets_ggml_cuda(machine):
    hw = machine("gtx1060_windows")
    g = gpu(hw, "nvidia")
    assert (g.chip, g.compute_capability, g.driver_version) == ("GP106", "6.1", "537.13")
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "cuda")


def test_snapdragon_windows_on_arm_gets_ggml_cpu(machine):
    hw = machine("snapdragon_x_elite_windows_arm")
    assert hw.arch == "arm64" and hw.cpu.vendor == "qualcomm"
    assert [d.vendor for d in hw.devices] == ["qualcomm", "qualcomm"]
    rec = recommend(hw)
    assert (rec.plugin, rec.build, rec.uses_cpu) == ("ggml", "cpu", True)
    assert len(rec.passed_over) == 2


# -- CPU only ----------------------------------------------------------------

def test_no_gpu_intel_xeon_with_amx_gets_openvino(machine):
    hw = machine("no_gpu_intel_xeon_server")
    cpu = hw.cpu
    # the capture lists one logical CPU of one socket: 56 cores, 112 threads
    assert (cpu.vendor, cpu.model, cpu.cores, cpu.threads) == ("intel", "Intel(R) Xeon(R) Platinum 8480+", 56, 112)
    assert {"AVX2", "AVX-512", "AMX", "AMX-BF16", "AMX-INT8"} <= set(cpu.isa)
    rec = recommend(hw)
    assert rec.plugin == "openvino" and rec.uses_cpu and rec.devices == []
    assert "AMX" in rec.reason
    assert passed_names(rec) == ["ASPEED Graphics Family (server BMC)"]


def test_no_gpu_amd_epyc_vm_gets_openvino(machine):
    hw = machine("no_gpu_amd_epyc_vm")
    assert hw.devices == []
    assert (hw.cpu.vendor, hw.cpu.model) == ("amd", "AMD EPYC")
    assert "AVX-512" in hw.cpu.isa and "AMX" not in hw.cpu.isa
    rec = recommend(hw)
    assert rec.plugin == "openvino" and rec.uses_cpu


def test_xeon_vm_with_amx_reads_its_last_level_cache_from_sysfs(machine):
    """This build VM's capture: two vCPUs sharing one 480 MiB L3 (``sdrt.cost``: weights beyond it stream)."""
    hw = machine("no_gpu_xeon_amx_vm")
    assert hw.devices == [] and hw.cpu.threads == 2
    assert {"AVX-512-BF16", "AMX-BF16"} <= set(hw.cpu.isa)
    assert hw.cpu.cache_bytes == 491520 * 1024  # index3 once, though both CPUs list it
    assert recommend(hw).plugin == "openvino"


def test_machines_without_a_cache_capture_leave_it_unknown(machine):
    assert machine("no_gpu_amd_epyc_vm").cpu.cache_bytes is None


def test_arm_linux_raspberry_pi_gets_ggml_cpu(machine):
    hw = machine("arm_linux_raspberry_pi_5")
    assert (hw.arch, hw.cpu.model, hw.cpu.threads) == ("arm64", "Raspberry Pi 5 Model B Rev 1.0", 4)
    assert {"NEON", "DOTPROD"} <= set(hw.cpu.isa) and hw.devices == []
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "cpu")


# -- Apple -------------------------------------------------------------------

@pytest.mark.parametrize("name, chip, gpu_cores, memory, cpu_cores", [
    # macOS 11 capture: brand "Apple processor", no hw.memsize/hw.physicalcpu in it
    ("apple_m1_macbook_air", "Apple M1", "7", None, 8),
    ("apple_m3_max_macbook_pro", "Apple M3 Max", "30", 36 * GIB, 14),
])
def test_apple_silicon_gets_coreml_on_gpu_and_neural_engine(machine, name, chip, gpu_cores, memory, cpu_cores):
    hw = machine(name)
    g = gpu(hw, "apple")
    assert (g.architecture, g.integrated, g.vram_bytes) == (chip, True, memory)
    assert g.name == f"{chip} ({gpu_cores}-core GPU)"
    assert (hw.cpu.model, hw.cpu.cores) == (chip, cpu_cores) and "NEON" in hw.cpu.isa
    rec = recommend(hw)
    assert rec.plugin == "coreml" and [d.kind for d in rec.devices] == ["gpu", "npu"]


def test_intel_mac_with_amd_gpu_gets_ggml_metal_on_the_radeon(machine):
    hw = machine("intel_mac_with_radeon_pro_5500m")
    amd = gpu(hw, "amd")
    assert (amd.device_id, amd.gfx_target, amd.integrated, amd.vram_bytes) == ("7340", "gfx1012", False, 4 * GIB)
    assert gpu(hw, "intel").integrated is True
    assert "AVX2" in hw.cpu.isa and hw.cpu.cores == 8
    rec = recommend(hw)
    assert (rec.plugin, rec.build) == ("ggml", "metal") and rec.devices == [amd]
