"""Choose a method's fast preset by repeated development splits (issue 16, item 1).

Reads ``heldout.py --stage dev`` results (the JSON files it writes): one for the current preset
and one per variant (``--set KEY=VALUE`` on top of it), every run on the same seeds, so a
variant and the current preset are compared on the same splits (paired).

The rule, fixed before the variants ran: per seed, the criterion is the mean of the two AUROCs
the goal names (bone-marrow development half, the other lab zoomed to the training scale). A
variant replaces the current preset only if its paired gain over the seeds is positive with a
t statistic of at least 2.13 (one-sided 95% for 5 seeds); of several, the largest gain. The
final split is not read here.

    python benchmarks/science/preset_choice.py --current RUN.json --variant NAME=RUN.json ... \\
        --method dsvdd --out benchmarks/results/vm-2core/heldout/presets

A variant may be another method's rows (``NAME=RUN.json@METHOD``), such as the rank ensemble
``heldout.py --ensemble dsvdd+droc`` writes beside its members (``@dsvdd+droc``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, paired_gain, write  # noqa: E402

T_MIN = 2.13  # one-sided 95% for 4 degrees of freedom
METRICS = ("auroc", "other_auroc", "recall_wr1_k5", "other_recall_wr1_k5")


def _rows(paths: str | Path, method: str) -> dict[int, dict]:
    """``seed -> row`` of ``method`` in one result file, or several separated by commas (seeds
    run apart)."""
    rows = {}
    for path in str(paths).split(","):
        data = json.loads(Path(path).read_text())
        rows |= {r["seed"]: r for r in data["results"] if r["method"] == method}
    if not rows:
        raise SystemExit(f"{paths}: no {method} rows")
    return rows


def _criterion(r: dict) -> float:
    return (r["auroc"] + r["other_auroc"]) / 2


def _mean_sd(v: list[float]) -> str:
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.mean(v):.3f} ± {sd:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--current", required=True, metavar="RUN.json[,RUN.json]")
    ap.add_argument(
        "--variant", action="append", default=[], metavar="NAME=RUN.json[,RUN.json][@METHOD]"
    )
    ap.add_argument("--method", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    current = _rows(args.current, args.method)
    seeds = sorted(current)
    table, chosen, best = [], "current", 0.0
    runs = [("current", current)]
    for spec in args.variant:
        name, _, path = spec.partition("=")
        path, _, method = path.partition("@")
        rows = _rows(path, method or args.method)
        if sorted(rows) != seeds:
            raise SystemExit(f"{name}: seeds {sorted(rows)} differ from the current {seeds}")
        runs.append((name, rows))
    for name, rows in runs:
        row = {"preset": name}
        for m in METRICS:
            row[m] = _mean_sd([rows[s][m] for s in seeds])
        row["fit_s"] = round(statistics.mean(rows[s]["fit_seconds"] for s in seeds), 1)
        if name != "current":
            g = paired_gain(_criterion(rows[s]) - _criterion(current[s]) for s in seeds)
            row["gain"] = f"{g['gain']:+.3f} ± {g['sd']:.3f}"
            row["t"] = round(g["t"], 2)
            row["better_seeds"] = f"{g['better']}/{g['n']}"
            if g["t"] >= T_MIN and g["gain"] > best:
                chosen, best = name, g["gain"]
        table.append(row)
    from cyto.bench.results import markdown_table

    md = [
        f"# Fast preset of {args.method}: development splits, seeds {seeds}",
        "",
        "Criterion per seed: mean of the bone-marrow and the other lab's AUROC; gain: paired "
        f"over seeds against the current preset (mean ± sd); a variant wins with t >= {T_MIN}.",
        "",
        *markdown_table(
            table,
            [
                ("preset", "preset"),
                ("auroc", "AUROC"),
                ("other_auroc", "other lab AUROC"),
                ("recall_wr1_k5", "Recall@5% @ WR 1%"),
                ("other_recall_wr1_k5", "other lab Recall@5% @ WR 1%"),
                ("gain", "criterion gain"),
                ("t", "t"),
                ("better_seeds", "better seeds"),
                ("fit_s", "fit s/seed"),
            ],
        ),
        "",
        f"Chosen: **{chosen}**.",
    ]
    meta = {
        **machine(),
        "method": args.method,
        "current": str(args.current),
        "variants": args.variant,
        "seeds": seeds,
        "t_min": T_MIN,
        "chosen": chosen,
    }
    write(args.out, f"preset_choice_{args.method}", meta, table, md)
    print("\n".join(md))


if __name__ == "__main__":
    main()
