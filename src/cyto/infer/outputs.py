"""What a scored slide leaves behind: the ranked score table, the top-K table and GeoJSON, the
review mosaics with their key, and the ground-truth labels of the cells when truth is given.

``scores.parquet`` appears by atomic rename; its file metadata names the model, the slide and its
checksum, the backend, device and precision, and the stage timings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cyto.errors import CytoWarning, InputPathError, warn_caller
from cyto.flags import passing
from cyto.slides import SLIDE_SUFFIXES, open_slide
from cyto.slides.base import printable
from cyto.slides.remote import redact, slide_bytes
from cyto.tables import json_text, named_columns, number_column, one_line, read_table
from cyto.version import __version__

MOSAIC_SIDE, MOSAIC_COLS = 96, 10


def ranks(scores: np.ndarray, then: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(order, rank): cells from most to least abnormal, and each cell's 1-based rank. Cells of
    equal ``scores`` are ordered by ``then`` (the model's score: a ranking other than the
    model's has ties, the one-sided morphometric score half of a folder's cells at 0), then by
    position. Without it, ties fell in input order, which in a labelled folder is class by
    class: on CRIC the abnormal classes, read before NILM, took the tied ranks first (AUROC by
    rank 0.874 where the scores give 0.833)."""
    scores = np.asarray(scores, dtype=np.float64)
    if then is None:
        order = np.argsort(-scores, kind="stable")
    else:
        order = np.lexsort((-np.asarray(then, dtype=np.float64), -scores))
    rank = np.empty(len(scores), dtype=np.int64)
    rank[order] = np.arange(1, len(scores) + 1)
    return order, rank


def read_truth(path: Path) -> dict[str, np.ndarray]:
    """A ground-truth table (CSV or Parquet: ``x``, ``y`` level-0 pixels, ``label`` 0/1,
    optional ``cell_radius``, and ``slide_id`` when it holds the cells of several slides) as
    arrays, or an :class:`InputPathError` naming what is wrong: read before any slide is scored,
    so a bad table costs nothing."""
    import pyarrow as pa

    if re.match(r"^(https?|s3|gs|gcs|dicomweb\+https?):/", str(path)):  # a URL read as a path
        url = re.sub(r"^([a-z0-9+]+):/+", r"\1://", str(path))
        raise InputPathError(
            f"{passing('truth', redact(url))}: a truth table is read from a local file; "
            "download it first"
        )
    path = Path(path)
    given = passing("truth", path)  # --truth PATH, or truth='PATH' from Python
    if path.is_dir():
        raise InputPathError(
            f"{given} is a folder: a truth table is a .parquet or .csv file of x, y, label"
        )
    if not path.is_file():
        raise InputPathError(f"{given} does not exist (a CSV or Parquet of x, y, label)")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise InputPathError(f"{given}: expected a .csv or .parquet table of x, y, label")
    try:
        gt = read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputPathError(f"{given} cannot be read as a table: {one_line(exc)}") from exc
    cols = named_columns(gt, given)
    missing = [c for c in ("x", "y", "label") if c not in cols]
    if missing:
        raise InputPathError(
            f"{given} needs columns x, y (level-0 pixels) and label (1 = abnormal); it "
            f"lacks {', '.join(missing)} (has {', '.join(gt.column_names) or 'none'})"
        )
    out = {}
    for name in ("x", "y", "label", "cell_radius"):
        if name not in cols:
            continue
        try:
            out[name] = number_column(gt[cols[name]])
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputPathError(f"{given}: {name} must be numbers: {one_line(exc)}") from exc
        if not np.isfinite(out[name]).all():
            raise InputPathError(f"{given}: {name} has empty or non-numeric values")
    if not np.isin(out["label"], (0, 1)).all():
        raise InputPathError(f"{given}: label must be 0 (normal) or 1 (abnormal)")
    out["label"] = out["label"].astype(np.int64)
    if "class" in cols:  # each truth cell's class (cyto synth slide --cells: a Bethesda class)
        out["class"] = np.array(
            ["" if v is None else str(v) for v in gt[cols["class"]].to_pylist()], dtype=object
        )
    if "slide_id" in cols:  # an empty value belongs to no slide; a column of none, to this one
        ids = ["" if v is None else str(v) for v in gt[cols["slide_id"]].to_pylist()]
        if any(ids):
            out["slide_id"] = np.array(ids, dtype=object)
    return out


#: a slide's ``summary.json`` truth block when ``--truth`` holds no cell of it: nothing planted,
#: and no label column in its table (unknown, not negative)
NO_TRUTH_OF_SLIDE = {
    "truth_cells_of_slide": 0,
    "planted_abnormal": 0,
    "planted_found_in_top_k": 0,
    "planted_recall_at_k": None,
}


