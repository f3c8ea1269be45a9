"""How a run that differs from its calibration is said (hostile round 5)."""

from __future__ import annotations


def test_a_precision_auto_chose_is_not_named_as_a_flag_the_user_passed():
    """Hostile round 5 (6.14): after an int8 export, a plain `cyto score` warned "scored unlike
    the calibration slides (--precision bf16 -> int8)"; the user never passed --precision (auto
    chose). The change is named as what ran."""
    from types import SimpleNamespace

    import numpy as np

    from cyto.stats.calibrate import Calibration

    cal = Calibration(
        [np.linspace(0, 1, 50)],
        {"valid_for": {"model": "m", "precision": "bf16", "graph": "encoder.onnx", "options": {}}},
    )
    scorer = SimpleNamespace(
        bundle=SimpleNamespace(scoring_id="m"), precision="int8", graph_file="encoder.onnx"
    )
    [line] = cal.differences(scorer, {})
    assert "--precision bf16" not in line and "bf16 -> int8" in line, line
    assert line.startswith("the precision run (auto's choice, or --precision)"), line
