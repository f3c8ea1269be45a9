#!/usr/bin/env bash
# The paper's witness-rate sweep at the paper's sizes (issue 16, item 4a), on synthetic cells:
# 18,370 training normals in 10 bags and 7,873 held-out normals, the paper's abnormal counts
# (train 910/455/90/45/10/5 in the 5 positive bags, test 396/198/40/20/4/2), K = 400, 10 trials.
# On a GPU pass RECIPE=paper (the methods' own recipes, ResNet18 at 224 px); the default is a
# recipe that fits a 2-core CPU in about an hour (SmallCNN at 32 px, one to six epochs: with 30x
# the cells of the 600-cell data, an epoch holds as many steps as the fast preset's whole run).
# Usage: benchmarks/science/paper_scale_sweep.sh WORK_DIR RESULTS_DIR [DEVICE]
# SEED (default 0) draws another split, bags and trials from the same cells; METHODS and WRS
# (defaults: all five methods, 9,5,1,0.5,0.1,0.05) run a part of the sweep.
set -euo pipefail
work=$1; results=$2; device=${3:-cpu}
mkdir -p "$work" "$results"
if [ ! -d "$work/cells" ]; then
  # 26,243 normal cells (0.7 of them: 10 bags of 1,837) and 6 x 304 abnormal cells (half of them
  # can be injected into training: 912 >= 910); 80 px at scale 0.625 is the 192 px look resized
  cyto synth patches "$work/cells" --n-normal 26243 --n-abnormal 304 --size 80 --scale 0.625 \
    --seed 16
fi
methods=${METHODS:-dsvdd,droc,fs-sil,ws-sil,its2clr}
if [ "${RECIPE:-cpu}" = paper ]; then
  recipe=(--preset paper)
else
  recipe=(--preset fast --set input_size=32 --set load_size=40)
  for s in dsvdd:ae_epochs=2 dsvdd:epochs=6 droc:epochs=4 fs-sil:epochs=3 ws-sil:epochs=3 \
           its2clr:epochs=4 its2clr:warmup_epochs=1 its2clr:refit_every=1; do
    case ",$methods," in *",${s%%:*},"*) recipe+=(--set "$s") ;; esac  # the methods run only
  done
fi
cyto eval sweep --data "$work/cells" --normal normal \
  --methods "$methods" --wr "${WRS:-9,5,1,0.5,0.1,0.05}" \
  --trials 10 --k 400 --seed "${SEED:-0}" \
  --train-fraction 0.7 "${recipe[@]}" --out "$work/sweep" --device "$device" \
  | tee "$work/sweep_output.txt"
cp "$work/sweep/results.csv" "$work/sweep/sweep.json" "$work/sweep"/*.md "$work/sweep"/*.tex \
  "$work/sweep"/*.png "$work/sweep"/*.svg "$work/sweep_output.txt" "$results/"
