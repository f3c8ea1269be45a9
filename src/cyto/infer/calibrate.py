"""Calibrate a model's normal-score quantiles on slide-negative score tables.

``cyto train`` stores quantiles of the scores of its normal training patches, but cells cut from
a slide by the pipeline can score differently (other cropping, staining, scanner). The abnormal
burden is better calibrated on what the pipeline produced for known-negative slides:
``cyto calibrate MODEL neg1/scores.parquet neg2/scores.parquet`` writes those quantiles into the
bundle, and ``cyto score`` uses them from then on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.bundle import CALIBRATION_QUANTILES, add_files, load_bundle
from cyto.errors import ConfigError, InputPathError


def calibrate_from_tables(model: Path, tables: list[Path], min_cells: int = 100) -> dict:
    import pyarrow.parquet as pq

    bundle = load_bundle(Path(model), weights=False)
    scores = []
    for t in tables:
        if not Path(t).is_file():
            raise InputPathError(f"score table {t} does not exist")
        table = pq.read_table(t)
        if "score" not in table.column_names:
            raise ConfigError(f"{t} has no 'score' column: pass scores.parquet from cyto score")
        meta = table.schema.metadata or {}
        method = meta.get(b"cyto.method", b"").decode()
        if method and method != bundle.method:
            raise ConfigError(
                f"{t} was scored by a {method} model, not this {bundle.method} bundle: scores "
                "of different models cannot calibrate each other"
            )
        scores.append(np.asarray(table["score"], dtype=np.float64))
    allv = np.concatenate(scores) if scores else np.empty(0)
    if len(allv) < min_cells:
        raise ConfigError(f"need at least {min_cells} scored cells to calibrate, got {len(allv)}")
    calibration = {
        "source": f"{len(allv)} cells of {len(tables)} slide-negative score table(s)",
        "tables": [str(t) for t in tables],
        "n": int(len(allv)),
        "quantiles": {str(q): float(np.quantile(allv, q)) for q in CALIBRATION_QUANTILES},
    }
    add_files(bundle.path, {}, {"calibration": calibration})
    return calibration


def burden(scores: np.ndarray, calibration: dict | None, q: str = "0.99") -> dict | None:
    """Abnormal-burden estimate: cells above the model's normal-cell quantile ``q``, less the
    share that normal cells alone put there (1 - q), as the paper's Discussion proposes."""
    if not calibration or q not in calibration.get("quantiles", {}) or len(scores) == 0:
        return None
    thr = float(calibration["quantiles"][q])
    above = int((scores > thr).sum())
    expected = (1.0 - float(q)) * len(scores)
    excess = max(0.0, above - expected)
    return {
        "threshold": thr,
        "threshold_quantile_of_normals": float(q),
        "cells_above": above,
        "expected_from_normal_cells": round(expected, 1),
        "excess_cells": round(excess, 1),
        "excess_fraction": round(excess / len(scores), 5),
        "calibration": calibration.get("source"),
    }
