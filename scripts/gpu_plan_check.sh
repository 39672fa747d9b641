#!/bin/bash
# The cost model's check on a GPU (issue 37): calibrate sdrt-ggml on the GPU, then predicted against measured time
# per call and peak GPU memory for each bench model and the parts of SD 1.5 (full size, random weights) and the
# tiny SDXL at two sizes. docs/plan.md records what it printed on a lent H200.
#
#   bash scripts/gpu_plan_check.sh OUT_DIR [DEVICE]          # DEVICE: a ggml device id, default CUDA0
#
# Needs: sdrt and sdrt-ggml installed, with ggml-python built for the GPU (docs/ggml-cuda.md), onnxruntime, and
# SD15_GRAPHS pointing at `python scripts/weightless.py pack` of a full-size SD 1.5 ONNX folder (made by
# scripts/make_sd15_full.py), whose weights this fills with seeded random values first.
set -u
out=${1:?usage: gpu_plan_check.sh OUT_DIR [DEVICE]}
dev=${2:-CUDA0}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export SDRT_CACHE_DIR=${SDRT_CACHE_DIR:-$(mktemp -d)} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
# DEADLINE (epoch seconds; default an hour from now): each step gets a share of the time left when it starts, 1 s at least
DEADLINE=${DEADLINE:-$(( $(date +%s) + 3600 ))}
left() { local l=$(( DEADLINE - $(date +%s) )); echo $(( l > 1 ? l : 1 )); }
share() { local t=$(( $(left) * $1 / 100 )); echo $(( t > 1 ? t : 1 )); }

stamp "sdrt info"
$py -m sdrt info 2>&1 | tee "$out/info.txt" | grep -i -E "ggml|$dev" || { stamp "sdrt info failed"; exit 1; }

sd15=""
if [ -n "${SD15_GRAPHS:-}" ]; then
    sd15=$(mktemp -d)/sd15
    cp -r "$SD15_GRAPHS" "$sd15"
    stamp "filling the SD 1.5 weights in $sd15"
    $py "$here/scripts/weightless.py" fill "$sd15" > "$out/fill.log" 2>&1 || { stamp "fill failed"; tail "$out/fill.log"; exit 1; }
fi

stamp "calibrating ggml on $dev"
timeout "$(share 45)" $py -m sdrt selftest --calibrate --backend ggml --device "$dev" --passes "${PASSES:-1}" \
    --report "$out/calibration.json" > "$out/calibrate.log" 2>&1
rc=$?
tail -5 "$out/calibrate.log"
[ $rc -eq 0 ] || { stamp "calibration failed (rc $rc)"; exit 1; }
cp "$SDRT_CACHE_DIR/calibration/calibration.json" "$out/stored-calibration.json" 2>/dev/null

stamp "checking the predictions on $dev"
args=(--backend ggml --device "$dev" --passes "${PASSES:-1}" --json "$out/check.json")
[ -n "$sd15" ] && args+=(--sd15 "$sd15")
timeout "$(share "${CHECK_SHARE:-100}")" $py "$here/scripts/check_plan_predictions.py" "${args[@]}" 2>&1 | tee "$out/check.log"
if [ "${FP16:-0}" = 1 ] && [ -n "$sd15" ] && [ "$(left)" -gt 30 ]; then  # the SD 1.5 parts' time at fp16 beside fp32's (measured;
    stamp "SD 1.5 at fp16"                                   # predicted from the fp32 factors)
    timeout "$(left)" $py "$here/scripts/check_plan_predictions.py" --backend ggml --device "$dev" --passes 1 \
        --precision fp16 --group "SD 1.5" --sd15 "$sd15" --json "$out/check-fp16.json" 2>&1 | tee "$out/check-fp16.log"
fi
stamp "done"
