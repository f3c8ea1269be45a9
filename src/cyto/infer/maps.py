"""The abnormality map of a scored slide: the slide cut into square windows of a physical size
(50 um by default), one value per window computed from the cells whose centres fall in it.

With a calibrated slide the value is the fraction of the window's cells that score above the
burden's threshold (the 99th percentile of the calibration's normal cells, so about 0.01 where
every cell is normal), counted over the cells the burden counts (the evaluable ones, where it
counts those): a number in [0, 1] that reads the same on every slide. It is not the fraction
FDR-flagged, which is all zero on a slide where nothing reaches BH's first step (the demo's: 780
calibration cells cannot flag one of 1,040). Without a calibration it is the highest score in the
window (the model's own units). A window without counted cells is NaN in ``values`` and 0 in
``counts``, so "no cells here" is never read as "normal cells here". ``cyto view`` draws it at
low zoom, and :mod:`cyto.infer.qupath` writes it as a pyramidal OME-TIFF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the window side in micrometres when none is given
WINDOW_UM = 50.0
#: what ``AbnormalityMap.kind`` may say
KINDS = ("fraction_flagged", "fraction_above_threshold", "max_score")


@dataclass(frozen=True)
class AbnormalityMap:
    """One value per window of a slide.

    Attributes:
        values: float32 ``[rows, cols]``; the statistic ``kind`` names, NaN where no cell lies.
        counts: int32 ``[rows, cols]``; cells whose centre lies in the window.
        window_px: level-0 pixels per window side (``window_um / mpp``); window ``(r, c)``
            covers x in ``[c * window_px, (c + 1) * window_px)``, y likewise with ``r``.
        mpp: micrometres per level-0 pixel of the slide.
        window_um: micrometres per window side.
        kind: ``fraction_flagged``, ``fraction_above_threshold`` or ``max_score``.
        threshold: the score threshold of ``fraction_above_threshold``, else None.
    """

    values: np.ndarray
    counts: np.ndarray
    window_px: float
    mpp: float
    window_um: float
    kind: str
    threshold: float | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of windows."""
        return self.values.shape

    @property
    def is_fraction(self) -> bool:
        """Whether ``values`` are fractions in [0, 1] (a calibrated statistic)."""
        return self.kind != "max_score"

    def window_of(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """(row, col) of the windows holding level-0 points ``x``, ``y`` (clipped to the map)."""
        rows, cols = self.shape
        col = np.clip(np.floor(np.asarray(x, np.float64) / self.window_px), 0, cols - 1)
        row = np.clip(np.floor(np.asarray(y, np.float64) / self.window_px), 0, rows - 1)
        return row.astype(np.int64), col.astype(np.int64)


def abnormality_grid(
    x,
    y,
    score,
    width: int,
    height: int,
    mpp: float,
    window_um: float = WINDOW_UM,
    flagged=None,
    threshold: float | None = None,
    counted=None,
) -> AbnormalityMap:
    """The abnormality map of cells at level-0 centres ``x``, ``y`` with ``score``, on a slide of
    ``width`` x ``height`` level-0 pixels at ``mpp`` um/px, in windows of ``window_um``.

    ``flagged`` (bool per cell, e.g. the table's FDR flags) gives the fraction flagged per window;
    else ``threshold`` gives the fraction scoring above it; with neither, the maximum score. A
    flag that is missing (None/NaN in a table whose flags were withheld) counts as not flagged.
    ``counted`` (bool per cell, None: all): the cells the map counts, the others left out.
    Cells outside the slide are put in the nearest edge window; cells without a finite position
    or score are left out. Vectorised: 10^5 cells take milliseconds.

    Raises:
        ValueError: a size, mpp or window that is not positive, arrays of unequal length, or both
            ``flagged`` and ``threshold`` given.
    """
    if width < 1 or height < 1:
        raise ValueError(f"slide size must be positive, got {width} x {height} px")
    if not (math.isfinite(mpp) and mpp > 0):
        raise ValueError(f"mpp must be a positive number of um per pixel, got {mpp}")
    if not (math.isfinite(window_um) and window_um > 0):
        raise ValueError(f"window must be a positive number of um, got {window_um}")
    if flagged is not None and threshold is not None:
        raise ValueError("give flagged cells or a score threshold, not both")
    xs = np.asarray(x, np.float64).ravel()
    ys = np.asarray(y, np.float64).ravel()
    ss = np.asarray(score, np.float64).ravel()
    if not len(xs) == len(ys) == len(ss):
        raise ValueError(f"x, y and score differ in length: {len(xs)}, {len(ys)}, {len(ss)}")
    if flagged is not None:
        hit = _flags(flagged)
        if len(hit) != len(xs):
            raise ValueError(f"flagged has {len(hit)} values for {len(xs)} cells")
        kind = "fraction_flagged"
    elif threshold is not None:
        hit = ss > float(threshold)
        kind = "fraction_above_threshold"
    else:
        hit = None
        kind = "max_score"

    window_px = window_um / mpp
    rows, cols = max(1, math.ceil(height / window_px)), max(1, math.ceil(width / window_px))
    keep = np.isfinite(xs) & np.isfinite(ys) & np.isfinite(ss)
    if counted is not None:
        use = _flags(counted)
        if len(use) != len(xs):
            raise ValueError(f"counted has {len(use)} values for {len(xs)} cells")
        keep &= use
    col = np.clip(np.floor(xs[keep] / window_px), 0, cols - 1).astype(np.int64)
    row = np.clip(np.floor(ys[keep] / window_px), 0, rows - 1).astype(np.int64)
    flat = row * cols + col
    counts = np.bincount(flat, minlength=rows * cols)
    empty = counts == 0
    if hit is not None:
        hits = np.bincount(flat, weights=hit[keep].astype(np.float64), minlength=rows * cols)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = hits / counts
    else:
        values = np.full(rows * cols, -np.inf)
        np.maximum.at(values, flat, ss[keep])
    values[empty] = np.nan
    return AbnormalityMap(
        values=values.reshape(rows, cols).astype(np.float32),
        counts=counts.reshape(rows, cols).astype(np.int32),
        window_px=float(window_px),
        mpp=float(mpp),
        window_um=float(window_um),
        kind=kind,
        threshold=None if threshold is None else float(threshold),
    )


def _flags(flagged) -> np.ndarray:
    """``flagged`` as bools, a missing flag (None, NaN) as False."""
    arr = np.asarray(flagged).ravel()
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind in "iuf":
        return np.nan_to_num(arr.astype(np.float64), nan=0.0) != 0
    return np.array([bool(f) and f == f for f in arr], dtype=bool)


#: the table's FDR flag column the map counts, first found first (cyto.stats.calibrate)
FLAG_COLUMNS = ("flagged_bh", "flagged_adaptive")


def map_of_table(
    table,
    width: int,
    height: int,
    mpp: float,
    window_um: float = WINDOW_UM,
    burden: dict | None = None,
    rank_by: str | None = None,
) -> AbnormalityMap:
    """:func:`abnormality_grid` of a score table (pyarrow).

    ``burden`` (the slide's ``summary["burden"]``) with status ``ok``: the fraction of cells
    above its ``threshold``, over its evaluable cells when it counted those
    (``counted == "evaluable"``, the table's ``evaluable`` column). Without one, a table that
    holds FDR flags (``flagged_bh``) gives the fraction flagged, and any other the maximum
    of what the cells are ranked by (``rank_by``, the summary's: the morphometric or fused
    score where the model's is not what ranks; the map followed the model's score while the
    cells were ranked by their morphometry: hostile round 25). The burden's threshold and the
    flags are of the score the calibration holds (the burden's ``column``: the model's, or the
    morphometric score of a bundle ranked by it)."""
    import pyarrow.compute as pc

    from cyto.data.morphometry import ranked_column

    names = set(table.column_names)
    x, y = table["x"].to_numpy(), table["y"].to_numpy()
    # the burden's threshold is of the score its calibration holds (cyto.data.morphometry.
    # calibrated_column: the morphometric score of a bundle ranked by it)
    held = (burden or {}).get("column") or "score"
    xy = (x, y, table[held if held in names else "score"].to_numpy())
    if burden and burden.get("status") == "ok" and burden.get("threshold") is not None:
        counted = None
        if burden.get("counted") == "evaluable" and "evaluable" in names:
            counted = pc.fill_null(table["evaluable"], False).to_numpy(zero_copy_only=False)
        return abnormality_grid(
            *xy,
            width,
            height,
            mpp,
            window_um,
            threshold=float(burden["threshold"]),
            counted=counted,
        )
    flag = next((c for c in FLAG_COLUMNS if c in names), None)
    flagged = None
    if flag is not None:
        column = table[flag]
        if column.null_count < len(column):  # all null: the flags were withheld
            flagged = pc.fill_null(column, False).to_numpy(zero_copy_only=False)
    if flagged is not None:
        return abnormality_grid(*xy, width, height, mpp, window_um, flagged=flagged)
    ranked = pc.fill_null(table[ranked_column(names, rank_by)], float("nan"))
    return abnormality_grid(
        x, y, ranked.to_numpy(zero_copy_only=False), width, height, mpp, window_um
    )
