"""Which refine mode, and does one round hold on fresh seeds? (issue 17)

Reads ``refine_loop.py --finetune`` results (the JSON files it writes; each row holds, per seed,
Recall@100 of the base model, of the fine-tuned refinement and of the retrained one, on the same
review and held-out slides). For each group of seeds (``--group NAME=RUN.json[,RUN.json...]``)
and each mode, the paired gain over the base model: mean ± sd, t and how many seeds gained.

The rule, written down before the fine-tuned development seeds 3-4 and the fresh seeds 9-12 had
finished: of the two modes, the one with the larger paired t on the development group (the first
``--group``) is recommended; every later group is read once, as a check of that choice, and
both modes are reported there side by side.

    python benchmarks/review/refine_choice.py --group dev=RUN0-4.json \\
        --group fresh=RUN5-7.json,RUN8-12.json --out benchmarks/results/vm-2core/refine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, paired_gain, write  # noqa: E402

MODES = (("retrained", "refined_recall"), ("fine-tuned", "finetuned_recall"))


def _rows(paths: str) -> list[dict]:
    rows = []
    for p in paths.split(","):
        data = json.loads(Path(p).read_text())
        got = [r for r in data["results"] if "finetuned_recall" in r]
        if not got:
            raise SystemExit(f"{p}: not a refine_loop.py --finetune result")
        rows += got
    seeds = [r["seed"] for r in rows]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"seed counted twice in {paths}: {sorted(seeds)}")
    return sorted(rows, key=lambda r: r["seed"])


def paired(rows: list[dict], key: str) -> dict:
    """The paired gain of ``key`` over the base model across the rows' seeds."""
    return {
        "base": statistics.mean(r["base_recall"] for r in rows),
        "refined": statistics.mean(r[key] for r in rows),
        **paired_gain(r[key] - r["base_recall"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--group", action="append", required=True, metavar="NAME=RUN.json[,...]")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    groups = []
    for spec in args.group:
        name, _, paths = spec.partition("=")
        if not paths:
            raise SystemExit(f"--group {spec!r}: give NAME=RUN.json[,RUN.json...]")
        groups.append((name, _rows(paths)))
    table = []
    for name, rows in groups:
        for mode, key in MODES:
            table.append(
                {
                    "group": name,
                    "mode": mode,
                    "seeds": [r["seed"] for r in rows],
                    **paired(rows, key),
                }
            )
    dev = {r["mode"]: r for r in table if r["group"] == groups[0][0]}
    chosen = max(dev, key=lambda m: dev[m]["t"])
    md = [
        "# Refine mode: retrained vs fine-tuned, paired Recall@100 gain over the base model",
        "",
        "`python benchmarks/review/refine_choice.py "
        + " ".join(f"--group {g}" for g in args.group)
        + "`",
        "",
        "| seeds | mode | base | refined | paired gain (sd) | t | seeds better |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {r['group']} ({','.join(map(str, r['seeds']))}) | {r['mode']} | {r['base']:.3f} "
            f"| {r['refined']:.3f} | {r['gain']:+.3f} ({r['sd']:.3f}) | {r['t']:.2f} "
            f"| {r['better']}/{r['n']} |"
            for r in table
        ],
        "",
        f"Chosen on `{groups[0][0]}` (larger paired t): **{chosen}**.",
    ]
    meta = {
        **machine(),
        "command": "python benchmarks/review/refine_choice.py "
        + " ".join(f"--group {g}" for g in args.group),
        "chosen": chosen,
    }
    write(args.out, "refine_choice", meta, table, md)
    print("\n".join(md))


if __name__ == "__main__":
    main()
