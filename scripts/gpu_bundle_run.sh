#!/bin/bash
# On the GPU machine, in this tree: build ggml-python for CUDA from the bundle (scripts/gpu_bundle.sh), put sdrt and
# sdrt-ggml on PYTHONPATH, then scripts/gpu_plan_check.sh. BUDGET (seconds, default 570): when to stop, all in.
# GGML_CUDA_FA=OFF keeps the build near 3 minutes on 16 cores (5 with the flash-attention kernels: FA=ON).
#
#   bash scripts/gpu_bundle_run.sh DIR OUT [DEVICE]
set -u
dir=$(cd "${1:?usage: gpu_bundle_run.sh DIR OUT [DEVICE]}" && pwd); out=${2:?usage}; dev=${3:-CUDA0}
R=$(cd "$(dirname "$0")/.." && pwd); RES=$(mktemp -d)/res; mkdir -p "$out" "$RES"
trap 'tar czf "$out/results.tgz" -C "$(dirname "$RES")" res 2>/dev/null' EXIT
T0=$(date +%s); PY=${PY:-python3}
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$RES/steps.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/gpu.txt" 2>&1; cat "$RES/gpu.txt"
SITE=$(mktemp -d); B=$(mktemp -d); W=$(mktemp -d)
if [ -z "${GGML_WHEEL:-}" ]; then  # GGML_WHEEL: a ggml-python wheel built before (this script's last run)
  say "building ggml-python for CUDA on $(nproc) cores"
  tar xzf "$dir"/ggml_python-0.0.45.tar.gz -C "$B"
  (cd "$B"/ggml_python-0.0.45 && CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-native} -DGGML_CUDA_FA=${FA:-OFF} -DGGML_CUDA_NCCL=OFF -DGGML_LLAMAFILE=ON" \
    $PY -m pip wheel --no-deps --no-build-isolation --no-index -w "$W" .) > "$RES/build.log" 2>&1 \
    || { say "build failed"; tail -20 "$RES/build.log"; exit 1; }
  GGML_WHEEL=$(ls "$W"/ggml_python*.whl)
  say "built $GGML_WHEEL"
fi
for w in "$GGML_WHEEL" "$dir"/platformdirs*.whl "$dir"/torchruntime*.whl; do $PY -m zipfile -e "$w" "$SITE"; done
cp -r "$dir"/site/* "$SITE"/ && cp "$dir/_native.so" "$R/plugin-ggml/src/sdrt_ggml/_native.so"
export PYTHONPATH=$SITE:$R/core/src:$R/plugin-ggml/src PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
SD=$(mktemp -d) && tar xJf "$dir/sd15w.tar.xz" -C "$SD"
SD15_GRAPHS=$SD/sd15w PYTHON=$PY PASSES=${PASSES:-1} DEADLINE=$(( T0 + ${BUDGET:-570} )) CHECK_SHARE=80 FP16=${FP16:-1} \
  bash "$R/scripts/gpu_plan_check.sh" "$RES" "$dev"
say "end"
