"""One call for a cohort, on this machine or a Ray cluster, and the one-line report of a slide."""

from __future__ import annotations

from pathlib import Path

from cyto.cohort.local import REUSED, score_cohort
from cyto.errors import ConfigError, CytoError, InputPathError
from cyto.infer import ScoreOptions
from cyto.infer.finish import Metrics
from cyto.location import OutputLocation
from cyto.slides.remote import slide_name


def run_cohort(
    slides: list[Path],
    model: Path,
    out: Path | OutputLocation,
    opts: ScoreOptions,
    ray: str | None = None,
    echo=print,
    metrics: Metrics | None = None,
    part_tiles: int = 256,
    overwrite: bool = False,
) -> tuple[list[dict], list[tuple[Path, CytoError]]]:
    """Score ``slides`` into ``out`` here (``ray`` None) or on a Ray cluster (``auto``, ``local``
    or HOST:PORT), where a slide of more than ``part_tiles`` tiles is scored in parts by several
    engines at once (0: whole slides only). Returns (summaries, failures as (slide, error)).
    A slide's finished results in ``out`` are scored again only with ``opts.resume`` (kept
    where they still hold) or ``overwrite``. ``out``: a folder, or a prefix in object storage
    (:class:`~cyto.location.OutputLocation`: ``s3://bucket/scored/``)."""
    from cyto.cohort.local import stage
    from cyto.location import output_location

    refuse_resume_and_overwrite(opts.resume, overwrite)
    where = output_location(out)
    if not where.is_remote:  # resumed or overwritten too: a user's own files stay
        from cyto.cohort.local import output_folders

        for _, folder in output_folders(slides, where.local):
            refuse_users_outputs(folder)
    if not (opts.resume or overwrite):
        stage(where, slides)  # a prefix's folders, read where they are checked
        try:
            refuse_rescoring(slides, where.local)
        except CytoError as exc:
            where.translated(exc)
            raise
    from cyto.outputs_check import FRESH_ONLY

    token = FRESH_ONLY.set(not (opts.resume or overwrite))  # a Ray cohort's engines too
    try:
        if ray is None:
            return score_cohort(slides, model, where, opts, echo=echo, metrics=metrics)
        from cyto.cohort.ray import score_cohort_ray

        if part_tiles < 0:
            raise ConfigError(f"--ray-part-tiles must be >= 0, got {part_tiles}")
        return score_cohort_ray(slides, model, where, opts, ray, echo, metrics, part_tiles or None)
    finally:
        FRESH_ONLY.reset(token)


def refuse_resume_and_overwrite(resume: bool, overwrite: bool) -> None:
    """A slide's finished results are either kept (``resume``) or scored over (``overwrite``):
    asked for both, ``--overwrite`` was silently ignored. Refused in one line naming both in
    the caller's words (``cyto score`` and :func:`cyto.score_slide` alike)."""
    from cyto.outputs_check import refuse_keep_and_replace

    refuse_keep_and_replace(
        resume,
        overwrite,
        "keeps a slide's finished results where they still hold",
        "scores it again",
    )


def refuse_rescoring(slides: list[Path], out: Path) -> None:
    """A slide's folder in ``out`` that holds its finished results (a summary and a score
    table) is not scored over without --resume or --overwrite (:mod:`cyto.outputs_check`);
    another slide's folder is never written over (:func:`output_folders` puts this one beside
    it)."""
    from cyto.cohort.local import output_folders

    for slide, folder in output_folders(slides, out):
        refuse_finished(folder, slide.name, False)


