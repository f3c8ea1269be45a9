"""Tables (Markdown, LaTeX) and log-log plots of a witness-rate sweep.

Each file is written beside itself and renamed (:func:`cyto.bundle.atomic_write`): a run
stopped while it draws (Ctrl-C, a full disk) leaves every file whole, the last one's or the
new one, never a truncated table or PNG. They are made from ``results.csv`` alone, so a
rerun makes them again."""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from cyto.bundle import atomic_write

PLOTTED = {
    "recall_at_k": "Recall@K",
    "ndcg_at_k": "nDCG@K",
    "autk_at_k": "AUTK@K",
    "aufroc_at_k": "normalized AUFROC@K",
}
UPPER_BOUND = "fs-sil"


def load_results(path: Path) -> dict[tuple[str, float, str], list[float]]:
    table: dict[tuple[str, float, str], list[float]] = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            table[r["method"], float(r["wr"]), r["metric"]].append(float(r["value"]))
    return table


def _ms(values: list[float]) -> tuple[float, float]:
    arr = np.array([v for v in values if not math.isnan(v)])
    if arr.size == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def tp_table(results: Path, out_dir: Path, k: int) -> tuple[Path, Path]:
    """TP@K mean +- std, methods x WR (WR descending, as in the paper)."""
    table = load_results(results)
    methods = list(dict.fromkeys(m for m, _, _ in table))
    wrs = sorted({w for _, w, _ in table}, reverse=True)
    label = {m: f"{m} (upper bound)" if m == UPPER_BOUND else m for m in methods}
    md = [
        f"| TP@{k} | " + " | ".join(f"WR {w:g}%" for w in wrs) + " |",
        "|---|" + "---|" * len(wrs),
    ]
    tex = [
        r"\begin{tabular}{l" + "c" * len(wrs) + "}",
        r"\hline",
        f"TP@{k} & " + " & ".join(f"WR {w:g}\\%" for w in wrs) + r" \\",
        r"\hline",
    ]
    for m in methods:
        cells = []
        for w in wrs:
            mean, std = _ms(table.get((m, w, "tp_at_k"), []))
            cells.append("-" if math.isnan(mean) else f"{mean:.1f} ± {std:.1f}")
        md.append(f"| {label[m]} | " + " | ".join(cells) + " |")
        tex.append(label[m] + " & " + " & ".join(c.replace("±", r"$\pm$") for c in cells) + r" \\")
    tex += [r"\hline", r"\end{tabular}"]
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "tp_at_k.md", ("\n".join(md) + "\n").encode())
    atomic_write(out_dir / "tp_at_k.tex", ("\n".join(tex) + "\n").encode())
    return out_dir / "tp_at_k.md", out_dir / "tp_at_k.tex"


def plots(results: Path, out_dir: Path, k: int) -> list[Path]:
    """One log-log panel per metric against WR, one line per method (PNG and SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = load_results(results)
    methods = list(dict.fromkeys(m for m, _, _ in table))
    written = []
    for metric, title in PLOTTED.items():
        fig, ax = plt.subplots(figsize=(5, 4))
        for m in methods:
            wrs = sorted({w for mm, w, me in table if mm == m and me == metric})
            stats = [_ms(table[m, w, metric]) for w in wrs]
            means = np.array([s[0] for s in stats])
            stds = np.array([s[1] for s in stats])
            ok = np.isfinite(means) & (means > 0)
            if not ok.any():
                continue
            x = np.array(wrs)[ok]
            ax.errorbar(
                x,
                means[ok],
                yerr=stds[ok],
                marker="o",
                capsize=3,
                label=f"{m} (upper bound)" if m == UPPER_BOUND else m,
                linestyle="--" if m == UPPER_BOUND else "-",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("witness rate (%)")
        ax.set_ylabel(title.replace("K", str(k)))
        ax.set_title(f"{title.replace('K', str(k))} vs witness rate")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # nothing drawn (every mean 0): no legend, and
            ax.legend(fontsize=8)  # none of matplotlib's warning on the console
        fig.tight_layout()
        try:
            for ext in ("png", "svg"):
                path = out_dir / f"{metric}.{ext}"
                drawn = io.BytesIO()
                fig.savefig(drawn, format=ext, dpi=120)
                atomic_write(path, drawn.getvalue())
                written.append(path)
        finally:
            plt.close(fig)
    return written
