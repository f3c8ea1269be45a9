"""The bag check of the weakly supervised methods: after training, do the model's own instance
scores, pooled per training bag, put the positive bags above the negative ones?

A weakly supervised method only ever sees bag labels. If its instance ranking came out inverted
(abnormal cells below normal ones, as ItS2CLR's did at a 5 % witness rate before its aggregator
was anchored on negative bags) or flat, nothing else in training says so. Pooling the scores of the
cells each bag holds and comparing positive with negative bags does: a model whose pooled scores
rank the positive training bags no better than chance has learned nothing usable about witnesses.

Pooling is the mean of each bag's top ``top_fraction`` scores (at least one cell): what a reviewer
would see of the bag, and less noisy than the maximum. The check passes when the bag AUROC would be
unlikely (p <= 0.05) under bag labels drawn at random (an exact permutation test for the few bags
of a training set): with 5 positive and 5 negative bags that takes a bag AUROC of 0.84 or more.
It is ``failed`` when the ranking is inverted beyond what random bag labels give (bag AUROC below
0.5 with the lower one-sided p <= 0.05: 0.16 or less with 5 + 5 bags), and ``weak`` otherwise.
An AUROC just under 0.5 is not a failure: with 10 bags it is noise. ItS2CLR on the final split
(WR 4.3 %) had a seed at bag AUROC 0.48 and held-out AUROC 0.78.

It is a necessary check, not a sufficient one: it runs on the training bags, which a network can
memorise, so a pass does not prove the ranking holds on new cells. A failure, on the other hand,
means the model is not usable as trained. Measured on ItS2CLR before its fix (10 Matek bags, witness
rate 9 %, 3 seeds): of the two seeds whose held-out AUROC was inverted (0.38, 0.39), the check
flagged one (bag AUROC 0.40: ``weak`` under the rule above, which 10 bags cannot call inverted)
and passed the other (0.96: its pseudo-labels had taught the encoder the positive bags' own
normal cells).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PASS_LEVEL = 0.05  # a pass: bag AUROC this unlikely (or less) under bag labels drawn at random


def pooled_bag_scores(
    scores: np.ndarray, bags: np.ndarray, top_fraction: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """``(bag names, pooled score)``: the mean of each bag's top ``top_fraction`` scores."""
    names, inverse = np.unique(np.asarray(bags).astype(str), return_inverse=True)
    pooled = np.empty(len(names))
    for b in range(len(names)):
        s = np.sort(np.asarray(scores, dtype=np.float64)[inverse == b])[::-1]
        k = max(1, int(np.ceil(top_fraction * len(s))))
        pooled[b] = s[:k].mean()
    return names, pooled


def auroc(y: np.ndarray, s: np.ndarray) -> float:
    """Mann-Whitney AUROC with ties counted half. ``cyto.eval.metrics.auroc`` is the same number,
    but ``train/`` sits below ``eval/`` in the layering and may not import it."""
    y = np.asarray(y).astype(bool)
    pos, neg = np.asarray(s)[y], np.asarray(s)[~y]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def null_aurocs(
    y: np.ndarray, s: np.ndarray, max_exact: int = 20_000, draws: int = 5_000
) -> np.ndarray:
    """The AUROC of ``s`` under every relabelling of ``y`` when there are at most ``max_exact``,
    else under ``draws`` seeded shuffles."""
    from itertools import combinations
    from math import comb

    y = np.asarray(y).astype(bool)
    n, k = len(y), int(y.sum())
    if comb(n, k) <= max_exact:
        labellings = []
        for pos in combinations(range(n), k):
            lab = np.zeros(n, dtype=bool)
            lab[list(pos)] = True
            labellings.append(lab)
    else:
        rng = np.random.default_rng(0)
        labellings = [rng.permutation(y) for _ in range(draws)]
    return np.array([auroc(lab, s) for lab in labellings])


def permutation_p(
    y: np.ndarray,
    s: np.ndarray,
    max_exact: int = 20_000,
    draws: int = 5_000,
    lower: bool = False,
    null: np.ndarray | None = None,
) -> float:
    """One-sided p-value of the AUROC of ``s`` for labels ``y`` against labels shuffled at random
    (``lower``: of an AUROC this low or lower), over :func:`null_aurocs` (or ``null`` given)."""
    observed = auroc(y, s)
    if null is None:
        null = null_aurocs(y, s, max_exact, draws)
    if lower:
        return float((null <= observed + 1e-12).mean())
    return float((null >= observed - 1e-12).mean())


def bag_check(
    scores: np.ndarray, bags: np.ndarray, bag_labels: np.ndarray, top_fraction: float = 0.05
) -> dict[str, Any]:
    """The check as the bundle records it: bag AUROC of the pooled scores and a status
    (``ok``, ``weak`` or ``failed``) with a one-line message."""
    names, pooled = pooled_bag_scores(scores, bags, top_fraction)
    label_of = dict(
        zip(np.asarray(bags).astype(str), np.asarray(bag_labels).astype(int), strict=True)
    )
    y = np.array([label_of[n] for n in names])
    value = auroc(y, pooled)
    null = null_aurocs(y, pooled)
    p = permutation_p(y, pooled, null=null)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    p_low = permutation_p(y, pooled, lower=True, null=null)
    if value < 0.5 and p_low <= PASS_LEVEL:
        status = "failed"
        message = (
            f"bag check FAILED: pooled instance scores rank the {n_pos} positive training bags "
            f"below the {n_neg} negative ones (bag AUROC {value:.2f}, p = {p_low:.2g} under "
            "random bag labels); the ranking is inverted: do not use this model"
        )
    elif value <= 0.5:
        status = "weak"
        message = (
            f"bag check weak: pooled instance scores rank the {n_pos} positive training bags no "
            f"higher than the {n_neg} negative ones (bag AUROC {value:.2f}, as random bag labels "
            "often give): the instance ranking is unreliable"
        )
    elif p > PASS_LEVEL:
        status = "weak"
        message = (
            f"bag check weak: bag AUROC {value:.2f} on the training bags ({n_pos} positive, "
            f"{n_neg} negative) is within what random bag labels give (p = {p:.2g} > "
            f"{PASS_LEVEL}): the instance ranking is unreliable"
        )
    else:
        status = "ok"
        message = (
            f"bag check ok: bag AUROC {value:.2f} ({n_pos} positive, {n_neg} negative bags; "
            f"p = {p:.2g})"
        )
    return {
        "bag_auroc": round(value, 4),
        "p_value": round(p, 6),
        "status": status,
        "message": message,
        "pooling": f"mean of each bag's top {top_fraction:.0%} instance scores",
        "n_positive_bags": n_pos,
        "n_negative_bags": n_neg,
        "pooled": {str(n): round(float(p), 6) for n, p in zip(names, pooled, strict=True)},
    }
