"""The pure parsers and architecture rules, fed captured output."""

from __future__ import annotations

import pytest
from hw_machines import CPUS, MACHINES

from sdrt.hardware import families, parse
from sdrt.hardware.assemble import _win_driver_version, with_vendor


def test_lspci_nnk_keeps_domains_classes_names_and_drivers():
    text = (MACHINES / "wsl2_rtx4070" / "lspci-nnk.txt").read_text()
    recs = parse.parse_lspci_nn(text)
    assert [(r.slot, hex(r.class_code), r.vendor_id, r.device_id) for r in recs] == [
        ("1a1c:00:00.0", "0x30200", "1414", "008e"), ("9c3e:00:00.0", "0x88000", "1af4", "105a")]
    assert recs[1].driver == "virtio-pci" and recs[0].driver is None
    recs = parse.parse_lspci_nn((MACHINES / "rtx4090_linux" / "lspci-nnk.txt").read_text())
    gpu = [r for r in recs if r.slot == "0000:01:00.0"][0]
    assert (gpu.name, gpu.driver) == ("NVIDIA Corporation AD102 [GeForce RTX 4090]", "nvidia")


def test_lspci_vmd_domains_of_five_hex_digits_keep_their_own_drivers():
    """Behind an Intel VMD controller lspci prints 5-digit domains (real Latitude 7450 capture)."""
    recs = parse.parse_lspci_nn((MACHINES / "meteor_lake_igpu_and_npu_linux" / "lspci-nnk.txt").read_text())
    by_slot = {r.slot: r for r in recs}
    assert by_slot["10000:e0:06.2"].driver == "pcieport" and by_slot["10000:e1:00.0"].driver == "nvme"
    assert by_slot["0000:71:00.0"].driver == "iwlwifi"          # not overwritten by the VMD bridge after it
    assert by_slot["0000:00:0b.0"].driver is None               # "Kernel modules: intel_vpu" is not a binding
    assert len(recs) == 28


def test_lspci_lines_of_an_unreadable_function_are_not_given_to_the_one_before():
    text = ("01:00.0 VGA compatible controller [0300]: NVIDIA Corporation Device [10de:2684] (rev a1)\n"
            "\tKernel driver in use: nvidia\n"
            "02:00.0 VGA compatible controller: Intel Corporation DG2 [Arc A770] (rev 08)\n"   # no -nn ids
            "\tKernel driver in use: i915\n")
    (rec,) = parse.parse_lspci_nn(text)
    assert (rec.slot, rec.driver) == ("0000:01:00.0", "nvidia")


@pytest.mark.parametrize("name, slot, device, driver", [
    ("no_sysfs_pci_lspci_fallback_gtx1650_mobile", "0000:01:00.0", "1f91", "nvidia"),   # sub-lines: 8 spaces
    ("rtx3080_nvidia_smi_broken_linux", "0000:3e:00.0", "2206", "nvidia"),  # pasted: sub-lines lost their tab
    ("container_no_lspci_two_rtx3090", "0000:0a:00.0", "2204", "nvidia"),   # `grep -A3` output with a "--"
])
def test_lspci_nnk_real_captures_keep_the_driver_of_each_function(name, slot, device, driver):
    recs = parse.parse_lspci_nn((MACHINES / name / "lspci-nnk.txt").read_text())
    rec = [r for r in recs if r.slot == slot][0]
    assert (rec.class_code, rec.vendor_id, rec.device_id, rec.driver) == (0x030000, "10de", device, driver)
    audio = [r for r in recs if r.class_code == 0x040300]
    assert audio and all(r.driver == "snd_hda_intel" for r in audio)


def test_nvidia_smi_csv_with_a_comma_in_the_name_and_missing_values():
    rows = parse.parse_nvidia_smi(
        "0, 00000000:01:00.0, 0x268410DE, 24564, 560.35.03, 8.9, NVIDIA GeForce RTX 4090\n"
        "1, 00000000:02:00.0, 0x20B010DE, [N/A], [N/A], 8.0, NVIDIA A100, SXM4 40GB\n"
        "No devices were found\n")
    assert rows[0] == {"index": 0, "name": "NVIDIA GeForce RTX 4090", "device_id": "2684", "vendor_id": "10de",
                       "bus_id": "0000:01:00.0", "vram_bytes": 24564 * 2**20, "driver_version": "560.35.03",
                       "compute_capability": "8.9"}
    assert rows[1]["name"] == "NVIDIA A100, SXM4 40GB" and "vram_bytes" not in rows[1]
    assert "driver_version" not in rows[1] and len(rows) == 2


def test_rocminfo_keeps_gpu_agents_only():
    agents = parse.parse_rocminfo((MACHINES / "rx7900xtx_linux_rocm" / "rocminfo.txt").read_text())
    assert agents == [{"gfx_target": "gfx1100", "name": "Radeon RX 7900 XTX", "device_id": "744c", "bdf": 768,
                       "vram_bytes": 25149440 * 1024}]
    assert parse.parse_rocminfo("ROCk module is NOT loaded, possibly no GPU devices\n") == []


