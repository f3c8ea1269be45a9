"""Nucleus centres as points: read from files (CSV, Parquet, GeoJSON), matched against true
centres, and how crowded they are.

Files: CSV or Parquet with ``x`` and ``y`` columns, or GeoJSON points / polygons (QuPath's export;
a polygon gives its centroid), all in level-0 pixels. Points outside the slide are an error that
names how many and where. Points closer than :data:`SAME_POINT_PX` to an earlier one (a row
repeated by a merge of two exports, a polygon exported twice) are one nucleus: kept once, with a
warning that counts the others, so one cell never takes several ranks of the top K.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cyto.errors import CytoWarning, InputPathError, warn_caller
from cyto.tables import named_columns, number_column, one_line, read_table

#: points of a nuclei file closer than this (level-0 pixels, a quarter of a micrometre at 40x;
#: no two nuclei are that close) are the same nucleus given twice
SAME_POINT_PX = 1.0


def others_in_crop(xy: np.ndarray, crop_px: float) -> np.ndarray:
    """Per detection, how many other detections lie inside a ``crop_px`` square crop centred on
    it (level-0 pixels; int64, vectorised)."""
    from scipy.spatial import cKDTree

    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    if len(xy) < 2:
        return np.zeros(len(xy), dtype=np.int64)
    found = cKDTree(xy).query_ball_point(xy, crop_px / 2.0, p=np.inf, return_length=True)
    return np.asarray(found, dtype=np.int64) - 1


def crowding(xy: np.ndarray, crop_px: int, mpp: float | None) -> dict:
    """How crowded detections are: the median number of other detections inside a crop centred
    on each one, and the median nearest-neighbour distance (um when ``mpp`` is known, else px).

    A cytology smear at the model's scale shows about one cell per crop; dozens mean a tissue
    section, or a slide at another scale than the crops were made for.
    """
    from scipy.spatial import cKDTree

    xy = np.asarray(xy, dtype=np.float64)[:, :2]
    if len(xy) < 2:
        return {"cells": int(len(xy)), "median_others_per_crop": 0.0, "median_nn": None}
    dist, _ = cKDTree(xy).query(xy, k=2)
    others = others_in_crop(xy, crop_px)
    nn = float(np.median(dist[:, 1])) * (mpp or 1.0)
    return {
        "cells": int(len(xy)),
        "median_others_per_crop": float(np.median(others)),
        "median_nn": round(nn, 2),
        "nn_unit": "um" if mpp else "px",
    }


def match(detected: np.ndarray, truth: np.ndarray, radius: float) -> tuple[float, float]:
    """(recall, precision) of detections within ``radius`` of true centres (greedy, one-to-one)."""
    from scipy.spatial import cKDTree

    if len(truth) == 0 or len(detected) == 0:
        return (0.0 if len(truth) else 1.0), (0.0 if len(detected) else 1.0)
    tree = cKDTree(detected[:, :2])
    used = np.zeros(len(detected), dtype=bool)
    hits = 0
    for t in truth[:, :2]:
        for j in tree.query_ball_point(t, radius):
            if not used[j]:
                used[j] = True
                hits += 1
                break
    return hits / len(truth), used.sum() / len(detected)


def read_nuclei_file(path: Path, width: int, height: int) -> np.ndarray:
    """(N, 2) level-0 centres from CSV / Parquet (x, y columns) or GeoJSON, each nucleus once
    (see :func:`distinct_points`; a warning counts the repeats dropped)."""
    path = Path(path)
    if not path.is_file():
        raise InputPathError(f"nuclei file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".geojson", ".json"):
        pts = _geojson_points(path)
    elif suffix in (".csv", ".parquet", ".pq"):
        import pyarrow as pa

        try:
            table = read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputPathError(
                f"nuclei file {path} cannot be read as a table: {one_line(exc)}"
            ) from exc
        cols = named_columns(table, f"nuclei file {path}")
        if "x" not in cols or "y" not in cols:
            raise InputPathError(
                f"nuclei file {path} needs x and y columns (level-0 pixels); "
                f"it has {', '.join(table.column_names)}"
            )
        try:
            pts = np.stack([number_column(table[cols[c]]) for c in ("x", "y")], axis=1)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputPathError(
                f"nuclei file {path}: x and y must be numbers (level-0 pixels): {one_line(exc)}"
            ) from exc
    else:
        raise InputPathError(f"nuclei file {path}: expected .csv, .parquet or .geojson")
    missing = ~np.isfinite(pts).all(axis=1)
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise InputPathError(
            f"nuclei file {path}: {int(missing.sum())} point(s) without a numeric x and y "
            f"(first: point {row + 1})"
        )
    bad = (
        ~np.isfinite(pts).all(axis=1)
        | (pts[:, 0] < 0)
        | (pts[:, 1] < 0)
        | (pts[:, 0] >= width)
        | (pts[:, 1] >= height)
    )
    if bad.any():
        first = pts[np.flatnonzero(bad)[0]]
        raise InputPathError(
            f"nuclei file {path}: {int(bad.sum())} point(s) outside the "
            f"{width}x{height} slide (first at x={first[0]:g}, y={first[1]:g})"
        )
    keep = distinct_points(pts)
    dropped = len(pts) - int(keep.sum())
    if dropped:
        warn_caller(
            f"--nuclei {path}: {dropped} of {len(pts)} point(s) repeat another point within "
            f"{SAME_POINT_PX:g} level-0 pixel; each nucleus is scored once ({int(keep.sum())})",
            CytoWarning,
        )
    return pts[keep]


def distinct_points(pts: np.ndarray, radius: float = SAME_POINT_PX) -> np.ndarray:
    """A mask keeping each point of ``pts`` (N, 2) unless it lies closer than ``radius`` to an
    earlier kept point: exact repeats and near-repeats of one nucleus count once, in file
    order (a chain of points each under ``radius`` from the next keeps every other one)."""
    from scipy.spatial import cKDTree

    keep = np.ones(len(pts), dtype=bool)
    if len(pts) < 2:
        return keep
    # query_pairs takes pairs at most r apart; closer than ``radius`` is wanted
    pairs = cKDTree(pts).query_pairs(np.nextafter(radius, 0.0), output_type="ndarray")
    if not len(pairs):
        return keep
    earlier: dict[int, list[int]] = {}
    for i, j in pairs.tolist():  # i < j
        earlier.setdefault(j, []).append(i)
    for j in sorted(earlier):
        keep[j] = not any(keep[i] for i in earlier[j])
    return keep


def _geojson_points(path: Path) -> np.ndarray:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputPathError(f"nuclei file {path} is not valid GeoJSON: {exc}") from exc
    if not isinstance(data, (list, dict)):
        raise InputPathError(f"nuclei file {path} is not a GeoJSON FeatureCollection or feature")
    features = data if isinstance(data, list) else data.get("features", [data])
    if not isinstance(features, list):
        raise InputPathError(f"nuclei file {path}: its 'features' is not a list")
    pts = []
    for i, f in enumerate(features):
        if not isinstance(f, dict):
            raise InputPathError(f"nuclei file {path}: feature {i + 1} is not a GeoJSON object")
        geom = f.get("geometry") or {}
        if not isinstance(geom, dict):
            raise InputPathError(f"nuclei file {path}: feature {i + 1} has no GeoJSON geometry")
        kind, coords = geom.get("type"), geom.get("coordinates")
        try:
            if kind == "Point":
                pts.append(_xy(coords))
            elif kind == "MultiPoint":
                pts.extend(_xy(c) for c in coords)
            elif kind == "Polygon":
                ring = np.asarray([_xy(c) for c in coords[0]], dtype=np.float64)
                pts.append(ring[:-1].mean(axis=0) if len(ring) > 1 else ring[0])
        except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
            raise InputPathError(
                f"nuclei file {path}: feature {i + 1} ({kind}) has no valid x, y coordinates"
            ) from exc
    if not pts:
        raise InputPathError(f"nuclei file {path} holds no Point or Polygon features")
    return np.asarray(pts, dtype=np.float64).reshape(-1, 2)


def _xy(coords) -> tuple[float, float]:
    """The x, y of a GeoJSON position (a third coordinate is ignored)."""
    if len(coords) < 2:
        raise ValueError(f"a position needs x and y, got {coords!r}")
    return float(coords[0]), float(coords[1])
