#!/bin/sh
# Cross-compile the native kernels for AArch64 and run gemm_check.c under qemu-user: the NEON
# kernels are then checked for results (not speed) on an x86 machine.
#   apt-get install gcc-aarch64-linux-gnu qemu-user-static    (Debian/Ubuntu)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/sdrt-gemm-check-arm64
aarch64-linux-gnu-gcc -O3 -std=gnu11 -Wall -Wextra -static -I"$here/.." -o "$out" "$here/gemm_check.c" \
    "$here/../tensor.c" "$here/../gemm.c" "$here/../gemm_kernels.c" -lm
qemu-aarch64-static "$out"
