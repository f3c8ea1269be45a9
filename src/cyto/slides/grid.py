"""Where a slide has tissue, and its grid of tiles."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def tissue_mask(reader) -> tuple[np.ndarray | None, float]:
    """Boolean mask at the lowest level (True = not blank glass) and its downsample, or None
    when the slide has no level small enough to read whole (every tile is then visited)."""
    from scipy import ndimage

    level = len(reader.info.level_dims) - 1
    w, h = reader.info.level_dims[level]
    if w * h > 4096 * 4096:
        return None, 1.0
    low = reader.read_region(0, 0, w, h, level=level)
    # optical density summed over the channels, through one table of 256 logs per channel
    # value: the same float32 numbers as the log of every pixel, without float copies of it
    log = np.log((np.arange(256, dtype=np.float32) + 1.0) / 256.0)
    od = log[low[..., 0]]
    od += log[low[..., 1]]
    od += log[low[..., 2]]
    mask = ndimage.binary_dilation(od < -0.25, iterations=3)
    return mask, reader.info.level_downsamples[level]


def tile_grid(
    width: int, height: int, tile: int, mask: np.ndarray | None = None, mask_ds: float = 1.0
) -> Iterator[tuple[int, int, int]]:
    """(index, x0, y0) of every ``tile``-pixel tile of a ``width`` x ``height`` level-0 grid,
    row by row; with a tissue ``mask`` (at ``mask_ds``), only tiles that hold tissue."""
    cols = -(-width // tile)
    for y0 in range(0, height, tile):
        for x0 in range(0, width, tile):
            if mask is not None:
                mx0, my0 = int(x0 / mask_ds), int(y0 / mask_ds)
                mx1, my1 = int((x0 + tile) / mask_ds) + 1, int((y0 + tile) / mask_ds) + 1
                if not mask[my0:my1, mx0:mx1].any():
                    continue
            yield (y0 // tile) * cols + x0 // tile, x0, y0
