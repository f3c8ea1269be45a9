#!/usr/bin/env bash
# `cyto bench cohort` against a Ray cluster of two nodes on this machine (a head and a second
# node started with `ray start`, one CPU each), and against a local Ray started by the driver.
# Usage: benchmarks/reliability/cohort_two_nodes.sh MODEL RESULTS_DIR [N_SLIDES] [SIZE]
set -euo pipefail
model=$1; results=$2; n=${3:-8}; size=${4:-4096}
bin=$(dirname "$(command -v cyto)")
port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
# nodes joining a cluster send its token (~/.ray/auth_token) only in this mode
export RAY_AUTH_MODE=token
cleanup() { for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done; wait || true; }
trap cleanup EXIT
common=(--num-cpus 1 --block --disable-usage-stats --node-ip-address 127.0.0.1)
setsid "$bin/ray" start --head --port "$port" --include-dashboard false "${common[@]}" >/dev/null 2>&1 &
pids+=($!)
sleep 8
setsid "$bin/ray" start --address "127.0.0.1:$port" "${common[@]}" >/dev/null 2>&1 &
pids+=($!)
sleep 8
# two engines, each decoding in its own process: two busy processes on two cores
cyto bench cohort --synthetic "$n" --size "$size" --model "$model" --workers 0 \
  --ray "127.0.0.1:$port" --results "$results/two-nodes"
cleanup
trap - EXIT
# one engine and one decode process, as a plain run on this machine
cyto bench cohort --synthetic "$n" --size "$size" --model "$model" --workers 1 \
  --ray local --results "$results/local"
