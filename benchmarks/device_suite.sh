#!/usr/bin/env bash
# The GPU run of the benchmark suite, as run on a lent GPU machine (see benchmarks/README.md).
# Usage: benchmarks/device_suite.sh FAST_MODEL RESULTS_DIR [SLIDE_SIDE_PX]
# Steps are time-boxed and results are packed after each one, so a cut-off run keeps what it made.
set -u
model=$1; res=$2; side=${3:-24000}
export PYTHONUNBUFFERED=1 CYTO_PROGRESS=0
mkdir -p "$res" /tmp/cyto-slide
pack() { tar czf "${OUT:-$res/..}/gpu_results.tgz" -C "$res" . ; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$res/nvidia-smi.csv"
echo "== gpu checks"
timeout 200 python3 benchmarks/gpu_checks.py --model "$model" --out "$res/gpu_checks" \
    --work /tmp/cyto-gpu-work 2>&1 | grep -v Warning | tail -12
pack
echo "== engine benches"
timeout 240 python3 benchmarks/run_suite.py --out "$res" --work /tmp/cyto-suite \
    --fast-model "$model" --devices cuda --batches 1,8,32,128,512 --budget 1 --skip scorer,slide \
    2>&1 | grep -E "patches/s|unavailable|suite|Error" | tail -80
pack
echo "== slide: synthesize ${side}^2 and score it on the GPU"
python3 -m cyto synth slide /tmp/cyto-slide/slide.ndpi --width "$side" --height "$side" \
    --abnormal-fraction 0.005 --workers "$(($(nproc) - 1))" --overwrite 2>&1 | tail -2
timeout 200 python3 benchmarks/run_suite.py --out "$res" --work /tmp/cyto-suite \
    --fast-model "$model" --skip engine,scorer --slide /tmp/cyto-slide/slide.ndpi \
    --workers "$(($(nproc) - 2))" --naive-cells 1000 2>&1 | tail -8
pack
ls -R "$res"
