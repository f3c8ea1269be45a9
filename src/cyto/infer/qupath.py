"""Outputs that QuPath (v0.4 to v0.6) opens as they are: every cell as a detection object with its
measurements (``cells.geojson``; ``topk.geojson`` is the same writer over the top-K rows), and
the abnormality map (:mod:`cyto.infer.maps`) as a pyramidal, tiled OME-TIFF at its physical
resolution (``abnormality.ome.tif``).

The GeoJSON follows what QuPath's own reader takes (``qupath-core``, ``qupath/lib/io/``:
``QuPathTypeAdapters.PathObjectTypeAdapter.parseObject``, ``ROITypeAdapters.ROITypeAdapter.read``,
``GsonTools.PathClassTypeAdapter.read``; ``PathObjectTypeAdapters`` before v0.4):

- ``properties.objectType: "detection"``: a detection object (without it QuPath makes an
  annotation, and 10^5 annotations make QuPath crawl);
- ``properties.measurements``: a map of name to number. QuPath v0.4 and v0.5 read it as
  ``Map<String, Double>``, so a value must be a JSON number: flags are written 0/1, and a missing
  value (no p-value in an uncalibrated run) is left out rather than written null;
- ``properties.classification``: ``{"name", "color": [r, g, b]}``. QuPath reads an object
  classification only when it has both (``name`` alone raises "Unable to parse PathClass"), so
  each class carries its colour;
- ``geometry``: the nucleus as a closed octagon (a JTS ring must be closed) of the nucleus's
  radius with the foreign member ``isEllipse: true``, from which QuPath makes an ellipse ROI (a
  circle) of the octagon's bounds; any other GeoJSON reader sees the octagon. Level-0 pixels,
  the frame QuPath uses for the slide; two decimals, as QuPath writes its own;
- ``name``: ``rank N``. No ``id`` (QuPath gives each object a UUID), no ``isLocked``.

The file is written feature by feature from row batches (a Parquet table is read a batch at a
time), so 10^5 cells take the memory of one batch, and it appears by atomic rename.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from cyto.infer.maps import AbnormalityMap
from cyto.slides.remote import is_url
from cyto.tables import parquet_file

CELLS_GEOJSON = "cells.geojson"
MAP_TIFF = "abnormality.ome.tif"
#: what ``cyto score --qupath`` may name, and the file each writes
QUPATH_FILES = {"cells": CELLS_GEOJSON, "map": MAP_TIFF}
#: the QuPath classes cyto gives cells: (name, RGB colour); a flagged cell is shown flagged
FLAGGED_CLASS = ("cyto flagged", (220, 20, 60))
TOP_K_CLASS = ("cyto top-K", (255, 140, 0))
#: the nucleus radius drawn (um) when the table gives no area (points from --nuclei)
NUCLEUS_RADIUS_UM = 4.0
#: table columns that are the geometry, not measurements
_GEOMETRY = ("x", "y")
#: rows per batch read from a Parquet table
BATCH_ROWS = 8192
#: the octagon's corners around a centre, as multiples of the radius (closed: the first again)
_ANGLES = np.arange(9) * (np.pi / 4)
_OCTAGON = np.stack([np.cos(_ANGLES), np.sin(_ANGLES)], axis=1)
_OCTAGON[-1] = _OCTAGON[0]
_RING = ",".join(["[%.2f,%.2f]"] * 9)


def measurement_columns(schema) -> list[str]:
    """The columns of a score table (pyarrow schema) written as QuPath measurements: every
    number and flag (integer, float, bool) except the centre, which is the geometry; text
    columns (``slide_id``, ``quality``) are not numbers QuPath can map."""
    import pyarrow.types as pt

    return [
        f.name
        for f in schema
        if f.name not in _GEOMETRY
        and (pt.is_integer(f.type) or pt.is_floating(f.type) or pt.is_boolean(f.type))
    ]


def _numbers(column) -> list[str | None]:
    """A column (pyarrow) as JSON numbers, a flag as 0/1; None where there is none to write
    (null, NaN, infinite)."""
    import pyarrow.types as pt

    values = column.to_pylist()
    if pt.is_boolean(column.type):
        return [None if v is None else ("1" if v else "0") for v in values]
    if pt.is_integer(column.type):
        return [None if v is None else str(v) for v in values]
    return [None if v is None or not math.isfinite(v) else repr(v) for v in values]


def _classification(name: str, rgb: tuple[int, int, int]) -> str:
    return f'"classification":{{"name":{json.dumps(name)},"color":[{rgb[0]},{rgb[1]},{rgb[2]}]}},'


_CLASSES = {"flagged": _classification(*FLAGGED_CLASS), "top": _classification(*TOP_K_CLASS)}


def _features(batch, columns: list[str], top_k: int, radius_px: float) -> Iterable[str]:
    """The GeoJSON features of one batch of rows, one string each."""
    n = batch.num_rows
    if n == 0:
        return
    names = batch.schema.names
    xs = batch.column(names.index("x")).to_numpy(zero_copy_only=False).astype(np.float64)
    ys = batch.column(names.index("y")).to_numpy(zero_copy_only=False).astype(np.float64)
    radius = np.full(n, radius_px)
    if "nucleus_area" in names:
        area = batch.column(names.index("nucleus_area")).to_pylist()
        area = np.array([np.nan if a is None else a for a in area], dtype=np.float64)
        found = np.isfinite(area) & (area > 0)
        radius[found] = np.sqrt(area[found] / np.pi)
    ring_x = xs[:, None] + radius[:, None] * _OCTAGON[None, :, 0]
    ring_y = ys[:, None] + radius[:, None] * _OCTAGON[None, :, 1]
    ring = np.stack([ring_x, ring_y], axis=2).reshape(n, 18)
    # each measurement as "name":number, per column; per row the ones it has
    texts = [
        [None if t is None else key + t for t in _numbers(batch.column(names.index(c)))]
        for c in columns
        for key in (json.dumps(c) + ":",)
    ]
    rows = zip(*texts, strict=True) if texts else ((),) * n
    ranks = batch.column(names.index("rank")).to_pylist() if "rank" in names else [None] * n
    flags = (
        batch.column(names.index("flagged_bh")).to_pylist() if "flagged_bh" in names else [None] * n
    )
    placed = (np.isfinite(xs) & np.isfinite(ys)).tolist()  # no centre, no geometry: left out
    for coords, row, rank, flag, ok in zip(ring.tolist(), rows, ranks, flags, placed, strict=True):
        if not ok:
            continue
        if flag:
            cls = _CLASSES["flagged"]
        elif rank is not None and rank <= top_k:
            cls = _CLASSES["top"]
        else:
            cls = ""
        name = f'"name":"rank {rank}",' if rank is not None else ""
        yield (
            '{"type":"Feature","geometry":{"type":"Polygon","coordinates":[['
            + _RING % tuple(coords)
            + ']],"isEllipse":true},"properties":{"objectType":"detection",'
            + name
            + cls
            + '"measurements":{'
            + ",".join([t for t in row if t is not None])
            + "}}}"
        )


def write_detections(batches: Iterable, path: Path, *, top_k: int, radius_px: float) -> int:
    """Write row ``batches`` (pyarrow record batches or tables of a score table: ``x``, ``y``,
    and the columns :func:`measurement_columns` takes) to ``path`` as a GeoJSON
    FeatureCollection of QuPath detections (the module's docstring says which fields QuPath
    reads); cells ranked within ``top_k`` are classed ``cyto top-K``, FDR-flagged cells
    ``cyto flagged``. ``radius_px``: the nucleus radius (level-0 px) where the table gives no
    ``nucleus_area``; a row without a finite centre is left out. Written one batch at a time,
    to a hidden file renamed into place at the end. Returns the number of features."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.tmp")
    count = 0
    columns: list[str] | None = None
    try:
        with open(partial, "w", encoding="utf-8") as fh:
            fh.write('{"type":"FeatureCollection","features":[')
            for batch in batches:
                # a table: its record batches
                chunks = batch.to_batches() if hasattr(batch, "to_batches") else [batch]
                for chunk in chunks:
                    if columns is None:
                        columns = measurement_columns(chunk.schema)
                    for feature in _features(chunk, columns, top_k, radius_px):
                        fh.write(("\n" if count == 0 else ",\n") + feature)
                        count += 1
            fh.write("\n]}\n")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return count


