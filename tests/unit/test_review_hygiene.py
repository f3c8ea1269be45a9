"""Blinding and training hygiene (issue 68, class 4): a blinded review is found from the scored
folder it was made of, wherever its --session folder is."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from cyto.errors import ConfigError, InputPathError
from cyto.review.session import REVIEWS_FILE, record_review, recorded_reviews
from cyto.view.folder import review_blocking


def _review(root, scored, cases=("case-001",)):
    """A review folder's key as build_session writes it (what the view's guard reads)."""
    root.mkdir(parents=True)
    key = {"scored": [str(f) for f in scored], "cases": {c: {} for c in cases}}
    (root / "key.json").write_text(json.dumps(key))
    return root


def test_a_review_made_elsewhere_is_found_from_the_scored_folder(tmp_path):
    folder = tmp_path / "cohort" / "slide1"
    folder.mkdir(parents=True)
    elsewhere = _review(tmp_path / "far" / "away" / "rv", [folder])
    assert review_blocking([folder], [folder]) is None  # the folder does not know of it yet
    record_review([folder], elsewhere)
    record_review([folder], elsewhere)  # once is enough
    assert recorded_reviews(folder) == [elsewhere.absolute()]
    assert "blinded review with nothing marked yet" in review_blocking([folder], [folder.parent])


def test_a_recorded_review_whose_key_is_not_written_yet_blocks(tmp_path):
    """cyto review records the review in the scored folder before its folder and key exist
    (the session takes a while to build): in that window cyto view showed every rank."""
    folder = tmp_path / "slide1"
    folder.mkdir()
    record_review([folder], tmp_path / "elsewhere" / "rv")  # no key.json there (yet)
    assert "has no key yet" in review_blocking([folder], [folder])


def test_open_view_refuses_the_slide_of_an_unfinished_review_elsewhere(tmp_path):
    from cyto.view.folder import open_view

    folder = tmp_path / "slide1"
    folder.mkdir()
    (folder / "summary.json").write_text("{}")
    (folder / "scores.parquet").write_bytes(b"")
    record_review([folder], _review(tmp_path / "elsewhere", [folder]))
    with pytest.raises(ConfigError, match=r"elsewhere is a blinded review.*--unblind"):
        open_view(folder)


def test_a_folder_the_review_cannot_be_recorded_in_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "slide1"
    (folder / REVIEWS_FILE).mkdir(parents=True)  # unwritable as a file
    with pytest.raises(InputPathError, match="cannot record the review in") as err:
        record_review([folder], tmp_path / "rv")
    assert "\n" not in str(err.value)


# --- training hygiene: no "normal" cells from a slide triaged excess -------------------------


def _scored_folder(folder, burden):
    """A scored folder's summary as cyto score writes one (no cells are cut before the check)."""
    from cyto.seal import seal_outputs

    folder.mkdir(parents=True)
    summary = {
        "model": "m.cyto",
        "method": "dsvdd",
        "slide": str(folder / "slide.tif"),
        "slide_identity": "x",
        "resolution": {"crop_px_level0": 32, "slide_mpp": 0.25},
        "burden": burden,
    }
    (folder / "scores.parquet").write_bytes(b"")
    summary["outputs"] = {"scores.parquet": {"kind": "parquet"}}
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, summary["outputs"])  # as cyto score seals what it wrote
    return folder


def test_data_cells_refuses_a_slide_its_calibrated_scoring_triaged_excess(tmp_path):
    from cyto.review.cells import harvest_cells

    folder = _scored_folder(
        tmp_path / "s", {"status": "ok", "triage": "excess", "slide_p_value": 0.006}
    )
    with pytest.raises(ConfigError, match=r"triaged the slide 'excess', slide p=0.006") as err:
        harvest_cells([folder], tmp_path / "ds")
    assert "\n" not in str(err.value) and "negative slides only" in str(err.value)
    assert not (tmp_path / "ds" / "normal").exists()


# --- truth cells outside the slide are said, not counted as missed ---------------------------


