"""The nucleus-size score (cyto.data.morphometry): a one-class score from two numbers of the
normal cells, larger and smaller nuclei both scored as abnormal, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.data.morphometry import NucleusSize
from cyto.errors import ConfigError
from tests.unit.test_scale import _cell


def test_cells_whose_nuclei_are_larger_or_smaller_than_the_normals_rank_above_them():
    rng = np.random.default_rng(0)
    normals = np.stack([_cell(80, r) for r in rng.uniform(11, 13, 40)])
    model = NucleusSize.fit(normals)
    test = np.stack([_cell(80, r) for r in (12.0, 11.5, 12.5, 20.0, 6.0)])
    s = model.score(test)
    assert s[3] > 3 * s[:3].max()  # a blast-sized nucleus
    assert s[4] > 3 * s[:3].max()  # an erythroblast-sized one: the score has two sides
    assert np.all(s >= 0)
    # a patch without a centre nucleus is far out, and finite
    blank = np.full((1, 80, 80, 3), 235, dtype=np.uint8)
    assert np.isfinite(model.score(blank)[0]) and model.score(blank)[0] > s[3]


def test_the_score_is_in_the_normals_standard_deviations():
    normals = np.stack([_cell(80, r) for r in (10, 11, 12, 13, 14)])
    model = NucleusSize.fit(normals)
    assert model.score(normals).mean() == pytest.approx(
        np.mean(
            np.abs(
                (np.log(np.pi * np.array([10, 11, 12, 13, 14]) ** 2 / 6400) - model.mean) / model.sd
            )
        ),
        rel=0.1,
    )


def test_a_score_needs_normals_that_vary():
    with pytest.raises(ConfigError, match=">= 2 normal cells"):
        NucleusSize.fit(np.stack([_cell(80, 12)]))
    with pytest.raises(ConfigError, match="same size"):
        NucleusSize.fit(np.stack([_cell(80, 12)] * 5))
