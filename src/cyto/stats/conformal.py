"""Error control for a slide's scores, from the scores of slide-negative (normal) slides.

Everything here is plain numpy/scipy on score arrays; :mod:`cyto.stats.calibrate` builds the
calibration from score tables and applies it to a scored slide.

- **Conformal p-value** of a cell with score ``s`` against ``n`` calibration scores ``c``:
  ``p = (1 + #{c >= s}) / (n + 1)``. Ties count against the cell (a calibration score equal to
  ``s`` is "at least as abnormal"), so p is conservative when scores tie. If the slide's normal
  cells and the calibration cells are exchangeable, ``P(p <= u) <= u`` for a normal cell.
- **Benjamini-Hochberg** on those p-values flags a set of cells whose expected share of normal
  cells is at most ``alpha`` (conformal p-values are positively dependent, PRDS, so BH holds:
  Bates et al., *Testing for outliers with conformal p-values*, Ann. Stat. 2023). The adaptive
  variant divides ``alpha`` by Storey's estimate of the null proportion ``pi0``.
- **Calibration-conditional p-values** (optional, ``confidence`` = 1 - delta): the guarantee
  above holds on average over calibration sets; one lab's calibration can sit anywhere in that
  average (on the synthetic cohorts of ``benchmarks/burden/burden_resample.py``, 10 calibration
  slides of 300 cells gave an FDR between 0.02 and 0.19 from draw to draw at alpha 0.1, mean
  0.09).
  With probability ``1 - delta`` over the calibration, every order statistic of the calibration
  scores' true tail probabilities lies inside the generalized Simes band (Sarkar 2008; Bates et
  al. 2023, section 3, with ``k = n/2``), so ``1 - a_i`` bounds the normal tail above a score
  with ``i`` calibration scores below it, simultaneously for all scores. Given the calibration,
  the cells' p-values are then valid and independent, and BH on them keeps the FDR at most
  alpha for this calibration, with that probability. Cost: p-values about ``(4.6 + 1.4 j) / n``
  instead of ``(1 + j) / n`` (``j`` calibration scores at or above), so fewer cells are flagged.
- **Burden**: the number of cells above the normal ``q``-quantile ``t``, less what normal cells
  put there, over ``1 - r`` (``r`` = the normal exceedance rate at ``t``). Its interval adds
  three variances: binomial noise of this slide's normal cells, the spread of ``r`` between
  normal slides (method of moments over the calibration slides, ``tau^2``), and the error of ``r``
  estimated from the calibration. What it counts is the abnormal cells that score above ``t``;
  abnormal cells that look normal to the model are not counted, so for a weak model it is a lower
  bound on the true burden.
- **Slide test**: "this slide holds more cells above ``t`` than normal slides": a beta-binomial
  upper tail, the beta carrying ``tau^2`` and the estimation error of ``r``.
- **Per-slide normalization** (``median``, the default): every slide's scores, the calibration
  slides' included, are centred on their own median before any of the above. Normal slides
  differ (stain, thickness, scanner focus) and a one-class score moves with them; a few percent
  of abnormal cells hardly move a median. ``median-iqr`` also divides by the slide's
  interquartile range (it loses the tail when scores are heavy-tailed: a slide whose IQR is
  tiny blows its few high scores up); ``none`` uses the raw scores. On the synthetic cohorts of
  ``benchmarks/burden/burden_fdr.py`` (each slide its own stain) raw scores broke the FDR (0.21 at
  alpha 0.1 for Deep SVDD), ``median-iqr`` kept it but lost almost all power; ``median`` was
  chosen on the development cohort by the rule stated there.
- **Bulk check**: unless ``none``, whether the slide's median and IQR lie where the
  calibration slides' do (in calibration IQRs, and as a log ratio); with ``none``, where its 10th
  and 25th percentiles fall among the calibration scores. Abnormal cells hardly move either; a
  stain or scanner the calibration never saw does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NORMALIZATIONS = ("median", "median-iqr", "none")
# chosen on the development cohort of benchmarks/burden/burden_fdr.py
DEFAULT_NORMALIZATION = "median"
TIES = "a calibration score equal to the cell's counts as at least as abnormal (conservative)"
BULK_QUANTILES = (0.1, 0.25)  # the slide percentiles the bulk check places among the normals
BULK_TOLERANCE_MIN = 0.06  # at least this far off before a slide is called mismatched


def location_scale(scores: np.ndarray) -> tuple[float, float]:
    """(median, interquartile range) of a slide's scores; the IQR at least 1e-9 of the median's
    size so that a slide of identical scores does not divide by zero."""
    s = np.asarray(scores, dtype=np.float64)
    if len(s) == 0:
        return 0.0, 1.0
    q25, med, q75 = np.quantile(s, [0.25, 0.5, 0.75])
    return float(med), float(max(q75 - q25, 1e-9 * max(abs(med), 1.0)))


def normalize(scores: np.ndarray, how: str) -> tuple[np.ndarray, float, float]:
    """(normalized scores, location, scale) of one slide (see the module docstring)."""
    s = np.asarray(scores, dtype=np.float64)
    if how == "none":
        return s, 0.0, 1.0
    loc, scale = location_scale(s)
    if how == "median":
        return s - loc, loc, 1.0  # location only: a scale from the IQR can be tiny (see above)
    return (s - loc) / scale, loc, scale


def p_values(scores: np.ndarray, calibration_sorted: np.ndarray) -> np.ndarray:
    """Conformal p-values of ``scores`` against the sorted calibration scores (see :data:`TIES`)."""
    c = np.asarray(calibration_sorted, dtype=np.float64)
    n = len(c)
    at_least = n - np.searchsorted(c, np.asarray(scores, dtype=np.float64), side="left")
    return (1.0 + at_least) / (n + 1.0)


def simes_band(n: int, delta: float) -> np.ndarray:
    """``a_1..a_n``: with probability at least ``1 - delta``, ``n`` iid uniforms sorted satisfy
    ``U_(i) >= a_i`` for every ``i`` at once. Generalized Simes with ``k = ceil(n / 2)``:
    ``a_i = (delta * C(i, k) / C(n, k)) ** (1 / k)`` for ``i >= k``, else 0."""
    from scipy.special import gammaln

    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be between 0 and 1, got {delta}")
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    k = (n + 1) // 2
    i = np.arange(k, n + 1, dtype=np.float64)
    log_a = (
        np.log(delta) + gammaln(i + 1) - gammaln(i - k + 1) - (gammaln(n + 1) - gammaln(n - k + 1))
    ) / k
    out[k - 1 :] = np.exp(log_a)
    return out


def conditional_p_values(
    scores: np.ndarray, calibration_sorted: np.ndarray, confidence: float
) -> np.ndarray:
    """Calibration-conditional conformal p-values (see the module docstring): valid for this
    calibration with probability ``confidence``; never below :func:`p_values`."""
    c = np.asarray(calibration_sorted, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    n = len(c)
    below = np.searchsorted(c, s, side="left")  # calibration scores strictly below (ties: above)
    a = simes_band(n, 1.0 - confidence)
    p = np.ones(len(s), dtype=np.float64)
    has = below >= 1
    p[has] = 1.0 - a[below[has] - 1]
    return np.maximum(p, p_values(s, c))


def smallest_p(n: int, confidence: float | None = None) -> float:
    """The smallest p-value ``n`` calibration scores can give (conditional with ``confidence``)."""
    if confidence is None:
        return 1.0 / (n + 1.0)
    return float(1.0 - simes_band(n, 1.0 - confidence)[-1]) if n else 1.0


def bh(p: np.ndarray, alpha: float) -> np.ndarray:
    """Benjamini-Hochberg: the boolean mask of rejected hypotheses at level ``alpha``."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    if m == 0:
        return np.zeros(0, dtype=bool)
    ordered = np.sort(p)
    below = np.flatnonzero(ordered <= alpha * np.arange(1, m + 1) / m)
    if len(below) == 0:
        return np.zeros(m, dtype=bool)
    return p <= ordered[below[-1]]


