"""Ranking metrics on hand-computed cases, against sklearn and an independent brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import ndcg_score, roc_auc_score

from cyto.eval import metrics as M

S = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
Y = [1, 0, 1, 0, 0, 1]  # ranked: + - + - - +


def test_hand_computed_small_case():
    assert M.tp_at_k(S, Y, 3) == 2
    assert M.recall_at_k(S, Y, 3) == pytest.approx(2 / 3)
    assert M.precision_at_k(S, Y, 3) == pytest.approx(2 / 3)
    dcg = 1 / math.log2(2) + 1 / math.log2(4)
    assert M.dcg_at_k(S, Y, 3) == pytest.approx(dcg)
    ideal = 1 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert M.ndcg_at_k(S, Y, 3) == pytest.approx(dcg / ideal)
    # TP(<=1..3) = 1, 1, 2 -> (1 + 1 + 2) / 3
    assert M.autk_at_k(S, Y, 3) == pytest.approx(4 / 3)
    # AUFROC@3: T_max = 3; points (FPI, TPR): (0,0) (0,1/3) (1/3,1/3) (1/3,2/3), carried flat
    # to FPI 1 -> 1/3 * 1/3 + 2/3 * 2/3
    assert M.aufroc_at_k(S, Y, 3) == pytest.approx(1 / 9 + 4 / 9)
    assert M.auroc(S, Y) == pytest.approx(roc_auc_score(Y, S))


def test_ties_are_broken_pessimistically():
    scores = [1.0, 1.0, 1.0, 0.0]
    labels = [1, 0, 1, 0]
    # among the three tied cells the normal one ranks first
    assert M.ranked_labels(scores, labels).tolist() == [0, 1, 1, 0]
    assert M.tp_at_k(scores, labels, 1) == 0
    constant = np.zeros(10)
    y = np.array([1] * 3 + [0] * 7)
    assert M.tp_at_k(constant, y, 7) == 0
    assert M.auroc(constant, y) == 0.5


def test_k_larger_than_n_and_no_positives():
    assert M.tp_at_k(S, Y, 100) == 3
    assert M.recall_at_k(S, Y, 100) == 1.0
    assert M.precision_at_k(S, Y, 100) == pytest.approx(0.5)
    none = [0, 0, 0]
    assert M.tp_at_k([3, 2, 1], none, 2) == 0
    assert math.isnan(M.recall_at_k([3, 2, 1], none, 2))
    assert math.isnan(M.ndcg_at_k([3, 2, 1], none, 2))
    assert math.isnan(M.aufroc_at_k([3, 2, 1], none, 2))
    assert math.isnan(M.auroc([3, 2, 1], none))
    row = M.all_metrics([3, 2, 1], none, 10)
    assert row["k"] == 3 and row["tp_at_k"] == 0


def test_bad_inputs_are_clear_errors():
    with pytest.raises(M.MetricError, match="NaN or infinite"):
        M.recall_at_k([0.1, float("nan")], [0, 1], 1)
    with pytest.raises(M.MetricError, match="0 \\(normal\\) or 1"):
        M.tp_at_k([0.1, 0.2], [0, 2], 1)
    with pytest.raises(M.MetricError, match="differ in length"):
        M.tp_at_k([0.1, 0.2], [0], 1)
    with pytest.raises(M.MetricError, match="K must be >= 1"):
        M.tp_at_k([0.1], [1], 0)


@pytest.mark.parametrize("seed", range(5))
def test_ndcg_and_auroc_agree_with_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = (rng.random(200) < 0.1).astype(int)
    y[:2] = 1
    s = rng.normal(size=200) + y  # continuous: no ties
    for k in (1, 10, 50, 500):
        ref = ndcg_score(y[None, :], s[None, :], k=k)
        assert M.ndcg_at_k(s, y, k) == pytest.approx(ref)
    s_tied = np.round(s, 1)  # with ties
    assert M.auroc(s_tied, y) == pytest.approx(roc_auc_score(y, s_tied))


def _aufroc_brute(scores, labels, k):
    # an independent reading: walk the ranking cell by cell, summing trapezoids
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], labels[i], i))
    k = min(k, len(scores))
    t_max = min(sum(labels), k)
    area, tp, fp = 0.0, 0, 0
    for i in order[:k]:
        prev_tpr, prev_fpi = tp / t_max, fp / k
        tp += labels[i]
        fp += 1 - labels[i]
        area += (fp / k - prev_fpi) * (tp / t_max + prev_tpr) / 2
    return area + (1 - fp / k) * tp / t_max  # the last TPR, out to FPI 1


@pytest.mark.parametrize("seed", range(6))
def test_aufroc_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    y = (rng.random(n) < 0.3).astype(int).tolist()
    y[0] = 1
    s = np.round(rng.random(n), 2).tolist()
    for k in (1, 3, n // 2 + 1, n + 5):
        assert M.aufroc_at_k(s, y, k) == pytest.approx(_aufroc_brute(s, y, k))


def test_perfect_ranking():
    y = [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    s = list(range(10, 0, -1))
    assert M.recall_at_k(s, y, 4) == 1.0
    assert M.ndcg_at_k(s, y, 4) == pytest.approx(1.0)
    assert M.aufroc_at_k(s, y, 4) == pytest.approx(1.0)
    # K = the number of abnormal cells: a perfect ranking scored 0 before the curve was carried
    # out to FPI 1 (QA); it is 1, a ranking with no hit is 0 and one hit of two is in between
    assert M.aufroc_at_k(s, y, 2) == pytest.approx(1.0)
    assert M.aufroc_at_k(s[::-1], y, 2) == 0.0
    assert 0 < M.aufroc_at_k([10, 1, 9] + s[3:], y, 2) < 1


def test_eval_scores_cli(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.cli_runner import run_cyto

    pq.write_table(
        pa.table({"score": S, "label": Y, "cell_id": list(range(6))}), tmp_path / "s.parquet"
    )
    proc = run_cyto("eval", "scores", str(tmp_path / "s.parquet"), "--k", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)[0]
    assert row["tp_at_k"] == 2 and row["aufroc_at_k"] == pytest.approx(5 / 9)
    (tmp_path / "u.csv").write_text("p,is_blast\n0.2,0\n0.9,1\n0.5,0\n")
    proc = run_cyto(
        "eval",
        "scores",
        str(tmp_path / "u.csv"),
        "--score-column",
        "p",
        "--label-column",
        "is_blast",
        "--k",
        "1",
    )
    assert proc.returncode == 0 and "Recall" in proc.stdout
    bad = run_cyto("eval", "scores", str(tmp_path / "s.parquet"), "--label-column", "y")
    assert bad.returncode == 2 and "no column 'y'" in bad.stderr


def test_ties_at_k_are_broken_one_way_and_said():
    """Hostile round 12, N6: on one table of equal scores `cyto predict` said Recall@5 1.000 and
    `cyto eval scores` 0.000, each breaking ties its own way without a word."""
    from cyto.eval.metrics import recall_at_k, tied_at_k, ties_words

    scores, labels = np.zeros(10), np.array([1] * 5 + [0] * 5)
    assert recall_at_k(scores, labels, 5) == 0.0  # normal cells first among ties
    assert tied_at_k(scores, 5) == 10
    assert ties_words(scores, 5).startswith("note: 10 cells share the score at rank 5")
    assert tied_at_k(np.arange(10.0), 5) == 0 and ties_words(np.arange(10.0), 5) is None
    assert tied_at_k(np.array([3, 2, 2, 2, 1.0]), 2) == 3
    assert tied_at_k(np.array([3, 2, 2, 1, 1.0]), 3) == 0  # the top 3 is the same any order


def test_a_slides_truth_report_counts_the_tie_at_k():
    """A Pap slide's review top 400 held 12 planted cells of a tie at morphometric score 0 that
    summary.json's tp_at_k (pessimistic) counted as 11, unsaid (hostile round 58, 5): the truth
    report's metrics carry how many cells share the K-th score."""
    scores = np.array([5.0, 4.0, 0.0, 0.0, 0.0, 0.0])
    labels = np.array([0, 1, 1, 0, 0, 1])
    row = M.truth_metrics("truth.parquet")(scores, labels, 3)
    assert row["tied_at_k"] == 4 and row["tp_at_k"] == 1  # normal cells first in the tie
    assert M.truth_metrics("t")(scores, labels, 2)["tied_at_k"] == 0
    assert M.truth_metrics(None) is None
