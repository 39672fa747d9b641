"""Write sdrt's device library, core/src/sdrt/data/devices.json, from the compact table below.

Each row holds what the vendor publishes for one product (memory, bandwidth, the FP32 shader
rate or the matrix-engine rate); the other precisions are DERIVED with the architecture's ratio,
and every entry says so in ``derived``. Ratios (dense, no sparsity):

- NVIDIA Turing GeForce: tensor FP16 (FP32 accumulate) = 4 x FP32 shader, INT8 = 16 x (Turing whitepaper);
- NVIDIA Ampere/Ada/Blackwell GeForce: tensor FP16/BF16 (FP32 accumulate) = 2 x FP32 shader,
  FP8 = 4 x (Ada, Blackwell), INT8 = 8 x (GA102, AD102, GB202 whitepapers' GeForce tables);
- AMD RDNA2: packed FP16 = 2 x FP32, INT8 (dot4) = 4 x; RDNA3: WMMA FP16 = 2 x the dual-issue FP32
  figure; RDNA4: WMMA FP16 = 4 x, INT8/FP8 = 8 x (AMD's RDNA 4 product pages);
- Intel Xe-HPG/Xe2 with XMX: FP16 = 8 x FP32 shader, INT8 = 16 x; Xe-LPG without XMX: FP16 = 2 x, INT8 (DP4a) = 4 x;
- Apple M-series GPU: FP16 = FP32 rate (ALU count x 2 x clock), no separate matrix engine counted;
- NPUs: the vendor's INT8 TOPS; FP16 = INT8 / 2.

Figures come from the pages named in ``source``; this script was written without web access, so
each entry carries ``checked``: true only where the figure was confirmed against a stored copy of a
public page during development (the page is named), false where it is the vendor figure as recalled.
Run: python scripts/make_device_library.py
"""

from __future__ import annotations

import json
from pathlib import Path

T = 1e12
GB = 1e9
GIB = 2**30

NV_SRC = {
    "turing": "NVIDIA Turing GPU Architecture whitepaper (Appendix A, GeForce RTX 20 specs); nvidia.com GeForce RTX 20 series spec pages",
    "ampere": "NVIDIA Ampere GA102 GPU Architecture whitepaper (GeForce RTX 30 tables); nvidia.com GeForce RTX 30 series spec pages",
    "ada": "NVIDIA Ada GPU Architecture whitepaper (GeForce RTX 40 tables); nvidia.com GeForce RTX 40 series spec pages",
    "blackwell": "NVIDIA RTX Blackwell GPU Architecture whitepaper; nvidia.com GeForce RTX 50 series spec pages",
}
NV_RATIO = {"turing": {"fp16": 4, "int8": 16}, "ampere": {"fp16": 2, "bf16": 2, "int8": 8},
            "ada": {"fp16": 2, "bf16": 2, "fp8": 4, "int8": 8}, "blackwell": {"fp16": 2, "bf16": 2, "fp8": 4, "int8": 8}}

# (name, architecture, memory GiB, bandwidth GB/s, FP32 shader TFLOP/s)
NVIDIA = [
    ("RTX 2060 6GB", "turing", 6, 336, 6.45), ("RTX 2070 8GB", "turing", 8, 448, 7.46),
    ("RTX 2080 8GB", "turing", 8, 448, 10.07), ("RTX 2080 Ti 11GB", "turing", 11, 616, 13.45),
    ("RTX 3050 8GB", "ampere", 8, 224, 9.10), ("RTX 3060 12GB", "ampere", 12, 360, 12.74),
    ("RTX 3060 Ti 8GB", "ampere", 8, 448, 16.20), ("RTX 3070 8GB", "ampere", 8, 448, 20.31),
    ("RTX 3080 10GB", "ampere", 10, 760, 29.77), ("RTX 3090 24GB", "ampere", 24, 936, 35.58),
    ("RTX 4060 8GB", "ada", 8, 272, 15.11), ("RTX 4060 Ti 16GB", "ada", 16, 288, 22.06),
    ("RTX 4070 12GB", "ada", 12, 504, 29.15), ("RTX 4070 Ti SUPER 16GB", "ada", 16, 672, 44.10),
    ("RTX 4080 16GB", "ada", 16, 717, 48.74), ("RTX 4090 24GB", "ada", 24, 1008, 82.58),
    ("RTX 5060 Ti 16GB", "blackwell", 16, 448, 23.70), ("RTX 5070 12GB", "blackwell", 12, 672, 30.87),
    ("RTX 5070 Ti 16GB", "blackwell", 16, 896, 43.94), ("RTX 5080 16GB", "blackwell", 16, 960, 56.28),
    ("RTX 5090 32GB", "blackwell", 32, 1792, 104.8),
]
CHECKED = {"RTX 3060 12GB": "https://huggingface.co/hardware/rtx-3060 (12 GB, 12.74 TFLOPS)",
           "RTX 4090 24GB": "https://waredb.com/processor/nvidia-geforce-rtx-4090 (1008 GB/s, FP32 82.58, FP16 tensor 165.15 dense)",
           "RTX 3080 10GB": "https://huggingface.co/hardware/rtx-3080 (30.6 TFLOPS)",
           "RTX 3060 Ti 8GB": "https://huggingface.co/hardware/rtx-3060-ti (8 GB, 16.2 TFLOPS)",
           "RTX 2060 6GB": "gist deviceQuery + bandwidth table (336 GB/s, 1920 cores at 1.71 GHz)"}

