"""``cyto predict``: score a patch folder or manifest with a bundle (PyTorch by default)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np

from cyto.data.dataset import PatchDataset, load_records
from cyto.data.images import read_image, resize_rgb
from cyto.data.scale import resolve_zoom, scale_advice, zoom_patches
from cyto.errors import InputPathError, OutputWriteError, ScaleWarning, UnreadableImageError


def predict(
    model: Path,
    data: Path,
    out: Path,
    normal: str | None = None,
    abnormal: str | None = None,
    device: str = "cpu",
    batch_size: int = 128,
    backend: str = "torch",
    precision: str = "fp32",
    zoom: str | float | None = None,
    patch_mpp: float | None = None,
    verify: bool = True,
    skip_unreadable: bool = False,
    rank_by: str = "auto",
) -> dict[str, object]:
    """Write ``out`` (Parquet): path, class, [label], score, rank (1 = most abnormal), and
    under ``rank_by`` ``model+nucleus`` the nucleus-size score and the fused score the rank
    follows (``nucleus_score``, ``fused_score``; :mod:`cyto.data.morphometry`).

    ``zoom`` (a factor, or ``auto``) or ``patch_mpp`` bring patches of another scanner to the
    model's training scale first (:mod:`cyto.data.scale`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.cohort.local import check_out_file
    from cyto.data.morphometry import RANK_BY, fused_score, resolve_rank_by, scorer_rank_by
    from cyto.progress import progress
    from cyto.runtime import load_scorer

    if rank_by not in RANK_BY:
        resolve_rank_by(rank_by, "", None)  # the one-line error, before the model loads
    check_out_file(Path(out))
    scorer = load_scorer(model, backend, device, precision, verify=verify)
    spec = scorer.spec
    rank_by, nucleus = scorer_rank_by(scorer, rank_by)
    size = scorer.bundle.manifest["config"].get("load_size")
    zooming = zoom is not None or patch_mpp is not None
    load = None if zooming else size  # a zoom cuts the native image, then resizes
    records = load_records(Path(data))
    labels = None
    skipped: list[tuple[Path, str]] = []
    if normal:
        ds = PatchDataset.from_path(
            data, normal=normal, abnormal=abnormal, size=load, skip_unreadable=skip_unreadable
        )
        records, images, labels, skipped = ds.records, ds.images, ds.labels, ds.skipped
    else:
        images, kept = [], []
        with progress("read images", total=len(records), unit="images") as bar:
            for r in records:
                bar.advance()
                try:
                    images.append(read_image(r.path))
                except UnreadableImageError as exc:
                    if not skip_unreadable:
                        raise
                    skipped.append((r.path, exc.reason))
                    continue
                kept.append(r)
        records = kept
        if load:
            images = [resize_rgb(im, load) for im in images]
    if len(images) == 0:
        raise InputPathError(f"no images to score in {data}")
    if size is None and len({im.shape for im in images}) > 1:
        size = spec.input_size
    factor, how = 1.0, "none"
    if zooming:
        out_size = size or spec.crop_size
        factor, how = resolve_zoom(
            zoom, patch_mpp, spec.mpp, spec.nucleus_fraction,
            lambda: zoom_patches(images, 1.0, out_size),  # resized only for --zoom auto
        )  # fmt: skip
        images = zoom_patches(images, factor, out_size)
    else:
        images = np.stack([resize_rgb(im, size) if size else im for im in images])
        advice = scale_advice(spec.nucleus_fraction, images)
        if advice is not None:
            warnings.warn(advice, ScaleWarning, stacklevel=2)
    scores = scorer.score(images, batch_size, progress=f"predict {Path(data).name}")
    cols = {
        "path": [str(r.path) for r in records],
        "class": [r.cls for r in records],
        "score": scores,
    }
    ranked = scores
    if nucleus is not None:  # ranked by model+nucleus
        cols["nucleus_score"] = nucleus.score(images)
        ranked = cols["fused_score"] = fused_score(scores, cols["nucleus_score"])
    order = np.argsort(-ranked, kind="stable")
    rank = np.empty(len(scores), dtype=np.int64)
    rank[order] = np.arange(1, len(scores) + 1)
    cols["rank"] = rank
    if labels is not None:
        cols["label"] = labels.astype(np.int8)
    if any(r.bag is not None for r in records):
        cols["bag"] = [r.bag for r in records]
    table = pa.table(cols).replace_schema_metadata(
        {
            "cyto.model": str(model),
            "cyto.manifest_sha256": scorer.bundle.manifest_hash,
            "cyto.method": scorer.bundle.method,
            "cyto.backend": scorer.backend.name,
            "cyto.precision": scorer.precision,
            "cyto.zoom": f"{factor:.4g} ({how})",
            "cyto.rank_by": rank_by,
            # the files left out (--skip-unreadable), so no reader mistakes the table for all
            "cyto.skipped": json.dumps([[str(p), why] for p, why in skipped]),
            "cyto.verification": json.dumps(
                scorer.verification.as_json() if scorer.verification else None
            ),
        }
    )
    out = Path(out)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputWriteError(f"cannot write --out {out}: {exc.strerror or exc}") from exc
    summary: dict[str, object] = {
        "n": len(scores),
        "out": out,
        "zoom": factor,
        "zoom_from": how,
        "rank_by": rank_by,
        "notes": list(scorer.notes),
        "skipped": skipped,
        "verification": scorer.verification.words() if scorer.verification else "none",
    }
    if labels is not None and 0 < labels.sum() < len(labels):
        from sklearn.metrics import roc_auc_score

        k = int(labels.sum())
        summary["auroc"] = float(roc_auc_score(labels, ranked))
        summary["recall_at_k"] = float(labels[order[:k]].mean())
        summary["k"] = k
        if rank_by != "model":  # what the model alone gives, beside
            summary["auroc_model"] = float(roc_auc_score(labels, scores))
    return summary
