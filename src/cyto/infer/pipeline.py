"""Score every cell of a slide: tiles -> nuclei -> crops -> engine -> kernel -> Parquet.

This first version runs in one process: tiles are read in row-major order with a margin, tiles
without tissue (by a low-resolution mask) are skipped, nuclei are detected (or taken from a file),
cells are cut from the decoded tile, batched through the exported ONNX graph (or PyTorch) and the
numba kernel, and streamed to a Parquet file in row groups. The final files appear by atomic
rename. Outputs: scores.parquet, topk.parquet, topk.geojson (QuPath points), ranked and blinded
mosaics with a key, summary.json. Not yet: worker processes, resume, focal-plane choice.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cyto import __version__
from cyto.data.images import resize_rgb
from cyto.errors import ConfigError
from cyto.infer.nuclei import NucleusParams, detect_nuclei, read_nuclei_file
from cyto.infer.patches import crop_cells
from cyto.infer.slide import open_slide
from cyto.progress import progress


@dataclass(frozen=True)
class ScoreOptions:
    patch_size: int = 192
    tile: int = 1024
    batch_size: int = 64
    top_k: int = 400
    mosaic: int = 100
    backend: str = "onnx"  # onnx | torch
    nuclei: Path | None = None
    truth: Path | None = None  # ground-truth cells (x, y, label) to report Recall@K
    truth_radius: float = 20.0
    detection: NucleusParams = field(default_factory=NucleusParams)

    def __post_init__(self) -> None:
        if self.patch_size < 16 or self.tile < self.patch_size or self.batch_size < 1:
            raise ConfigError("need patch_size >= 16, tile >= patch_size and batch_size >= 1")
        if self.backend not in ("onnx", "torch"):
            raise ConfigError(f"backend must be onnx or torch here, got {self.backend!r}")
        if self.top_k < 1 or self.mosaic < 0:
            raise ConfigError("top_k must be >= 1 and mosaic >= 0")


def _tissue_mask(reader) -> tuple[np.ndarray, float]:
    """Boolean mask at the lowest level (True = not blank glass) and its downsample."""
    from scipy import ndimage

    level = len(reader.info.level_dims) - 1
    w, h = reader.info.level_dims[level]
    low = reader.read_region(0, 0, w, h, level=level).astype(np.float32)
    od = -np.log((low + 1.0) / 256.0).sum(axis=2)
    mask = ndimage.binary_dilation(od > 0.25, iterations=3)
    return mask, reader.info.level_downsamples[level]


def _scorer(model: Path, backend: str):
    if backend == "onnx":
        from cyto.export.onnx import OnnxScorer

        return OnnxScorer.open(model)
    from cyto.models.from_bundle import load_scorer

    return load_scorer(model)


def score_slide(
    slide: Path, model: Path, out_dir: Path, opts: ScoreOptions = ScoreOptions(), echo=print
) -> dict:
    """Score one slide into ``out_dir``; returns the summary (also written as summary.json)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scorer = _scorer(Path(model), opts.backend)
    load_size = scorer.bundle.manifest["config"].get("load_size")
    reader = open_slide(slide)
    info = reader.info
    timings = {"read": 0.0, "detect": 0.0, "crop": 0.0, "score": 0.0, "write": 0.0}
    mask, mask_ds = _tissue_mask(reader)
    given = None
    if opts.nuclei is not None:
        given = read_nuclei_file(opts.nuclei, info.width, info.height)
    half = opts.patch_size // 2
    margin = half + 32
    schema = pa.schema(
        [
            ("slide_id", pa.string()),
            ("cell_id", pa.int64()),
            ("x", pa.float64()),
            ("y", pa.float64()),
            ("nucleus_area", pa.float64()),
            ("score", pa.float64()),
            ("tile", pa.int64()),
        ]
    )
    partial = out_dir / ".scores.partial.parquet"
    writer = pq.ParquetWriter(partial, schema)
    slide_id = Path(slide).stem
    n_cells = 0
    tiles = [
        (x, y) for y in range(0, info.height, opts.tile) for x in range(0, info.width, opts.tile)
    ]
    pending: list[tuple[np.ndarray, np.ndarray, int]] = []
    given_by_tile: dict[int, np.ndarray] = {}
    if given is not None:  # bucket the file's points by tile once, not once per tile
        cols = -(-info.width // opts.tile)
        tile_of = (given[:, 1] // opts.tile).astype(np.int64) * cols + (
            given[:, 0] // opts.tile
        ).astype(np.int64)
        pts = np.column_stack([given, np.zeros(len(given))])
        for t in np.unique(tile_of):
            given_by_tile[int(t)] = pts[tile_of == t]

    def flush() -> None:
        nonlocal n_cells
        if not pending:
            return
        crops = np.concatenate([p[0] for p in pending])
        meta = np.concatenate([p[1] for p in pending])
        tile_ids = np.concatenate([np.full(len(p[1]), p[2]) for p in pending])
        t0 = time.perf_counter()
        if load_size and load_size != crops.shape[1]:
            # the model saw patches resized at load time (area filter): do the same here
            crops = np.stack([resize_rgb(c, load_size) for c in crops])
        scores = scorer.score(crops, opts.batch_size)
        timings["score"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = np.arange(n_cells, n_cells + len(crops))
        writer.write_table(
            pa.table(
                {
                    "slide_id": [slide_id] * len(crops),
                    "cell_id": ids,
                    "x": meta[:, 0],
                    "y": meta[:, 1],
                    "nucleus_area": meta[:, 2],
                    "score": scores,
                    "tile": tile_ids,
                },
                schema=schema,
            )
        )
        timings["write"] += time.perf_counter() - t0
        n_cells += len(crops)
        pending.clear()

    with progress(f"score {Path(slide).name}", total=len(tiles), unit="tiles") as bar:
        for t_index, (x0, y0) in enumerate(tiles):
            mx0, my0 = int(x0 / mask_ds), int(y0 / mask_ds)
            mx1, my1 = int((x0 + opts.tile) / mask_ds) + 1, int((y0 + opts.tile) / mask_ds) + 1
            if not mask[my0:my1, mx0:mx1].any():
                bar.advance()
                continue
            t0 = time.perf_counter()
            tile = reader.read_region(
                x0 - margin, y0 - margin, opts.tile + 2 * margin, opts.tile + 2 * margin
            )
            timings["read"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            if given is None:
                found = detect_nuclei(tile, opts.detection)
                found[:, 0] += x0 - margin
                found[:, 1] += y0 - margin
            else:
                found = given_by_tile.get(t_index, np.empty((0, 3)))
            inside = (
                (found[:, 0] >= x0)
                & (found[:, 0] < x0 + opts.tile)
                & (found[:, 1] >= y0)
                & (found[:, 1] < y0 + opts.tile)
            )
            found = found[inside]
            timings["detect"] += time.perf_counter() - t0
            if len(found):
                t0 = time.perf_counter()
                crops = crop_cells(tile, x0 - margin, y0 - margin, found, opts.patch_size)
                timings["crop"] += time.perf_counter() - t0
                pending.append((crops, found, t_index))
                if sum(len(p[1]) for p in pending) >= 4 * opts.batch_size:
                    flush()
            bar.advance()
            bar.set_postfix(f"{n_cells + sum(len(p[1]) for p in pending)} cells")
        flush()
    writer.close()
    reader.close()
    return _finish(partial, out_dir, slide, model, scorer, opts, n_cells, timings, t_start, echo)


def _finish(partial, out_dir, slide, model, scorer, opts, n_cells, timings, t_start, echo):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.bundle import sha256_file

    table = pq.read_table(partial)
    scores = np.asarray(table["score"]) if n_cells else np.empty(0)
    order = np.argsort(-scores, kind="stable")
    rank = np.empty(len(scores), dtype=np.int64)
    rank[order] = np.arange(1, len(scores) + 1)
    table = table.append_column("rank", pa.array(rank))
    labels = truth_idx = None
    if opts.truth is not None and n_cells:
        labels, truth_idx, planted = _labels_from_truth(table, opts.truth, opts.truth_radius)
        table = table.append_column("label", pa.array(labels.astype(np.int8)))
    bundle = scorer.bundle
    meta = {
        "cyto.version": __version__,
        "cyto.model": str(model),
        "cyto.manifest_sha256": bundle.manifest_hash,
        "cyto.method": bundle.method,
        "cyto.slide": str(slide),
        "cyto.slide_sha256": sha256_file(Path(slide)),
        "cyto.backend": opts.backend,
        "cyto.timings": json.dumps(timings),
    }
    table = table.replace_schema_metadata(meta)
    final = out_dir / "scores.parquet"
    pq.write_table(table, partial, row_group_size=8192)
    os.replace(partial, final)
    k = min(opts.top_k, n_cells)
    top = table.take(pa.array(order[:k])) if k else table.slice(0, 0)
    pq.write_table(top, out_dir / "topk.parquet")
    write_geojson(table, order, k, out_dir / "topk.geojson")
    summary = {
        "slide": str(slide),
        "model": str(model),
        "method": bundle.method,
        "backend": opts.backend,
        "cells_scored": int(n_cells),
        "seconds": round(time.perf_counter() - t_start, 2),
        "timings_s": {k2: round(v, 2) for k2, v in timings.items()},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "slide_score_mean_top_k": float(scores[order[:k]].mean()) if k else None,
        "options": {k2: (str(v) if isinstance(v, Path) else v) for k2, v in asdict(opts).items()},
    }
    summary["cells_per_s"] = round(n_cells / max(summary["seconds"], 1e-9), 1)
    if n_cells == 0:
        echo(f"warning: no cells found in {slide}; wrote an empty score table")
    if labels is not None:
        from cyto.eval.metrics import all_metrics

        summary["truth"] = all_metrics(scores, labels, k)
        hit_cells = {
            int(j)
            for j in truth_idx[order[:k]]
            if j >= 0 and labels[np.flatnonzero(truth_idx == j)[0]] == 1
        }
        summary["truth"]["planted_abnormal"] = planted
        summary["truth"]["planted_found_in_top_k"] = len(hit_cells)
        summary["truth"]["planted_recall_at_k"] = len(hit_cells) / planted if planted else None
    if opts.mosaic and n_cells:
        summary["mosaic"] = str(_mosaic(slide, table, order, labels, opts, out_dir))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _labels_from_truth(table, truth: Path, radius: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Label each detected cell by the nearest ground-truth cell, if within ``radius`` (or 0.8
    of that cell's radius, when the truth table gives it).

    Returns (label per detection, matched truth index or -1, number of planted abnormal cells).
    """
    import pyarrow.parquet as pq
    from scipy.spatial import cKDTree

    gt = pq.read_table(truth)
    pts = np.stack([np.asarray(gt["x"]), np.asarray(gt["y"])], axis=1)
    dist, idx = cKDTree(pts).query(np.stack([np.asarray(table["x"]), np.asarray(table["y"])], 1))
    truth_labels = np.asarray(gt["label"])
    reach = np.full(len(pts), radius)
    if "cell_radius" in gt.column_names:  # a big cell's nucleus may be found off its centre
        reach = np.maximum(reach, 0.8 * np.asarray(gt["cell_radius"], dtype=np.float64))
    hit = dist <= reach[idx]
    labels = np.where(hit, truth_labels[idx], 0).astype(np.int64)
    return labels, np.where(hit, idx, -1), int(truth_labels.sum())


def _mosaic(slide, table, order, labels, opts, out_dir: Path) -> Path:
    """Review mosaics of the top cells, 10 per row.

    ``topk_mosaic.png`` is in ranked order, with true abnormal cells (when ground truth is given)
    boxed with an x. ``topk_mosaic_blinded.png`` shows the same cells in a random order without
    marks, for blinded review as in the paper; ``topk_mosaic_blinded_key.json`` maps each grid
    position to its cell and rank.
    """
    from PIL import Image, ImageDraw

    n = min(opts.mosaic, len(order))
    side, cols = 96, 10
    rows = -(-n // cols)
    reader = open_slide(slide)
    xs, ys = np.asarray(table["x"]), np.asarray(table["y"])
    ids = np.asarray(table["cell_id"])
    half = opts.patch_size // 2
    tiles = []
    for i in order[:n]:
        crop = reader.read_region(
            int(round(xs[i])) - half, int(round(ys[i])) - half, opts.patch_size, opts.patch_size
        )
        tiles.append(Image.fromarray(crop).resize((side, side), Image.Resampling.BILINEAR))
    reader.close()

    def grid(sequence: list[int], marks: bool) -> Image.Image:
        canvas = Image.new("RGB", (cols * side, rows * side), "white")
        draw = ImageDraw.Draw(canvas)
        for pos, k in enumerate(sequence):
            cx, cy = (pos % cols) * side, (pos // cols) * side
            canvas.paste(tiles[k], (cx, cy))
            if marks and labels is not None and labels[order[k]] == 1:
                draw.rectangle(
                    [cx + 1, cy + 1, cx + side - 2, cy + side - 2], outline="white", width=3
                )
                draw.line([cx + 6, cy + 6, cx + 20, cy + 20], fill="white", width=3)
                draw.line([cx + 20, cy + 6, cx + 6, cy + 20], fill="white", width=3)
        return canvas

    path = out_dir / "topk_mosaic.png"
    grid(list(range(n)), marks=True).save(path)
    shuffled = [int(k) for k in np.random.default_rng(0).permutation(n)]
    grid(shuffled, marks=False).save(out_dir / "topk_mosaic_blinded.png")
    key = [
        {
            "position": pos,
            "row": pos // cols,
            "col": pos % cols,
            "cell_id": int(ids[order[k]]),
            "rank": k + 1,
        }
        for pos, k in enumerate(shuffled)
    ]
    (out_dir / "topk_mosaic_blinded_key.json").write_text(json.dumps(key, indent=1))
    return path


def write_geojson(table, order, k: int, path: Path) -> Path:
    """The top-K cells as GeoJSON points (level-0 pixels) that QuPath imports as detections."""
    xs, ys = np.asarray(table["x"]), np.asarray(table["y"])
    scores, ids = np.asarray(table["score"]), np.asarray(table["cell_id"])
    features = [
        {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [float(xs[i]), float(ys[i])]},
            "properties": {
                "objectType": "detection",
                "name": f"rank {r + 1}",
                "classification": {"name": "cyto top-K"},
                "measurements": {"score": float(scores[i]), "rank": r + 1, "cell_id": int(ids[i])},
            },
        }
        for r, i in enumerate(order[:k])
    ]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path
