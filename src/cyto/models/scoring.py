"""Scoring networks rebuilt from a bundle: uint8 patches in, one score per patch out.

These modules are what training evaluates, what ``cyto predict`` runs in PyTorch and what export
traces, so every backend starts from one definition. Higher scores are always more abnormal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cyto.models.backbones import build_backbone
from cyto.models.preprocess import Preprocess

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


def tta_blend(d: torch.Tensor, lam: float) -> torch.Tensor:
    """``d``: (views, N) distances with the original view first -> d0 + lam * (max_k d_k - d0)."""
    d0 = d[0]
    return d0 + lam * (d.max(dim=0).values - d0)


class DSVDDScorer(nn.Module):
    """Deep SVDD: squared distance to each seed's fixed centre, TTA blend, mean over seeds.

    Views are made in the graph: a flip, and rotations by fixed sampling grids (precomputed for
    the input size), so the exported ONNX graph makes them too.
    """

    def __init__(
        self,
        encoders: Sequence[nn.Module],
        centres: torch.Tensor,
        input_size: int,
        views: Sequence[str] = ("orig",),
        lam: float = 0.35,
    ) -> None:
        super().__init__()
        self.pre = Preprocess(input_size)
        self.encoders = nn.ModuleList(encoders)
        self.register_buffer("centres", centres.float())
        self.views = tuple(views)
        self.lam = float(lam)
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

    def embeddings(self, x: torch.Tensor) -> torch.Tensor:
        """(seeds, views, N, d) embeddings for uint8 NHWC input."""
        x = self.pre(x)
        viewed = [self._view(x, i) for i in range(len(self.views))]
        return torch.stack([torch.stack([enc(v) for v in viewed]) for enc in self.encoders])

    def distances(self, x: torch.Tensor) -> torch.Tensor:
        """(seeds, views, N) squared distances to each seed's centre."""
        e = self.embeddings(x)
        return ((e - self.centres[:, None, None, :]) ** 2).sum(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.distances(x)
        return torch.stack([tta_blend(d[s], self.lam) for s in range(d.shape[0])]).mean(dim=0)


class DSVDDEmbeddings(nn.Module):
    """What the exported graph computes for Deep SVDD: (seeds, views, N, d) embeddings."""

    def __init__(self, scorer: DSVDDScorer) -> None:
        super().__init__()
        self.scorer = scorer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scorer.embeddings(x)


class ClassifierScorer(nn.Module):
    """FS-SIL / WS-SIL: softmax probability of the abnormal class."""

    def __init__(self, net: nn.Module, input_size: int) -> None:
        super().__init__()
        self.pre = Preprocess(input_size)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(self.pre(x)), dim=1)[:, 1]


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

    def __init__(self, encoder: nn.Module, input_size: int, normalize: bool = False) -> None:
        super().__init__()
        self.pre = Preprocess(input_size)
        self.encoder = encoder
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(self.pre(x))
        return F.normalize(z, dim=1) if self.normalize else z


class InstanceMILScorer(nn.Module):
    """ItS2CLR: the MIL aggregator's instance logit on the encoder's embedding."""

    def __init__(self, encoder: nn.Module, head: nn.Linear, input_size: int) -> None:
        super().__init__()
        self.embed = EmbeddingModel(encoder, input_size, normalize=True)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x)).squeeze(1)


def ocsvm_decision(
    x: np.ndarray, sv: np.ndarray, coef: np.ndarray, gamma: float, rho: float, chunk: int = 4096
) -> np.ndarray:
    """``sum_i a_i exp(-gamma ||x - sv_i||^2) - rho`` in float64, via the GEMM expansion."""
    x = np.asarray(x, dtype=np.float64)
    sv = np.asarray(sv, dtype=np.float64)
    sv_sq = (sv**2).sum(1)
    out = np.empty(len(x))
    for i in range(0, len(x), chunk):
        xb = x[i : i + chunk]
        d2 = (xb**2).sum(1)[:, None] + sv_sq[None, :] - 2.0 * xb @ sv.T
        np.maximum(d2, 0.0, out=d2)
        out[i : i + chunk] = np.exp(-gamma * d2) @ np.asarray(coef, np.float64).ravel() - rho
    return out


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


def encoder_from_state(manifest: dict, state: dict[str, torch.Tensor], prefix: str) -> nn.Module:
    """Rebuild a backbone from the manifest and load the tensors under ``prefix``."""
    net = build_backbone(
        manifest["backbone"], int(manifest["embedding_dim"]), bias=bool(manifest.get("bias", True))
    )
    sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    net.load_state_dict(sub)
    return net
