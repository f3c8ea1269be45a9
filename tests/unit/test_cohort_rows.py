"""``cohort.csv`` rows of earlier runs are what their folders' seals vouch for (issue 68, hostile
round 3: a row edited by hand survived a ``--resume`` run of other slides, re-written as cyto's)."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyto.cohort.table import COHORT_COLUMNS, cohort_row, write_cohort_table
from cyto.errors import CytoWarning
from cyto.seal import seal_outputs

#: columns a row holds of its own, not drawn from the folder's summary
NOT_VOUCHED = {"output", "node", "attempts"}


def _folder(root: Path, name: str, p: float) -> tuple[Path, dict]:
    folder = root / name
    folder.mkdir(parents=True)
    summary = {
        "slide": str(root / f"{name}.tif"),
        "cells_scored": 120,
        "seconds": 2.5,
        "cells_per_s": 48.0,
        "slide_score_mean_top_k": 0.7,
        "burden": {
            "status": "ok",
            "abnormal_cells_interval": [1, 9],
            "abnormal_cells": 4,
            "abnormal_fraction": 0.03,
            "flagged_bh": 2,
            "flagged_adaptive": 3,
            "slide_p_value": p,
            "triage": "excess" if p < 0.05 else "no excess",
        },
    }
    (folder / "scores.parquet").write_bytes(b"table")
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, ["scores.parquet"])
    return folder, summary


def _rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as fh:
        return {Path(r["output"]).name: r for r in csv.DictReader(fh)}


def _cohort(root: Path) -> Path:
    table = root / "cohort.csv"
    rows = []
    for name, p in (("a", 0.006), ("b", 0.4)):
        folder, summary = _folder(root, name, p)
        rows.append(cohort_row(root / f"{name}.tif", folder, summary))
    write_cohort_table(rows, table)
    return table


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    column=st.sampled_from(sorted(set(COHORT_COLUMNS) - NOT_VOUCHED)),
    value=st.text(alphabet="0123456789.aenox -", min_size=1, max_size=8),
)
def test_an_edited_row_of_another_run_is_drawn_again_from_its_seal(tmp_path_factory, column, value):
    root = tmp_path_factory.mktemp("cohort")
    table = _cohort(root)
    before = _rows(table)["b"]
    edited = dict(before, **{column: value})
    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows = [edited if Path(r["output"]).name == "b" else r for r in rows]
    with open(table, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COHORT_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    again = cohort_row(
        root / "a.tif", root / "a", json.loads((root / "a" / "summary.json").read_text())
    )
    with warnings.catch_warnings(record=True) as said:  # a run of slide a only (--resume)
        warnings.simplefilter("always")
        write_cohort_table([again], table)
    assert _rows(table)["b"] == before
    lines = [str(w.message) for w in said if issubclass(w.category, CytoWarning)]
    if edited[column] != before[column]:  # what the row said was changed: said, by its slide
        assert len(lines) == 1 and "the rows of b.tif are drawn again" in lines[0], lines
    else:
        assert lines == []


def test_a_row_whose_folder_is_not_whole_is_left_out_and_said(tmp_path):
    table = _cohort(tmp_path)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    summary["burden"]["triage"] = "excess"  # the folder's own summary edited too
    (tmp_path / "b" / "summary.json").write_text(json.dumps(summary))
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    with pytest.warns(CytoWarning, match=r"the rows of b.tif are left out") as said:
        write_cohort_table([cohort_row(tmp_path / "a.tif", tmp_path / "a", a)], table)
    assert [str(w.message).count("\n") for w in said] == [0]
    assert set(_rows(table)) == {"a"}


def test_failed_rows_and_untouched_rows_stay_as_written(tmp_path):
    table = _cohort(tmp_path)
    write_cohort_table(
        [cohort_row(tmp_path / "c.tif", tmp_path / "c", None, "decoder error")], table
    )
    before = table.read_text()
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_cohort_table([cohort_row(tmp_path / "a.tif", tmp_path / "a", a)], table)
    assert table.read_text() == before


def test_a_cohort_table_that_cannot_be_written_says_what_the_slides_folders_hold(tmp_path):
    """Hostile round 47, 6: `cyto score` onto a disk full from the start said "every slide's
    own folder holds its outputs" where no slide was scored."""
    from cyto.errors import OutputWriteError

    (tmp_path / "file").write_text("")
    table = tmp_path / "file" / "cohort.csv"  # under a file: cannot be written
    a_folder, a = _folder(tmp_path, "a", 0.5)
    failed = cohort_row(tmp_path / "c.tif", tmp_path / "c", None, "the disk is full")
    scored = cohort_row(tmp_path / "a.tif", a_folder, a)
    for rows, said in (
        ([failed], "no slide was scored"),
        ([scored, failed], "the scored slide's own folder holds its outputs"),
        ([scored], "every slide's own folder holds its outputs"),
    ):
        with pytest.raises(OutputWriteError, match=f"; {said}: give an --out"):
            write_cohort_table(rows, table)


def test_a_row_says_what_ranked_the_cells_and_the_morphometric_slide_score(tmp_path):
    """A Pap cohort had only the model's slide score, which its bundle had rejected, and no word
    of what ranked the cells (hostile round 58, 1)."""
    folder, summary = _folder(tmp_path, "a", 0.2)
    summary.update(rank_by="morphometry", slide_morphometry_mean_top_k=4.25)
    row = cohort_row(tmp_path / "a.tif", folder, summary)
    assert row["rank_by"] == "morphometry" and row["slide_morphometry_mean_top_k"] == 4.25
    summary.pop("slide_morphometry_mean_top_k")
    assert cohort_row(tmp_path / "a.tif", folder, summary)["slide_morphometry_mean_top_k"] == ""
