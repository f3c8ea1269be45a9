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
        assert a == pytest.approx(b)
    classes = evaluate_by_class(path, [5], score_column="rank", echo=said.append)
    assert classes[0]["auroc"] == pytest.approx(by_score[0]["auroc"])


def test_cli_reads_rank_the_right_way_round_and_says_so(tmp_path):
    path = _ranked_table(tmp_path / "t.parquet")
    score = run_cyto("eval", "scores", str(path), "--k", "10", "--score-column", "score")
    rank = run_cyto("eval", "scores", str(path), "--k", "10", "--score-column", "rank")
    assert score.returncode == 0 and rank.returncode == 0, rank.stderr
    assert rank.stdout == NOTE + "\n" + score.stdout
    both = run_cyto("eval", "scores", str(path), "--score-column", "rank", "--by-class")
    assert both.returncode == 0 and both.stdout.count(NOTE) == 1, both.stdout
    js = run_cyto("eval", "scores", str(path), "--k", "10", "--score-column", "rank", "--json")
    assert js.returncode == 0 and js.stderr.strip() == NOTE
    assert json.loads(js.stdout)[0]["auroc"] == pytest.approx(
        json.loads(run_cyto("eval", "scores", str(path), "--k", "10", "--json").stdout)[0]["auroc"]
    )
