"""Summarise a `pipeline_before_after.sh` run: per model, version and engine the median and range
of cells/s, engine-only cells/s, pipeline efficiency and the wait for tiles over the rounds,
the end-to-end ratio of `auto` to ONNX Runtime fp32 within each round, and the median time of
each stage. Prints markdown; `--out FILE` writes it too.

    python benchmarks/speed/pipeline_summary.py benchmarks/results/epyc-2core/pipeline
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def load(folder: Path) -> dict:
    """{(model, version, engine): {round: result}} from RESULTS/<model>/r<k>-<version>-<b>-<p>."""
    runs: dict = defaultdict(dict)
    for f in sorted(folder.glob("*/r*-*/slide_*.json")):
        r = json.loads(f.read_text())["results"][0]
        rnd, version, backend, precision = f.parent.name.split("-", 3)
        runs[(f.parent.parent.name, version, f"{backend}-{precision}")][int(rnd[1:])] = r
    return runs


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def summary(folder: Path) -> list[str]:
    runs = load(folder)
    lines = [
        "| model | version | engine | cells/s | engine-only cells/s | efficiency | wait s |"
        " auto / fp32 (same round) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (model, version, engine), rounds in sorted(runs.items()):
        rs = list(rounds.values())
        ratio = ""
        if engine == "auto-auto":
            fp32 = runs.get((model, version, "onnx-fp32"), {})
            ratios = [
                r["cells_per_s"] / fp32[k]["cells_per_s"] for k, r in rounds.items() if k in fp32
            ]
            ratio = spread(ratios) if ratios else ""
        engine_name = engine
        if engine == "auto-auto" and rs[0].get("precision"):
            engine_name = f"auto: {rs[0]['backend']} {rs[0]['precision']}"
        lines.append(
            f"| {model} | {version} | {engine_name} | "
            f"{spread([r['cells_per_s'] for r in rs])} | "
            f"{spread([r['engine_cells_per_s'] for r in rs])} | "
            f"{spread([r['pipeline_efficiency'] for r in rs])} | "
            f"{spread([r['timings_s']['wait'] for r in rs])} | {ratio} |"
        )
    stages = ["mask", "read", "detect", "crop", "nucleus", "engine", "write", "wait", "finish"]
    lines += [
        "",
        "Median seconds of each stage (read, detect, crop and nucleus in the worker; the rest in"
        " the engine's process; wait: the engine's process waiting for a tile result):",
        "",
        "| model | version | engine | total s | " + " | ".join(stages) + " |",
        "|---|---|---|---|" + "---|" * len(stages),
    ]
    for (model, version, engine), rounds in sorted(runs.items()):
        rs = list(rounds.values())
        cells = [f"{statistics.median(r['timings_s'].get(s, 0.0) for r in rs):.2f}" for s in stages]
        total = statistics.median(r["seconds"] for r in rs)
        row = f"| {model} | {version} | {engine} | {total:.2f} | "
        lines.append(row + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = "\n".join(summary(args.folder)) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
