"""The networks that exported graphs compute: uint8 NHWC patches in, the graph output out.

Each module here is what ``cyto export`` writes to ONNX, what the PyTorch backend runs and what
training evaluates, so every backend starts from one definition. The graph ends where the scorer
head (:mod:`cyto.runtime.heads`) takes over:

| head       | module            | graph output                       |
|------------|-------------------|------------------------------------|
| dsvdd      | DSVDDEmbeddings   | embeddings (seeds, views, N, d)    |
| ocsvm      | EmbeddingModel    | embeddings (N, d)                  |
| classifier | ClassifierLogits  | logits (N, 2)                      |
| mil        | InstanceLogit     | instance logits (N,)               |
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cyto.models.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess

TTA_VIEWS = ("orig", "hflip", "rot+10", "rot-10")


def rotation_grid(size: int, degrees: float) -> torch.Tensor:
    """Sampling grid (1, size, size, 2) that rotates a square image about its centre."""
    a = math.radians(degrees)
    theta = torch.tensor(
        [[[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]], dtype=torch.float32
    )
    return F.affine_grid(theta, [1, 3, size, size], align_corners=False)


def view_degrees(view: str) -> float | None:
    """Rotation angle of a view name (``rot+10`` -> 10.0), None for the others."""
    if view in ("orig", "hflip"):
        return None
    if view.startswith("rot"):
        return float(view[3:])
    raise ValueError(f"unknown test-time view {view!r}; known: {', '.join(TTA_VIEWS)}")


class DSVDDEmbeddings(nn.Module):
    """Deep SVDD: every seed's encoder on every test-time view -> (seeds, views, N, d).

    Views are made in the graph: a flip, and rotations by fixed sampling grids (precomputed for
    the input size), so the exported ONNX graph makes them too.
    """

    def __init__(
        self,
        encoders: Sequence[nn.Module],
        input_size: int,
        views: Sequence[str] = ("orig",),
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    ) -> None:
        super().__init__()
        self.pre = Preprocess(input_size, mean, std)
        self.encoders = nn.ModuleList(encoders)
        self.views = tuple(views)
        for i, v in enumerate(self.views):
            deg = view_degrees(v)
            if deg is not None:
                self.register_buffer(f"grid{i}", rotation_grid(input_size, deg))

    def _view(self, x: torch.Tensor, i: int) -> torch.Tensor:
        v = self.views[i]
        if v == "orig":
            return x
        if v == "hflip":
            return torch.flip(x, dims=[3])
        grid = getattr(self, f"grid{i}").expand(x.shape[0], -1, -1, -1)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre(x)
        viewed = [self._view(x, i) for i in range(len(self.views))]
        return torch.stack([torch.stack([enc(v) for v in viewed]) for enc in self.encoders])


class ClassifierLogits(nn.Module):
    """FS-SIL / WS-SIL: the classifier's two logits (normal, abnormal)."""

    def __init__(self, net: nn.Module, input_size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        super().__init__()
        self.pre = Preprocess(input_size, mean, std)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.pre(x))


class ClassifierFeatures(nn.Module):
    """A classifier's input to its last linear layer (its 'embedding')."""

    def __init__(self, net: nn.Module, input_size: int) -> None:
        super().__init__()
        self.pre = Preprocess(input_size)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        hook = self.net.fc.register_forward_hook(lambda m, i, o: captured.append(i[0]))
        try:
            self.net(self.pre(x))
        finally:
            hook.remove()
        return captured[0]


class EmbeddingModel(nn.Module):
    """Preprocess + encoder; optionally L2-normalized (DROC feeds unit vectors to the OC-SVM)."""

    def __init__(
        self,
        encoder: nn.Module,
        input_size: int,
        normalize: bool = False,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    ) -> None:
        super().__init__()
        self.pre = Preprocess(input_size, mean, std)
        self.encoder = encoder
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(self.pre(x))
        return F.normalize(z, dim=1) if self.normalize else z


class InstanceLogit(nn.Module):
    """ItS2CLR: the MIL aggregator's instance logit on the encoder's unit-normalized embedding."""

    def __init__(
        self, encoder: nn.Module, head: nn.Linear, input_size: int, mean=IMAGENET_MEAN, std=None
    ) -> None:
        super().__init__()
        self.embed = EmbeddingModel(encoder, input_size, True, mean, std or IMAGENET_STD)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x)).squeeze(1)


class ScoreModule(nn.Module):
    """A graph followed by a scorer head's torch form (:mod:`cyto.runtime.heads`): uint8 NHWC in,
    one score per cell out, on whatever device the module is on. Training evaluates this."""

    def __init__(self, graph: nn.Module, head) -> None:
        super().__init__()
        self.graph = graph
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.torch_finish(self.graph(x))


@torch.no_grad()
def run_batched(
    module: nn.Module, images: np.ndarray, batch_size: int = 64, device: torch.device | str = "cpu"
) -> np.ndarray:
    """Apply a uint8-input module in batches on ``device``; returns a numpy array (float32)."""
    module.to(device).eval()
    outs = []
    for i in range(0, len(images), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(images[i : i + batch_size])).to(device)
        outs.append(module(x).float().cpu().numpy())
    if not outs:
        return np.empty((0,), dtype=np.float32)
    return np.concatenate(outs)
