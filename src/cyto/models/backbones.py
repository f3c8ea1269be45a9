"""Backbones: torchvision ResNet18 (from scratch by default) and a small CNN for CPU presets.

Both take any input size (global average pooling) and end in a linear layer of ``out_dim``. With
``bias=False`` every bias and every BatchNorm shift is removed from the embedding path, as Deep
SVDD requires (Ruff et al., *Deep One-Class Classification*, ICML 2018, Prop. 2: a learnable bias
lets the network map every input to the centre).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cyto.errors import ConfigError

BACKBONES = ("resnet18", "smallcnn")


class GlobalMean(nn.Module):
    """Global average pooling straight to (N, C).

    The same numbers as ``AdaptiveAvgPool2d(1)`` then ``flatten``, but the exported graph is one
    ReduceMean: the flatten of a pooled view exports as an index computation over the batch
    (Shape of the uint8 input, Range, Gather), 11 nodes that TensorRT would have to import and
    run for nothing.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class SmallCNN(nn.Module):
    """Four conv blocks (3x3 conv, BatchNorm, LeakyReLU, 2x2 max-pool), pooling, a linear layer."""

    def __init__(self, out_dim: int = 128, bias: bool = True, width: int = 32) -> None:
        super().__init__()
        chans = [3, width, width * 2, width * 4, width * 8]
        layers: list[nn.Module] = []
        for cin, cout in zip(chans[:-1], chans[1:], strict=True):
            layers += [
                nn.Conv2d(cin, cout, 3, padding=1, bias=bias),
                nn.BatchNorm2d(cout, affine=bias, eps=1e-4),
                nn.LeakyReLU(0.1),
                nn.MaxPool2d(2),
            ]
        self.features = nn.Sequential(*layers)
        self.pool = GlobalMean()
        self.fc = nn.Linear(chans[-1], out_dim, bias=bias)
        self.feature_dim = chans[-1]
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(x)))


def _without_affine(module: nn.Module) -> None:
    """Replace every BatchNorm by one without learnable scale and shift, in place."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(
                module,
                name,
                nn.BatchNorm2d(
                    child.num_features, eps=child.eps, momentum=child.momentum, affine=False
                ),
            )
        else:
            _without_affine(child)


def _resnet18(out_dim: int, bias: bool) -> nn.Module:
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=out_dim)
    model.fc = nn.Linear(512, out_dim, bias=bias)
    model.avgpool = GlobalMean()  # torchvision's flatten of (N, C) is then a no-op
    if not bias:
        _without_affine(model)
    model.feature_dim = 512
    model.out_dim = out_dim
    return model


def build_backbone(
    name: str, out_dim: int, bias: bool = True, weights: Path | None = None
) -> nn.Module:
    """A backbone by name; ``weights`` is a local state dict (safetensors or torch), never a URL."""
    if name == "resnet18":
        model = _resnet18(out_dim, bias)
    elif name == "smallcnn":
        model = SmallCNN(out_dim, bias)
    else:
        raise ConfigError(f"unknown backbone {name!r}; known: {', '.join(BACKBONES)}")
    if weights is not None:
        load_backbone_weights(model, weights)
    return model


def load_backbone_weights(model: nn.Module, path: Path) -> list[str]:
    """Load matching tensors from a local file; returns the names loaded.

    Layers whose shape differs (e.g. an ImageNet classifier) are left as they are. A file of which
    less than half fits is an error, not a silent start from scratch.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling refusal becomes one clear error
            raise ConfigError(f"cannot read weights {path} as a tensor state dict: {exc}") from exc
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
    if not isinstance(state, dict):
        raise ConfigError(f"weights file {path} does not hold a state dict")
    state = {k.removeprefix("module.").removeprefix("encoder."): v for k, v in state.items()}
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if len(usable) < max(1, len(state) // 2):
        raise ConfigError(
            f"weights file {path} has no tensor that fits this backbone: only {len(usable)} of "
            f"its {len(state)} tensors match by name and shape (expected keys like "
            f"{next(iter(own))!r}); is it for another backbone?"
        )
    model.load_state_dict(usable, strict=False)
    return sorted(usable)
