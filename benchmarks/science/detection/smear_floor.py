"""The smear preset's threshold floor on pale slides (hostile round 66, 8): the haematoxylin
threshold of an MGG smear is the slide's Otsu cut with a floor, an optical density below which
nothing is nucleus. On a pale synthetic slide (seed 3 of the tutorials' negatives) the floor
(0.08) lay above the slide's own cut (0.044): half the nuclei were split in two or missed.

For each seed of a block, a synthetic MGG smear (``cyto synth slide``, its truth table) is read
as ``cyto score`` reads it (the slide's one threshold over its tissue windows, each tile with a
margin) under each floor, and the detections are matched to the drawn cells within 15 px
(1.8 um): recall (cells found), precision (detections on a cell), the detections per cell.
Choices are made on ``--block dev`` (seeds 1-12); ``--block final`` (seeds 101-112) was read
once, for the rule chosen (``floor_share`` 0.6) against the fixed floor (``--floor-share 0``).

    PYTHONPATH=src python benchmarks/science/detection/smear_floor.py --block dev --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import numpy as np

BLOCKS = {"dev": range(1, 13), "final": range(101, 113)}
FLOORS = (0.08, 0.06, 0.05, 0.04, 0.03, 0.02)
MATCH_PX = 15


def detect_slide(path: Path, params) -> tuple[np.ndarray, float | None]:
    from cyto.detect import detect_in_region
    from cyto.infer.tiling import slide_threshold_of
    from cyto.slides.grid import tile_grid, tissue_mask
    from cyto.slides.readers import open_slide

    reader = open_slide(path)
    mask, ds = tissue_mask(reader)
    t = slide_threshold_of(reader, params, mask, ds)
    at = dataclasses.replace(params, threshold=t)
    info = reader.info
    tile, margin = 512, 64
    found = [
        detect_in_region(reader, x0, y0, min(tile, info.width - x0), min(tile, info.height - y0),
                         margin, at)
        for _, x0, y0 in tile_grid(info.width, info.height, tile, mask, ds)
    ]  # fmt: skip
    found = [f for f in found if len(f)]
    return (np.concatenate(found) if found else np.empty((0, 3))), t


def match(truth: np.ndarray, found: np.ndarray) -> dict:
    from scipy.spatial import cKDTree

    if len(found) == 0:
        return {"recall": 0.0, "precision": float("nan"), "per_cell": 0.0}
    d, i = cKDTree(truth).query(found[:, :2])
    ok = d <= MATCH_PX
    return {
        "recall": len(set(i[ok])) / len(truth),
        "precision": float(ok.mean()),
        "per_cell": len(found) / len(truth),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block", choices=sorted(BLOCKS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--side", type=int, default=3072, help="slide side in px")
    ap.add_argument("--floors", default=",".join(map(str, FLOORS)))
    ap.add_argument("--extent", type=float, default=None, help="smear_extent (0.1: mostly glass)")
    ap.add_argument("--n-cells", type=int, default=None, help="nucleated cells (few: sparse)")
    ap.add_argument("--seeds", type=int, default=None, help="the block's first N seeds only")
    ap.add_argument(
        "--floor-share",
        type=float,
        default=None,
        help="NucleusParams.floor_share (0: the fixed floor of cyto before it; default: cyto's)",
    )
    args = ap.parse_args()
    import pyarrow.parquet as pq

    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.detect import NucleusParams

    floors = [float(f) for f in args.floors.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    extra = {k: v for k, v in (("smear_extent", args.extent), ("n_cells", args.n_cells)) if v}
    for seed in list(BLOCKS[args.block])[: args.seeds]:
        cfg = SlideSynthConfig(width=args.side, height=args.side, seed=seed, **extra)
        made = write_slide(args.out / f"s{seed}.tif", cfg)
        t = pq.read_table(made.ground_truth)
        truth = np.column_stack([t["x"].to_numpy(), t["y"].to_numpy()])
        for floor in floors:
            t0 = time.perf_counter()
            share = {} if args.floor_share is None else {"floor_share": args.floor_share}
            params = NucleusParams(min_threshold=floor, **share)
            found, thr = detect_slide(made.paths[0], params)
            row = {"seed": seed, "floor": floor, "threshold": thr, "cells": len(truth),
                   **match(truth, found),
                   "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        made.paths[0].unlink()
    share = NucleusParams().floor_share if args.floor_share is None else args.floor_share
    print(
        f"# block {args.block}, side {args.side}, {extra or 'default smear'}, floor_share {share}"
    )
    (args.out / f"{args.block}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"# {platform.processor() or platform.machine()}")
    for floor in floors:
        got = [r for r in rows if r["floor"] == floor]
        rec = np.array([r["recall"] for r in got])
        pre = np.array([r["precision"] for r in got])
        per = np.array([r["per_cell"] for r in got])
        print(
            f"floor {floor:.2f}: recall {rec.mean():.3f} +- {rec.std(ddof=1):.3f} "
            f"(min {rec.min():.3f}), "
            f"precision {pre.mean():.3f} +- {pre.std(ddof=1):.3f} (min {pre.min():.3f}), "
            f"detections per cell {per.mean():.3f} (max {per.max():.3f})"
        )


if __name__ == "__main__":
    main()
