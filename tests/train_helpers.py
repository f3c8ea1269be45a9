"""Tiny training settings shared by the training tests."""

from __future__ import annotations

from cyto.train.config import resolve_config
from cyto.train.registry import get_method

TINY = {"backbone": "smallcnn", "input_size": 32, "batch_size": 16, "epochs": 4}
PER_METHOD = {
    "dsvdd": {
        "ae_epochs": 3,
        "epochs": 15,
        "n_seeds": 2,
        "embedding_dim": 16,
        "lr": 1e-3,
        "ae_lr": 1e-3,
    },
    "droc": {"embedding_dim": 32, "proj_dim": 16, "temperature": 0.5, "whiten": True},
    "its2clr": {
        "epochs": 12,
        "embedding_dim": 16,
        "warmup_epochs": 1,
        "refit_every": 2,
        "agg_epochs": 60,
        "agg_lr": 0.002,
        "lr": 0.05,
        "temperature": 0.1,
    },
    "fs-sil": {"lr": 0.01},
    "ws-sil": {"lr": 0.003, "epochs": 6},
}


def make(name: str, **extra):
    cls = get_method(name)
    return cls(resolve_config(cls.Config, overrides={**TINY, **PER_METHOD[name], **extra}))
