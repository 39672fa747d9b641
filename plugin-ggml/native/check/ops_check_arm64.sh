#!/bin/sh
# Cross-compile the attention, GELU and group-norm kernels for AArch64 and run ops_check.c under
# qemu-user: the NEON bodies are then checked for results (not speed) on an x86 machine.
#   apt-get install gcc-aarch64-linux-gnu qemu-user-static    (Debian/Ubuntu)
# With CC=gcc (and no qemu) it checks the x86 bodies the same way.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/sdrt-ops-check
cc=${CC:-aarch64-linux-gnu-gcc}
$cc -O3 -std=c11 -Wall -Wextra -static -I"$here/.." -o "$out" "$here/ops_check.c" "$here/../ops.c" \
    "$here/../tensor.c" -lm
case "$cc" in
aarch64*) qemu-aarch64-static "$out" ;;
*) "$out" ;;
esac
