"""The paper's augmentations, with albumentations 2.0.

* Weak views (contrastive positives, one-class training): RGBShift, RandomResizedCrop to 224,
  normalization.
* The pseudo-abnormal strong set of distribution-augmented contrastive learning (DROC): CenterCrop
  180 then resize, ColorJitter, GridDistortion and ElasticTransform, each applied with p=1. A
  pseudo-abnormal view applies one member of the set, chosen at random (``mode="one"``), or all of
  them in sequence (``mode="all"``).
* Size-preserving views for Deep SVDD (RGBShift, flip, small rotations; no crop).
* The evaluation view: a deterministic resize and normalization.

Every pipeline takes a seed: the same seed and the same calls give the same views. Pipelines return
float32 arrays in CHW layout, ready for ``torch.from_numpy``.

Departure from the paper: RandomResizedCrop keeps 50-100 % of the patch area (the paper does not
state its range; torchvision's 8 % floor crops away the cell the label is about). CenterCrop keeps
the paper's 180/250 of the side when a patch is smaller than 250 px.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

import numpy as np

# albumentations asks PyPI for a newer version at import unless told not to; cyto never goes online.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albumentations as A  # noqa: E402

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
STRONG_NAMES = ("center_crop", "color_jitter", "grid_distortion", "elastic")

View = Callable[[np.ndarray], np.ndarray]


class _Pipeline:
    """An albumentations Compose that takes uint8 HWC and returns float32 CHW."""

    def __init__(self, compose: A.Compose) -> None:
        self.compose = compose

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(
                f"expected a uint8 (H, W, 3) image, got {image.dtype} {tuple(image.shape)}"
            )
        out = self.compose(image=image)["image"]
        return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


def _normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD) -> A.Normalize:
    return A.Normalize(mean=mean, std=std, max_pixel_value=255.0, p=1.0)


class StainJitter(A.ImageOnlyTransform):
    """Another lab's stain and scanner, drawn at random (``cyto.data.stain.jitter``): each image's
    lαβ spread scaled by exp(N(0, sigma)) and its means moved by N(0, sigma) spreads."""

    def __init__(self, sigma: float = 0.2, p: float = 0.8) -> None:
        super().__init__(p=p)
        self.sigma = float(sigma)

    def get_params(self) -> dict:
        r = self.random_generator
        return {
            "shift": r.normal(0.0, self.sigma, 3),
            "scale": np.exp(r.normal(0.0, self.sigma, 3)),
        }

    def apply(self, img: np.ndarray, shift=None, scale=None, **params) -> np.ndarray:
        from cyto.data.stain import jitter

        return jitter(img, shift, scale)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("sigma",)


def _colour(stain_jitter: float) -> list:
    """The colour augmentation of the training views: RGBShift, after the stain jitter when
    ``stain_jitter`` > 0."""
    shift = A.RGBShift(r_shift_limit=15, g_shift_limit=15, b_shift_limit=15, p=0.8)
    return [StainJitter(stain_jitter), shift] if stain_jitter > 0 else [shift]


def weak_view(
    size: int = 224,
    seed: int | None = 0,
    crop_scale: tuple[float, float] = (0.5, 1.0),
    stain_jitter: float = 0.0,
) -> View:
    """[StainJitter] + RGBShift + RandomResizedCrop(size) + normalization."""
    return _Pipeline(
        A.Compose(
            [
                *_colour(stain_jitter),
                A.RandomResizedCrop(size=(size, size), scale=crop_scale, p=1.0),
                _normalize(),
            ],
            seed=seed,
        )
    )


def size_preserving_view(
    size: int = 224, seed: int | None = 0, max_rotation: float = 10.0, stain_jitter: float = 0.0
) -> View:
    """RGBShift, horizontal flip and small rotations, then resize: no crop, no zoom.

    For one-class training (Deep SVDD): an enlarged nucleus is the abnormality the model must
    notice, so its training views must not teach it that cell size does not matter. The views are
    the family of Deep SVDD's test-time views.
    """
    return _Pipeline(
        A.Compose(
            [
                *_colour(stain_jitter),
                A.HorizontalFlip(p=0.5),
                A.Rotate(limit=max_rotation, border_mode=4, p=0.5),  # cv2.BORDER_REFLECT_101
                A.Resize(size, size, p=1.0),
                _normalize(),
            ],
            seed=seed,
        )
    )


def _center_crop_side(input_size: int) -> int:
    # the paper crops 180 px out of 250 px bone-marrow patches
    return 180 if input_size >= 180 else max(8, round(input_size * 180 / 250))


def strong_transforms(size: int = 224, input_size: int = 250) -> dict[str, A.BasicTransform]:
    """The four members of the pseudo-abnormal strong set, each with p=1."""
    side = _center_crop_side(input_size)
    return {
        "center_crop": A.Sequential(
            [A.CenterCrop(height=side, width=side, p=1.0), A.Resize(size, size, p=1.0)], p=1.0
        ),
        "color_jitter": A.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, p=1.0),
        "grid_distortion": A.GridDistortion(num_steps=5, distort_limit=0.3, p=1.0),
        "elastic": A.ElasticTransform(alpha=40, sigma=6, p=1.0),
    }


def pseudo_abnormal_view(
    size: int = 224,
    input_size: int = 250,
    seed: int | None = 0,
    mode: Literal["one", "all"] = "one",
) -> View:
    """A distribution-shifted view D(x): one (or all) of the strong set, then resize + normalize."""
    if mode not in ("one", "all"):
        raise ValueError(f"mode must be 'one' or 'all', got {mode!r}")
    members = list(strong_transforms(size, input_size).values())
    core = A.OneOf(members, p=1.0) if mode == "one" else A.Sequential(members, p=1.0)
    return _Pipeline(A.Compose([core, A.Resize(size, size, p=1.0), _normalize()], seed=seed))


def eval_view(size: int = 224) -> View:
    """Deterministic resize + normalization (what scoring uses)."""
    return _Pipeline(A.Compose([A.Resize(size, size, p=1.0), _normalize()], seed=0))
