"""cyto eval scores on a rank column: cyto's ``rank`` is 1 = most abnormal, the other way round
from every score column (hostile round 10, N32: AUROC 0.2232 for a table whose scores give
0.7768, without a word)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import rankdata

from cyto.data.morphometry import ranked_column
from cyto.eval.scores import evaluate_by_class, evaluate_table
from tests.cli_runner import run_cyto

NOTE = "note: rank: 1 = most abnormal, read as such (lower = more abnormal)"


def _ranked_table(path, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.r_[np.zeros(80, dtype=np.int64), np.ones(20, dtype=np.int64)]
    scores = rng.normal(0, 1, len(labels)) + labels  # better than chance, not perfect
    rank = rankdata(-scores, method="ordinal").astype(np.int64)  # as cyto writes it: 1 = top
    classes = np.where(labels == 1, "LSIL", "NILM")
    pq.write_table(
        pa.table({"class": classes, "score": scores, "rank": rank, "label": labels}), path
    )
    return path


def test_rank_column_gives_the_score_columns_metrics(tmp_path):
    path = _ranked_table(tmp_path / "t.parquet")
    said = []
    by_score = evaluate_table(path, [5, 10], "score", echo=said.append)
    assert said == []
    by_rank = evaluate_table(path, [5, 10], "rank", echo=said.append)
    assert said == [NOTE]
    assert by_rank[0]["auroc"] > 0.5
    for a, b in zip(by_score, by_rank, strict=True):
        assert (a.pop("score_column"), b.pop("score_column")) == ("score", "rank")
        assert a == pytest.approx(b)
    classes = evaluate_by_class(path, [5], score_column="rank", echo=said.append)
    assert classes[0]["auroc"] == pytest.approx(by_score[0]["auroc"])


def test_cli_reads_rank_the_right_way_round_and_says_so(tmp_path):
    path = _ranked_table(tmp_path / "t.parquet")
    score = run_cyto("eval", "scores", str(path), "--k", "10", "--score-column", "score")
    rank = run_cyto("eval", "scores", str(path), "--k", "10", "--score-column", "rank")
    assert score.returncode == 0 and rank.returncode == 0, rank.stderr
    # the same numbers, each table line naming the column it judged (round 27, 14)
    assert rank.stdout == NOTE + "\n" + score.stdout.replace(
        "(judged by 'score')", "(judged by 'rank')"
    )
    assert "(judged by 'score')" in score.stdout
    both = run_cyto("eval", "scores", str(path), "--score-column", "rank", "--by-class")
    assert both.returncode == 0 and both.stdout.count(NOTE) == 1, both.stdout
    js = run_cyto("eval", "scores", str(path), "--k", "10", "--score-column", "rank", "--json")
    assert js.returncode == 0 and js.stderr.strip() == NOTE
    assert json.loads(js.stdout)[0]["auroc"] == pytest.approx(
        json.loads(run_cyto("eval", "scores", str(path), "--k", "10", "--json").stdout)[0]["auroc"]
    )


@pytest.mark.parametrize("seed", range(6))
def test_a_table_that_lost_its_ranking_s_record_is_judged_by_the_column_its_rank_follows(
    tmp_path, seed
):
    """Hostile round 25 (21): a predict table saved as CSV (or Parquet without its metadata)
    lost ``cyto.rank_by``, and ``--score-column auto`` judged the model's ``score`` (AUROC
    0.539) where cyto had ranked by ``morphometry_score`` (0.796), without a word. The column
    cyto's ``rank`` follows is judged, and said; a rank that follows none is judged itself."""
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    n = 120
    labels = (rng.random(n) < 0.2).astype(np.int64)
    cols = {
        "score": rng.normal(0, 1, n),
        "morphometry_score": np.maximum(rng.normal(0, 1, n) + 1.5 * labels, 0.0),  # ties at 0
        "fused_score": rng.random(n),
    }
    followed = ["score", "morphometry_score", "fused_score", None][seed % 4]
    if followed is None:  # a rank of its own (a user's, an edited table)
        rank = rng.permutation(n) + 1
    else:  # cyto's: ties broken by the model's score
        rank = np.lexsort((-cols["score"], -cols[followed])).argsort() + 1
    table = pa.table({**cols, "rank": rank.astype(np.int64), "label": labels})
    csv, bare = tmp_path / "t.csv", tmp_path / "t.parquet"
    pcsv.write_csv(table, csv)
    pq.write_table(table, bare)
    expected = evaluate_table(bare, [10], followed or "rank", echo=lambda m: None)
    for path in (csv, bare):
        said = []
        got = evaluate_table(path, [10], echo=said.append)
        assert got[0]["auroc"] == pytest.approx(expected[0]["auroc"]), (path, followed)
        line = next(m for m in said if "records no ranking" in m)
        if followed is None:
            assert "its rank follows no score column: judged by rank" in line, line
        else:
            assert f"judged by {followed!r}, the column its rank follows" in line, line
    # a table that records its ranking is judged by it, without a word about it
    meta = {b"cyto.rank_by": b"model"}
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "m.parquet")
    said = []
    evaluate_table(tmp_path / "m.parquet", [10], echo=said.append)
    assert not any("records no ranking" in m for m in said)


