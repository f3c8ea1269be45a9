"""OpenVINO's engine threads as one stream or as several, end to end (issue 58): ``cyto bench
slide`` on one slide, ``cyto.runtime.backends.openvino.STREAMS`` set to each value in turn, the
order rotated every round so that a change in the machine's load falls on every value. A first
JSON line with the machine (``cyto.bench.device.machine``: the CPU, its flags, the libraries),
then one a run (rates, stage times, the load average), and the median ratio to the first value,
paired by round.

    python benchmarks/speed/openvino_streams.py SLIDE MODEL --patch-size 224 --rounds 4 \\
        --streams 1 2 --out RESULTS.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

KEYS = ("seconds", "cells_per_s", "engine_cells_per_s", "pipeline_efficiency", "model_load_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slide", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--patch-size", type=int, default=192)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", type=Path, required=True, help="one JSON line a run")
    args = ap.parse_args()
    os.environ.setdefault("CYTO_PROGRESS", "0")

    import cyto.runtime.backends.openvino as ov
    from cyto.bench.device import machine
    from cyto.bench.slide import bench_slide
    from cyto.infer.options import ScoreOptions

    opts = ScoreOptions(
        patch_size=args.patch_size,
        device="cpu",
        backend="openvino",
        precision=args.precision,
        mosaic=0,
    )
    rows = []
    with args.out.open("a") as log:
        print(json.dumps({"meta": machine(" ".join(sys.argv))}), file=log, flush=True)
        for r in range(args.rounds):
            k = r % len(args.streams)
            order = args.streams[k:] + args.streams[:k]
            for streams in order[::-1] if r % 2 else order:
                ov.STREAMS = streams
                work = Path(tempfile.mkdtemp()) / "out"
                try:
                    res = bench_slide(args.slide, args.model, work, opts, naive_cells=0)
                finally:
                    shutil.rmtree(work.parent, ignore_errors=True)
                row = {
                    "round": r,
                    "streams": streams,
                    "load": round(os.getloadavg()[0], 2),
                    **{key: res[key] for key in KEYS},
                    "precision": res["precision"],
                    "timings_s": res["timings_s"],
                }
                rows.append(row)
                print(json.dumps(row), file=log, flush=True)
    first = {row["round"]: row["cells_per_s"] for row in rows if row["streams"] == args.streams[0]}
    for streams in args.streams:
        mine = [row for row in rows if row["streams"] == streams]
        ratio = [row["cells_per_s"] / first[row["round"]] for row in mine]
        print(
            f"streams {streams}: cells/s {statistics.median(x['cells_per_s'] for x in mine):.1f}, "
            f"efficiency {statistics.median(x['pipeline_efficiency'] for x in mine):.3f}, "
            f"x{statistics.median(ratio):.3f} the first ({', '.join(f'{x:.2f}' for x in ratio)})"
        )


if __name__ == "__main__":
    main()