# NVIDIA data-centre GPUs (the lent GPU machines; a check of the model on a GPU runs there): (name, architecture,
# memory GiB as nvidia-smi reports it, bandwidth GB/s, {precision: dense TFLOP/s as NVIDIA's datasheet lists it}); fp32 is
# the non-tensor rate, the others the tensor cores' dense (not sparse) rates
DATACENTER = [
    ("H100 SXM 80GB", "hopper", 79.6, 3350, {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9,
                                             "int8": 1978.9}),
    ("H100 PCIe 80GB", "hopper", 79.6, 2000, {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0,
                                              "int8": 1513.0}),
    ("H200 SXM 141GB", "hopper", 140.4, 4800, {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9,
                                               "int8": 1978.9}),
]
DC_SRC = {"H100 SXM 80GB": "nvidia.com H100 Tensor Core GPU datasheet (SXM column; dense = half the sparse figures)",
          "H100 PCIe 80GB": "nvidia.com H100 Tensor Core GPU datasheet (PCIe column; dense = half the sparse figures)",
          "H200 SXM 141GB": "nvidia.com H200 Tensor Core GPU datasheet (SXM column; dense = half the sparse figures); "
                            "memory: nvidia-smi on a lent H200 read 143771 MiB"}

# AMD discrete: (name, arch, GiB, GB/s, FP32 TFLOP/s as AMD lists it (RDNA3/4: dual-issue figure))
AMD = [
    ("RX 6600 8GB", "rdna2", 8, 224, 8.93), ("RX 6700 XT 12GB", "rdna2", 12, 384, 13.21),
    ("RX 6800 XT 16GB", "rdna2", 16, 512, 20.74), ("RX 6900 XT 16GB", "rdna2", 16, 512, 23.04),
    ("RX 7600 8GB", "rdna3", 8, 288, 21.75), ("RX 7800 XT 16GB", "rdna3", 16, 624, 37.32),
    ("RX 7900 XT 20GB", "rdna3", 20, 800, 51.48), ("RX 7900 XTX 24GB", "rdna3", 24, 960, 61.39),
    ("RX 9060 XT 16GB", "rdna4", 16, 322, 25.63), ("RX 9070 16GB", "rdna4", 16, 644, 36.13),
    ("RX 9070 XT 16GB", "rdna4", 16, 645, 48.66),
]
AMD_RATIO = {"rdna2": {"fp16": 2, "int8": 4}, "rdna3": {"fp16": 2, "bf16": 2, "int8": 2},
             "rdna4": {"fp16": 4, "bf16": 4, "fp8": 8, "int8": 8}}
AMD_SRC = "amd.com Radeon RX product specifications pages (peak single precision, memory, bandwidth); AMD RDNA 3 / RDNA 4 architecture pages for the matrix rates"

