"""The per-slide pipeline (``cyto.infer``): one slide in, a ranked score table and its review
mosaics out.

Owns the plan of a slide (its resolution against the model's, tiles with tissue), the tiles in
flight through worker processes, the batches of crops through the scorer, the resumable chunk store
with its lock, and the outputs (``scores.parquet``, top-K, mosaics, ``summary.json``). Reads slides
through :mod:`cyto.slides`, finds nuclei through :mod:`cyto.detect`, scores through
:mod:`cyto.runtime` and takes calibration from :mod:`cyto.stats`; never imports training,
evaluation, cohorts or anything above it.
"""

from __future__ import annotations

from cyto.infer.options import ScoreOptions
from cyto.infer.pipeline import score_slide

__all__ = ["ScoreOptions", "score_slide"]
