"""``cyto predict``: score a patch folder or manifest with a bundle (PyTorch by default)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cyto.data.dataset import (
    DecodedChunk,
    PatchRecord,
    decode_stream,
    load_records,
    one_size,
    resolve_classes,
)
from cyto.data.images import resize_rgb
from cyto.data.scale import (
    nucleus_fraction,
    resolve_zoom,
    share_advice,
    zoom_patches,
)
from cyto.errors import (
    ConfigError,
    DatasetError,
    InputPathError,
    OutputWriteError,
    ScaleWarning,
)


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
    chunk: int = 512,
) -> dict[str, object]:
    """Write ``out`` (Parquet): path, class, [label], score, rank (1 = most abnormal), and
    under ``rank_by`` ``model+nucleus`` the nucleus-size score and the fused score the rank
    follows (``nucleus_score``, ``fused_score``; :mod:`cyto.data.morphometry`).

    ``zoom`` (a factor, or ``auto``) or ``patch_mpp`` bring patches of another scanner to the
    model's training scale first (:mod:`cyto.data.scale`).

    The images stream through in chunks of ``chunk`` (decoded on threads one chunk ahead), so
    memory holds a few chunks and the scores, whatever the folder's size; ``--zoom auto``
    reads the folder twice, first to measure its nuclei."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.cohort.local import check_out_file
    from cyto.data.morphometry import RANK_BY, fused_score, resolve_rank_by, scorer_rank_by
    from cyto.progress import progress
    from cyto.runtime import load_scorer

    if rank_by not in RANK_BY:
        resolve_rank_by(rank_by, "", None)  # the one-line error, before the model loads
    check_out_file(Path(out))
    if Path(out).suffix.lower() not in (".parquet", ".pq"):  # x.csv was given Parquet bytes
        raise ConfigError(
            f"--out {out}: cyto predict writes a Parquet table, with the model and the "
            "verification in its metadata; give a name ending in .parquet"
        )
    scorer = load_scorer(model, backend, device, precision, verify=verify)
    spec = scorer.spec
    rank_by, nucleus = scorer_rank_by(scorer, rank_by)
    records, labels = _chosen(Path(data), normal, abnormal)
    size = scorer.bundle.manifest["config"].get("load_size")
    zooming = zoom is not None or patch_mpp is not None
    if size is None and not zooming and not one_size(records):
        size = spec.input_size  # a model of native-size patches, given several sizes
    out_size = size or spec.crop_size
    name = Path(data).name

    def chunks():  # a zoom cuts the native image, then resizes
        return decode_stream(records, None if zooming else size, skip_unreadable, chunk=chunk)

    factor, how = 1.0, "none"
    if zooming:
        factor, how = resolve_zoom(
            zoom, patch_mpp, spec.mpp, spec.nucleus_fraction,
            lambda: _nucleus_shares(chunks(), out_size, len(records), name),  # --zoom auto only
        )  # fmt: skip

    scores, shares, nucleus_scores, kept = [], [], [], []
    skipped: list[tuple[Path, str]] = []
    with progress(f"predict {name}", total=len(records), unit="images") as bar:
        for part in chunks():
            skipped += part.skipped
            if part.images:
                if zooming:
                    batch = zoom_patches(part.images, factor, out_size)
                else:
                    batch = np.stack([resize_rgb(im, size) if size else im for im in part.images])
                    shares.append(nucleus_fraction(batch))  # for the scale advice
                scores.append(scorer.score(batch, batch_size))
                if nucleus is not None:
                    nucleus_scores.append(nucleus.score(batch))
                kept += part.index
            bar.advance(part.n)
    if not kept:
        raise InputPathError(f"no images to score in {data}")
    records = [records[i] for i in kept]
    if labels is not None:
        labels = labels[kept]
        if not (labels == 0).any():
            raise DatasetError(f"no readable image of the normal class(es) {normal}")
    scores = np.concatenate(scores)
    if shares:
        advice = share_advice(spec.nucleus_fraction, np.concatenate(shares))
        if advice is not None:
            warnings.warn(advice, ScaleWarning, stacklevel=2)
    cols = {
        "path": [str(r.path) for r in records],
        "class": [r.cls for r in records],
        "score": scores,
    }
    ranked = scores
    if nucleus is not None:  # ranked by model+nucleus
        cols["nucleus_score"] = np.concatenate(nucleus_scores)
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


def _chosen(
    data: Path, normal: str | None, abnormal: str | None
) -> tuple[list[PatchRecord], np.ndarray | None]:
    """The records to score and, with ``normal``, their labels (1 = abnormal): the classes in
    neither ``normal`` nor ``abnormal`` are left out, as in training."""
    records = load_records(data)
    if not normal:
        return records, None
    normal_t, abnormal_t = resolve_classes({r.cls for r in records}, normal, abnormal, data)
    records = [r for r in records if r.cls in normal_t or r.cls in abnormal_t]
    return records, np.array([0 if r.cls in normal_t else 1 for r in records], dtype=np.int8)


def _nucleus_shares(chunks: Iterator[DecodedChunk], size: int, total: int, name: str) -> np.ndarray:
    """The nucleus share of every readable patch at ``size``, chunk by chunk (``--zoom auto``)."""
    from cyto.progress import progress

    out = []
    with progress(f"measure nuclei {name}", total=total, unit="images") as bar:
        for part in chunks:
            if part.images:
                out.append(nucleus_fraction(zoom_patches(part.images, 1.0, size)))
            bar.advance(part.n)
    return np.concatenate(out) if out else np.empty(0)
