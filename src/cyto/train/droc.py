"""DROC: contrastive representation learning with distribution-augmented pseudo-abnormal
negatives, then a one-class SVM (Sohn et al., *Learning and Evaluating Representations for Deep
One-Class Classification*, ICLR 2021), with the recipe of *Needle in a Haystack* (Chatterjee et
al., 2024): ResNet18 encoder, 2-layer projection head of dimension 256, temperature 2, Adam lr
1e-3, batch 64, 100 epochs, weak views RGBShift + RandomResizedCrop 224, the strong set as the
pseudo-abnormal distribution D(x), and an RBF OneClassSVM(nu=0.1, gamma='auto') on the normal
training embeddings. Score = -decision_function.

The loss, for a batch of N images with projections z (two weak views, 2N unit vectors) and a
(one pseudo-abnormal view each, N unit vectors), similarity s = cosine / temperature:

    L_clr = mean_i -log( e^{s(i, p(i))} / sum_{k != i} e^{s(i, k)} )          (k over the 2N views)
    L_DA  = mean_i -log( e^{s(i, p(i))} / ( e^{s(i, p(i))} + sum_j e^{s(i, a_j)} ) )
    L     = L_clr + alpha * L_DA

so the pseudo-abnormal views enter the denominator as extra negatives of every anchor. All views
of a batch go through the encoder in one forward pass, so BatchNorm normalizes the pseudo-abnormal
views with the statistics of the whole batch, not with their own (which would erase the shift L_DA
is about). The OC-SVM sees the encoder's raw embeddings (the head is dropped): with
gamma='auto' (1 / dimension) the RBF kernel of unit vectors would be nearly constant.
``normalize_embeddings=True`` feeds unit vectors, as Sohn et al. do with a tuned gamma.

``whiten=True`` (the fast preset; not in the paper) whitens the embeddings of the normal training
cells before the OC-SVM, with the Ledoit-Wolf shrunk covariance: e = W (f - mu), W = C^{-1/2}. The
map is folded into the encoder's last linear layer, so the bundle, the ONNX graph and the scoring
kernels are those of any DROC model. Contrastive embeddings spend most of their variance on what
tells one normal cell from another (background, neighbours); what sets abnormal cells apart sits in
low-variance directions, which an RBF kernel on raw embeddings cannot see. Whitened embeddings also
have the unit scale that gamma='auto' assumes. On the bone-marrow cells it raised the held-out
AUROC of the same encoders from 0.555 +- 0.022 to 0.747 +- 0.018 (fast preset, three seeds) and
from 0.46 to 0.61 (the paper's recipe on an H100, one seed): benchmarks/science/droc_whitening.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cyto.data.augment import pseudo_abnormal_view
from cyto.errors import ConfigError
from cyto.flags import Range, setting
from cyto.models.backbones import build_backbone
from cyto.models.graphs import EmbeddingModel, ScoreModule, run_batched
from cyto.runtime.heads.ocsvm import OCSVMHead
from cyto.train.base import Method
from cyto.train.config import OneClassConfig
from cyto.train.data import TrainData, apply_view, epoch_batches, weak_pair
from cyto.train.loop import run_phase
from cyto.train.registry import register


@dataclass(frozen=True)
class DROCConfig(OneClassConfig):
    embedding_dim: int = 512
    proj_dim: int = 256
    temperature: float = 2.0
    alpha: float = 1.0
    lr: float = 1e-3
    epochs: int = 100
    nu: float = 0.1
    gamma: str = "auto"  # OC-SVM RBF width: "auto" (1/d), "scale" (1/(d var)) or a number
    strong_mode: str = "one"  # one member of the strong set per view, or "all" in sequence
    normalize_embeddings: bool = False  # unit vectors into the OC-SVM (Sohn et al.) or raw
    crop_min: float = 0.5  # RandomResizedCrop keeps at least this share of the area
    whiten: bool = False  # Ledoit-Wolf whitening of the embeddings before the OC-SVM (not in paper)

    RANGES = {
        "embedding_dim": Range(1),
        "proj_dim": Range(1),
        "temperature": Range(0, open_lo=True),
        "alpha": Range(0),
        "nu": Range(0, 1, open_lo=True),
        "crop_min": Range(0, 1, open_lo=True),
    }

    presets = {
        "fast": {
            "backbone": "smallcnn",
            "input_size": 64,
            "load_size": 80,
            "embedding_dim": 128,
            "proj_dim": 64,
            # 20 over 10: +0.041 +- 0.034 on the development splits (t 2.71, 5/5 seeds;
            # benchmarks/results/vm-2core/heldout/presets/preset_choice_droc_*)
            "epochs": 20,
            "temperature": 0.5,
            "whiten": True,
            # stain jitter: +0.038 +- 0.030 on the acquisition-order development blocks (t 2.83,
            # 4/5 seeds; benchmarks/results/vm-2core/heldout/order/)
            "stain_jitter": 0.2,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.temperature <= 0 or self.alpha < 0:
            raise ConfigError(f"{setting('temperature')} must be > 0 and alpha >= 0")
        if not 0 < self.nu <= 1:
            raise ConfigError(f"{setting('nu')} must be in (0, 1], got {self.nu}")
        if self.gamma not in ("auto", "scale"):
            try:
                if float(self.gamma) <= 0:
                    raise ValueError
            except ValueError as exc:
                raise ConfigError(
                    f"gamma must be 'auto', 'scale' or a positive number, got {self.gamma!r}"
                ) from exc
        if self.whiten and self.normalize_embeddings:
            raise ConfigError(
                "whiten and normalize_embeddings exclude each other: whitening is a linear map "
                "folded into the encoder, and unit-normalizing after it would undo it"
            )
        if self.strong_mode not in ("one", "all"):
            raise ConfigError(
                f"{setting('strong_mode')} must be 'one' or 'all', got {self.strong_mode!r}"
            )


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent loss (L_clr) over two views."""
    return droc_loss(z1, z2, None, temperature, 0.0)


