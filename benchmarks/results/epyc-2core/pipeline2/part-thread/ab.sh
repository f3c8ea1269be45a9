#!/bin/bash
cd /work/main
export CYTO_PROGRESS=0
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then vs="head new"; else vs="new head"; fi
  for v in $vs; do
    for pair in "fs:/tmp/ov58/fs.cyto:/tmp/ov58/slide.tif:224" "demo:/tmp/ov58/demo8.cyto:/tmp/ov58/demo/slide.ndpi:192"; do
      IFS=: read -r name model slide ps <<<"$pair"
      out=/tmp/abl/res/$name-r$r-$v; mkdir -p $out
      PYTHONPATH=/tmp/abl/$v/src .venv/bin/python -m cyto bench slide $slide --model $model --device cpu --backend auto --precision auto --patch-size $ps --naive-cells 0 --results $out > $out.log 2>&1
      python3 -c "
import json,glob
d=json.load(open(glob.glob('$out/*.json')[0])); r=d['results'][0] if 'results' in d else d
print('$name r$r $v', r['cells_per_s'], r['engine_cells_per_s'], r['pipeline_efficiency'], 'wait', r['timings_s']['wait'], 'load', r['model_load_s'])"
    done
  done
done
