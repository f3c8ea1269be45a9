"""The burden over the evaluable cells against the burden over every cell, on slides scored by
the pipeline: demo-like synthetic slides, in focus and out of focus, negative and with planted
abnormal cells, scored once by ``cyto score`` with a calibrated bundle whose calibration marks
its evaluable cells; both burdens are computed from the same score tables
(:func:`cyto.stats.calibrate.apply` with and without the table's ``evaluable`` column).

    python benchmarks/burden/burden_evaluable.py --model M.cyto --work /tmp/bev \
        --results benchmarks/results/epyc-2core/burden-evaluable

``--model``: a bundle calibrated (``cyto calibrate``) on tables scored with an adequacy rule,
e.g. a copy of ``make demo``'s ``dsvdd.cyto`` calibrated again on its ``negative_scores``.
Writes ``slides.jsonl`` (one line a slide) and ``summary.md`` under ``--results``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np


def _cyto(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "cyto", *args], check=True, capture_output=True)


def _burden_words(b: dict) -> dict:
    if b["status"] != "ok":
        return {"status": b["status"]}
    return {
        "status": "ok",
        "abnormal_fraction": round(b["abnormal_fraction"], 4),
        "interval": [round(v, 4) for v in b["abnormal_fraction_interval"]],
        "slide_p": round(b["slide_p_value"], 4),
        "triage": b["triage"],
        "cells": b["cells"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--seeds", default="60,61,62,63")
    ap.add_argument("--defocus", default="0,1", help="um, comma-separated")
    ap.add_argument("--abnormal", default="0,0.02", help="planted shares, comma-separated")
    ap.add_argument("--size", type=int, default=2048)
    args = ap.parse_args()

    from cyto.bundle import load_bundle
    from cyto.stats import calibrate
    from cyto.tables import read_table

    cal = calibrate.Calibration.of(load_bundle(args.model, weights=False))
    if cal is None or cal.evaluable is None:
        sys.exit(f"{args.model}: no calibration marking its evaluable cells (cyto calibrate)")
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds.split(","):
        for d in args.defocus.split(","):
            for ab in args.abnormal.split(","):
                name = f"s{seed}_d{d}_a{ab}"
                slide = args.work / f"{name}.ndpi"
                out = args.work / "out" / name
                if not (out / "summary.json").is_file():
                    _cyto(
                        "synth", "slide", str(slide), "--width", str(args.size), "--height",
                        str(args.size), "--seed", seed, "--abnormal-fraction", ab,
                        "--defocus", d, "--workers", "1", "--overwrite",
                    )  # fmt: skip
                    _cyto(
                        "score", str(slide), "--model", str(args.model), "--out",
                        str(args.work / "out"), "--mosaic", "0", "--qupath", "none",
                        "--truth", str(args.work / f"{name}.cells.parquet"), "--resume",
                    )  # fmt: skip
                table = read_table(out / "scores.parquet")
                summary = json.loads((out / "summary.json").read_text())
                scores = np.asarray(table["score"], dtype=np.float64)
                evaluable = np.asarray(table["evaluable"], dtype=bool)
                labels = np.asarray(table["label"])
                every = calibrate.apply(scores, cal)["burden"]
                counted = calibrate.apply(scores, cal, evaluable=evaluable)["burden"]
                a = summary["adequacy"]
                rows.append(
                    {
                        "slide": name,
                        "seed": int(seed),
                        "defocus_um": float(d),
                        "abnormal_fraction": float(ab),
                        "cells": len(scores),
                        "planted_abnormal": summary["truth"]["planted_abnormal"],
                        "labelled_abnormal": int((labels == 1).sum()),
                        "labelled_abnormal_evaluable": int((labels[evaluable] == 1).sum()),
                        "adequacy": a["result"],
                        "cells_evaluable": a["cells_evaluable"],
                        "out_of_focus_share": a["out_of_focus_share"],
                        "crowded_share": a["crowded_share"],
                        "burden_every_cell": _burden_words(every),
                        "burden_evaluable": _burden_words(counted),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    with open(args.results / "slides.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    lines = [
        "| slides | excess over every cell | excess over evaluable cells |",
        "|---|---|---|",
    ]
    for d in sorted({r["defocus_um"] for r in rows}):
        for ab in sorted({r["abnormal_fraction"] for r in rows}):
            group = [r for r in rows if r["defocus_um"] == d and r["abnormal_fraction"] == ab]
            n = len(group)
            old = sum(r["burden_every_cell"].get("triage") == "excess" for r in group)
            new = sum(r["burden_evaluable"].get("triage") == "excess" for r in group)
            lines.append(f"| defocus {d:g} um, {ab:.0%} abnormal | {old}/{n} | {new}/{n} |")
    (args.results / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
