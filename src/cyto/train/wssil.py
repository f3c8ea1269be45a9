"""WS-SIL: the FS-SIL network trained on labels inherited from the bag (slide) label.

Every instance of a positive bag is labelled abnormal, every instance of a negative bag normal. It
never reads instance labels: :meth:`WSSIL.training_labels` looks at ``bag_labels`` only.
"""

from __future__ import annotations

import numpy as np

from cyto.errors import DatasetError
from cyto.train.data import TrainData
from cyto.train.fssil import FSSIL, SILConfig
from cyto.train.registry import register


class WSSILConfig(SILConfig):
    """FS-SIL's fields; its own fast preset (FS-SIL's epochs were re-chosen on instance labels,
    WS-SIL's were not)."""

    presets = {"fast": {**SILConfig.presets["fast"], "epochs": 12}}


@register("ws-sil")
class WSSIL(FSSIL):
    instance_labels = False
    """Weakly supervised single-instance learning (slide-label inheritance)."""

    Config = WSSILConfig

    def training_labels(self, data: TrainData) -> np.ndarray:
        if data.bag_labels is None:
            raise DatasetError(
                "WS-SIL needs bags: give a manifest with bag (slide_id) and bag_label columns"
            )
        return data.bag_labels.astype(np.int64)
