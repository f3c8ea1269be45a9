"""Exported path vs training path, side by side in one run (issue: export).

1. ResNet18 encoder (Deep SVDD bundle, no bias, 1 seed, original view only): patches/s of
   PyTorch eager fp32 vs ONNX Runtime (CPU) on uint8 patches, at batch 64 and 256 and at input
   192 and 224 px. Warm-up first, median of repeats.
2. The OC-SVM scorer: numba kernel vs sklearn's decision_function vs the plain numpy reference,
   on N queries x 512 dims with about 1,000 support vectors.

    python benchmarks/speed/export_bench.py [--queries 100000] [--repeats 3]

Results: benchmarks/results/export_<host>_<date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()  # warm-up (numba compile, ORT graph optimizations, allocator)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_bundle(tmp: Path, input_size: int) -> Path:
    from cyto.bench.models import architecture_bundle

    return architecture_bundle(tmp / f"r18-{input_size}.cyto", "resnet18", input_size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = ap.parse_args()

    from cyto.runtime import load_scorer
    from cyto.runtime.heads import ocsvm

    rows = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for size in (192, 224):
            path = make_bundle(Path(tmp), size)
            torch_scorer = load_scorer(path, "torch", "cpu")
            ort_scorer = load_scorer(path, "onnx", "cpu")
            for batch in (64, 256):
                x = rng.integers(0, 256, size=(batch, size, size, 3), dtype=np.uint8)
                t_torch = timed(lambda x=x, b=batch, s=torch_scorer: s.score(x, b), args.repeats)
                t_ort = timed(lambda x=x, b=batch, s=ort_scorer: s.score(x, b), args.repeats)
                row = {
                    "bench": "encoder",
                    "model": "resnet18",
                    "size": size,
                    "batch": batch,
                    "torch_eager_fp32_per_s": round(batch / t_torch, 1),
                    "onnxruntime_cpu_per_s": round(batch / t_ort, 1),
                    "ratio_ort_over_torch": round(t_torch / t_ort, 2),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)

    from sklearn.svm import OneClassSVM

    train = rng.normal(size=(10_000, 512)) / np.sqrt(512)
    svm = OneClassSVM(kernel="rbf", nu=0.1, gamma="auto").fit(train)
    q = rng.normal(size=(args.queries, 512)) / np.sqrt(512)
    sv, coef = svm.support_vectors_, svm.dual_coef_.ravel()
    gamma, rho = float(svm._gamma), float(-svm.intercept_[0])
    t_nb = timed(lambda: ocsvm.ocsvm_scores(q, sv, coef, gamma, rho), args.repeats)
    t_sk = timed(lambda: svm.decision_function(q), 1)
    sub = q[:2000]
    t_ref = timed(lambda: ocsvm.ocsvm_scores_ref(sub, sv, coef, gamma, rho), 1) * len(q) / 2000
    diff = float(
        np.abs(
            ocsvm.ocsvm_scores(q[:5000], sv, coef, gamma, rho) + svm.decision_function(q[:5000])
        ).max()
    )
    row = {
        "bench": "ocsvm",
        "queries": len(q),
        "dims": 512,
        "support_vectors": len(sv),
        "numba_per_s": round(len(q) / t_nb),
        "sklearn_per_s": round(len(q) / t_sk),
        "numpy_reference_per_s": round(len(q) / t_ref),
        "ratio_numba_over_sklearn": round(t_sk / t_nb, 1),
        "max_abs_diff_vs_sklearn": diff,
    }
    rows.append(row)
    print(json.dumps(row), flush=True)

    cmd = "python benchmarks/speed/export_bench.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k != "out"
    )
    meta = machine(cmd)
    lines = [
        f"# Exported path vs training path ({meta['cpu_count']} CPUs, {meta['host']})",
        "",
        f"`{meta['command']}`",
        "",
        "| input | batch | PyTorch eager fp32 (patches/s) | ONNX Runtime CPU (patches/s) | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r["bench"] == "encoder":
            lines.append(
                f"| {r['size']} px | {r['batch']} | {r['torch_eager_fp32_per_s']} | "
                f"{r['onnxruntime_cpu_per_s']} | {r['ratio_ort_over_torch']}x |"
            )
    o = rows[-1]
    lines += [
        "",
        f"OC-SVM, {o['queries']:,} queries x 512 dims, {o['support_vectors']} support vectors:",
        "",
        "| scorer | queries/s |",
        "|---|---|",
        f"| numba kernel | {o['numba_per_s']:,} |",
        f"| sklearn | {o['sklearn_per_s']:,} |",
        f"| numpy reference (broadcast) | {o['numpy_reference_per_s']:,} |",
        "",
        f"numba / sklearn = {o['ratio_numba_over_sklearn']}x; max |difference| "
        f"{o['max_abs_diff_vs_sklearn']:.2e}.",
    ]
    write(args.out, "export", meta, rows, lines)


if __name__ == "__main__":
    main()
