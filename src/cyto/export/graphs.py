"""What each scorer kind exports: the network part of the score, uint8 NHWC in.

| kind       | graph output                                  | kernel after it          |
|------------|-----------------------------------------------|--------------------------|
| dsvdd      | embeddings (seeds, views, N, d)               | dsvdd_scores             |
| ocsvm      | unit-normalized embeddings (N, d)             | ocsvm_scores             |
| classifier | logits (N, 2)                                 | softmax_abnormal         |
| mil        | instance logits (N,)                          | none (the logit is it)   |
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from cyto.export import kernels
from cyto.models.from_bundle import TorchScorer
from cyto.models.scoring import DSVDDEmbeddings


class _Logits(nn.Module):
    def __init__(self, scorer: nn.Module) -> None:
        super().__init__()
        self.pre, self.net = scorer.pre, scorer.net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.pre(x))


GRAPHS: dict[str, Callable[[TorchScorer], nn.Module]] = {
    "dsvdd": lambda s: DSVDDEmbeddings(s.module),
    "ocsvm": lambda s: s.module,
    "classifier": lambda s: _Logits(s.module),
    "mil": lambda s: s.module,
}
OUTPUTS = {"dsvdd": "embeddings", "ocsvm": "embeddings", "classifier": "logits", "mil": "scores"}


def finish(kind: str, out: np.ndarray, manifest: dict, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Graph output -> final score (higher = more abnormal), with the bundle's arrays."""
    if kind == "dsvdd":
        return kernels.dsvdd_scores(
            np.ascontiguousarray(out, np.float32),
            np.ascontiguousarray(arrays["centres"], np.float32),
            float(manifest["tta_lambda"]),
        )
    if kind == "ocsvm":
        return kernels.ocsvm_scores(
            out,
            arrays["support_vectors"],
            arrays["dual_coef"],
            float(arrays["gamma"]),
            float(arrays["rho"]),
        )
    if kind == "classifier":
        return kernels.softmax_abnormal(np.ascontiguousarray(out, np.float32))
    if kind == "mil":
        return np.asarray(out, dtype=np.float64).reshape(-1)
    raise ValueError(f"unknown scorer kind {kind!r}")


def concat_outputs(kind: str, parts: list[np.ndarray]) -> np.ndarray:
    """Join per-batch graph outputs (the batch axis is 2 for Deep SVDD, 0 otherwise)."""
    return np.concatenate(parts, axis=2 if kind == "dsvdd" else 0)