def refuse_finished(
    folder: Path,
    slide_name: str,
    overwrite: bool,
    resumed: str | Path | None = None,
    *,
    field: str = "out",
    resumable: bool = True,
) -> None:
    """``folder`` holding a slide's finished results (a summary and a score table) is refused
    unless ``overwrite``, or resume (``resumed``: the slide resumed, as given) where what it
    holds is that slide's: resume keeps a slide's own results where they still hold and never
    replaces another slide's finished or interrupted run (by the rule that gives each slide of a
    cohort its own folder, :func:`cyto.cohort.local.held_by_another`: the same file, or the
    same content). One line, in the caller's words (:mod:`cyto.flags`), naming the slide the
    results are of (another slide's, when its summary says so). ``cyto score`` and
    :func:`cyto.score_slide` alike, and ``cyto bench slide --work`` (``field``: the option
    naming the folder; ``resumable``: whether the caller can resume, and is told so). A
    ``summary.json`` cyto did not write (:func:`cyto.seal.written_by_cyto`) is refused even with
    ``overwrite``, naming it."""
    import json

    from cyto.cohort.local import refuse_cohort_folder
    from cyto.flags import passing, said
    from cyto.outputs_check import refuse_foreign, refuse_to_replace
    from cyto.seal import SUMMARY, written_by_cyto

    folder = Path(folder)
    refuse_cohort_folder(folder, slide_name, field)  # a cohort's folder is no slide's
    if not written_by_cyto(folder):  # a user's own summary.json: not results, never replaced
        refuse_foreign([SUMMARY], passing(field, folder))
    refuse_users_outputs(folder, field)
    if resumed is not None and not overwrite:
        from cyto.cohort.local import held_by_another

        other = held_by_another(folder, resumed)
        if other is not None:
            raise InputPathError(
                f"{passing(field, folder)} holds {other}: {passing('resume')} keeps the "
                f"results of {slide_name}, never another slide's (give another {said(field)}, "
                f"or pass {passing('overwrite')} to replace them)"
            )
        return
    if overwrite or not (
        (folder / "summary.json").is_file() and (folder / "scores.parquet").is_file()
    ):
        return
    try:
        recorded = json.loads((folder / "summary.json").read_text()).get("slide")
    except (OSError, ValueError, AttributeError):
        recorded = None
    of = Path(str(recorded)).name if recorded else slide_name
    refuse_to_replace(
        folder,
        False,
        name=f"{passing(field, folder)} (the finished results of {of})",
        other=f"{passing('resume')} to keep them where they still hold" if resumable else "",
    )


def refuse_users_outputs(folder: Path, field: str = "out") -> None:
    """A slide's folder where no run of cyto's is (none finished: no summary; none stopped: no
    ``.partial``) that holds files under the names of its outputs holds the user's own files:
    refused in one line naming one, with ``--overwrite``, ``--resume`` or neither (a user's
    ``cells.geojson`` there was written over without a word). A folder staged from an object
    store prefix is not checked (its files are a publish that stopped half way, cyto's)."""
    from cyto.flags import passing
    from cyto.infer.finish import written_outputs
    from cyto.infer.qupath import QUPATH_FILES
    from cyto.infer.store import PARTIAL
    from cyto.location import shown
    from cyto.outputs_check import refuse_foreign
    from cyto.seal import SUMMARY, is_cyto_table_file

    folder = Path(folder)
    if (folder / SUMMARY).is_file() or (folder / PARTIAL).is_dir():
        return
    if shown(folder) != str(folder):  # staged from a prefix: a publish stopped half way
        return
    names = [*written_outputs(0, 0, True), *QUPATH_FILES.values()]
    # a table that says it is cyto's is a failed run's (its outputs written, then the disk
    # filled; its .partial removed by hand), never the user's: it was refused as "cyto did
    # not write", with or without --overwrite (hostile round 65, 2)
    theirs = [n for n in names if (folder / n).exists() and not is_cyto_table_file(folder / n)]
    refuse_foreign(theirs, passing(field, folder))


def as_found(summary: dict, out) -> dict:
    """``summary`` naming the folder under ``out`` (a folder, or an :class:`OutputLocation`) it
    was found in: a reused slide's summary records the folder it was written in, which a copied
    or moved cohort folder no longer is (its row in cohort.csv is taken by the folder's name
    under OUT, the same rule)."""
    from cyto.location import shown

    if not summary.get(REUSED) or not summary.get("output"):
        return summary
    home = Path(getattr(out, "local", out))
    return {**summary, "output": shown(home / Path(str(summary["output"])).name)}


def slide_line(summary: dict, out: Path) -> str:
    """A scored slide in one line: cells, time, rates, where it went, its burden and truth."""
    s = as_found(summary, out)
    where = s.get("output") or Path(str(out)) / Path(s["slide"]).stem
    if s.get(REUSED):  # kept from an earlier run: its time is not this run's
        line = f"{slide_name(s['slide'])}: already scored ({s[REUSED]}): {s['cells_scored']} cells"
        return line + f" -> {where}" + _findings(s)
    if s.get("cells_per_s") is not None:
        rate = f"{s['cells_per_s']} cells/s, engine {s.get('engine_cells_per_s')} cells/s"
    elif s.get("rows_kept"):  # the cells of a finished run, kept: only its outputs written
        rate = "its cells kept from the finished run; its outputs written again"
    elif s.get("cells_resumed"):  # this run scored nothing: every cell came from its chunks
        rate = f"all {s['cells_resumed']} from finished chunks"
    else:
        rate = "no cells found"
    line = f"{slide_name(s['slide'])}: {s['cells_scored']} cells in {s['seconds']} s ({rate}) "
    return line + f"-> {where}" + _findings(s)