def test_truth_cells_outside_the_slide_are_said_in_one_line_and_left_out(tmp_path):
    import numpy as np
    import pyarrow as pa

    from cyto.errors import CytoWarning
    from cyto.infer.outputs import labels_from_truth

    truth = tmp_path / "t.csv"
    truth.write_text("x,y,label\n100,100,1\n5000,100,1\n100,-3,1\n")
    table = pa.table(
        {
            "slide_id": ["a", "a"],
            "cell_id": np.arange(2),
            "x": np.array([100.0, 400.0]),
            "y": np.array([100.0, 400.0]),
            "score": np.zeros(2),
        }
    )
    with pytest.warns(CytoWarning, match=r"2 of its 3 cell\(s\) .*outside the slide") as said:
        labels, _, planted = labels_from_truth(table, truth, 10, size=(1000, 800))
    assert [str(w.message).count("\n") for w in said] == [0]
    assert "1000 x 800 px" in str(said[0].message)
    assert labels.tolist() == [1, 0] and planted == 1  # the one on the slide, found


# --- each slide's cells once: a copy of a scored folder is the same slide ----------------------


def test_data_cells_refuses_the_same_slide_twice_as_calibrate_does(tmp_path):
    """A hostile check: `cyto data cells n1 copy-of-n1` wrote every cell twice into the training
    folder with no word, while `cyto calibrate` refused the same pair."""
    import shutil

    from cyto.review.cells import harvest_cells

    folder = _scored_folder(tmp_path / "n1", {"status": "ok"})
    copy = tmp_path / "elsewhere" / "n1copy"
    shutil.copytree(folder, copy)
    with pytest.raises(ConfigError, match="copies of one scoring run.*: give one of them") as err:
        harvest_cells([folder, copy], tmp_path / "ds")
    assert "\n" not in str(err.value) and "n1copy" in str(err.value)
    assert not (tmp_path / "ds").exists()


def _view(folder, tmp_path):
    from cyto.view.folder import open_view

    open_view(folder)


def _cells(folder, tmp_path):
    from cyto.review.cells import harvest_cells

    harvest_cells([folder], tmp_path / "ds")


def _review_of(folder, tmp_path):
    from cyto.review.session import build_session

    build_session([folder], tmp_path / "rv")


@pytest.mark.parametrize("reader", [_view, _cells, _review_of], ids=["view", "cells", "review"])
def test_a_copy_beside_its_original_in_a_cohort_folder_is_one_line_not_a_second_slide(
    tmp_path, reader
):
    """A hostile check: with `cp -r o/s3 o/s3copy`, `cyto view o` listed s3 twice ("viewer of
    4 slide(s)") and `cyto data cells o` said "give it once" of a folder nobody gave twice.
    Every reader of a cohort folder says which two folders are copies of one run."""
    import shutil

    cohort = tmp_path / "o"
    _scored_folder(cohort / "s3", {"status": "ok"})
    _scored_folder(cohort / "s4", {"status": "ok"})
    shutil.copytree(cohort / "s3", cohort / "s3copy_keep")
    with pytest.raises(ConfigError) as err:
        reader(cohort, tmp_path)
    said = str(err.value)
    assert "\n" not in said and "s3copy_keep" in said and "copies of one scoring run" in said
    assert said.startswith(f"{cohort.resolve()} holds s3 and s3copy_keep")
    assert not (tmp_path / "ds").exists() and not (tmp_path / "rv").exists()


def test_refines_refusal_names_the_flag_the_review_is_given_by(monkeypatch):
    """cyto refine takes the review as --marks; its refusal said --review (issue 68)."""
    from cyto.review import refine, session

    monkeypatch.setattr(refine, "lineage", lambda bundle, depth=32: ["this-model"])
    for made_by in ({"/o/a": "another-model"}, {"/o/a": None}):
        monkeypatch.setattr(session, "reviewed_models", lambda _s, m=made_by: m)
        with pytest.raises(ConfigError, match=r"^--marks rv\b") as err:
            refine.check_reviewed_model(None, Path("m.cyto"), Path("rv"), None)
        assert "--review" not in str(err.value)


# --- a review is known by the slide and model, not only by the folder's own record -----------


def _identified(folder, identity="slide-a", scoring_id="m1"):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"slide_identity": identity}))
    table = pa.table({"score": [0.1]}).replace_schema_metadata({"cyto.scoring_id": scoring_id})
    pq.write_table(table, folder / "scores.parquet")
    return folder