def nucleus_radius_px(mpp: float | None) -> float:
    """The radius drawn for a cell without a nucleus area: :data:`NUCLEUS_RADIUS_UM` at ``mpp``
    (8 px when the slide records no resolution)."""
    return NUCLEUS_RADIUS_UM / mpp if mpp else 8.0


def write_cells_geojson(
    table_path: Path, path: Path, *, top_k: int, mpp: float | None, batch_rows: int = BATCH_ROWS
) -> int:
    """Every cell of the score table at ``table_path`` (Parquet) as QuPath detections at
    ``path`` (:func:`write_detections`), read ``batch_rows`` rows at a time. Returns the number
    of cells written."""
    # no pre-buffering or threaded read-ahead: they hold row groups ahead of the writer, a
    # memory that grows with the table (47 MB at 4 x 10^5 cells, 18 MB without)
    parquet = parquet_file(table_path, pre_buffer=False)
    return write_detections(
        parquet.iter_batches(batch_size=batch_rows, use_threads=False),
        path,
        top_k=top_k,
        radius_px=nucleus_radius_px(mpp),
    )


# -- the abnormality map as an OME-TIFF -------------------------------------------------------

#: tile side of the map's TIFF (a multiple of 16); levels are halved until one tile holds them
MAP_TILE = 128


