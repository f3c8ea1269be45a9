#!/usr/bin/env bash
# The CPU pipeline before and after a change, in one run on one machine (issue 15: "the same
# slide on this 2-core CPU must not get slower"). Runs `cyto bench slide` alternately with the
# code of OLD (a git worktree) and of the working tree, ROUNDS times, then the new options
# (--overlap on; --decode torch in one process) once per round.
# Usage: benchmarks/speed/cpu_before_after.sh OLD_COMMIT MODEL SLIDE RESULTS_DIR [ROUNDS]
set -eu
old=$1; model=$(realpath "$2"); slide=$(realpath "$3"); res=$(realpath -m "$4"); rounds=${5:-2}
here=$(git rev-parse --show-toplevel)
py="$here/.venv/bin/python"
tree=$(mktemp -d /tmp/cyto-old-XXXX)
git -C "$here" worktree add --detach "$tree" "$old" >/dev/null
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
export CYTO_PROGRESS=0
common=(--model "$model" --device cpu --naive-cells 0)
for r in $(seq "$rounds"); do
    echo "== round $r: before ($old)"
    (cd "$tree" && PYTHONPATH="$tree/src" "$py" -m cyto bench slide "$slide" "${common[@]}" \
        --results "$res/r$r-before" | tail -1)
    echo "== round $r: after ($(git -C "$here" rev-parse --short HEAD), defaults)"
    "$py" -m cyto bench slide "$slide" "${common[@]}" --results "$res/r$r-after" | tail -1
    echo "== round $r: after, --overlap on"
    "$py" -m cyto bench slide "$slide" "${common[@]}" --overlap on --results "$res/r$r-after-overlap" | tail -1
    echo "== round $r: after, --decode torch --workers 0 --overlap on (the one-process device path)"
    "$py" -m cyto bench slide "$slide" "${common[@]}" --decode torch --workers 0 --overlap on \
        --results "$res/r$r-after-devpath" | tail -1
done
