"""Top-K retrieval metrics of *Needle in a Haystack* (Chatterjee et al., 2024), numpy only.

Every function takes ``scores`` (higher = more abnormal) and binary ``labels`` (1 = abnormal) and
ranks the cells by score. Ties are broken pessimistically and deterministically: among cells with
equal scores, normal cells rank ahead of abnormal ones, and otherwise the input order is kept. A
constant scorer therefore never looks better than chance.

``K`` larger than the number of cells ``N`` means ``K = N``. With no abnormal cell, the recall-type
metrics (Recall, nDCG, AUTK, AUFROC) are undefined and return NaN; TP and precision are 0. NaN or
infinite scores, labels other than 0/1 and mismatched lengths raise :class:`MetricError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cyto.errors import MetricError


def _check(scores, labels, k: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    if s.shape != y.shape:
        raise MetricError(f"scores and labels differ in length: {s.size} vs {y.size}")
    bad = ~np.isfinite(s)
    if bad.any():
        where = np.flatnonzero(bad)[:5].tolist()
        raise MetricError(
            f"{int(bad.sum())} score(s) are NaN or infinite (e.g. at {where}); "
            "remove or rescore those cells"
        )
    if y.size and not np.isin(y, (0, 1)).all():
        raise MetricError(f"labels must be 0 (normal) or 1 (abnormal), got {np.unique(y)[:5]}")
    y = y.astype(np.int64)
    if k is not None:
        if int(k) < 1:
            raise MetricError(f"K must be >= 1, got {k}")
        k = min(int(k), s.size)
    return s, y, k if k is not None else s.size


def ranking(scores, labels) -> np.ndarray:
    """Indices from most to least abnormal, ties broken pessimistically (see module doc)."""
    s, y, _ = _check(scores, labels)
    return np.lexsort((np.arange(s.size), y, -s))


def tied_at_k(scores, k: int) -> int:
    """How many cells share the K-th highest score while some of them rank below K: the cells
    whose order inside the top K the pessimistic tie-break decides (0: the top K is the same
    under any order of ties)."""
    s = np.sort(np.asarray(scores, dtype=np.float64).ravel())[::-1]
    k = min(int(k), s.size)
    if k < 1 or k >= s.size or s[k - 1] != s[k]:
        return 0
    return int(np.sum(s == s[k - 1]))


def ties_words(scores, k: int) -> str | None:
    """One line when ties decide the top ``k`` (``tied_at_k``), saying how they are broken, or
    None. ``cyto predict`` and ``cyto eval scores`` said Recall@5 1.000 and 0.000 of one table of
    equal scores, each breaking ties its own way without a word (hostile round 12, N6)."""
    n = tied_at_k(scores, k)
    if not n:
        return None
    return (
        f"note: {n} cells share the score at rank {min(int(k), np.size(scores))}: the top {k} "
        "breaks their tie pessimistically (normal cells first), so a constant scorer never "
        "looks better than chance"
    )


def ranked_labels(scores, labels) -> np.ndarray:
    s, y, _ = _check(scores, labels)
    return y[ranking(s, y)]


def tp_at_k(scores, labels, k: int) -> int:
    s, y, k = _check(scores, labels, k)
    return int(ranked_labels(s, y)[:k].sum())


def recall_at_k(scores, labels, k: int) -> float:
    s, y, k = _check(scores, labels, k)
    t = int(y.sum())
    return math.nan if t == 0 else tp_at_k(s, y, k) / t


def precision_at_k(scores, labels, k: int) -> float:
    s, y, k = _check(scores, labels, k)
    return 0.0 if k == 0 else tp_at_k(s, y, k) / k


def dcg_at_k(scores, labels, k: int) -> float:
    """Sum over the top K of (2^y - 1) / log2(i + 1), i = 1..K."""
    s, y, k = _check(scores, labels, k)
    r = ranked_labels(s, y)[:k]
    return float(((2.0**r - 1) / np.log2(np.arange(2, r.size + 2))).sum())


def ndcg_at_k(scores, labels, k: int) -> float:
    """DCG@K over the ideal DCG@K (all abnormal cells first)."""
    s, y, k = _check(scores, labels, k)
    t = int(y.sum())
    if t == 0:
        return math.nan
    ideal = (1.0 / np.log2(np.arange(2, min(t, k) + 2))).sum()
    return dcg_at_k(s, y, k) / float(ideal)


def autk_at_k(scores, labels, k: int) -> float:
    """AUTK@K = sum_{k'=1..K} TP(<= k') / T."""
    s, y, k = _check(scores, labels, k)
    t = int(y.sum())
    if t == 0:
        return math.nan
    return float(np.cumsum(ranked_labels(s, y)[:k]).sum() / t)


def aufroc_at_k(scores, labels, k: int) -> float:
    """Normalized area under the free-response ROC curve up to K.

    TPR(k') = TP(k') / T_max with T_max = min(T, K), the most abnormal cells K can hold; FPI(k') =
    FP(k') / K; k' = 0..K (starting from the origin), integrated by the trapezoid rule, and the
    curve carried flat at its last TPR out to FPI = 1 (a free-response curve ends where the
    reader stops; the K cells' hits use up part of the false-positive axis). A perfect ranking
    scores 1; no hit in the top K scores 0. (Before this extension a perfect ranking scored
    1 - T_max / K: 0 when K equals the number of abnormal cells.)
    """
    s, y, k = _check(scores, labels, k)
    t = int(y.sum())
    if t == 0:
        return math.nan
    r = ranked_labels(s, y)[:k]
    tp = np.concatenate([[0], np.cumsum(r)])
    fp = np.concatenate([[0], np.cumsum(1 - r)])
    tpr = tp / min(t, k)
    fpi = fp / k
    area = np.sum((fpi[1:] - fpi[:-1]) * (tpr[1:] + tpr[:-1]) / 2.0)
    return float(area + (1.0 - fpi[-1]) * tpr[-1])


def auroc(scores, labels) -> float:
    """Area under the ROC curve (Mann-Whitney, ties count one half); NaN with one class only."""
    s, y, _ = _check(scores, labels)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size)
    sorted_s = s[order]
    # midranks for ties
    starts = np.flatnonzero(np.concatenate([[True], sorted_s[1:] != sorted_s[:-1]]))
    ends = np.concatenate([starts[1:], [s.size]])
    for a, b in zip(starts, ends, strict=True):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def all_metrics(scores, labels, k: int) -> dict[str, float]:
    """Every metric at one K (the row ``cyto eval scores`` prints)."""
    s, y, kk = _check(scores, labels, k)
    return {
        "n": int(s.size),
        "positives": int(y.sum()),
        "k": kk,
        "tp_at_k": tp_at_k(s, y, kk),
        "recall_at_k": recall_at_k(s, y, kk),
        "precision_at_k": precision_at_k(s, y, kk),
        "ndcg_at_k": ndcg_at_k(s, y, kk),
        "autk_at_k": autk_at_k(s, y, kk),
        "aufroc_at_k": aufroc_at_k(s, y, kk),
        "auroc": auroc(s, y),
    }


def truth_metrics(truth) -> Callable | None:
    """The metrics a slide's truth report adds (:func:`all_metrics`) when it is scored with a
    truth table, else None: one rule for ``cyto score --truth`` and ``cyto.score_slide(truth=)``
    (the Python call's summary had the planted counts only: hostile round 28, 2); with
    ``tied_at_k``, the cells sharing the K-th score across K, which the metrics count
    pessimistically where the review's top K holds some of them (0: none)."""
    return truth_report_metrics if truth is not None else None


def truth_report_metrics(scores, labels, k: int) -> dict:
    """:func:`all_metrics` with ``tied_at_k`` (module level: a cohort's workers take it)."""
    return {**all_metrics(scores, labels, k), "tied_at_k": tied_at_k(scores, k)}
