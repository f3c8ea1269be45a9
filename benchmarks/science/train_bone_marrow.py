"""Train every method with a preset on a real cell-patch dataset and rank held-out cells.

The check of issue 'train the five methods': each method must rank abnormal cells above normal
ones clearly better than chance on held-out cells. Usage (2 CPU cores: about 10 minutes):

    python benchmarks/science/train_bone_marrow.py --data ../shared/data/bone_marrow \\
        --normal LYT --abnormal BLA,PMO,EOS,MON --preset fast --seeds 0,1,2

``--preset paper`` trains the paper's recipes (ResNet18 at 224 px; for a GPU: ``--device cuda``).
Each seed draws its own split and initialisation; the table gives the mean and the standard
deviation over seeds, and every row is printed (and appended to ``--jsonl``) as soon as it is done.

Split (seeded): half of the normals and half of the abnormals train, the rest are the test pool.
One-class methods (dsvdd, droc) see the training normals only; FS-SIL sees instance labels; WS-SIL
and ItS2CLR see 10 bags of training normals, 5 of which also hold the training abnormals, with bag
labels only. Results go to benchmarks/results/ as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from cyto.data.dataset import PatchDataset
from cyto.train.config import resolve_config
from cyto.train.data import TrainData
from cyto.train.registry import get_method, method_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, where, write  # noqa: E402


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


def train_data(cls, ds: PatchDataset, images, tr_n, tr_a, seed: int) -> TrainData:
    """What a method learns from on a split: the training normals (one-class), normals and
    abnormals with labels (FS-SIL), or 10 bags with bag labels only (WS-SIL, ItS2CLR)."""
    if cls.one_class:
        return TrainData(images[tr_n], ds.labels[tr_n], fingerprint=ds.fingerprint)
    if cls.instance_labels:
        idx = np.concatenate([tr_n, tr_a])
        return TrainData(images[idx], ds.labels[idx], fingerprint=ds.fingerprint)
    idx, bag, bag_label = bags_for(tr_n, tr_a, seed)
    return TrainData(images[idx], None, bag, bag_label, fingerprint=ds.fingerprint)


def common_parser(doc: str) -> argparse.ArgumentParser:
    """The options every training benchmark takes (data, classes, preset, seeds, device...)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--normal", default="LYT")
    ap.add_argument("--abnormal", default=None)
    ap.add_argument("--preset", default="fast", help="a preset name, or 'paper' for none")
    ap.add_argument("--seeds", default="0", help="comma-separated; each draws split and init")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, every method"
    )
    ap.add_argument("--jsonl", type=Path, default=None, help="append each row here when done")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    return ap


def common_settings(args: argparse.Namespace):
    """``(device, preset or None, seeds, overrides)`` from the common options."""
    from cyto.train.loop import resolve_device

    preset = None if args.preset == "paper" else args.preset
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    return resolve_device(args.device), preset, seeds, dict(kv.split("=", 1) for kv in args.set)


def methods_and_size(names: str, preset: str | None, overrides: dict) -> tuple[list[str], int]:
    """The methods of a comma-separated list, and the load size they share (or exit)."""
    methods = [m.strip() for m in names.split(",") if m.strip()]
    sizes = {
        resolve_config(get_method(m).Config, preset, overrides=overrides).load_size for m in methods
    }
    if len(sizes) != 1:
        raise SystemExit(f"methods disagree on load_size: {sizes}")
    return methods, sizes.pop()


def command_line(script: str, args: argparse.Namespace) -> str:
    """The command that reproduces this run (without where its files went); ``script`` is the
    script's path below ``benchmarks/`` (``science/heldout.py``)."""
    opts = " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()
        if k not in ("out", "jsonl", "set") and v is not None
    )
    return f"python benchmarks/{script} {opts}" + "".join(f" --set {kv}" for kv in args.set)


def append_row(jsonl: Path | None, row: dict) -> None:
    """Print a finished row and append it to ``jsonl``: a run cut off keeps what it made."""
    print(json.dumps(row), flush=True)
    if jsonl is not None:
        jsonl.parent.mkdir(parents=True, exist_ok=True)
        with open(jsonl, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def main() -> None:
    ap = common_parser(__doc__)
    ap.add_argument("--methods", default=",".join(method_names()))
    args = ap.parse_args()

    device, preset, seeds, overrides = common_settings(args)
    methods, size = methods_and_size(args.methods, preset, overrides)
    ds = PatchDataset.from_path(args.data, normal=args.normal, abnormal=args.abnormal, size=size)
    images = np.asarray(ds.images)
    rows = []
    for seed in seeds:
        rows += run_seed(ds, images, methods, preset, seed, device, overrides, args.jsonl)
    k, n_test = rows[0]["k"], rows[0]["n_test"]

    cmd = command_line("science/train_bone_marrow.py", args)
    meta = machine(cmd) | {"chance_recall_at_k": round(k / n_test, 4), "seeds": seeds}
    lines = [
        f"# {args.data.name}: one-class ranking of held-out cells ({args.preset} preset)",
        "",
        where(cmd, meta, device),
        "",
        f"Test pool: {n_test} cells, {k} abnormal (chance AUROC 0.5, chance Recall@{k} = "
        f"{meta['chance_recall_at_k']}). Mean ± standard deviation over seeds {args.seeds}.",
        "",
        f"| method | train images | AUROC | Recall@{k} | TP@{k} | fit (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in methods:
        got = [r for r in rows if r["method"] == name]

        def ms(key, fmt, got=got):
            v = [r[key] for r in got]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            return (
                f"{fmt.format(statistics.mean(v))} ± {fmt.format(sd)}"
                if len(v) > 1
                else (fmt.format(v[0]))
            )

        lines.append(
            f"| {name} | {got[0]['n_train']} | {ms('auroc', '{:.3f}')} | "
            f"{ms('recall_at_k', '{:.3f}')} | {ms('tp_at_k', '{:.0f}')} | "
            f"{ms('fit_seconds', '{:.0f}')} |"
        )
    tag = f"train_{args.data.name}_{args.preset}" + (
        "" if device.type == "cpu" else f"_{device.type}"
    )
    write(args.out, tag, meta, rows, lines)


def run_seed(ds, images, methods, preset, seed, device, overrides, jsonl) -> list[dict]:
    """Train and rank every method on the split of one seed."""
    tr_n, tr_a, test = split(ds, seed)
    y_test = ds.labels[test].astype(int)
    k = int(y_test.sum())
    rows = []
    for name in methods:
        cls = get_method(name)
        cfg = resolve_config(cls.Config, preset, overrides={**overrides, "seed": seed})
        data = train_data(cls, ds, images, tr_n, tr_a, seed)
        t0 = time.perf_counter()
        model = cls(cfg).fit(data, device=device)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        scores = model.score(images[test])
        score_s = time.perf_counter() - t0
        top = np.argsort(-scores, kind="stable")[:k]
        row = {
            "method": name,
            "preset": preset or "paper",
            "seed": seed,
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
        append_row(jsonl, row)
    return rows


if __name__ == "__main__":
    main()
