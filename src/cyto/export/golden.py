"""Golden cells: what every exported graph and engine is checked against, on every machine.

At export a bundle keeps a few hundred real cells (uint8, at the model's crop size) with the
scores the trained PyTorch network gives them in fp32 here, as ``golden.npz`` inside the seal.
:mod:`cyto.runtime.verify` runs each graph on them wherever it is loaded. The cells come from
what the user gave (``--cells``, ``--parity-cells``, ``--calib``), else from the training folder
the manifest names when it is still there; a mix of normal and, where the classes say so,
abnormal cells (at most a quarter). Without any real cells the golden set is seeded random
patches: enough to check that fp32 numbers agree, not a ranking, so quantized graphs replace it
with their calibration cells.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from cyto.bundle import Staged, load_bundle, staged_files
from cyto.errors import CytoError
from cyto.runtime.verify import GOLDEN_FILE, read_golden

N_GOLDEN = 256


def _records(source: Path, normal: tuple[str, ...] | None):
    from cyto.data.dataset import load_records

    records = load_records(source)
    labels = None
    if normal:
        labels = np.array([0 if r.cls in normal else 1 for r in records], dtype=np.int8)
        if labels.all():  # the normal class is not in this folder: labels say nothing
            labels = None
    return records, labels


def draw(n_total: int, labels: np.ndarray | None, n: int, seed: int) -> np.ndarray:
    """Indices of ``n`` cells: at most a quarter abnormal when labels are known, the rest
    normal; sorted, seeded."""
    rng = np.random.default_rng(seed)
    if labels is None:
        return np.sort(rng.permutation(n_total)[:n])
    abn, nor = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    k_abn = min(len(abn), n // 4)
    k_nor = min(len(nor), n - k_abn)
    k_abn = min(len(abn), n - k_nor)
    return np.sort(np.concatenate([rng.permutation(abn)[:k_abn], rng.permutation(nor)[:k_nor]]))


def golden_source(bundle, candidates: list[Path | None]) -> Path | None:
    """The first cells the user gave, else the training folder when it is still there."""
    for c in candidates:
        if c is not None:
            return Path(c)
    src = (bundle.manifest.get("training_data") or {}).get("source")
    if src and Path(src).exists():
        return Path(src)
    return None


def write_golden(
    path: Path,
    source: Path | None = None,
    normal: str | None = None,
    n: int = N_GOLDEN,
    seed: int = 0,
    images: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    source_words: str | None = None,
    stage: Staged | None = None,
) -> dict:
    """Keep ``n`` golden cells with their fp32 PyTorch scores in the bundle at ``path`` (with
    ``stage``: sealed with the rest of the stage, e.g. the graph they verify, when it ends).

    The cells are ``images`` (with ``labels``) when given, else drawn from ``source`` (a class
    folder or manifest; ``normal`` names the normal classes, default the bundle's), else seeded
    random patches. Returns the manifest entry."""
    from cyto.data.dataset import parse_classes
    from cyto.data.images import read_image, resize_rgb
    from cyto.runtime.scorer import load_scorer

    bundle = load_bundle(Path(path), weights=False)
    size = bundle.spec.crop_size
    kind = "cells"
    if images is None and source is not None:
        normals = parse_classes(normal) or parse_classes(
            (bundle.manifest.get("training_data") or {}).get("normal")
        )
        records, all_labels = _records(source, normals)
        pick = draw(len(records), all_labels, n, seed)
        images = np.stack([resize_rgb(read_image(records[i].path), size) for i in pick])
        labels = None if all_labels is None else all_labels[pick]
        source_words = str(source)
    elif images is None:
        images = np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        kind, source_words = "random", f"{n} seeded random patches (no real cells given)"
    else:
        pick = draw(len(images), labels, n, seed)
        images, labels = images[pick], None if labels is None else labels[pick]
    if len(images) < 8:
        raise CytoError(f"golden cells: {len(images)} cells; at least 8 are needed")
    reference = load_scorer(bundle, "torch", "cpu", verify=False)
    try:
        scores = reference.score(images, batch_size=32)
    finally:
        reference.close()
    if not np.isfinite(scores).all():
        raise CytoError(f"{bundle.path}: the trained network gives non-finite scores")
    entry = {
        "file": GOLDEN_FILE,
        "cells": int(len(images)),
        "abnormal": None if labels is None else int(labels.sum()),
        "kind": kind,
        "source": source_words,
        "reference": "PyTorch fp32 on the CPU, at export",
        "size": int(size),
    }
    with contextlib.ExitStack() as scope:
        if stage is None:  # alone: added to the bundle at the end of this call
            stage = scope.enter_context(staged_files(bundle.path))
        target = stage.file(GOLDEN_FILE)
        np.savez_compressed(
            target,
            images=np.ascontiguousarray(images, dtype=np.uint8),
            scores=scores.astype(np.float64),
            labels=(
                np.full(len(images), -1, np.int8) if labels is None else labels.astype(np.int8)
            ),
        )
        stage.add(GOLDEN_FILE, {"golden": entry})
    return entry


def needs_real_cells(path: Path) -> bool:
    """Whether the bundle's golden set is missing, damaged (an export writes it again:
    :func:`cyto.bundle.rewriting`) or random patches."""
    from cyto.bundle import sha256_file

    bundle = load_bundle(Path(path), weights=False)
    listed = bundle.manifest.get("files", {}).get(GOLDEN_FILE)
    kept = Path(path) / GOLDEN_FILE
    if listed and (not kept.is_file() or sha256_file(kept) != listed):
        return True
    golden = read_golden(bundle)
    return golden is None or golden.kind == "random"