def truth_of_slide(gt: dict[str, np.ndarray], slide_id: str, path: Path) -> dict[str, np.ndarray]:
    """The rows of a truth table (:func:`read_truth`) that belong to the slide the score table
    names ``slide_id`` (the slide's file name without its suffix, as ``cyto synth slide`` writes
    it; the full file name is taken too). A table without a ``slide_id`` column is one slide's,
    taken whole. No row of this slide: a warning names the slide and what the table holds, and
    the slide gets no planted cells (another slide's cells were matched here before)."""
    if "slide_id" not in gt:
        return gt
    ids = gt["slide_id"]
    mine = np.array([v == slide_id or _stem(v) == slide_id for v in ids], dtype=bool)
    if not mine.any():
        held = sorted(set(ids.tolist()))
        names = ", ".join(repr(v) for v in held[:3]) + (" ..." if len(held) > 3 else "")
        warn_caller(
            f"{passing('truth', path)} holds no cell of slide {slide_id!r} (its slide_id: "
            f"{names or 'none'}); this slide is scored without truth cells",
            CytoWarning,
        )
    return {k: v[mine] for k, v in gt.items()}


def _stem(name: str) -> str:
    """``name`` without a slide file's suffix (``s.ndpi`` -> ``s``); other names as they are."""
    p = Path(name)
    return p.stem if p.suffix.lower() in SLIDE_SUFFIXES else name


#: the ``class`` of a detected cell that no truth cell matched (a planted crop's other nuclei,
#: debris): labelled 0, so ``cyto eval scores --by-class`` counts it with the normal classes
UNMATCHED = "unmatched"


def labels_from_truth(
    table, truth: Path, radius: float, size: tuple[int, int] | None = None, classes: bool = False
) -> tuple:
    """Label each detected cell by the nearest ground-truth cell of this slide
    (:func:`truth_of_slide`), if within ``radius`` (or 0.8 of that cell's radius, when the
    truth table gives it). Truth cells outside the slide (``size``: its level-0 width and
    height) can match no detection: they are left out, said in one warning.

    Returns (label per detection, matched truth index or -1, number of planted abnormal cells);
    labels None when the table holds no cell of this slide (or none on it, both said): such a
    slide has no truth, and labels of 0 would pass it off as a slide known to be negative
    (an expert's marks on it were judged false by a review's report). ``classes``: a fourth,
    each detection's truth class (its matched cell's; :data:`UNMATCHED` for none), or None
    where the truth table has no ``class`` column.
    """
    from scipy.spatial import cKDTree

    slide_id = str(table["slide_id"][0].as_py()) if table.num_rows else ""
    gt = truth_inside(truth_of_slide(read_truth(truth), slide_id, truth), slide_id, truth, size)
    truth_labels = gt["label"]
    if len(truth_labels) == 0:
        none = (None, np.full(table.num_rows, -1), 0)
        return (*none, None) if classes else none
    pts = np.stack([gt["x"], gt["y"]], axis=1)
    dist, idx = cKDTree(pts).query(np.stack([np.asarray(table["x"]), np.asarray(table["y"])], 1))
    reach = np.full(len(pts), radius)
    if "cell_radius" in gt:  # a big cell's nucleus may be found off its centre
        reach = np.maximum(reach, 0.8 * gt["cell_radius"])
    hit = dist <= reach[idx]
    # one detection per truth cell, its nearest: a planted crop's other nuclei (a neighbour's,
    # debris) within its reach are not that cell (51 labelled abnormal of 34 planted cells)
    rows = np.flatnonzero(hit)
    rows = rows[np.lexsort((rows, dist[rows], idx[rows]))]  # by truth cell, nearest first
    _, first = np.unique(idx[rows], return_index=True)
    hit = np.zeros_like(hit)
    hit[rows[first]] = True
    labels = np.where(hit, truth_labels[idx], 0).astype(np.int64)
    found = labels, np.where(hit, idx, -1), int(truth_labels.sum())
    if not classes:
        return found
    if "class" not in gt:
        return (*found, None)
    return (*found, np.where(hit, gt["class"][idx], UNMATCHED).astype(object))