def test_a_review_is_found_when_the_folder_lost_its_record_or_the_slide_was_scored_again(
    tmp_path,
):
    """A hostile check: with a blinded review of a slide unfinished, `rm reviews.json` in its
    scored folder, or the same slide scored again by the same model into another folder, and
    cyto view showed every rank."""
    first = _identified(tmp_path / "scored" / "a")
    review = _review(tmp_path / "far" / "rv", [first])
    record_review([first], review)
    (first / REVIEWS_FILE).unlink()  # the folder's own record lost
    assert "blinded review with nothing marked yet" in review_blocking([first], [first])
    again = _identified(tmp_path / "rescored" / "a")  # the same slide and model elsewhere
    assert "blinded review with nothing marked yet" in review_blocking([again], [again])
    # the slide is blinded, not one model's ranking of it (hostile round 5, WS 4.5)
    other_model = _identified(tmp_path / "other" / "a", scoring_id="m2")
    assert "rv is a blinded review with nothing marked yet" in review_blocking(
        [other_model], [other_model]
    )
    other_slide = _identified(tmp_path / "b" / "b", identity="slide-b")
    assert review_blocking([other_slide], [other_slide]) is None


def test_a_registry_that_cannot_be_read_fails_closed_in_one_line(tmp_path, monkeypatch):
    """A hostile check: the registry's record of a slide cut short, or CYTO_REVIEW_REGISTRY
    naming a file, and cyto view served every rank with no word."""
    from cyto.review.session import _registry_file

    first = _identified(tmp_path / "scored" / "a")
    record_review([first], _review(tmp_path / "far" / "rv", [first]))
    (first / REVIEWS_FILE).unlink()
    record = _registry_file("slide-a")
    record.write_text(record.read_text()[:20])
    with pytest.raises(InputPathError, match="review registry's record .* cannot be read") as err:
        review_blocking([first], [first])
    assert "\n" not in str(err.value)
    not_a_folder = tmp_path / "registry-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("CYTO_REVIEW_REGISTRY", str(not_a_folder))
    with pytest.raises(InputPathError, match="is not a folder"):
        review_blocking([first], [first])


def test_a_report_out_that_is_a_file_is_one_line_and_the_file_kept(tmp_path):
    """A hostile check (round 2): `cyto review report REV --out FILE --overwrite` ended in a
    raw FileExistsError."""
    from cyto.review.report import write_report

    mine = tmp_path / "notes.txt"
    mine.write_text("mine\n")
    with pytest.raises(InputPathError, match="is a file: the report is a folder") as err:
        write_report(tmp_path / "rv", out=mine)
    assert "\n" not in str(err.value) and mine.read_text() == "mine\n"


def test_a_folder_scored_from_a_url_reads_the_url_and_says_it_without_secrets(tmp_path):
    """A hostile check (round 2): cyto view, data cells and review of a folder scored from a URL
    said the slide "http:/host/... is not there" (the URL read as a path). Now the URL is read
    (issue 67); a server that cannot be reached is one line, without user info or query."""
    from cyto.errors import CytoError
    from cyto.review.session import as_scored, read_source
    from tests.servers import free_port

    url = f"http://ann:pw@127.0.0.1:{free_port()}/s.tif?sig=SECRET"
    folder = _scored_folder(tmp_path / "s", {"status": "ok"})
    summary = json.loads((folder / "summary.json").read_text())
    summary["slide"] = url
    (folder / "summary.json").write_text(json.dumps(summary))
    from cyto.seal import seal_outputs

    seal_outputs(folder, summary["outputs"])
    source = read_source(folder)
    assert source.slide.startswith("http://127.0.0.1:") and "pw" not in source.slide
    with pytest.raises(CytoError, match="could not be reached") as e:
        as_scored(source.slide, source.identity)
    said = str(e.value)
    assert "http:/1" not in said and "pw" not in said and "SECRET" not in said, said
    assert "\n" not in said


