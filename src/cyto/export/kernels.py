"""Numba scoring kernels: pure functions over numpy arrays, each with a plain-numpy reference.

The exported graph computes embeddings (or logits); these kernels turn them into the final score
with the arrays stored in the bundle (``scorer.npz``): nothing is refit at scoring time.

* Deep SVDD: squared distance to each seed's centre over the views, the blend
  d0 + lambda * (max_k d_k - d0), then the mean over seeds.
* OC-SVM (RBF): -(sum_i a_i exp(-gamma ||x - sv_i||^2) - rho), via the ||x||^2 + ||sv||^2 - 2 x.sv
  expansion in float64, a GEMM per chunk of queries.
* Classifier: the softmax probability of the abnormal class, from the two logits.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def dsvdd_scores(emb: np.ndarray, centres: np.ndarray, lam: float) -> np.ndarray:
    """``emb``: (seeds, views, N, d) float32; ``centres``: (seeds, d). Returns (N,) float64."""
    s_n, v_n, n, d = emb.shape
    out = np.zeros(n, dtype=np.float64)
    for i in prange(n):
        total = 0.0
        for s in range(s_n):
            d0 = 0.0
            dmax = -1.0
            for v in range(v_n):
                acc = 0.0
                for j in range(d):
                    diff = np.float64(emb[s, v, i, j]) - np.float64(centres[s, j])
                    acc += diff * diff
                if v == 0:
                    d0 = acc
                if acc > dmax:
                    dmax = acc
            total += d0 + lam * (dmax - d0)
        out[i] = total / s_n
    return out


def dsvdd_scores_ref(emb: np.ndarray, centres: np.ndarray, lam: float) -> np.ndarray:
    d = ((emb.astype(np.float64) - centres.astype(np.float64)[:, None, None, :]) ** 2).sum(-1)
    per_seed = d[:, 0] + lam * (d.max(axis=1) - d[:, 0])
    return per_seed.mean(axis=0)


@njit(cache=True, parallel=True, fastmath=True)
def _rbf_finish(
    cross: np.ndarray,
    x_sq: np.ndarray,
    sv_sq: np.ndarray,
    coef: np.ndarray,
    gamma: float,
    rho: float,
) -> np.ndarray:
    """-(sum_j a_j exp(-gamma (|x|^2 + |sv_j|^2 - 2 x.sv_j)) - rho) from the GEMM's x.sv."""
    n, m = cross.shape
    out = np.empty(n, dtype=np.float64)
    for i in prange(n):
        acc = 0.0
        for j in range(m):
            v = x_sq[i] + sv_sq[j] - 2.0 * cross[i, j]
            v = max(v, 0.0)
            acc += coef[j] * np.exp(-gamma * v)
        out[i] = -(acc - rho)
    return out


def ocsvm_scores(
    x: np.ndarray, sv: np.ndarray, coef: np.ndarray, gamma: float, rho: float, chunk: int = 2048
) -> np.ndarray:
    """-decision_function of an RBF one-class SVM (higher = more abnormal), float64 throughout.

    Each chunk of queries is one BLAS GEMM (x . sv) followed by a parallel numba pass for the
    exponentials and the weighted sum.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    sv = np.ascontiguousarray(sv, dtype=np.float64)
    coef = np.ascontiguousarray(np.ravel(coef), dtype=np.float64)
    sv_sq = (sv * sv).sum(axis=1)
    out = np.empty(len(x), dtype=np.float64)
    for i in range(0, len(x), chunk):
        xb = x[i : i + chunk]
        out[i : i + chunk] = _rbf_finish(
            xb @ sv.T, (xb * xb).sum(axis=1), sv_sq, coef, float(gamma), float(rho)
        )
    return out


def ocsvm_scores_ref(x, sv, coef, gamma, rho) -> np.ndarray:
    x = np.asarray(x, np.float64)
    d2 = ((x[:, None, :] - np.asarray(sv, np.float64)[None, :, :]) ** 2).sum(-1)
    return -(np.exp(-gamma * d2) @ np.ravel(coef).astype(np.float64) - rho)


@njit(cache=True)
def softmax_abnormal(logits: np.ndarray) -> np.ndarray:
    """P(abnormal) from (N, 2) logits, numerically stable."""
    n = logits.shape[0]
    out = np.empty(n, dtype=np.float64)
    for i in range(n):
        a = np.float64(logits[i, 0])
        b = np.float64(logits[i, 1])
        m = max(a, b)
        ea, eb = np.exp(a - m), np.exp(b - m)
        out[i] = eb / (ea + eb)
    return out


def softmax_abnormal_ref(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e[:, 1] / e.sum(axis=1)
