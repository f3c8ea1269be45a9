"""What every slide reader shares: the slide's description, the reader protocol, RGB conversion
and white padding outside the slide."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from cyto.errors import UnsupportedSlideError

PAD = 255
PLANE_SEP = "#page="  # FILE.ndpi#page=N: an NDPI z-offset page read as a focal plane


@dataclass(frozen=True)
class SlideInfo:
    path: Path
    backend: str
    vendor: str
    width: int
    height: int
    level_dims: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    mpp: float | None
    objective: float | None
    properties: dict[str, str] = field(default_factory=dict, repr=False)


class SlideReader(Protocol):
    info: SlideInfo

    def read_region(self, x: int, y: int, w: int, h: int, level: int = 0) -> np.ndarray: ...

    def close(self) -> None: ...


def _float(value: object) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _to_rgb(rgba: np.ndarray) -> np.ndarray:
    if rgba.shape[2] == 3:
        return np.ascontiguousarray(rgba)
    if rgba.shape[2] == 4:
        if np.all(rgba[..., 3] == 255):  # opaque (nearly every tile): the composite is the RGB
            return np.ascontiguousarray(rgba[..., :3])
        a = rgba[..., 3:4].astype(np.float32) / 255.0
        rgb = rgba[..., :3].astype(np.float32) * a + PAD * (1.0 - a)
        return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
    if rgba.shape[2] == 1:
        return np.repeat(rgba, 3, axis=2)
    raise UnsupportedSlideError(f"slide has {rgba.shape[2]} bands; expected RGB")


def in_slide(x: int, y: int, w: int, h: int, width: int, height: int):
    """(x, y, w, h) of the part of a region that lies on a ``width`` x ``height`` slide, or None
    when none does."""
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
    return (x0, y0, x1 - x0, y1 - y0) if x0 < x1 and y0 < y1 else None


def padded(inside: np.ndarray | None, box, x: int, y: int, w: int, h: int) -> np.ndarray:
    """The ``w`` x ``h`` region at (``x``, ``y``): ``inside`` (read at ``box``, from
    :func:`in_slide`) with white around it."""
    out = np.full((h, w, 3), PAD, dtype=np.uint8)
    if box is not None:
        bx, by, bw, bh = box
        out[by - y : by - y + bh, bx - x : bx - x + bw] = inside
    return out
