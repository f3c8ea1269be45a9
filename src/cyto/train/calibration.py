"""Normal-score quantiles stored in the bundle: the basis of the abnormal-burden estimate."""

from __future__ import annotations

from typing import Any

import numpy as np

from cyto.bundle import CALIBRATION_QUANTILES
from cyto.train.data import TrainData


def normal_calibration(model, data: TrainData) -> dict[str, Any] | None:
    """Quantiles of the trained model's scores on the normal training cells (instance label 0,
    or, where ``data`` has no instance labels, every cell of a negative bag: `cyto train` removes
    them for the weakly supervised methods).

    ``cyto score`` counts the cells of a slide above the 0.99 quantile and reports the excess over
    the 1% that normal cells alone would give: the abnormal-burden estimate the paper's
    Discussion proposes. The scores are in-sample, so they run a little low; the estimate is a
    screening aid, not a count.
    """
    if data.labels is not None:
        idx = np.flatnonzero(data.labels == 0)
        source = "training cells with instance label normal (in-sample)"
    elif data.bag_labels is not None:
        idx = np.flatnonzero(np.asarray(data.bag_labels) == 0)
        source = "training cells of negative bags (in-sample)"
    else:
        return None
    if len(idx) < 20:
        return None
    scores = np.asarray(model.score(data.images[idx]), dtype=np.float64)
    return {
        "source": source,
        "n": int(len(idx)),
        "quantiles": {str(q): float(np.quantile(scores, q)) for q in CALIBRATION_QUANTILES},
    }
