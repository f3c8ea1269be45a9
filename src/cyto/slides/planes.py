"""Focal planes: which extra planes a slide has, and the sharpest one per cell."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from cyto.errors import ConfigError
from cyto.slides.dicom import is_dicom_file
from cyto.slides.ndpi import ndpi_planes
from cyto.slides.readers import open_plane, open_slide

_PLANE_RE = re.compile(r"_z([+-]\d+(?:\.\d+)?)um$")


def find_planes(slide: Path, spec: str) -> list[tuple[float, str]]:
    """Extra focal planes of ``slide`` as (z in um, plane): ``auto`` takes the z-offset pages of
    an NDPI file, or sibling files named ``NAME_z+1.00um.ext`` (what ``cyto synth slide
    --planes`` writes for TIFF); ``none`` uses the main plane only; a comma-separated list names
    the files (z from their names, else their order)."""
    slide = Path(slide)
    if spec == "none":
        return []
    if spec == "auto" and slide.suffix.lower() == ".ndpi":
        return ndpi_planes(slide)
    if spec == "auto" and (slide.is_dir() or is_dicom_file(slide)):
        return []  # a DICOM slide: its focal planes are not read (OpenSlide gives one)
    if spec == "auto":
        found = []
        for f in sorted(slide.parent.glob(f"{slide.stem}_z*um{slide.suffix}")):
            m = _PLANE_RE.search(f.stem)
            if m and f != slide:
                found.append((float(m.group(1)), str(f)))
        return sorted(found)
    out = []
    for i, name in enumerate(p for p in spec.split(",") if p.strip()):
        f = Path(name.strip())
        if not f.is_file():
            raise ConfigError(f"focal plane file {f} does not exist")
        m = _PLANE_RE.search(f.stem)
        out.append((float(m.group(1)) if m else float(i + 1), str(f)))
    return out


def check_plane_geometry(planes: list[tuple[float, str]], width: int, height: int) -> None:
    """Every extra plane must have the slide's size."""
    for _z, f in planes:
        reader = open_plane(f)
        w, h = reader.info.width, reader.info.height
        reader.close()
        if (w, h) != (width, height):
            raise ConfigError(
                f"focal plane {f} is {w}x{h}, the slide {width}x{height}: planes must share "
                "one geometry"
            )


def sharpness(crops: np.ndarray) -> np.ndarray:
    """Variance of the Laplacian of the grey central half of each crop (higher = sharper)."""
    from scipy import ndimage

    n, s = crops.shape[:2]
    q = s // 4
    grey = crops[:, q : s - q, q : s - q].astype(np.float32).mean(axis=3)
    lap = np.stack([ndimage.laplace(g) for g in grey]) if n else grey
    return lap.reshape(n, -1).var(axis=1)


def sharpest(stack: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(crops from the sharpest plane per cell, plane index per cell) from one crop set per
    plane."""
    n = len(stack[0])
    if len(stack) == 1:
        return stack[0], np.zeros(n, dtype=np.int64)
    plane = np.argmax(np.stack([sharpness(c) for c in stack]), axis=0)
    return np.stack(stack)[plane, np.arange(n)], plane


def open_with_planes(slide: Path, spec: str = "auto"):
    """(reader of ``slide``, its extra focal planes per ``spec``), every plane checked to have
    the slide's size: a bad slide or plane fails here, before any output exists."""
    reader = open_slide(slide)
    try:
        planes = find_planes(slide, spec)
        check_plane_geometry(planes, reader.info.width, reader.info.height)
    except BaseException:
        reader.close()
        raise
    return reader, planes
