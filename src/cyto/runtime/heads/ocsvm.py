"""RBF one-class SVM head (DROC): the negated decision function of the fitted OC-SVM.

``-(sum_i a_i exp(-gamma ||x - sv_i||^2) - rho)`` over the support vectors ``sv_i``, dual
coefficients ``a_i``, ``gamma`` and ``rho`` stored in ``scorer.npz`` (nothing is refit at scoring
time). The graph emits the embeddings ``(N, d)`` the SVM was fitted on (whitened or unit-normalized
inside the graph when the model says so). Computed in float64 through the
``||x||^2 + ||sv||^2 - 2 x.sv`` expansion: one BLAS GEMM per chunk of cells, then a parallel numba
pass for the exponentials.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cyto.runtime import kernels
from cyto.runtime.heads.base import Head
from cyto.runtime.heads.registry import register_head


@kernels.KeptKernel
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
    """-decision_function of an RBF one-class SVM (higher = more abnormal), float64 throughout."""
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


@register_head
class OCSVMHead(Head):
    name = "ocsvm"
    output = "embeddings"
    batch_axis = 0
    arrays = ("support_vectors", "dual_coef", "gamma", "rho")
    graph_output = "embeddings (N, d)"
    summary = "negated RBF one-class SVM decision function"

    def __init__(self, support_vectors, dual_coef, gamma: float, rho: float) -> None:
        self.support_vectors = np.ascontiguousarray(support_vectors, dtype=np.float64)
        self.dual_coef = np.ascontiguousarray(np.ravel(dual_coef), dtype=np.float64)
        self.gamma = float(gamma)
        self.rho = float(rho)
        if len(self.dual_coef) != len(self.support_vectors):
            raise ValueError("one dual coefficient per support vector is needed")

    @classmethod
    def from_bundle(cls, spec, arrays):
        cls.require(arrays)
        return cls(arrays["support_vectors"], arrays["dual_coef"], arrays["gamma"], arrays["rho"])

    def _args(self):
        return self.support_vectors, self.dual_coef, self.gamma, self.rho

    def finish(self, out: np.ndarray) -> np.ndarray:
        return ocsvm_scores(out, *self._args())

    def reference(self, out: np.ndarray) -> np.ndarray:
        return ocsvm_scores_ref(out, *self._args())

    def torch_finish(self, out):
        import torch

        x = out.to(torch.float64)
        sv = self._tensor("support_vectors", x)
        d2 = (x * x).sum(1, keepdim=True) + (sv * sv).sum(1)[None, :] - 2.0 * x @ sv.T
        k = torch.exp(-self.gamma * d2.clamp_min(0.0))
        return -(k @ self._tensor("dual_coef", x) - self.rho)

    def describe(self) -> str:
        sv = self.support_vectors
        return f"{super().describe()} ({sv.shape[0]} support vectors, gamma={self.gamma:.4g})"
