"""Softmax head (FS-SIL, WS-SIL): the probability of the abnormal class from two logits.

The graph emits the classifier's logits ``(N, 2)`` (normal, abnormal); the score is
``softmax(logits)[:, 1]``, computed stably in float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cyto.runtime import kernels
from cyto.runtime.heads.base import Head
from cyto.runtime.heads.registry import register_head


@kernels.KeptKernel
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


@register_head
class SoftmaxHead(Head):
    name = "classifier"
    output = "logits"
    graph_output = "logits (N, 2)"
    summary = "softmax probability of the abnormal class"

    @classmethod
    def from_bundle(cls, spec, arrays):
        return cls()

    def finish(self, out: np.ndarray) -> np.ndarray:
        return softmax_abnormal(np.ascontiguousarray(out, np.float32))

    def reference(self, out: np.ndarray) -> np.ndarray:
        return softmax_abnormal_ref(out)

    def torch_finish(self, out):
        import torch

        return torch.softmax(out.to(torch.float64), dim=1)[:, 1]  # float64, as the numba finish
