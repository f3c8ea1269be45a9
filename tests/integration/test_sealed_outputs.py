"""Issue 68, class 2: a slide's outputs are trusted by their seal, not by their records.

A hand-edited ``summary.json`` (triage 'excess' -> 'no excess', slide p 0.006 -> 0.9) was reused
by ``cyto score --resume`` ('already scored; skipping') and the forged triage went into
``cohort.csv``. Now every finished folder is sealed (cyto.seal) and every reader of finished
outputs (resume, cohort.csv, watch, view, review, calibrate) goes through its check."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from cyto.errors import ConfigError, InputPathError

SUMMARY = "summary.json"  # literal: the first test runs against a cyto without cyto.seal

QUIET = lambda _: None  # noqa: E731


def _opts(**kw):
    from cyto.infer import ScoreOptions

    return ScoreOptions(**{"mosaic": 0, "workers": 0, "tile": 512, "resume": True, **kw})


def _pos_opts(truth: Path):
    """The options the slide of :func:`calibrated` is scored with: mosaics, the QuPath cells
    (not the map), its truth, FDR 0.2."""
    return _opts(mosaic=8, fdr_alpha=0.2, qupath="cells", truth=truth)


@pytest.fixture(scope="module")
def calibrated(exported_dsvdd, tmp_path_factory):
    """(a copy of the small Deep SVDD bundle calibrated on two slide-negative slides, a slide
    with 20% abnormal cells, its cohort folder, its options: :func:`_pos_opts`): a summary with
    a triage."""
    from cyto.cohort import score_cohort
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.infer import score_slide
    from cyto.stats.calibrate import calibrate_from_tables

    root = tmp_path_factory.mktemp("sealed")
    model = root / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    tables = []
    for i in range(2):
        neg = write_slide(
            root / f"neg{i}.tif",
            SlideSynthConfig(width=768, height=768, n_cells=110, abnormal_fraction=0.0, seed=i),
            workers=1,
        )
        score_slide(neg.paths[0], model, root / f"neg{i}", _opts(resume=False), echo=QUIET)
        tables.append(root / f"neg{i}" / "scores.parquet")
    calibrate_from_tables(model, tables, min_cells=50)
    pos = write_slide(
        root / "s1.tif",
        SlideSynthConfig(width=768, height=768, n_cells=110, abnormal_fraction=0.2, seed=9),
        workers=1,
    )
    out = root / "out"
    opts = _pos_opts(pos.ground_truth)
    [summary], failed = score_cohort([pos.paths[0]], model, out, opts, QUIET)
    assert not failed and summary["burden"]["status"] == "ok", summary["burden"]
    assert summary["truth"]["planted_abnormal"] > 0
    return model, pos.paths[0], out, opts


def _rows(out: Path) -> list[dict]:
    with open(out / "cohort.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _forge(folder: Path) -> dict:
    """The issue's edit: the triage and the slide's p-value changed by hand."""
    summary = json.loads((folder / SUMMARY).read_text())
    b = summary["burden"]
    b["triage"] = "no excess" if b["triage"] != "no excess" else "excess"
    b["slide_p_value"] = 0.9 if b["slide_p_value"] != 0.9 else 0.006
    (folder / SUMMARY).write_text(json.dumps(summary, indent=2))
    return b


def test_a_forged_summary_is_scored_again_and_never_reaches_cohort_csv(calibrated, tmp_path):
    """Failed before the seal: 's1.tif: already scored; skipping', and cohort.csv held the
    forged triage and p-value."""
    from cyto.cohort import score_cohort

    model, slide, scored, opts = calibrated
    out = tmp_path / "out"
    shutil.copytree(scored, out)
    (out / "cohort.csv").unlink()  # its row names the folder copied from
    truth = _rows(scored)[0]
    forged = _forge(out / "s1")
    said: list[str] = []
    [summary], _ = score_cohort([slide], model, out, opts, said.append)
    assert not any("already scored" in m for m in said), said
    line = next(m for m in said if "scoring it again" in m)
    assert "its outputs changed since they were written (summary.json)" in line, line
    [row] = _rows(out)
    assert row["triage"] == truth["triage"] != forged["triage"]
    assert row["slide_p_value"] == truth["slide_p_value"] != str(forged["slide_p_value"])
    assert summary["burden"]["triage"] == truth["triage"]
    # scored again, the folder is whole and sealed: the next --resume skips it
    said.clear()
    score_cohort([slide], model, out, opts, said.append)
    assert any("already scored" in m for m in said), said


#: what a damaged folder may have lost: each file the run wrote, a file added under the name
#: of one of cyto's outputs this run did not write
def _damage(folder: Path, target: str, how: str, at: float) -> None:
    path = folder / target
    if not path.exists():
        path.write_bytes(b"added by hand")
        return
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: int(len(data) * at)])
    elif how == "edit":
        i = min(int(len(data) * at), len(data) - 1)
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
    elif how == "add":  # the same name written again by something else
        path.write_bytes(data + b"\n")


TARGETS = [
    SUMMARY,
    "scores.parquet",
    "topk.parquet",
    "topk.geojson",
    "topk_mosaic.png",
    "topk_mosaic_blinded.png",
    "topk_mosaic_blinded_key.json",
    "cells.geojson",
    "abnormality.ome.tif",  # not written by this run (--qupath cells): added
]
QUPATH = {"cells.geojson", "abnormality.ome.tif"}


@pytest.fixture(scope="module")
def scorer(calibrated):
    from cyto.cohort.local import open_model

    return open_model(calibrated[0], _opts(), QUIET)


@hsettings(max_examples=15, deadline=None)
@given(
    target=st.sampled_from(TARGETS),
    how=st.sampled_from(["edit", "truncate", "delete", "add"]),
    at=st.floats(0.0, 0.99),
)
def test_any_damage_to_a_finished_folder_is_scored_again_saying_which_file(
    calibrated, scorer, tmp_path_factory, target, how, at
):
    """--resume (and watch and the Ray path, which reuse through finished_summary) reuses a
    folder only when its seal holds; otherwise it says which file changed, and scores again
    (its cells kept when only what is drawn from its table changed)."""
    from cyto.cohort.local import finished_summary
    from cyto.seal import read_sealed

    _, slide, scored, opts = calibrated
    folder = tmp_path_factory.mktemp("damaged") / "s1"
    shutil.copytree(scored / "s1", folder)
    said: list[str] = []
    assert finished_summary(folder, scorer, slide, opts, said.append)
    assert said == []
    _damage(folder, target, how, at)
    got = finished_summary(folder, scorer, slide, opts, said.append)
    [line] = said
    assert target in line, line
    if target in QUPATH:  # drawn again from the sealed table, the folder sealed again
        assert got is not None and "QuPath outputs written again" in line, line
        assert read_sealed(folder).ok and not (folder / "abnormality.ome.tif").exists()
        return
    assert got is None, (target, how, said)
    assert "changed since they were written" in line, line
    # a table as it was written keeps its cells: the outputs drawn from it are written again
    then = "scoring it again" if target in (SUMMARY, "scores.parquet") else "its cells are kept"
    assert then in line, line


def test_files_the_user_adds_and_a_review_made_in_the_folder_keep_it_reused(
    calibrated, scorer, tmp_path
):
    """A review session ``cyto review`` makes inside the slide's folder, and the user's own
    notes, are outside the seal: the folder is still reused, shown and reviewed."""
    from cyto.cohort.local import finished_summary
    from cyto.review.session import build_session
    from cyto.view.folder import ViewSlide

    _, slide, scored, opts = calibrated
    folder = tmp_path / "s1"
    shutil.copytree(scored / "s1", folder)
    (folder / "notes.txt").write_text("seen by Dr A")
    build_session([folder], folder / "review", k=5, seed=1, echo=QUIET)
    said: list[str] = []
    assert finished_summary(folder, scorer, slide, opts, said.append)
    assert said == []
    ViewSlide(folder)


def test_view_review_and_calibrate_refuse_or_ignore_a_forged_folder(calibrated, tmp_path):
    from cyto.review.session import read_source
    from cyto.stats.calibrate import _planted
    from cyto.tables import read_table
    from cyto.view.folder import ViewSlide

    _, _, scored, _ = calibrated
    folder = tmp_path / "s1"
    shutil.copytree(scored / "s1", folder)
    ViewSlide(folder)
    read_source(folder)
    table = read_table(folder / "scores.parquet")
    summary = json.loads((folder / SUMMARY).read_text())
    planted = summary["truth"]["planted_abnormal"]
    assert _planted(folder / "scores.parquet", table, summary["slide"]) == (planted, False)
    summary["truth"]["planted_abnormal"] = 0  # calibrate would then take a planted slide
    (folder / SUMMARY).write_text(json.dumps(summary))
    # what --resume then does said as it is: the slide scored again whole (hostile round 65,
    # 3: "scores again only what changed" preceded a run that scored every cell again)
    again = r"score it again \(cyto score --resume scores again only the slides whose outputs"
    with pytest.raises(ConfigError, match=r"changed since they were written \(summary.json\)"):
        ViewSlide(folder)
    with pytest.raises(InputPathError, match=again):
        read_source(folder)
    # calibrate does not take the forged count: it counts the table's labels (detections)
    counted, labelled = _planted(folder / "scores.parquet", table, summary["slide"])
    assert counted > 0 and labelled
    (folder / "seal.json").unlink()
    with pytest.raises(ConfigError, match="carry no seal"):
        ViewSlide(folder)


def test_a_moved_cohort_folder_reused_names_the_folder_it_is_in_now(calibrated, tmp_path):
    """Failed before: the slide's line named the folder the summary was written in (issue 68,
    hostile round 3: '... cells -> OLD/s1' while cohort.csv named NEW/s1)."""
    from cyto.cohort import score_cohort
    from cyto.cohort.run import slide_line
    from cyto.view.folder import view_words

    model, slide, scored, opts = calibrated
    out = tmp_path / "moved"
    shutil.copytree(scored, out)
    said: list[str] = []
    [summary], _ = score_cohort([slide], model, out, opts, said.append)
    assert any("already scored" in m for m in said), said
    line = slide_line(summary, out)
    assert line.endswith(f"-> {out / 's1'}") or f"-> {out / 's1'};" in line, line
    assert str(scored) not in line, line
    from cyto.cohort.run import as_found  # what cyto score prints its other lines from

    assert str(scored) not in view_words([as_found(summary, out)], out)
    assert _rows(out)[0]["output"] == str(out.resolve() / "s1")


def test_eval_scores_reads_a_scored_folders_table_only_through_its_seal(calibrated, tmp_path):
    """A hostile check (round 4): `cyto eval scores` of a scored folder's edited scores.parquet
    raised the AUROC from 0.60 to 1.00 with no word; the folder itself was "does not exist"."""
    import pyarrow.parquet as pq

    from cyto.eval.scores import evaluate_table

    _, _, scored, _ = calibrated
    folder = tmp_path / "s1"
    shutil.copytree(scored / "s1", folder)
    whole = evaluate_table(folder, [10])  # the folder is its table
    assert whole == evaluate_table(folder / "scores.parquet", [10])
    t = pq.read_table(folder / "scores.parquet")
    i = t.schema.get_field_index("score")
    pq.write_table(t.set_column(i, "score", t["label"].cast("float64")), folder / "scores.parquet")
    with pytest.raises(ConfigError, match=r"its outputs changed since they were written"):
        evaluate_table(folder / "scores.parquet", [10])


def test_a_slide_folder_holding_a_users_files_under_output_names_is_never_written_over(
    calibrated, tmp_path
):
    """A hostile check (round 4): `cyto score` into an OUT/SLIDE/ holding the user's own
    cells.geojson (no run of cyto's there) wrote over it without --overwrite."""
    from tests.cli_runner import run_cyto

    model, slide, _, _ = calibrated
    out = tmp_path / "out"
    (out / "s1").mkdir(parents=True)
    mine = out / "s1" / "cells.geojson"
    mine.write_text('{"mine": true}')
    for extra in ([], ["--overwrite"]):
        proc = run_cyto("score", str(slide), "--model", str(model), "--out", str(out),
                        "--workers", "0", "--mosaic", "0", *extra)  # fmt: skip
        assert proc.returncode != 0, proc.stdout
        assert "holds cells.geojson that cyto did not write" in proc.stdout + proc.stderr
    assert mine.read_text() == '{"mine": true}'


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]])
def test_tables_of_a_failed_run_whose_chunks_were_removed_are_cytos_to_replace(
    calibrated, tmp_path, flags
):
    """Hostile round 65 (2): a run that failed as it wrote its outputs (a full disk) left its
    tables and its .partial; the user removed .partial, and every rerun (plain, --overwrite,
    --resume) was refused: the folder "holds scores.parquet and 1 other file(s) that cyto did
    not write". They carry cyto's metadata: they are a failed run's, scored again. A table of
    the user's own under that name is still never written over."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.cli_runner import run_cyto

    model, slide, scored, _ = calibrated
    out = tmp_path / "out"
    (out / "s1").mkdir(parents=True)
    for name in ("scores.parquet", "topk.parquet"):
        shutil.copy(scored / "s1" / name, out / "s1" / name)
    if not flags:  # read as what it is: no finished run (round 65, 5: calibrate took it)
        copy = tmp_path / "m.cyto"
        shutil.copytree(model, copy)
        for given in (out / "s1", out / "s1" / "scores.parquet"):
            proc = run_cyto("calibrate", str(copy), str(given), "--overwrite")
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert "a cyto score run that did not finish" in proc.stderr, proc.stderr
    args = ["score", str(slide), "--model", str(model), "--out", str(out), "--workers", "0"]
    proc = run_cyto(*args, "--mosaic", "0", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "s1" / "summary.json").is_file()
    # a table of the user's own under the name: refused, and kept
    mine = tmp_path / "mine"
    (mine / "s1").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2]}), mine / "s1" / "scores.parquet")
    proc = run_cyto(*args[:4], "--out", str(mine), "--workers", "0", "--mosaic", "0", *flags)
    assert proc.returncode != 0 and "holds scores.parquet that cyto did not write" in (
        proc.stdout + proc.stderr
    )
    assert pq.read_table(mine / "s1" / "scores.parquet").column_names == ["x"]


def test_score_slide_resume_from_python_reuses_a_sealed_folder_and_says_why_not(
    calibrated, tmp_path
):
    """``cyto.score_slide(resume=True)`` reuses a finished folder as ``cyto score --resume``
    does (the same rule: :func:`cyto.cohort.local.finished_summary`). Failed before: it said
    only 'no unfinished run here' and scored a sealed folder again, and gave no reason for a
    forged one."""
    import cyto

    model, slide, scored, opts = calibrated
    folder = tmp_path / "s1"
    shutil.copytree(scored / "s1", folder)
    kw = {"mosaic": 8, "fdr_alpha": 0.2, "qupath": "cells", "truth": opts.truth}
    said: list[str] = []
    before = (folder / "scores.parquet").stat().st_mtime_ns
    table = cyto.score_slide(
        slide, model, folder, resume=True, workers=0, tile=512, echo=said.append, **kw
    )
    assert any("already scored" in m for m in said), said
    assert (folder / "scores.parquet").stat().st_mtime_ns == before  # nothing scored again
    assert table.num_rows > 0
    forged = _forge(folder)
    said.clear()
    cyto.score_slide(slide, model, folder, resume=True, workers=0, tile=512, echo=said.append, **kw)
    line = next(m for m in said if "scoring it again" in m)
    assert "summary.json" in line, line
    summary = json.loads((folder / SUMMARY).read_text())
    assert summary["burden"]["triage"] != forged["triage"]


def test_a_bundle_calibrated_while_a_run_scores_is_recorded_as_it_was_loaded(calibrated, tmp_path):
    """Hostile round 5 (WS 7.4): a bundle calibrated again while `cyto score` ran left a result
    scored with the old calibration under the new manifest's hash, and `--resume` kept it
    ("already scored"). The run records the manifest it loaded; a resume then sees the model
    changed, and writes the outputs again with the new calibration from the cells it keeps
    (the calibration does not shape a cell's scores), as a fresh run would write them."""
    import hashlib

    from cyto.cohort.local import finished_summary, open_model
    from cyto.infer import score_slide
    from cyto.stats.calibrate import calibrate_from_tables

    model, slide, _, opts = calibrated
    copy = tmp_path / "m.cyto"
    shutil.copytree(model, copy)
    loaded = hashlib.sha256((copy / "manifest.json").read_bytes()).hexdigest()
    scorer = open_model(copy, opts, QUIET)  # loaded with the calibration of two slides
    calibrate_from_tables(
        copy, [model.parent / "neg0" / "scores.parquet"], min_cells=50, overwrite=True
    )
    summary = score_slide(slide, scorer, tmp_path / "s1", opts, echo=QUIET)
    assert summary["model_sha256"] == loaded
    said: list[str] = []
    fresh = open_model(copy, opts, QUIET)
    assert finished_summary(tmp_path / "s1", fresh, slide, opts, said.append) is None
    assert "MODEL (its manifest)" in said[0] and "its cells are kept" in said[0], said
    from cyto.cohort.local import score_one
    from tests.tables import same_table

    said.clear()
    again = score_one(slide, tmp_path / "s1", fresh, replace(opts, resume=True), said.append, None)
    assert again["cells_this_run"] == 0 and again["model_sha256"] != loaded, said
    new = score_slide(slide, fresh, tmp_path / "fresh", opts, echo=QUIET)
    assert again["burden"] == new["burden"] and again["burden"] != summary["burden"]
    for name in ("scores.parquet", "topk.parquet"):
        assert same_table(
            pq.read_table(tmp_path / "s1" / name), pq.read_table(tmp_path / "fresh" / name)
        )


def _edit_column(src: Path, dst: Path, column: str, how) -> None:
    """``src``'s table with ``column`` changed by ``how`` (its file metadata kept), at ``dst``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    values = np.asarray(table[column].to_numpy(zero_copy_only=False))
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, column, pa.array(how(values))), dst)


@hsettings(max_examples=8, deadline=None)
@given(
    column=st.sampled_from(["score", "x", "cell_id", "morphometry_score"]),
    factor=st.sampled_from([3.0, -1.0, 1.0001]),
)
def test_a_score_table_copied_out_of_its_folder_and_edited_is_refused(
    calibrated, tmp_path_factory, column, factor
):
    """Hostile round 5 (WS 2.3): a scores.parquet edited and copied out of its sealed folder
    calibrated a bundle ("99th percentile 10.29"). A cyto table carries its rows' seal in its
    own metadata: calibrate and eval refuse it edited, wherever it lies."""
    from cyto.eval.scores import read_score_table
    from cyto.stats.calibrate import calibrate_from_tables

    model, _, _, _ = calibrated
    root = tmp_path_factory.mktemp("loose")
    copy = root / "m.cyto"
    shutil.copytree(model, copy)
    honest = model.parent / "neg0" / "scores.parquet"
    shutil.copy(honest, root / "honest.parquet")  # copied out whole: still taken
    calibrate_from_tables(copy, [root / "honest.parquet"], min_cells=50, overwrite=True)
    _edit_column(honest, root / "a.parquet", column, lambda v: v * factor)
    with pytest.raises(ConfigError, match="its rows are not as cyto wrote them"):
        calibrate_from_tables(copy, [root / "a.parquet"], min_cells=50, overwrite=True)
    with pytest.raises(ConfigError, match="its rows are not as cyto wrote them"):
        read_score_table(root / "a.parquet", "score", "label", need_label=False)


def test_calibrate_refuses_a_table_that_names_no_model(calibrated, tmp_path):
    """Hostile round 5 (WS 2.14): another model's tables with their metadata stripped were
    recorded as a calibration valid for this bundle. Refused in one line."""
    import pyarrow.parquet as pq

    from cyto.stats.calibrate import calibrate_from_tables

    model, _, _, _ = calibrated
    copy = tmp_path / "m.cyto"
    shutil.copytree(model, copy)
    table = pq.read_table(model.parent / "neg0" / "scores.parquet")
    pq.write_table(table.replace_schema_metadata(None), tmp_path / "plain.parquet")
    with pytest.raises(ConfigError, match="carries no record of the model that scored it"):
        calibrate_from_tables(copy, [tmp_path / "plain.parquet"], min_cells=50, overwrite=True)


@pytest.fixture(scope="module")
def predicted(exported_dsvdd, synth_patches, tmp_path_factory) -> Path:
    """A `cyto predict` table (read, never changed, by the tests that take it) of a sixth of the
    synthetic patches: 20 normal and 12 abnormal, every class."""
    import cyto

    root = tmp_path_factory.mktemp("predicted")
    for cls in sorted(synth_patches.iterdir()):
        (root / "patches" / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir())[::6]:
            shutil.copy(f, root / "patches" / cls.name / f.name)
    out = root / "p.parquet"
    cyto.predict(exported_dsvdd, root / "patches", out, normal="normal", echo=None)
    return out


def test_an_edited_predict_table_is_not_evaluated_as_cyto_s(predicted, tmp_path):
    """Hostile round 5 (WS 2.10): a predict table with its abnormal cells' scores raised by
    100 (cyto's metadata kept) gave AUROC 1.0 in `cyto eval scores`. Refused in one line; the
    table as predict wrote it is evaluated."""
    from tests.cli_runner import run_cyto

    out = predicted
    assert run_cyto("eval", "scores", str(out)).returncode == 0
    _edit_column(out, tmp_path / "forged.parquet", "score", lambda v: v + 100)
    proc = run_cyto("eval", "scores", str(tmp_path / "forged.parquet"))
    assert proc.returncode != 0 and "its rows are not as cyto wrote them" in proc.stderr, (
        proc.stdout + proc.stderr
    )


def test_calibrate_names_a_predict_table_as_one(exported_dsvdd, predicted, tmp_path):
    """Hostile round 6 (N27): a `cyto predict` table given to calibrate was said to be "a slide
    scored with --truth holding 120 abnormal cell(s)"."""
    from cyto.stats.calibrate import calibrate_from_tables

    out = predicted
    copy = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, copy)
    with pytest.raises(ConfigError, match=r"is a table of patches \(cyto predict\), not a slide"):
        calibrate_from_tables(copy, [out], min_cells=10)


def test_a_folder_of_a_run_stopped_as_it_wrote_its_outputs_is_refused_by_its_readers(
    calibrated, tmp_path, monkeypatch
):
    """Hostile round 46, 2: `cyto score` killed after its table was written, before its seal:
    the folder holds scores.parquet beside the run's .partial chunks, and `cyto calibrate` and
    `cyto eval scores` took the table without a word (the table is read only through its seal;
    a folder with neither seal nor summary was taken as a table copied out alone)."""
    import cyto.infer.finish as finish
    from cyto.eval.scores import evaluate_table
    from cyto.infer import score_slide
    from cyto.stats.calibrate import calibrate_from_tables

    model, slide, _, _ = calibrated

    def stopped(out_dir, summary):
        raise KeyboardInterrupt  # as Ctrl-C or a kill between the table and the seal

    monkeypatch.setattr(finish, "write_summary", stopped)
    folder = tmp_path / "s1"
    with pytest.raises(KeyboardInterrupt):
        score_slide(slide, model, folder, _opts(resume=False), echo=QUIET)
    monkeypatch.undo()
    assert (folder / "scores.parquet").is_file() and (folder / ".partial").is_dir()
    assert not (folder / "seal.json").exists() and not (folder / SUMMARY).exists()
    unfinished = r"holds an unfinished cyto score run .*finish it with cyto score --resume"
    with pytest.raises(ConfigError, match=unfinished):
        evaluate_table(folder / "scores.parquet", [10])
    with pytest.raises(ConfigError, match=unfinished):
        evaluate_table(folder, [10])
    bundle = tmp_path / "m.cyto"
    shutil.copytree(model, bundle)
    with pytest.raises(ConfigError, match=unfinished):
        calibrate_from_tables(bundle, [folder / "scores.parquet"], min_cells=50)
    # the viewer, review and data cells say the same of it (they said "holds no scored slide")
    from cyto.review.session import find_scored
    from cyto.view.folder import ViewSlide

    with pytest.raises(ConfigError, match=unfinished):
        ViewSlide(folder)
    with pytest.raises(InputPathError, match=unfinished):
        find_scored([folder])
    # finished by a resume, it is read
    score_slide(slide, model, folder, _opts(resume=True), echo=QUIET)
    assert not (folder / ".partial").exists()
    with pytest.raises(ConfigError, match="calibrate from negative slides only"):  # read, judged
        calibrate_from_tables(bundle, [folder / "scores.parquet"], min_cells=50)


def test_a_folder_of_a_run_stopped_before_its_first_chunk_is_said_to_be_unfinished(
    calibrated, tmp_path, monkeypatch
):
    """Hostile round 70, 2: `cyto score` stopped before it kept a chunk leaves its .partial
    folder and no table; `cyto eval scores` called it "a folder without scores.parquet: give a
    score table" where a run stopped later was told to finish with --resume. Every reader of a
    slide's folder says it is unfinished, and how to finish it."""
    from cyto.eval.scores import evaluate_table
    from cyto.infer import score_slide
    from cyto.infer.store import ChunkStore
    from cyto.review.session import find_scored
    from cyto.stats.calibrate import calibrate_from_tables
    from cyto.view.folder import ViewSlide

    model, slide, _, _ = calibrated

    def stopped(self, *args, **kwargs):
        raise KeyboardInterrupt  # as a SIGTERM before the first chunk was kept

    monkeypatch.setattr(ChunkStore, "write", stopped)
    folder = tmp_path / "s1"
    with pytest.raises(KeyboardInterrupt):
        score_slide(slide, model, folder, _opts(resume=False), echo=QUIET)
    monkeypatch.undo()
    assert (folder / ".partial").is_dir() and not list(folder.glob("*.parquet"))
    unfinished = r"s1: it holds an unfinished cyto score run .*finish it with cyto score --resume"
    with pytest.raises(ConfigError, match=unfinished):
        evaluate_table(folder, [10])
    bundle = tmp_path / "m.cyto"
    shutil.copytree(model, bundle)
    with pytest.raises(ConfigError, match=unfinished):
        calibrate_from_tables(bundle, [folder], min_cells=50)
    with pytest.raises(ConfigError, match=unfinished):
        ViewSlide(folder)
    with pytest.raises(InputPathError, match=unfinished):
        find_scored([folder])
    score_slide(slide, model, folder, _opts(resume=True), echo=QUIET)  # finished, it is read
    assert ViewSlide(folder).folder == folder


def test_a_folder_a_run_is_writing_now_is_read_by_no_reader(calibrated, tmp_path):
    """Hostile round 47, 3: while `cyto score --overwrite` rewrote a slide's folder (its lock
    held, the earlier run's outputs and seal still there), `cyto review` built a session from
    the earlier run's cells without a word, and the review outlived the tables it came from;
    `cyto view` and `cyto data cells` read the folder too. Every reader waits for the run."""
    from cyto.eval.scores import evaluate_table
    from cyto.locks import OutputLock
    from cyto.review.session import read_source
    from cyto.stats.calibrate import calibrate_from_tables
    from cyto.view.folder import ViewSlide

    model, _, scored, _ = calibrated
    folder = tmp_path / "s1"
    shutil.copytree(scored / "s1", folder)
    bundle = tmp_path / "m.cyto"
    shutil.copytree(model, bundle)
    busy = r"is being written by another cyto score \(pid .*wait for it to finish, then read it"
    with OutputLock(folder):  # as the rewriting run holds it
        with pytest.raises(ConfigError, match=busy):
            ViewSlide(folder)
        with pytest.raises(InputPathError, match=busy):
            read_source(folder)
        with pytest.raises(ConfigError, match=busy):
            evaluate_table(folder / "scores.parquet", [10])
        with pytest.raises(ConfigError, match=busy):
            calibrate_from_tables(bundle, [folder / "scores.parquet"], min_cells=50)
    ViewSlide(folder)  # the run gone, the folder is read again
    read_source(folder)
    # a cohort's folder: the slide being written is left out and said, the others shown
    import warnings

    from cyto.errors import CytoWarning
    from cyto.view.folder import open_view

    cohort = tmp_path / "cohort"
    for name in ("s1", "s2"):
        shutil.copytree(scored / "s1", cohort / name)
    with OutputLock(cohort / "s2"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shown = open_view(cohort, unblind=True)
    assert [s.folder.name for s in shown] == ["s1"]
    said = [str(w.message) for w in caught if issubclass(w.category, CytoWarning)]
    assert any("1 slide folder(s) of" in m and "left out (s2), being written" in m for m in said)
    # a slide scored for the first time (no outputs yet), or left unfinished by a stopped run:
    # left out and said (round 48, 4: it was left out unsaid)
    shutil.rmtree(cohort / "s2")  # a copy of s1's run: one of them is shown
    (cohort / "s3" / ".partial").mkdir(parents=True)
    with OutputLock(cohort / "s4"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shown = open_view(cohort, unblind=True)
    assert [s.folder.name for s in shown] == ["s1"]
    said = " | ".join(str(w.message) for w in caught if issubclass(w.category, CytoWarning))
    assert "left out (s4), being written by another cyto score now" in said, said
    assert "left out (s3), unfinished (a run stopped)" in said, said
    # a cohort of nothing finished says why, not "holds no scored slide"
    lone = tmp_path / "lone"
    (lone / "s3" / ".partial").mkdir(parents=True)
    with pytest.raises(InputPathError, match=r"s3: it holds an unfinished cyto score run"):
        open_view(lone, unblind=True)


def test_a_slide_that_failed_after_it_was_scored_stays_failed_in_cohort_csv(calibrated, tmp_path):
    """Hostile round 61, 2: a slide scored, then failing on a later run (its file gone bad, a
    URL answering 404), left its earlier sealed folder and a row cyto wrote "failed"; the next
    run of any other slide into the folder said "rows not as cyto wrote them (edited by hand)"
    and drew the row again from the earlier seal, as "scored": the table hid the failure."""
    import warnings

    from cyto.cohort import score_cohort

    model, slide, _, opts = calibrated
    out = tmp_path / "out"
    bad = tmp_path / slide.name
    shutil.copy(slide, bad)
    [summary], _ = score_cohort([bad], model, out, opts, QUIET)
    assert _rows(out)[0]["status"] == "scored"
    bad.write_bytes(slide.read_bytes()[:4096])  # the same file, cut short since
    _, failed = score_cohort([bad], model, out, opts, QUIET)
    assert failed and _rows(out)[0]["status"] == "failed", _rows(out)
    error = _rows(out)[0]["error"]
    other = tmp_path / "other" / "s2.tif"
    other.parent.mkdir()
    other.write_bytes(b"not a slide")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        score_cohort([other], model, out, opts, QUIET)
    assert not [str(w.message) for w in caught if "as cyto wrote" in str(w.message)]
    rows = {Path(r["output"]).name: r for r in _rows(out)}
    assert set(rows) == {"s1", "s2"}, (_rows(out), [str(w.message) for w in caught])
    assert rows["s1"]["status"] == "failed" and rows["s1"]["error"] == error, rows["s1"]
    assert rows["s2"]["status"] == "failed", rows


def test_a_row_this_run_scores_next_is_not_said_to_need_a_resume(calibrated, tmp_path):
    """Hostile round 61, 3: a --resume run of two slides, the second's summary edited since,
    said after the first "the rows of s2.tif are left out (...: score them again with --resume
    to have them back)", of the slide it was about to score again."""
    import warnings

    from cyto.cohort import score_cohort

    model, slide, _, opts = calibrated
    out = tmp_path / "out"
    slides = [tmp_path / "s1.tif", tmp_path / "s2.tif"]
    for s in slides:
        shutil.copy(slide, s)
    score_cohort(slides, model, out, opts, QUIET)
    _forge(out / "s2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done, failed = score_cohort(slides, model, out, opts, QUIET)
    assert not failed and len(done) == 2
    said = [str(w.message) for w in caught if "as cyto wrote" in str(w.message)]
    assert not said, said
    assert [r["status"] for r in _rows(out)] == ["scored", "scored"]