def storey_pi0(p: np.ndarray, lam: float = 0.5) -> float:
    """Storey's estimate of the share of true nulls, ``(1 + #{p > lam}) / (m (1 - lam))``, at
    most 1 (the ``+1`` is the finite-sample correction that keeps adaptive BH valid)."""
    m = len(p)
    if m == 0:
        return 1.0
    return float(min(1.0, (1.0 + np.sum(np.asarray(p) > lam)) / (m * (1.0 - lam))))


def adaptive_bh(p: np.ndarray, alpha: float, lam: float = 0.5) -> tuple[np.ndarray, float]:
    """BH at ``alpha / pi0`` (Storey's adaptive procedure); returns (mask, pi0)."""
    pi0 = storey_pi0(p, lam)
    return bh(p, alpha / pi0), pi0


@dataclass(frozen=True)
class NormalRate:
    """How often normal cells score above a threshold ``t``: pooled over the calibration
    slides (``rate``), its between-slide variance (``tau2``) and the variance of ``rate`` as an
    estimate (``rate_var``)."""

    threshold: float
    quantile: float
    rate: float
    tau2: float
    rate_var: float
    slides: int

    @property
    def total_var(self) -> float:
        """Variance of a new normal slide's true rate around ``rate`` (spread + estimate)."""
        return self.tau2 + self.rate_var


