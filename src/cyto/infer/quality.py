"""The quality of each cell and of the slide's scanned area, for the adequacy rule
(:mod:`cyto.stats.adequacy`).

Per cell, measured where the crop is cut (:func:`crop_sharpness`, one vectorised call per tile
result in the tile worker) and from the table's positions at the end (:func:`cell_quality`):

- ``sharpness``: the variance of the Laplacian of the grey central half of the crop, at the
  model's input size; against the sharpness of the bundle's golden cells (training-distribution
  crops at the same size), a cell far below their spread is out of focus;
- crowded: more than :data:`CROWDED_OTHERS` other detections inside its crop (a smear at the
  model's scale shows about one), the measure of :func:`cyto.detect.crowding`;
- at a tile's edge (its crop crosses a border between the tile it was found in and the next)
  or at the slide's edge (its crop runs off the slide and is padded).

A cell is *evaluable* when it is in focus, not crowded and the slide's cells are at the model's
scale (:func:`cyto.data.scale.share_check`); edges are said, not held against it.
"""

from __future__ import annotations

import numpy as np

#: other detections inside a cell's crop above which the cell is crowded: a crop at the model's
#: scale holds about seven cells laid edge to edge, so five or more others mean cells that touch
#: or overlap (a cyto choice: 6% of the cells of a synthetic smear, 57% of one with 2.3 times
#: its cells; the slide-level warning of :mod:`cyto.infer.pipeline` asks a median above 6)
CROWDED_OTHERS = 4
#: a cell is out of focus below this share of the reference's low quantile (a cyto choice,
#: measured on synthetic slides: docs/how-to/adequacy.md)
FOCUS_SHARE = 1.0
#: the reference's quantile a cell's sharpness is held against
FOCUS_QUANTILE = 0.05
#: the quality flags, as they appear in the score table's ``quality`` column
FLAGS = ("out_of_focus", "crowded", "tile_edge", "slide_edge")
OK = "ok"


def crop_sharpness(crops) -> np.ndarray:
    """The sharpness of each crop (N, H, W, 3) uint8, host array or torch tensor: the variance
    of the 4-neighbour Laplacian of the grey central half (float32, higher = sharper).

    Vectorised over the crops (no per-cell loop); a tensor is measured where it lies."""
    n = len(crops)
    if n == 0:
        return np.empty(0, dtype=np.float32)
    s = crops.shape[1]
    q = s // 4
    if hasattr(crops, "cpu"):  # a torch tensor (crops decoded and cut on a device)
        grey = crops[:, q - 1 : s - q + 1, q - 1 : s - q + 1].float().mean(dim=3)
        lap = _laplacian(grey)
        return lap.reshape(n, -1).var(dim=1, unbiased=False).cpu().numpy().astype(np.float32)
    # the grey level times 3 in int16 (at most 765; its Laplacian within +-3060), then the
    # variance over 9: the float32 mean of the channels' answer, 3.3x faster at 224 px
    c = crops[:, q - 1 : s - q + 1, q - 1 : s - q + 1]
    grey3 = c[..., 0].astype(np.int16)
    grey3 += c[..., 1]
    grey3 += c[..., 2]
    lap = _laplacian(grey3).reshape(n, -1).astype(np.float32)
    lap -= lap.mean(axis=1, keepdims=True)
    return (np.square(lap).mean(axis=1) / 9.0).astype(np.float32)


def _laplacian(g):
    """The 4-neighbour Laplacian of (N, H, W) grey images, on their interior (H-2, W-2)."""
    return (
        g[:, :-2, 1:-1] + g[:, 2:, 1:-1] + g[:, 1:-1, :-2] + g[:, 1:-1, 2:] - 4 * g[:, 1:-1, 1:-1]
    )


def focus_reference(golden) -> dict | None:
    """The sharpness spread of the bundle's golden cells (their normal cells when labelled),
    and the threshold below which a cell is out of focus; None when the bundle has no real
    golden cells (random patches say nothing about focus)."""
    if golden is None or golden.kind != "cells" or not len(golden.images):
        return None
    images = golden.images
    if golden.labels is not None and (golden.labels == 0).sum() >= 8:
        images = images[golden.labels == 0]
    sharp = crop_sharpness(images)
    low = float(np.quantile(sharp, FOCUS_QUANTILE))
    return {
        "source": "the bundle's golden cells",
        "cells": int(len(sharp)),
        "median": round(float(np.median(sharp)), 3),
        f"q{int(FOCUS_QUANTILE * 100):02d}": round(low, 3),
        "threshold": round(FOCUS_SHARE * low, 3),
    }


