"""``cohort.csv``: one row per slide of a cohort (what it holds, or why it failed), merged under a
lock so that two runs into one folder never lose each other's rows."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cyto.errors import warn_caller
from cyto.location import shown
from cyto.slides.base import printable


def failure_words(slide, exc: Exception) -> str:
    """A slide's failure in words: the error's, the slide named once (first, where the error
    does not name it)."""
    return str(exc) if str(slide) in str(exc) else f"{slide}: {exc}"


COHORT_COLUMNS = (
    "slide",
    "output",
    "status",
    # the model bundle that scored it (summary["model"], ["model_sha256"]): rows of another
    # model in one table were not said apart (hostile round 54, 1)
    "model",
    "model_sha256",
    # what its scores, flags and burden depend on (the trained arrays, the graph that scored,
    # the calibration): rows of one value are on one scale (a bundle exported again into the
    # same graphs is; one calibrated again is not: round 69, 10)
    "scale_sha256",
    "cells",
    "seconds",
    "cells_per_s",
    "slide_score_mean_top_k",
    # what ranked the cells, and the mean morphometric score of the slide's top K cells by it
    # (a Pap cohort sorted by the model's slide score sorted by a score its bundle rejected:
    # hostile round 58, 1)
    "rank_by",
    "slide_morphometry_mean_top_k",
    "calibration",
    "burden_counted",  # the cells the burden counts: evaluable | all (summary["burden"])
    "cells_above",  # of them, above the threshold: a 0-0 interval's why (round 69, 7)
    "abnormal_cells",
    "abnormal_cells_low",
    "abnormal_cells_high",
    "abnormal_fraction",
    # the levels its flags and triage were drawn at: rows of two runs at other levels read
    # p=0.18 "excess" beside p=0.20 "no excess", the levels nowhere (hostile round 69, 3)
    "fdr_alpha",
    "flagged_bh",
    "flagged_adaptive",
    "slide_p_value",
    "triage_level",
    "triage",
    # the specimen-adequacy rule (summary["adequacy"]; empty under --adequacy none)
    "adequacy_preset",
    "adequacy",
    "adequacy_reasons",
    "cells_evaluable",
    "out_of_focus_share",
    "crowded_area_share",
    "glass_or_skipped_share",
    "cell_scale_factor",
    "node",
    "attempts",
    "error",
)


def cohort_row(
    slide: Path,
    output: Path,
    summary: dict | None,
    error: str = "",
    node: str | None = None,
    attempts: int = 1,
    another_run: bool = False,
) -> dict:
    """One slide's line of ``cohort.csv``: what it holds, or why it failed; ``node`` is the
    machine that scored it (this one unless said), ``attempts`` how many workers it took.
    ``another_run``: it failed because its folder is another run's (:attr:`CytoError.
    another_run`): the row yields to that run's when the table is merged."""
    import socket

    row = dict.fromkeys(COHORT_COLUMNS, "")
    row.update(
        {
            "slide": str(slide),
            "output": str(output),
            "status": "failed",
            "error": error,
            "node": node or socket.gethostname(),
            "attempts": attempts,
        }
    )
    if summary is None:
        if another_run:
            row[YIELDS] = True
        return row
    b = summary.get("burden") or {}
    row.update(
        {
            "status": "scored",
            "cells": summary.get("cells_scored"),
            "seconds": summary.get("seconds"),
            "cells_per_s": summary.get("cells_per_s"),
            "slide_score_mean_top_k": summary.get("slide_score_mean_top_k"),
            "rank_by": summary.get("rank_by", ""),
            "slide_morphometry_mean_top_k": _blank(summary.get("slide_morphometry_mean_top_k")),
            "calibration": b.get("status", ""),
            "model": summary.get("model", ""),
            "model_sha256": summary.get("model_sha256", ""),
            "scale_sha256": summary.get("scale_sha256", ""),
        }
    )
    a = summary.get("adequacy")
    if a:
        row.update(
            {
                "adequacy_preset": a["preset"],
                "adequacy": a["result"],
                "adequacy_reasons": "; ".join(a["reasons"]),
                "cells_evaluable": a["cells_evaluable"],
                "out_of_focus_share": _blank(a.get("out_of_focus_share")),
                "crowded_area_share": _blank(a.get("crowded_area_share")),
                "glass_or_skipped_share": _blank(a.get("glass_or_skipped_share")),
                "cell_scale_factor": _blank((a.get("cell_scale") or {}).get("factor")),
            }
        )
    if b.get("status") == "ok":
        lo, hi = b["abnormal_cells_interval"]
        row.update(
            {
                "burden_counted": b.get("counted", "all"),
                "cells_above": b.get("cells_above", ""),
                "fdr_alpha": b.get("fdr_alpha", ""),
                "triage_level": b.get("triage_level", ""),
                "abnormal_cells": b["abnormal_cells"],
                "abnormal_cells_low": lo,
                "abnormal_cells_high": hi,
                "abnormal_fraction": b["abnormal_fraction"],
                "flagged_bh": b["flagged_bh"],
                "flagged_adaptive": b["flagged_adaptive"],
                "slide_p_value": b["slide_p_value"],
                "triage": b["triage"],
            }
        )
    return row


def _blank(value: object) -> object:
    """A measure not taken (None) as an empty cell."""
    return "" if value is None else value


def write_cohort_table(rows: list[dict], path: Path, pending: Iterable[str] = ()) -> Path:
    """Merge ``rows`` into ``cohort.csv`` (a row per output folder; a slide scored again
    replaces its row, rows of other runs into the same folder stay), under a lock so that two
    runs never lose each other's rows; written by atomic rename. ``pending``: the output
    folders (names) this run has still to score: their earlier rows are drawn from their
    seals as any other run's, but not said (this run scores them next)."""
    try:
        return _merge_cohort_table(rows, path, set(pending))
    except OSError as exc:  # a read-only or full --out: one line, the slides' outputs are kept
        from cyto.errors import OutputWriteError

        # what the slides' folders hold, as the rows say (a disk full from the start let no
        # slide be scored, and the line said each folder held its outputs: round 47, 6)
        scored = sum(1 for r in rows if r.get("status") == "scored")
        kept = (
            "no slide was scored"
            if not scored
            else "every slide's own folder holds its outputs"
            if scored == len(rows)
            else "the scored slide's own folder holds its outputs"
            if scored == 1
            else f"the {scored} scored slides' own folders hold their outputs"
        )
        raise OutputWriteError(
            f"cannot write the cohort table {path} ({exc.strerror or exc}); {kept}: give an "
            "--out you can write to"
        ) from exc


def _merge_cohort_table(rows: list[dict], path: Path, pending: set[str]) -> Path:
    import csv

    from cyto.locks import folder_lock

    # the folder's own lock: a lock file beside the table was left in every output folder
    with folder_lock(path.parent):
        path.with_name(f".{path.name}.lock").unlink(missing_ok=True)  # an earlier cyto's
        # a row per output folder, known by its name in this folder: an --out spelled another
        # way (relative from elsewhere, absolute) is the same folder, and the same row
        # (a staging folder's: the prefix in object storage it stands for, cyto.location)
        home = path.parent.resolve()
        merged: dict[str, dict] = {}
        given = {Path(r["output"]).name for r in rows}
        dropped, redrawn = [], []
        for old in read_cohort_table(path):
            row = {k: old.get(k, "") for k in COHORT_COLUMNS}
            name = Path(row["output"]).name
            row["output"] = shown(home / name) if name else row["output"]
            slide = Path(str(row["slide"])).name or name
            if name not in given:  # another run's row: as its folder's seal vouches for it
                sealed = _as_sealed(row, home / name)
                if sealed is None:
                    dropped.append((slide, name))
                    continue
                if name in merged or any(
                    _text(sealed[c]) != _text(row[c])
                    for c in COHORT_COLUMNS
                    if c not in KEPT and c in old  # an earlier cyto's table had fewer columns
                ):
                    # edited, or a second row of one folder: named by the slide it is of
                    redrawn.append((Path(str(sealed["slide"])).name or slide, name))
                row = sealed
            merged[name] = row
        # said of the table as the user named it (a staging folder's: its prefix in object
        # storage), and never of a slide this run scores next ("score them again with
        # --resume", said to a --resume run about to: hostile round 61, 3)
        dropped = [d for d, name in dropped if name not in pending]
        redrawn = [r for r, name in redrawn if name not in pending]
        _say_rows(shown(path), sorted(set(dropped)), sorted(set(redrawn) - set(dropped)))
        for given_row in rows:
            row = {k: v for k, v in given_row.items() if k != YIELDS}
            name = Path(row["output"]).name
            row["output"] = shown(home / name)
            if given_row.get(YIELDS):
                # another run holds the folder, or finished it since this run began: its row
                # stands (a slide that run scored was marked failed by the refused one, the
                # last to write the table: hostile round 30, 6); its sealed folder's when done
                drawn = _as_sealed(row, home / name, yields=True)
                if drawn is not row:
                    merged[name] = drawn
                    continue
                if name in merged:
                    continue
            merged[name] = row
        partial = path.with_name(f".{path.name}.partial")
        # always UTF-8: a slide name that is not (b"slide-\xff.tif") is written as \xff
        merged = {k: {c: _cell(v) for c, v in row.items()} for k, row in merged.items()}
        with open(partial, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COHORT_COLUMNS)
            writer.writeheader()
            writer.writerows(merged.values())
        os.replace(partial, path)
    return path


#: columns of a row not drawn from its folder's summary (compared as they are)
KEPT = ("output", "node", "attempts")
#: a row's mark (no column) that it yields to another run's row of its folder (cohort_row)
YIELDS = "_yields"


def _say_rows(path: str, dropped: list[str], redrawn: list[str]) -> None:
    """One line for the rows of other runs that were not as their folders' seals say."""
    if not (dropped or redrawn):
        return

    from cyto.errors import CytoWarning

    def some(names: list[str]) -> str:
        return ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")

    parts = []
    if dropped:
        parts.append(
            f"the rows of {some(dropped)} are left out (their folders hold no sealed summary: "
            "score them again with --resume to have them back)"
        )
    if redrawn:
        parts.append(f"the rows of {some(redrawn)} are drawn again from their folders' seals")
    warn_caller(
        f"{path}: rows not as cyto wrote them (edited by hand, or folders moved): "
        + "; ".join(parts),
        CytoWarning,
    )


def say_models(path: Path) -> None:
    """One line where the cohort table at ``path`` holds scored slides of more than one model
    (or of one bundle calibrated again, or exported into other graphs, between runs: rows of
    more than one ``scale_sha256``, :attr:`Scorer.scale_sha256`): their scores, flags and
    burden are not on one scale, and the table said nothing of it (hostile round 54, 1). Called
    when a run's slides are all in the table (a watch: after each), so it is the table as the
    run leaves it (said after each slide, it named mixes a run then replaced: round 55, 1);
    said again in a process only when the mix changes. Slides flagged and triaged at other
    levels (``--fdr``, ``--triage-level``) are said so too (round 69, 3)."""
    models: dict[str, str] = {}
    levels: set[str] = set()
    rows = read_cohort_table(path) if path.is_file() else []
    for row in rows:  # a row of a cyto before scale_sha256: its manifest's
        sha = _text(row.get("scale_sha256")) or _text(row.get("model_sha256"))
        if row.get("status") == "scored" and sha:
            models.setdefault(sha, _text(row.get("model")) or "a model")
        if row.get("status") == "scored" and _text(row.get("fdr_alpha")):
            levels.add(_levels(row))
    from cyto.errors import CytoWarning

    if len(levels) > 1 and _SAID_LEVELS.get(str(path)) != levels:
        _SAID_LEVELS[str(path)] = levels
        warn_caller(
            f"{shown(path)} holds slides flagged and triaged at {len(levels)} levels "
            f"({'; '.join(sorted(levels))}): their flags and triage labels do not compare (its "
            "fdr_alpha and triage_level columns say which is which); score them again at one",
            CytoWarning,
        )
    if len(models) < 2 or _SAID_MODELS.get(str(path)) == set(models):
        return
    _SAID_MODELS[str(path)] = set(models)

    shown_models = "; ".join(f"{m} (scale {sha[:12]})" for sha, m in models.items())
    warn_caller(
        f"{shown(path)} holds slides scored by {len(models)} models or versions of one "
        f"({shown_models}: another network, graph or calibration): their scores, flags and "
        "burden are not on one scale (its model and scale_sha256 columns say which is which); "
        "give each model its own --out",
        CytoWarning,
    )


#: the models each cohort table was said to mix, in this process (:func:`say_models`)
_SAID_MODELS: dict[str, set[str]] = {}
#: the FDR and triage levels each cohort table was said to mix, in this process
_SAID_LEVELS: dict[str, set[str]] = {}


def _levels(row: dict) -> str:
    """A scored row's FDR and triage levels, in words."""
    return f"--fdr {_text(row.get('fdr_alpha'))}, --triage-level {_text(row.get('triage_level'))}"


def _as_sealed(row: dict, folder: Path, yields: bool = False) -> dict | None:
    """An earlier run's row of ``cohort.csv`` drawn again from its folder's sealed summary (a
    row edited by hand is the summary's again), None when a "scored" row's folder holds no
    sealed summary (the row is left out). A failed slide's row (its folder unsealed, or holding
    an earlier run's sealed outputs) and the row of a folder staged for object storage that
    this machine has not pulled are kept as they are; ``yields``: a failed row of this run
    that yields to the run that holds or finished the folder (its sealed row stands)."""
    from cyto.seal import read_sealed

    if not folder.exists() and shown(folder) != str(folder):
        return row  # another machine's slide in the prefix: not here to check
    if row.get("status") == "failed" and not yields:
        # cyto's own row of a later attempt (not one that yields to the run that holds or
        # finished the folder: that run's sealed row stands): a slide scored, then failing on
        # a later run (its file gone bad, a URL answering 404, a series grown) keeps its
        # earlier sealed folder, and the row drawn from that seal said "scored", the failure
        # called a hand edit (hostile round 61, 2)
        return row
    sealed = read_sealed(folder, summary_only=True)
    if not sealed.ok:
        # a failed slide leaves no sealed folder (a run that rewrites one unseals it first)
        return None if row.get("status") == "scored" else row
    try:
        attempts = int(row.get("attempts") or 1)
    except ValueError:
        attempts = 1
    summary = sealed.summary
    recorded = printable(str(summary.get("slide") or ""))
    # the slide as the run named it (a relative path), unless the row names another file
    slide = row["slide"] if Path(row["slide"]).name == Path(recorded).name else recorded
    fresh = cohort_row(
        slide,
        row["output"],
        summary,
        node=row.get("node") or None,
        attempts=attempts,
    )
    return {k: fresh.get(k, "") for k in COHORT_COLUMNS}


#: the columns that make a CSV file a cohort table cyto writes (not a lab's own table)
COHORT_KEY_COLUMNS = frozenset({"slide", "output"})


def is_cohort_table(path: Path) -> bool:
    """Whether ``path`` is a cohort table cyto writes: its header names
    :data:`COHORT_KEY_COLUMNS` (a lab's own ``cohort.csv`` of patients does not)."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, csv.Error):
        return False
    return {h.strip() for h in header} >= COHORT_KEY_COLUMNS


def read_cohort_table(path: Path) -> list[dict]:
    """The rows of an existing ``cohort.csv`` (none when there is none). Bytes that are not
    UTF-8 (a hand edit in another encoding, a slide name written by an older cyto) are read as
    ``\\xNN``, so updating the table never fails on them; a file the CSV reader cannot parse
    at all (a NUL byte, a binary file put in its place) is one :class:`OutputWriteError`
    naming it, raised before any slide is scored (:func:`cyto.cohort.local.check_inputs`)."""
    import csv

    path = Path(path)
    if not path.is_file():
        return []
    from cyto.errors import OutputWriteError

    fix = "move it away (each slide's folder keeps its own outputs) and run again"
    try:
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
            reader = csv.DictReader(fh)
            rows = [{_cell(k): _cell(v) for k, v in row.items() if k is not None} for row in reader]
            header = [_cell(k) for k in reader.fieldnames or ()]
    except csv.Error as exc:
        raise OutputWriteError(
            f"cannot update the cohort table {printable(path)}: it is not a CSV file cyto can "
            f"read ({exc}); {fix}"
        ) from exc
    if rows and not set(header) >= COHORT_KEY_COLUMNS:
        raise OutputWriteError(
            f"cannot update the cohort table {printable(path)}: it is no cohort table (its "
            f"header has no slide and output columns); {fix}"
        )
    return [row for row in rows if row.get("output")]


def _text(value: object) -> str:
    """A value as the table holds it once written (a number as its text, None as '')."""
    return "" if value is None else printable(str(value))


def _cell(value: object) -> object:
    """A value of the table as valid UTF-8 text."""
    return printable(value) if isinstance(value, str) else value
