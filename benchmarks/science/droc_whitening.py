"""DROC with and without whitening the embeddings before the OC-SVM, on the same encoder.

Why DROC's fast preset whitens (see cyto.train.droc): for each seed, one encoder is trained by
contrastive learning on the training normals of the split of ``train_bone_marrow.py``; then the
paper's OC-SVM (RBF, nu=0.1, gamma='auto') is fitted twice, on the raw embeddings and on the
Ledoit-Wolf-whitened ones, and both rank the same held-out cells. Usage:

    python benchmarks/science/droc_whitening.py --data ../shared/data/bone_marrow \\
        --normal LYT --abnormal BLA,PMO,EOS,MON --preset fast --seeds 0,1,2

``--preset paper`` trains the paper's recipe (ResNet18, 224 px, 100 epochs: a GPU job).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from cyto.data.dataset import PatchDataset
from cyto.train.config import resolve_config
from cyto.train.data import TrainData
from cyto.train.droc import DROC, DROCConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, mean_sd, where, write  # noqa: E402
from train_bone_marrow import (  # noqa: E402
    append_row,
    command_line,
    common_parser,
    common_settings,
    split,
)


def main() -> None:
    args = common_parser(__doc__).parse_args()
    device, preset, seeds, overrides = common_settings(args)
    load_size = resolve_config(DROCConfig, preset, overrides=overrides).load_size
    ds = PatchDataset.from_path(
        args.data, normal=args.normal, abnormal=args.abnormal, size=load_size
    )
    images = np.asarray(ds.images)
    rows = []
    for seed in seeds:
        tr_n, _, test = split(ds, seed)
        y = ds.labels[test].astype(int)
        k = int(y.sum())
        cfg = resolve_config(DROCConfig, preset, overrides={**overrides, "seed": seed, "whiten": 0})
        t0 = time.perf_counter()
        raw = DROC(cfg).fit(TrainData(images[tr_n], ds.labels[tr_n]), device=device)
        fit_s = time.perf_counter() - t0
        white = copy.deepcopy(raw)
        white.fit_scorer(images[tr_n], whiten=True)
        row = {"seed": seed, "n_test": len(test), "k": k, "fit_seconds": round(fit_s, 1)}
        for name, model in (("raw", raw), ("whitened", white)):
            s = model.score(images[test])
            top = np.argsort(-s, kind="stable")[:k]
            row[f"auroc_{name}"] = round(float(roc_auc_score(y, s)), 4)
            row[f"recall_at_k_{name}"] = round(float(y[top].mean()), 4)
        row["shrinkage"] = round(white.whitening_["shrinkage"], 4)
        rows.append(row)
        append_row(args.jsonl, row)

    cmd = command_line("science/droc_whitening.py", args)
    meta = machine(cmd) | {"device_used": str(device)}

    def ms(key: str) -> str:
        return mean_sd((r[key] for r in rows), "{:.3f}")

    k = rows[0]["k"]
    lines = [
        f"# DROC ({args.preset} preset): OC-SVM on raw vs whitened embeddings, same encoder",
        "",
        where(cmd, meta, device),
        "",
        f"| seed | AUROC raw | AUROC whitened | Recall@{k} raw | Recall@{k} whitened | fit (s) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['seed']} | {r['auroc_raw']:.3f} | {r['auroc_whitened']:.3f} | "
        f"{r['recall_at_k_raw']:.3f} | {r['recall_at_k_whitened']:.3f} | {r['fit_seconds']:.0f} |"
        for r in rows
    ]
    lines.append(
        f"| mean | {ms('auroc_raw')} | {ms('auroc_whitened')} | {ms('recall_at_k_raw')} | "
        f"{ms('recall_at_k_whitened')} | |"
    )
    tag = f"droc_whitening_{args.preset}" + ("" if device.type == "cpu" else f"_{device.type}")
    write(args.out, tag, meta, rows, lines)


if __name__ == "__main__":
    main()
