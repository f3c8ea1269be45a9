"""Rankings on cells the methods never saw: development splits, a final block touched once,
and a second lab (issues 16, 36).

The protocol (evaluation hygiene):

* ``--split order`` (the default, issue 36): the files of each class are put in acquisition order
  (the last number of the file name, ``LYT_00017.jpg``); the latest ``--final-fraction`` of each
  class is the **final** block, never used while choices are made, the earlier files the
  **development** pool. A later file is a later patient: a random split of the same patients
  overstates what a lab sees next year. ``--split random``: the final split is a stratified random
  draw (``--final-seed``) instead.
* ``--stage dev``: the methods train on the earlier half of each class of the development pool and
  rank the later half (``--split random``: a random half per seed). Make every choice (presets,
  defaults) on these rows.
* ``--stage final``: after choices are frozen, each seed trains on the whole development pool and
  ranks the final split, once. Its rows are reported beside the development ones, never tuned on.
* ``--other`` (a second lab's cells, e.g. ../shared/data/pbc) is ranked by every trained model in
  both stages; no model trains on it, unless ``--mix-other N`` (a mixed-lab recipe): then N of its
  normal cells, drawn per seed, join the training normals and leave its test set.

What each method learns from: one-class methods (dsvdd, droc) the training normals only; FS-SIL the
training normals and half of the training abnormals with instance labels (the supervised bound);
WS-SIL and ItS2CLR 10 bags of the training normals, 5 of them positive and holding
``--witnesses-per-bag`` abnormal cells each, with bag labels only (the witness rate is printed).

Metrics on each test set: AUROC; Recall@K with K = the number of abnormal test cells; and the
paper's operating point, Recall@K at a witness rate of 1 % with K = 5 % of the pool (the paper's
400 of 7,913), averaged over ``--draws`` random draws of the abnormal cells (chance = 0.05).
Weakly supervised rows also carry their bag check (``cyto.train.bagcheck``).

``--ensemble dsvdd+droc`` adds a row per seed that ranks by the mean of the listed methods' ranks
within the pool being ranked (each test set on its own; no label, no training score used): what a
lab gets from scoring a slide with two bundles and ordering its cells by their mean rank.
Several ensembles are separated by commas (``dsvdd+nucleus,droc+nucleus``).

``nucleus`` in ``--methods`` is the nucleus-size score (``cyto.data.morphometry``): no network,
the training normals' mean and spread of the log centre-nucleus share; a baseline for the networks
and an ensemble member.

    python benchmarks/science/heldout.py --data ../shared/data/bone_marrow --normal LYT \\
        --other ../shared/data/pbc --other-normal lymphocyte --preset fast --seeds 0,1,2,3,4 \\
        --stage dev
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from cyto.data.dataset import PatchDataset
from cyto.data.morphometry import NucleusSize, fused_score
from cyto.data.scale import nucleus_fraction, zoom_from_nuclei, zoom_patches
from cyto.eval.metrics import auroc, recall_at_k
from cyto.eval.splits import acquisition_key, order_split, stratified_split
from cyto.train.config import resolve_config
from cyto.train.data import TrainData
from cyto.train.registry import get_method, method_names

#: the --methods name of the nucleus-size score (cyto.data.morphometry): no network, trained on
#: the same normals as the one-class methods
NUCLEUS = "nucleus"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, where, write  # noqa: E402
from train_bone_marrow import (  # noqa: E402
    append_row,
    command_line,
    common_parser,
    common_settings,
    methods_and_size,
)


def recall_at_wr(
    y: np.ndarray, s: np.ndarray, wr: float, k_frac: float, draws: int, seed: int
) -> float:
    """Mean Recall@K over draws of a pool of every normal test cell plus abnormal cells at witness
    rate ``wr`` (at least one), K = ``k_frac`` of the pool. Ties rank normal cells first."""
    rng = np.random.default_rng(seed)
    normal, abnormal = s[y == 0], s[y == 1]
    n_abn = abnormal_count(len(normal), wr)
    k = max(1, math.ceil(k_frac * (len(normal) + n_abn)))
    labels = np.r_[np.zeros(len(normal), int), np.ones(n_abn, int)]
    got = [
        recall_at_k(np.concatenate([normal, rng.choice(abnormal, n_abn, replace=False)]), labels, k)
        for _ in range(draws)
    ]
    return float(np.mean(got))


def abnormal_count(n_normal: int, wr: float) -> int:
    """Abnormal cells in a pool of ``n_normal`` normal ones at witness rate ``wr`` (at least 1)."""
    return max(1, round(wr * n_normal / (1 - wr)))


def metrics(y: np.ndarray, s: np.ndarray, draws: int, seed: int, wrs=()) -> dict:
    """AUROC, Recall@K (K = abnormal count), Recall@5% at WR 1 % and at each of ``wrs``
    (fractions) over ``draws`` draws of the abnormal cells."""
    got = {
        "auroc": round(auroc(s, y), 4),
        "recall_at_k": round(recall_at_k(s, y, int(y.sum())), 4),
        "recall_wr1_k5": round(recall_at_wr(y, s, 0.01, 0.05, draws, seed), 4),
    }
    for wr in wrs:
        got[f"recall_wr{wr * 100:g}_k5"] = round(recall_at_wr(y, s, wr, 0.05, draws, seed), 4)
    return got


def train_data(
    cls, labels, fingerprint, images, tr_n, tr_a, per_bag: int, seed: int
) -> tuple[TrainData, float]:
    """What ``cls`` learns from, and the witness rate of its positive bags (0 when unbagged)."""
    rng = np.random.default_rng(seed + 11)
    if cls.one_class:
        return TrainData(images[tr_n], labels[tr_n], fingerprint=fingerprint), 0.0
    if cls.instance_labels:
        idx = np.concatenate([tr_n, tr_a[: len(tr_a) // 2]])
        return TrainData(images[idx], labels[idx], fingerprint=fingerprint), 0.0
    witnesses = rng.permutation(tr_a)[: 5 * per_bag]
    idx = np.concatenate([tr_n, witnesses])
    bag = np.array(
        [f"bag{i % 10}" for i in rng.permutation(len(tr_n))]
        + [f"bag{i % 5}" for i in range(5 * per_bag)]
    )
    bag_label = np.array([int(int(b[3:]) < 5) for b in bag], dtype=np.int8)
    in_pos = bag_label == 1
    wr = len(witnesses) / int(in_pos.sum())
    return TrainData(images[idx], None, bag, bag_label, fingerprint=fingerprint), wr


def main() -> None:
    ap = common_parser(__doc__)
    ap.add_argument("--methods", default=",".join(method_names()))
    ap.add_argument("--stage", choices=("dev", "final"), default="dev")
    ap.add_argument(
        "--split",
        choices=("order", "random"),
        default="order",
        help="order: by acquisition order (the last number of each file name), the final block "
        "is the latest --final-fraction of each class and each development run trains on the "
        "earlier half of the development pool and ranks the later half (seeds vary the model "
        "only); random: stratified random draws of the same sizes (seeds vary the halves too)",
    )
    ap.add_argument("--final-fraction", type=float, default=0.25)
    ap.add_argument("--final-seed", type=int, default=2026)
    ap.add_argument("--witnesses-per-bag", type=int, default=2)
    ap.add_argument("--other", type=Path, default=None, help="a second lab's cell folders")
    ap.add_argument("--other-normal", default="lymphocyte")
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument(
        "--wrs",
        default="",
        help="witness rates in percent (e.g. 9,5,1,0.5,0.1,0.05): Recall@5%% of the pool at each, "
        "over --draws draws, in a second table (the paper's sweep on real cells)",
    )
    ap.add_argument(
        "--other-zoom",
        default="1",
        help="the other lab's cells look this many times smaller: the centre 1/zoom of each "
        "image is cut and resized to the load size (cyto.data.scale.zoom_patch; bone marrow vs "
        "PBC: 1.68, from the area of the normal cells' nuclei), or auto: estimated without "
        "labels, the median nucleus share of all the other lab's cells against that of the "
        "development normals (what `cyto predict --zoom auto` does)",
    )
    ap.add_argument(
        "--home-zoom",
        default="1",
        help="zoom --data's own cells (training and test) by this factor first: train at the "
        "other lab's larger scale instead of shrinking its cells (the reverse direction), or "
        "auto: the factor that gives the development normals the median nucleus share of all "
        "the other lab's cells (no labels)",
    )
    ap.add_argument(
        "--mix-other",
        type=int,
        default=0,
        help="a mixed-lab recipe: this many of the other lab's normal cells (drawn per seed) "
        "join the training normals and leave its test set",
    )
    ap.add_argument(
        "--ensemble",
        default="",
        help="methods joined by + (e.g. dsvdd+droc), all among --methods, several separated by "
        "commas: for each, a row per seed that ranks by the mean of their ranks within each test "
        "pool",
    )
    args = ap.parse_args()
    try:
        wr_list = [float(w) / 100 for w in args.wrs.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(
            f"--wrs must be percentages separated by commas, got {args.wrs!r}"
        ) from None
    if any(not 0 < w < 1 for w in wr_list):
        raise SystemExit(f"--wrs must be in (0, 100) percent, got {args.wrs!r}")

    device, preset, seeds, overrides = common_settings(args)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    networks = ",".join(m for m in names if m != NUCLEUS)
    if not networks:
        raise SystemExit(f"--methods needs a trained method beside {NUCLEUS} (its load size)")
    size = methods_and_size(networks, preset, overrides)[1]
    methods = names
    ensembles = [[m for m in e.split("+") if m] for e in args.ensemble.split(",") if e.strip()]
    if any(len(e) < 2 or not set(e) <= set(methods) for e in ensembles):
        raise SystemExit(
            f"--ensemble needs two or more of --methods joined by +, got {args.ensemble!r}"
        )
    members = sorted({m for e in ensembles for m in e})
    ds = PatchDataset.from_path(args.data, normal=args.normal, abnormal=args.abnormal, size=size)
    images, y = np.asarray(ds.images), ds.labels.astype(int)
    classes = np.array(ds.classes)
    keys = [acquisition_key(r.path) for r in ds.records]
    if args.split == "order":
        dev, final = order_split(classes, keys, np.arange(len(y)), args.final_fraction)
    else:
        # by label, as before the order split existed: the committed random-split runs repeat
        final, dev = stratified_split(y, np.arange(len(y)), args.final_fraction, args.final_seed)
    other, zoom_note, home_note = None, "1.000", "1.000"
    if args.other is not None:
        other = PatchDataset.from_path(args.other, normal=args.other_normal)
        other_at_size = zoom_patches(other.images, 1.0, size)  # unzoomed, at the load size
    if args.home_zoom != "1":
        if args.home_zoom == "auto":
            if other is None:
                raise SystemExit("--home-zoom auto needs --other")
            reference = float(np.median(nucleus_fraction(other_at_size)))
            home = zoom_from_nuclei(reference, images[dev][y[dev] == 0])
        else:
            home = float(args.home_zoom)
        home_note = f"{home:.3f}" + (" (auto)" if args.home_zoom == "auto" else "")
        print(f"{args.data.name} zoomed {home_note}", flush=True)
        images = zoom_patches(images, home, size)
    pool_images, pool_labels = images, y  # what training draws from (both labels when mixed)
    if other is not None:
        other_y = other.labels.astype(int)
        if args.other_zoom == "auto":
            dev_normals = images[dev][y[dev] == 0]
            reference = float(np.median(nucleus_fraction(dev_normals)))
            zoom = zoom_from_nuclei(reference, other_at_size)
        else:
            zoom = float(args.other_zoom)
        zoom_note = f"{zoom:.3f}" + (" (auto)" if args.other_zoom == "auto" else "")
        print(f"other lab zoomed {zoom_note}", flush=True)
        # at the training cells' scale
        other_images = other_at_size if zoom == 1.0 else zoom_patches(other.images, zoom, size)
        pool_images = np.concatenate([images, other_images])
        pool_labels = np.concatenate([y, other_y])
    elif args.mix_other:
        raise SystemExit("--mix-other needs --other")

    rows = []
    for seed in seeds:
        if args.stage == "dev" and args.split == "order":
            train, test = order_split(classes, keys, dev, 0.5)
        elif args.stage == "dev":
            train, test = stratified_split(y, dev, 0.5, seed)
        else:
            train, test = dev, final
        tr_n, tr_a = train[y[train] == 0], train[y[train] == 1]
        other_test = np.arange(len(other)) if other is not None else None
        if args.mix_other:
            normals = np.random.default_rng([seed, 3]).permutation(np.flatnonzero(other_y == 0))
            mixed = np.sort(normals[: args.mix_other])
            tr_n = np.concatenate([tr_n, len(y) + mixed])  # indices into the pooled arrays
            other_test = np.setdiff1d(other_test, mixed)
        kept: dict[str, dict[str, np.ndarray]] = {}  # the ensemble members' scores, per test set
        for name in methods:
            t0 = time.perf_counter()
            if name == NUCLEUS:  # no network: two numbers of the training normals
                model, data, wr = NucleusSize.fit(pool_images[tr_n]), tr_n, 0.0
            else:
                cls = get_method(name)
                cfg = resolve_config(cls.Config, preset, overrides={**overrides, "seed": seed})
                data, wr = train_data(
                    cls,
                    pool_labels,
                    ds.fingerprint,
                    pool_images,
                    tr_n,
                    tr_a,
                    args.witnesses_per_bag,
                    seed,
                )
                t0 = time.perf_counter()
                model = cls(cfg).fit(data, device=device)
            fit_seconds = round(time.perf_counter() - t0, 1)
            s_test = model.score(images[test])
            s_other = model.score(pool_images[len(y) + other_test]) if other is not None else None
            if name in members:
                kept[name] = {"test": s_test, "other": s_other, "fit": fit_seconds}
            row = {
                "stage": args.stage,
                "method": name,
                "seed": seed,
                "n_train": len(data),
                "train_witness_rate": round(wr, 4),
                "fit_seconds": fit_seconds,
                "n_test": len(test),
                "n_test_normal": int((y[test] == 0).sum()),
                **{
                    f"{k}": v
                    for k, v in metrics(y[test], s_test, args.draws, seed, wr_list).items()
                },
            }
            if other is not None:
                got = metrics(other_y[other_test], s_other, args.draws, seed, wr_list)
                row.update({f"other_{k}": v for k, v in got.items()} | {"n_other": len(s_other)})
                row["n_other_normal"] = int((other_y[other_test] == 0).sum())
            check = getattr(model, "bag_check_", None)
            if check is not None:
                row.update(bag_auroc=check["bag_auroc"], bag_check=check["status"])
            rows.append(row)
            append_row(args.jsonl, row)
        for ensemble in ensembles:
            name = "+".join(ensemble)
            row = {"stage": args.stage, "method": name, "seed": seed, "n_train": len(tr_n)}
            row |= {"train_witness_rate": 0.0, "n_test": len(test)}
            row["fit_seconds"] = round(sum(kept[m]["fit"] for m in ensemble), 1)
            row["n_test_normal"] = int((y[test] == 0).sum())
            s_test = fused_score(*[kept[m]["test"] for m in ensemble])
            row |= metrics(y[test], s_test, args.draws, seed, wr_list)
            if other is not None:
                s_other = fused_score(*[kept[m]["other"] for m in ensemble])
                got = metrics(other_y[other_test], s_other, args.draws, seed, wr_list)
                row.update({f"other_{k}": v for k, v in got.items()} | {"n_other": len(s_other)})
                row["n_other_normal"] = int((other_y[other_test] == 0).sum())
            rows.append(row)
            append_row(args.jsonl, row)

    cmd = command_line("science/heldout.py", args)
    meta = machine(cmd) | {
        "seeds": seeds,
        "stage": args.stage,
        "split": args.split,
        "final_fraction": args.final_fraction,
        "final_seed": args.final_seed,
        "n_dev": len(dev),
        "n_final": len(final),
        "other_zoom": zoom_note,
        "home_zoom": home_note,
    }
    shown = methods + ["+".join(e) for e in ensembles]
    write(
        args.out,
        f"heldout_{args.data.name}_{args.preset}_{args.stage}",
        meta,
        rows,
        table(rows, shown, args, meta, device, wr_list),
    )


def table(rows, methods, args, meta, device, wr_list=()) -> list[str]:
    def ms(got, key, fmt="{:.3f}"):
        v = [r[key] for r in got if key in r]
        if not v:
            return "-"
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        return f"{fmt.format(statistics.mean(v))} ± {fmt.format(sd)}"

    if args.split == "order":
        split = (
            f"Split by acquisition order (the file index): the final block is the latest "
            f"{args.final_fraction:.0%} of each class of {args.data.name} ({meta['n_final']} "
            f"cells), the development pool the {meta['n_dev']} earlier ones."
        )
        what = (
            "the earlier half of each class of the development pool and ranks the later half "
            "(the same cells every seed; seeds vary the model)"
            if args.stage == "dev"
            else "the whole development pool, ranking the later final block (touched once)"
        )
    else:
        split = (
            f"Random split: the final split is {args.final_fraction:.0%} of each label of "
            f"{args.data.name} (seed {args.final_seed}, {meta['n_final']} cells), the "
            f"development pool the other {meta['n_dev']}."
        )
        what = (
            "a random half of the development pool (another per seed) and ranks the other half"
            if args.stage == "dev"
            else "the whole development pool, ranking the final split (touched once)"
        )
    other = f" and {args.other.name} (another lab, never trained on)" if args.other else ""
    if meta.get("other_zoom", "1.000") != "1.000":
        other += f", its cells zoomed {meta['other_zoom']}x to the training scale"
    if meta.get("home_zoom", "1.000") != "1.000":
        other += f"; {args.data.name}'s own cells zoomed {meta['home_zoom']}x before training"
    if args.mix_other:
        other = (
            f" and {args.other.name} (another lab; mixed-lab recipe: {args.mix_other} of its "
            "normal cells join the training normals and leave its test set)"
        )
    lines = [
        f"# Held-out ranking, {args.stage} stage, {args.split} split: {args.data.name}{other}",
        "",
        where(meta["command"], meta, device),
        "",
        f"{split} Each seed ({', '.join(map(str, meta['seeds']))}) trains on {what}. "
        "Mean ± sd over seeds. Recall@5% @ WR 1%: the paper's operating point (K = 5 % of a pool "
        f"at witness rate 1 %, mean of {args.draws} draws; chance 0.05).",
        "",
        "| method | train | WR of positive bags | AUROC | Recall@K | Recall@5% @ WR 1% |"
        + (" other lab AUROC | other lab Recall@5% @ WR 1% |" if args.other else "")
        + " bag check (AUROC; failed) |",
        "|---|---|---|---|---|---|" + ("---|---|" if args.other else "") + "---|",
    ]
    for name in methods:
        got = [r for r in rows if r["method"] == name]
        wr = got[0]["train_witness_rate"]
        bag = "-"
        if "bag_auroc" in got[0]:
            failed = sum(r["bag_check"] == "failed" for r in got)
            bag = f"{ms(got, 'bag_auroc', '{:.2f}')}; {failed} of {len(got)}"
        lines.append(
            f"| {name} | {got[0]['n_train']} | {f'{wr:.1%}' if wr else '-'} | "
            f"{ms(got, 'auroc')} | {ms(got, 'recall_at_k')} | {ms(got, 'recall_wr1_k5')} |"
            + (
                f" {ms(got, 'other_auroc')} | {ms(got, 'other_recall_wr1_k5')} |"
                if args.other
                else ""
            )
            + f" {bag} |"
        )
    if wr_list:
        lines += wr_table(rows, methods, args, wr_list, "", args.data.name)
        if args.other:
            lines += wr_table(rows, methods, args, wr_list, "other_", args.other.name)
    return lines


def wr_table(rows, methods, args, wr_list, prefix: str, name: str) -> list[str]:
    """Recall@5% of the pool at each witness rate: the paper's sweep on the held-out cells."""
    n = rows[0][f"n_{prefix or 'test_'}normal"]
    heads = [f"WR {w * 100:g}% ({abnormal_count(n, w)} abn.)" for w in wr_list]
    lines = [
        "",
        f"Recall@5% by witness rate on {name}: {n} normal test cells (per seed) plus the stated "
        f"number of abnormal ones, drawn {args.draws} times; at least one abnormal cell, so the "
        "smallest WRs share one pool size. With one abnormal cell, Recall@5% is the chance it "
        "outranks 95% of the normal cells. Chance: 0.05. Mean ± sd over seeds.",
        "",
        "| method | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(heads),
    ]
    for method in methods:
        got = [r for r in rows if r["method"] == method]
        cells = []
        for w in wr_list:
            v = [r[f"{prefix}recall_wr{w * 100:g}_k5"] for r in got]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.3f} ± {sd:.3f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
