"""The one-line report of a scored slide (:func:`cyto.cohort.run.slide_line`)."""

from __future__ import annotations

import hypothesis
import pytest
from hypothesis import strategies as st

from cyto.cohort.run import slide_line
from cyto.infer import ScoreOptions
from cyto.infer.finish import few_cells_words


def _summary(**over) -> dict:
    base = {
        "slide": "/d/s.ndpi",
        "output": "/o/s",
        "cells_scored": 0,
        "seconds": 1.5,
        "cells_per_s": None,
        "engine_cells_per_s": None,
        "cells_resumed": 0,
    }
    return {**base, **over}


def test_a_fresh_run_that_found_no_cells_says_so():
    """A fresh run of a slide without cells said 'all 0 from finished chunks' (QA): nothing was
    resumed, so the line says no cells were found."""
    line = slide_line(_summary(), "/o")
    assert "no cells found" in line and "finished chunks" not in line, line


def test_a_run_that_only_resumed_and_one_that_scored_are_told_apart():
    resumed = slide_line(_summary(cells_scored=40, cells_resumed=40), "/o")
    assert resumed == "s.ndpi: 40 cells in 1.5 s (all 40 from finished chunks) -> /o/s"
    fresh = slide_line(_summary(cells_scored=40, cells_per_s=26.7, engine_cells_per_s=120.0), "/o")
    assert "(26.7 cells/s, engine 120.0 cells/s)" in fresh, fresh


@hypothesis.given(
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
        lambda t: "/" not in t and t.strip(" ") == t
    ),
    st.sampled_from(["http://h:80/a%20b/", "s3://bucket/p/", "https://h/x/"]),
)
def test_a_slide_by_url_is_named_by_its_decoded_name_as_its_folder_is(name, prefix):
    """Hostile round 72, 5: `cyto score 'http://.../%C3%A9%202.tif'` named the slide `é 2` in its
    progress and folder, and `%C3%A9%202.tif` in its summary line: one name, decoded."""
    from urllib.parse import quote

    from cyto.slides.remote import SlideURL

    url = prefix + quote(f"{name}.tif")
    assert SlideURL(url).name == f"{name}.tif"
    line = slide_line(_summary(slide=url, cells_scored=3, cells_resumed=3), "/o")
    assert line.startswith(f"{name}.tif: 3 cells in "), line
    from cyto.cohort.local import REUSED

    kept = slide_line({**_summary(slide=url, cells_scored=3), REUSED: "then"}, "/o")
    assert kept.startswith(f"{name}.tif: "), kept


def test_a_slide_kept_from_an_earlier_run_says_when_not_how_long():
    """--resume reused a finished slide and the report reprinted the earlier run's '40 cells in
    1.5 s (26.7 cells/s ...)' as if it had just run."""
    from cyto.cohort.local import REUSED

    kept = _summary(cells_scored=40, cells_per_s=26.7, engine_cells_per_s=120.0)
    line = slide_line({**kept, REUSED: "2026-12-01 09:30 UTC"}, "/o")
    assert line == "s.ndpi: already scored (2026-12-01 09:30 UTC): 40 cells -> /o/s", line


def test_fewer_cells_than_tissue_tiles_gets_a_word_on_why():
    opts = ScoreOptions()
    words = few_cells_words(7, 19, None, opts)
    assert words.startswith("only 7 cells found in 19 tiles with tissue"), words
    assert "smear at 0.12 um/px (assumed: the slide records none)" in words
    assert "--mpp" in words and "--detection tissue" in words
    assert "assumed" not in few_cells_words(7, 19, 0.5, opts)
    assert few_cells_words(19, 19, None, opts) is None  # one a tile: no word
    assert few_cells_words(0, 3, None, opts) is None  # a slide of three tiles says little
    assert few_cells_words(2, 19, None, ScoreOptions(nuclei="n.csv")) is None  # points given
    from cyto.flags import python_words

    with python_words("score_slide"):  # a Python caller is told its keywords, not flags
        words = few_cells_words(7, 19, None, opts)
    assert "slide_mpp=UM_PER_PX" in words and "detection='tissue'" in words, words
    assert "nuclei=" in words and "--" not in words, words