def cell_quality(
    xy: np.ndarray,
    sharpness: np.ndarray,
    tiles: np.ndarray,
    *,
    crop_px: int,
    tile: int,
    width: int,
    height: int,
    grid_cols: int,
    focus_threshold: float | None,
) -> dict[str, np.ndarray]:
    """Per cell: ``out_of_focus``, ``crowded``, ``tile_edge``, ``slide_edge`` (bool arrays)
    and ``others`` (detections inside its crop), from the level-0 centres ``xy`` (N, 2), the
    crops' sharpness (NaN where unmeasured: never out of focus), the tile index of each
    (row-major on a grid of ``grid_cols``) and the slide's geometry."""
    from cyto.detect.points import others_in_crop

    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    n = len(xy)
    half = crop_px / 2.0
    others = others_in_crop(xy, crop_px)
    sharp = np.asarray(sharpness, dtype=np.float64)
    blurred = (
        np.zeros(n, dtype=bool)
        if focus_threshold is None
        else np.nan_to_num(sharp, nan=np.inf) < focus_threshold
    )
    tiles = np.asarray(tiles, dtype=np.int64)
    x0 = (tiles % grid_cols) * tile
    y0 = (tiles // grid_cols) * tile
    x, y = xy[:, 0], xy[:, 1]
    # a border between two tiles (the slide's own border is the slide edge)
    tile_edge = ((x - half < x0) & (x0 > 0)) | ((x + half > x0 + tile) & (x0 + tile < width))
    tile_edge |= ((y - half < y0) & (y0 > 0)) | ((y + half > y0 + tile) & (y0 + tile < height))
    slide_edge = (x - half < 0) | (y - half < 0) | (x + half > width) | (y + half > height)
    return {
        "out_of_focus": blurred,
        "crowded": others > CROWDED_OTHERS,
        "tile_edge": tile_edge,
        "slide_edge": slide_edge,
        "others": others,
    }


def quality_words(flags: dict[str, np.ndarray]) -> np.ndarray:
    """The ``quality`` column: each cell's flags joined by commas, or ``ok`` (vectorised over
    the 16 combinations, not per cell)."""
    n = len(flags["crowded"])
    code = np.zeros(n, dtype=np.int64)
    for bit, name in enumerate(FLAGS):
        code |= flags[name].astype(np.int64) << bit
    names = np.array(
        [
            ",".join(name for bit, name in enumerate(FLAGS) if c >> bit & 1) or OK
            for c in range(1 << len(FLAGS))
        ],
        dtype=object,
    )
    return names[code]


def area_shares(
    tiles: np.ndarray, crowded: np.ndarray, n_tissue_tiles: int, n_grid_tiles: int
) -> dict:
    """The slide's area by tile: the share skipped (no tissue in the mask, never read), the
    share of the scanned tiles that held no cell (glass the mask let through, or obscured),
    the share of the slide that was either (``glass_or_skipped_share``: no cell to read there),
    and the share of the scanned tiles that is crowded (most of its cells crowded)."""
    tiles = np.asarray(tiles, dtype=np.int64)
    scanned = max(n_tissue_tiles, 1)
    with_cells, at = np.unique(tiles, return_inverse=True)
    crowded_tiles = 0
    if len(with_cells):
        share = np.bincount(at, weights=crowded.astype(np.float64)) / np.bincount(at)
        crowded_tiles = int((share > 0.5).sum())
    return {
        "tiles_scanned": int(n_tissue_tiles),
        "tiles_on_slide": int(n_grid_tiles),
        "tiles_with_cells": int(len(with_cells)),
        "skipped_share": round(1.0 - n_tissue_tiles / max(n_grid_tiles, 1), 4),
        "empty_scanned_share": round(max(n_tissue_tiles - len(with_cells), 0) / scanned, 4),
        "glass_or_skipped_share": round(1.0 - len(with_cells) / max(n_grid_tiles, 1), 4),
        "crowded_area_share": round(crowded_tiles / scanned, 4),
    }


def slide_adequacy(
    table,
    rule,
    *,
    reference: dict | None,
    scale: dict | None,
    stain: dict | None = None,
    crop_px: int,
    tile: int,
    size: tuple[int, int],
    n_tissue_tiles: int,
    detection: str,
    mpp_ratio: float | None = None,
) -> tuple[dict, dict]:
    """(score-table columns, ``summary["adequacy"]``) of a slide's score ``table`` judged by
    ``rule`` (:mod:`cyto.stats.adequacy`): the columns ``quality`` (flags, :data:`FLAGS`, or
    ``ok``) and ``evaluable``; the block holds the result, its reasons and every measure.

    Crowding is held against a cell only under ``detection == "smear"``: the nuclei of a
    section (``--detection tissue``) touch by nature; the flag is still written. ``mpp_ratio``:
    the model's mpp over the slide's when the crops are not resampled to it (``--rescale``):
    more than :data:`~cyto.data.scale.ADVISE_ZOOM` off, the cells are off scale whatever the
    detection. ``stain``: the first cells' stain check (:func:`cyto.detect.stain.stain_check`),
    its angle and whether it was said, as ``cell_stain``."""
    from cyto.stats.adequacy import judge

    width, height = size
    cols = -(-width // tile)
    n = table.num_rows
    xy = np.column_stack([table["x"].to_numpy(), table["y"].to_numpy()]) if n else np.empty((0, 2))
    sharp = (
        np.asarray(table["sharpness"].to_numpy(zero_copy_only=False), dtype=np.float64)
        if n
        else np.empty(0)
    )
    tiles = table["tile"].to_numpy() if n else np.empty(0, dtype=np.int64)
    threshold = reference["threshold"] if reference is not None else None
    flags = cell_quality(
        xy,
        sharp,
        tiles,
        crop_px=crop_px,
        tile=tile,
        width=width,
        height=height,
        grid_cols=cols,
        focus_threshold=threshold,
    )
    counted = detection == "smear"
    # the scale check's advice (given under smear detection only: a section's touching nuclei
    # fool the nucleus share); cells that look larger are not judged when most cells are out of
    # focus or crowded: blur spreads a nucleus and touching cells join theirs (a defocused
    # slide's cells looked 1.3x larger, a crowded one's 1.5x: docs/how-to/adequacy.md), while
    # neither makes a cell look smaller
    blurred = float(flags["out_of_focus"].mean()) if n else 0.0
    packed = float(flags["crowded"].mean()) if n and counted else 0.0
    larger = bool(scale and (scale.get("factor") or 1.0) < 1.0)
    # ... unless the crops were cut at another side than the model's (--patch-size): then the
    # blur is the resize's, and the scale is the cause to say (a 64 px cut for a 96 px model
    # read "100% out of focus": hostile round 12, N23)
    cut = bool(scale and (scale.get("cut_by") or scale.get("detection_differs")))
    scale_judged = not larger or (blurred <= 0.5 and packed <= 0.5) or cut
    from cyto.data.scale import ADVISE_ZOOM

    mpp_off = mpp_ratio is not None and not 1 / ADVISE_ZOOM <= mpp_ratio <= ADVISE_ZOOM
    # the cells look as the model's where the recorded resolutions say they cannot: the slide's
    # recorded mpp is the suspect (a slide at 0.258 um/px recorded as 0.5 was "unsatisfactory,
    # 0 evaluable cells" while its cells matched the model: hostile round 18); judged as they look
    mpp_off = mpp_off and not bool(scale and scale.get("mpp_contradicted"))
    off_scale = (bool(scale and scale.get("advised")) and scale_judged) or mpp_off
    bad = flags["out_of_focus"] | (flags["crowded"] if counted else False)
    evaluable = ~bad & (not off_scale)
    measured = np.isfinite(sharp)
    shares = area_shares(tiles, flags["crowded"], n_tissue_tiles, -(-height // tile) * cols)
    m = {
        "cells_detected": int(n),
        "cells_evaluable": int(evaluable.sum()),
        "not_evaluable_share": round(float(1 - evaluable.mean()), 4) if n else None,
        "out_of_focus_share": (
            round(float(flags["out_of_focus"].mean()), 4) if n and threshold is not None else None
        ),
        "crowded_share": round(float(flags["crowded"].mean()), 4) if n else 0.0,
        "crowding_counted": counted,
        "crowding_crop_px": int(crop_px),
        "crowding_others": CROWDED_OTHERS,
        "at_tile_edge_share": round(float(flags["tile_edge"].mean()), 4) if n else 0.0,
        "at_slide_edge_share": round(float(flags["slide_edge"].mean()), 4) if n else 0.0,
        **shares,
        "median_sharpness": round(float(np.median(sharp[measured])), 3) if measured.any() else None,
        "focus_reference": reference,
        "cell_scale": None
        if not scale and not mpp_off
        else {
            "factor": (scale or {}).get("factor"),
            "off_scale": off_scale if scale_judged or mpp_off else None,
            "median_nucleus_share": (scale or {}).get("median_nucleus_share"),
            "model_nucleus_share": (scale or {}).get("model_nucleus_share"),
            # the model's mpp over the slide's, crops not resampled (None: --rescale, or unknown)
            "mpp_ratio": mpp_ratio,
            "mpp_off_scale": mpp_off,
            # the cells' own look contradicts the recorded resolutions (the check's words)
            "mpp_contradicted": bool((scale or {}).get("mpp_contradicted")),
            # they look larger at a resolution recorded as the model's: a lesion or a wrong mpp
            "larger_at_recorded_mpp": bool((scale or {}).get("larger_at_recorded_mpp")),
            # the --patch-size that makes them look so (None: not one the user gave)
            "cut_by": (scale or {}).get("cut_by"),
            # the --detection that makes them look so (None: the model's stain's own)
            "detection_differs": (scale or {}).get("detection_differs"),
            # what is left to pass, in the caller's words (cyto.flags.to_pass; None: all given)
            **({"to_pass": scale["to_pass"]} if scale and "to_pass" in scale else {}),
        },
    }
    if stain is not None:
        m["cell_stain"] = {"degrees": stain.get("degrees"), "advised": bool(stain.get("advised"))}
    if reference is None:
        m["focus_not_checked"] = "the bundle has no real golden cells to hold sharpness against"
    block = judge(rule, m)
    return {"quality": quality_words(flags), "evaluable": evaluable}, block
