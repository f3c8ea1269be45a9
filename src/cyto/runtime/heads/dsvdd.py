"""Deep SVDD head: squared distance to each seed's centre, test-time-view blend, seed mean.

From *Needle in a Haystack* (Chatterjee et al., 2024): the score of a cell is the squared
distance of its embedding to the hypersphere centre (Ruff et al., ICML 2018); with test-time views
the blend ``d0 + lambda * (max_k d_k - d0)`` of the original view's distance and the largest
one, averaged over the ensemble's seeds. The graph emits the embeddings
``(seeds, views, N, d)``; the centres are in ``scorer.npz``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cyto.runtime import kernels
from cyto.runtime.heads.base import Head
from cyto.runtime.heads.registry import register_head


@kernels.KeptKernel
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


def tta_blend(d, lam: float):
    """``d``: (views, N) distances (torch), original view first -> d0 + lam * (max_k d_k - d0)."""
    d0 = d[0]
    return d0 + lam * (d.max(dim=0).values - d0)


@register_head
class DSVDDHead(Head):
    name = "dsvdd"
    output = "embeddings"
    batch_axis = 2
    arrays = ("centres",)
    graph_output = "embeddings (seeds, views, N, d)"
    summary = "squared distance to each seed's centre, view blend, mean over seeds"

    def __init__(self, centres: np.ndarray, lam: float) -> None:
        self.centres = np.ascontiguousarray(centres, dtype=np.float32)
        if self.centres.ndim != 2:
            raise ValueError(f"centres must be (seeds, d), got shape {self.centres.shape}")
        self.lam = float(lam)

    @classmethod
    def from_bundle(cls, spec, arrays):
        cls.require(arrays)
        return cls(arrays["centres"], spec.tta_lambda)

    def finish(self, out: np.ndarray) -> np.ndarray:
        return dsvdd_scores(np.ascontiguousarray(out, np.float32), self.centres, self.lam)

    def reference(self, out: np.ndarray) -> np.ndarray:
        return dsvdd_scores_ref(out, self.centres, self.lam)

    def distances(self, out):
        """(seeds, views, N) squared distances of torch embeddings to each seed's centre."""
        c = self._tensor("centres", out).to(out.dtype)
        return ((out - c[:, None, None, :]) ** 2).sum(dim=-1)

    def torch_finish(self, out):
        import torch

        d = self.distances(out.to(torch.float64))  # float64, as the numba finish
        return torch.stack([tta_blend(d[s], self.lam) for s in range(d.shape[0])]).mean(dim=0)

    def describe(self) -> str:
        s, dim = self.centres.shape
        return f"{super().describe()} ({s} seed(s), d={dim}, lambda={self.lam:g})"
