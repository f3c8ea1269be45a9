"""Peak memory of `cyto score` on a sparse and a dense slide (issue: bounded memory at any
density and file size).

Two slides of the same size: a synthetic cytology smear (sparse: about one cell per crop), and a
real H&E region (``--dense-from``, e.g. ../shared/data/wsi/cmu1_small_region.svs) tiled to that
size, where a 192 px crop holds about 20 detections. Both are scored in one run with a 224 px
model (random weights: memory and speed do not depend on them) and one worker; each row gives the
main process's and the worker's peak resident memory (VmHWM), the cells and cells/s. With
``--big-gib N`` a third row scores the sparse slide's file followed by an N GiB hole (a sparse
file: N GiB on the file system, nothing on disk), which must cost no more memory than the slide.

    python benchmarks/speed/memory_peak.py --dense-from ../shared/data/wsi/cmu1_small_region.svs \\
        --side 8192 [--big-gib 4] [--backbone smallcnn] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, score_summary, where, write  # noqa: E402


def dense_slide(src: Path, side: int, out: Path) -> Path:
    """``src``'s first 2048 px square tiled to ``side`` x ``side``: a pyramidal zlib TIFF."""
    import numpy as np
    import tifffile

    from cyto.slides import open_slide

    reader = open_slide(src)
    mpp = reader.info.mpp or 0.5
    block = reader.read_region(0, 0, 2048, 2048)
    reader.close()
    reps = -(-side // 2048)
    img = np.tile(block, (reps, reps, 1))[:side, :side]
    res = 1e4 / mpp  # pixels per cm
    with tifffile.TiffWriter(out) as tw:
        tw.write(
            img,
            tile=(512, 512),
            compression="zlib",
            photometric="rgb",
            resolution=(res, res),
            resolutionunit="CENTIMETER",
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dense-from", type=Path, required=True, help="a real H&E slide (SVS)")
    ap.add_argument("--side", type=int, default=8192)
    ap.add_argument("--backbone", default="smallcnn")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--big-gib", type=float, default=0, help="add a row: the sparse slide + a hole")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = ap.parse_args()

    from cyto.bench.models import architecture_bundle
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = architecture_bundle(work / "m.cyto", args.backbone, 224)
        sparse = write_slide(
            work / "sparse.tif", SlideSynthConfig(width=args.side, height=args.side, seed=3)
        ).paths[0]
        dense = dense_slide(args.dense_from, args.side, work / "dense.tif")
        slides = [("sparse synthetic smear", sparse), ("dense real H&E", dense)]
        if args.big_gib:
            big = work / "big.tif"
            big.write_bytes(sparse.read_bytes())
            with open(big, "r+b") as fh:
                fh.truncate(big.stat().st_size + int(args.big_gib * 2**30))
            size = big.stat().st_size / 2**30
            slides.append((f"big file: the sparse smear + a hole, {size:.2f} GiB", big))
        for name, slide in slides:
            out = work / name.split()[0].strip(":")
            s = score_summary(slide, model, out, "--workers", str(args.workers))
            row = {
                "slide": f"{name}, {args.side}x{args.side}",
                "cells": s["cells_scored"],
                "cells_per_s": s["cells_per_s"],
                "main_peak_mb": s["peak_rss_mb"],
                "worker_peak_mb": s["peak_rss_workers_mb"],
                "others_per_crop": (s["detection_crowding"] or {}).get("median_others_per_crop"),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    cmd = "python benchmarks/speed/memory_peak.py " + " ".join(sys.argv[1:])
    meta = machine(cmd)
    lines = [
        "# Peak memory of cyto score, sparse vs dense",
        "",
        where(cmd, meta, "cpu") + f"; {args.backbone} at 224 px, {args.workers} worker(s)",
        "",
        "| slide | cells | cells/s | main peak MB | worker peak MB | other detections per crop |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['slide']} | {r['cells']} | {r['cells_per_s']} | {r['main_peak_mb']} | "
            f"{r['worker_peak_mb']} | {r['others_per_crop']} |"
        )
    write(args.out, "memory_peak", meta, rows, lines)


if __name__ == "__main__":
    main()