def test_a_column_it_refuses_is_one_line_without_notes_before_it(tmp_path):
    """Hostile round 25 (26): ``--score-column nucleus_area_um2`` (NaN where no nucleus was
    measured) printed a note on ties at K, then the error: two lines for one refusal. (A
    morphometry column's NaN now ranks lowest, round 33; any other column's is refused so.)"""
    n = 60
    area = np.r_[np.full(40, 30.0), np.linspace(40, 90, 10), np.full(10, np.nan)]
    labels = np.r_[np.zeros(40, np.int64), np.ones(20, np.int64)]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"my_score": area[:n], "label": labels}), path)
    proc = run_cyto("eval", "scores", str(path), "--k", "50", "--score-column", "my_score")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    [line] = (proc.stdout + proc.stderr).strip().splitlines()
    assert line.startswith("error: 10 score(s) are NaN or infinite"), line


def test_a_k_above_the_table_is_said_as_the_whole_table(tmp_path):
    """Hostile round 25 (26): ``--k 10000`` on a table of 420 cells printed a row of K 420,
    the K asked for unsaid. The metrics of the whole table, and a note."""
    path = _ranked_table(tmp_path / "t.parquet")
    said: list[str] = []
    rows = evaluate_table(path, [10, 500, 1000], "score", echo=said.append)
    assert [r["k"] for r in rows] == [10, 100, 100]
    assert said == ["note: --k 500, --k 1000 are more than the table's 100 cells: the whole table"]


@pytest.mark.parametrize("seed", range(8))
def test_a_table_without_its_ranking_or_a_rank_says_which_column_it_judged(tmp_path, seed):
    """Hostile round 26 (2): a predict table ranked by its morphometric score, saved as CSV
    without its ``rank`` (or Parquet without metadata), was judged by the model's ``score``:
    AUROC 0.604 for 0.874, without a word, and --json did not name the column. The note names
    the column judged and the others the table holds; every row (--json too) names it."""
    import itertools

    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    n = 60
    labels = (rng.random(n) < 0.3).astype(np.int64)
    subsets = [c for r in (1, 2, 3) for c in itertools.combinations(
        ("score", "morphometry_score", "fused_score"), r)]  # fmt: skip
    present = subsets[seed % len(subsets)]
    table = pa.table({**{c: rng.normal(0, 1, n) for c in present}, "label": labels})
    pcsv.write_csv(table, tmp_path / "t.csv")
    said = []
    rows = evaluate_table(tmp_path / "t.csv", [5], echo=said.append)
    judged = rows[0]["score_column"]
    assert judged == ranked_column(present) and judged in present  # fused, score, morphometry
    notes = [m for m in said if "records no ranking" in m]
    if len(present) == 1:
        assert notes == []
    else:
        (line,) = notes
        assert f"and has no rank column: judged by {judged!r}; it also holds " in line, line
        assert all(repr(c) in line for c in present), line
    proc = run_cyto("eval", "scores", str(tmp_path / "t.csv"), "--k", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["score_column"] == judged
    assert ("records no ranking" in proc.stderr) == (len(present) > 1)


def test_non_finite_scores_are_named_by_the_tables_rows(tmp_path):
    """Hostile round 43 (8): a CSV's NaN and inf scores at its data rows 2, 4 and 6 were said
    "at [1, 3, 5]", the metrics' 0-based positions, with nothing to say so."""
    path = tmp_path / "e.csv"
    path.write_text("path,score,label\na.png,0.9,1\nb.png,NaN,1\nc.png,0.1,0\nd.png,,0\n"
                    "e.png,0.5,0\nf.png,inf,0\n")  # fmt: skip
    proc = run_cyto("eval", "scores", str(path), "--k", "2")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: 3 score(s) are NaN or infinite in 'score' of {path} (e.g. its row(s) 2, 4, 6, "
        "counted from 1 below the header); remove or rescore those cells"
    )
