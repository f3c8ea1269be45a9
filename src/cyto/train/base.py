"""The method contract (scikit-learn style): ``__init__`` stores the config, ``fit`` returns
``self``, learned state ends in ``_``, and ``embed``/``score`` on an unfitted method raise."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from cyto.errors import NotFittedError
from cyto.models.graphs import run_batched
from cyto.train.config import TrainConfig
from cyto.train.data import TrainData


class Method(ABC):
    """Base of the five methods. Subclasses set ``Config`` and ``scorer_kind``."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[TrainConfig]] = TrainConfig
    scorer_kind: ClassVar[str] = ""
    one_class: ClassVar[bool] = False  # learns from the normal images only
    instance_labels: ClassVar[bool] = True  # False: bag labels only; `cyto train` strips the rest

    def __init__(self, config: TrainConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()
        if not isinstance(self.config, self.Config):
            raise TypeError(f"{self.name} expects a {self.Config.__name__}")
        self.history_: dict[str, list[float]] = {}
        self.device_ = torch.device("cpu")

    # --- each method implements these ----------------------------------------------------------
    @abstractmethod
    def _fit(
        self, data: TrainData, ckpt_dir: Path | None, resume: bool, weights: Path | None
    ) -> None:
        """Learn from ``data``; set the fitted state (attributes ending in ``_``)."""

    @abstractmethod
    def _scorer(self) -> nn.Module:
        """uint8 NHWC -> score module (fitted)."""

    @abstractmethod
    def _embedder(self) -> nn.Module:
        """uint8 NHWC -> embedding module (fitted)."""

    @abstractmethod
    def export_state(self) -> tuple[dict[str, Any], dict[str, dict], dict[str, np.ndarray]]:
        """``(manifest fields, weights per file, scorer arrays)`` for the bundle."""

    # --- shared -------------------------------------------------------------------------------
    def fit(
        self,
        data: TrainData,
        device: torch.device | str = "cpu",
        ckpt_dir: Path | None = None,
        resume: bool = False,
        weights: Path | None = None,
    ) -> Method:
        self.device_ = torch.device(device)
        self.stain_ = None
        given = data  # score() normalizes what it is given: the bag check scores these
        if self.config.stain_norm != "none":
            from cyto.data.stain import normalize_images, reference

            # the method learns from normalized images; score() and the bundle's graph normalize
            # what they are given the same way
            self.stain_ = reference(data.images)
            data = dataclasses.replace(data, images=normalize_images(data.images, self.stain_))
        self._fit(data, ckpt_dir, resume, weights)
        self.fitted_ = True
        if not self.instance_labels and data.bags is not None and data.bag_labels is not None:
            from cyto.train.bagcheck import bag_check

            scores = self._training_scores(given.images)
            self.bag_check_ = bag_check(scores, data.bags, data.bag_labels)
        return self

    def _training_scores(self, images: np.ndarray) -> np.ndarray:
        """The scores of the training images, for the bag check (a method whose score remembers
        its training cells overrides this to leave each one out)."""
        return self.score(images)

    def _check_fitted(self) -> None:
        if not getattr(self, "fitted_", False):
            raise NotFittedError(f"{self.name} is not fitted yet: call fit() first")

    def score(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        """Abnormality of each uint8 (N, H, W, 3) image; higher = more abnormal."""
        self._check_fitted()
        scorer = self._stained(self._scorer())
        return run_batched(scorer, images, batch_size, self.device_).astype(np.float64)

    def embed(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        self._check_fitted()
        return run_batched(self._stained(self._embedder()), images, batch_size, self.device_)

    def _stained(self, module: nn.Module) -> nn.Module:
        """``module`` preceded by the stain normalization the method was trained with."""
        if getattr(self, "stain_", None) is None:
            return module
        from cyto.data.stain import StainNormalized
        from cyto.data.stain import module as stain_module

        return StainNormalized(module, stain_module(self.stain_)).to(self.device_)

    def n_used(self, data: TrainData) -> int:
        """How many of ``data``'s images the method learns from."""
        return len(data.require_normals()) if self.one_class else len(data)

    def used_words(self, data: TrainData) -> str:
        """What the method learned from, in words, for the manifest."""
        return "normal images only" if self.one_class else "all images"

    def bundle_parts(
        self, data: TrainData
    ) -> tuple[dict[str, Any], dict[str, dict], dict[str, np.ndarray]]:
        """``(manifest, weights, scorer arrays)``, ready for :func:`cyto.bundle.save_bundle`."""
        manifest = self.base_manifest(data)
        extra, tensors, scorer = self.export_state()
        manifest.update(extra)
        return manifest, tensors, scorer

    def base_manifest(self, data: TrainData) -> dict[str, Any]:
        cfg = self.config
        return {
            "method": self.name,
            "scorer_kind": self.scorer_kind,
            "backbone": cfg.backbone,
            "input_size": cfg.input_size,
            "input": "uint8 NHWC RGB, any size (resized inside the model)",
            "normalization": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
            "resize": "bilinear, align_corners=False",
            "config": cfg.to_dict(),
            "training_data": {
                "fingerprint": data.fingerprint,
                "n_images": len(data),
                "n_used": self.n_used(data),
                "used": self.used_words(data),
            },
            "history": self.history_,
            **({"bag_check": self.bag_check_} if hasattr(self, "bag_check_") else {}),
            **({"stain_normalization": self.stain_} if getattr(self, "stain_", None) else {}),
        }
