#!/usr/bin/env bash
# ONNX Runtime's CUDA provider on a lent GPU machine, as the runs in results/h200/ort-cuda were
# made: onnxruntime-gpu packed by ort_gpu_pack.py (its parts carried over two calls, the first
# copying its part to /tmp), the image's CPU onnxruntime removed (the two builds never side by
# side), then the CUDA tests, device_suite.sh verify (fp32 and fp16 exported with golden cells,
# cyto doctor on the GPU: every path verified there, and auto's choice) and the engine bench.
# Usage: ort_cuda_lent.sh FIRST_PART SECOND_PART SHA256_FILE WHEELS_DIR MODEL RESULTS_DIR
#   WHEELS_DIR: what the image lacks for the tests (albumentations and its needs; openslide-python
#   and openslide-bin for the slide tests)
set -u
first=$1; second=$2; sum=$3; wheels=$4; model=$5; res=$6
export PYTHONUNBUFFERED=1 CYTO_PROGRESS=0
mkdir -p "$res" /tmp/site-ort
cat "$first" "$second" > /tmp/ort.tar.xz
echo "$(cut -d' ' -f1 "$sum")  /tmp/ort.tar.xz" | sha256sum -c - || exit 3
tar -xJf /tmp/ort.tar.xz -C /tmp/site-ort || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-ort \
    "$wheels"/*.whl || exit 5
python3 -m pip uninstall -y onnxruntime 2>&1 | tail -1
export PYTHONPATH=/tmp/site-ort:$PWD/src:$PWD
here=$(dirname "$0")
T_TESTS=230 bash "$here/device_suite.sh" tests "$model" "$res" 2>&1 | tail -12
T_VERIFY=100 timeout 220 bash "$here/device_suite.sh" verify "$model" "$res" 2>&1 | tail -30
echo "== engine: PyTorch and ONNX Runtime's CUDA provider, fp32 and fp16"
timeout 90 python3 -m cyto bench engine --model /tmp/cyto-verify.cyto --devices cuda \
    --backends torch,onnx --precisions fp32,fp16 --batches 64,256 --budget 1 \
    --results "$res/engine-ort-cuda" 2>&1 | grep -E "patches/s|rror|unavail" | tail -12
tar czf "${OUT:-$res/..}/gpu_results.tgz" -C "$res" .