# integrated GPUs and NPUs: (name, vendor, kind, shared memory GiB (a typical laptop), GB/s, {precision: TFLOP/s}, derivation, source)
INTEGRATED = [
    ("Radeon 780M (Ryzen 7 8840U)", "amd", "igpu", 16, 120, {"fp32": 8.29, "fp16": 16.6, "int8": 16.6},
     "12 CU x 64 lanes x 2 (FMA) x 2 (dual issue) x 2.7 GHz; LPDDR5X-7500 x 128 bit",
     "amd.com Ryzen 7 8840U specifications"),
    ("Radeon 890M (Ryzen AI 9 HX 370)", "amd", "igpu", 32, 120, {"fp32": 11.88, "fp16": 23.8, "int8": 23.8},
     "16 CU x 64 x 2 x 2 x 2.9 GHz; LPDDR5X-7500 x 128 bit", "amd.com Ryzen AI 9 HX 370 specifications"),
    ("Radeon 8060S (Ryzen AI Max+ 395)", "amd", "igpu", 96, 256, {"fp32": 29.7, "fp16": 59.4, "int8": 59.4},
     "40 CU x 64 x 2 x 2 x 2.9 GHz; LPDDR5X-8000 x 256 bit; up to 96 GB of 128 GB assignable to the GPU",
     "amd.com Ryzen AI Max+ 395 specifications"),
    ("XDNA 2 NPU (Ryzen AI 300)", "amd", "npu", 32, 120, {"int8": 50.0, "bf16": 25.0},
     "AMD's 50 TOPS INT8; bf16 = INT8 / 2", "amd.com Ryzen AI 300 series specifications"),
    ("Arc A380 6GB", "intel", "gpu", 6, 186, {"fp32": 4.2, "fp16": 33.6, "bf16": 33.6, "int8": 67.2},
     "1024 ALUs x 2 x 2.05 GHz; XMX FP16 = 8 x, INT8 = 16 x", "ark.intel.com Intel Arc A380 Graphics"),
    ("Arc A750 8GB", "intel", "gpu", 8, 512, {"fp32": 17.2, "fp16": 137.6, "bf16": 137.6, "int8": 275.2},
     "3584 ALUs x 2 x 2.4 GHz; XMX FP16 = 8 x, INT8 = 16 x", "ark.intel.com Intel Arc A750 Graphics"),
    ("Arc A770 16GB", "intel", "gpu", 16, 560, {"fp32": 19.7, "fp16": 157.3, "bf16": 157.3, "int8": 314.6},
     "4096 ALUs x 2 x 2.4 GHz; XMX FP16 = 8 x, INT8 = 16 x", "ark.intel.com Intel Arc A770 Graphics"),
    ("Arc B570 10GB", "intel", "gpu", 10, 380, {"fp32": 12.7, "fp16": 101.5, "bf16": 101.5, "int8": 203.0},
     "Intel's 203 INT8 TOPS; FP16 = INT8 / 2; FP32 = FP16 / 8", "intel.com Intel Arc B570 specifications"),
    ("Arc B580 12GB", "intel", "gpu", 12, 456, {"fp32": 14.6, "fp16": 116.5, "bf16": 116.5, "int8": 233.0},
     "Intel's 233 INT8 TOPS; FP16 = INT8 / 2; FP32 = FP16 / 8", "intel.com Intel Arc B580 specifications"),
    ("Arc iGPU (Core Ultra 7 155H)", "intel", "igpu", 16, 120, {"fp32": 4.6, "fp16": 9.2, "int8": 18.4},
     "8 Xe-LPG cores (1024 ALUs) x 2 x 2.25 GHz, no XMX: FP16 = 2 x, DP4a INT8 = 4 x; LPDDR5X-7467 x 128 bit",
     "ark.intel.com Intel Core Ultra 7 155H"),
    ("Arc 140V iGPU (Core Ultra 7 258V)", "intel", "igpu", 32, 136, {"fp32": 4.0, "fp16": 32.0, "bf16": 32.0, "int8": 64.0},
     "Intel's 64 GPU INT8 TOPS (Xe2 XMX); FP16 = INT8 / 2; FP32 = FP16 / 8; LPDDR5X-8533 x 128 bit",
     "ark.intel.com Intel Core Ultra 7 258V"),
    ("NPU (Core Ultra 7 155H)", "intel", "npu", 16, 120, {"int8": 11.0, "fp16": 5.5},
     "Intel's 11 NPU INT8 TOPS; FP16 = INT8 / 2", "ark.intel.com Intel Core Ultra 7 155H"),
    ("NPU 4 (Core Ultra 7 258V)", "intel", "npu", 32, 136, {"int8": 48.0, "fp16": 24.0},
     "Intel's 48 NPU INT8 TOPS; FP16 = INT8 / 2", "ark.intel.com Intel Core Ultra 7 258V"),
]

# Apple: (name, GPU cores, GPU clock GHz, memory GiB, GB/s, Neural Engine TOPS)
APPLE = [
    ("Apple M1 (8-core GPU) 16GB", 8, 1.278, 16, 68.25, 11.0), ("Apple M1 Max (32-core GPU) 64GB", 32, 1.296, 64, 400, 11.0),
    ("Apple M2 (10-core GPU) 24GB", 10, 1.398, 24, 100, 15.8), ("Apple M2 Ultra (76-core GPU) 192GB", 76, 1.398, 192, 800, 31.6),
    ("Apple M3 (10-core GPU) 24GB", 10, 1.38, 24, 100, 18.0), ("Apple M3 Max (40-core GPU) 128GB", 40, 1.38, 128, 400, 18.0),
    ("Apple M4 (10-core GPU) 32GB", 10, 1.47, 32, 120, 38.0), ("Apple M4 Pro (20-core GPU) 64GB", 20, 1.47, 64, 273, 38.0),
    ("Apple M4 Max (40-core GPU) 128GB", 40, 1.47, 128, 546, 38.0),
]