#: a top K of at least this share of a slide's cells is said beside what chance finds there
TOP_K_SHARE = 0.05


def _findings(s: dict) -> str:
    """What a slide's summary found, as clauses of its one-line report."""
    line = burden_words(s.get("burden"))
    if s.get("adequacy"):  # the specimen-adequacy rule's result, with its reasons
        from cyto.stats.adequacy import adequacy_words

        line += adequacy_words(s["adequacy"])
    if (s.get("verification") or {}).get("status") == "unverified":
        # the advice of the UNVERIFIED warning, not another (round 28, 17)
        line += "; UNVERIFIED scores (no golden cells: cyto export the model)"
    if "truth" in s:
        t = s["truth"]
        if t.get("planted_abnormal"):
            line += (
                f"; planted abnormal found in the top {t['k']}: "
                f"{t['planted_found_in_top_k']}/{t['planted_abnormal']}"
            )
            if t.get("tied_at_k"):
                # the review's top K holds some of them in no order of the ranking's, and the
                # summary's tp_at_k counts them pessimistically: 12/14 here, 11 there, unsaid
                # (a Pap slide's cells at morphometric score 0: hostile round 58, 5)
                line += (
                    f" ({t['tied_at_k']} cells share the score at rank {t['k']}: the tp_at_k "
                    "of summary.json counts their tie pessimistically)"
                )
            if s.get("cells_scored") and t["k"] >= s["cells_scored"]:
                from cyto.flags import said

                # every cell is in the top K: the count says nothing of the ranking (round 33)
                line += f" (every cell: {said('top_k')} over the {s['cells_scored']} scored)"
            elif s.get("cells_scored") and t["k"] >= TOP_K_SHARE * s["cells_scored"]:
                # the top 400 of a 680-cell slide found 11/14 though its top 20 held none:
                # the count beside what drawing K cells at random finds (hostile round 57, 4)
                share = t["k"] / s["cells_scored"]
                line += (
                    f" (the top {t['k']} is {share:.0%} of the {s['cells_scored']} cells "
                    f"scored: chance alone finds {share * t['planted_abnormal']:.1f})"
                )
        elif t.get("truth_cells_of_slide") == 0:  # no truth: not a negative slide either
            line += "; --truth holds no cell of this slide (no truth for it)"
        else:  # "found 0/0" read as a miss
            line += "; --truth holds no abnormal cell of this slide"
    return line


def burden_words(b: dict | None) -> str:
    """The burden block of a summary as a clause of the one-line report."""
    if not b:
        return ""
    if b.get("status") != "ok":
        return f"; burden: {b.get('status')}"
    lo, hi = b["abnormal_fraction_interval"]
    guarantee = b.get("fdr_guarantee", "")
    given = f" {guarantee}" if guarantee.startswith("for this calibration") else ""
    # the cells the burden counts: the evaluable ones (an adequacy rule judged the slide and the
    # calibration marks its own), else every cell
    if b.get("counted") == "evaluable":
        rests = f", of {b['cells']:,} evaluable cells"
    elif "evaluable_cells" in b:
        rests = f", of all {b['cells']:,} cells, {b['evaluable_cells']:,} evaluable"
    else:
        rests = ""
    from cyto.stats.calibrate import above_words

    share, p = _number(b["abnormal_fraction"], ".2%"), _number(b["slide_p_value"], ".2g")
    ci = f"{100 * lo:.2f}-{100 * hi:.2f}%" if _defined(lo) and _defined(hi) else "unknown"
    if b.get("cells_above") == 0:  # a zero-width interval, said why (hostile round 67, 13)
        ci += ": no cell scored above it"
    return (
        f"; abnormal burden {share} {above_words(b.get('threshold_quantile_of_normals'))} "
        f"(95% CI {ci}{rests}), {b['flagged_bh']} cells flagged at FDR {b['fdr_alpha']}{given}, "
        f"slide p={p} ({b['triage']})"
    )


def _number(value: float | None, spec: str) -> str:
    """A summary's number as the line shows it; "unknown" where the run could not define it
    (written as null: summary.json is strict JSON, see :func:`cyto.tables.json_text`)."""
    return format(value, spec) if _defined(value) else "unknown"


def _defined(value: float | None) -> bool:
    """Not null (as read back) nor NaN (in a summary not yet written)."""
    return value is not None and value == value