def normal_rate(
    calibration_sorted: np.ndarray, slide_index: np.ndarray, quantile: float
) -> NormalRate:
    """The exceedance rate at the calibration's ``quantile`` and how it varies between the
    calibration slides (``slide_index`` gives each calibration score's slide)."""
    c = np.asarray(calibration_sorted, dtype=np.float64)
    n = len(c)
    t = float(np.quantile(c, quantile))
    above = c > t
    rate = float(above.mean())
    _, per_slide = np.unique(slide_index, return_inverse=True)
    sizes = np.bincount(per_slide).astype(np.float64)
    rates = np.bincount(per_slide, weights=above) / sizes
    j = len(sizes)
    total = float(np.sum(sizes))
    if j >= 2:
        # moments (DerSimonian-Laird): E[Q] = (J - 1) r (1 - r) + tau^2 (N - sum n_j^2 / N)
        q_stat = float(np.sum(sizes * (rates - rate) ** 2))
        tau2 = max(
            0.0, (q_stat - (j - 1) * rate * (1.0 - rate)) / (total - np.sum(sizes**2) / total)
        )
    else:
        tau2 = 0.0
    # the pooled rate weights slides by their cells: its variance as an estimate
    rate_var = rate * (1.0 - rate) / max(n, 1) + tau2 * float(np.sum(sizes**2)) / total**2
    return NormalRate(t, quantile, rate, tau2, rate_var, j)


INTERVALS = ("beta-binomial", "normal")


def normal_count(n: int, rate: NormalRate):
    """The distribution of how many of ``n`` normal cells score above the threshold on a new
    slide: beta-binomial (binomial when the rate has no spread), the beta centred on the normal
    rate with the variance between slides plus the estimation error (a frozen scipy law)."""
    from scipy.stats import betabinom, binom

    r = min(max(rate.rate, 0.5 / (n + 1)), 1.0 - 1e-9)
    v = rate.total_var
    if v <= 0 or v >= r * (1 - r):
        return binom(n, r)
    k = r * (1.0 - r) / v - 1.0  # a + b of the beta with mean r and variance v
    return betabinom(n, r * k, (1.0 - r) * k)


