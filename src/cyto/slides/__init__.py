"""Slides (``cyto.slides``): open any whole-slide image and read it.

Owns the readers (pyvips, OpenSlide, NDPI z-offset pages), a slide's levels and metadata
(:class:`SlideInfo`), its focal planes and the sharpest one per cell, its tissue mask and tile grid,
and decoding on a device (:mod:`cyto.slides.device`, torch, imported only when asked for). Knows
nothing of models, nuclei or scores; imports only ``cyto.errors`` and, for device decode,
``cyto.runtime.devices``.
"""

from __future__ import annotations

from cyto.slides.base import PAD, PLANE_SEP, SlideInfo, SlideReader
from cyto.slides.grid import tile_grid, tissue_mask
from cyto.slides.planes import check_plane_geometry, find_planes, open_with_planes, sharpest
from cyto.slides.readers import BACKENDS, SLIDE_SUFFIXES, open_plane, open_slide, slide_files

__all__ = [
    "BACKENDS",
    "PAD",
    "PLANE_SEP",
    "SLIDE_SUFFIXES",
    "SlideInfo",
    "SlideReader",
    "check_plane_geometry",
    "find_planes",
    "open_plane",
    "open_slide",
    "open_with_planes",
    "sharpest",
    "slide_files",
    "tile_grid",
    "tissue_mask",
]