def test_cells_are_never_cut_from_a_slide_replaced_since_it_was_scored(tmp_path):
    """cyto data cells and cyto review cut cells at the places a scored table names: from a
    slide file replaced since it was scored they cut another slide's pixels, without a word."""
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.infer.store import slide_identity
    from cyto.review.session import crop_cells

    path = tmp_path / "a.tif"
    write_slide(path, SlideSynthConfig(width=512, height=512, seed=1), workers=0)
    scored_as = slide_identity(path)
    crop_cells(path, [(100, 100)], 32, [tmp_path / "same.png"], identity=scored_as)
    assert (tmp_path / "same.png").is_file()
    other = tmp_path / "other" / "a.tif"
    write_slide(other, SlideSynthConfig(width=512, height=512, seed=2), workers=0)
    other.replace(path)
    with pytest.raises(InputPathError, match="is not the slide it was scored as") as err:
        crop_cells(path, [(100, 100)], 32, [tmp_path / "other.png"], identity=scored_as)
    assert "\n" not in str(err.value) and not (tmp_path / "other.png").exists()


def test_data_cells_says_when_a_slide_its_adequacy_rule_judged_unsatisfactory(tmp_path):
    """Hostile round 7 (H27): `cyto data cells` cut all 643 cells of a slide judged
    "unsatisfactory, 0 evaluable cells ... all off scale" as normal training cells, no word.
    It says so in one warning naming the slide and the rule's reasons."""
    from cyto.errors import CytoWarning
    from cyto.review.cells import harvest_cells
    from cyto.seal import seal_outputs

    folder = _scored_folder(tmp_path / "s", {"status": "ok"})
    summary = json.loads((folder / "summary.json").read_text())
    summary["adequacy"] = {
        "result": "unsatisfactory",
        "reasons": ["0 evaluable cells: cells off the model's scale"],
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, summary["outputs"])  # as a run that judged it so seals it
    with (
        pytest.warns(CytoWarning, match=r"its adequacy is unsatisfactory \(0 evaluable") as said,
        pytest.raises(Exception),  # noqa: B017 - the made-up slide has no pixels to cut
    ):
        harvest_cells([folder], tmp_path / "ds")
    [w] = [w for w in said if "adequacy" in str(w.message)]
    assert "\n" not in str(w.message) and str(folder) in str(w.message)
    # run again onto cells already cut: refused first, with no slide's warning before it
    # (hostile round 75, 6: each slide's adequacy at length, then "exists")
    (tmp_path / "ds" / "normal").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ds" / "normal" / "mine.png").write_bytes(b"x")
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        with pytest.raises(InputPathError, match="cyto did not write"):
            harvest_cells([folder], tmp_path / "ds")
    assert not [str(w.message) for w in again if "adequacy" in str(w.message)]


