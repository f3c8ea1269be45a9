#!/usr/bin/env bash
# The GPU run of the benchmark suite, as run on a lent GPU machine (see benchmarks/README.md).
# Usage: benchmarks/gpu/device_suite.sh PART FAST_MODEL RESULTS_DIR
#   PART: tests (the CUDA tests: tests/integration/test_gpu.py and the runtime's unit tests),
#   checks (gpu_checks.py), parity (gpu_parity.py: every method's GPU paths against ONNX Runtime
#   fp32 on the real bone-marrow cells; needs BONE_MARROW=path), engine (cyto bench engine on CUDA and the host CPU), slide
#   (synthesize a slide, cyto bench slide on the GPU), devpath (decode, detection and crops on the
#   GPU against CPU workers, tables compared; the same with --overlap off), paper (the paper's
#   Deep SVDD recipe, 5 seeds x 4 views ResNet18 224, on the device path, fp32 and fp16), train (the paper's recipes on the bone-marrow
#   cells: DROC raw vs whitened, FS-SIL, WS-SIL, ItS2CLR, then Deep SVDD with one seed; needs
#   BONE_MARROW=path; TRAIN_STEPS=droc,sup,dsvdd picks steps, SUP_METHODS the supervised ones);
#   verify (issue 32: the model exported with fp16 and golden cells, then cyto doctor on the GPU:
#   every CUDA path verified on the golden cells here, ORT CUDA opening a session where
#   onnxruntime-gpu is installed); several with commas.
# Each step is time-boxed and the results are packed after it ($OUT/gpu_results.tgz), so a run
# that is cut off keeps what it made.
set -u
parts=$1; model=$2; res=$3; side=${SLIDE_SIDE:-24000}
export PYTHONUNBUFFERED=1 CYTO_PROGRESS=0
mkdir -p "$res" /tmp/cyto-slide
pack() { tar czf "${OUT:-$res/..}/gpu_results.tgz" -C "$res" . ; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$res/nvidia-smi.csv"
if [[ $parts == *tests* ]]; then
    echo "== CUDA tests"
    timeout "${T_TESTS:-240}" python3 -m pytest -q -p no:cacheprovider tests/integration/test_gpu.py \
        tests/unit/test_runtime.py tests/integration/test_tensorrt.py 2>&1 | tee "$res/pytest.log" | tail -25
    pack
fi
if [[ $parts == *verify* ]]; then
    echo "== verification on this machine: the golden cells through every path of the GPU"
    rm -rf /tmp/cyto-verify.cyto && cp -r "$model" /tmp/cyto-verify.cyto
    timeout "${T_VERIFY:-150}" python3 -m cyto export /tmp/cyto-verify.cyto --precision fp32,fp16 \
        2>&1 | tail -6
    timeout "${T_VERIFY:-150}" python3 -m cyto doctor /tmp/cyto-verify.cyto --device cuda \
        2>&1 | tee "$res/doctor-cuda.txt" | tail -30
    timeout 60 python3 -m cyto doctor /tmp/cyto-verify.cyto --device cuda --json \
        > "$res/doctor-cuda.json" 2>/dev/null
    pack
fi
if [[ $parts == *parity* ]]; then
    echo "== GPU paths vs ONNX Runtime fp32 on real cells"
    timeout "${T_PARITY:-260}" python3 benchmarks/gpu/gpu_parity.py --data "${BONE_MARROW:?set BONE_MARROW}" \
        --normal LYT --abnormal BLA,PMO,EOS,MON --seeds 0,1 --device cuda --out "$res/gpu_parity" \
        2>&1 | grep -v batches/s | tail -40
    pack
fi
if [[ $parts == *checks* ]]; then
    echo "== gpu checks"
    timeout "${T_CHECKS:-210}" python3 benchmarks/gpu/gpu_checks.py --model "$model" \
        --out "$res/gpu_checks" --work /tmp/cyto-gpu-work 2>&1 | grep -v Warning | tail -12
    pack
fi
if [[ $parts == *engine* ]]; then
    echo "== engine benches"
    timeout "${T_ENGINE:-210}" python3 benchmarks/speed/run_suite.py --out "$res" --work /tmp/cyto-suite \
        --fast-model "$model" --devices cuda --batches "${BATCHES:-1,8,32,128,512}" \
        --budget 0.5 --skip scorer,slide 2>&1 | grep -E "patches/s|suite|Error" | tail -80
    pack
    echo "== the host CPU of this machine, paper-size model, for comparison"
    timeout 90 python3 -m cyto bench engine --model /tmp/cyto-suite/paper-resnet18-224.cyto \
        --devices cpu --backends torch,onnx --precisions fp32 --batches 32,128 \
        --budget 0.5 --results "$res/engine-paper-host-cpu" 2>&1 | grep -E "patches/s" | tail
    pack
fi
if [[ $parts == *slide* ]]; then
    echo "== slide: synthesize ${side}^2 and score it on the GPU"
    timeout 120 python3 -m cyto synth slide /tmp/cyto-slide/slide.ndpi --width "$side" \
        --height "$side" --abnormal-fraction 0.005 --workers "$(($(nproc) - 1))" --overwrite \
        2>&1 | tail -2
    timeout "${T_SLIDE:-200}" python3 benchmarks/speed/run_suite.py --out "$res" --work /tmp/cyto-suite \
        --fast-model "$model" --skip engine,scorer --slide /tmp/cyto-slide/slide.ndpi \
        --workers "$(($(nproc) - 2))" --naive-cells 1000 2>&1 | tail -8
    pack
fi
if [[ $parts == *devpath* ]]; then
    # issue 15: JPEG tiles decoded, nuclei found and crops cut on the GPU (one process), against
    # the CPU workers on the same pyramidal TIFF; the two tables compared cell by cell
    echo "== device path: decode, detect, crop on the GPU vs CPU workers (${side}^2 TIFF)"
    timeout 150 python3 -m cyto synth slide /tmp/cyto-slide/dev.tif --width "$side" \
        --height "$side" --abnormal-fraction 0.005 --workers "$(($(nproc) - 1))" --overwrite \
        2>&1 | tail -2
    timeout "${T_DEV:-150}" python3 -m cyto bench slide /tmp/cyto-slide/dev.tif --model "$model" \
        --device cuda --decode torch --detector torch --workers 0 --naive-cells 0 \
        --work /tmp/cyto-dev/gpu --results "$res/slide-devpath" 2>&1 | tail -4
    timeout "${T_DEV:-150}" python3 -m cyto bench slide /tmp/cyto-slide/dev.tif --model "$model" \
        --device cuda --workers "$(($(nproc) - 2))" --naive-cells 0 \
        --work /tmp/cyto-dev/cpu --results "$res/slide-cpuworkers" 2>&1 | tail -4
    # the engine lane's share: the same device path with the engine in the main thread
    timeout "${T_DEV:-150}" python3 -m cyto bench slide /tmp/cyto-slide/dev.tif --model "$model" \
        --device cuda --decode torch --detector torch --workers 0 --overlap off --naive-cells 0 \
        --work /tmp/cyto-dev/gpu-nolane --results "$res/slide-devpath-overlap-off" 2>&1 | tail -4
    python3 - "$res/slide-devpath/tables.txt" <<'PY'
import sys
import numpy as np, pyarrow.parquet as pq
from scipy.stats import spearmanr
a = pq.read_table("/tmp/cyto-dev/gpu/scores.parquet").to_pydict()
b = pq.read_table("/tmp/cyto-dev/cpu/scores.parquet").to_pydict()
ka = {(x, y): s for x, y, s in zip(a["x"], a["y"], a["score"])}
kb = {(x, y): s for x, y, s in zip(b["x"], b["y"], b["score"])}
both = sorted(set(ka) & set(kb))
rho = spearmanr([ka[k] for k in both], [kb[k] for k in both]).statistic
line = (f"cells gpu {len(ka)} cpu {len(kb)} matched {len(both)}; Spearman on matched {rho:.6f}; "
        f"max |diff| {max(abs(ka[k] - kb[k]) for k in both):.3g}")
print(line); open(sys.argv[1], "w").write(line + "\n")
PY
    pack
fi
if [[ $parts == *paper* ]]; then
    # issue 15: the paper's Deep SVDD recipe (ResNet18 at 224 px, 5 seeds x 4 test-time views =
    # 20 forward passes per cell; random weights: throughput only) on the device-path slide,
    # PyTorch fp32 and fp16 (autocast), end to end; engine-only cells/s are in the same rows
    echo "== paper recipe (5 seeds x 4 views, ResNet18 224) on the device path"
    python3 - <<'PY'
from pathlib import Path
from cyto.bench.models import architecture_bundle
from cyto.models.graphs import TTA_VIEWS
architecture_bundle(Path("/tmp/cyto-suite/paper-5x4.cyto"), "resnet18", 224, seeds=5,
                    views=TTA_VIEWS, export=False)
PY
    for prec in fp32 fp16; do
        timeout "${T_PAPER:-150}" python3 -m cyto bench slide /tmp/cyto-slide/dev.tif \
            --model /tmp/cyto-suite/paper-5x4.cyto --backend torch --precision "$prec" \
            --device cuda --decode torch --detector torch --workers 0 --batch-size 128 \
            --naive-cells 0 --work "/tmp/cyto-dev/paper-$prec" \
            --results "$res/slide-paper-5x4-$prec" 2>&1 | tail -3
        pack
    done
fi
if [[ $parts == *train* ]]; then
    bm=${BONE_MARROW:?set BONE_MARROW to the bone-marrow patch folder}
    mkdir -p "$res/train"
    cls=(--data "$bm" --normal LYT --abnormal BLA,PMO,EOS,MON --preset paper --device cuda)
    steps=${TRAIN_STEPS:-droc,sup,dsvdd}
    [[ $steps == *droc* ]] && echo "== train: DROC paper recipe, OC-SVM on raw vs whitened embeddings" &&
    timeout "${T_DROC:-200}" python3 benchmarks/science/droc_whitening.py "${cls[@]}" --seeds 0 \
        --out "$res/train" --jsonl "$res/train/droc_whitening.jsonl" 2>&1 | grep -v Warn | tail -4
    pack
    [[ $steps == *sup* ]] && echo "== train: FS-SIL, WS-SIL, ItS2CLR paper recipes" &&
    timeout "${T_SIL:-220}" python3 benchmarks/science/train_bone_marrow.py "${cls[@]}" --seeds 0 \
        --methods "${SUP_METHODS:-fs-sil,ws-sil,its2clr}" --out "$res/train" --jsonl "$res/train/paper.jsonl" \
        2>&1 | grep -v Warn | tail -5
    pack
    [[ $steps == *dsvdd* ]] && echo "== train: Deep SVDD paper recipe, one seed of the ensemble" &&
    timeout "${T_DSVDD:-130}" python3 benchmarks/science/train_bone_marrow.py "${cls[@]}" --seeds 0 \
        --methods dsvdd --set n_seeds=1 --out "$res/train" --jsonl "$res/train/paper.jsonl" \
        2>&1 | grep -v Warn | tail -3
    pack
fi
ls -R "$res"
