#!/bin/bash
# Bundle what the cost model's GPU check (scripts/gpu_plan_check.sh) needs on a GPU machine with no network, into
# DIR (docs/plan.md, "On a GPU"): ggml-python's source (built there for CUDA), the two pure-Python wheels sdrt needs
# beside numpy/onnx/regex/pluggy/packaging, sdrt's and sdrt-ggml's dist-info (their entry points: they run from this
# tree on PYTHONPATH), sdrt-ggml's native library (stripped), and a full-size SD 1.5 folder's graphs without their
# weights (scripts/weightless.py pack; `fill` remakes them there). Then, in this tree on the GPU machine:
#
#   bash scripts/gpu_bundle_run.sh DIR OUT [DEVICE]
#
#   bash scripts/gpu_bundle.sh DIR SD15_ONNX_FOLDER       # e.g. the folder scripts/make_sd15_full.py writes
set -eu
dir=${1:?usage: gpu_bundle.sh DIR SD15_ONNX_FOLDER}; sd15=${2:?usage: gpu_bundle.sh DIR SD15_ONNX_FOLDER}
here=$(cd "$(dirname "$0")/.." && pwd); py=${PYTHON:-python3}
mkdir -p "$dir/site" && work=$(mktemp -d)
$py -m pip download -q --no-deps --no-binary :all: ggml-python==0.0.45 -d "$dir"
$py -m pip download -q --no-deps --only-binary :all: platformdirs torchruntime -d "$dir"
$py -m pip wheel -q --no-deps "$here/core" "$here/plugin-ggml" -w "$work"
for w in "$work"/sdrt*.whl; do (cd "$dir/site" && $py -m zipfile -e "$w" "$work/x" && mv "$work"/x/*.dist-info . && rm -rf "$work/x"); done
so=$(ls "$here"/plugin-ggml/build/lib*/sdrt_ggml/_native*.so "$here"/plugin-ggml/src/sdrt_ggml/_native*.so 2>/dev/null | head -1)
strip --strip-unneeded -o "$dir/_native.so" "$so"
$py "$here/scripts/weightless.py" pack "$sd15" "$work/sd15w" > /dev/null
tar cJf "$dir/sd15w.tar.xz" -C "$work" sd15w
rm -rf "$work"
du -sh "$dir"
