#!/usr/bin/env bash
# Does the CPU pipeline keep up with the engine (issue 58)? `cyto bench slide` with the code of
# BEFORE and of AFTER (each a commit, exported with `git archive`, or a folder holding a copy of
# src/; "." is the working tree), run through PYTHONPATH with this checkout's venv, alternated in
# one run (the order reverses every other round, so a change in the machine's load falls on
# both), each with ONNX Runtime fp32 and with `--precision auto`, for every MODEL=SLIDE pair. The
# load average is logged before every run (load.txt).
# Usage: benchmarks/speed/pipeline_before_after.sh BEFORE AFTER RESULTS_DIR ROUNDS \
#            MODEL=SLIDE[:EXTRA_ARGS] ...
# e.g.   ... HEAD~3 . benchmarks/results/epyc-2core/pipeline 3 \
#            fs.cyto=slide.tif:"--patch-size 224" demo.cyto=demo/slide.ndpi
# Summarise: python benchmarks/speed/pipeline_summary.py RESULTS_DIR
set -eu
res=$(realpath -m "$3"); rounds=$4
here=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d /tmp/cyto-before-after-XXXX)
trap 'rm -rf "$tmp"' EXIT
code() {  # the src/ folder of a commit or a folder ($2: where to export a commit)
    if [ "$1" = . ]; then echo "$here/src"
    elif [ -d "$1/src" ]; then realpath "$1/src"
    else mkdir -p "$2" && git -C "$here" archive "$1" src | tar -x -C "$2" && echo "$2/src"; fi
}
before_src=$(code "$1" "$tmp/before"); after_src=$(code "$2" "$tmp/after"); shift 4
pairs=("$@")
mkdir -p "$res"
export CYTO_PROGRESS=0
for r in $(seq "$rounds"); do
    versions="before after"
    if [ $((r % 2)) -eq 0 ]; then versions="after before"; fi
    for v in $versions; do
        if [ "$v" = before ]; then src=$before_src; else src=$after_src; fi
        for pair in "${pairs[@]}"; do
            model=${pair%%=*}; rest=${pair#*=}; slide=${rest%%:*}
            extra=""; if [ "$rest" != "$slide" ]; then extra=${rest#*:}; fi
            name=$(basename "$model" .cyto)
            for cfg in "onnx fp32" "auto auto"; do
                read -r backend precision <<<"$cfg"
                out="$res/$name/r$r-$v-$backend-$precision"
                echo "$(date -u +%FT%T) $name r$r $v $cfg load $(cut -d' ' -f1-3 /proc/loadavg)" \
                    | tee -a "$res/load.txt"
                # extra is a list of options: split on purpose
                # shellcheck disable=SC2086
                PYTHONPATH="$src" "$here/.venv/bin/python" -m cyto bench slide "$slide" \
                    --model "$model" --device cpu --backend "$backend" --precision "$precision" \
                    --naive-cells 0 $extra --results "$out" | tail -1
            done
        done
    done
done
echo "$(date -u +%FT%T) end load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$res/load.txt"