def burden(
    scores: np.ndarray, rate: NormalRate, level: float = 0.95, interval: str = "beta-binomial"
) -> dict:
    """Abnormal cells scoring above ``rate.threshold``: estimate and ``level`` interval.

    ``beta-binomial``: the interval's ends are the cells above the threshold less the upper and
    lower ``level`` quantiles of :func:`normal_count` (skewed, as counts of a few cells are);
    ``normal``: estimate +- z standard errors. Both are clipped to [0, cells above]."""
    from scipy.stats import norm

    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(INTERVALS)}, got {interval!r}")
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    above = int(np.sum(s > rate.threshold))
    r = rate.rate
    expected = n * r
    est = (above - expected) / (1.0 - r)
    tail = (1.0 - level) / 2.0
    if interval == "normal" or n == 0:
        var_normal = n * r * (1.0 - r) + n**2 * rate.total_var
        se = float(np.sqrt(var_normal)) / (1.0 - r)
        z = float(norm.ppf(1.0 - tail))
        lo, hi = est - z * se, est + z * se
    else:
        law = normal_count(n, rate)
        lo = (above - float(law.ppf(1.0 - tail))) / (1.0 - r)
        hi = (above - float(law.ppf(tail))) / (1.0 - r)
    # the abnormal cells above the threshold are some of the cells above it: no bound exceeds
    # their count (the 1 / (1 - r) correction put one cell above at [0, 1.01], round 67, 13),
    # and the interval holds its estimate (a count's quantiles are whole cells)
    est_c = min(float(above), max(0.0, est))
    lo, hi = min(est_c, max(0.0, lo)), max(est_c, min(float(above), hi))
    return {
        "cells": n,
        "threshold": rate.threshold,
        "threshold_quantile_of_normals": rate.quantile,
        "cells_above": above,
        "expected_from_normal_cells": round(expected, 2),
        "abnormal_cells": round(est_c, 2),
        "abnormal_cells_interval": [round(lo, 2), round(hi, 2)],
        "abnormal_fraction": est_c / n if n else None,
        "abnormal_fraction_interval": [lo / n, hi / n] if n else None,
        "level": level,
        "interval": interval,
    }


def slide_p_value(scores: np.ndarray, rate: NormalRate) -> float:
    """P(a normal slide of this many cells has at least as many cells above the threshold),
    under :func:`normal_count`."""
    s = np.asarray(scores, dtype=np.float64)
    if len(s) == 0:
        return 1.0
    above = int(np.sum(s > rate.threshold))
    return float(normal_count(len(s), rate).sf(above - 1))


BULK_FLOORS = {"median_shift_iqr": 1.0, "iqr_log_ratio": float(np.log(1.5))}


def bulk_deviations(scores: np.ndarray, parts: list[np.ndarray], how: str) -> dict[str, float]:
    """How far the bulk of a slide's raw scores sits from the calibration slides' (``parts``),
    each 0 for a slide scored just like them (see the module docstring)."""
    s = np.asarray(scores, dtype=np.float64)
    if len(s) == 0 or not parts:
        return {}
    if how == "none":
        c = np.sort(np.concatenate(parts))
        qs = np.quantile(s, BULK_QUANTILES)
        at = np.searchsorted(c, qs, side="right") / len(c)
        return {f"q{q}_position": float(a - q) for q, a in zip(BULK_QUANTILES, at, strict=True)}
    loc, scale = location_scale(s)
    ref = np.array([location_scale(p) for p in parts])
    return {
        "median_shift_iqr": float((loc - ref[:, 0].mean()) / ref[:, 1].mean()),
        "iqr_log_ratio": float(np.log(scale) - np.log(ref[:, 1]).mean()),
    }


def bulk_tolerance(loso_deviations: list[dict[str, float]]) -> dict[str, float]:
    """Three times the root-mean-square deviation of the calibration slides, each against the
    others, but at least a floor (0.06 for a percentile position, 1 IQR for the median, a
    factor 1.5 for the IQR)."""
    names = loso_deviations[0].keys() if loso_deviations else ()
    out = {}
    for name in names:
        dev = np.array([d[name] for d in loso_deviations])
        floor = BULK_FLOORS.get(name, BULK_TOLERANCE_MIN)
        out[name] = float(max(floor, 3.0 * np.sqrt(np.mean(dev**2))))
    return out


def tolerance_of(tolerance: dict[str, float], name: str) -> float:
    """The tolerance of bulk statistic ``name``: the calibration's, else its floor."""
    return tolerance.get(name, BULK_FLOORS.get(name, BULK_TOLERANCE_MIN))


def bulk_mismatch(deviations: dict[str, float], tolerance: dict[str, float]) -> list[str]:
    """The statistics further from 0 than their tolerance."""
    return [k for k, v in deviations.items() if abs(v) > tolerance_of(tolerance, k)]
