"""fp32 vs int8 (and fp16) graphs: speed in ONNX Runtime on this CPU, and ranking parity of every
method on real cells.

Speed (``--part speed``): the paper's networks at 224 px with random weights (speed does not
depend on what the weights learned): FS-SIL (ResNet18, softmax head) and Deep SVDD (ResNet18,
``--dsvdd-seeds`` seeds x 4 test-time views per cell). The int8 graphs are calibrated on real
normal cells (``--data``, ``--normal``); on a CPU ONNX Runtime runs the ``int8-cpu`` form.
Patches/s per batch size come from ``cyto bench engine``'s timing (warm-up, median of repeated
calls), fp32 and int8 side by side in one run.

Pipeline (``--part pipeline``): ``cyto score`` of a real H&E region tiled to ``--side`` px
with a nuclei file holding a 224 px grid (what a patch toolkit scores), fp32 vs int8, one run.

Parity (``--part parity``): every method trained with ``--preset`` on half the normal and
abnormal cells of ``--data`` (as benchmarks/science/train_bone_marrow.py splits them), exported,
then its fp16 and int8 graphs (int8 calibrated on the training normals with each
``--methods-calib`` method) compared with fp32 through the full score on the held-out half:
Spearman, top-1% and top-10% overlap, and the AUROC / Recall@K each graph gives. Seeds draw their
own splits.

    python benchmarks/speed/quantize_bench.py --part speed --data ../shared/data/bone_marrow \\
        --normal LYT
    python benchmarks/speed/quantize_bench.py --part pipeline --data ../shared/data/bone_marrow \
        --normal LYT --slide-from ../shared/data/wsi/cmu1_small_region.svs --side 16384
    python benchmarks/speed/quantize_bench.py --part parity --data ../shared/data/bone_marrow \\
        --normal LYT --abnormal BLA,PMO,EOS,MON --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "science"))  # train_bone_marrow
from _results import machine, mean_sd, score_summary, where, write  # noqa: E402
from train_bone_marrow import append_row, split, train_data  # noqa: E402


def speed(args) -> tuple[list[dict], list[str]]:
    from cyto.bench.engine import bench_engine
    from cyto.bench.models import architecture_bundle, classifier_bundle
    from cyto.export.quantize import export_variant, load_cells

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = {
            "fs-sil resnet18-224": classifier_bundle(work / "fs.cyto"),
            f"dsvdd resnet18-224 {args.dsvdd_seeds}x4": architecture_bundle(
                work / "d.cyto", seeds=args.dsvdd_seeds, views=("orig", "hflip", "rot+10", "rot-10")
            ),
        }
        calib = load_cells(args.data, 224, classes=args.normal, limit=args.calib_cells)
        for name, path in models.items():
            t0 = time.perf_counter()
            for key in ("int8", "int8-cpu"):  # the CPU runs the int8-cpu form
                entry = export_variant(
                    path, key, calib, None, args.calib_method, accept_loss=True, echo=print
                )
            print(f"{name}: int8 graphs in {time.perf_counter() - t0:.0f} s", flush=True)
            batches = [int(b) for b in args.batches.split(",")]
            if name.startswith("dsvdd"):
                batches = [b for b in batches if b <= 8]  # 20 passes per cell
            got = bench_engine(
                path,
                ["cpu"],
                ["onnx"],
                ["fp32", "int8"],
                batches,
                repeats=args.repeats,
                budget=args.budget,
            )
            for r in got:
                r["model"] = name
                r["int8_parity_spearman_random_weights"] = entry["parity_vs_fp32"]["spearman"]
            rows += got
    lines = [
        "| model | batch | fp32 patches/s | int8 patches/s | int8 / fp32 |",
        "|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["model"] for r in rows):
        for b in dict.fromkeys(r["batch"] for r in rows if r["model"] == name):
            by = {r["precision"]: r for r in rows if r["model"] == name and r["batch"] == b}
            f, i = by["fp32"]["patches_per_s"], by["int8"]["patches_per_s"]
            lines.append(f"| {name} | {b} | {f} | {i} | {i / f:.2f} |")
    return rows, lines


def pipeline(args) -> tuple[list[dict], list[str]]:
    """`cyto score` end to end, fp32 vs int8: a 224 px grid of cells on a tiled real H&E slide."""
    import json

    from memory_peak import dense_slide

    from cyto.bench.models import classifier_bundle
    from cyto.export.quantize import export_variant, load_cells

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = classifier_bundle(work / "fs.cyto")
        calib = load_cells(args.data, 224, classes=args.normal, limit=args.calib_cells)
        for key in ("int8", "int8-cpu"):
            export_variant(model, key, calib, None, args.calib_method, accept_loss=True)
        slide = dense_slide(args.slide_from, args.side, work / "slide.tif")
        half = 112
        xs = np.arange(half, args.side - half, 224)
        grid = np.array([(x, y) for y in xs for x in xs], dtype=np.float64)
        nuclei = work / "grid.csv"
        nuclei.write_text("x,y\n" + "".join(f"{x:g},{y:g}\n" for x, y in grid))
        for precision in ("fp32", "int8"):
            s = score_summary(
                slide,
                model,
                work / precision,
                "--nuclei",
                str(nuclei),
                "--patch-size",
                "224",
                "--workers",
                str(args.workers),
                "--precision",
                precision,
                "--backend",
                "onnx",
                "--device",
                "cpu",
            )
            row = {
                "precision": precision,
                "cells": s["cells_scored"],
                "seconds": s["seconds"],
                "cells_per_s": s["cells_per_s"],
                "engine_cells_per_s": s["engine_cells_per_s"],
                "pipeline_efficiency": s["pipeline_efficiency"],
                "main_peak_mb": s["peak_rss_mb"],
                "worker_peak_mb": s["peak_rss_workers_mb"],
                "timings_s": s["timings_s"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [
        f"`cyto score` of a {args.side}^2 tiled real H&E slide with a nuclei file of a 224 px grid "
        f"({rows[0]['cells']} cells), FS-SIL-shaped ResNet18 at 224 px, ONNX Runtime on the CPU, "
        f"{args.workers} worker(s):",
        "",
        "| graph | cells/s end to end | engine cells/s | pipeline efficiency | main / worker MB "
        "| engine s | waiting for tiles s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["timings_s"]
        lines.append(
            f"| {r['precision']} | {r['cells_per_s']} | {r['engine_cells_per_s']} | "
            f"{r['pipeline_efficiency']} | {r['main_peak_mb']} / {r['worker_peak_mb']} | "
            f"{t.get('engine', 0):.1f} | {t.get('wait', 0):.1f} |"
        )
    return rows, lines


def parity(args) -> tuple[list[dict], list[str]]:
    from sklearn.metrics import roc_auc_score

    from cyto.bundle import save_bundle
    from cyto.data.dataset import PatchDataset
    from cyto.export.onnx import export_onnx
    from cyto.export.quantize import Cells, export_variant
    from cyto.train.config import resolve_config
    from cyto.train.registry import get_method, method_names

    methods = [m for m in args.methods.split(",") if m] or method_names()
    preset = None if args.preset == "paper" else args.preset
    size = resolve_config(get_method(methods[0]).Config, preset).load_size
    ds = PatchDataset.from_path(args.data, normal=args.normal, abnormal=args.abnormal, size=size)
    images = np.asarray(ds.images)
    # rows a cut-off run appended to --jsonl are kept, and their (method, seed) not trained again
    rows = []
    if args.jsonl is not None and args.jsonl.exists():
        rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
        seeds = {int(s) for s in args.seeds.split(",")}
        rows = [r for r in rows if r["method"] in methods and r["seed"] in seeds]
    done = {(r["method"], r["seed"], r["graph"], r["calibration"]) for r in rows}
    every_graph = [
        (g, m if g.startswith("int8") else None)
        for g in args.graphs.split(",")
        for m in (args.methods_calib.split(",") if g.startswith("int8") else [None])
    ]

    def label(graph: str) -> str:  # int8 graphs with float nodes are other graphs
        return f"{graph} keep {args.keep_float}" if args.keep_float and "int8" in graph else graph

    with tempfile.TemporaryDirectory() as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            tr_n, tr_a, test = split(ds, seed)
            y = ds.labels[test].astype(np.int8)
            held = Cells(images[test], y, f"{args.data.name} held-out half", ds.fingerprint)
            calib = Cells(images[tr_n], None, f"{args.data.name} training normals", ds.fingerprint)
            for name in methods:
                graphs = [g for g in every_graph if (name, seed, label(g[0]), g[1]) not in done]
                if not graphs:
                    continue
                cls = get_method(name)
                cfg = resolve_config(cls.Config, preset, overrides={"seed": seed})
                data = train_data(cls, ds, images, tr_n, tr_a, seed)
                model = cls(cfg).fit(data)
                path = save_bundle(
                    Path(tmp) / f"{name}-{seed}.cyto", *model.bundle_parts(data), overwrite=True
                )
                export_onnx(path)
                for precision, method in graphs:
                    t0 = time.perf_counter()
                    entry = export_variant(
                        path,
                        precision,
                        calib if method else None,
                        held,
                        method or "percentile",
                        accept_loss=True,
                        exclude=tuple(e for e in args.keep_float.split(",") if e),
                        echo=lambda m: None,
                    )
                    p = entry["parity_vs_fp32"]
                    row = {
                        "method": name,
                        "seed": seed,
                        "graph": label(precision),
                        "calibration": method,
                        "cells": p["cells"],
                        "spearman": round(p["spearman"], 5),
                        "top1_overlap": round(p["top1_overlap"], 3),
                        "top10_overlap": round(p["top10_overlap"], 3),
                        "auroc_fp32": round(p["auroc_fp32"], 4),
                        "auroc_quantized": round(p["auroc_quantized"], 4),
                        "recall_at_k_fp32": round(p["recall_at_k_fp32"], 4),
                        "recall_at_k_quantized": round(p["recall_at_k_quantized"], 4),
                        "gate_passed": entry["gate"]["passed"],
                        "seconds": round(time.perf_counter() - t0, 1),
                    }
                    assert abs(roc_auc_score(y, model.score(images[test])) - p["auroc_fp32"]) < 0.01
                    rows.append(row)
                    append_row(args.jsonl, row)
    lines = [
        "| method | graph | Spearman | top-1% | top-10% | AUROC fp32 -> quantized | "
        "Recall@K fp32 -> quantized | gate passed |",
        "|---|---|---|---|---|---|---|---|",
    ]

    for name in methods:
        for g in dict.fromkeys((r["graph"], r["calibration"]) for r in rows):
            got = [r for r in rows if r["method"] == name and (r["graph"], r["calibration"]) == g]
            if not got:
                continue
            label = g[0] + (f" ({g[1]})" if g[1] else "")
            col = {k: mean_sd(r[k] for r in got) for k in got[0] if isinstance(got[0][k], float)}
            lines.append(
                f"| {name} | {label} | {col['spearman']} | {col['top1_overlap']} | "
                f"{col['top10_overlap']} | {col['auroc_fp32']} -> {col['auroc_quantized']} | "
                f"{col['recall_at_k_fp32']} -> {col['recall_at_k_quantized']} | "
                f"{sum(r['gate_passed'] for r in got)}/{len(got)} |"
            )
    return rows, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=("speed", "pipeline", "parity"), required=True)
    ap.add_argument("--slide-from", type=Path, help="pipeline: a real H&E slide to tile")
    ap.add_argument("--side", type=int, default=16384)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--normal", default="LYT")
    ap.add_argument("--abnormal", default=None)
    ap.add_argument("--calib-cells", type=int, default=256)
    ap.add_argument("--calib-method", default="percentile")
    ap.add_argument("--methods-calib", default="percentile,entropy,minmax")
    ap.add_argument("--keep-float", default="", help="parity: int8 nodes or op types kept float")
    ap.add_argument("--graphs", default="fp16,int8,int8-cpu", help="parity: graphs to measure")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--dsvdd-seeds", type=int, default=5)
    ap.add_argument("--methods", default="")
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--jsonl", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = ap.parse_args()
    rows, table = {"speed": speed, "pipeline": pipeline, "parity": parity}[args.part](args)
    cmd = "python benchmarks/speed/quantize_bench.py " + " ".join(sys.argv[1:])
    meta = machine(cmd)
    lines = [f"# fp32 vs quantized graphs: {args.part}", "", where(cmd, meta, "cpu"), "", *table]
    write(args.out, f"quantize_{args.part}", meta, rows, lines)


if __name__ == "__main__":
    main()