def truth_inside(
    gt: dict[str, np.ndarray], slide_id: str, path: Path, size: tuple[int, int] | None
) -> dict[str, np.ndarray]:
    """The truth cells of a slide that lie on it (``size``: level-0 width and height; None:
    all). Cells outside it could never be found, and counted as planted they made a recall of
    '0/2' with no word: they are left out, said in one warning naming how many and the frame."""
    if size is None or not len(gt.get("x", ())):
        return gt
    w, h = size
    x, y = np.asarray(gt["x"], np.float64), np.asarray(gt["y"], np.float64)
    inside = (x >= 0) & (y >= 0) & (x < w) & (y < h)
    if inside.all():
        return gt

    n_out, n = int((~inside).sum()), len(inside)
    abnormal = int(np.asarray(gt["label"])[~inside].sum()) if "label" in gt else 0
    warn_caller(
        f"{passing('truth', path)}: {n_out} of its {n} cell(s) of slide {slide_id!r} "
        f"({abnormal} abnormal) lie outside the slide ({w} x {h} px at level 0), where no "
        "detection can match them: left out (are its x, y level-0 pixels of this slide?)",
        CytoWarning,
    )
    return {k: v[inside] for k, v in gt.items()}


def truth_report(
    scores: np.ndarray,
    order: np.ndarray,
    labels: np.ndarray,
    truth_idx: np.ndarray,
    planted: int,
    k: int,
    metrics: Callable[[np.ndarray, np.ndarray, int], dict] | None = None,
) -> dict:
    """How many planted abnormal cells the top ``k`` holds (a detection counts for the truth cell
    it matched, once), plus ``metrics(scores, labels, k)`` when given (the @K metrics of
    :mod:`cyto.eval.metrics`, which the caller passes in)."""
    out = dict(metrics(scores, labels, k)) if metrics is not None else {"k": k}
    top = order[:k]
    hit_cells = set(truth_idx[top][(truth_idx[top] >= 0) & (labels[top] == 1)].tolist())
    out["planted_abnormal"] = planted
    out["planted_found_in_top_k"] = len(hit_cells)
    out["planted_recall_at_k"] = len(hit_cells) / planted if planted else None
    return out


def write_score_table(table, out_dir: Path, meta: dict[str, str]) -> None:
    import pyarrow.parquet as pq

    from cyto.seal import with_rows_seal

    partial = out_dir / ".scores.parquet.tmp"
    # sealed in its own metadata too: a copy taken out of its folder is still checked
    pq.write_table(with_rows_seal(table, meta), partial, row_group_size=8192)
    os.replace(partial, out_dir / "scores.parquet")


def table_metadata(
    scorer, slide: Path, identity: str, timings: dict, result_key: dict
) -> dict[str, str]:
    """The score table's file metadata; ``result_key``: the scoring options that change scores
    (what ``cyto calibrate`` records its calibration as valid for)."""
    bundle = scorer.bundle
    return {
        "cyto.version": __version__,
        "cyto.model": bundle.recorded_path,
        "cyto.manifest_sha256": bundle.manifest_hash,
        "cyto.method": bundle.method,
        "cyto.scoring_id": bundle.scoring_id,
        "cyto.result_key": json_text(result_key, default=str, sort_keys=True),
        "cyto.slide": printable(slide),  # Parquet metadata is UTF-8: a name that is not, shown
        "cyto.slide_identity": identity,
        "cyto.slide_bytes": str(slide_bytes(slide)),
        "cyto.backend": scorer.backend.name,
        "cyto.device": scorer.device,
        "cyto.precision": scorer.precision,
        "cyto.graph": scorer.graph_ran,
        # the graph's check on the golden cells here: status and its numbers
        "cyto.verification": json_text(
            scorer.verification.as_json() if scorer.verification is not None else None
        ),
        "cyto.timings": json_text(timings),
    }


#: the metadata key of a table that holds the top cells of a slide's only (``topk.parquet``)
EXTRACT_KEY = "cyto.extract"


