"""The end of a slide: rank the cells, add the calibration's columns, write every output and the
summary (:func:`finish_slide`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cyto.bundle import atomic_write
from cyto.infer.memory import peak_rss_mb
from cyto.infer.options import STAGES, ScoreOptions, check_rank_by
from cyto.infer.outputs import (
    MOSAIC_FILES,
    NO_TRUTH_OF_SLIDE,
    labels_from_truth,
    ranks,
    table_metadata,
    truth_report,
    write_mosaics,
    write_score_table,
    write_top_k,
    written_outputs,
)
from cyto.infer.plan import TileRun
from cyto.infer.qupath import write_qupath
from cyto.infer.scale import Resolution
from cyto.location import recorded
from cyto.runtime import Scorer
from cyto.seal import SEAL, seal_outputs, unseal
from cyto.stats import calibrate
from cyto.tables import json_text

Metrics = Callable[[np.ndarray, np.ndarray, int], dict]
SUMMARY = "summary.json"


def finish_slide(table, plan, runs, out_dir, scorer, opts, echo, metrics, t_start) -> dict:
    """Rank and write every output of a slide scored by ``runs`` (one, or one per range of
    tiles); writes and returns the summary."""
    timings = dict.fromkeys(STAGES, 0.0)
    for r in runs:
        for stage, seconds in r.timings.items():
            timings[stage] += seconds
    run = _Run(plan.slide, out_dir, scorer, opts, timings, t_start, plan.res, echo, metrics)
    run.identity = plan.identity
    run.resumed_cells = sum(r.resumed_cells for r in runs)
    run.plan, run.scale, run.stain = plan, runs[0].scale, getattr(runs[0], "stain", None)
    summary = _finish(table, run)
    if few := few_cells_words(table.num_rows, len(plan.jobs), plan.slide_mpp, opts):
        echo(f"warning: {plan.slide.name}: {few}")
    rss = [r.worker_rss_mb for r in runs if r.worker_rss_mb is not None]
    summary.update(
        {
            "loop_seconds": round(sum(r.loop_seconds for r in runs), 2),
            "workers": plan.workers,
            "peak_rss_workers_mb": round(max(rss), 1) if rss else None,
            "focal_planes_um": list(plan.ctx.plane_z),
            # the haematoxylin threshold every tile was detected at (None: each tile's own)
            "detection_threshold": plan.threshold,
            "detection_crowding": runs[0].crowd,
            "cell_scale": runs[0].scale,
            # the first cells' stain against the model's training cells' (cyto.detect.stain)
            "cell_stain": getattr(runs[0], "stain", None),
            "decode": plan.decode,
            "engine_lane": engine_lane(runs, scorer.device),
            "tiles": {"total": len(plan.jobs), "resumed_from": runs[0].resumed_tiles},
            "rows_kept": runs[0].kept,  # its cells are a finished run's, kept (--resume)
            "rows_key": plan.store_key(scorer, opts, len(plan.jobs)),  # what its rows are of
        }
    )
    if len(runs) > 1:
        summary["tiles"]["parts"] = len(runs)
        summary["tiles"]["resumed"] = sum(r.resumed_tiles for r in runs)
    write_summary(out_dir, summary)
    return summary


def engine_lane(runs: list[TileRun], device: str) -> dict:
    """How busy the engine was over the tile loop: the share of the loop spent in engine calls
    (wall time), on CUDA the GPU's busy fraction from CUDA events around those calls, and the
    bytes copied from host memory to the device per cell."""
    loop = sum(r.loop_seconds for r in runs)
    cells = sum(r.cells for r in runs)
    busy = sum(r.timings["engine"] for r in runs)
    cuda = device.startswith("cuda")
    return {
        "overlap": any(r.overlap for r in runs),
        "engine_busy_fraction": round(busy / loop, 3) if loop > 0 else None,
        "gpu_busy_fraction": (
            round(sum(r.engine_device_s for r in runs) / loop, 3) if cuda and loop > 0 else None
        ),
        "h2d_bytes_per_cell": (
            round(sum(r.h2d_bytes for r in runs) / cells, 1) if cuda and cells else None
        ),
    }


_COLUMN_TYPES = {"p_value": "float64", "flagged_bh": "bool", "flagged_adaptive": "bool"}


def _calibrated(scores: np.ndarray, run: _Run, quality=None, table=None, how="model") -> dict:
    """The calibration's columns and burden block (:func:`cyto.stats.calibrate.apply`; the
    burden over the cells ``quality`` marks evaluable, under ``--burden-cells evaluable`` and
    where the calibration marks its own), or why there are none; says out loud when the run
    differs from the calibration's."""
    bundle = run.scorer.bundle
    cal = calibrate.Calibration.of(bundle)
    if cal is None:
        burden = {
            "status": "not calibrated",
            "reason": "no slide-negative calibration in this bundle: run cyto calibrate "
            f"{bundle.path} NEGATIVE/scores.parquet ... for p-values, FDR flags and burden",
        }
        # each option asked for that nothing here can act on (--fdr too: it was not said)
        from cyto.flags import passing

        ignored = [  # each one given, whatever its value (--fdr 0.1 is the default's too)
            passing(name, getattr(run.opts, name))
            for name in ("fdr_confidence", "fdr_alpha", "triage_level", "burden_cells")
            if getattr(run.opts, name) is not None
        ]
        if ignored:  # a warning: flags asked for are not there (a Python caller's
            burden["ignored"] = ignored  # echo=None lost the note: hostile round 73, 2)
            run.echo(
                f"warning: {run.slide.name}: {' and '.join(ignored)} "
                f"{'does' if len(ignored) == 1 else 'do'} nothing without a calibration (the "
                "bundle has none)"
            )
        return {"burden": burden}
    differs = cal.differences(run.scorer, run.opts.result_key())
    if any(d.startswith("MODEL ") for d in differs):
        return {
            "burden": {
                "status": calibrate.CALIBRATION_MISMATCH,
                "reason": "the calibration was made with another model: calibrate again",
            }
        }
    scores, lacking = calibrate.held_values(cal, scores, table)  # the score it holds
    if lacking:
        return {"burden": {"status": calibrate.CALIBRATION_MISMATCH, "reason": lacking}}
    other = calibrate.ranking_words(cal.column, how)
    if other is not None:
        run.echo(f"warning: {run.slide.name}: {other}")
    why_all = "--burden-cells all" if run.opts.counting == calibrate.COUNTED_ALL else None
    evaluable = quality["evaluable"] if quality is not None and why_all is None else None
    out = calibrate.apply(
        scores,
        cal,
        alpha=run.opts.alpha,
        triage_level=run.opts.triage,
        confidence=run.opts.fdr_confidence,
        evaluable=evaluable,
        why_all=why_all,
        cause=calibrate.known_cause(differs, run.scale),
    )
    if differs:
        run.echo(
            f"warning: {run.slide.name}: scored unlike the calibration slides ("
            + "; ".join(differs)
            + "): p-values, FDR flags and burden assume the same scoring; calibrate again on "
            "slide-negative slides scored this way"
        )
        out["burden"]["scored_unlike_calibration"] = differs
    # what its threshold and p-values are of (the map's), and why not of the ranking
    out["burden"].update(column=cal.column, **({"ranked_otherwise": other} if other else {}))
    own = calibrate.calibration_slide_words(cal.info, run.identity, run.slide.name)
    if own:  # triaged "no excess" against a null holding its own cells, with no word
        out["burden"]["calibration_slide"] = True
        run.echo(f"warning: {own}")
    if out["burden"]["status"] != "ok":
        run.echo(f"warning: {run.slide.name}: {out['burden']['reason']}")
    elif "note" in out["burden"]:
        run.echo(f"note: {run.slide.name}: {out['burden']['note']}")
    return out


