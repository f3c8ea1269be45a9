"""How a run that differs from its calibration is said (hostile round 5)."""

from __future__ import annotations

import pytest


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
        bundle=SimpleNamespace(scoring_id="m"), precision="int8", graph_ran="encoder.onnx"
    )
    [line] = cal.differences(scorer, {})
    assert "--precision bf16" not in line and "bf16 -> int8" in line, line
    assert line.startswith("the precision run (auto's choice, or --precision)"), line


def test_what_the_burden_counts_is_said_by_the_rule_the_burden_applies():
    """Hostile round 7 (H28): a calibration with 0 evaluable cells of 643 was said as "the
    burden counts evaluable cells: 0 of the 643", while with fewer than MIN_EVALUABLE the
    burden counts every cell. The line follows Calibration.counted, for any count."""
    import numpy as np
    from hypothesis import given
    from hypothesis import strategies as st

    from cyto.stats.calibrate import (
        COUNTED_EVALUABLE,
        MIN_EVALUABLE,
        Calibration,
        burden_counts_words,
    )

    @given(st.integers(1, 3 * MIN_EVALUABLE), st.data())
    def check(n, data):
        ev = data.draw(st.integers(0, n))
        cal = Calibration([np.linspace(0, 1, n)], {}, [np.arange(n) < ev])
        counted, _ = cal.counted(np.ones(4, bool))
        line = burden_counts_words({"n": n, "evaluable_cells": ev})
        if counted == COUNTED_EVALUABLE:
            assert line.startswith(f"the burden counts evaluable cells: {ev:,} of the {n:,}")
        else:
            assert line.startswith("the burden counts every cell: only"), line
            assert f"fewer than {MIN_EVALUABLE}" in line

    check()
    assert burden_counts_words({"n": 5, "evaluable_cells": None}).startswith(
        "the burden counts every cell: a table marks no evaluable cells"
    )


def test_the_quantiles_said_are_of_the_cells_the_burden_counts():
    """``cyto calibrate`` said the 99th percentile of every calibration cell beside a burden
    that counts the evaluable cells against theirs (hostile round 58). Where the burden counts
    the evaluable cells (:meth:`Calibration.counted`), their quantiles are said beside all
    cells'; where it counts every cell, those alone; for any count."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cyto.stats.calibrate import (
        COUNTED_EVALUABLE,
        MIN_EVALUABLE,
        Calibration,
        _quantiles,
        quantile_words,
    )

    @settings(max_examples=60, deadline=None)
    @given(st.integers(1, 3 * MIN_EVALUABLE), st.integers(1, 3), st.data())
    def check(n, slides, data):
        rng = np.random.default_rng(n)
        parts = [rng.normal(size=n) for _ in range(slides)]
        marked = [rng.random(n) < data.draw(st.floats(0, 1)) for _ in range(slides)]
        ev = int(sum(m.sum() for m in marked))
        every = np.concatenate(parts)
        record = {
            "quantiles": {
                "0.5": float(np.quantile(every, 0.5)),
                "0.99": float(np.quantile(every, 0.99)),
            },
            "evaluable_cells": ev,
            "quantiles_evaluable": _quantiles(parts, marked),
        }
        line = quantile_words(record)
        assert line.startswith(
            f"median {np.quantile(every, 0.5):.4g}, 99th percentile {np.quantile(every, 0.99):.4g}"
        )
        counted, _ = Calibration(parts, {}, marked).counted(np.ones(4, bool))
        if counted == COUNTED_EVALUABLE:
            kept = np.concatenate([p[m] for p, m in zip(parts, marked, strict=True)])
            assert line.endswith(
                f" (of the {ev:,} evaluable cells the burden counts: "
                f"{np.quantile(kept, 0.5):.4g}, {np.quantile(kept, 0.99):.4g})"
            ), line
        else:
            assert "evaluable" not in line, line

    check()
    # under a normalization the figures are the raw scores', which read the same whatever it
    # is (the median-iqr calibration said median's figures unlabelled: hostile round 67, 12)
    record = {"quantiles": {"0.5": 0.4133, "0.99": 2.26}, "normalization": "median-iqr"}
    assert quantile_words(record) == "raw scores: median 0.4133, 99th percentile 2.26"
    assert quantile_words({**record, "normalization": "none"}).startswith("median 0.4133")
    assert _quantiles([np.ones(3)], None) is None
    assert _quantiles([np.ones(3)], [np.zeros(3, bool)]) is None


@pytest.mark.parametrize("labelled", [False, True])
def test_a_planted_slide_is_refused_in_the_callers_words(labelled):
    """Hostile round 73, 3: cyto.calibrate refused a slide scored with its truth naming
    `--truth`, where a Python caller wrote `truth=`."""
    from cyto.errors import ConfigError
    from cyto.flags import python_words
    from cyto.stats.calibrate import refuse_planted

    with pytest.raises(ConfigError) as cli:
        refuse_planted("s.tif", 3, "calibrate", labelled=labelled)
    with python_words("calibrate"), pytest.raises(ConfigError) as api:
        refuse_planted("s.tif", 3, "calibrate", labelled=labelled)
    assert "--truth" in str(cli.value) and "--" not in str(api.value), (cli.value, api.value)
    assert str(api.value) == str(cli.value).replace("--truth", "truth")