def test_a_bad_score_option_is_named_as_the_flag_the_user_typed():
    """The errors named ScoreOptions' fields (top_k, slide_mpp, fdr_alpha), which cyto score
    does not take (QA); they name --top-k, --mpp, --fdr, with the value given."""
    import pytest

    from cyto.errors import ConfigError

    cases = {
        "top_k": (0, "--top-k must be >= 1, got 0"),
        "mosaic": (-1, "--mosaic must be >= 0"),
        "slide_mpp": (0.0, "--mpp must be between 0.01 and 10 (um per pixel"),
        "model_mpp": (500.0, "--model-mpp must be between 0.01 and 10 (um per pixel"),
        "fdr_alpha": (2.0, "--fdr must be between 0 and 1, got 2.0"),
        "triage_level": (0.0, "--triage-level must be between 0 and 1"),
        "patch_size": (8, "--patch-size must be between 16 and 1024 (px), got 8"),
        "tile": (100, "--tile must be at least --patch-size (192 px), got 100"),  # with 192 below
        "batch_size": (0, "--batch-size must be >= 1"),
        "workers": (-2, "--workers must be >= 0, got -2"),
        "rank_by": ("size", "--rank-by must be one of"),
    }
    for field, (value, words) in cases.items():
        with pytest.raises(ConfigError) as err:
            ScoreOptions(**{field: value}, **({"patch_size": 192} if field == "tile" else {}))
        assert str(err.value).startswith(words), (field, str(err.value))


def test_truth_without_planted_cells_is_not_reported_as_a_miss():
    """A hostile check: with --truth of another slide, the warning said the slide is scored
    without truth cells and the line then said "found in the top 145: 0/0"."""
    truth = {"k": 145, "planted_found_in_top_k": 0, "planted_abnormal": 0}
    line = slide_line(_summary(truth=truth), "/o")
    assert "0/0" not in line and "--truth holds no abnormal cell of this slide" in line, line
    found = {"k": 20, "planted_found_in_top_k": 3, "planted_abnormal": 4}
    assert "planted abnormal found in the top 20: 3/4" in slide_line(_summary(truth=found), "/o")
    # every cell in the top K (a slide of fewer cells than --top-k): "6/6" says nothing of the
    # ranking, and the line says why (hostile round 33, 9)
    every = {"k": 129, "planted_found_in_top_k": 6, "planted_abnormal": 6}
    line = slide_line(_summary(truth=every, cells_scored=129), "/o")
    assert "found in the top 129: 6/6 (every cell: --top-k over the 129 scored)" in line, line
    line = slide_line(_summary(truth=found, cells_scored=1500), "/o")
    assert line.endswith("found in the top 20: 3/4"), line
    # the top 400 of a 680-cell slide: 11/14 read well where its top 20 held none; said beside
    # what K cells drawn at random find (hostile round 57, 4)
    most = {"k": 400, "planted_found_in_top_k": 11, "planted_abnormal": 14}
    line = slide_line(_summary(truth=most, cells_scored=680), "/o")
    assert line.endswith(
        "found in the top 400: 11/14 (the top 400 is 59% of the 680 cells scored: chance "
        "alone finds 8.2)"
    ), line
    # the review's top K holds some of a tie the metrics count pessimistically: said (a Pap
    # slide's console 12/14 beside summary.json's tp_at_k 11: hostile round 58, 5)
    tied = {**found, "tied_at_k": 354}
    line = slide_line(_summary(truth=tied, cells_scored=1500), "/o")
    assert line.endswith(
        "found in the top 20: 3/4 (354 cells share the score at rank 20: the tp_at_k of "
        "summary.json counts their tie pessimistically)"
    ), line
    line = slide_line(_summary(truth=found, cells_scored=400), "/o")  # 20 is 5 %: said
    assert line.endswith("3/4 (the top 20 is 5% of the 400 cells scored: chance alone finds 0.2)")