class _Run:
    """What the finishing step of one slide needs to know about its run."""

    def __init__(self, slide, out_dir, scorer, opts, timings, t_start, res, echo, metrics):
        self.slide: Path = slide
        self.out_dir: Path = out_dir
        self.scorer: Scorer = scorer
        self.opts: ScoreOptions = opts
        self.timings: dict = timings
        self.t_start: float = t_start
        self.res: Resolution = res
        self.echo = echo
        self.metrics: Metrics | None = metrics
        self.identity: str = ""
        self.resumed_cells: int = 0
        self.plan = None  # the slide's plan (its geometry, for the adequacy's area shares)
        self.scale: dict | None = None  # the first cells' scale and stain checks
        self.stain: dict | None = None


#: tiles with tissue from which fewer cells than tiles is worth a word
FEW_CELLS_TILES = 4


def few_cells_words(n_cells: int, n_tiles: int, slide_mpp, opts) -> str | None:
    """Why so few cells, when a slide's tissue gave fewer cells than tiles (a smear at the
    scale assumed gives dozens a tile): a section read as a smear, or a resolution that makes
    every nucleus look too small or too large. A slide of 19 tissue tiles with no recorded
    resolution gave 7 cells and no word (QA). None otherwise, or with --nuclei."""
    if opts.nuclei is not None or n_tiles < FEW_CELLS_TILES or n_cells >= n_tiles:
        return None
    from cyto.flags import UM_PER_PX, passing, said

    mpp = slide_mpp or opts.detection.mpp
    section = (
        f" A section ({passing('detection', 'tissue')})?" if opts.detection.kind != "tissue" else ""
    )
    return (  # in the caller's words: flags at the command line, keywords from Python
        f"only {n_cells} cells found in {n_tiles} tiles with tissue (fewer than one a tile), "
        f"with nucleus sizes for {opts.detection.kind} at {mpp:g} um/px"
        + ("" if slide_mpp else " (assumed: the slide records none)")
        + f". Is the resolution right ({passing('slide_mpp', UM_PER_PX)})?{section} Or "
        f"give the nuclei with {said('nuclei')}"
    )