@pytest.mark.parametrize("onto", ["model", "marks", "data"])
def test_refine_never_writes_onto_its_own_inputs(tmp_path, onto):
    """``cyto refine M --out M --overwrite`` replaced its own input model, whose new manifest
    then named itself as its parent (hostile round 7, H1): an output that is an input is
    refused, --overwrite or not, before anything is read or written."""
    from tests.cli_runner import run_cyto

    model, marks, data = tmp_path / "m.cyto", tmp_path / "rv", tmp_path / "cells"
    for folder in (model, marks, data):
        folder.mkdir()
    (model / "manifest.json").write_text('{"kept": true}')
    target = {"model": model, "marks": marks, "data": data}[onto]
    res = run_cyto(
        "refine", str(model), "--marks", str(marks), "--data", str(data), "--out", str(target),
        "--overwrite",
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    named = {"model": f"MODEL {model}", "marks": f"--marks {marks}", "data": f"--data {data}"}
    assert res.stderr.strip() == (
        f"error: --out {target} is the input {named[onto]}: an output never replaces an input; "
        "give another place to write to"
    )
    assert (model / "manifest.json").read_text() == '{"kept": true}'
    assert not (tmp_path / f"{target.name}.refine").exists()


def test_refines_eta_is_refused_by_its_own_flag(tmp_path):
    """``cyto refine --eta -1`` said "--set known_abnormal_eta must be >= 0", a setting the user
    never wrote (hostile round 7, H33): --eta is checked as given, before the model is read."""
    from tests.cli_runner import run_cyto

    model, marks, data = tmp_path / "m.cyto", tmp_path / "rv", tmp_path / "cells"
    for folder in (model, marks, data):
        folder.mkdir()
    res = run_cyto(
        "refine", str(model), "--marks", str(marks), "--data", str(data), "--out",
        str(tmp_path / "r.cyto"), "--eta", "-1",
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip() == (
        "error: --eta must be >= 0 (the Deep SAD weight of the known abnormal cells; 0: they "
        "weigh nothing), got -1.0"
    )
    assert not (tmp_path / "r.cyto").exists() and not (tmp_path / "r.cyto.refine").exists()


def test_a_review_a_reviewer_has_open_is_said_so_not_called_unstarted(tmp_path):
    """Hostile round 8 (N16): `cyto view` during a review whose page was open, nothing marked
    yet, said it was "a blinded review nobody has started", which reads as an abandoned review
    and invites --unblind. It names who has the page open (the page holds its lock)."""
    from cyto.locks import OutputLock, held

    folder = tmp_path / "cohort" / "slide1"
    folder.mkdir(parents=True)
    rv = _review(tmp_path / "rv", [folder])
    record_review([folder], rv)
    page = OutputLock(rv / ".reviewer-ann", "cyto review page of reviewer 'ann'")
    with page:
        assert held(rv / ".reviewer-ann")
        said = review_blocking([folder], [folder])
        assert said.endswith("is a blinded review that ann has open now (nothing marked yet)")
    assert not held(rv / ".reviewer-ann")  # the page stopped: nothing marked, no one at it
    assert review_blocking([folder], [folder]).endswith("with nothing marked yet")


def test_scoring_again_under_an_open_review_is_said_and_the_view_advice_waits(tmp_path):
    """Hostile round 9 (N2, N3): `cyto score --overwrite` replaced a slide folder under an open
    blinded review with no word, then advised `cyto view` of it, which refuses until the review
    is finished. Both say the review."""
    from cyto.view.folder import rescoring_words, view_words

    folder = tmp_path / "o" / "s1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    assert rescoring_words([folder]) == []  # no review: nothing to say
    assert view_words([{"output": str(folder)}], folder.parent).startswith("see the whole slide")
    rv = _review(tmp_path / "rv", [folder.resolve()])
    record_review([folder], rv)
    [line] = rescoring_words([folder])
    assert line.startswith(f"{folder} is being scored again under an open review (")
    assert "blinded review with nothing marked yet" in line and "\n" not in line
    words = view_words([{"output": str(folder)}], folder.parent)
    assert words.startswith(f"cyto view {folder} shows every cell's rank, so it waits"), words


def test_scoring_the_reviewed_slide_into_another_folder_says_no_review_is_cut(tmp_path):
    """Hostile round 11 (N21): with a review made from oc/s1 open, `cyto score` of the same slide
    into another folder o11 with --overwrite said o11/s1 was "scored again under an open review":
    the review's cases come from oc/s1, which nothing replaced. Only the folder the review was
    cut from is said; the view of the other folder still waits (it shows the slide's ranks)."""
    from cyto.view.folder import rescoring_words, view_words

    reviewed = _identified(tmp_path / "oc" / "s1")
    rv = _review(tmp_path / "rv", [reviewed.resolve()])
    record_review([reviewed], rv)
    elsewhere = _identified(tmp_path / "o11" / "s1")  # the same slide, scored into another folder
    assert rescoring_words([elsewhere]) == []
    assert "shows every cell's rank, so it waits" in view_words(
        [{"output": str(elsewhere)}], elsewhere.parent
    )
    [line] = rescoring_words([reviewed])
    assert line.startswith(f"{reviewed} is being scored again under an open review (")


def test_a_scored_folder_that_is_not_there_is_said_so_from_where_it_was_looked_for(
    tmp_path, monkeypatch
):
    """Hostile round 75, 15: `cyto view scored/demo` from another folder was told "is not a
    folder"; the path does not exist there at all. A file stays "not a folder"."""
    from cyto.review.session import find_scored

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputPathError) as err:
        find_scored([Path("scored/demo")])
    assert str(err.value) == (
        f"scored/demo does not exist (looked for in {tmp_path}) (give the output folder of "
        "cyto score)"
    )
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputPathError, match=r"^f is not a folder \(give"):
        find_scored([Path("f")])
