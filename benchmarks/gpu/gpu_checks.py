"""What only a CUDA GPU can show, in one run (results as JSON and Markdown):

1. Training on CUDA: Deep SVDD with the fast preset, mixed precision and channels_last, on
   synthetic patches; held-out AUROC and the time per run.
2. Inference parity of the CUDA paths against the exported CPU path (ONNX Runtime + numba):
   PyTorch CUDA fp32 and fp16 (autocast) on the same patches: max relative score difference,
   Spearman rank correlation, and overlap of the top 10% cells.
3. `cyto score` on a synthetic slide with ``--device cuda --backend torch`` against
   ``--device cpu --backend onnx``: the same cells and the same scores.

    python benchmarks/gpu/gpu_checks.py --model FAST.cyto --out DIR [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402


def agreement(ref: np.ndarray, got: np.ndarray) -> dict:
    from scipy.stats import spearmanr

    k = max(1, len(ref) // 10)
    top_ref = set(np.argsort(-ref)[:k].tolist())
    top_got = set(np.argsort(-got)[:k].tolist())
    return {
        "max_rel_diff": float(np.max(np.abs(got - ref) / (np.abs(ref) + 1e-6))),
        "spearman": float(spearmanr(ref, got).statistic),
        "top10pct_overlap": len(top_ref & top_got) / k,
    }


def device_scores(bundle: Path, patches: np.ndarray, fp16: bool, device: str) -> np.ndarray:
    """PyTorch on ``device`` (fp16 by autocast when asked), then the bundle's head."""
    from cyto.runtime import load_scorer

    return load_scorer(bundle, "torch", device, "fp16" if fp16 else "fp32").score(patches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="exported fast Deep SVDD bundle")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("gpu-work"))
    ap.add_argument("--device", default="cuda", help="cpu only to try the script itself")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: these checks need one")
    dev = args.device
    args.work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    # 1. training on CUDA
    from sklearn.metrics import roc_auc_score

    from cyto.data.synth.patches import PatchSynthConfig, write_patches
    from cyto.runtime import load_scorer
    from cyto.train.api import train

    data = args.work / "patches"
    write_patches(data, PatchSynthConfig(n_normal=300, n_abnormal=20, seed=1), overwrite=True)
    t0 = time.perf_counter()
    res = train(
        "dsvdd",
        data,
        args.work / "cuda.cyto",
        normal="normal",
        preset="fast",
        overrides={"mpp": 0.12},
        device=dev,
        overwrite=True,
    )
    held = args.work / "held"
    write_patches(held, PatchSynthConfig(n_normal=100, n_abnormal=15, seed=9), overwrite=True)
    from cyto.data.dataset import PatchDataset

    ds = PatchDataset.from_path(held, normal="normal", size=res.config.load_size)
    scores = load_scorer(res.bundle, "torch", dev).score(np.asarray(ds.images))
    rows.append(
        {
            "check": f"train dsvdd fast on {dev} (AMP and channels_last on CUDA)",
            "seconds": round(time.perf_counter() - t0, 1),
            "held_out_auroc": round(float(roc_auc_score(ds.labels, scores)), 3),
            "final_loss": {k: v[-1] for k, v in res.history.items() if k.startswith("dsvdd")},
        }
    )
    print(json.dumps(rows[-1]), flush=True)

    # 2. inference parity: CUDA fp32 / fp16 vs the exported CPU path
    from cyto.bench.models import architecture_bundle
    from cyto.runtime import load_scorer

    paper = architecture_bundle(args.work / "paper.cyto", "resnet18", 224)
    for name, bundle in (("fast dsvdd (trained)", args.model), ("resnet18-224 (random)", paper)):
        b = load_scorer(bundle, "onnx", "cpu")
        size = b.spec.crop_size
        # seeded random patches: enough to compare the numbers two backends compute
        patches = np.random.default_rng(3).integers(0, 256, (512, size, size, 3), dtype=np.uint8)
        ref = b.score(patches, 128)
        for fp16 in (False, True) if dev == "cuda" else (False,):
            got = device_scores(bundle, patches, fp16, dev)
            row = {"check": f"{name}: torch {dev} {'fp16' if fp16 else 'fp32'} vs onnxruntime cpu"}
            row.update(agreement(ref, got))
            rows.append(row)
            print(json.dumps(row), flush=True)

    # 3. cyto score on the GPU vs on the CPU
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.infer import ScoreOptions, score_slide

    slide = write_slide(
        args.work / "slide.ndpi",
        SlideSynthConfig(width=4096, height=4096, seed=2, abnormal_fraction=0.02),
        overwrite=True,
    )
    import pyarrow.parquet as pq

    out = {}
    for name, d, backend in (("ref", "cpu", "onnx"), ("dev", dev, "torch")):
        s = score_slide(
            slide.paths[0],
            args.model,
            args.work / f"score-{name}",
            ScoreOptions(mosaic=0, device=d, backend=backend, truth=slide.ground_truth),
        )
        out[name] = (pq.read_table(args.work / f"score-{name}" / "scores.parquet"), s)
    a, b2 = out["ref"][0], out["dev"][0]
    row = {
        "check": f"cyto score: {dev} torch vs cpu onnx on a 4096^2 synthetic slide",
        "cells_cpu_onnx": a.num_rows,
        "cells_torch": b2.num_rows,
        "same_cells": a.num_rows == b2.num_rows
        and bool(np.array_equal(np.asarray(a["x"]), np.asarray(b2["x"]))),
        "cells_per_s_cpu_onnx": out["ref"][1]["cells_per_s"],
        "cells_per_s_torch": out["dev"][1]["cells_per_s"],
        "recall_at_k_cpu_onnx": out["ref"][1]["truth"]["planted_recall_at_k"],
        "recall_at_k_torch": out["dev"][1]["truth"]["planted_recall_at_k"],
    }
    row.update(agreement(np.asarray(a["score"]), np.asarray(b2["score"])))
    rows.append(row)
    print(json.dumps(row), flush=True)

    meta = machine("python benchmarks/gpu/gpu_checks.py " + " ".join(sys.argv[1:]))
    where = meta["gpu"]["name"] if meta.get("gpu") else f"CPU ({meta['cpu']})"
    lines = [f"# GPU checks on {where}", "", f"`{meta['command']}`", ""]
    lines += [f"- {json.dumps(r)}" for r in rows]
    write(args.out, "gpu_checks", meta, rows, lines)


if __name__ == "__main__":
    main()