def slide_scores(table, scores: np.ndarray, k: int) -> dict:
    """The slide's scores for a cohort: ``slide_score_mean_top_k``, the mean of the model's
    score over its own top ``k`` cells, and, where the table holds a morphometric score,
    ``slide_morphometry_mean_top_k``, the mean of that over its own top ``k``: each a score of
    one kind, comparable across slides whatever ranked the cells (the model's scores of the
    cells the morphometric score ranked first were neither: hostile round 25)."""
    out: dict = {"slide_score_mean_top_k": _mean_top(scores, k)}
    if "morphometry_score" in table.column_names:
        import pyarrow as pa
        import pyarrow.compute as pc

        column = table["morphometry_score"].cast(pa.float64())
        morph = pc.fill_null(column, float("nan")).to_numpy(zero_copy_only=False)
        out["slide_morphometry_mean_top_k"] = _mean_top(morph, k)
    return out


def _mean_top(values: np.ndarray, k: int) -> float | None:
    """The mean of the ``k`` highest finite ``values`` (None where there are none)."""
    top = np.sort(values[np.isfinite(values)])[-k:] if k > 0 else values[:0]
    return float(top.mean()) if len(top) else None


def rank_by(scorer: Scorer, opts) -> str:
    """``opts.rank_by`` resolved for ``scorer``'s bundle (``model``, ``morphometry`` or
    ``model+morphometry``), or the one-line error: called before a slide is scored, so a bad
    choice costs nothing."""
    from cyto.data.morphometry import scorer_rank_by

    return scorer_rank_by(scorer, opts.rank_by)[0]


def _ranked_by(table, scores: np.ndarray, run: _Run) -> tuple[str, np.ndarray]:
    """What orders the cells (:func:`rank_by`) and the values it ranks by: the model's scores,
    the morphometric score, or their fused score (:func:`cyto.data.morphometry.ranked_values`)."""
    from cyto.data.morphometry import ranked_values

    how = rank_by(run.scorer, run.opts)
    if how == "model" or not len(scores):
        return how, scores
    morph = table["morphometry_score"].to_numpy(zero_copy_only=False)
    return how, ranked_values(how, scores, np.asarray(morph, dtype=np.float64))


