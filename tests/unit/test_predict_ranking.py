"""A labelled folder ranked clearly better by another ranking than the one used is said so
(hostile round 17, case 23: bone marrow by a model trained on synthetic cells, --rank-by auto
took morphometry by the bundle's held-back cells: AUROC 0.236, the model alone 0.785, and only
the numbers were printed)."""

from __future__ import annotations

import warnings

from hypothesis import given
from hypothesis import strategies as st

from cyto.errors import CytoWarning
from cyto.flags import python_words
from cyto.predict import BETTER_BY, _better_ranking

#: a bundle's record of its held-back cells: auto chose among the rankings by them
HELD = {"auroc": {"model": 0.7, "morphometry": 0.8}, "normal_cells": 40, "abnormal_cells": 40}


def _said(summary: dict, rank_by: str, auto: bool, validation: dict | None = HELD) -> list[str]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        _better_ranking(summary, rank_by, auto, validation)
    return [str(w.message) for w in got if issubclass(w.category, CytoWarning)]


def test_auto_s_choice_beaten_by_the_model_alone_is_said_with_the_flag():
    summary = {"auroc": 0.236, "auroc_model": 0.785}
    (line,) = _said(summary, "morphometry", auto=True)
    assert line.startswith(
        "--rank-by model ranks these labelled cells better: AUROC 0.785 against 0.236 by "
        "morphometry (auto took morphometry: it ranked the bundle's held-back cells best"
    ), line
    assert summary["better_ranking"] == "model"
    asked = {"auroc": 0.60, "auroc_morphometry": 0.80}
    (line,) = _said(asked, "model+morphometry", auto=False)  # asked for: no word of auto
    assert line == (
        "--rank-by morphometry ranks these labelled cells better: AUROC 0.800 against 0.600 "
        "by model+morphometry"
    )
    with python_words("predict"):
        (line,) = _said({"auroc": 0.5, "auroc_model": 0.9}, "morphometry", auto=True)
    assert line.startswith("rank_by='model' ranks"), line


@given(
    chosen=st.floats(0, 1),
    model=st.none() | st.floats(0, 1),
    morph=st.none() | st.floats(0, 1),
)
def test_said_exactly_when_another_ranking_is_better_by_the_margin(chosen, model, morph):
    summary = {"auroc": chosen, "auroc_model": model, "auroc_morphometry": morph}
    lines = _said(summary, "model+morphometry", auto=True)
    best = max((a for a in (model, morph) if a is not None), default=None)
    assert bool(lines) == (best is not None and best >= chosen + BETTER_BY)
    assert ("better_ranking" in summary) == bool(lines)
