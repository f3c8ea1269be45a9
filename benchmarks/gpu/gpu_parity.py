"""Ranking parity of the GPU paths against ONNX Runtime fp32 on the CPU, on real cells.

Each method is trained (``--preset``, on ``--device``) on half of the normal cells of a split
(``train_bone_marrow.split``), exported, and scores the other half plus the held-out abnormal
cells through:

- ``onnx-cpu-fp32``: ONNX Runtime on the CPU, ``encoder.onnx`` (the reference);
- ``torch-<device>-fp32``: the PyTorch backend on the device (TF32 off);
- ``torch-<device>-fp16``: the PyTorch backend with fp16 autocast (CUDA only);
- ``onnx-cpu-fp16``: the exported fp16 graph in ONNX Runtime on the CPU.

Reported per path: Spearman, top-1%/top-10% overlap and max relative difference against the
reference, AUROC of both, and cells/s of the scoring call (after one warm-up call).

    python benchmarks/gpu/gpu_parity.py --data ../shared/data/bone_marrow --normal LYT \\
        --abnormal BLA,PMO,EOS,MON --seeds 0,1 --device cuda
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "science"))  # train_bone_marrow
from _results import machine, mean_sd, where, write  # noqa: E402
from train_bone_marrow import (  # noqa: E402
    append_row,
    command_line,
    common_parser,
    common_settings,
    split,
    train_data,
)


def paths_for(device: str) -> list[tuple[str, str, str, str]]:
    """(label, backend, device, precision) of every path measured."""
    out = [("onnx-cpu-fp32", "onnx", "cpu", "fp32"), ("onnx-cpu-fp16", "onnx", "cpu", "fp16")]
    out.append((f"torch-{device.split(':')[0]}-fp32", "torch", device, "fp32"))
    if device.startswith("cuda"):
        out.append(("torch-cuda-fp16", "torch", device, "fp16"))
    return out


def timed_scores(scorer, images: np.ndarray, batch: int) -> tuple[np.ndarray, float]:
    scorer.score(images[:batch], batch_size=batch)  # warm-up: allocator, cuDNN autotune
    t0 = time.perf_counter()
    scores = scorer.score(images, batch_size=batch)
    return scores, len(images) / (time.perf_counter() - t0)


def run(args) -> tuple[list[dict], list[str]]:
    from cyto.bundle import save_bundle
    from cyto.data.dataset import PatchDataset
    from cyto.export.onnx import export_onnx
    from cyto.export.quantize import Cells, export_variant, ranking_parity
    from cyto.runtime.scorer import load_scorer
    from cyto.train.config import resolve_config
    from cyto.train.registry import get_method, method_names

    dev, preset, seeds, overrides = common_settings(args)
    device = str(dev)
    methods = [m for m in args.methods.split(",") if m] or method_names()
    size = resolve_config(get_method(methods[0]).Config, preset, overrides=overrides).load_size
    ds = PatchDataset.from_path(args.data, normal=args.normal, abnormal=args.abnormal, size=size)
    images = np.asarray(ds.images)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            tr_n, tr_a, test = split(ds, seed)
            y = ds.labels[test].astype(np.int8)
            for name in methods:
                cls = get_method(name)
                cfg = resolve_config(cls.Config, preset, overrides={**overrides, "seed": seed})
                data = train_data(cls, ds, images, tr_n, tr_a, seed)
                t0 = time.perf_counter()
                model = cls(cfg).fit(data, device=device)
                fit_s = time.perf_counter() - t0
                path = save_bundle(
                    Path(tmp) / f"{name}-{seed}.cyto", *model.bundle_parts(data), overwrite=True
                )
                export_onnx(path)
                held = Cells(images[test], y, f"{args.data.name} held-out half", ds.fingerprint)
                export_variant(path, "fp16", None, held, accept_loss=True, echo=lambda m: None)
                ref = None
                for label, backend, dev, precision in paths_for(device):
                    scorer = load_scorer(path, backend, dev, precision)
                    scores, rate = timed_scores(scorer, images[test], args.batch)
                    scorer.backend.close()
                    if ref is None:
                        ref = scores
                    p = ranking_parity(ref, scores, y)
                    row = {
                        "method": name,
                        "seed": seed,
                        "path": label,
                        "cells": p["cells"],
                        "spearman": round(p["spearman"], 6),
                        "top1_overlap": round(p["top1_overlap"], 3),
                        "top10_overlap": round(p["top10_overlap"], 3),
                        "max_rel_diff": float(f"{p['max_rel_diff']:.3g}"),
                        "auroc_ref": round(p["auroc_fp32"], 4),
                        "auroc": round(p["auroc_quantized"], 4),
                        "cells_per_s": round(rate, 1),
                        "fit_s": round(fit_s, 1),
                    }
                    rows.append(row)
                    append_row(args.jsonl, row)
    lines = [
        f"Training and GPU paths on `{device}`; reference: ONNX Runtime fp32 on the CPU. "
        f"{len(rows) and rows[0]['cells']} held-out cells per split, batch {args.batch}.",
        "",
        "| method | path | Spearman | top-1% | top-10% | max rel diff | AUROC ref -> path "
        "| cells/s |",
        "|---|---|---|---|---|---|---|---|",
    ]

    for name in methods:
        for label in dict.fromkeys(r["path"] for r in rows):
            got = [r for r in rows if r["method"] == name and r["path"] == label]
            if not got:
                continue
            lines.append(
                f"| {name} | {label} | {mean_sd((r['spearman'] for r in got), '{:.5f}')} | "
                f"{mean_sd((r['top1_overlap'] for r in got), '{:.3f}')} | "
                f"{mean_sd((r['top10_overlap'] for r in got), '{:.3f}')} | "
                f"{max(r['max_rel_diff'] for r in got):.2g} | "
                f"{mean_sd(r['auroc_ref'] for r in got)} -> {mean_sd(r['auroc'] for r in got)} | "
                f"{mean_sd((r['cells_per_s'] for r in got), '{:.0f}')} |"
            )
    return rows, lines


def main() -> None:
    ap = common_parser(__doc__)
    ap.add_argument("--methods", default="")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    rows, table = run(args)
    cmd = command_line("gpu/gpu_parity.py", args)
    meta = machine(cmd)
    lines = ["# GPU paths: ranking parity on real cells", "", where(cmd, meta, args.device), ""]
    write(args.out, "gpu_parity", meta, rows, [*lines, *table])


if __name__ == "__main__":
    main()
