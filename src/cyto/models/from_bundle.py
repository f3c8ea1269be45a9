"""Rebuild a PyTorch scorer from a verified bundle (no training code needed).

Scorer kinds are looked up in a table, so adding a method means adding one builder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from cyto.bundle import Bundle, load_bundle
from cyto.errors import BundleError
from cyto.models.backbones import build_backbone
from cyto.models.scoring import (
    ClassifierFeatures,
    ClassifierScorer,
    DSVDDScorer,
    EmbeddingModel,
    InstanceMILScorer,
    ocsvm_decision,
    run_batched,
)


@dataclass
class TorchScorer:
    """``score(images)`` for uint8 (N, H, W, 3) patches; higher = more abnormal."""

    bundle: Bundle
    module: nn.Module  # uint8 -> score, or uint8 -> embedding for "ocsvm"
    embedder: nn.Module
    device: torch.device
    post: Callable[[np.ndarray], np.ndarray] | None = None

    def score(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        out = run_batched(self.module, images, batch_size, self.device).astype(np.float64)
        return self.post(out) if self.post is not None else out

    def embed(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        return run_batched(self.embedder, images, batch_size, self.device)


def _net(manifest: dict, state: dict, out_dim: int | None = None) -> nn.Module:
    net = build_backbone(
        manifest["backbone"],
        out_dim or int(manifest["embedding_dim"]),
        bias=bool(manifest.get("bias", True)),
    )
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise BundleError(f"weights do not fit a {manifest['backbone']} backbone: {exc}") from exc
    return net.eval()


def _dsvdd(b: Bundle, dev: torch.device) -> TorchScorer:
    m = b.manifest
    encoders = [_net(m, b.weights[f"encoder-seed{s}"]) for s in range(len(m["seeds"]))]
    centres = torch.from_numpy(b.scorer["centres"])
    mod = DSVDDScorer(encoders, centres, m["input_size"], m["tta_views"], m["tta_lambda"])
    return TorchScorer(b, mod.to(dev), EmbeddingModel(encoders[0], m["input_size"]).to(dev), dev)


def _classifier(b: Bundle, dev: torch.device) -> TorchScorer:
    net = _net(b.manifest, b.weights["net"], out_dim=2)
    size = b.manifest["input_size"]
    return TorchScorer(
        b, ClassifierScorer(net, size).to(dev), ClassifierFeatures(net, size).to(dev), dev
    )


def _ocsvm(b: Bundle, dev: torch.device) -> TorchScorer:
    m = b.manifest
    emb = EmbeddingModel(
        _net(m, b.weights["encoder"]), m["input_size"], normalize=bool(m["embedding_normalized"])
    ).to(dev)
    s = b.scorer

    def post(feats: np.ndarray) -> np.ndarray:
        return -ocsvm_decision(
            feats, s["support_vectors"], s["dual_coef"], float(s["gamma"]), float(s["rho"])
        )

    return TorchScorer(b, emb, emb, dev, post)


def _mil(b: Bundle, dev: torch.device) -> TorchScorer:
    m = b.manifest
    enc = _net(m, b.weights["encoder"])
    head = nn.Linear(int(m["embedding_dim"]), 1)
    agg = b.weights["aggregator"]
    head.load_state_dict({"weight": agg["instance.weight"], "bias": agg["instance.bias"]})
    mod = InstanceMILScorer(enc, head, m["input_size"]).to(dev)
    return TorchScorer(b, mod, mod.embed, dev)


BUILDERS: dict[str, Callable[[Bundle, torch.device], TorchScorer]] = {
    "dsvdd": _dsvdd,
    "classifier": _classifier,
    "ocsvm": _ocsvm,
    "mil": _mil,
}


def load_scorer(path: Path | Bundle, device: torch.device | str = "cpu") -> TorchScorer:
    bundle = path if isinstance(path, Bundle) else load_bundle(Path(path))
    kind = bundle.manifest.get("scorer_kind")
    if kind not in BUILDERS:
        raise BundleError(
            f"{bundle.path}: unknown scorer kind {kind!r}; this cyto knows "
            f"{', '.join(BUILDERS)} (upgrade cyto?)"
        )
    return BUILDERS[kind](bundle, torch.device(device))
