"""Patches from another scanner or objective, brought to the scale a model was trained at.

A model trained on one lab's cells learns their size: the same lymphocyte imaged at 1.7x fewer
pixels per micron looks like a small, abnormal thing (bone marrow vs peripheral blood: AUROC
0.52 before, 0.87 after). ``zoom`` resamples a patch by a factor about its centre and keeps
its size: > 1 enlarges (centre crop), < 1 shrinks (the border filled with the patch's own
background colour).

The factor comes from the pixel sizes (``patch mpp / model mpp``) when both are known, or is
estimated from the cells: :func:`nucleus_fraction` measures the share of a patch covered by
nucleus, and :func:`zoom_from_nuclei` compares the median over a folder with the median over
the training normals that the bundle records. The median over a folder stands for its normal
cells when most of them are normal (a slide, a screening folder); a folder balanced between
classes shifts it, and that is said where it is used.
"""

from __future__ import annotations

import numpy as np

from cyto.errors import ConfigError

#: a pixel is nucleus when its optical density (summed over R, G, B) exceeds this share of the
#: patch's own high percentile: stain intensity varies between labs, the nucleus is the darkest
#: part of a blood or marrow cell in both
NUCLEUS_OD_SHARE = 0.5
ZOOM_RANGE = (0.25, 4.0)
#: a folder whose cells look more than this many times smaller or larger than the training cells
#: (from the nuclei) gets a warning that ``--zoom auto`` is advised: another lab's lymphocytes
#: at 1.69x ranked at AUROC 0.44 unzoomed and 0.81 zoomed; the same lab's later files are at 0.9-1.1
ADVISE_ZOOM = 1.25


def _od(images: np.ndarray) -> np.ndarray:
    x = np.asarray(images, dtype=np.float32)
    return -np.log((x + 1.0) / 256.0).sum(axis=-1)


