"""Preprocessing as a module: raw uint8 NHWC patches in, normalized float NCHW out.

Training, scoring and the exported ONNX graph all use this one module, so the exported artifact
gives the answer training gave. The uint8 input is cast before anything else touches it:
TensorRT's ONNX parser accepts a UINT8 tensor only as a network input that feeds a Cast, so a
transpose (or any other op) on the uint8 tensor would make every graph unparseable there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Preprocess(nn.Module):
    """uint8 ``(N, H, W, 3)`` -> float ``(N, 3, size, size)``: cast, resize, normalize."""

    def __init__(self, size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> None:
        super().__init__()
        self.size = int(size)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().permute(0, 3, 1, 2) / 255.0  # cast first: see the module docstring
        # always resize (an identity at the same size): no shape-dependent branch in the graph
        x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return (x - self.mean) / self.std