def write_top_k(table, order: np.ndarray, k: int, out_dir: Path, mpp: float | None = None) -> None:
    """``topk.parquet`` and ``topk.geojson`` (:func:`write_geojson`) of the ``k`` top cells;
    ``mpp``: the slide's, for the nucleus drawn where the table has no area."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.seal import with_rows_seal

    top = table.take(pa.array(order[:k])) if k else table.slice(0, 0)
    # an extract, said in its own metadata: judged as a slide's table its metrics are of the top
    # cells alone, under any name (hostile round 29, 1)
    meta = {**(top.schema.metadata or {}), EXTRACT_KEY: json_text({"of": "scores.parquet", "k": k})}
    pq.write_table(with_rows_seal(top, meta), out_dir / "topk.parquet")
    write_geojson(table, order, k, out_dir / "topk.geojson", mpp=mpp)


def write_geojson(table, order, k: int, path: Path, mpp: float | None = None) -> Path:
    """The top-K cells, in rank order, as QuPath detection objects with their measurements
    (level-0 pixels): the writer of ``cells.geojson`` (:func:`cyto.infer.qupath.write_detections`)
    over the top rows."""
    import pyarrow as pa

    from cyto.infer.qupath import nucleus_radius_px, write_detections

    top = table.take(pa.array(order[:k])) if k else table.slice(0, 0)
    write_detections([top], path, top_k=k, radius_px=nucleus_radius_px(mpp))
    return path


#: what :func:`write_mosaics` writes into a slide's folder
MOSAIC_FILES = ("topk_mosaic.png", "topk_mosaic_blinded.png", "topk_mosaic_blinded_key.json")
#: the columns a finished score table always has (those a reuse of it relies on)
TABLE_COLUMNS = ("slide_id", "cell_id", "x", "y", "score", "rank")


def written_outputs(
    n_cells: int,
    k: int,
    mosaics: bool,
    qupath: dict[str, dict] | None = None,
    columns: tuple[str, ...] | list[str] = TABLE_COLUMNS,
) -> dict[str, dict]:
    """What a finished run writes into a slide's folder, with the rows and columns each table
    holds: recorded in ``summary.json`` so a reuse can check the files are still these.
    ``qupath``: the QuPath outputs written (:func:`cyto.infer.qupath.write_qupath`, with their
    sizes); ``columns``: the tables' (it named 6 of a Pap table's 22: hostile round 58, 8)."""
    columns = list(columns)
    out = {
        "scores.parquet": {"kind": "parquet", "rows": int(n_cells), "columns": columns},
        "topk.parquet": {"kind": "parquet", "rows": int(k), "columns": columns},
        "topk.geojson": {"kind": "json"},
    }
    for name in MOSAIC_FILES if mosaics else ():
        out[name] = {"kind": "json" if name.endswith(".json") else "file"}
    out.update(qupath or {})
    return out


def output_artifacts(folder: Path, summary: dict) -> list:
    """The files a finished run's ``summary`` says its folder holds, as artifacts to check
    (:mod:`cyto.reuse`); a summary of an older cyto that recorded none names the tables and
    mosaics it did write."""
    from cyto.reuse import Artifact

    outputs = summary.get("outputs")
    if not isinstance(outputs, dict):
        n = int(summary.get("cells_scored") or 0)
        k = min(int((summary.get("output_key") or {}).get("top_k") or 0), n)
        outputs = written_outputs(n, k, bool(summary.get("mosaic")))
    meta = (
        ("cyto.slide_identity", str(summary.get("slide_identity"))),
        ("cyto.manifest_sha256", str(summary.get("model_sha256"))),
    )
    return [
        Artifact(
            Path(folder) / name,
            str(spec.get("kind", "file")),
            rows=spec.get("rows"),
            columns=tuple(spec.get("columns") or ()),
            meta=meta if name == "scores.parquet" else (),
            size=spec.get("bytes"),
        )
        for name, spec in outputs.items()
        if isinstance(spec, dict)
    ]


def write_mosaics(
    slide: Path, table, order: np.ndarray, labels, n_cells: int, out_dir: Path, crop: int
) -> Path:
    """Review mosaics of the top cells, 10 per row.

    ``topk_mosaic.png`` is in ranked order, with true abnormal cells (when ground truth is given)
    boxed with an x. ``topk_mosaic_blinded.png`` shows the same cells in a random order without
    marks, for blinded review as in the paper; ``topk_mosaic_blinded_key.json`` maps each grid
    position to its cell and rank. ``crop`` is the level-0 size the model saw.
    """
    from PIL import Image, ImageDraw

    n = min(n_cells, len(order))
    side, cols = MOSAIC_SIDE, MOSAIC_COLS
    rows = -(-n // cols)
    reader = open_slide(slide)
    xs, ys = np.asarray(table["x"]), np.asarray(table["y"])
    ids = np.asarray(table["cell_id"])
    half = crop // 2
    tiles = []
    for i in order[:n]:
        cell = reader.read_region(int(round(xs[i])) - half, int(round(ys[i])) - half, crop, crop)
        tiles.append(Image.fromarray(cell).resize((side, side), Image.Resampling.BILINEAR))
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

    ranked, blinded, key_file = MOSAIC_FILES
    path = out_dir / ranked
    # zlib level 4: a third of the default's (6) time a mosaic, within 1 % of its size
    grid(list(range(n)), marks=True).save(path, compress_level=4)
    shuffled = [int(k) for k in np.random.default_rng(0).permutation(n)]
    grid(shuffled, marks=False).save(out_dir / blinded, compress_level=4)
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
    (out_dir / key_file).write_text(json_text(key, indent=1))
    return path
