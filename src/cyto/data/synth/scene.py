"""A scene of cells, red cells and debris, drawn region by region.

Objects are stored as small numpy arrays (position, kind, seed), not as rendered pixels: each object
is drawn from its own seed when a region that touches it is drawn. A region's pixels therefore do
not depend on how the plane is cut into regions, and memory depends on the region size only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cyto.data.synth.cells import (
    CELL_CLASSES,
    StainStyle,
    add_window,
    render_cell_od,
    render_debris_od,
    render_rbc_od,
    sample_cell,
)

KIND_CELL, KIND_RBC, KIND_DEBRIS = 0, 1, 2
# Largest half-width of any object's window (px, at scale 1) in its plane of focus: an enlarged
# multinucleated cell with blur (about 63 px), with room for defocus. Regions look this far around
# themselves for objects, plus DEFOCUS_REACH px per um away from the main plane.
MAX_REACH = 110
DEFOCUS_REACH = 3 * 2.2  # three sigmas of the defocus blur, 2.2 px per um


@dataclass
class Scene:
    """Objects of one plane: parallel arrays, one entry per object."""

    x: np.ndarray  # float64, level-0 px
    y: np.ndarray
    kind: np.ndarray  # int8: KIND_*
    cls: np.ndarray  # int8: index into CELL_CLASSES (cells), -1 otherwise
    seed: np.ndarray  # int64
    size: np.ndarray  # float32: radius of red cells and debris (cells carry theirs in the seed)
    focus_z: np.ndarray  # float32: plane of best focus (um) for red cells and debris
    scale: float = 1.0
    _grid: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    _grid_cell: int = 512

    @staticmethod
    def concat(parts: list[Scene], scale: float = 1.0) -> Scene:
        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        return Scene(
            x=cat("x"),
            y=cat("y"),
            kind=cat("kind"),
            cls=cat("cls"),
            seed=cat("seed"),
            size=cat("size"),
            focus_z=cat("focus_z"),
            scale=scale,
        )

    def build_index(self, grid_cell: int = 512) -> None:
        """Bucket objects by grid cell so a region finds its objects without a full scan."""
        self._grid_cell = grid_cell
        gx = np.floor(self.x / grid_cell).astype(np.int64)
        gy = np.floor(self.y / grid_cell).astype(np.int64)
        order = np.lexsort((gx, gy))
        keys = np.stack([gy[order], gx[order]], axis=1)
        if len(order) == 0:
            self._grid = {}
            return
        change = np.flatnonzero(np.any(np.diff(keys, axis=0) != 0, axis=1)) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change, [len(order)]])
        self._grid = {
            (int(keys[s, 0]), int(keys[s, 1])): order[s:e]
            for s, e in zip(starts, ends, strict=True)
        }

    def reach(self, z: float = 0.0) -> int:
        """How far (px) from its centre an object's window may reach in focal plane ``z``."""
        return int(np.ceil(MAX_REACH * self.scale + DEFOCUS_REACH * abs(z)))

    def objects_near(self, x0: int, y0: int, w: int, h: int, z: float = 0.0) -> np.ndarray:
        """Indices of objects whose window may touch the region, in a fixed (index) order."""
        reach = self.reach(z)
        if not self._grid:
            sel = (
                (self.x > x0 - reach)
                & (self.x < x0 + w + reach)
                & (self.y > y0 - reach)
                & (self.y < y0 + h + reach)
            )
            return np.flatnonzero(sel)
        g = self._grid_cell
        found = []
        for gy in range((y0 - reach) // g, (y0 + h + reach) // g + 1):
            for gx in range((x0 - reach) // g, (x0 + w + reach) // g + 1):
                idx = self._grid.get((gy, gx))
                if idx is not None:
                    found.append(idx)
        if not found:
            return np.empty(0, dtype=np.int64)
        idx = np.sort(np.concatenate(found))
        # the grid cells are coarser than the reach: keep only objects within it, or each would
        # be drawn for about three rows of regions instead of the one or two it touches
        x, y = self.x[idx], self.y[idx]
        keep = (x > x0 - reach) & (x < x0 + w + reach) & (y > y0 - reach) & (y < y0 + h + reach)
        return idx[keep]


class WindowCache:
    """Rendered object windows of the current row of blocks.

    Blocks are drawn left to right; a window is dropped as soon as no later block of the row can
    ask for it (its object is beyond the scene's reach), so memory holds about one column of
    objects, whatever the slide size.
    """

    def __init__(self) -> None:
        self._store: dict[tuple[int, float], tuple[np.ndarray, int, float]] = {}

    def __len__(self) -> int:
        return len(self._store)

    def get(self, key: tuple[int, float]) -> tuple[np.ndarray, int] | None:
        hit = self._store.get(key)
        return None if hit is None else (hit[0], hit[1])

    def put(self, key: tuple[int, float], value: tuple[np.ndarray, int], right: float) -> None:
        self._store[key] = (value[0], value[1], right)

    def drop_left_of(self, x: float) -> None:
        """Forget windows whose right edge is left of ``x``."""
        for k in [k for k, v in self._store.items() if v[2] < x]:
            del self._store[k]

    def clear(self) -> None:
        self._store.clear()


def render_od(
    scene: Scene,
    x0: int,
    y0: int,
    w: int,
    h: int,
    style: StainStyle,
    z: float = 0.0,
    cache: WindowCache | None = None,
) -> np.ndarray:
    """Optical density of the region ``[x0, x0+w) x [y0, y0+h)`` at focal plane ``z`` (um)."""
    od = np.zeros((h, w, 3), dtype=np.float32)
    reach = scene.reach(z)
    for i in scene.objects_near(x0, y0, w, h, z):
        key = (int(i), float(z))
        hit = cache.get(key) if cache is not None else None
        if hit is None:
            hit = _render_object(scene, int(i), style, z)
            if cache is not None:
                cache.put(key, hit, float(scene.x[i]) + reach)
        window, half = hit
        add_window(od, window, scene.x[i] - x0, scene.y[i] - y0, half)
    return od


def _render_object(scene: Scene, i: int, style: StainStyle, z: float) -> tuple[np.ndarray, int]:
    kind = int(scene.kind[i])
    seed = int(scene.seed[i])
    if kind == KIND_CELL:
        spec = sample_cell(
            CELL_CLASSES[int(scene.cls[i])], np.random.default_rng(seed), scale=scene.scale
        )
        return render_cell_od(
            spec,
            defocus=z - spec.focus_z,
            nucleus_gain=style.nucleus_gain,
            cyto_gain=style.cyto_gain,
        )
    if kind == KIND_RBC:
        defocus = z - float(scene.focus_z[i])
        blur = float(np.hypot(0.7 * scene.scale, 2.2 * abs(defocus)))
        return render_rbc_od(float(scene.size[i]), seed, blur, gain=style.rbc_gain)
    return render_debris_od(float(scene.size[i]), seed)


def cell_objects(
    x: np.ndarray, y: np.ndarray, cls_index: np.ndarray, rng: np.random.Generator
) -> Scene:
    """Cells at the given centres; each gets its own seed from ``rng``."""
    n = len(x)
    return Scene(
        x=np.asarray(x, dtype=np.float64),
        y=np.asarray(y, dtype=np.float64),
        kind=np.full(n, KIND_CELL, dtype=np.int8),
        cls=np.asarray(cls_index, dtype=np.int8),
        seed=rng.integers(0, 2**31 - 1, size=n, dtype=np.int64),
        size=np.zeros(n, dtype=np.float32),
        focus_z=np.zeros(n, dtype=np.float32),
    )


def background_objects(
    x: np.ndarray, y: np.ndarray, kind: int, rng: np.random.Generator, scale: float
) -> Scene:
    """Red cells (radius about 17 px) or debris (about 4 px) at the given positions."""
    n = len(x)
    if kind == KIND_RBC:
        size = rng.normal(17.0, 1.8, size=n) * scale
    else:
        size = rng.uniform(2.0, 6.0, size=n) * scale
    return Scene(
        x=np.asarray(x, dtype=np.float64),
        y=np.asarray(y, dtype=np.float64),
        kind=np.full(n, kind, dtype=np.int8),
        cls=np.full(n, -1, dtype=np.int8),
        seed=rng.integers(0, 2**31 - 1, size=n, dtype=np.int64),
        size=size.astype(np.float32),
        focus_z=rng.normal(0.0, 0.6, size=n).astype(np.float32),
    )
