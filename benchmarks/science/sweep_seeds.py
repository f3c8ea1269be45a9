"""Witness-rate sweeps of several split seeds, side by side: each seed's mean over its trials,
then mean ± sd over seeds, and which method is ahead in how many seeds.

A sweep's trials resample the test abnormal cells of one split: their sd says nothing about
another split of the normal cells, another draw of the training abnormals or another training
run. Seeds do (`paper_scale_sweep.sh` with SEED=1, 2, ...).

    python benchmarks/science/sweep_seeds.py --run 0=DIR0/results.csv \\
        --run 1=DIR1/results.csv,... --metric tp_at_k --pairs droc:dsvdd,fs-sil:droc \\
        --out RESULTS_DIR
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import paired_gain  # noqa: E402


def per_seed(
    paths: dict[str, list[Path]], metric: str
) -> dict[tuple[str, float], dict[str, float]]:
    """(method, WR) -> {seed: mean of ``metric`` over that seed's trials}; a seed's results may
    come from several sweeps (parts of it run apart)."""
    values: dict[tuple[str, float, str], list[float]] = defaultdict(list)
    for seed, files in paths.items():
        for path in files:
            with open(path, newline="") as f:
                for r in csv.DictReader(f):
                    if r["metric"] == metric:
                        values[(r["method"], float(r["wr"]), seed)].append(float(r["value"]))
    out: dict[tuple[str, float], dict[str, float]] = defaultdict(dict)
    for (method, wr, seed), v in values.items():
        out[(method, wr)][seed] = float(np.mean(v))
    return out


def tables(
    table, seeds: list[str], pairs: list[tuple[str, str]], metric: str, digits: int = 1
) -> str:
    # only the (method, WR) cells that every seed ran
    cells = {k: v for k, v in table.items() if all(s in v for s in seeds)}
    methods = sorted({m for m, _ in cells}, key=lambda m: [m for m, _ in table].index(m))
    wrs = sorted({w for _, w in cells}, reverse=True)
    head = f"| {metric}, mean ± sd over seeds {', '.join(seeds)} | " + " | ".join(
        f"WR {w:g}%" for w in wrs
    )
    lines = [head + " |", "|---" * (len(wrs) + 1) + "|"]
    for m in methods:
        row = []
        for w in wrs:
            v = np.array([cells[(m, w)][s] for s in seeds]) if (m, w) in cells else None
            row.append("" if v is None else f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines += ["", "| per seed | " + " | ".join(f"WR {w:g}%" for w in wrs) + " |"]
    lines.append("|---" * (len(wrs) + 1) + "|")
    for m in methods:
        row = [
            " / ".join(f"{cells[(m, w)][s]:.{digits}f}" for s in seeds) if (m, w) in cells else ""
            for w in wrs
        ]
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    if pairs:
        lines += ["", "| ahead in seeds (of " + str(len(seeds)) + ", ties apart) | "]
        lines[-1] += " | ".join(f"WR {w:g}%" for w in wrs) + " |"
        lines.append("|---" * (len(wrs) + 1) + "|")
        for a, b in pairs:
            row = []
            for w in wrs:
                if (a, w) not in cells or (b, w) not in cells:
                    row.append("")
                    continue
                d = [cells[(a, w)][s] - cells[(b, w)][s] for s in seeds]
                g = paired_gain(d)
                row.append(
                    f"{a} {g['better']}, {b} {sum(x < 0 for x in d)} "
                    f"(diff {g['gain']:+.{digits}f} ± {g['sd']:.{digits}f})"
                )
            lines.append(f"| {a} vs {b} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--run", action="append", required=True, help="SEED=results.csv[,more results.csv]"
    )
    ap.add_argument("--metric", default="tp_at_k")
    ap.add_argument("--pairs", default="", help="A:B,... methods compared seed by seed")
    ap.add_argument("--digits", type=int, default=1, help="decimals in the tables")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    paths = dict(r.split("=", 1) for r in args.run)
    seeds = list(paths)
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p]
    table = per_seed({s: [Path(x) for x in p.split(",")] for s, p in paths.items()}, args.metric)
    text = tables(table, seeds, pairs, args.metric, args.digits)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"seeds_{args.metric}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
