"""Slide containers the synthetic generator writes (kept import-light for the CLI)."""

from __future__ import annotations

from enum import Enum


class SlideFormat(str, Enum):
    """Container of a synthetic slide."""

    tiff = "tiff"
    ndpi = "ndpi"


SUFFIX_FORMATS = {".tif": SlideFormat.tiff, ".tiff": SlideFormat.tiff, ".ndpi": SlideFormat.ndpi}
