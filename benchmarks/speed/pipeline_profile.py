"""Where the time of `cyto bench slide` goes (issue 58): cProfile of the engine's process
(``main``: the whole of ``bench_slide``, the workers in their own processes) or of the tile
worker's work (``worker``: ``run_tile`` over every tile of the slide, in this process, once to
warm up and once profiled). Prints the functions by cumulative or own time.

    python benchmarks/speed/pipeline_profile.py main SLIDE MODEL --patch-size 224
    python benchmarks/speed/pipeline_profile.py worker SLIDE MODEL --patch-size 224
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path


def profile_main(args) -> cProfile.Profile:
    from cyto.bench.slide import bench_slide
    from cyto.infer.options import ScoreOptions

    opts = ScoreOptions(
        patch_size=args.patch_size,
        device="cpu",
        backend=args.backend,
        precision=args.precision,
        mosaic=0,
        top_k=400,
    )
    work = Path(tempfile.mkdtemp()) / "out"
    prof = cProfile.Profile()
    prof.enable()
    r = bench_slide(args.slide, args.model, work, opts, naive_cells=0, echo=lambda _: None)
    prof.disable()
    shutil.rmtree(work.parent, ignore_errors=True)
    keys = ("seconds", "cells_per_s", "engine_cells_per_s", "pipeline_efficiency", "model_load_s")
    print({k: r[k] for k in keys}, r["timings_s"])
    return prof


def profile_worker(args) -> cProfile.Profile:
    from cyto.infer import tiling
    from cyto.infer.options import ScoreOptions
    from cyto.infer.plan import SlidePlan
    from cyto.runtime import load_scorer
    from cyto.slides import open_with_planes

    opts = ScoreOptions(patch_size=args.patch_size, device="cpu", backend="onnx", precision="fp32")
    scorer = load_scorer(args.model, "onnx", "cpu", "fp32")
    reader, planes = open_with_planes(args.slide, opts.planes)
    t0 = time.perf_counter()
    plan = SlidePlan(args.slide, reader, planes, scorer, opts, lambda _: None)
    print(f"plan: {time.perf_counter() - t0:.3f} s, {len(plan.jobs)} tiles")
    tiling._init_worker(plan.ctx)

    def every_tile() -> tuple[int, dict]:
        todo, cells, times = deque(plan.jobs), 0, {}
        while todo:
            res = tiling.run_tile(todo.popleft())
            cells += len(res["meta"])
            for k, v in res["times"].items():
                times[k] = times.get(k, 0.0) + v
            if res["rest"] is not None:  # a dense tile's part jobs, as the feed makes them
                step = plan.ctx.max_cells
                n = -(-len(res["rest"]) // step)
                for k in reversed(range(n)):
                    chunk = res["rest"][k * step : (k + 1) * step]
                    todo.appendleft((res["tile"], res["x0"], res["y0"], chunk, (k, n)))
        return cells, times

    t0 = time.perf_counter()
    every_tile()
    print(f"first pass (opens the slide, imports): {time.perf_counter() - t0:.3f} s")
    c0, t0 = time.process_time(), time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    cells, times = every_tile()
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stages = {k: round(v, 3) for k, v in times.items()}
    print(f"profiled pass: {cells} cells, {wall:.3f} s wall, {cpu:.3f} s CPU, stages {stages}")
    return prof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("main", "worker"))
    ap.add_argument("slide", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--patch-size", type=int, default=192)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--stats", type=Path, help="also write the raw cProfile stats here")
    args = ap.parse_args()
    os.environ.setdefault("CYTO_PROGRESS", "0")
    prof = profile_main(args) if args.what == "main" else profile_worker(args)
    if args.stats:
        prof.dump_stats(args.stats)
    order = "cumulative" if args.what == "main" else "tottime"
    pstats.Stats(prof).strip_dirs().sort_stats(order).print_stats(args.top)


if __name__ == "__main__":
    main()
