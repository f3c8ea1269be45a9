"""The paper's Table 3 (TP@400 per method and witness rate) beside ours, as multiples of chance.

Pools of different sizes compare only as multiples of chance: TP@K / (K x abnormal / pool), which
is Recall@K / (K / pool). Three columns per method and witness rate:

* **paper**: TP@400 from the paper's Table 3 (``--paper``, the Markdown transcription in
  ``shared/paper/TABLES.md``), its pool the 7,873 test normals plus the WR's test abnormal cells;
* **synthetic, paper scale**: ``paper_scale_sweep.sh`` runs (``--synth SEED=results.csv[,...]``,
  one per split seed): the paper's pool sizes and counts, K = 400; each seed's mean over its
  trials, then mean ± sd over seeds;
* **real cells**: ``heldout.py --wrs ...`` (``--real RUN.json``): Recall@5 % of a pool of the
  held-out bone-marrow normals plus abnormal cells at the WR (K = 5 % of the pool, as 400 is of
  the paper's 7,913), mean ± sd over seeds. The training witness rate there is that run's (the
  one-class methods never see an abnormal cell, so for them it does not matter).

    python benchmarks/science/table3.py --paper ../shared/paper/TABLES.md \\
        --synth 0=benchmarks/results/vm-2core/sweep-paper-scale-synth/results.csv \\
        --real benchmarks/results/vm-2core/heldout/order/final/heldout_..._final_....json \\
        --out benchmarks/results/vm-2core/table3
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402
from sweep_seeds import per_seed  # noqa: E402

PAPER_TEST_NORMALS = 7873
PAPER_K = 400
WRS = (9.0, 5.0, 1.0, 0.5, 0.1, 0.05)
COLUMNS = {"FS-SIL": "fs-sil", "WS-SIL": "ws-sil", "DSVDD": "dsvdd", "DROC": "droc"}
COLUMNS["ItS2CLR"] = "its2clr"


def paper_table(path: Path) -> tuple[dict[tuple[str, float], float], dict[float, int]]:
    """``(method, WR) -> TP@400`` of the paper's Table 3 and ``WR -> test abnormal cells`` from
    the Markdown transcription (the tables after the "TP@400" and "Abnormal cells per witness
    rate" headings)."""
    text = path.read_text()
    tp = _table_after(text, "TP@400")
    counts = _table_after(text, "Abnormal cells per witness rate")
    if not tp or not counts:
        raise SystemExit(f"{path}: no TP@400 or abnormal-count table found")
    heads = tp[0][1:]
    unknown = [h for h in heads if h not in COLUMNS]
    if unknown:
        raise SystemExit(f"{path}: unknown method column(s) {unknown}")
    values = {}
    for row in tp[1:]:
        wr = _wr(row[0])
        for head, cell in zip(heads, row[1:], strict=True):
            values[(COLUMNS[head], wr)] = float(re.sub(r"[*\s]", "", cell).split("±")[0])
    test = {_wr(row[0]): int(row[2]) for row in counts[1:]}
    return values, test


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first Markdown table after the heading line that contains ``heading``."""
    lines = text.splitlines()
    start = next((i for i, s in enumerate(lines) if s.startswith("#") and heading in s), None)
    if start is None:
        return []
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows


def _wr(cell: str) -> float:
    return float(cell.strip().rstrip("%"))


def _ms(v: list[float], digits: int = 1) -> str:
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.mean(v):.{digits}f} ± {sd:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paper", type=Path, required=True, help="the paper's tables (TABLES.md)")
    ap.add_argument("--synth", action="append", default=[], help="SEED=results.csv[,more]")
    ap.add_argument(
        "--real", type=Path, action="append", default=[], help="heldout.py runs with --wrs"
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    paper, paper_test = paper_table(args.paper)
    synth_seeds = dict(s.split("=", 1) for s in args.synth)
    tp = per_seed({k: [Path(p) for p in v.split(",")] for k, v in synth_seeds.items()}, "tp_at_k")
    recall = per_seed(
        {k: [Path(p) for p in v.split(",")] for k, v in synth_seeds.items()}, "recall_at_k"
    )
    real_rows, real_commands, seen = [], [], set()
    for path in args.real:
        got = json.loads(path.read_text())
        # a method and seed in two runs (a baseline re-run beside a candidate) counts once
        fresh = [r for r in got["results"] if (r["method"], r["seed"]) not in seen]
        seen |= {(r["method"], r["seed"]) for r in fresh}
        real_rows += fresh
        real_commands.append(f"`{got['meta']['command']}`")
    # the paper's methods, then rankings only we have (e.g. dsvdd+nucleus): no paper column
    methods = list(dict.fromkeys([*COLUMNS.values(), *(r["method"] for r in real_rows)]))
    real_meta = {"command": "; ".join(real_commands) or "-"}

    rows = []
    for wr in WRS:
        n_abn = paper_test[wr]
        chance_tp = PAPER_K * n_abn / (PAPER_TEST_NORMALS + n_abn)
        for method in methods:
            row = {"wr": wr, "method": method}
            if (method, wr) in paper:
                row["paper_tp"] = paper[(method, wr)]
                row["paper_x"] = round(row["paper_tp"] / chance_tp, 2)
            synth_tp = list(tp.get((method, wr), {}).values())
            synth_recall = list(recall.get((method, wr), {}).values())
            if synth_tp:
                chance_recall = PAPER_K / (PAPER_TEST_NORMALS + n_abn)
                row["synth_tp"] = synth_tp
                row["synth_x"] = [round(r / chance_recall, 2) for r in synth_recall]
            key = f"recall_wr{wr:g}_k5"
            real = [r[key] for r in real_rows if r["method"] == method and key in r]
            if real:
                row["real_recall"] = real
                row["real_x"] = [round(r / 0.05, 2) for r in real]
            rows.append(row)

    def one(v, digits=1) -> str:
        """A value, or mean ± sd over seeds; one seed only: the value and a dagger."""
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return _ms(v, digits) if len(v) > 1 else f"{v[0]:.{digits}f}†"

    def cell(row, tp_key, x_key):
        if x_key not in row:
            return "-"
        x_text = one(row[x_key])
        x_text = x_text.replace("†", "x†") if x_text.endswith("†") else f"{x_text}x"
        return x_text if tp_key is None else f"{one(row[tp_key])} ({x_text})"

    def short(row, key):
        if key not in row:
            return "-"
        v = row[key]
        if isinstance(v, float):
            return f"{v:.1f}x"
        return f"{statistics.mean(v):.1f}x" + ("†" if len(v) == 1 and key == "synth_x" else "")

    lines = [
        "# The paper's Table 3 beside ours, in multiples of chance",
        "",
        f"`{' '.join(['python', 'benchmarks/science/table3.py', *sys.argv[1:]])}`",
        "",
        "Multiples of chance: TP@400 / (400 x abnormal / pool), or Recall@K / (K / pool). "
        "Paper: its Table 3 (the mean of 10 draws). Synthetic: paper-scale sweeps "
        "(`paper_scale_sweep.sh`, the paper's pool sizes and counts, K = 400), mean over split "
        f"seeds {', '.join(synth_seeds) or '-'}. Real: bone-marrow cells, Recall@5 % of a pool "
        "of the held-out normals plus abnormal cells at the WR, mean over seeds "
        f"({real_meta['command']}).",
        "",
        "Each cell: paper / synthetic / real († synthetic from one split seed only).",
        "",
        "| method | " + " | ".join(f"WR {w:g}%" for w in WRS) + " |",
        "|---|" + "---|" * len(WRS),
    ]
    for m in methods:
        got = {r["wr"]: r for r in rows if r["method"] == m}
        cells = [
            " / ".join(short(got[w], k) for k in ("paper_x", "synth_x", "real_x")) for w in WRS
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "In detail: TP@400 and its multiple of chance, mean ± sd over seeds († one seed only; "
        "the paper's sd is over draws of one model and is not repeated here).",
        "",
        "| WR | method | paper TP@400 (x chance) | synthetic TP@400 (x chance) "
        "| real cells, Recall@5% (x chance) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['wr']:g}% | {row['method']} | {cell(row, 'paper_tp', 'paper_x')} | "
            f"{cell(row, 'synth_tp', 'synth_x')} | {cell(row, 'real_recall', 'real_x')} |"
        )
    meta = machine(" ".join(["python benchmarks/science/table3.py", *sys.argv[1:]]))
    meta |= {"real": real_commands, "synth_seeds": list(synth_seeds)}
    write(args.out, "table3", meta, rows, lines)


if __name__ == "__main__":
    main()
