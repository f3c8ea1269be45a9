"""Pap-stained cervical cells (CRIC Cervix): how each one-class ranking orders NILM against the
squamous lesions, on development blocks and, once, on a final block of later files (issue 66).

Blocks (by the cell id of each class, which follows acquisition order, cyto.eval.splits):

* the **final** block: the latest ``--final-fraction`` of NILM, ASC-US and LSIL (ASC-H has 7
  cells, all of early images: it stays in development). Touched once, with ``--stage final``,
  after every choice was made.
* the **development** pool: the rest. Fold A trains on the earlier half of each class and ranks
  the later half; fold B the other way round (a later block ranks an earlier one: two blocks
  each way, so a choice holds in both). Only NILM cells are trained on.

Rankings (``--rankings``):

* ``morphometry``: the Pap morphometric score (:class:`cyto.data.morphometry.Morphometric`) of
  the training normals, no network.
* ``dsvdd``, ``droc``: the methods' fast presets on the crops (``--set`` overrides), their own
  score.
* ``dsvdd-knn``, ``droc-knn``: their embeddings, scored by the mean distance to the 5 nearest
  training normals (standardised).
* ``default``: what a user gets: ``cyto train dsvdd --preset fast --set stain=pap`` on the
  training block's folder (normal and abnormal classes: the abnormal cells only choose the
  ranking, on held-back cells) and ``cyto predict`` on the test block, its rank (``--rank-by
  auto``).

Metrics: AUROC (every abnormal class, and each against NILM), and the paper's operating points:
Recall@K with K = 5 % of the pool at witness rates of 1 % and 0.1 % (``--draws`` draws of the
abnormal cells, at least one a pool; chance 0.05), with nDCG@K and normalised AUFROC@K there.

    python benchmarks/science/pap/pap_ranking.py --data ../shared/data/cric --stage dev \\
        --rankings morphometry,default,dsvdd,droc --seeds 0,1,2 \\
        --out benchmarks/results/vm-2core/pap/dev
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _results.py
from _results import machine, mean_sd, write  # noqa: E402

from cyto.data.dataset import PatchDataset, acquisition_key  # noqa: E402
from cyto.eval.metrics import aufroc_at_k, auroc, ndcg_at_k, recall_at_k  # noqa: E402

#: the CRIC crops' pixel size (benchmarks/science/pap/README.md: how it was found)
MPP = 0.258
#: the run's options (--normal, --stain, --mpp), set by main()
OPT = argparse.Namespace(normal="NILM", stain="pap", mpp=MPP)
RANKINGS = ("morphometry", "default", "dsvdd", "droc", "dsvdd-knn", "droc-knn")


def blocks(ds: PatchDataset, final_fraction: float, final_classes: tuple[str, ...]):
    """(development indices, final indices) by acquisition order within each class."""
    cls = np.array(ds.classes)
    dev, final = [], []
    for c in sorted(set(cls)):
        members = sorted(
            np.flatnonzero(cls == c), key=lambda i: acquisition_key(ds.records[i].path)
        )
        cut = (
            len(members) - int(round(final_fraction * len(members)))
            if c in final_classes
            else len(members)
        )
        dev += members[:cut]
        final += members[cut:]
    return np.array(sorted(dev)), np.array(sorted(final))


def halves(ds: PatchDataset, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The earlier and later half of each class among ``idx``."""
    cls = np.array(ds.classes)
    early, late = [], []
    for c in sorted(set(cls[idx])):
        members = sorted(idx[cls[idx] == c], key=lambda i: acquisition_key(ds.records[i].path))
        early += members[: len(members) // 2]
        late += members[len(members) // 2 :]
    return np.array(sorted(early)), np.array(sorted(late))


def recall_at_wr(y, s, wr: float, draws: int, seed: int) -> dict:
    """Recall@K, nDCG@K, AUFROC@K (K = 5 % of the pool) over draws of a pool of every normal
    test cell plus abnormal cells at witness rate ``wr`` (at least one)."""
    rng = np.random.default_rng(seed)
    normal, abnormal = s[y == 0], s[y == 1]
    n_abn = max(1, round(wr * len(normal) / (1 - wr)))
    k = max(1, math.ceil(0.05 * (len(normal) + n_abn)))
    labels = np.r_[np.zeros(len(normal), int), np.ones(n_abn, int)]
    got = {"recall": [], "ndcg": [], "aufroc": []}
    for _ in range(draws):
        pool = np.concatenate([normal, rng.choice(abnormal, n_abn, replace=False)])
        got["recall"].append(recall_at_k(pool, labels, k))
        got["ndcg"].append(ndcg_at_k(pool, labels, k))
        got["aufroc"].append(aufroc_at_k(pool, labels, k))
    return {f"{m}_wr{wr * 100:g}": round(float(np.mean(v)), 4) for m, v in got.items()} | {
        f"k_wr{wr * 100:g}": k,
        f"abnormal_per_pool_wr{wr * 100:g}": n_abn,
    }


def metrics(y, s, classes, draws: int, seed: int) -> dict:
    out = {
        "auroc": round(auroc(s, y), 4),
        "n_normal": int((y == 0).sum()),
        "n_abnormal": int(y.sum()),
    }
    for c in sorted(set(classes[y == 1])):
        pick = (y == 0) | (classes == c)
        out[f"auroc_{c}"] = round(auroc(s[pick], (classes[pick] == c).astype(int)), 4)
    for wr in (0.01, 0.001):
        out |= recall_at_wr(y, s, wr, draws, seed)
    return out


def scores_of(ranking: str, ds, train_idx, test_idx, seed: int, overrides: dict, work: Path):
    """(test scores, what was chosen) of one ranking trained on ``train_idx`` (its NILM cells)."""
    from cyto.data.morphometry import Morphometric
    from cyto.detect.morphometry import measure_stain

    images = np.asarray(ds.images)
    labels = np.asarray(ds.labels)
    normals = train_idx[labels[train_idx] == 0]
    if ranking == "morphometry":
        fit = Morphometric.fit(measure_stain(images[normals], OPT.mpp, OPT.stain), OPT.stain)
        return fit.score(measure_stain(images[test_idx], OPT.mpp, OPT.stain)), "morphometry"
    if ranking == "default":
        return _default(ds, train_idx, test_idx, seed, overrides, work)
    from cyto.train.config import resolve_config
    from cyto.train.data import TrainData
    from cyto.train.registry import get_method

    method = ranking.split("-")[0]
    cls = get_method(method)
    cfg = resolve_config(
        cls.Config, "fast", overrides={**overrides, "seed": seed, "stain": OPT.stain}
    )
    from cyto.data.images import resize_rgb

    size = cfg.load_size or images.shape[1]
    x = np.stack([resize_rgb(im, size) for im in images])
    model = cls(cfg).fit(TrainData(x[normals], np.zeros(len(normals), np.int8)), device="cpu")
    if ranking.endswith("-knn"):
        from sklearn.neighbors import NearestNeighbors

        e_tr, e_te = model.embed(x[normals]), model.embed(x[test_idx])
        mu, sd = e_tr.mean(0), e_tr.std(0) + 1e-6
        nn = NearestNeighbors(n_neighbors=5).fit((e_tr - mu) / sd)
        return nn.kneighbors((e_te - mu) / sd)[0].mean(1), ranking
    return np.asarray(model.score(x[test_idx]), dtype=np.float64), ranking


def _link(ds, idx, root: Path) -> Path:
    for i in idx:
        r = ds.records[i]
        (root / r.cls).mkdir(parents=True, exist_ok=True)
        os.symlink(r.path.resolve(), root / r.cls / r.path.name)
    return root


def _default(ds, train_idx, test_idx, seed: int, overrides: dict, work: Path):
    """cyto train dsvdd --preset fast --set stain=STAIN, then cyto predict: the rank it gives."""
    import pyarrow.parquet as pq

    from cyto.predict import predict
    from cyto.train.api import train

    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmp = Path(tmp)
        train_dir, test_dir = _link(ds, train_idx, tmp / "train"), _link(ds, test_idx, tmp / "test")
        given = {**overrides, "stain": OPT.stain, "seed": seed}
        if OPT.mpp:
            given["mpp"] = OPT.mpp
        sets = [f"{k}={v}" for k, v in given.items()]
        res = train(
            "dsvdd", train_dir, tmp / "m.cyto", normal=OPT.normal, preset="fast", overrides=sets
        )
        summary = predict(
            tmp / "m.cyto", test_dir, tmp / "p.parquet", normal=OPT.normal, echo=lambda *a: None
        )
        table = pq.read_table(tmp / "p.parquet")
        # the rank's order, as scores (rank 1 highest), in the test indices' order
        by_path = {
            Path(p).name + c: -r
            for p, c, r in zip(
                table["path"].to_pylist(),
                table["class"].to_pylist(),
                table["rank"].to_pylist(),
                strict=True,
            )
        }
        scores = np.array(
            [by_path[ds.records[i].path.name + ds.records[i].cls] for i in test_idx],
            dtype=np.float64,
        )
        held = json.dumps(res.validation["auroc"]) if res.validation else "none"
        chosen = f"{summary['rank_by']} (held back: {held})"
    return scores, chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--stage", choices=("dev", "final"), default="dev")
    ap.add_argument("--rankings", default="morphometry,default")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--folds", default="A,B", help="the development folds to run (--stage dev)")
    ap.add_argument("--final-fraction", type=float, default=0.25)
    ap.add_argument(
        "--final-classes", default="NILM,ASC-US,LSIL", help="the classes with a final block"
    )
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--normal", default="NILM")
    ap.add_argument("--stain", default="pap", help="mgg, pap or he: the cells' stain")
    ap.add_argument("--mpp", type=float, default=MPP, help="the crops' um/px (0: not known)")
    ap.add_argument("--size", type=int, default=100, help="crops are padded or resized to this")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--rows",
        type=Path,
        help="rebuild the result files from the rows a run printed (its log: one JSON row a "
        "line), for a run stopped before its end; nothing is trained",
    )
    args = ap.parse_args()
    if args.rows is not None:
        rows = [json.loads(ln) for ln in args.rows.read_text().splitlines() if ln.startswith("{")]
        if not rows:
            raise SystemExit(f"{args.rows} holds no result row")
        folds = list(dict.fromkeys(r["fold"] for r in rows))
        rankings = list(dict.fromkeys(r["ranking"] for r in rows))
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {**machine(), "command": " ".join(sys.argv), "rows_from": str(args.rows)}
        report(args.out, rows[0]["stage"], meta, rows, folds, rankings)
        return
    rankings = [r for r in args.rankings.split(",") if r]
    unknown = sorted(set(rankings) - set(RANKINGS))
    if unknown:
        raise SystemExit(f"unknown rankings {unknown}; known: {', '.join(RANKINGS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    overrides = dict(kv.split("=", 1) for kv in args.set)
    args.mpp = args.mpp or None
    OPT.normal, OPT.stain, OPT.mpp = args.normal, args.stain, args.mpp
    ds = PatchDataset.from_path(args.data, normal=args.normal, size=args.size)  # pads
    dev, final = blocks(ds, args.final_fraction, tuple(args.final_classes.split(",")))
    if args.stage == "dev":
        a, b = halves(ds, dev)
        folds = {k: v for k, v in {"A": (a, b), "B": (b, a)}.items() if k in args.folds.split(",")}
    else:
        folds = {"final": (dev, final)}
    classes = np.array(ds.classes)
    labels = np.asarray(ds.labels)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {**machine(), "command": " ".join(sys.argv), "mpp": args.mpp,
            "blocks": {"dev": int(len(dev)), "final": int(len(final))}}  # fmt: skip
    rows = []
    for fold, (tr, te) in folds.items():
        for ranking in rankings:
            for seed in seeds if ranking != "morphometry" else seeds[:1]:  # no seed to vary
                t0 = time.perf_counter()
                s, chosen = scores_of(ranking, ds, tr, te, seed, overrides, args.out)
                row = {"stage": args.stage, "fold": fold, "ranking": ranking, "seed": seed,
                       "chosen": chosen, "seconds": round(time.perf_counter() - t0, 1),
                       **metrics(labels[te], s, classes[te], args.draws, seed)}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
                # after every row: a run stopped later keeps what it measured
                report(args.out, args.stage, meta, rows, folds, rankings)


def report(out: Path, stage: str, meta: dict, rows: list[dict], folds, rankings) -> None:
    """The result files (JSON and Markdown) of ``rows``: mean ± sd over seeds per ranking."""
    per_class = sorted({k for r in rows for k in r if k.startswith("auroc_")})  # each lesion
    md = [
        f"# Pap rankings, {stage}", "", f"`{meta['command']}`", "",
        "| fold | ranking | seeds | AUROC | " + " | ".join(k[6:] for k in per_class)
        + " | Recall@5% WR 1% | WR 0.1% | nDCG WR 1% |",
        "|---|---|---|---|" + "---|" * len(per_class) + "---|---|---|",
    ]  # fmt: skip
    for fold in folds:
        for ranking in rankings:
            got = [r for r in rows if r["fold"] == fold and r["ranking"] == ranking]
            if not got:
                continue
            cols = [
                mean_sd(v, "{:.3f}") if (v := [r[k] for r in got if k in r]) else "-"
                for k in ("auroc", *per_class, "recall_wr1", "recall_wr0.1", "ndcg_wr1")
            ]
            md.append(f"| {fold} | {ranking} | {len(got)} | " + " | ".join(cols) + " |")
    write(out, f"pap_{stage}", meta, rows, md)


if __name__ == "__main__":
    main()
