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


def rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate a float NCHW batch about its centre (bilinear, border padding)."""
    a = math.radians(degrees)
    theta = torch.tensor(
        [[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]],
        dtype=x.dtype,
        device=x.device,
    ).expand(x.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def make_view(x: torch.Tensor, view: str) -> torch.Tensor:
    if view == "orig":
        return x
    if view == "hflip":
        return torch.flip(x, dims=[3])
    if view.startswith("rot"):
        return rotate(x, float(view[3:]))
    raise ValueError(f"unknown test-time view {view!r}; known: {', '.join(TTA_VIEWS)}")


def tta_blend(d: torch.Tensor, lam: float) -> torch.Tensor:
    """``d``: (views, N) distances with the original view first -> d0 + lam * (max_k d_k - d0)."""
    d0 = d[0]
    return d0 + lam * (d.max(dim=0).values - d0)


class DSVDDScorer(nn.Module):
    """Deep SVDD: squared distance to each seed's fixed centre, TTA blend, mean over seeds."""

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

    def distances(self, x: torch.Tensor) -> torch.Tensor:
        """(seeds, views, N) squared distances for uint8 NHWC input."""
        x = self.pre(x)
        viewed = [make_view(x, v) for v in self.views]
        out = []
        for s, enc in enumerate(self.encoders):
            per_view = [((enc(v) - self.centres[s]) ** 2).sum(dim=1) for v in viewed]
            out.append(torch.stack(per_view))
        return torch.stack(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.distances(x)
        return torch.stack([tta_blend(d[s], self.lam) for s in range(d.shape[0])]).mean(dim=0)


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
    """Apply a uint8-input module in batches; returns a numpy array (float32)."""
    module.eval()
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
