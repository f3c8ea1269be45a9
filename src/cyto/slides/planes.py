"""Focal planes: which extra planes a slide has, that each belongs to it, and the sharpest one
per cell."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from cyto.errors import ConfigError
from cyto.flags import comma_list, passing
from cyto.slides.base import PLANE_SEP
from cyto.slides.dicom import is_dicom_file
from cyto.slides.ndpi import ndpi_planes
from cyto.slides.readers import open_plane, open_slide
from cyto.slides.remote import SlideURL

_PLANE_RE = re.compile(r"_z([+-]\d+(?:\.\d+)?)um$")
#: the side of the overviews a plane is compared on (their longer side, in blocks): a cell is
#: a few blocks wide, so focus hardly shows, while another smear's cells fall elsewhere
OVERVIEW_BLOCKS = 96
#: the least correlation of a plane's overview with the slide's (a plane of the slide, even
#: defocused by 2 um: 0.99 on `cyto synth slide` z-stacks; another smear of its size: below 0.3)
SAME_SLIDE_R = 0.6
_OVERVIEW_MAX = 2048  # the most pixels a side of the level read for an overview


def find_planes(slide: Path, spec: str) -> list[tuple[float, str]]:
    """Extra focal planes of ``slide`` as (z in um, plane): ``auto`` takes the z-offset pages of
    an NDPI file, or sibling files named ``NAME_z+1.00um.ext`` (what ``cyto synth slide
    --planes`` writes for TIFF); ``none`` uses the main plane only; a comma-separated list names
    the files (z from their names, else their order)."""
    if spec == "none":
        return []
    if isinstance(slide, SlideURL):
        if spec == "auto":
            return []  # a remote slide's focal planes are not searched for
        raise ConfigError(
            f"{slide}: {passing('planes', 'FILES')} is for local slides; pass "
            f"{passing('planes', 'none')}"
        )
    slide = Path(slide)
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
    for i, name in enumerate(comma_list(spec, "planes")):
        from cyto.flags import said
        from cyto.slides.remote import is_url, redact

        if is_url(name.strip()):  # it was turned into a path (s3:/...) and said missing
            raise ConfigError(
                f"{said('planes')} takes local files, not a URL: {redact(name.strip())} (copy "
                "the focal planes to this machine first)"
            )
        f = Path(name.strip())
        if not f.is_file():
            raise ConfigError(f"{said('planes')}: focal plane file {f} does not exist")
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


def overview(reader, box: tuple[int, int, int, int], grid: tuple[int, int]) -> np.ndarray:
    """A grey overview of the level-0 ``box`` (x, y, w, h) of a slide: read at its coarsest
    level, averaged down to ``grid`` (width, height) blocks."""
    from PIL import Image

    info = reader.info
    level = len(info.level_dims) - 1
    ds = info.level_downsamples[level]
    x, y, w, h = (round(v / ds) for v in box)  # read_region takes the level's pixels
    img = reader.read_region(x, y, max(1, w), max(1, h), level=level)
    grey = Image.fromarray(img.astype(np.float32).mean(axis=2))
    return np.asarray(grey.resize(grid, Image.Resampling.BOX), dtype=np.float64)


def plane_likeness(slide_view: np.ndarray, plane_view: np.ndarray) -> float:
    """How much a plane's overview looks like the slide's: the correlation of their detail
    (each less its own smooth trend, so the shape of the smear on the glass, which two smears
    share, does not count). Where both have no detail (blank glass) nothing tells them apart
    but their brightness: 1 when it agrees within 8 grey levels, else 0; where only one has
    detail, 0."""
    from scipy import ndimage

    a, b = (np.asarray(v, dtype=np.float64) for v in (slide_view, plane_view))
    da = (a - ndimage.gaussian_filter(a, 3.0, mode="nearest")).ravel()
    db = (b - ndimage.gaussian_filter(b, 3.0, mode="nearest")).ravel()
    flat_a, flat_b = da.std() < 0.5, db.std() < 0.5
    if flat_a and flat_b:
        return 1.0 if abs(a.mean() - b.mean()) <= 8.0 else 0.0
    if flat_a or flat_b:
        return 0.0
    return float(np.corrcoef(da, db)[0, 1])


def check_planes_belong(reader, planes: list[tuple[float, str]]) -> None:
    """Every extra plane must show the slide, not another slide of the same size.

    A focal plane of a slide is the same smear a little above or below: at the scale of a
    low-resolution overview (:func:`overview`, a few cells per block) its pattern of cells is
    the slide's, whatever the focus, while another smear's cells lie elsewhere. So the plane's
    overview must correlate with the slide's by :data:`SAME_SLIDE_R` or more. Metadata would
    not do: scanners write their own (one a z offset per plane, others nothing), and two
    slides of one scanner share it. An NDPI file's own z pages are not compared. Costs one
    read of each coarsest level.
    """
    checked = [(z, f) for z, f in planes if not _page_of(f, reader.info.path)]
    width, height = reader.info.width, reader.info.height
    for _z, f in checked:
        plane = open_plane(f)
        try:
            # one level-0 window both read at their coarsest level, in at most 2048 px a side
            ds = min(reader.info.level_downsamples[-1], plane.info.level_downsamples[-1])
            w, h = int(min(width, _OVERVIEW_MAX * ds)), int(min(height, _OVERVIEW_MAX * ds))
            box = ((width - w) // 2, (height - h) // 2, w, h)
            scale = OVERVIEW_BLOCKS / max(w, h)
            grid = (max(1, round(w * scale)), max(1, round(h * scale)))
            r = plane_likeness(overview(reader, box, grid), overview(plane, box, grid))
        finally:
            plane.close()
        if r < SAME_SLIDE_R:
            raise ConfigError(
                f"--planes: {f} does not show slide {reader.info.path} (their low-resolution "
                f"overviews correlate {r:.2f}, a focal plane of it at least {SAME_SLIDE_R}): "
                "give the focal planes of this slide"
            )


def _page_of(plane: str, slide: Path) -> bool:
    """Whether ``plane`` is a z page of the slide's own NDPI file (``FILE#page=N``)."""
    text = str(plane)
    return PLANE_SEP in text and Path(text.rsplit(PLANE_SEP, 1)[0]) == Path(slide)


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
    the slide's size and to show it (:func:`check_planes_belong`): a bad slide or plane fails
    here, before any output exists."""
    reader = open_slide(slide)
    try:
        planes = find_planes(slide, spec)
        check_plane_geometry(planes, reader.info.width, reader.info.height)
        check_planes_belong(reader, planes)
    except BaseException:
        reader.close()
        raise
    return reader, planes
