#!/bin/sh
# Build the C checks of sdrt-ggml's native kernels and run them: gemm_check.c (the GEMM
# micro-kernels), amx_check.c (the AMX bf16 product with operands that end at an inaccessible page,
# the caller's tile configuration kept, the tiles refused by the OS: vdpbf16ps; the bf16 attention on the
# tiles with its operands at such a page), ops_check.c
# (attention, GELU, group norm), amx_conv_check.c (the conv without packing on AMX tiles, its operands
# ending at an inaccessible page), conv_check.c (both conv routes with
# their epilogue, the depthwise conv, the padded group-norm output), pool_check.c (the ops' thread
# pool: every task once, sleeping workers, two submitting threads). Each checks every ISA that the
# build and the CPU have against double-precision references; exit status 1 on any mismatch.
#   sh run.sh            # the host's compiler ($CC, default cc): e.g. AVX-512 on a machine with it
#   sh run.sh arm64      # cross-compiled for AArch64 and run under qemu-user: the NEON kernels
#                        # (apt-get install gcc-aarch64-linux-gnu qemu-user-static)
#   sh run.sh windows    # cross-compiled for Windows x64 by mingw-w64 and run under Wine: the pool's
#                        # Win32 threads (apt-get install gcc-mingw-w64-x86-64 wine64)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/sdrt-native-check
mkdir -p "$out"
exe=
if [ "${1:-}" = arm64 ]; then
    cc=aarch64-linux-gnu-gcc
    flags=-static
    runner=qemu-aarch64-static
elif [ "${1:-}" = windows ]; then
    cc=x86_64-w64-mingw32-gcc
    flags=-static
    runner=${WINE:-/usr/lib/wine/wine64}
    exe=.exe
    export WINEDEBUG=-all
else
    cc=${CC:-cc}
    flags=
    runner=
fi
for check in gemm_check amx_check amx_conv_check ops_check conv_check pool_check; do
    # shellcheck disable=SC2086
    $cc -O3 -std=gnu11 -Wall -Wextra -pthread $flags -I"$here/.." -o "$out/$check$exe" "$here/$check.c" "$here"/../*.c -lm
    echo "== $check"
    $runner "$out/$check$exe"
done
