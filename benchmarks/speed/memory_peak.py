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

Several sides in one run (``--side 4096 8192 16384 32768``) give one table, smallest first; the
table is rewritten after every slide, so a run stopped part-way keeps the rows it finished.
``--mosaic 100`` keeps cyto score's default review mosaic (the default here is none, as in the
first runs); the mosaic's crops are part of what the main process holds.
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
    ap.add_argument("--side", type=int, nargs="+", default=[8192], help="one or more sides (px)")
    ap.add_argument("--backbone", default="smallcnn")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--big-gib", type=float, default=0, help="add a row: the sparse slide + a hole")
    ap.add_argument("--input-size", type=int, default=224, help="the model's crop side (px)")
    ap.add_argument(
        "--model", type=Path, help="score with this bundle instead (e.g. a fast Deep SVDD)"
    )
    ap.add_argument("--mosaic", type=int, default=0, help="cells in the review mosaic (0: none)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = ap.parse_args()

    from cyto.bench.models import architecture_bundle

    sides = sorted(set(args.side))
    cmd = "python benchmarks/speed/memory_peak.py " + " ".join(sys.argv[1:])
    meta = machine(cmd)
    name = "memory_peak_" + "-".join(str(s) for s in sides)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = args.model or architecture_bundle(work / "m.cyto", args.backbone, args.input_size)
        for side in sides:
            for name_, slide in side_slides(work, side, args):
                out = work / f"{side}-{name_.split()[0].strip(':')}"
                s = score_summary(
                    slide, model, out, "--workers", str(args.workers), "--mosaic", str(args.mosaic)
                )
                crowding = s["detection_crowding"] or {}
                row = {
                    "slide": f"{name_}, {side}x{side}",
                    "side": side,
                    "cells": s["cells_scored"],
                    "cells_per_s": s["cells_per_s"],
                    "main_peak_mb": s["peak_rss_mb"],
                    "worker_peak_mb": s["peak_rss_workers_mb"],
                    "others_per_crop": crowding.get("median_others_per_crop"),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                write(args.out, name, meta, rows, table(cmd, meta, args, rows))
            for f in work.glob(f"{side}-*.tif"):
                f.unlink()  # a 32768^2 slide is GiBs: keep one size on disk at a time


def side_slides(work: Path, side: int, args: argparse.Namespace) -> list[tuple[str, Path]]:
    """The sparse and dense slides (and the big file, with ``--big-gib``) of one side."""
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    sparse = write_slide(
        work / f"{side}-sparse.tif", SlideSynthConfig(width=side, height=side, seed=3)
    ).paths[0]
    dense = dense_slide(args.dense_from, side, work / f"{side}-dense.tif")
    slides = [("sparse synthetic smear", sparse), ("dense real H&E", dense)]
    if args.big_gib:
        big = work / f"{side}-big.tif"
        big.write_bytes(sparse.read_bytes())
        with open(big, "r+b") as fh:
            fh.truncate(big.stat().st_size + int(args.big_gib * 2**30))
        size = big.stat().st_size / 2**30
        slides.append((f"big file: the sparse smear + a hole, {size:.2f} GiB", big))
    return slides


def model_words(args: argparse.Namespace) -> str:
    if args.model is None:
        return f"{args.backbone} at {args.input_size} px (random weights)"
    from cyto.bundle import load_bundle

    spec = load_bundle(args.model).spec
    return (
        f"{args.model.name}: {spec.method}, {spec.backbone} at {spec.input_size} px, "
        f"{spec.n_seeds} seed(s) x {len(spec.tta_views)} view(s)"
    )


def table(cmd: str, meta: dict, args: argparse.Namespace, rows: list[dict]) -> list[str]:
    mosaic = f"a {args.mosaic}-cell mosaic" if args.mosaic else "no mosaic"
    lines = [
        "# Peak memory of cyto score, sparse vs dense",
        "",
        where(cmd, meta, "cpu") + f"; {model_words(args)}, {args.workers} worker(s), {mosaic}",
        "",
        "| slide | cells | cells/s | main peak MB | worker peak MB | other detections per crop |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['slide']} | {r['cells']} | {r['cells_per_s']} | {r['main_peak_mb']} | "
            f"{r['worker_peak_mb']} | {r['others_per_crop']} |"
        )
    return lines


if __name__ == "__main__":
    main()
