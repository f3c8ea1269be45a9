"""Validate the calibrated outputs of ``cyto score`` on synthetic cohorts: FDR of the flagged
cells, coverage of the burden interval, slide triage per witness rate (issue 18).

Two cohorts of synthetic slides, each with its own slide-negative calibration slides: a
development cohort, on which the per-slide normalization (``slide`` or ``none``) is chosen by a
rule stated before looking (below), and a final cohort with other seeds, scored once, on which
both are reported. Every synthetic slide draws its own stain (the generator's per-slide
``StainStyle``), so normal slides differ as real ones do.

Slides are scored by the real pipeline (``score_slide`` with the slide's ground truth); the
bundle is calibrated on the cohort's calibration slides with ``calibrate_from_tables``. The two
normalizations are then evaluated on the same score tables, and the pipeline's own columns are
checked against that evaluation.

Choice rule (development cohort): among normalizations whose false discovery rate over all
slides is at most alpha + 2 Monte-Carlo standard errors and whose burden interval covers the
abnormal cells above the threshold on at least 90% of slides, the one with the higher power;
if none qualifies, the one with the lower FDR.

What the burden counts (``--burden-cells``, default both, on the same tables): ``evaluable``, each
slide's evaluable cells (the table's ``evaluable`` column, written under ``cyto score``'s default
``--adequacy general``) against the calibration slides' evaluable cells, as ``cyto score`` does
since 6e3baad; ``all``, every cell against a calibration that marks none, the count before (and
this script's only one before). p-values and flags are every cell's under both; the script
checks that the two counts flag the same cells. ``--dev-per-rate 0`` skips the development cohort.

    python benchmarks/burden/burden_fdr.py --model demo_out/dsvdd.cyto \
        --work /tmp/burden --results benchmarks/results/vm-2core/burden
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from cyto.stats.conformal import DEFAULT_NORMALIZATION, NORMALIZATIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402

STAINS = {"batch": "one per cohort (exchangeable slides)", "per-slide": "each slide its own"}
RATES = (0.0, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.09)
# seed blocks; the final cohort's is an option: block 2000 was the first final cohort, scored
# before ``median`` normalization existed (its results are kept in results/.../round1)
COHORTS = {"development": 1000, "final": 3000}
COUNTED_ALL = "all"  # cyto.stats.calibrate.COUNTED_ALL / COUNTED_EVALUABLE
COUNTS = ("evaluable", COUNTED_ALL)  # what --burden-cells may ask the burden to count


def _slides(
    work: Path, seed0: int, n_cal: int, per_rate: int, size: int, n_cells: int, batch: bool
):
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    made = {"calibration": [], "test": []}
    (work / "slides").mkdir(parents=True, exist_ok=True)
    jobs = [("calibration", 0.0, i) for i in range(n_cal)]
    jobs += [("test", r, i) for r in RATES for i in range(per_rate)]
    for k, (part, rate, i) in enumerate(jobs):
        path = work / "slides" / f"{part}-{rate:g}-{i}.ndpi"
        truth = path.with_suffix(".cells.parquet")
        if not (path.is_file() and truth.is_file()):
            res = write_slide(
                path,
                SlideSynthConfig(
                    width=size,
                    height=size,
                    n_cells=n_cells,
                    abnormal_fraction=rate,
                    seed=seed0 + k,
                    stain_seed=seed0 if batch else None,
                ),
                overwrite=True,
            )
            truth = res.ground_truth
        made[part].append((path, rate, truth))
    return made


def _score(scorer, slides, out: Path) -> list[Path]:
    from cyto.infer import score_slide
    from cyto.infer.options import ScoreOptions

    tables = []
    for path, _, truth in slides:
        folder = out / path.stem
        if not (folder / "scores.parquet").is_file() or not (folder / "summary.json").is_file():
            opts = ScoreOptions(mosaic=0, top_k=50, truth=truth)
            score_slide(path, scorer, folder, opts, echo=lambda _: None)
        tables.append(folder / "scores.parquet")
    return tables


def _near_abnormal(table, truth: Path, summary: Path) -> np.ndarray:
    """Per detection: a planted abnormal cell's centre lies inside its crop. Such a crop is not
    a normal cell's crop even when the detection itself matched no abnormal cell (a second
    detection of a big cell, a neighbour), so the 'crop null' FDR does not count it as false."""
    import pyarrow.parquet as pq

    gt = pq.read_table(truth)
    abn = np.asarray(gt["label"]) == 1
    half = json.loads(summary.read_text())["resolution"]["crop_px_level0"] / 2
    xy = np.stack([np.asarray(table["x"]), np.asarray(table["y"])], 1)
    pts = np.stack([np.asarray(gt["x"]), np.asarray(gt["y"])], 1)[abn]
    if not len(pts):
        return np.zeros(len(xy), dtype=bool)
    inside = (np.abs(xy[:, None, :] - pts[None, :, :]) <= half).all(axis=2)
    return inside.any(axis=1)


def _evaluate(
    parts,
    tests,
    how: str,
    alpha: float,
    confidence: float | None = None,
    *,
    count: str = "all",
    cal_evaluable: list[np.ndarray] | None = None,
) -> list[dict]:
    """One row per test slide: flags, burden and slide test against ``parts`` normalized ``how``
    (flags from calibration-conditional p-values with ``confidence``).

    ``count``: the cells the burden, slide test and bulk check count. ``all``: every cell,
    against a calibration that marks none (cyto before 6e3baad, and ``cyto score`` on a
    calibration from tables without an ``evaluable`` column). ``evaluable``: each test slide's
    evaluable cells (the fifth element of its ``tests`` entry) against the calibration slides'
    evaluable cells ``cal_evaluable`` (``cyto score``'s default). Either way every cell keeps its
    p-value and flag. A row's ``detectable`` is the abnormal cells above the burden's threshold
    *among the cells the burden counted* (every cell for ``all``)."""
    from cyto.stats import calibrate

    marks = cal_evaluable if count == calibrate.COUNTED_EVALUABLE else None
    if count == calibrate.COUNTED_EVALUABLE and marks is None:
        raise ValueError("count='evaluable' needs the calibration slides' evaluable marks")
    info = {"normalization": how, **calibrate.leave_one_slide_out(parts, how, alpha, marks)}
    cal = calibrate.Calibration(parts, info, marks)
    rows = []
    for (_, rate), (scores, labels, pipeline_flags, near, *more) in tests:
        ev = more[0] if more else None
        pipeline_burden = more[1] if len(more) > 1 else None  # the run's summary.json burden
        res = calibrate.apply(
            scores,
            cal,
            alpha=alpha,
            confidence=confidence,
            evaluable=ev if marks is not None else None,
        )
        b = res["burden"]
        abnormal = labels == 1
        counted = (
            ev if b.get("counted") == calibrate.COUNTED_EVALUABLE else np.ones(len(scores), bool)
        )
        row = {
            "rate": rate,
            "count": count,
            "cells": len(scores),
            "abnormal": int(abnormal.sum()),
            "status": b["status"],
            "counted": b.get("counted"),
            "counted_cells": int(counted.sum()),
            "abnormal_counted": int((abnormal & counted).sum()),
        }
        if ev is not None:
            row["evaluable_cells"] = int(ev.sum())
            row["abnormal_not_evaluable"] = int((abnormal & ~ev).sum())
        flags = res["columns"]["flagged_bh"]
        row["_flags"] = flags  # for comparing the counts' flags; not written
        if b["status"] == "ok":
            adaptive = res["columns"]["flagged_adaptive"]
            detectable = int(np.sum(abnormal & counted & (scores > b["threshold"])))
            lo, hi = b["abnormal_cells_interval"]
            row.update(
                {
                    "flagged": int(flags.sum()),
                    "fdp": float(np.sum(flags & (labels == 0)) / max(flags.sum(), 1)),
                    "fdp_crop": float(np.sum(flags & (labels == 0) & ~near) / max(flags.sum(), 1)),
                    "fdp_adaptive": float(
                        np.sum(adaptive & (labels == 0)) / max(adaptive.sum(), 1)
                    ),
                    "power": float(np.sum(flags & abnormal) / abnormal.sum())
                    if abnormal.sum()
                    else None,
                    "threshold": float(b["threshold"]),
                    "detectable": detectable,
                    "estimate": b["abnormal_cells"],
                    "bias": b["abnormal_cells"] - detectable,
                    "low": lo,
                    "high": hi,
                    "covers_detectable": bool(lo <= detectable <= hi),
                    "covers_counted": bool(lo <= row["abnormal_counted"] <= hi),
                    "covers_all": bool(lo <= abnormal.sum() <= hi),  # JSON: no numpy bool
                    "slide_p": b["slide_p_value"],
                    "excess": bool(b["triage"] == calibrate.TRIAGE_EXCESS),
                }
            )
            if pipeline_flags is not None:
                row["pipeline_agrees"] = bool(np.array_equal(pipeline_flags, flags))
            if pipeline_burden is not None and pipeline_burden.get("counted") == b["counted"]:
                row["pipeline_burden_agrees"] = bool(
                    pipeline_burden.get("status") == "ok"
                    and np.isclose(pipeline_burden["abnormal_cells"], b["abnormal_cells"])
                    and np.isclose(pipeline_burden["slide_p_value"], b["slide_p_value"])
                )
        rows.append(row)
    return rows


def _same_flags(a: list[dict], b: list[dict]) -> list[bool | None]:
    """Per slide: the two evaluations flagged the same cells (None: one reported no flags, a
    bulk mismatch; it is then compared as 'not the same' only if the other did flag)."""
    out = []
    for ra, rb in zip(a, b, strict=True):
        fa, fb = ra["_flags"], rb["_flags"]
        if fa is None or fb is None:
            out.append(fa is None and fb is None)
        else:
            out.append(bool(np.array_equal(fa, fb)))
    return out


def _se(values) -> float:
    v = list(values)
    return statistics.stdev(v) / np.sqrt(len(v)) if len(v) > 1 else float("nan")


def _auroc_pair(a: list[dict], b: list[dict], boot: int = 2000, seed: int = 0) -> dict | None:
    """Slide AUROC of every positive slide (rate > 0) against the rate-0 slides under two
    evaluations of the same slides, on the slides both gave a slide p-value, and a paired
    bootstrap over slides (nulls and positives resampled apart) of the difference a - b."""
    from sklearn.metrics import roc_auc_score

    both = [
        i
        for i, (ra, rb) in enumerate(zip(a, b, strict=True))
        if "slide_p" in ra and "slide_p" in rb
    ]
    null = np.array([i for i in both if a[i]["rate"] == 0])
    pos = np.array([i for i in both if a[i]["rate"] > 0])
    if len(null) < 2 or len(pos) < 2:
        return None

    def auc(rows, n, p):
        y = np.r_[np.zeros(len(n)), np.ones(len(p))]
        return float(roc_auc_score(y, -np.array([rows[i]["slide_p"] for i in [*n, *p]])))

    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(boot):
        n, p = rng.choice(null, len(null)), rng.choice(pos, len(pos))
        diffs.append(auc(a, n, p) - auc(b, n, p))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {
        "null_slides": int(len(null)),
        "positive_slides": int(len(pos)),
        "auroc_a": auc(a, null, pos),
        "auroc_b": auc(b, null, pos),
        "difference": auc(a, null, pos) - auc(b, null, pos),
        "difference_se": float(np.std(diffs, ddof=1)),
        "difference_95": [float(lo), float(hi)],
        "bootstrap": boot,
    }


def _share_se(values) -> float | None:
    """Binomial Monte-Carlo se of a share of slides."""
    v = [bool(x) for x in values]
    if not v:
        return None
    p = float(np.mean(v))
    return float(np.sqrt(p * (1 - p) / len(v)))


def _summarise(rows: list[dict], alpha: float) -> list[dict]:
    from sklearn.metrics import roc_auc_score

    out = []
    null_p = [r["slide_p"] for r in rows if r["rate"] == 0 and "slide_p" in r]
    for rate in [*RATES, "all"]:
        sel = [r for r in rows if rate == "all" or r["rate"] == rate]
        if not sel:
            continue
        ok = [r for r in sel if r["status"] == "ok"]
        fdp = [r["fdp"] for r in ok]

        def mean(key, rs=ok):
            return float(np.mean([r[key] for r in rs])) if rs else None

        row = {
            "rate": rate,
            "slides": len(sel),
            "mismatch": len(sel) - len(ok),
            "cells_mean": float(np.mean([r["cells"] for r in sel])),
            "counted_mean": mean("counted_cells", sel),
            "abnormal_mean": float(np.mean([r["abnormal"] for r in sel])),
            "abnormal_counted_mean": mean("abnormal_counted", sel),
            "fdr": float(np.mean(fdp)) if fdp else None,
            "fdr_se": _se(fdp) if fdp else None,
            "fdr_crop": mean("fdp_crop"),
            "fdr_crop_se": _se([r["fdp_crop"] for r in ok]) if ok else None,
            "fdr_adaptive": mean("fdp_adaptive"),
            "power": float(np.mean([r["power"] for r in ok if r["power"] is not None]))
            if any(r["power"] is not None for r in ok)
            else None,
            "coverage_detectable": mean("covers_detectable"),
            "coverage_detectable_se": _share_se([r["covers_detectable"] for r in ok]),
            "coverage_counted": mean("covers_counted"),
            "coverage_all": mean("covers_all"),
            "estimate_mean": mean("estimate"),
            "detectable_mean": mean("detectable"),
            "bias_mean": mean("bias"),
            "bias_sd": float(np.std([r["bias"] for r in ok], ddof=1)) if len(ok) > 1 else None,
            "triage_excess": mean("excess"),
            "triage_excess_se": _share_se([r["excess"] for r in ok]),
        }
        marked = [r for r in sel if "abnormal_not_evaluable" in r]
        if marked:
            row["evaluable_mean"] = mean("evaluable_cells", marked)
            row["abnormal_not_evaluable_mean"] = mean("abnormal_not_evaluable", marked)
            n_abn = sum(r["abnormal"] for r in marked)
            row["abnormal_not_evaluable_share"] = (
                sum(r["abnormal_not_evaluable"] for r in marked) / n_abn if n_abn else None
            )
        pos = [r["slide_p"] for r in ok if r["rate"] == rate] if rate not in (0.0, "all") else []
        if pos and null_p:
            y = np.r_[np.zeros(len(null_p)), np.ones(len(pos))]
            row["slide_auroc"] = float(roc_auc_score(y, -np.r_[null_p, pos]))
        agree = [r["pipeline_agrees"] for r in ok if "pipeline_agrees" in r]
        if agree:
            row["pipeline_agrees"] = f"{sum(agree)}/{len(agree)}"
        agree = [r["pipeline_burden_agrees"] for r in ok if "pipeline_burden_agrees" in r]
        if agree:
            row["pipeline_burden_agrees"] = f"{sum(agree)}/{len(agree)}"
        same = [r["flags_same"] for r in sel if "flags_same" in r]
        if same:
            row["flags_same"] = f"{sum(same)}/{len(same)}"
        out.append(row)
    return out


def _choose(summaries: dict[str, list[dict]], alpha: float) -> str:
    def qualifies(s):
        a = s[-1]  # "all"
        return (
            a["fdr"] is not None
            and a["fdr"] <= alpha + 2 * a["fdr_se"]
            and (a["coverage_detectable"] or 0) >= 0.9
        )

    ok = [h for h, s in summaries.items() if qualifies(s)]
    if ok:
        return max(ok, key=lambda h: summaries[h][-1]["power"] or 0)
    return min(summaries, key=lambda h: summaries[h][-1]["fdr"] or 1)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(6, 5))
    true_frac = np.array([r["abnormal"] / r["cells"] for r in ok])
    est = np.array([r["estimate"] / r["cells"] for r in ok])
    err = np.array(
        [
            [e - r["low"] / r["cells"], r["high"] / r["cells"] - e]
            for r, e in zip(ok, est, strict=True)
        ]
    )
    det = np.array([r["detectable"] / r["cells"] for r in ok])
    ax.errorbar(true_frac, est, yerr=err.T, fmt="o", ms=3, alpha=0.6, label="estimate, 95% CI")
    ax.plot(true_frac, det, "x", ms=4, color="k", alpha=0.6, label="truth above threshold")
    top = max(0.1, float(true_frac.max(initial=0)) * 1.1)
    ax.plot([0, top], [0, top], "--", color="grey", lw=1)
    ax.set_xlabel("true abnormal fraction (detections matched to planted abnormal cells)")
    ax.set_ylabel("estimated abnormal fraction")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _evaluable(table, name) -> np.ndarray:
    """A score table's ``evaluable`` column (null: not evaluable, as ``cyto calibrate`` reads
    it); exits saying so when the table has none."""
    if "evaluable" not in table.column_names:
        raise SystemExit(
            f"{name}: no evaluable column (scored with --adequacy none, or by a cyto before "
            "it): rerun with --burden-cells all, or score again"
        )
    column = table["evaluable"]
    return np.asarray(column.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("demo_out/dsvdd.cyto"))
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--calibration-slides", type=int, default=10)
    ap.add_argument(
        "--dev-per-rate",
        type=int,
        default=5,
        help="test slides per rate of the development cohort; 0: no development cohort, the "
        "default normalization is the one plotted",
    )
    ap.add_argument("--final-per-rate", type=int, default=15)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument(
        "--cells",
        type=int,
        default=None,
        help="cells per slide (default: the generator's "
        "smear density, about 260 on 2048^2; denser slides crowd the crops)",
    )
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--final-seed", type=int, default=COHORTS["final"])
    ap.add_argument(
        "--stain",
        choices=("per-slide", "batch"),
        default="per-slide",
        help="per-slide: every slide its own stain (normal slides differ, as across a lab's "
        "months); batch: one stain per cohort (exchangeable slides, the guarantee's premise)",
    )
    ap.add_argument(
        "--burden-cells",
        default="evaluable,all",
        help="comma-separated: the cells the burden counts, each evaluated on the same tables. "
        "evaluable: each slide's evaluable cells against the calibration slides' (cyto score's "
        "default since 6e3baad; needs the tables' evaluable column); all: every cell against a "
        "calibration marking none (the behaviour before, and this script's only one before)",
    )
    args = ap.parse_args()
    counts = [c.strip() for c in args.burden_cells.split(",") if c.strip()]
    if not counts or any(c not in COUNTS for c in counts) or len(set(counts)) < len(counts):
        ap.error(f"--burden-cells: a comma-separated subset of {','.join(COUNTS)}")

    import pyarrow.parquet as pq

    from cyto.runtime import load_scorer
    from cyto.stats.calibrate import calibrate_from_tables

    t0 = time.perf_counter()
    report, all_rows = {}, {}
    chosen = None
    COHORTS["final"] = args.final_seed
    if args.dev_per_rate == 0:  # no development cohort: the default normalization is reported
        del COHORTS["development"]
        chosen = DEFAULT_NORMALIZATION
    cost, pairs = {}, {}
    for cohort, seed0 in COHORTS.items():
        per_rate = args.dev_per_rate if cohort == "development" else args.final_per_rate
        work = args.work / cohort
        slides = _slides(
            work,
            seed0,
            args.calibration_slides,
            per_rate,
            args.size,
            args.cells,
            args.stain == "batch",
        )
        bundle = work / "model.cyto"
        if not bundle.is_dir():
            shutil.copytree(args.model, bundle)
        scorer = load_scorer(bundle, "onnx", "cpu")
        cal_tables = _score(scorer, slides["calibration"], work / "scores")
        # default normalization; a rerun replaces the last run's calibration
        calibrate_from_tables(bundle, cal_tables, alpha=args.alpha, overwrite=True)
        scorer = load_scorer(bundle, "onnx", "cpu")  # now calibrated
        test_tables = _score(scorer, slides["test"], work / "scores-calibrated")
        cal_read = [pq.read_table(t) for t in cal_tables]
        parts = [np.asarray(t["score"], dtype=np.float64) for t in cal_read]
        need_marks = "evaluable" in counts
        cal_marks = (
            [_evaluable(t, n) for t, n in zip(cal_read, cal_tables, strict=True)]
            if need_marks
            else None
        )
        tests = []
        for (_, rate, truth), table in zip(slides["test"], test_tables, strict=True):
            t = pq.read_table(table)
            near = _near_abnormal(t, truth, table.parent / "summary.json")
            flags = np.asarray(t["flagged_bh"]) if "flagged_bh" in t.column_names else None
            if flags is not None and t["flagged_bh"].null_count:
                flags = None
            data = [np.asarray(t["score"], dtype=np.float64), np.asarray(t["label"]), flags, near]
            if need_marks:
                data.append(_evaluable(t, table))
                # the run's own burden (cyto score's default count) to check the offline one
                data.append(json.loads((table.parent / "summary.json").read_text()).get("burden"))
            tests.append(((table, rate), tuple(data)))
        if need_marks:
            cost[cohort] = {
                "calibration_cells": int(sum(len(p) for p in parts)),
                "calibration_evaluable": int(sum(m.sum() for m in cal_marks)),
            }
        summaries = {}
        for how in NORMALIZATIONS:
            rows = {}
            for count in counts:
                rows[count] = _evaluate(
                    parts, tests, how, args.alpha, count=count, cal_evaluable=cal_marks
                )
                # the pipeline's columns are the default normalization's (any count: the
                # flags do not depend on it unless the bulk check does)
                if how != DEFAULT_NORMALIZATION:
                    for r in rows[count]:
                        r.pop("pipeline_agrees", None)
                        r.pop("pipeline_burden_agrees", None)
            if len(counts) > 1:
                same = _same_flags(rows[counts[0]], rows[counts[1]])
                for count in counts:
                    for r, x in zip(rows[count], same, strict=True):
                        r["flags_same"] = x
                pairs[f"{cohort}/{how}"] = _auroc_pair(rows[counts[0]], rows[counts[1]])
            for count in counts:
                for r in rows[count]:
                    r.pop("_flags")
                all_rows[f"{cohort}/{how}/{count}"] = rows[count]
                summaries[(how, count)] = _summarise(rows[count], args.alpha)
        if cohort == "development":
            ref = COUNTED_ALL if COUNTED_ALL in counts else counts[0]
            chosen = _choose({h: summaries[(h, ref)] for h in NORMALIZATIONS}, args.alpha)
        report[cohort] = summaries
        print(
            f"{cohort}: {len(slides['test'])} test slides scored ({time.perf_counter() - t0:.0f} s)"
        )

    args.results.mkdir(parents=True, exist_ok=True)
    plots = {}
    for count in counts:
        plots[count] = args.results / f"burden_vs_truth_{count}.png"
        _plot(
            all_rows[f"final/{chosen}/{count}"],
            plots[count],
            f"final cohort, {chosen} normalization, alpha {args.alpha}, burden over {count} cells",
        )
    meta = {
        **machine(),
        "model": str(args.model),
        "alpha": args.alpha,
        "slides": {"size_px": args.size, "cells": args.cells, "rates": RATES, "stain": args.stain},
        "calibration_slides": args.calibration_slides,
        "per_rate": {"development": args.dev_per_rate, "final": args.final_per_rate},
        "burden_cells": counts,
        "evaluable_cells": cost,
        "auroc_pairs": {"counts": counts[:2], **pairs} if len(counts) > 1 else None,
        "chosen_on_development": chosen if "development" in COHORTS else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    chose = (
        f"Normalization chosen on the development cohort by the rule in the script: **{chosen}**"
        if "development" in COHORTS
        else f"No development cohort (--dev-per-rate 0): **{chosen}** is cyto's default"
    )
    md = [
        "# Burden and FDR on synthetic cohorts (issue 18)",
        "",
        f"`python benchmarks/burden/burden_fdr.py --model {args.model} --work {args.work} "
        f"--results {args.results} --calibration-slides {args.calibration_slides} "
        f"--dev-per-rate {args.dev_per_rate} --final-per-rate {args.final_per_rate} "
        f"--final-seed {args.final_seed} --stain {args.stain} --burden-cells {','.join(counts)}` "
        f"on {meta['host']} ({meta['cpu_count']} CPUs); {meta['seconds']} s.",
        f"Slides {args.size}² px with {args.cells or 'the default density of'} cells; stain: "
        f"{STAINS[args.stain]}; "
        f"{args.calibration_slides} slide-negative calibration slides per cohort; alpha "
        f"{args.alpha}. {chose} (cyto's default: {DEFAULT_NORMALIZATION}); final cohort seeds "
        f"from {args.final_seed}.",
        "",
        "FDR: mean false discovery proportion of BH-flagged cells over slides (± Monte-Carlo "
        "se; the slides share one calibration, so this se understates the spread over "
        "calibrations); FDR (crop null): a flagged detection counts as false only if no planted "
        "abnormal cell lies inside its crop; power: share of abnormal detections flagged; "
        "the burden counts `evaluable` cells (each slide's evaluable cells against the "
        "calibration slides' evaluable cells, cyto score's default) or `all` cells (every cell, "
        "the count before 6e3baad); coverage (detectable): share of slides whose 95% interval "
        "holds the abnormal detections above the burden's threshold *among the cells the burden "
        "counted*; coverage (counted): holds all abnormal detections among the counted cells; "
        "coverage (all): holds every abnormal detection of the slide; bias: estimate minus "
        "detectable (mean ± sd over slides); triage: share of slides called 'excess' at level "
        "0.05 (± binomial se); slide AUROC: slide p-values of that rate against the rate-0 "
        "slides; flags same: slides whose BH flags the two counts share (they differ only "
        "where one count's bulk check refuses the slide); mismatch: slides without a burden "
        "(bulk mismatch, or no evaluable cell); pipeline = offline: the run's flags are the "
        "offline ones; pipeline burden = offline: the run's burden and slide p-value (the count "
        "it made) are the offline ones of that count.",
    ]
    from cyto.bench.results import markdown_table

    cols = [
        ("rate", "WR"),
        ("slides", "slides"),
        ("mismatch", "mismatch"),
        ("abnormal_mean", "abnormal/slide"),
        ("fdr", "FDR"),
        ("fdr_se", "se"),
        ("fdr_crop", "FDR (crop null)"),
        ("fdr_crop_se", "se "),
        ("fdr_adaptive", "FDR adaptive"),
        ("power", "power"),
        ("coverage_detectable", "coverage (detectable)"),
        ("coverage_all", "coverage (all)"),
        ("estimate_mean", "estimate"),
        ("detectable_mean", "detectable"),
        ("triage_excess", "triage excess"),
        ("slide_auroc", "slide AUROC"),
        ("pipeline_agrees", "pipeline = offline"),
        ("pipeline_burden_agrees", "pipeline burden = offline"),
    ]
    side = [("rate", "WR"), ("slides", "slides")]
    per_count = [
        ("mismatch", "mismatch"),
        ("counted_mean", "counted cells"),
        ("abnormal_counted_mean", "abnormal counted"),
        ("detectable_mean", "detectable"),
        ("estimate_mean", "estimate"),
        ("bias", "bias ± sd"),
        ("coverage_detectable", "cov. (detectable)"),
        ("coverage_counted", "cov. (counted)"),
        ("coverage_all", "cov. (all)"),
        ("triage", "triage excess ± se"),
        ("slide_auroc", "slide AUROC"),
    ]
    for cohort in COHORTS:
        if len(counts) > 1:
            for how in NORMALIZATIONS:
                merged = []
                for rows_c in zip(*(report[cohort][(how, c)] for c in counts), strict=True):
                    m = {k: rows_c[0][k] for k in ("rate", "slides")}
                    first = rows_c[0]
                    for c, r in zip(counts, rows_c, strict=True):
                        m[f"fdr/{c}"] = (
                            None if r["fdr"] is None else f"{r['fdr']:.3f} ± {r['fdr_se']:.3f}"
                        )
                    m["flags_same"] = first.get("flags_same")
                    m["abnormal_mean"] = first["abnormal_mean"]
                    m["not_evaluable"] = first.get("abnormal_not_evaluable_mean")
                    m["not_evaluable_share"] = first.get("abnormal_not_evaluable_share")
                    for c, r in zip(counts, rows_c, strict=True):
                        for k, _ in per_count:
                            v = r.get(k)
                            if k == "bias":
                                v = (
                                    None
                                    if r["bias_mean"] is None
                                    else f"{r['bias_mean']:+.2f} ± {r['bias_sd'] or 0:.2f}"
                                )
                            elif k == "triage":
                                v = (
                                    None
                                    if r["triage_excess"] is None
                                    else f"{r['triage_excess']:.2f} ± {r['triage_excess_se']:.2f}"
                                )
                            m[f"{k}/{c}"] = v
                    merged.append(m)
                md += ["", f"## {cohort} cohort, {how} normalization: the two counts", ""]
                md += markdown_table(
                    merged,
                    [
                        *side,
                        ("abnormal_mean", "abnormal/slide"),
                        ("not_evaluable", "abnormal not evaluable/slide"),
                        ("not_evaluable_share", "share not evaluable"),
                        *((f"fdr/{c}", f"FDR ± se [{c}]") for c in counts),
                        ("flags_same", "flags same"),
                    ],
                )
                md += [""]
                md += markdown_table(
                    merged,
                    side + [(f"{k}/{c}", f"{h} [{c}]") for k, h in per_count for c in counts],
                )
                pair = pairs.get(f"{cohort}/{how}")
                if pair:
                    md += [
                        "",
                        f"Slide AUROC of the {pair['positive_slides']} positive slides (every rate "
                        f"above 0) against the {pair['null_slides']} rate-0 slides, on the slides "
                        f"both counts gave a slide p-value: {counts[0]} {pair['auroc_a']:.3f}, "
                        f"{counts[1]} {pair['auroc_b']:.3f}; difference "
                        f"{pair['difference']:+.3f} ± {pair['difference_se']:.3f} (paired "
                        f"bootstrap over slides, {pair['bootstrap']} draws; 95% "
                        f"{pair['difference_95'][0]:+.3f} to {pair['difference_95'][1]:+.3f}).",
                    ]
        for (how, count), summary in report[cohort].items():
            md += ["", f"## {cohort} cohort, {how} normalization, burden over {count} cells", ""]
            md += markdown_table(summary, cols)
    md += [""] + [f"![estimated vs true burden, {c} cells]({plots[c].name})" for c in counts]
    rows = [
        {
            "cohort": c,
            "normalization": h,
            "burden_cells": k,
            "summary": s,
            "slides": all_rows[f"{c}/{h}/{k}"],
        }
        for c in COHORTS
        for (h, k), s in report[c].items()
    ]
    write(args.results, "burden_fdr", meta, rows, md)
    print(
        json.dumps(
            {c: {f"{h}/{k}": s[-1] for (h, k), s in report[c].items()} for c in COHORTS},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