def droc_loss(
    z1: torch.Tensor, z2: torch.Tensor, a: torch.Tensor | None, temperature: float, alpha: float
) -> torch.Tensor:
    """L_clr + alpha * L_DA on unnormalized projections (see the module docstring)."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z1.shape[0]
    sim = z @ z.T / temperature
    eye = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    sim = sim.masked_fill(eye, float("-inf"))
    pos_idx = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    pos = sim[torch.arange(2 * n, device=z.device), pos_idx]
    l_clr = (torch.logsumexp(sim, dim=1) - pos).mean()
    if a is None or alpha == 0:
        return l_clr
    neg_a = z @ F.normalize(a, dim=1).T / temperature  # (2N, N)
    l_da = (torch.logsumexp(torch.cat([pos[:, None], neg_a], dim=1), dim=1) - pos).mean()
    return l_clr + alpha * l_da


def fold_whitening(encoder: nn.Module, feats: np.ndarray) -> dict[str, float]:
    """Fold e = W (f - mu), W = C^{-1/2} of the Ledoit-Wolf covariance C of ``feats``, into
    ``encoder.fc`` in place; returns the shrinkage and the condition number of C."""
    from sklearn.covariance import LedoitWolf

    fc = getattr(encoder, "fc", None)
    if not isinstance(fc, nn.Linear) or fc.bias is None:
        raise ConfigError("whitening needs an encoder whose last layer is a Linear `fc` with bias")
    lw = LedoitWolf().fit(feats)
    evals, evecs = np.linalg.eigh(lw.covariance_)
    evals = np.maximum(evals, evals.max() * 1e-12)
    w = (evecs / np.sqrt(evals)) @ evecs.T
    with torch.no_grad():
        dev = fc.weight.device
        wt = torch.as_tensor(w, dtype=torch.float64, device=dev)
        mu = torch.as_tensor(lw.location_, dtype=torch.float64, device=dev)
        weight = wt @ fc.weight.double()
        bias = wt @ (fc.bias.double() - mu)
        fc.weight.copy_(weight.to(fc.weight.dtype))
        fc.bias.copy_(bias.to(fc.bias.dtype))
    return {"shrinkage": float(lw.shrinkage_), "condition": float(evals.max() / evals.min())}


class ProjectionHead(nn.Module):
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(inplace=True), nn.Linear(dim, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register("droc")
class DROC(Method):
    """Distribution-augmented contrastive learning + RBF one-class SVM."""

    Config = DROCConfig
    scorer_kind = "ocsvm"
    one_class = True

    def _fit(
        self, data: TrainData, ckpt_dir: Path | None, resume: bool, weights: Path | None
    ) -> None:
        cfg: DROCConfig = self.config  # type: ignore[assignment]
        normals = data.images[data.require_normals()]
        if len(normals) < 2:
            raise ConfigError("DROC needs at least 2 normal images per batch to contrast")
        torch.manual_seed(cfg.seed)
        enc = build_backbone(cfg.backbone, cfg.embedding_dim, weights=weights).to(self.device_)
        head = ProjectionHead(cfg.embedding_dim, cfg.proj_dim).to(self.device_)
        opt = torch.optim.Adam(
            [*enc.parameters(), *head.parameters()], lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        in_size = normals.shape[1]

        def batches(epoch: int):
            s = cfg.seed * 7919 + epoch
            v1, v2 = weak_pair(cfg.input_size, s, cfg.crop_min, cfg.stain_jitter)
            da = pseudo_abnormal_view(cfg.input_size, in_size, seed=s + 2, mode=cfg.strong_mode)
            for idx in epoch_batches(len(normals), cfg.batch_size, cfg.seed, epoch, drop_last=True):
                imgs = normals[idx]
                yield tuple(torch.from_numpy(apply_view(v, imgs)) for v in (v1, v2, da))

        def loss(x1, x2, xa):
            # one forward pass over all views: BatchNorm must not normalize the pseudo-abnormal
            # views with statistics of their own, which would erase the shift L_DA is about
            z1, z2, za = head(enc(torch.cat([x1, x2, xa]))).split(len(x1))
            return droc_loss(z1, z2, za, cfg.temperature, cfg.alpha)

        n_batches = max(len(normals) // cfg.batch_size, 1)
        self.history_["contrastive"] = run_phase(
            "contrastive",
            {"encoder": enc, "head": head},
            opt,
            cfg.epochs,
            batches,
            loss,
            n_batches,
            self.device_,
            cfg.seed,
            ckpt_dir=ckpt_dir,
            resume=resume,
            amp=cfg.amp,
        )
        self.encoder_ = enc.eval()
        self.fit_scorer(normals, whiten=cfg.whiten)

    def fit_scorer(self, normals: np.ndarray, whiten: bool) -> None:
        """Fit the OC-SVM on the embeddings of ``normals``, whitening them first if asked (the
        whitening is folded into the encoder, once: call it on a fresh copy to compare)."""
        from sklearn.svm import OneClassSVM

        cfg: DROCConfig = self.config  # type: ignore[assignment]
        self.whitening_ = None
        feats = run_batched(self._embedder(), normals, 256, self.device_).astype(np.float64)
        if whiten:
            self.whitening_ = fold_whitening(self.encoder_, feats)
            feats = run_batched(self._embedder(), normals, 256, self.device_).astype(np.float64)
        gamma = cfg.gamma if cfg.gamma in ("auto", "scale") else float(cfg.gamma)
        svm = OneClassSVM(kernel="rbf", nu=cfg.nu, gamma=gamma).fit(feats)
        self.svm_ = svm
        self.support_vectors_ = svm.support_vectors_.astype(np.float64)
        self.dual_coef_ = svm.dual_coef_.ravel().astype(np.float64)
        self.gamma_ = float(svm._gamma)
        self.rho_ = float(-svm.intercept_[0])

    def _embedder(self) -> nn.Module:
        return EmbeddingModel(
            self.encoder_, self.config.input_size, normalize=self.config.normalize_embeddings
        ).to(self.device_)

    def _head(self) -> OCSVMHead:
        return OCSVMHead(self.support_vectors_, self.dual_coef_, self.gamma_, self.rho_)

    def score(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        """The OC-SVM's float64 numba finish on the embeddings (what every backend runs)."""
        self._check_fitted()
        return self._head().finish(self.embed(images, batch_size))

    def _scorer(self) -> nn.Module:
        return ScoreModule(self._embedder(), self._head()).to(self.device_)

    def export_state(self, data: TrainData | None = None) -> tuple[dict[str, Any], dict, dict]:
        manifest = {
            "embedding_dim": self.config.embedding_dim,
            "bias": True,
            "embedding_normalized": self.config.normalize_embeddings,
            "embedding_whitened": self.whitening_,
            "ocsvm": {
                "kernel": "rbf",
                "nu": self.config.nu,
                "gamma": self.gamma_,
                "rho": self.rho_,
            },
        }
        scorer = {
            "support_vectors": self.support_vectors_,
            "dual_coef": self.dual_coef_,
            "gamma": np.float64(self.gamma_),
            "rho": np.float64(self.rho_),
        }
        return manifest, {"encoder": self.encoder_.state_dict()}, scorer