def nucleus_fraction(images: np.ndarray) -> np.ndarray:
    """(N,) share of each uint8 (N, H, W, 3) patch's pixels that are nucleus (see the module)."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ConfigError(f"patches must be (N, H, W, 3), got {images.shape}")
    out = np.empty(len(images), dtype=np.float64)
    for i in range(0, len(images), 256):
        od = _od(images[i : i + 256]).reshape(min(256, len(images) - i), -1)
        top = np.percentile(od, 99, axis=1, keepdims=True)
        out[i : i + 256] = (od > NUCLEUS_OD_SHARE * np.maximum(top, 1e-6)).mean(axis=1)
    return out


def zoom_from_nuclei(reference: float, images: np.ndarray) -> float:
    """The factor that gives ``images``' median nucleus area the training median ``reference``
    (areas scale with the square of the factor)."""
    factor = _nucleus_factor(reference, images)
    if factor is None:
        raise ConfigError("cannot estimate a zoom: no nucleus pixels found in the patches")
    return check_zoom(factor)


def _nucleus_factor(reference: float, images) -> float | None:
    """sqrt(reference / the median nucleus share of ``images``), or None when either is 0."""
    median = float(np.median(nucleus_fraction(images)))
    if not reference > 0 or not median > 0:
        return None
    return float(np.sqrt(reference / median))


def scale_advice(model_nuclei: float | None, images) -> str | None:
    """A one-line warning when ``images`` (patches at the model's load size) look more than
    :data:`ADVISE_ZOOM` times smaller or larger than the model's training normals, else None."""
    if model_nuclei is None or len(images) == 0:
        return None
    factor = _nucleus_factor(model_nuclei, images)
    if factor is None or 1 / ADVISE_ZOOM <= factor <= ADVISE_ZOOM:
        return None
    median = model_nuclei / factor**2
    how = "smaller" if factor > 1 else "larger"
    times = factor if factor > 1 else 1 / factor
    advice = (
        "--zoom auto is advised (or --patch-mpp UM_PER_PX)"
        if factor > 1
        else "a model trained at this scale is advised (a zoom below 1 ranked worse than none)"
    )
    return (
        f"these cells look {times:.2f}x {how} than the model's training cells (median nucleus "
        f"share {median:.3f} against {model_nuclei:.3f}); a one-class model can rank another "
        f"scale's normal cells as the most abnormal: {advice}"
    )


def check_zoom(zoom: float) -> float:
    lo, hi = ZOOM_RANGE
    if not lo <= zoom <= hi:
        raise ConfigError(
            f"zoom {zoom:.3g} is outside {lo:g}..{hi:g}: these patches are not at a scale a "
            "resampling can fix (check the pixel sizes, or pass --zoom explicitly)"
        )
    return zoom


def zoom_patch(img: np.ndarray, zoom: float, size: int | None = None) -> np.ndarray:
    """``img`` (H, W, 3) uint8 magnified ``zoom`` x about its centre, returned at ``size``
    (default: its own). The centre 1/zoom of the image is cut at its native resolution before
    any resize, so enlarging loses no more detail than the crop itself."""
    from cyto.data.images import resize_rgb

    h, w = img.shape[:2]
    size = size or h
    if zoom == 1.0:
        return img if (h, w) == (size, size) else resize_rgb(img, size)
    side = max(1, round(min(h, w) / zoom))
    if side <= min(h, w):  # enlarge: the centre square
        y0, x0 = (h - side) // 2, (w - side) // 2
        return resize_rgb(np.ascontiguousarray(img[y0 : y0 + side, x0 : x0 + side]), size)
    edge = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    canvas = np.empty((side, side, 3), dtype=np.uint8)
    canvas[:] = np.median(edge, axis=0).astype(np.uint8)  # the background around the cell
    y0, x0 = (side - h) // 2, (side - w) // 2
    canvas[y0 : y0 + h, x0 : x0 + w] = img
    return resize_rgb(canvas, size)


def zoom_patches(images, zoom: float, size: int | None = None) -> np.ndarray:
    """:func:`zoom_patch` over a stack or a list of patches (of any sizes), as one stack."""
    return np.stack([zoom_patch(np.asarray(im), zoom, size) for im in images])


def resolve_zoom(
    zoom: str | float | None,
    patch_mpp: float | None,
    model_mpp: float | None,
    model_nuclei: float | None,
    images,
) -> tuple[float, str]:
    """(factor, how it was found) for ``--zoom FACTOR|auto`` or ``--patch-mpp UM``; ``images``
    (the patches at the model's load size, or a function that gives them) serve ``auto`` only."""
    if zoom is not None and patch_mpp is not None:
        raise ConfigError("give --zoom or --patch-mpp, not both")
    if patch_mpp is not None:
        if not patch_mpp > 0:
            raise ConfigError(f"--patch-mpp must be > 0 um per pixel, got {patch_mpp}")
        if model_mpp is None:
            raise ConfigError(
                "--patch-mpp: the model records no training resolution (train it with "
                "--set mpp=UM_PER_PX); pass --zoom FACTOR or --zoom auto instead"
            )
        return check_zoom(patch_mpp / model_mpp), (
            f"the pixel sizes: {patch_mpp:g} / {model_mpp:g} um per pixel"
        )
    if zoom is None:
        return 1.0, "none"
    if str(zoom).strip().lower() == "auto":
        if model_nuclei is None:
            raise ConfigError(
                "--zoom auto: the model records no nucleus size of its training cells (trained "
                "by an older cyto); pass --zoom FACTOR or --patch-mpp UM_PER_PX"
            )
        sample = images() if callable(images) else images
        return zoom_from_nuclei(model_nuclei, sample), (
            "the median nucleus size of these patches against the training normals' "
            "(assumes most patches show normal cells)"
        )
    try:
        value = float(zoom)
    except ValueError:
        raise ConfigError(f"--zoom takes a factor (e.g. 1.7) or auto, got {zoom!r}") from None
    return check_zoom(value), "given"
