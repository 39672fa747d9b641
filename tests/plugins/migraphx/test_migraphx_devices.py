"""Device discovery from captured machines: which AMD GPUs MIGraphX offers, which it passes over and why."""

from __future__ import annotations

import pytest
from hw_machines import load_machine

from sdrt.errors import BackendUnavailable
from sdrt_migraphx import devices as devices_mod
from sdrt_migraphx.backend import MIGraphXBackend

GPU_AND_REF = ("gpu", "ref")


def plan(name, tmp_path, targets=GPU_AND_REF, env=None):
    hw, _ = load_machine(name, tmp_path)
    return devices_mod.plan(hw, targets, env or {})


def test_rx7900xtx_is_offered_with_its_gfx_target_then_ref(tmp_path):
    pl = plan("rx7900xtx_linux_rocm", tmp_path)
    assert [d.id for d in pl.devices] == ["gpu:0", "ref"]
    gpu = pl.devices[0]
    assert (gpu.backend, gpu.kind, gpu.name) == ("migraphx", "gpu", "AMD Radeon RX 7900 XTX")
    assert gpu.properties["gfx_target"] == "gfx1100" and gpu.properties["architecture"] == "RDNA 3"
    assert gpu.properties["target"] == "gpu" and gpu.properties["hip_index"] == 0
    assert gpu.memory_bytes == 25753026560
    assert pl.devices[1].kind == "cpu" and pl.devices[1].properties["target"] == "ref"
    assert pl.passed_over == []


def test_four_mi300x_get_hip_indices_in_pci_order(tmp_path):
    pl = plan("mi300x_server_linux_rocm", tmp_path, ("gpu",))
    assert [d.id for d in pl.devices] == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert [d.properties["bus_id"] for d in pl.devices] == ["0000:26:00.0", "0000:46:00.0", "0000:65:00.0",
                                                            "0000:85:00.0"]
    assert {d.properties["gfx_target"] for d in pl.devices} == {"gfx942"}