def _finish(table, run: _Run) -> dict:
    """Rank the cells and write every output; returns the summary."""
    import pyarrow as pa

    opts, bundle, timings = run.opts, run.scorer.bundle, run.timings
    t_fin = time.perf_counter()
    n_cells = table.num_rows
    scores = np.asarray(table["score"], dtype=np.float64) if n_cells else np.empty(0)
    how, ranked = _ranked_by(table, scores, run)
    if how == "model+morphometry":
        table = table.append_column("fused_score", pa.array(ranked))
    order, rank = ranks(ranked, then=scores)
    table = table.append_column("rank", pa.array(rank))
    k = min(opts.top_k, n_cells)
    quality, adequacy = _adequacy(table, run)
    calibrated = _calibrated(scores, run, quality, table, how)
    for name, column in calibrated.get("columns", {}).items():  # None: the flags are withheld
        values = [None] * n_cells if column is None else column
        table = table.append_column(name, pa.array(values, type=_COLUMN_TYPES[name]))
    burden = calibrated["burden"]
    trained = calibrate.training_slide_words(bundle.manifest, run.identity, run.slide.name)
    if trained:  # ranked low for having been learned, with no word
        burden["training_slide"] = True
        run.echo(f"warning: {trained}")
    table = _with_quality(table, quality, burden, adequacy)
    labels = None
    truth = None
    if opts.truth is not None and n_cells:
        size = getattr(run.plan, "size", None)  # truth cells off the slide are said, left out
        labels, truth_idx, planted, classes = labels_from_truth(
            table, opts.truth, opts.truth_radius, size, classes=True
        )
        if labels is None:  # no truth cell of this slide (said): no label column, no metrics
            truth = {"k": k, **NO_TRUTH_OF_SLIDE}
        else:
            table = table.append_column("label", pa.array(labels.astype(np.int8)))
            if classes is not None:  # cyto eval scores --by-class on a composed slide
                table = table.append_column("class", pa.array(classes.tolist(), pa.string()))
            truth = truth_report(ranked, order, labels, truth_idx, planted, k, run.metrics)
    meta = table_metadata(run.scorer, run.slide, run.identity, timings, opts.result_key())
    meta["cyto.rank_by"] = how  # what the rank follows (cyto eval scores reads it)
    # the folder stops reading as a finished run until this run's summary and seal are written,
    # last (cyto.seal): stopped while the outputs below are rewritten, it is scored again on
    # --resume, never taken for done with half of them; mosaics this run does not draw are
    # another run's
    drawn = () if opts.mosaic and n_cells else MOSAIC_FILES
    for name in (SEAL, SUMMARY, *drawn):
        (run.out_dir / name).unlink(missing_ok=True)
    write_score_table(table, run.out_dir, meta)
    write_top_k(table, order, k, run.out_dir, mpp=run.res.slide_mpp)
    qupath = write_qupath(
        table,
        run.out_dir,
        opts.qupath_outputs(),
        top_k=k,
        slide=run.slide,
        mpp=run.res.slide_mpp,
        assumed_mpp=opts.detection.mpp,
        window_um=opts.map_um,
        burden=burden,
        rank_by=how,
    )
    if n_cells == 0:
        run.echo(f"warning: no cells found in {run.slide}; wrote an empty score table")
    summary = {
        "slide": str(run.slide),
        "output": recorded(run.out_dir),  # a staging folder: the prefix it stands for
        "slide_identity": run.identity,
        "model": bundle.recorded_path,
        "model_sha256": bundle.manifest_hash,
        "scale_sha256": run.scorer.scale_sha256,  # one value: one scale (the cohort check)
        "method": bundle.method,
        "backend": run.scorer.backend.name,
        "device": run.scorer.device,
        "precision": run.scorer.precision,
        "graph": run.scorer.graph_ran,  # the table's cyto.graph
        # the check of this graph on the golden cells here ("skipped": the user's override)
        "verification": (
            run.scorer.verification.as_json() if run.scorer.verification is not None else None
        ),
        "cells_scored": int(n_cells),
        "rank_by": how,
        # auto's choice resting on too few held-back abnormal cells: recorded where it ranked
        "rank_by_caution": check_rank_by(run.scorer, opts.rank_by),
        **slide_scores(table, scores, k),
        "burden": burden,
        "resolution": run.res.as_json(),
    }
    if adequacy is not None:
        summary["adequacy"] = adequacy
    if truth is not None:
        summary["truth"] = truth
    if opts.mosaic and n_cells:
        summary["mosaic"] = recorded(  # absolute, as the output beside it (round 28, 16)
            write_mosaics(
                run.slide, table, order, labels, opts.mosaic, run.out_dir, run.res.crop_px_level0
            )
        )
    timings["finish"] = time.perf_counter() - t_fin
    seconds = time.perf_counter() - run.t_start
    stage_total = sum(v for k2, v in timings.items() if k2 != "wait") or 1e-9
    # rates of this run only: a resumed run scored just the cells after the resume point
    new_cells = n_cells - run.resumed_cells
    engine_rate = new_cells / timings["engine"] if timings["engine"] > 0 else None
    summary.update(
        {
            "seconds": round(seconds, 2),
            "cells_this_run": int(new_cells),
            "cells_resumed": int(run.resumed_cells),
            # none when every cell came from finished chunks: this run scored nothing
            "cells_per_s": round(new_cells / max(seconds, 1e-9), 1) if new_cells else None,
            "engine_cells_per_s": round(engine_rate, 1) if engine_rate else None,
            "pipeline_efficiency": (
                round(new_cells / max(seconds, 1e-9) / engine_rate, 3) if engine_rate else None
            ),
            "timings_s": {k2: round(v, 2) for k2, v in timings.items()},
            "stage_share": {
                k2: round(v / stage_total, 3) for k2, v in timings.items() if k2 != "wait"
            },
            "peak_rss_mb": peak_rss_mb(),
            "options": opts.as_json(),
            "output_key": opts.output_key(),
            "outputs": written_outputs(
                n_cells, k, bool(opts.mosaic and n_cells), qupath, table.column_names
            ),
        }
    )
    return summary  # written, and the folder sealed, by finish_slide


