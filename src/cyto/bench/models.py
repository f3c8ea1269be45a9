"""Bundles for throughput benchmarks: the paper's architectures with random weights.

Throughput depends on the architecture, the input size and the scorer (seeds x TTA views), not
on what the weights learned, so a benchmark can measure a paper-size model (ResNet18 at 224 px)
on any machine without training it first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def architecture_bundle(
    out: Path,
    backbone: str = "resnet18",
    input_size: int = 224,
    embedding_dim: int = 128,
    seeds: int = 1,
    export: bool = True,
    views: tuple[str, ...] = ("orig",),
) -> Path:
    """A Deep SVDD bundle (bias-free encoder, ``seeds`` seeds, test-time ``views``) with random
    weights, exported to ONNX when ``export``."""
    import torch

    from cyto.bundle import save_bundle
    from cyto.export.onnx import export_onnx
    from cyto.models.backbones import build_backbone

    weights = {}
    for s in range(seeds):
        torch.manual_seed(s)
        enc = build_backbone(backbone, embedding_dim, bias=False).eval()
        weights[f"encoder-seed{s}"] = enc.state_dict()
    manifest = {
        "method": "dsvdd",
        "scorer_kind": "dsvdd",
        "backbone": backbone,
        "input_size": input_size,
        "embedding_dim": embedding_dim,
        "bias": False,
        "seeds": list(range(seeds)),
        "tta_views": list(views),
        "tta_lambda": 0.35,
        "config": {"backbone": backbone, "input_size": input_size, "load_size": None},
        "training_data": {"note": "random weights: a throughput benchmark model"},
    }
    centres = np.full((seeds, embedding_dim), 0.1, dtype=np.float32)
    path = save_bundle(Path(out), manifest, weights, {"centres": centres}, overwrite=True)
    if export:
        export_onnx(path, example_size=input_size)
    return path


def classifier_bundle(
    out: Path, backbone: str = "resnet18", input_size: int = 224, export: bool = True
) -> Path:
    """An FS-SIL-shaped bundle (a two-class classifier, softmax head) with random weights."""
    import torch

    from cyto.bundle import save_bundle
    from cyto.export.onnx import export_onnx
    from cyto.models.backbones import build_backbone

    torch.manual_seed(0)
    net = build_backbone(backbone, 2, bias=True).eval()
    manifest = {
        "method": "fs-sil",
        "scorer_kind": "classifier",
        "backbone": backbone,
        "input_size": input_size,
        "embedding_dim": 2,
        "bias": True,
        "config": {"backbone": backbone, "input_size": input_size, "load_size": None},
        "training_data": {"note": "random weights: a throughput benchmark model"},
    }
    path = save_bundle(Path(out), manifest, {"net": net.state_dict()}, {}, overwrite=True)
    if export:
        export_onnx(path, example_size=input_size)
    return path