@pytest.mark.parametrize("version, gfx", [(110000, "gfx1100"), (90010, "gfx90a"), (90402, "gfx942"),
                                          (110501, "gfx1151"), (120001, "gfx1201"), (100300, "gfx1030"),
                                          (90500, "gfx950"), (0, None)])
def test_kfd_gfx_target_version(version, gfx):
    assert parse.gfx_from_target_version(version) == gfx


def test_bdf_to_slot():
    assert parse.bdf_to_slot(768) == "0000:03:00.0"
    assert parse.bdf_to_slot(0xC5 << 8 | 0 << 3 | 1) == "0000:c5:00.1"


def test_cim_json_one_object_array_or_garbage():
    one = (MACHINES / "gtx1060_windows" / "cim-video.json").read_text()
    assert parse.parse_cim_json(one)[0]["PNPDeviceID"].startswith("PCI\\VEN_10DE&DEV_1C03&")
    assert len(parse.parse_cim_json((MACHINES / "rtx4090_windows" / "cim-video.json").read_text())) == 2
    assert parse.parse_cim_json("") == [] and parse.parse_cim_json("not json") == []
    assert parse.parse_cim_json('"just a string"') == []


@pytest.mark.parametrize("pnp, ids", [
    (r"PCI\VEN_10DE&DEV_2684&SUBSYS_889D1043&REV_A1\4&2B8260C3&0&0008", ("pci", "10de", "2684")),
    (r"ACPI\VEN_QCOM&DEV_0C36&SUBSYS_CLS08180&REV_0000\0", ("acpi", "qcom", "0c36")),
    (r"ROOT\BasicDisplay\0000", None), ("", None), (None, None)])
def test_pnp_device_id(pnp, ids):
    assert parse.parse_pnp_device_id(pnp) == ids


def test_system_profiler_and_sizes():
    items = parse.parse_system_profiler((MACHINES / "intel_mac_with_radeon_pro_5500m" /
                                         "system_profiler.json").read_text())
    assert [i["sppci_model"] for i in items] == ["Intel UHD Graphics 630", "AMD Radeon Pro 5500M"]
    assert parse.parse_system_profiler("{}") == [] and parse.parse_system_profiler("<plist/>") == []
    assert parse.parse_size("4 GB") == 4 * 2**30 and parse.parse_size("1536 MB") == 1536 * 2**20
    assert parse.parse_size("Dynamic, Max: 48 GB") == 48 * 2**30 and parse.parse_size(None) is None


def test_cpuinfo_x86_counts_cores_per_socket():
    cpu = parse.parse_cpuinfo((CPUS / "amd-epyc-9654.txt").read_text(), "x86_64")
    assert (cpu.vendor, cpu.cores, cpu.threads) == ("amd", 96, 96)           # SMT off: siblings == cpu cores
    assert "avx512_bf16" in cpu.features and "amx_tile" not in cpu.features


def test_cpuinfo_arm_server_names_the_core_from_its_part_number():
    cpu = parse.parse_cpuinfo((CPUS / "aws-graviton2-neoverse-n1.txt").read_text(), "arm64")
    assert (cpu.vendor, cpu.model, cpu.cores, cpu.threads) == ("arm", "Neoverse-N1", 1, 1)
    assert cpu.isa == ["NEON", "DOTPROD"]


def test_sysctl_apple_and_intel():
    values = parse.parse_sysctl((MACHINES / "apple_m3_max_macbook_pro" / "sysctl.txt").read_text())
    cpu = parse.cpu_from_sysctl(values, "arm64")
    assert (cpu.vendor, cpu.model, cpu.cores) == ("apple", "Apple M3 Max", 14)
    assert cpu.isa == ["NEON", "DOTPROD", "I8MM", "BF16"]
    # macOS 11 on an M1: a generic brand, no hw.physicalcpu, and no hw.optional.arm.FEAT_* keys yet
    values = parse.parse_sysctl((MACHINES / "apple_m1_macbook_air" / "sysctl.txt").read_text())
    cpu = parse.cpu_from_sysctl(values, "arm64")
    assert (cpu.vendor, cpu.model, cpu.cores, cpu.threads, cpu.isa) == ("apple", "Apple processor", 8, 8, ["NEON"])
    values = parse.parse_sysctl((MACHINES / "intel_mac_with_radeon_pro_5500m" / "sysctl.txt").read_text())
    assert {"avx", "avx2", "fma", "f16c"} <= set(parse.cpu_from_sysctl(values, "x86_64").features)


def test_last_level_cache_counts_each_instance_once():
    """The highest level's data or unified caches, each ``shared_cpu_list`` once: two CCDs' L3s add up, the CPUs
    sharing one do not; instruction caches and unreadable sizes are left out."""
    def row(level, kind, size, shared):
        return {"level": level, "type": kind, "size": size, "shared_cpu_list": shared}

    ccds = [row("1", "Data", "32K", "0,16"), row("1", "Instruction", "32K", "0,16"), row("2", "Unified", "1024K", "0,16"),
            row("3", "Unified", "32768K", "0-7,16-23"), row("3", "Unified", "32768K", "0-7,16-23"),
            row("3", "Unified", "32768K", "8-15,24-31")]
    assert parse.last_level_cache(ccds) == 64 * 2**20
    assert parse.last_level_cache([row("2", "Unified", "4M", "0-3"), row("1", "Instruction", "64K", "0")]) == 4 * 2**20
    assert parse.last_level_cache([row("3", "Unified", "lots", "0")]) is None and parse.last_level_cache([]) is None
    assert parse.parse_cache_size("491520K") == 491520 * 1024 and parse.parse_cache_size("") is None