def test_fdr_confidence_without_a_calibration_is_said_and_recorded_as_ignored():
    """A hostile check: --fdr-confidence 0.9 on an uncalibrated bundle did nothing, said
    nothing, and summary.json recorded it as if applied."""
    from pathlib import Path
    from types import SimpleNamespace

    import numpy as np

    from cyto.infer.finish import _calibrated

    said: list[str] = []
    bundle = SimpleNamespace(manifest={"files": {}}, path=Path("m.cyto"))
    run = SimpleNamespace(
        scorer=SimpleNamespace(bundle=bundle),
        opts=ScoreOptions(fdr_confidence=0.9),
        slide=Path("s.tif"),
        echo=said.append,
    )
    burden = _calibrated(np.zeros(3), run)["burden"]
    assert burden["status"] == "not calibrated" and burden["ignored"] == ["--fdr-confidence 0.9"]
    assert said == [
        "warning: s.tif: --fdr-confidence 0.9 does nothing without a calibration (the bundle "
        "has none)"
    ]
    run.opts, said[:] = ScoreOptions(), []
    assert "ignored" not in _calibrated(np.zeros(3), run)["burden"] and said == []
    # hostile round 6 (N23): --fdr did nothing either, and was not said
    run.opts = ScoreOptions(fdr_confidence=0.9, fdr_alpha=0.01)
    burden = _calibrated(np.zeros(3), run)["burden"]
    assert burden["ignored"] == ["--fdr-confidence 0.9", "--fdr 0.01"]
    assert said == [
        "warning: s.tif: --fdr-confidence 0.9 and --fdr 0.01 do nothing without a calibration (the "
        "bundle has none)"
    ]
    # hostile round 8 (N15): a value given that equals the default was not said (--fdr 0.1,
    # as the README types it)
    for given, words in (
        ({"fdr_alpha": 0.1}, "--fdr 0.1"),
        ({"triage_level": 0.05}, "--triage-level 0.05"),
        # hostile round 10 (N35): --burden-cells did nothing either, and was not said
        ({"burden_cells": "all"}, "--burden-cells all"),
        ({"burden_cells": "evaluable"}, "--burden-cells evaluable"),
    ):
        run.opts, said[:] = ScoreOptions(**given), []
        assert _calibrated(np.zeros(3), run)["burden"]["ignored"] == [words]
        assert said == [f"warning: s.tif: {words} does nothing without a calibration (the bundle "
                        "has none)"]  # fmt: skip


def test_a_resume_names_the_model_in_the_callers_words():
    """Hostile round 6 (N61): a Python `score_slide(resume=True)` over another model's stopped
    run was told "MODEL (its manifest) ... -> ...", the command line's placeholder."""
    from cyto.cohort.local import score_key_names
    from cyto.flags import python_words
    from cyto.infer.store import store_key_names

    # a stopped run's store, and a finished slide's key (round 56, 2: it said "MODEL" and "the
    # --truth file" to a Python caller)
    def scored_names():
        return score_key_names("s.tif")

    for names in (store_key_names, scored_names):
        assert names()["model"] == "MODEL (its manifest)"
        with python_words("score_slide"):
            assert names()["model"] == "model= (its manifest)"
            assert "--" not in " ".join(names().values()), names()
    assert scored_names()["truth_file"] == "the --truth file's content"


def test_already_scored_says_when_it_was_scored_not_when_it_was_copied(tmp_path):
    """Hostile round 6 (N58): `already scored (06:18)` after a cohort was copied at 06:18; it
    was scored at 06:12. The seal records when the run finished."""
    import json
    import os

    from cyto.cohort.local import scored_when
    from cyto.seal import SEAL, seal_outputs

    (tmp_path / "summary.json").write_text(json.dumps({"slide": "s.tif"}))
    seal_outputs(tmp_path, [])
    recorded = json.loads((tmp_path / SEAL).read_text())["sealed_at"]
    later = (tmp_path / SEAL).stat().st_mtime + 3 * 86400  # the copy, three days on
    for f in tmp_path.iterdir():
        os.utime(f, (later, later))
    assert scored_when(tmp_path) == recorded


