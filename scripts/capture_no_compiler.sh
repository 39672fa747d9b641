#!/bin/sh
# Capture pip's real output for a ggml-python source build on a machine without a C compiler (PATH
# holds only the fresh venv's bin: no cc, gcc or c++ to find), as tests/install/data/pip_no_compiler.txt.
# Needs the package index; takes a minute (pip fetches ggml-python's source and its build tools).
#   sh scripts/capture_no_compiler.sh [ggml-python version]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/tests/install/data/pip_no_compiler.txt"
venv=$(mktemp -d)
python3 -m venv "$venv"
mkdir -p "$(dirname "$out")"
env -u CC -u CXX PATH="$venv/bin" "$venv/bin/pip" install --no-cache-dir --no-deps --no-binary ggml-python \
    "ggml-python==${1:-0.0.45}" > "$out" 2>&1
echo "pip exit status $? (expected: not 0); $(wc -l < "$out") lines in $out"
rm -rf "$venv"