# CPUs: (name, vendor, cores, base-all-core GHz, ISA, FP32 FLOPs per cycle per core, GiB, GB/s, source)
CPUS = [
    ("Ryzen 9 7950X", "amd", 16, 5.0, ["avx2", "avx512f", "avx512_bf16", "fma"], 32, 64, 83,
     "amd.com Ryzen 9 7950X specifications (16 cores, 5.1 GHz boost, DDR5-5200 x 2 channels); Zen 4 runs AVX-512 as 2 x 256 bit"),
    ("Ryzen 9 9950X", "amd", 16, 5.0, ["avx2", "avx512f", "avx512_bf16", "fma"], 64, 64, 90,
     "amd.com Ryzen 9 9950X specifications (16 cores, DDR5-5600 x 2); Zen 5 desktop: 2 x 512-bit FMA per core"),
    ("Core i7-13700K", "intel", 16, 4.5, ["avx2", "fma", "avx_vnni"], 32, 64, 90,
     "ark.intel.com Core i7-13700K (8P+8E, DDR5-5600 x 2); 2 x 256-bit FMA per P core, counted for every core"),
    ("Core Ultra 7 155H (CPU)", "intel", 16, 3.8, ["avx2", "fma", "avx_vnni"], 32, 16, 120,
     "ark.intel.com Core Ultra 7 155H (6P+8E+2LP, LPDDR5X-7467)"),
    ("Apple M4 (CPU)", "apple", 10, 3.9, ["neon", "sme"], 16, 32, 120,
     "apple.com MacBook Pro M4 specs (4P+6E, 120 GB/s); 4 x 128-bit FMA per core"),
]


def entry(name, vendor, kind, mem_gib, bw, peaks, derived, source, checked=None, **more):
    e = {"name": name, "vendor": vendor, "kind": kind, "memory_bytes": int(mem_gib * GIB),
         "bandwidth_bytes_per_s": bw * GB, "peak_flops": {k: round(v * T) for k, v in peaks.items()},
         "derived": derived, "source": source, "checked": checked or False}
    e.update(more)
    return e


def build() -> list[dict]:
    out = []
    for name, arch, mem, bw, fp32 in NVIDIA:
        peaks = {"fp32": fp32, **{k: fp32 * r for k, r in NV_RATIO[arch].items()}}
        out.append(entry(name, "nvidia", "gpu", mem, bw, peaks,
                         f"fp32 = the vendor's shader TFLOPS; others = fp32 x {NV_RATIO[arch]} ({arch} dense tensor rates)",
                         NV_SRC[arch], CHECKED.get(name), arch=arch))
    for name, arch, mem, bw, peaks in DATACENTER:
        out.append(entry(name, "nvidia", "gpu", mem, bw, peaks, "each precision as the datasheet lists it (dense)",
                         DC_SRC[name], arch=arch))
    for name, arch, mem, bw, fp32 in AMD:
        peaks = {"fp32": fp32, **{k: fp32 * r for k, r in AMD_RATIO[arch].items()}}
        out.append(entry(name, "amd", "gpu", mem, bw, peaks, f"fp32 = AMD's peak single precision; others = fp32 x "
                         f"{AMD_RATIO[arch]} ({arch})", AMD_SRC, arch=arch))
    for name, vendor, kind, mem, bw, peaks, derived, source in INTEGRATED:
        out.append(entry(name, vendor, kind, mem, bw, peaks, derived, source, shared_memory=kind != "gpu"))
    for name, cores, ghz, mem, bw, ane in APPLE:
        fp32 = cores * 128 * 2 * ghz / 1000
        out.append(entry(name, "apple", "igpu", mem, bw, {"fp32": fp32, "fp16": fp32},
                         f"{cores} GPU cores x 128 ALUs x 2 (FMA) x {ghz} GHz; fp16 at the fp32 rate",
                         "apple.com product specifications and newsroom (GPU cores, unified memory, bandwidth)",
                         shared_memory=True, neural_engine_tops=ane))
    for name, vendor, cores, ghz, isa, per_cycle, mem, bw, source in CPUS:
        fp32 = cores * ghz * per_cycle / 1000
        peaks = {"fp32": fp32}
        if "avx512_bf16" in isa or "sme" in isa:
            peaks["bf16"] = 2 * fp32
        out.append(entry(name, vendor, "cpu", mem, bw, peaks,
                         f"{cores} cores x {ghz} GHz x {per_cycle} FP32 FLOPs/cycle; bf16 = 2 x fp32 where the ISA has it",
                         source, shared_memory=True, cores=cores, isa=isa))
    return out


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "core/src/sdrt/data/devices.json"
    path.write_text(json.dumps({"version": 1, "devices": build()}, indent=1) + "\n")
    print(f"wrote {path}: {len(build())} devices")