def test_cache_size_from_sysctl_and_cim():
    assert parse.cpu_from_sysctl({"hw.l3cachesize": "12582912", "hw.l2cachesize": "262144"}, "x86_64").cache_bytes \
        == 12 * 2**20
    # Apple silicon (the M3 Max capture): the performance cluster's L2, not the efficiency cores' 4 MiB
    values = parse.parse_sysctl((MACHINES / "apple_m3_max_macbook_pro" / "sysctl.txt").read_text())
    assert parse.cpu_from_sysctl(values, "arm64").cache_bytes == 16 * 2**20
    assert parse.cpu_from_sysctl({}, "arm64").cache_bytes is None
    two = [{"Name": "Xeon", "Manufacturer": "GenuineIntel", "NumberOfCores": 8, "L3CacheSize": 16896}] * 2
    assert parse.cpu_from_cim(two, "x86_64").cache_bytes == 2 * 16896 * 1024
    assert parse.cpu_from_cim([{"Name": "Xeon"}], "x86_64").cache_bytes is None


def test_system_pci_ids_database_lookup():
    text = (MACHINES / "meteor_lake_igpu_and_npu_linux" / "root/usr/share/hwdata/pci.ids").read_text()
    assert parse.parse_pci_ids(text, {("8086", "7d1d"), ("8086", "7d45"), ("8086", "ffff")}) == {
        ("8086", "7d1d"): "Meteor Lake NPU", ("8086", "7d45"): "Meteor Lake-P [Intel Graphics]"}


@pytest.mark.parametrize("chip, arch, cc", [
    ("GA100", "Ampere", "8.0"), ("GA102GL", "Ampere", "8.6"), ("AD107M", "Ada Lovelace", "8.9"),
    ("GB202", "Blackwell", "12.0"), ("GB100", "Blackwell", "10.0"), ("GH100", "Hopper", "9.0"),
    ("TU116", "Turing", "7.5"), ("GV100", "Volta", "7.0"), ("GP100", "Pascal", "6.0"), ("GP106", "Pascal", "6.1"),
    ("GM204", "Maxwell", "5.2"), ("GK110B", "Kepler", "3.5"), ("XYZ", None, None)])
def test_nvidia_architecture_from_chip(chip, arch, cc):
    assert families.nvidia_arch(chip) == (arch, cc)


def test_nvidia_smi_capability_wins_over_the_chip_rule():
    assert families.nvidia_arch("GB10B", "12.1") == ("Blackwell", "12.1")
    assert families.nvidia_arch(None, "8.9") == ("Ada Lovelace", "8.9")


@pytest.mark.parametrize("chip, gfx", [("Navi 31", "gfx1100"), ("Navi 48", "gfx1201"), ("Navi 21", "gfx1030"),
                                       ("Aqua Vanjaram", "gfx942"), ("Aldebaran/MI200", "gfx90a"),
                                       ("Ellesmere", "gfx803"), ("Mystery", None)])
def test_amd_gfx_from_chip(chip, gfx):
    assert families.amd_gfx(chip) == gfx


@pytest.mark.parametrize("chip, market, discrete", [
    ("DG2", "Arc A770", True), ("Battlemage G21", "Arc B580", True),
    ("Meteor Lake-P", "Intel Arc Graphics", False),           # torchruntime marks it discrete; it is the iGPU
    (None, "Core Ultra 200V Series Processors Arc Graphics 130V/140V GPU", False),
    ("Panther Lake", "Arc B390", False), ("Raptor Lake-S GT1", "UHD Graphics 770", False),
    (None, "Intel(R) Arc(TM) A750 Graphics", True), (None, "Mystery", None)])
def test_intel_discrete_or_integrated(chip, market, discrete):
    assert families.intel_is_discrete(chip, market) is discrete


def test_windows_nvidia_driver_version_is_shown_as_nvidia_numbers_it():
    assert _win_driver_version("nvidia", "32.0.15.6636") == "566.36"
    assert _win_driver_version("nvidia", "31.0.15.3713") == "537.13"
    assert _win_driver_version("amd", "32.0.12033.1030") == "32.0.12033.1030"


def test_vendor_prefix():
    assert with_vendor("nvidia", "GeForce RTX 4090") == "NVIDIA GeForce RTX 4090"
    assert with_vendor("nvidia", "NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert with_vendor("amd", "Radeon RX 7900 XTX") == "AMD Radeon RX 7900 XTX"
    assert with_vendor("other", "ASPEED Graphics Family") == "ASPEED Graphics Family"
