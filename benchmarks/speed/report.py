"""Gather `cyto bench` result files from several machines or GPUs into one comparison.

    python benchmarks/speed/report.py [--results benchmarks/results] \\
        [--out benchmarks/results/REPORT]

Reads every engine_*.json, scorer_*.json and slide_*.json below ``--results`` and writes
REPORT.md (tables: best patches/s per machine, backend and precision for each model; the numba
scorer against sklearn; whole-slide cells/s, pipeline efficiency and the naive baseline) and
REPORT.png (patches/s per machine and backend at the largest common batch, log scale).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from cyto.bench.device import machine_label as label
from cyto.bench.engine import canonical_backend
from cyto.bench.results import markdown_table
from cyto.bench.scorer import OCSVM_COLUMNS
from cyto.bench.slide import SLIDE_COLUMNS, flat_row


def load(results: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = defaultdict(list)
    for f in sorted(results.rglob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("kind") in ("engine", "scorer", "slide"):
            data["file"] = str(f.relative_to(results))
            found[data["kind"]].append(data)
    return found


def engine_table(runs: list[dict]) -> tuple[list[str], dict]:
    best: dict = {}
    for run in runs:
        model = Path(run["meta"].get("model", "?")).stem
        for r in run["results"]:
            if not r.get("available"):
                continue
            backend = canonical_backend(r["backend"])  # earlier results used other names
            key = (model, label(run["meta"]), r["device"], backend, r["precision"])
            if key not in best or r["patches_per_s"] > best[key]["patches_per_s"]:
                best[key] = r
    lines = [
        "| model | machine | device | backend | precision | best patches/s | at batch | p50 ms |"
        " vs eager fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(best):
        r = best[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {r['patches_per_s']:,.0f} "
            f"| {r['batch']} | {r['p50_ms']} | {r.get('vs_torch_eager_fp32', '-')} |"
        )
    return lines, best


def scorer_table(runs: list[dict]) -> list[str]:
    rows = [
        {**r, "machine": label(run["meta"]), "support_vectors": r.get("support_vectors", "-")}
        for run in runs
        for r in run["results"]
    ]
    return markdown_table(rows, [("machine", "machine"), ("scorer", "scorer"), *OCSVM_COLUMNS])


def slide_table(runs: list[dict]) -> list[str]:
    rows = [flat_row(r, label(run["meta"])) for run in runs for r in run["results"]]
    return markdown_table(rows, [("machine", "machine"), *SLIDE_COLUMNS])


def plot(best: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({k[0] for k in best})
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        keys = sorted(k for k in best if k[0] == model)
        names = [f"{k[1][:28]}\n{k[2]} {k[3]} {k[4]}" for k in keys]
        ax.barh(range(len(keys)), [best[k]["patches_per_s"] for k in keys], color="#4c72b0")
        ax.set_yticks(range(len(keys)), names, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("patches/s (best batch)")
        ax.set_title(model)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    here = Path(__file__).resolve().parents[1] / "results"
    ap.add_argument("--results", type=Path, default=here)
    ap.add_argument("--out", type=Path, default=here / "REPORT")
    args = ap.parse_args()
    runs = load(args.results)
    if not runs:
        raise SystemExit(f"no cyto bench result files below {args.results}")
    machines = sorted({label(r["meta"]) for rs in runs.values() for r in rs})
    lines = ["# cyto benchmarks across machines", "", "Machines: " + "; ".join(machines), ""]
    best: dict = {}
    if runs.get("engine"):
        table, best = engine_table(runs["engine"])
        lines += ["## Engine: best patches/s per backend and precision", "", *table, ""]
    if runs.get("scorer"):
        lines += ["## Scoring kernels", "", *scorer_table(runs["scorer"]), ""]
    if runs.get("slide"):
        lines += ["## Whole slide", "", *slide_table(runs["slide"]), ""]
    files = sorted(r["file"] for rs in runs.values() for r in rs)
    lines += ["Source files: " + ", ".join(f"`{f}`" for f in files)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if best:
        plot(best, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.md')}" + (" and .png" if best else ""))


if __name__ == "__main__":
    main()
