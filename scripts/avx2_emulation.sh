#!/bin/bash
# Run a Python command as an AVX2-only AMD Zen 1 runs it, on any x86-64 Linux machine (docs/ggml.md, "Every CPU"):
#   - qemu-user's EPYC-v1 CPU model: CPUID says AVX2, FMA, F16C and no AVX-512, so ggml, sdrt-ggml's kernels,
#     onnxruntime's MLAS and OpenVINO's oneDNN all dispatch to their AVX2 code;
#   - a Zen 1 /proc/cpuinfo (what sdrt.hardware reads), bind-mounted in a private mount namespace;
#   - ggml-python built without AVX-512 (a pip install builds it -march=native, which this CPU model cannot run).
# Correctness only: emulated code runs ~100-200x slower, so no timing from it means anything.
# Needs root (unshare -m, mount --bind), qemu-user (apt install qemu-user; Debian 12 has QEMU 7.2), a C compiler.
#
#   bash scripts/avx2_emulation.sh WORKDIR python -m pytest -q tests/plugins/ggml
#
# Limits: a child process (subprocess.run([sys.executable, ...])) runs natively, not emulated; fork() with threads
# can crash qemu-user; QEMU 7.2 computes OpenVINO's AVX2 Tanh wrongly (a one-op model is off by up to 0.995 against
# numpy there and exact natively), so an OpenVINO result through Tanh is no evidence under this emulation.
set -euo pipefail
WORK=${1:?usage: avx2_emulation.sh WORKDIR python ARGS...}
shift
PY=$(command -v "${1:?python}")
shift
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
command -v qemu-x86_64 >/dev/null || { echo "qemu-x86_64 is missing: apt install qemu-user" >&2; exit 2; }

if [ ! -d "$WORK/ggml-site/ggml" ]; then  # ggml-python, the installed version, built for AVX2
    ver=$("$PY" -c 'from importlib.metadata import version; print(version("ggml-python"))')
    "$PY" -m pip download -q --no-deps --no-binary :all: "ggml-python==$ver" -d "$WORK/src"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" \
        "$PY" -m pip wheel -q --no-deps "$WORK"/src/ggml_python-*.tar.gz -w "$WORK/wheel"
    "$PY" -m pip install -q --no-deps --target "$WORK/ggml-site" "$WORK"/wheel/ggml_python-*.whl
fi

if [ ! -f "$WORK/cpuinfo" ]; then  # this machine's /proc/cpuinfo with a Zen 1's name and flags
    "$PY" - "$WORK/cpuinfo" <<'EOF'
import re, sys
flags = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall "
         "nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid pni pclmulqdq "
         "monitor ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic "
         "cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw skinit wdt tce topoext perfctr_core perfctr_nb cpb "
         "hw_pstate ssbd ibpb vmmcall fsgsbase bmi1 avx2 smep bmi2 rdseed adx smap clflushopt sha_ni xsaveopt xsavec "
         "xgetbv1 xsaves clzero irperf xsaveerptr arat")
text = open("/proc/cpuinfo").read()
for key, value in (("flags", flags), ("model name", "AMD EPYC 7551 32-Core Processor"), ("cpu family", "23"),
                   ("model", "1"), ("vendor_id", "AuthenticAMD")):
    text = re.sub(rf"^{key}\s*:.*$", f"{key}\t: {value}", text, flags=re.M)
open(sys.argv[1], "w").write(text)
EOF
fi

export PYTHONPATH="$WORK/ggml-site${PYTHONPATH:+:$PYTHONPATH}"
exec unshare -m --propagation private bash -c 'mount --bind "$0" /proc/cpuinfo && shift && exec "$@"' \
    "$WORK/cpuinfo" _ qemu-x86_64 -cpu EPYC-v1 "$PY" "$@" 2> >(grep -v "TCG doesn't support requested feature" >&2)