@pytest.mark.parametrize(("env", "buses"), [
    ({"HIP_VISIBLE_DEVICES": "2,3"}, ["0000:65:00.0", "0000:85:00.0"]),
    ({"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "2"}, ["0000:85:00.0"]),
    ({"HIP_VISIBLE_DEVICES": "GPU-abc"}, ["0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0"]),
    ({"HIP_VISIBLE_DEVICES": "7"}, []),
])
def test_visible_devices_renumber_the_gpus(tmp_path, env, buses):
    pl = plan("mi300x_server_linux_rocm", tmp_path, ("gpu",), env)
    assert [d.properties["bus_id"] for d in pl.devices] == buses
    assert [d.id for d in pl.devices] == [f"gpu:{i}" for i in range(len(buses))]


@pytest.mark.parametrize(("machine", "gfx"), [
    ("radeon_780m_apu_linux", "gfx1103"),
    ("rx6800_linux_no_rocm", "gfx1030"),
    ("nvidia_and_amd_in_one_linux", "gfx1030"),
    ("rtx5090_linux", "gfx1036"),
])
def test_gfx_targets_off_rocms_list_are_passed_over_with_the_plugin_to_use(tmp_path, machine, gfx):
    pl = plan(machine, tmp_path)
    assert [d.id for d in pl.devices] == ["ref"]
    (p,) = pl.passed_over
    assert p.gfx_target == gfx
    assert f"{gfx} is not on ROCm's MIGraphX support list" in p.reason
    assert "sdrt-ggml" in p.instead and "Vulkan" in p.instead and "HIP" in p.instead
    assert gfx in str(p) and p.gpu in str(p)


def test_windows_and_macos_gpus_are_passed_over_because_migraphx_is_linux_only(tmp_path):
    win = plan("rx7900xtx_windows", tmp_path)
    assert [d.id for d in win.devices] == ["ref"]
    assert len(win.passed_over) == 2
    assert all("Linux only, not Windows" in p.reason for p in win.passed_over)
    mac = plan("intel_mac_with_radeon_pro_5500m", tmp_path)
    (p,) = mac.passed_over
    assert "Linux only, not Darwin" in p.reason and "metal" in p.instead


def test_a_migraphx_built_without_gpu_passes_over_a_supported_gpu(tmp_path):
    pl = plan("rx7900xtx_linux_rocm", tmp_path, ("ref",))
    assert [d.id for d in pl.devices] == ["ref"]
    (p,) = pl.passed_over
    assert "built without its gpu target" in p.reason and "ROCm's MIGraphX package" in p.instead


def test_cpu_target_is_listed_between_gpus_and_ref(tmp_path):
    pl = plan("rx7900xtx_linux_rocm", tmp_path, ("gpu", "cpu", "ref"))
    assert [d.id for d in pl.devices] == ["gpu:0", "cpu", "ref"]


def test_no_amd_gpu_means_only_the_cpu_targets(tmp_path):
    hw, _ = load_machine("rtx4090_linux", tmp_path)
    pl = devices_mod.plan(hw, GPU_AND_REF)
    assert [d.id for d in pl.devices] == ["ref"] and pl.passed_over == []
    assert devices_mod.describe_gpus(hw) == "no AMD GPU found on this machine"


def test_describe_gpus_names_supported_and_passed_over_gpus(tmp_path):
    hw, _ = load_machine("rx7900xtx_linux_rocm", tmp_path)
    assert devices_mod.describe_gpus(hw) == "AMD Radeon RX 7900 XTX (gfx1100) is supported"
    hw, _ = load_machine("radeon_780m_apu_linux", tmp_path / "b")
    assert "gfx1103 is not on ROCm's MIGraphX support list" in devices_mod.describe_gpus(hw)


def _missing(hw):
    exc = BackendUnavailable("MIGraphX is not usable here: the Python module migraphx cannot be imported",
                             where="import migraphx", fix="install ROCm's MIGraphX")
    return MIGraphXBackend._unavailable(exc, hw)


def test_without_the_module_a_supported_gpu_gets_the_install_hint(tmp_path):
    hw, _ = load_machine("rx7900xtx_linux_rocm", tmp_path)
    err = _missing(hw)
    assert "AMD Radeon RX 7900 XTX (gfx1100) is supported" in str(err)
    assert err.fix == "install ROCm's MIGraphX"


def test_without_the_module_an_unsupported_gpu_points_to_ggml_first(tmp_path):
    hw, _ = load_machine("radeon_780m_apu_linux", tmp_path)
    err = _missing(hw)
    assert err.fix.startswith("use sdrt-ggml instead (its Vulkan build")
    assert "for MIGraphX's CPU ref target only: install ROCm's MIGraphX" in err.fix


def test_this_machine_without_migraphx_lists_no_device_and_says_why(backend):
    from sdrt_migraphx import module

    try:
        module.load()
    except BackendUnavailable:
        pass
    else:
        pytest.skip("MIGraphX is installed here; this test covers machines without it")
    with pytest.raises(BackendUnavailable) as info:
        backend.devices()
    text = str(info.value)
    assert "the Python module migraphx cannot be imported" in text
    assert "apt install migraphx" in text and "plugin-migraphx/README.md" in text
    assert "\n" not in text


def test_the_module_is_looked_for_where_rocm_installs_it(monkeypatch, tmp_path):
    from sdrt_migraphx import module

    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm-7.2"))
    assert module.rocm_lib_dirs() == [tmp_path / "rocm-7.2" / "lib", module.Path("/opt/rocm/lib")]
    monkeypatch.delenv("ROCM_PATH")
    assert module.rocm_lib_dirs() == [module.Path("/opt/rocm/lib")]
    assert "PyPI's migraphx is an empty placeholder" in module.INSTALL_HINT
