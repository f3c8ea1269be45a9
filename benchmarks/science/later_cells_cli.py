"""The outside check, on later files, through the CLI exactly as a user runs it (issue 36).

A held-out check outside the team trained with ``cyto train METHOD --data bone_marrow --normal LYT
--preset fast`` and ranked later Matek files with ``cyto predict``. This script does the same on
the cells we have: the files of each class are put in acquisition order (the last number of the
file name); the earlier ones (``1 - --late-fraction`` of each class) are linked into a training
folder, the later ones into a test folder (a temporary directory; nothing is copied). Per method
and seed:

    cyto train METHOD --data EARLY --normal LYT --preset fast --seed S --out M.cyto [--set ...]
    cyto predict M.cyto --data LATE --normal LYT
    cyto predict M.cyto --data OTHER --normal lymphocyte [--zoom auto]   (with --other)

and the score tables give AUROC, Recall@5 % at WR 1 % (the paper's operating point, over
``--draws`` draws; chance 0.05) and AUROC per abnormal class: of the model's score alone (rows
named by the method), and of the ranking ``cyto predict`` gives by default where it differs
(``METHOD+nucleus``: the model's score fused with the nucleus-size score, Deep SVDD).

    python benchmarks/science/later_cells_cli.py --data ../shared/data/bone_marrow --normal LYT \\
        --other ../shared/data/pbc --other-normal lymphocyte --methods dsvdd,droc --seeds 0,1,2 \\
        --out benchmarks/results/vm-2core/heldout/order/cli
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from cyto.data.dataset import load_records
from cyto.eval.metrics import auroc
from cyto.eval.splits import acquisition_key, order_split

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, where, write  # noqa: E402
from heldout import recall_at_wr  # noqa: E402


def link_blocks(
    data: Path, late_fraction: float, stage: str, work: Path
) -> tuple[Path, Path, int, int]:
    """``work/early`` and ``work/late``: class folders of symbolic links to the earlier and later
    files of each class of ``data``; returns both and their sizes. ``stage`` final: the latest
    ``late_fraction`` of each class against the files before it; dev: those earlier files only,
    their earlier half against their later half (the final block is not read)."""
    records = load_records(data)
    classes = np.array([r.cls for r in records])
    keys = [acquisition_key(r.path) for r in records]
    early, late = order_split(classes, keys, np.arange(len(records)), late_fraction)
    if stage == "dev":
        early, late = order_split(classes, keys, early, 0.5)
    for name, idx in (("early", early), ("late", late)):
        for i in idx:
            r = records[i]
            dest = work / name / r.cls / Path(r.path).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(Path(r.path).resolve())
    return work / "early", work / "late", len(early), len(late)


def cyto(*args: str) -> str:
    """Run the ``cyto`` command of this interpreter; its output, or exit with its error."""
    proc = subprocess.run(
        [sys.executable, "-m", "cyto", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "CYTO_PROGRESS": "0"},
    )
    if proc.returncode:
        raise SystemExit(f"cyto {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


#: the score columns of a `cyto predict` table, and the row name each gives a method: the model
#: alone, and the fused rank with the nucleus-size score (`--rank-by auto` for Deep SVDD)
RANKINGS = {"score": "{}", "fused_score": "{}+nucleus"}


def rankings(table: Path) -> list[str]:
    """The columns of :data:`RANKINGS` that ``table`` holds."""
    names = pq.read_schema(table).names
    return [c for c in RANKINGS if c in names]


def ranked(table: Path, draws: int, seed: int, column: str = "score") -> dict:
    """AUROC, Recall@5 % at WR 1 % and the AUROC of each abnormal class against the normals, of
    the ranking by ``column``."""
    t = pq.read_table(table, columns=["class", "label", column]).to_pydict()
    y, s = np.asarray(t["label"], dtype=int), np.asarray(t[column], dtype=float)
    cls_of = np.asarray(t["class"])
    got = {
        "auroc": round(auroc(s, y), 4),
        "recall_wr1_k5": round(recall_at_wr(y, s, 0.01, 0.05, draws, seed), 4),
    }
    normal = y == 0
    for cls in sorted(set(cls_of[~normal])):
        pick = normal | (cls_of == cls)
        got[f"auroc_{cls}"] = round(auroc(s[pick], y[pick]), 4)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="class folders in acquisition order")
    ap.add_argument("--normal", default="LYT")
    ap.add_argument("--other", type=Path, default=None, help="a second lab's class folders")
    ap.add_argument("--other-normal", default="lymphocyte")
    ap.add_argument("--methods", default="dsvdd,droc")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--preset", default="fast")
    ap.add_argument(
        "--late-fraction",
        type=float,
        default=0.25,
        help="the final block: this share of each class, the latest files",
    )
    ap.add_argument(
        "--stage",
        choices=("dev", "final"),
        default="dev",
        help="dev: train on the earlier half of the files before the final block, rank the later "
        "half (make choices here); final: train on all of them, rank the final block (once)",
    )
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", default="", help="a name for this run's result files")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    sets = [x for kv in args.set for x in ("--set", kv)]

    rows = []
    with tempfile.TemporaryDirectory(prefix="cyto-later-") as tmp:
        work = Path(tmp)
        early, late, n_early, n_late = link_blocks(args.data, args.late_fraction, args.stage, work)
        print(f"{n_early} earlier files to train on, {n_late} later ones to rank", flush=True)
        for method in methods:
            for seed in seeds:
                bundle = work / f"{method}-{seed}.cyto"
                t0 = time.perf_counter()
                cyto("train", method, "--data", str(early), "--normal", args.normal,
                     "--preset", args.preset, "--set", f"seed={seed}", *sets,
                     "--out", str(bundle))  # fmt: skip
                fit_seconds = round(time.perf_counter() - t0, 1)
                cyto("predict", str(bundle), "--data", str(late), "--normal", args.normal,
                     "--out", str(work / "late.parquet"), "--overwrite")  # fmt: skip
                found = {}  # one row per ranking the tables hold
                for column in rankings(work / "late.parquet"):
                    found[column] = {"method": RANKINGS[column].format(method), "seed": seed}
                    found[column]["fit_seconds"] = fit_seconds
                    found[column] |= ranked(work / "late.parquet", args.draws, seed, column)
                if args.other is not None:
                    for zoom, prefix in ((None, "other_unzoomed_"), ("auto", "other_")):
                        extra = ["--zoom", zoom] if zoom else []
                        cyto("predict", str(bundle), "--data", str(args.other),
                             "--normal", args.other_normal, *extra,
                             "--out", str(work / "other.parquet"), "--overwrite")  # fmt: skip
                        for column, row in found.items():
                            got = ranked(work / "other.parquet", args.draws, seed, column)
                            row |= {f"{prefix}{k}": v for k, v in got.items()}
                for row in found.values():
                    print(row, flush=True)
                    rows.append(row)

    cmd = " ".join(["python benchmarks/science/later_cells_cli.py", *sys.argv[1:]])
    meta = machine(cmd) | {"n_early": n_early, "n_late": n_late, "seeds": seeds}
    meta["stage"] = args.stage
    name = f"later_cells_cli_{args.stage}{'_' + args.tag if args.tag else ''}"
    shown = list(dict.fromkeys(r["method"] for r in rows))
    write(args.out, name, meta, rows,
          table(rows, shown, args, meta))  # fmt: skip


def table(rows: list[dict], methods: list[str], args, meta: dict) -> list[str]:
    def ms(got, key):
        v = [r[key] for r in got if key in r]
        if not v:
            return "-"
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        return f"{statistics.mean(v):.3f} ± {sd:.3f}"

    classes = sorted(
        {k[len("auroc_") :] for r in rows for k in r if k.startswith("auroc_")},
    )
    lines = [
        f"# Later files through the CLI, {args.stage} stage: {args.data.name}"
        + (f" and {args.other.name}" if args.other else ""),
        "",
        where(meta["command"], meta, "cpu"),
        "",
        f"`cyto train --preset {args.preset}` on the earlier {meta['n_early']} files "
        f"(acquisition order, each class), `cyto predict` on the later {meta['n_late']}"
        + (f" and on {args.other.name} (unzoomed and `--zoom auto`)" if args.other else "")
        + ". Mean ± sd over seeds "
        + ", ".join(map(str, meta["seeds"]))
        + "; Recall@5% @ WR 1%: chance 0.05.",
        "",
        "| method | AUROC, later files | Recall@5% @ WR 1% | "
        + " | ".join(f"AUROC {c}" for c in classes)
        + (
            " | other lab AUROC, unzoomed | other lab AUROC, zoom auto | "
            "other lab Recall@5% @ WR 1%, zoom auto |"
            if args.other
            else " |"
        ),
        "|---|---|---|" + "---|" * len(classes) + ("---|---|---|" if args.other else ""),
    ]
    for m in methods:
        got = [r for r in rows if r["method"] == m]
        lines.append(
            f"| {m} | {ms(got, 'auroc')} | {ms(got, 'recall_wr1_k5')} | "
            + " | ".join(ms(got, f"auroc_{c}") for c in classes)
            + (
                f" | {ms(got, 'other_unzoomed_auroc')} | {ms(got, 'other_auroc')} | "
                f"{ms(got, 'other_recall_wr1_k5')} |"
                if args.other
                else " |"
            )
        )
    return lines


if __name__ == "__main__":
    main()
