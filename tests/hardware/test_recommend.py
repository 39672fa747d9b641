"""The decision rules on their own: built Hardware in, one plugin out."""

from __future__ import annotations

import pytest

from sdrt.hardware import CPU, Accelerator, Hardware, recommend

GIB = 2**30
X86 = CPU(vendor="intel", model="Intel(R) Core(TM) i7-12700", arch="x86_64", features=("avx2",))
ARM = CPU(vendor="arm", model="Neoverse-V2", arch="arm64", features=("neon",))


def nv(name, cc, vram=None):
    return Accelerator(kind="gpu", vendor="nvidia", name=name, compute_capability=cc, integrated=False,
                       vram_bytes=vram)


def amd(name, gfx, integrated=False, vram=None):
    return Accelerator(kind="gpu", vendor="amd", name=name, gfx_target=gfx, integrated=integrated, vram_bytes=vram)


@pytest.mark.parametrize("cc, os, arch, plugin, build", [
    ("7.5", "Linux", "x86_64", "trt", None), ("8.6", "Windows", "x86_64", "trt", None),
    ("8.9", "Linux", "x86_64", "trt", None), ("12.0", "Windows", "x86_64", "trt", None),
    ("7.0", "Linux", "x86_64", "ggml", "cuda"),     # Volta: older than Turing
    ("8.0", "Linux", "x86_64", "ggml", "cuda"),     # A100: not a TensorRT-RTX target
    ("10.0", "Linux", "x86_64", "ggml", "cuda"),    # B200
    ("8.7", "Linux", "arm64", "ggml", "cuda"),      # Jetson Orin: ARM
    ("12.0", "Linux", "arm64", "ggml", "cuda"),     # TensorRT-RTX ships x86-64 only
    (None, "Linux", "x86_64", "ggml", "cuda"),
])
def test_nvidia_rules(cc, os, arch, plugin, build):
    rec = recommend(Hardware(os=os, arch=arch, cpu=X86 if arch == "x86_64" else ARM, devices=[nv("GPU", cc)]))
    assert (rec.plugin, rec.build) == (plugin, build)


@pytest.mark.parametrize("gfx, os, plugin, build", [
    ("gfx1100", "Linux", "migraphx", None), ("gfx1201", "Linux", "migraphx", None),
    ("gfx942", "Linux", "migraphx", None), ("gfx90a", "Linux", "migraphx", None),
    ("gfx950", "Linux", "migraphx", None), ("gfx1151", "Linux", "migraphx", None),
    ("gfx1103", "Linux", "ggml", "vulkan"), ("gfx1030", "Linux", "ggml", "vulkan"),
    ("gfx1102", "Linux", "ggml", "vulkan"),        # RX 7600: AMD supports it on Windows only
    ("gfx803", "Linux", "ggml", "vulkan"), (None, "Linux", "ggml", "vulkan"),
    ("gfx1100", "Windows", "ggml", "vulkan"),
])
def test_amd_rules(gfx, os, plugin, build):
    rec = recommend(Hardware(os=os, arch="x86_64", cpu=X86, devices=[amd("Radeon", gfx)]))
    assert (rec.plugin, rec.build) == (plugin, build)


def test_the_strongest_discrete_gpu_wins_across_vendors_and_the_rest_are_passed_over_with_reasons():
    arc = Accelerator(kind="gpu", vendor="intel", name="Intel Arc A770", integrated=False, vram_bytes=16 * GIB)
    rtx = nv("NVIDIA GeForce RTX 3060", "8.6", 12 * GIB)
    igpu = Accelerator(kind="gpu", vendor="intel", name="Intel UHD Graphics 770", integrated=True)
    rec = recommend(Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[igpu, rtx, arc]))
    assert rec.plugin == "openvino" and rec.devices == [igpu, arc] and rec.uses_cpu
    assert [(d.name, "trt" in why) for d, why in rec.passed_over] == [("NVIDIA GeForce RTX 3060", True)]


def test_two_identical_gpus_are_both_used():
    a, b = nv("RTX 4090", "8.9", 24 * GIB), nv("RTX 4090", "8.9", 24 * GIB)
    rec = recommend(Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[a, b]))
    assert rec.plugin == "trt" and rec.devices == [a, b] and rec.passed_over == []


def test_a_newer_nvidia_gpu_beats_an_older_one_that_needs_another_plugin():
    old, new = nv("GTX 1080 Ti", "6.1", 11 * GIB), nv("RTX 4070", "8.9", 12 * GIB)
    rec = recommend(Hardware(os="Windows", arch="x86_64", cpu=X86, devices=[old, new]))
    assert rec.plugin == "trt" and rec.devices == [new]
    assert "ggml (cuda build)" in rec.passed_over[0][1]


def test_discrete_beats_integrated_even_with_unknown_memory():
    apu = amd("Radeon 780M", "gfx1103", integrated=True, vram=512 * 2**20)
    rtx = nv("RTX 4060 Laptop", "8.9")
    rec = recommend(Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[apu, rtx]))
    assert rec.plugin == "trt"


def test_an_intel_npu_alone_means_openvino():
    npu = Accelerator(kind="npu", vendor="intel", name="Intel Lunar Lake NPU", integrated=True)
    rec = recommend(Hardware(os="Windows", arch="x86_64", cpu=X86, devices=[npu]))
    assert rec.plugin == "openvino" and rec.devices == [npu] and "NPU" in rec.reason


def test_display_only_adapters_do_not_count_as_gpus():
    bmc = Accelerator(kind="gpu", vendor="other", name="ASPEED Graphics Family")
    assert recommend(Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[bmc])).plugin == "openvino"
    rec = recommend(Hardware(os="Linux", arch="arm64", cpu=ARM, devices=[bmc]))
    assert (rec.plugin, rec.build) == ("ggml", "cpu")


def test_intel_mac_without_gpu_data_falls_back_to_ggml_cpu():
    rec = recommend(Hardware(os="Darwin", arch="x86_64", cpu=X86))
    assert (rec.plugin, rec.build) == ("ggml", "cpu")


def test_recommendation_to_dict_is_json_ready():
    import json

    rec = recommend(Hardware(os="Linux", arch="x86_64", cpu=X86, devices=[nv("RTX 4090", "8.9", 24 * GIB)]))
    data = json.loads(json.dumps(rec.to_dict()))
    assert data["plugin"] == "trt" and data["devices"] == ["RTX 4090 (compute 8.9, discrete, 24 GiB)"]