def test_a_parquet_table_named_csv_is_said_so_without_its_bytes(tmp_path):
    """Hostile round 6 (N28): `cyto eval scores t.csv` (Parquet bytes) put the file's binary
    bytes into its one line. Said what it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.cli_runner import run_cyto

    path = tmp_path / "t.csv"
    pq.write_table(pa.table({"score": [0.1, 0.2], "label": [0, 1]}), path)
    proc = run_cyto("eval", "scores", str(path))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.endswith("it holds a Parquet table under a .csv name: rename it .parquet"), line
    assert line.isprintable()


@pytest.mark.parametrize("resume, overwrite, fresh", [(False, False, True), (True, False, False),
                                                      (False, True, False)])  # fmt: skip
def test_a_folder_finished_by_another_run_after_the_check_is_refused_under_the_lock(
    tmp_path, monkeypatch, resume, overwrite, fresh
):
    """Hostile round 9 (N25): two `cyto score` into one --out 2.5-3.2 s apart: the second, with
    no --overwrite, replaced the first's finished results (its check ran before the lock).
    The run says, to the pipeline, that it found no finished results; under the folder's lock
    the pipeline refuses a folder finished since, in one line."""
    from pathlib import Path

    import cyto.cohort.run as run
    from cyto.errors import InputPathError
    from cyto.infer.pipeline import refuse_finished_since
    from cyto.outputs_check import FRESH_ONLY

    seen = []
    monkeypatch.setattr(run, "score_cohort", lambda *a, **k: seen.append(FRESH_ONLY.get()))
    monkeypatch.setattr(run, "refuse_rescoring", lambda *a: None)
    run.run_cohort([], Path("m.cyto"), tmp_path / "o", ScoreOptions(resume=resume),
                   overwrite=overwrite)  # fmt: skip
    assert seen == [fresh] and FRESH_ONLY.get() is False  # set for the run only
    folder = tmp_path / "o" / "s1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    (folder / "scores.parquet").write_bytes(b"")
    token = FRESH_ONLY.set(True)
    try:
        with pytest.raises(InputPathError) as err:
            refuse_finished_since(Path("s1.tif"), folder)
    finally:
        FRESH_ONLY.reset(token)
    assert "was finished by another run after this one began" in str(err.value)
    assert "--overwrite" in str(err.value) and "\n" not in str(err.value)
    refuse_finished_since(Path("s1.tif"), folder)  # not a fresh-only run: nothing to refuse


def test_a_summary_with_undefined_numbers_reads_back_and_is_told():
    """Hostile round 11 (N31): a number the run could not define (NaN) is written as null in
    summary.json (strict JSON); the one-line report of a summary read back says it is unknown."""
    import json

    from cyto.tables import json_text

    nan = float("nan")
    burden = {
        "status": "ok",
        "abnormal_fraction": nan,
        "abnormal_fraction_interval": [nan, nan],
        "flagged_bh": 0,
        "fdr_alpha": 0.1,
        "slide_p_value": nan,
        "triage": "routine",
    }
    truth = {"k": 20, "planted_found_in_top_k": 0, "planted_abnormal": 0, "recall_at_k": nan}
    summary = json.loads(json_text(_summary(burden=burden, truth=truth)))
    line = slide_line(summary, "/o")
    unknown = "abnormal burden unknown above the normal cells' threshold (95% CI unknown)"
    assert f"{unknown}, 0 cells flagged" in line, line
    assert "slide p=unknown (routine)" in line, line


def _shouted(tree) -> list[str]:
    """The string pieces of ``tree`` that open a console line with a prefix other than the
    house's lowercase ``warning:``/``note:``/``error:`` (``WARNING:``, ``Warning:``, ``NOTE:``,
    ``Error:``), at the start of the string or after a braced name."""
    import ast
    import re

    prefix = re.compile(r"^(?:\{\}: )?(WARNING|Warning|NOTE|Note|ERROR|Error): ")
    found = []
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in inner:  # a piece of an f-string, read with it
            continue
        if isinstance(node, ast.JoinedStr):  # an f-string: its names as {}
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if prefix.match(text):
            found.append(f"{node.lineno}: {text[:40]!r}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_every_console_line_says_warning_note_and_error_in_one_case():
    """`cyto predict` printed `warning: UNVERIFIED`, a cohort of `cyto score` `WARNING:
    UNVERIFIED` for the same bundle, `cyto train` `WARNING: bag check FAILED` (hostile rounds 28
    and 29): a lab's log filter or a script reading the console keys on one prefix. No string
    of cyto's code opens a line with another case."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "cyto"
    bad = {
        str(f.relative_to(src)): hits
        for f in sorted(src.rglob("*.py"))
        if (hits := _shouted(ast.parse(f.read_text())))
    }
    assert bad == {}
    # the check can fail: the three lines it was written for, and a braced name before one
    probe = ast.parse(
        'echo(f"WARNING: {u}")\necho(f"{name}: WARNING: {m}")\n("WARNING: " if loud else "")\n'
        'echo("warning: fine")\n'
    )
    assert [h.split(":")[0] for h in _shouted(probe)] == ["1", "2", "3"]


