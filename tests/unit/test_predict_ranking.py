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
    # a switch is advised only to a ranking above chance (round 63, 5)
    assert ("better_ranking" in summary) == (bool(lines) and best > 0.5)
    assert all(("below chance" in line) == (best <= 0.5) for line in lines), lines


def test_two_rankings_below_chance_are_said_so_and_no_switch_is_advised():
    """Hostile round 63, 5: Pap crops given to a bone-marrow model were told "--rank-by model
    ranks these labelled cells better: AUROC 0.357 against 0.301", a switch between two
    rankings both below chance."""
    summary = {"auroc": 0.301, "auroc_model": 0.357}
    (line,) = _said(summary, "morphometry", auto=True)
    assert line == (
        "these labelled cells are ranked below chance by morphometry (AUROC 0.301) and by model "
        "(0.357): the model's cells are not these (another stain, lab or scale?); train on "
        "normal cells of their own"
    ), line
    assert "better_ranking" not in summary


def test_a_folder_ranked_by_morphometry_with_few_nuclei_measured_is_warned():
    """Uniform grey or pure red crops were "ranked by morphometry", every score 0 and AUROC 0.5,
    without a word (hostile round 57, 3): past a quarter of the crops without a nucleus
    measured, the ranking is said to say little of them (nothing, where none was)."""
    import numpy as np

    from cyto.data.morphometry import Feature, Morphometric
    from cyto.predict import UNMEASURED_SHARE, unmeasured_words

    morph = Morphometric("pap", (Feature("nucleus_share", "up", -2.9, 1.0),))

    def column(missing: int, n: int = 100) -> dict:
        area = np.full(n, 30.0)
        area[:missing] = np.nan
        share = np.where(np.isnan(area), 0.0, 0.2)  # none near the centre: share 0, not NaN
        # every area NaN where the model records no pixel size: the share says it
        return {
            "score": np.zeros(n),
            "nucleus_area_um2": np.full(n, np.nan),
            "nucleus_share": share,
        }

    line = unmeasured_words(morph, column(100), "morphometry")
    assert line.startswith("no nucleus was measured near the centre of any of the 100 crops: ")
    assert "the ranking by morphometry says nothing of them" in line and "--rank-by model" in line
    with python_words("predict"):
        line = unmeasured_words(morph, column(60), "model+morphometry")
    assert "60 of the 100 crops" in line and "says little" in line and "rank_by='model'" in line
    assert unmeasured_words(morph, column(int(UNMEASURED_SHARE * 100)), "morphometry") is None
    assert unmeasured_words(morph, column(100), "model") is None  # not ranked by it
    assert unmeasured_words(None, column(100), "morphometry") is None
