"""Cell-centred crops cut from a decoded tile (never one slide read per nucleus)."""

from __future__ import annotations

import numpy as np


def crop_cells(
    tile: np.ndarray, tile_x: int, tile_y: int, centres: np.ndarray, size: int
) -> np.ndarray:
    """Crops of ``size x size`` centred on level-0 ``centres`` from a tile whose top-left pixel is
    at level-0 (``tile_x``, ``tile_y``). The tile must hold every crop (read it with a margin of
    at least ``size // 2``; the reader pads slide edges with white)."""
    half = size // 2
    out = np.empty((len(centres), size, size, 3), dtype=np.uint8)
    for i, (x, y) in enumerate(np.asarray(centres)[:, :2]):
        x0 = int(round(x)) - half - tile_x
        y0 = int(round(y)) - half - tile_y
        if x0 < 0 or y0 < 0 or x0 + size > tile.shape[1] or y0 + size > tile.shape[0]:
            raise ValueError(
                f"crop at ({x:g}, {y:g}) does not fit in the tile; read it with a "
                f"margin of at least {half} px"
            )
        out[i] = tile[y0 : y0 + size, x0 : x0 + size]
    return out