@pytest.mark.parametrize(
    "name",
    ["m.cyto", "sp ace/m 1.cyto", "it's.cyto", "$HOME/x.cyto", 'q"u.cyto', "Лаб é.cyto", "-d.cyto",
     "--help", "a;rm -r b.cyto", "~/m.cyto", "*.cyto"],
)  # fmt: skip
def test_an_advised_path_pastes_into_a_shell_as_that_path(name, tmp_path):
    """Every path an advised command names (cyto.errors.as_arg) is one word to a shell and
    leads to that file: a space split it, a leading dash read as an option (hostile rounds
    54, 4 and 55, 7)."""
    import os
    import shlex
    import subprocess

    from cyto.errors import as_arg

    words = shlex.split(f"cyto export {as_arg(name)} --precision fp16")
    assert len(words) == 5 and not words[2].startswith("-"), words
    assert os.path.normpath(words[2]) == os.path.normpath(name)
    # the shell itself, with a file of that name here: printf gets the word as one argument
    got = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {as_arg(name)}"], capture_output=True, text=True,
        cwd=tmp_path, env={"HOME": "/nowhere", "PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert os.path.normpath(got.stdout.rstrip("\n")) == os.path.normpath(name), got


@pytest.mark.parametrize(
    "slide, words",
    [
        ("http://127.0.0.1:9/s.tif", "the version its server states"),
        ("s3://bucket/slides/s.tif", "the version its server states"),
        ("/slides/s.tif", "the slide's (or a plane's) file content"),
    ],
)
def test_a_stopped_run_over_a_slide_changed_since_names_what_changed(tmp_path, slide, words):
    """A resume over a URL whose version moved said "the slide's (or a plane's) file content:",
    where cyto never read the content, only the version the server states (the finished slide's
    check and the viewer named it rightly: round 62, 5)."""
    from cyto.infer.store import ChunkStore

    ChunkStore(tmp_path, {"slide": {slide: "a" * 64}}).start(resume=False, echo=print)
    said: list[str] = []
    ChunkStore(tmp_path, {"slide": {slide: "b" * 64}}).start(resume=True, echo=said.append)
    assert len(said) == 1 and said[0].startswith("resume: the earlier run had"), said
    assert f"{words}" in said[0] and f"{slide} aaaaaaaaaaaa -> bbbbbbbbbbbb" in said[0], said
    if "version" in words:
        assert "content" not in said[0], said


def test_a_burden_of_no_cell_above_the_threshold_says_why_its_interval_is_zero_wide():
    """ "95% CI 0.00-0.00%" read as certainty that a slide holds no abnormal cell: the line says
    that no cell scored above the threshold (hostile round 67, 13)."""
    burden = {
        "status": "ok",
        "cells": 254,
        "cells_above": 0,
        "abnormal_fraction": 0.0,
        "abnormal_fraction_interval": [0.0, 0.0],
        "flagged_bh": 0,
        "fdr_alpha": 0.1,
        "slide_p_value": 1.0,
        "triage": "no excess",
        "threshold_quantile_of_normals": 0.99,
    }
    line = slide_line(_summary(burden=burden), "/o")
    assert "(95% CI 0.00-0.00%: no cell scored above it)" in line, line
    burden.update(cells_above=3, abnormal_fraction_interval=[0.0, 0.01])
    assert "(95% CI 0.00-1.00%)" in slide_line(_summary(burden=burden), "/o")