def _adequacy(table, run: _Run) -> tuple[dict | None, dict | None]:
    """(the ``quality`` and ``evaluable`` columns, the adequacy block) of the slide under the
    ``--adequacy`` rule (:mod:`cyto.stats.adequacy`), said when not satisfactory; or None."""
    from cyto.infer.quality import focus_reference, slide_adequacy
    from cyto.runtime.verify import read_golden
    from cyto.stats.adequacy import adequacy_words

    rule = run.opts.adequacy_rule()
    if rule is None:
        return None, None
    plan = run.plan
    columns, block = slide_adequacy(
        table,
        rule,
        reference=focus_reference(run.scorer.golden or read_golden(run.scorer.bundle)),
        scale=run.scale,
        stain=run.stain,
        crop_px=run.res.crop_px_level0,
        tile=run.opts.tile,
        size=plan.size,
        n_tissue_tiles=len(plan.jobs),
        detection=run.opts.detection.kind,
        mpp_ratio=None if run.opts.rescale else run.res.mpp_ratio,
    )
    if block["result"] != "satisfactory":
        run.echo(f"warning: {run.slide.name}{adequacy_words(block)}")
    return columns, block


def _with_quality(table, quality: dict | None, burden: dict, block: dict | None):
    """The table with its ``quality`` and ``evaluable`` columns (:func:`_adequacy`; without
    them, and without the sharpness column, under ``--adequacy none``); the triage of an
    unsatisfactory slide says so instead of 'no excess', and the burden says how many evaluable
    cells the slide has."""
    import pyarrow as pa

    from cyto.stats.adequacy import triage_words

    if quality is None:
        return table.drop_columns(["sharpness"])
    table = table.append_column("quality", pa.array(quality["quality"], type=pa.string()))
    table = table.append_column("evaluable", pa.array(quality["evaluable"], type=pa.bool_()))
    if burden.get("status") == "ok":
        burden["evaluable_cells"] = block["cells_evaluable"]
        burden["triage"] = triage_words(burden["triage"], block)
    return table


def write_summary(out_dir: Path, summary: dict) -> None:
    """``summary.json``, at once, then the folder's seal over it and every output its
    ``outputs`` lists (:func:`cyto.seal.seal_outputs`, written last: it says the folder's
    outputs are whole, and only a folder whose seal holds is reused, shown or reviewed)."""
    from cyto.infer.qupath import QUPATH_FILES

    out_dir = Path(out_dir)
    unseal(out_dir)
    atomic_write(out_dir / SUMMARY, json_text(summary, indent=2, default=str).encode())
    owned = [*written_outputs(0, 0, True), *QUPATH_FILES.values()]
    seal_outputs(out_dir, (summary.get("outputs") or {}).keys(), owned)


#: the output-key fields that only choose the QuPath outputs (cyto.infer.qupath)
QUPATH_KEYS = ("qupath", "map_um")


def rewrite_qupath(out_dir: Path, summary: dict, opts: ScoreOptions, slide: Path) -> dict:
    """Write the QuPath outputs ``opts`` asks for into the finished folder ``out_dir`` from its
    score table, and the summary that lists them (written last, at once); returns it. For a
    finished slide whose table, ranks and other outputs hold (:func:`cyto.reuse.check_reuse`)
    and whose QuPath outputs differ, are missing or are cut short: the cells need no second
    scoring to be drawn again."""

    from cyto.infer.qupath import QUPATH_FILES
    from cyto.tables import read_table

    unseal(out_dir)  # the folder is being rewritten: no seal vouches for it until it is whole
    table = read_table(Path(out_dir) / "scores.parquet")
    k = min(int((summary.get("output_key") or {}).get("top_k") or opts.top_k), table.num_rows)
    written = write_qupath(
        table,
        Path(out_dir),
        opts.qupath_outputs(),
        top_k=k,
        slide=slide,
        mpp=(summary.get("resolution") or {}).get("slide_mpp"),
        assumed_mpp=opts.detection.mpp,
        window_um=opts.map_um,
        burden=summary.get("burden"),
        rank_by=summary.get("rank_by"),
    )
    files = set(QUPATH_FILES.values())
    outputs = {n: s for n, s in (summary.get("outputs") or {}).items() if n not in files}
    key = opts.output_key()
    summary = {
        **summary,
        "outputs": {**outputs, **written},
        "output_key": {**summary["output_key"], **{f: key[f] for f in QUPATH_KEYS}},
        "options": {**(summary.get("options") or {}), "qupath": opts.qupath, "map_um": opts.map_um},
    }
    write_summary(Path(out_dir), summary)
    return summary
