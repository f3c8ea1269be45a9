"""FDR of ``cyto score``'s flagged cells over many calibration draws (issue 18).

Conformal BH controls the FDR on average over calibration sets: the expectation runs over the
calibration slides as well as the scored slides. ``burden_fdr.py`` scores each cohort against
one calibration, so its FDR is one draw of a calibration-conditional quantity (0.146 and 0.025
for two one-stain cohorts). This script re-uses the score tables ``burden_fdr.py`` left in its
work folders and, per cohort, draws the calibration many times from the cohort's negative
slides:

- the pool: every slide of the cohort with no planted abnormal cell (its calibration slides and
  the test slides at witness rates 0-0.1% that drew none); all are slide-negative and of one
  stain batch, so exchangeable;
- per draw: ``--calibration-slides`` of the pool calibrate (the pipeline's default
  normalization, leave-one-slide-out tolerances, as ``cyto calibrate`` does); the rest of the
  pool and every slide with abnormal cells are scored against it, flags by BH at ``--alpha``;
- per cohort: the FDR averaged over draws (the marginal FDR the guarantee is about), the
  spread of the per-draw FDR (how far one lab's calibration can be from it), and a bootstrap
  over the cohort's slides for the Monte-Carlo error of the mean (slides are the independent
  units; draws only average over calibrations).

"Label" FDR counts every flagged detection not matched to a planted abnormal cell as false;
"crop null" does not count one whose crop holds a planted abnormal cell (a second detection of
a big cell, a neighbour), since no calibration crop holds one and such a crop is not a normal
cell's.

    python benchmarks/burden/burden_resample.py --cohort /tmp/b18/batch-dsvdd/final \
        --cohort /tmp/b18/batch2/final --cohort /tmp/b18/batch-dsvdd/development \
        --results benchmarks/results/vm-2core/burden/resampled
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cyto.stats.conformal import DEFAULT_NORMALIZATION

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402
from burden_fdr import _evaluate, _near_abnormal  # noqa: E402


def _load(cohort: Path) -> list[dict]:
    """Every slide of a ``burden_fdr.py`` cohort folder with its scores, labels and crop-null
    mask, from the tables that script wrote."""
    import pyarrow.parquet as pq

    out = []
    for slide in sorted((cohort / "slides").glob("*.ndpi")):
        part, rate, _ = slide.stem.split("-")
        folder = cohort / ("scores" if part == "calibration" else "scores-calibrated") / slide.stem
        table = pq.read_table(folder / "scores.parquet")
        truth = slide.with_suffix(".cells.parquet")
        labels = np.asarray(table["label"])
        near = _near_abnormal(table, truth, folder / "summary.json")
        out.append(
            {
                "name": slide.stem,
                "rate": float(rate),
                "scores": np.asarray(table["score"], dtype=np.float64),
                "labels": labels,
                "near": near,
                "negative": bool(labels.sum() == 0 and not near.any()),
            }
        )
    if not out:
        raise SystemExit(f"{cohort}: no slides/*.ndpi (a burden_fdr.py cohort folder?)")
    return out


def _draw(slides: list[dict], cal_idx, alpha: float, confidence: float | None) -> dict:
    """Per-slide false discovery proportions and flags of one calibration draw."""
    cal = set(int(i) for i in cal_idx)
    parts = [slides[i]["scores"] for i in sorted(cal)]
    test_idx = [i for i in range(len(slides)) if i not in cal]
    tests = [
        (
            (slides[i]["name"], slides[i]["rate"]),
            (slides[i]["scores"], slides[i]["labels"], None, slides[i]["near"]),
        )
        for i in test_idx
    ]
    rows = _evaluate(parts, tests, DEFAULT_NORMALIZATION, alpha, confidence)
    ok = [(r, i) for r, i in zip(rows, test_idx, strict=True) if r["status"] == "ok"]
    return {
        "fdp": np.array([r["fdp"] for r, _ in ok]),
        "fdp_crop": np.array([r["fdp_crop"] for r, _ in ok]),
        "fdp_adaptive": np.array([r["fdp_adaptive"] for r, _ in ok]),
        "negative": np.array([slides[i]["negative"] for _, i in ok]),
        "flagged": np.array([r["flagged"] for r, _ in ok]),
        "true": np.array([int(slides[i]["labels"].sum()) for _, i in ok]),
        "hits": np.array([(r["power"] or 0.0) * slides[i]["labels"].sum() for r, i in ok]),
        "index": np.array([i for _, i in ok], dtype=np.int64),
        "mismatch": len(rows) - len(ok),
    }


def _summary(cells: list[dict], n: int, alpha: float, boot: int, rng) -> dict:
    """Mean over draws, the spread of one draw, and a bootstrap over slides for the se."""
    per_draw = [
        {
            "fdr": float(d["fdp"].mean()),
            "fdr_crop": float(d["fdp_crop"].mean()),
            "fdr_adaptive": float(d["fdp_adaptive"].mean()),
            "null_slides_flagged": float((d["flagged"][d["negative"]] > 0).mean()),
            "power": float(d["hits"].sum() / max(d["true"].sum(), 1)),
            "flagged_per_slide": float(d["flagged"].mean()),
        }
        for d in cells
    ]
    out = {"draws": len(cells)}
    for key in per_draw[0]:
        v = np.array([p[key] for p in per_draw])
        out[key] = float(v.mean())
        out[f"{key}_draw_sd"] = float(v.std(ddof=1))
        out[f"{key}_draw_p10_p90"] = [float(np.quantile(v, 0.1)), float(np.quantile(v, 0.9))]
    # each draw's per-slide FDP reweighted by a resample of the cohort's slides
    for key, col in (("fdr", "fdp"), ("fdr_crop", "fdp_crop")):
        means = []
        for _ in range(boot):
            w = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
            means.append(
                np.mean(
                    [
                        np.sum(w[d["index"]] * d[col]) / max(np.sum(w[d["index"]]), 1e-12)
                        for d in cells
                    ]
                )
            )
        out[f"{key}_se"] = float(np.std(means, ddof=1))
    out["draws_above_alpha"] = float(np.mean([p["fdr"] > alpha for p in per_draw]))
    out["draws_above_alpha_crop"] = float(np.mean([p["fdr_crop"] > alpha for p in per_draw]))
    out["mismatch_per_draw"] = float(np.mean([d["mismatch"] for d in cells]))
    return out, per_draw


def _cohort(slides, draws: int, n_cal: int, alpha: float, boot: int, seed: int, modes):
    """{mode: (summary, per-draw rows)}; every mode sees the same calibration draws."""
    rng = np.random.default_rng(seed)
    pool = np.flatnonzero([s["negative"] for s in slides])
    if len(pool) <= n_cal:
        raise SystemExit(f"{len(pool)} negative slides: too few for {n_cal} calibration slides")
    picks = [rng.choice(pool, n_cal, replace=False) for _ in range(draws)]
    out = {}
    for mode in modes:
        cells = [_draw(slides, p, alpha, mode) for p in picks]
        summary, per_draw = _summary(cells, len(slides), alpha, boot, rng)
        summary["negative_pool"] = int(len(pool))
        out[mode] = (summary, per_draw)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cohort", type=Path, action="append", required=True)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--calibration-slides", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--confidence",
        type=float,
        default=0.9,
        help="also flag with calibration-conditional p-values at this confidence (0: only the "
        "marginal ones)",
    )
    args = ap.parse_args()

    t0 = time.perf_counter()
    modes = (None, args.confidence) if args.confidence else (None,)
    label = {None: "marginal", args.confidence: f"conditional {args.confidence:g}"}
    by_mode, draws = {m: [] for m in modes}, {}
    for k, cohort in enumerate(args.cohort):
        slides = _load(cohort)
        res = _cohort(
            slides,
            args.draws,
            args.calibration_slides,
            args.alpha,
            args.boot,
            args.seed + k,
            modes,
        )
        for mode, (s, per_draw) in res.items():
            row = {"flags": label[mode], "cohort": str(cohort), "slides": len(slides), **s}
            by_mode[mode].append(row)
            draws[f"{cohort} {label[mode]}"] = per_draw
            print(json.dumps(row), flush=True)
    rows = []
    for mode, mode_rows in by_mode.items():
        # cohorts are independent: their means, weighted by slides, and the se combined
        w = np.array([r["slides"] for r in mode_rows], dtype=np.float64)
        w /= w.sum()
        pooled = {
            "flags": label[mode],
            "cohort": "all (slide-weighted)",
            "slides": int(sum(r["slides"] for r in mode_rows)),
        }
        for key in (
            "fdr",
            "fdr_crop",
            "fdr_adaptive",
            "null_slides_flagged",
            "power",
            "flagged_per_slide",
        ):
            pooled[key] = float(np.sum(w * [r[key] for r in mode_rows]))
        for key in ("fdr", "fdr_crop"):
            pooled[f"{key}_se"] = float(
                np.sqrt(np.sum(w**2 * [r[f"{key}_se"] ** 2 for r in mode_rows]))
            )
        rows += [*mode_rows, pooled]

    meta = {
        **machine(),
        "alpha": args.alpha,
        "calibration_slides": args.calibration_slides,
        "draws": args.draws,
        "boot": args.boot,
        "normalization": DEFAULT_NORMALIZATION,
        "confidence": args.confidence or None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    from cyto.bench.results import markdown_table

    for r in rows:
        for key in ("fdr_draw_p10_p90", "fdr_crop_draw_p10_p90"):
            if key in r:
                r[key.replace("_p10_p90", "_range")] = "{:.3f}-{:.3f}".format(*r[key])
    md = [
        "# FDR over calibration draws (issue 18)",
        "",
        "`python benchmarks/burden/burden_resample.py "
        f"{' '.join(f'--cohort {c}' for c in args.cohort)}"
        f" --results {args.results}` on {meta['host']} ({meta['cpu_count']} CPUs); "
        f"{meta['seconds']} s. {args.draws} draws of {args.calibration_slides} calibration "
        f"slides from each cohort's negative slides, alpha {args.alpha}, {DEFAULT_NORMALIZATION} "
        f"normalization; se: bootstrap over the cohort's slides ({args.boot}); draw sd and "
        "p10-p90: the spread of one calibration's FDR. Marginal: `cyto score`'s default "
        "p-values (FDR <= alpha on average over calibrations); conditional: `--fdr-confidence` "
        "(FDR <= alpha for the calibration with that probability).",
        "",
    ]
    md += markdown_table(
        rows,
        [
            ("flags", "p-values"),
            ("cohort", "cohort"),
            ("slides", "slides"),
            ("negative_pool", "negative pool"),
            ("fdr", "FDR"),
            ("fdr_se", "se"),
            ("fdr_draw_range", "one draw p10-p90"),
            ("draws_above_alpha", "draws > alpha"),
            ("fdr_crop", "FDR (crop null)"),
            ("fdr_crop_se", "se "),
            ("fdr_crop_draw_range", "one draw p10-p90 "),
            ("fdr_adaptive", "FDR adaptive"),
            ("null_slides_flagged", "negative slides with a flag"),
            ("power", "power"),
            ("flagged_per_slide", "flags/slide"),
            ("mismatch_per_draw", "mismatch slides/draw"),
        ],
    )
    write(args.results, "burden_resample", meta, [*rows, {"per_draw": draws}], md)


if __name__ == "__main__":
    main()
