"""Stain normalization (Reinhard et al., *Color transfer between images*, 2001), for models that
must hold across labs, stain batches and scanners.

Each image's colour statistics in Ruderman's lαβ space (a log-LMS opponent space) are moved to a
reference: per channel, ``(v - mean_image) / std_image * std_ref + mean_ref``. The reference is the
average over the training images of their own means and standard deviations, so training images
change little and an image from another lab is pulled toward the training lab's colours.

One torch module does it, on uint8-valued NHWC pixels, with ops ONNX and TensorRT take (MatMul,
Log, Pow, ReduceMean, Round): training normalizes its images with it once, before augmentation,
and the bundle's graph starts with it (:func:`cyto.models.from_bundle.build_graph`), so
``cyto predict``, ``cyto score`` and every exported engine apply the bundle's normalization
without a step of their own.

Statistics are per image (per cell crop), which is what a cell-level model sees at scoring time. A
crop dominated by one large dark nucleus has other statistics than one with a small nucleus, so
normalization also removes a little of the colour signal it standardizes; measure it against no
normalization on held-out cells before relying on it (``benchmarks/science/heldout.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

METHODS = ("none", "reinhard")

_rgb2lms = torch.tensor(
    [[0.3811, 0.5783, 0.0402], [0.1967, 0.7244, 0.0782], [0.0241, 0.1288, 0.8444]],
    dtype=torch.float64,
)
_log2lab = torch.diag(
    torch.tensor([3**-0.5, 6**-0.5, 2**-0.5], dtype=torch.float64)
) @ torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, -2.0], [1.0, -1.0, 0.0]], dtype=torch.float64)
# the four matrices in float32, inverted once (in float64)
_RGB2LMS, _LOG2LAB = _rgb2lms.float(), _log2lab.float()
_LMS2RGB, _LAB2LOG = torch.linalg.inv(_rgb2lms).float(), torch.linalg.inv(_log2lab).float()


def _to_lab(x: torch.Tensor, rgb2lms: torch.Tensor, log2lab: torch.Tensor) -> torch.Tensor:
    """uint8-valued float NHWC -> lαβ NHWC (pixel values offset by one: log of 0 is avoided)."""
    lms = ((x + 1.0) / 256.0) @ rgb2lms.T
    return torch.log(lms) * (1.0 / np.log(10.0)) @ log2lab.T


def _to_rgb(lab: torch.Tensor, lab2log: torch.Tensor, lms2rgb: torch.Tensor) -> torch.Tensor:
    """lαβ NHWC -> uint8-valued float NHWC (rounded, clipped to 0..255)."""
    rgb = (torch.pow(10.0, lab @ lab2log.T) @ lms2rgb.T) * 256.0 - 1.0
    return torch.round(rgb.clamp(0.0, 255.0))


def jitter(image: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """A uint8 HWC image with other stain colours: each lαβ channel's spread scaled by ``scale``
    and its mean moved by ``shift`` times that spread (the augmentation that matches the
    normalization: what it removes, this adds)."""
    lab = _to_lab(torch.from_numpy(image).float()[None], _RGB2LMS, _LOG2LAB)
    mean = lab.mean(dim=(1, 2), keepdim=True)
    sd = lab.std(dim=(1, 2), keepdim=True, unbiased=False)
    shift_t = torch.as_tensor(shift, dtype=torch.float32).view(1, 1, 1, 3)
    scale_t = torch.as_tensor(scale, dtype=torch.float32).view(1, 1, 1, 3)
    lab = (lab - mean) * scale_t + mean + shift_t * sd
    rgb = _to_rgb(lab, _LAB2LOG, _LMS2RGB)
    return rgb[0].to(torch.uint8).numpy()


class ReinhardNormalize(nn.Module):
    """uint8 (or uint8-valued float) NHWC RGB -> float NHWC RGB with integer values in 0..255,
    each image's lαβ statistics moved to the reference ``(mean, std)``."""

    def __init__(self, mean: Any, std: Any) -> None:
        super().__init__()
        self.register_buffer(
            "ref_mean", torch.as_tensor(mean, dtype=torch.float32).view(1, 1, 1, 3)
        )
        self.register_buffer("ref_std", torch.as_tensor(std, dtype=torch.float32).view(1, 1, 1, 3))
        self.register_buffer("rgb2lms", _RGB2LMS.clone())
        self.register_buffer("log2lab", _LOG2LAB.clone())
        self.register_buffer("lab2log", _LAB2LOG.clone())
        self.register_buffer("lms2rgb", _LMS2RGB.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lab = _to_lab(x.float(), self.rgb2lms, self.log2lab)  # cast first (TensorRT: uint8 input)
        mean = lab.mean(dim=(1, 2), keepdim=True)
        std = ((lab - mean) ** 2).mean(dim=(1, 2), keepdim=True).sqrt().clamp(min=1e-4)
        lab = (lab - mean) / std * self.ref_std + self.ref_mean
        return _to_rgb(lab, self.lab2log, self.lms2rgb)


class StainNormalized(nn.Module):
    """A graph that takes uint8 NHWC, preceded by stain normalization."""

    def __init__(self, graph: nn.Module, norm: ReinhardNormalize) -> None:
        super().__init__()
        self.norm = norm
        self.model = graph

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.norm(x))


def lab_stats(images: np.ndarray, batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Per-image lαβ ``(means, stds)``, each ``(N, 3)``, of uint8 NHWC images."""
    means, stds = [], []
    with torch.no_grad():
        for i in range(0, len(images), batch):
            x = torch.from_numpy(np.asarray(images[i : i + batch])).float()
            lab = _to_lab(x, _RGB2LMS, _LOG2LAB)
            means.append(lab.mean(dim=(1, 2)).numpy())
            stds.append(lab.std(dim=(1, 2), unbiased=False).numpy())
    return np.concatenate(means), np.concatenate(stds)


def reference(images: np.ndarray) -> dict[str, Any]:
    """The bundle's record of a Reinhard reference fitted on ``images`` (the training images)."""
    means, stds = lab_stats(images)
    return {
        "method": "reinhard",
        "space": "lαβ (Ruderman), per image",
        "mean": [round(float(v), 6) for v in means.mean(0)],
        "std": [round(float(v), 6) for v in stds.mean(0)],
        "fitted_on": int(len(images)),
    }


def module(record: dict[str, Any]) -> ReinhardNormalize:
    """The normalization a bundle's ``stain_normalization`` record describes."""
    if record.get("method") != "reinhard":
        raise ValueError(f"unknown stain normalization {record.get('method')!r}")
    return ReinhardNormalize(record["mean"], record["std"]).eval()


def normalize_images(images: np.ndarray, record: dict[str, Any], batch: int = 256) -> np.ndarray:
    """uint8 NHWC images normalized as the bundle's graph will normalize them."""
    norm = module(record)
    out = np.empty_like(np.asarray(images), dtype=np.uint8)
    with torch.no_grad():
        for i in range(0, len(images), batch):
            x = torch.from_numpy(np.asarray(images[i : i + batch]))
            out[i : i + batch] = norm(x).to(torch.uint8).numpy()
    return out
