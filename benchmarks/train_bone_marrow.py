"""Train every method with a preset on a real cell-patch dataset and rank held-out cells.

The check of issue 'train the five methods': each method must rank abnormal cells above normal
ones clearly better than chance on held-out cells. Usage (2 CPU cores: about 10 minutes):

    python benchmarks/train_bone_marrow.py --data ../shared/data/bone_marrow \\
        --normal LYT --abnormal BLA,PMO,EOS,MON --preset fast

Split (seeded): half of the normals and half of the abnormals train, the rest are the test pool.
One-class methods (dsvdd, droc) see the training normals only; FS-SIL sees instance labels; WS-SIL
and ItS2CLR see 10 bags of training normals, 5 of which also hold the training abnormals, with bag
labels only. Results go to benchmarks/results/ as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from cyto.data.dataset import PatchDataset
from cyto.train.config import resolve_config
from cyto.train.data import TrainData
from cyto.train.registry import get_method, method_names

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, write  # noqa: E402


def split(ds: PatchDataset, seed: int):
    rng = np.random.default_rng(seed)
    y = ds.labels
    norm, abn = rng.permutation(np.flatnonzero(y == 0)), rng.permutation(np.flatnonzero(y == 1))
    tr_n, te_n = norm[: len(norm) // 2], norm[len(norm) // 2 :]
    tr_a, te_a = abn[: len(abn) // 2], abn[len(abn) // 2 :]
    return tr_n, tr_a, np.concatenate([te_n, te_a])


def bags_for(tr_n: np.ndarray, tr_a: np.ndarray, seed: int, n_bags: int = 10):
    rng = np.random.default_rng(seed + 1)
    idx = np.concatenate([tr_n, tr_a])
    bag = np.empty(len(idx), dtype=object)
    bag[: len(tr_n)] = [f"bag{i % n_bags}" for i in rng.permutation(len(tr_n))]
    bag[len(tr_n) :] = [f"bag{i % (n_bags // 2)}" for i in rng.permutation(len(tr_a))]
    bag_label = np.array([1 if int(b[3:]) < n_bags // 2 else 0 for b in bag], dtype=np.int8)
    return idx, bag, bag_label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--normal", default="LYT")
    ap.add_argument("--abnormal", default=None)
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--methods", default=",".join(method_names()))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    load_size = {resolve_config(get_method(m).Config, args.preset).load_size for m in methods}
    if len(load_size) != 1:
        raise SystemExit(f"methods disagree on load_size: {load_size}")
    ds = PatchDataset.from_path(
        args.data, normal=args.normal, abnormal=args.abnormal, size=load_size.pop()
    )
    images = np.asarray(ds.images)
    tr_n, tr_a, test = split(ds, args.seed)
    y_test = ds.labels[test].astype(int)
    k = int(y_test.sum())
    rows = []
    for name in methods:
        cls = get_method(name)
        cfg = resolve_config(cls.Config, args.preset, overrides={"seed": args.seed})
        if name in ("dsvdd", "droc"):
            data = TrainData(images[tr_n], ds.labels[tr_n], fingerprint=ds.fingerprint)
        elif name == "fs-sil":
            idx = np.concatenate([tr_n, tr_a])
            data = TrainData(images[idx], ds.labels[idx], fingerprint=ds.fingerprint)
        else:
            idx, bag, bag_label = bags_for(tr_n, tr_a, args.seed)
            data = TrainData(images[idx], None, bag, bag_label, fingerprint=ds.fingerprint)
        t0 = time.perf_counter()
        model = cls(cfg).fit(data)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        scores = model.score(images[test])
        score_s = time.perf_counter() - t0
        top = np.argsort(-scores, kind="stable")[:k]
        row = {
            "method": name,
            "preset": args.preset,
            "n_train": len(data),
            "n_test": len(test),
            "k": k,
            "auroc": round(float(roc_auc_score(y_test, scores)), 4),
            "recall_at_k": round(float(y_test[top].mean()), 4),
            "tp_at_k": int(y_test[top].sum()),
            "fit_seconds": round(fit_s, 1),
            "score_seconds": round(score_s, 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    cmd = "python benchmarks/train_bone_marrow.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k != "out"
    )
    meta = machine(cmd) | {"chance_recall_at_k": round(k / len(test), 4)}
    lines = [
        f"# {args.data.name}: one-class ranking of held-out cells ({args.preset} preset)",
        "",
        f"`{cmd}` on {meta['host']} ({meta['cpu_count']} CPUs, {meta['processor']})",
        "",
        f"Test pool: {len(test)} cells, {k} abnormal (chance Recall@{k} = "
        f"{meta['chance_recall_at_k']}).",
        "",
        f"| method | train images | AUROC | Recall@{k} | TP@{k} | fit (s) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['method']} | {r['n_train']} | {r['auroc']:.3f} | {r['recall_at_k']:.3f} | "
        f"{r['tp_at_k']} | {r['fit_seconds']:.0f} |"
        for r in rows
    ]
    write(args.out, f"train_{args.data.name}_{args.preset}", meta, rows, lines)


if __name__ == "__main__":
    main()
