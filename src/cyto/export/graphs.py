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

import torch
from torch import nn

from cyto.export.runtime import OUTPUTS, concat_outputs, finish  # noqa: F401 - re-exported
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
