"""Logit head (ItS2CLR): the MIL aggregator's instance logit is the score.

The graph ends in the instance classifier on the (unit-normalized) embedding and emits one logit
per cell ``(N,)``; the head only widens it to float64.
"""

from __future__ import annotations

import numpy as np

from cyto.runtime.heads.base import Head
from cyto.runtime.heads.registry import register_head


@register_head
class LogitHead(Head):
    name = "mil"
    output = "scores"
    graph_output = "instance logits (N,)"
    summary = "the logit itself"

    @classmethod
    def from_bundle(cls, spec, arrays):
        return cls()

    def finish(self, out: np.ndarray) -> np.ndarray:
        return np.asarray(out, dtype=np.float64).reshape(-1)

    def reference(self, out: np.ndarray) -> np.ndarray:
        return np.asarray(out, dtype=np.float64).reshape(-1)

    def torch_finish(self, out):
        return out.reshape(-1)
