"""Nearest-negatives head (ItS2CLR): how unlike the cells of negative bags a cell is.

The graph emits the (unit-normalized) embeddings ``(N, d)``. The head standardizes them with the
negative cells' mean and spread (``shift``, ``scale``) and scores each cell by the mean Euclidean
distance to its ``k`` nearest reference cells: a seeded sample of the training cells of negative
bags, standardized the same way (``negatives``, ``(M, d)``). Every cell of a negative bag is
normal, so a cell far from all of them is what the bag labels can vouch is unusual.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cyto.runtime import kernels
from cyto.runtime.heads.base import Head
from cyto.runtime.heads.registry import register_head


@kernels.KeptKernel
@njit(cache=True, parallel=True)
def knn_scores(
    emb: np.ndarray, reference: np.ndarray, shift: np.ndarray, scale: np.ndarray, k: int
) -> np.ndarray:
    """``emb``: (N, d) float32; ``reference``: (M, d) float64, standardized. Returns (N,)
    float64: the mean distance to the ``k`` nearest reference rows."""
    n, d = emb.shape
    m = reference.shape[0]
    out = np.empty(n, dtype=np.float64)
    for i in prange(n):
        z = np.empty(d, dtype=np.float64)
        for j in range(d):
            z[j] = (np.float64(emb[i, j]) - shift[j]) / scale[j]
        best = np.full(k, np.inf)  # the k smallest squared distances, ascending
        for r in range(m):
            acc = 0.0
            for j in range(d):
                diff = z[j] - reference[r, j]
                acc += diff * diff
            if acc < best[k - 1]:
                p = k - 1
                while p > 0 and best[p - 1] > acc:
                    best[p] = best[p - 1]
                    p -= 1
                best[p] = acc
        total = 0.0
        for p in range(k):
            total += np.sqrt(best[p])
        out[i] = total / k
    return out


def knn_scores_ref(emb, reference, shift, scale, k: int) -> np.ndarray:
    z = (emb.astype(np.float64) - shift) / scale
    d2 = ((z[:, None, :] - reference.astype(np.float64)[None]) ** 2).sum(-1)
    return np.sqrt(np.sort(d2, axis=1)[:, :k]).mean(axis=1)


@register_head
class KnnHead(Head):
    name = "knn"
    output = "embeddings"
    arrays = ("negatives", "shift", "scale", "k")
    graph_output = "embeddings (N, d)"
    summary = "mean distance to the k nearest negative-bag cells (standardized)"

    def __init__(self, negatives, shift, scale, k: int) -> None:
        self.negatives = np.ascontiguousarray(negatives, dtype=np.float64)
        self.shift = np.ascontiguousarray(shift, dtype=np.float64).reshape(-1)
        self.scale = np.ascontiguousarray(scale, dtype=np.float64).reshape(-1)
        self.k = int(k)
        d = self.negatives.shape[1] if self.negatives.ndim == 2 else -1
        if d < 1 or self.shift.shape != (d,) or self.scale.shape != (d,):
            raise ValueError("negatives must be (M, d) with shift and scale of length d")
        if not 1 <= self.k <= len(self.negatives):
            raise ValueError(f"k must be in 1..{len(self.negatives)}, got {self.k}")

    @classmethod
    def from_bundle(cls, spec, arrays):
        cls.require(arrays)
        return cls(arrays["negatives"], arrays["shift"], arrays["scale"], int(arrays["k"][0]))

    def finish(self, out: np.ndarray) -> np.ndarray:
        emb = np.ascontiguousarray(out, np.float32)
        return knn_scores(emb, self.negatives, self.shift, self.scale, self.k)

    def reference(self, out: np.ndarray) -> np.ndarray:
        return knn_scores_ref(out, self.negatives, self.shift, self.scale, self.k)

    def torch_finish(self, out):
        import torch

        z = (out.to(torch.float64) - self._tensor("shift", out)) / self._tensor("scale", out)
        d = torch.cdist(z, self._tensor("negatives", out))
        return d.topk(self.k, dim=1, largest=False).values.mean(dim=1)

    def describe(self) -> str:
        m, d = self.negatives.shape
        return f"{super().describe()} ({m} negative-bag cells, d={d}, k={self.k})"