def map_scale(m: AbnormalityMap) -> dict:
    """How the map's uint8 pixels read back as values: 0 = a window without cells, else
    ``value = low + (pixel - 1) * (high - low) / 254``. Fractions span [0, 1]; the maximum score
    spans the map's own lowest and highest window (a slide's scale, not comparable across
    slides)."""
    if m.is_fraction:
        low, high = 0.0, 1.0
    else:
        finite = m.values[np.isfinite(m.values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    return {
        "kind": m.kind,
        "no_cells": 0,
        "low": low,
        "high": high,
        "formula": "value = low + (pixel - 1) * (high - low) / 254; pixel 0: no cells",
        "window_um": m.window_um,
        "window_px_level0": m.window_px,
        "slide_mpp": m.mpp,
    }


def encode_map(m: AbnormalityMap) -> tuple[np.ndarray, dict]:
    """The map as uint8 pixels and their scale (:func:`map_scale`)."""
    scale = map_scale(m)
    low, high = scale["low"], scale["high"]
    values = m.values.astype(np.float64)
    empty = ~np.isfinite(values)
    span = high - low
    with np.errstate(invalid="ignore"):
        steps = np.rint((values - low) / span * 254) if span > 0 else np.full(values.shape, 254.0)
    pixels = np.where(empty, 0, 1 + np.clip(np.nan_to_num(steps), 0, 254)).astype(np.uint8)
    return pixels, scale


def decode_map(pixels: np.ndarray, scale: dict) -> np.ndarray:
    """Values (NaN: no cells) from the map's uint8 pixels and their scale (:func:`map_scale`)."""
    pixels = np.asarray(pixels, dtype=np.float64)
    values = scale["low"] + (pixels - 1) * (scale["high"] - scale["low"]) / 254
    return np.where(pixels == 0, np.nan, values)


def pyramid(pixels: np.ndarray, tile: int = MAP_TILE) -> list[np.ndarray]:
    """The map and its halvings, each pixel the highest of the 2 x 2 below it (a hot spot stays
    visible zoomed out; 0, no cells, is the lowest), until a level fits one tile."""
    levels = [pixels]
    while max(levels[-1].shape) > tile:
        a = levels[-1]
        h, w = a.shape
        padded = np.zeros((h + h % 2, w + w % 2), dtype=a.dtype)
        padded[:h, :w] = a
        levels.append(padded.reshape(padded.shape[0] // 2, 2, padded.shape[1] // 2, 2).max((1, 3)))
    return levels


def write_map_tiff(m: AbnormalityMap, path: Path, *, tile: int = MAP_TILE) -> dict:
    """The abnormality map as a pyramidal, tiled OME-TIFF at ``path``: one uint8 channel
    (:func:`encode_map`), ``PhysicalSizeX/Y`` = the window side in um, the TIFF resolution tags
    likewise (pixels per cm), sub-resolution levels as SubIFDs of the first image (the OME-TIFF
    pyramid QuPath and Bio-Formats read) and the scale as an OME ``MapAnnotation``. Written to
    a hidden file renamed into place. Returns the scale."""
    import tifffile

    pixels, scale = encode_map(m)
    levels = pyramid(pixels, tile)
    per_cm = 1e4 / m.window_um
    metadata = {
        "axes": "YX",
        "Name": f"cyto abnormality map ({m.kind.replace('_', ' ')}, {m.window_um:g} um windows)",
        "PhysicalSizeX": m.window_um,
        "PhysicalSizeXUnit": "µm",
        "PhysicalSizeY": m.window_um,
        "PhysicalSizeYUnit": "µm",
        "MapAnnotation": {f"cyto.{k}": str(v) for k, v in scale.items()},
    }
    options = {"tile": (tile, tile), "photometric": "minisblack", "compression": "zlib"}
    path = Path(path)
    partial = path.with_name(f".{path.name}.tmp")
    try:
        with tifffile.TiffWriter(partial, ome=True) as tif:
            tif.write(
                levels[0],
                subifds=len(levels) - 1,
                resolution=(per_cm, per_cm),
                resolutionunit="CENTIMETER",
                metadata=metadata,
                **options,
            )
            for i, level in enumerate(levels[1:], 1):
                f = per_cm / 2**i
                tif.write(
                    level,
                    subfiletype=1,
                    resolution=(f, f),
                    resolutionunit="CENTIMETER",
                    metadata=None,
                    **options,
                )
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return {**scale, "levels": [list(level.shape) for level in levels]}


# -- a slide's QuPath outputs -----------------------------------------------------------------


def write_qupath(
    table,
    out_dir: Path,
    which: tuple[str, ...],
    *,
    top_k: int,
    slide: Path,
    mpp: float | None,
    assumed_mpp: float,
    window_um: float,
    burden: dict | None = None,
    rank_by: str | None = None,
) -> dict[str, dict]:
    """Write the QuPath outputs ``which`` names (``cells``, ``map``; :data:`QUPATH_FILES`) of a
    ranked score ``table`` (pyarrow) into ``out_dir``, and remove those it does not name (another
    run's). ``mpp``: the slide's um/px (None: it records none, and the map's windows are cut at
    ``assumed_mpp``, said in the map's scale). Returns their entries for ``summary.json``'s
    ``outputs`` (:func:`cyto.infer.outputs.written_outputs`): each file's bytes, so a reuse finds
    a file cut short; the map's scale. ``burden``: the summary's burden block, whose threshold
    the map counts cells above (:func:`cyto.infer.maps.map_of_table`)."""
    from cyto.infer.maps import map_of_table
    from cyto.slides import open_slide

    out_dir = Path(out_dir)
    for key, name in QUPATH_FILES.items():
        if key not in which:
            (out_dir / name).unlink(missing_ok=True)
    out: dict[str, dict] = {}
    if "cells" in which:
        path = out_dir / CELLS_GEOJSON
        n = write_detections(
            table.to_batches(max_chunksize=BATCH_ROWS),
            path,
            top_k=top_k,
            radius_px=nucleus_radius_px(mpp),
        )
        out[CELLS_GEOJSON] = {"kind": "file", "bytes": path.stat().st_size, "features": n}
    if "map" in which:
        reader = open_slide(slide)
        try:
            width, height = reader.info.width, reader.info.height
        finally:
            reader.close()
        m = map_of_table(
            table, width, height, mpp or assumed_mpp, window_um, burden=burden, rank_by=rank_by
        )
        path = out_dir / MAP_TIFF
        scale = write_map_tiff(m, path)
        scale["slide_mpp_assumed"] = mpp is None
        out[MAP_TIFF] = {"kind": "file", "bytes": path.stat().st_size, "scale": scale}
    return out


def qupath_words(summaries: list[dict]) -> str | None:
    """The line ``cyto score`` ends with: where the QuPath outputs of the finished slides are
    and how to open them (None when none was written)."""
    names = [
        name
        for name in (CELLS_GEOJSON, MAP_TIFF)
        if any(name in (s.get("outputs") or {}) for s in summaries)
    ]
    if not names:
        return None
    folders = sorted({str(s.get("output")) for s in summaries if s.get("output")})
    where = folders[0] if len(folders) == 1 else "each slide's folder"
    # a folder in object storage holds nothing to drag: its files are fetched first, said once
    # with the tool that fetches them (round 61, 6; said before each file: round 74, 2)
    if folders and all(map(is_url, folders)):
        schemes = {f.split("://", 1)[0] for f in folders}
        tool = {"s3": "aws s3 cp --recursive", "gs": "gcloud storage cp --recursive"}
        how = f" (e.g. {tool[schemes.pop()]})" if len(schemes) == 1 and schemes <= set(tool) else ""
        head = f"QuPath: copy {where} to this machine{how}, then in that copy: "
    else:
        head = f"QuPath: in {where}: "
    parts = []
    if CELLS_GEOJSON in names:
        parts.append(
            f"drag {CELLS_GEOJSON} onto the slide open in QuPath (or File > Import objects from "
            "file...), then Measure > Show measurement maps"
        )
    if MAP_TIFF in names:
        parts.append(f"open {MAP_TIFF} as an image (one pixel per map window)")
    return head + "; ".join(parts) + " (docs/how-to/open-in-qupath.md)"
