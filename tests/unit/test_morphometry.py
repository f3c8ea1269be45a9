"""The nucleus-size score (cyto.data.morphometry): a one-class score from two numbers of the
normal cells, larger and smaller nuclei both scored as abnormal, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.data.morphometry import NucleusSize, fused_score, resolve_rank_by
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


def test_the_fused_score_is_the_mean_share_of_ranks_whatever_the_scales():
    model = np.array([0.1, 5.0, 2.0, 3.0])  # ranks 1, 4, 2, 3
    nucleus = np.array([900.0, 100.0, 800.0, 700.0])  # ranks 4, 1, 3, 2
    fused = fused_score(model, nucleus)
    assert fused.tolist() == pytest.approx([5 / 8, 5 / 8, 5 / 8, 5 / 8])
    assert fused_score(model * 1e6, np.log(nucleus)).tolist() == fused.tolist()
    assert fused_score(model).tolist() == pytest.approx([0.25, 1.0, 0.5, 0.75])
    with pytest.raises(ValueError):
        fused_score(model, nucleus[:3])


def test_rank_by_auto_fuses_only_for_deep_svdd_bundles_that_record_the_size():
    size = NucleusSize(-3.0, 0.4)
    assert NucleusSize.from_record(size.as_record()) == size
    assert NucleusSize.from_record(None) is None
    assert resolve_rank_by("auto", "dsvdd", size) == "model+nucleus"
    assert resolve_rank_by("auto", "dsvdd", None) == "model"  # a bundle from before
    assert resolve_rank_by("auto", "fssil", size) == "model"
    assert resolve_rank_by("model+nucleus", "droc", size) == "model+nucleus"
    with pytest.raises(ConfigError, match="records no nucleus size"):
        resolve_rank_by("model+nucleus", "dsvdd", None)
    with pytest.raises(ConfigError, match="--rank-by must be one of"):
        resolve_rank_by("nuclei", "dsvdd", size)
