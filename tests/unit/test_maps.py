"""The abnormality map (cyto.infer.maps): windows of a physical size, the fraction flagged on a
calibrated table, the maximum score otherwise, and NaN where a window holds no cell."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from cyto.infer.maps import AbnormalityMap, abnormality_grid, map_of_table


def _reference(x, y, score, width, height, window_px, hit=None):
    """Per-window statistic by a plain loop over windows (the reference of the vectorised one)."""
    rows, cols = int(np.ceil(height / window_px)), int(np.ceil(width / window_px))
    values = np.full((rows, cols), np.nan)
    counts = np.zeros((rows, cols), np.int64)
    for r in range(rows):
        for c in range(cols):
            inside = (np.clip(np.floor(x / window_px), 0, cols - 1) == c) & (
                np.clip(np.floor(y / window_px), 0, rows - 1) == r
            )
            counts[r, c] = inside.sum()
            if inside.any():
                values[r, c] = hit[inside].mean() if hit is not None else score[inside].max()
    return values, counts


def test_window_size_follows_the_slide_resolution():
    # 50 um at 0.25 um/px is 200 px: a 1000 x 450 px slide has 3 rows of 5 windows
    m = abnormality_grid([10.0], [10.0], [1.0], 1000, 450, 0.25, window_um=50.0)
    assert isinstance(m, AbnormalityMap)
    assert m.window_px == 200.0 and m.shape == (3, 5)
    assert m.values.dtype == np.float32 and m.counts.dtype == np.int32
    assert m.mpp == 0.25 and m.window_um == 50.0


def test_max_score_per_window_and_nan_where_no_cell():
    x = np.array([10, 150, 250, 990, 5.0])
    y = np.array([10, 190, 10, 440, 420.0])
    s = np.array([0.1, 0.7, -2.0, 3.0, 0.4])
    m = abnormality_grid(x, y, s, 1000, 450, 0.25)
    assert m.kind == "max_score" and not m.is_fraction
    assert m.values[0, 0] == pytest.approx(0.7)  # the higher of the two cells in window (0, 0)
    assert m.values[0, 1] == pytest.approx(-2.0)  # a negative maximum stays negative
    assert m.values[2, 4] == pytest.approx(3.0)
    assert m.values[2, 0] == pytest.approx(0.4)
    assert m.counts[0, 0] == 2 and m.counts.sum() == 5
    assert np.isnan(m.values[1, 2]) and m.counts[1, 2] == 0  # no cell: NaN, never 0


def test_fraction_flagged_matches_a_loop_over_windows():
    rng = np.random.default_rng(3)
    n, width, height, mpp = 5000, 4000, 3000, 0.5
    x, y = rng.uniform(0, width, n), rng.uniform(0, height, n)
    s = rng.normal(size=n)
    flagged = s > 1.5
    m = abnormality_grid(x, y, s, width, height, mpp, window_um=100.0, flagged=flagged)
    assert m.kind == "fraction_flagged" and m.is_fraction
    ref_values, ref_counts = _reference(x, y, s, width, height, 200.0, hit=flagged)
    np.testing.assert_array_equal(m.counts, ref_counts)
    np.testing.assert_allclose(m.values, ref_values, rtol=1e-6, equal_nan=True)
    assert np.nanmax(m.values) <= 1.0 and np.nanmin(m.values) >= 0.0


def test_max_matches_a_loop_and_threshold_gives_the_fraction_above():
    rng = np.random.default_rng(4)
    x, y, s = rng.uniform(0, 900, 800), rng.uniform(0, 700, 800), rng.normal(size=800)
    m = abnormality_grid(x, y, s, 900, 700, 1.0, window_um=100.0)
    ref_values, _ = _reference(x, y, s, 900, 700, 100.0)
    np.testing.assert_allclose(m.values, ref_values, rtol=1e-6, equal_nan=True)
    t = abnormality_grid(x, y, s, 900, 700, 1.0, window_um=100.0, threshold=0.5)
    assert t.kind == "fraction_above_threshold" and t.threshold == 0.5
    ref_frac, _ = _reference(x, y, s, 900, 700, 100.0, hit=s > 0.5)
    np.testing.assert_allclose(t.values, ref_frac, rtol=1e-6, equal_nan=True)


def test_edges_missing_flags_and_bad_positions():
    # a centre on the right/bottom edge (or just past it) is in the last window; a NaN position
    # is left out; a missing flag (None) counts as not flagged
    m = abnormality_grid(
        [400.0, 401.0, np.nan, 0.0],
        [300.0, 0.0, 5.0, 0.0],
        [1, 2, 3, 4],
        400,
        300,
        1.0,
        window_um=100.0,
        flagged=[True, None, True, False],
    )
    assert m.shape == (3, 4)
    assert m.counts[2, 3] == 1 and m.values[2, 3] == 1.0
    assert m.counts[0, 3] == 1 and m.values[0, 3] == 0.0
    assert m.counts.sum() == 3
    row, col = m.window_of([399.0, 0.0], [299.0, 0.0])
    assert row.tolist() == [2, 0] and col.tolist() == [3, 0]


def test_no_cells_is_an_all_nan_map():
    m = abnormality_grid([], [], [], 300, 300, 0.5)
    assert m.shape == (3, 3) and np.isnan(m.values).all() and (m.counts == 0).all()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"width": 0}, "slide size"),
        ({"mpp": 0.0}, "mpp"),
        ({"window_um": -1.0}, "window"),
        ({"flagged": [True], "threshold": 0.1}, "not both"),
        ({"flagged": [True, False]}, "flagged has 2"),
    ],
)
def test_bad_inputs_are_refused(kwargs, words):
    args = {"x": [1.0], "y": [1.0], "score": [0.0], "width": 10, "height": 10, "mpp": 1.0}
    with pytest.raises(ValueError, match=words):
        abnormality_grid(**{**args, **kwargs})


def test_map_of_table_counts_the_fdr_flags_when_the_table_has_them():
    base = {"x": [10.0, 20.0, 150.0], "y": [10.0, 20.0, 10.0], "score": [0.1, 0.9, 0.3]}
    plain = map_of_table(pa.table(base), 200, 100, 1.0, window_um=100.0)
    assert plain.kind == "max_score" and plain.values[0, 0] == pytest.approx(0.9)
    flagged = pa.table({**base, "flagged_bh": [False, True, None]})
    m = map_of_table(flagged, 200, 100, 1.0, window_um=100.0)
    assert m.kind == "fraction_flagged"
    assert m.values[0, 0] == pytest.approx(0.5) and m.values[0, 1] == 0.0
    withheld = pa.table({**base, "flagged_bh": pa.array([None] * 3, pa.bool_())})
    assert map_of_table(withheld, 200, 100, 1.0, window_um=100.0).kind == "max_score"


@pytest.mark.parametrize("seed", range(4))
def test_a_calibrated_slide_maps_the_cells_above_the_burdens_threshold(seed):
    """With the summary's burden the map is the fraction of counted cells above its threshold
    (the demo's calibration flags no cell, and a map of flags was all zero while 31 cells lay
    above the threshold); over the evaluable cells when the burden counted those, so a window of
    blurred cells only holds no counted cell (NaN), not "normal cells"."""
    rng = np.random.default_rng(seed)
    n = 400
    x, y = rng.uniform(0, 400, n), rng.uniform(0, 200, n)
    score = rng.normal(0, 1, n)
    evaluable = rng.random(n) > 0.2
    evaluable[(x >= 300) & (y < 100)] = False  # one window of blurred cells only
    table = pa.table(
        {
            "x": x,
            "y": y,
            "score": score,
            "flagged_bh": np.zeros(n, bool),  # nothing reached BH's first step
            "evaluable": evaluable,
        }
    )
    burden = {"status": "ok", "threshold": 1.0, "counted": "evaluable"}
    m = map_of_table(table, 400, 200, 1.0, window_um=100.0, burden=burden)
    assert m.kind == "fraction_above_threshold" and m.threshold == 1.0
    hit = (score > 1.0).astype(float)
    want, counts = _reference(
        x[evaluable], y[evaluable], score[evaluable], 400, 200, 100.0, hit[evaluable]
    )
    np.testing.assert_allclose(m.values, want, rtol=1e-6)
    np.testing.assert_array_equal(m.counts, counts)
    assert np.isnan(m.values[0, 3]) and m.counts[0, 3] == 0
    assert np.nanmax(m.values) > 0  # the flags' map was all zero
    # a burden over every cell counts every cell; no burden (or not ok): the flags, as before
    every = map_of_table(table, 400, 200, 1.0, 100.0, burden={**burden, "counted": "all"})
    np.testing.assert_allclose(every.values, _reference(x, y, score, 400, 200, 100.0, hit)[0])
    for b in (None, {"status": "calibration mismatch"}):
        assert map_of_table(table, 400, 200, 1.0, 100.0, burden=b).kind == "fraction_flagged"


@pytest.mark.parametrize("seed", range(4))
def test_the_map_shows_what_the_cells_are_ranked_by(seed):
    """Hostile round 25 (7): a Pap slide ranked by its morphometric score drew its map from the
    model's score (near chance there): QuPath's hot spots and its top-K cells disagreed, and
    nothing said why. Without a burden or flags, the map is the maximum of what ranks the
    cells (the summary's ``rank_by``): the morphometric or the fused score, or the model's."""
    rng = np.random.default_rng(seed)
    n = 400
    x, y = rng.uniform(0, 1000, n), rng.uniform(0, 1000, n)
    cols = {
        "score": rng.uniform(0, 1, n),
        "morphometry_score": rng.uniform(0, 1, n),
        "fused_score": rng.uniform(0, 1, n),
    }
    hot = {c: int(rng.integers(n)) for c in cols}  # each column's own hottest cell
    for c, i in hot.items():
        cols[c][i] = 5.0
    table = pa.table({"x": x, "y": y, **cols})
    for rank_by, column in (
        ("model", "score"),
        ("morphometry", "morphometry_score"),
        ("model+morphometry", "fused_score"),
        (None, "fused_score"),  # a table that records none: fused where there is one
    ):
        m = map_of_table(table, 1000, 1000, 0.25, 50.0, rank_by=rank_by)
        ref, _ = _reference(x, y, cols[column], 1000, 1000, 200.0)
        np.testing.assert_allclose(m.values, ref, rtol=1e-6)
    # the burden's threshold is on the model's score, as calibration holds it
    burden = {"status": "ok", "threshold": 0.5}
    m = map_of_table(table, 1000, 1000, 0.25, 50.0, burden=burden, rank_by="morphometry")
    ref, _ = _reference(x, y, cols["score"], 1000, 1000, 200.0, hit=cols["score"] > 0.5)
    np.testing.assert_allclose(m.values, ref, rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_the_slide_scores_are_each_of_one_kind_whatever_ranks_the_cells(seed):
    """Hostile round 25 (7): ``slide_score_mean_top_k`` was the model's score of the cells the
    morphometric score ranked first: neither the model's slide score nor a morphometric one.
    Each is the mean of one score over its own top K; NaN (an unmeasured cell) is no score."""
    from cyto.infer.finish import slide_scores

    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(5, 300)), int(rng.integers(1, 400))
    score = rng.normal(0, 1, n)
    morph = np.maximum(rng.normal(0, 1, n), 0)
    morph[rng.random(n) < 0.1] = np.nan
    got = slide_scores(pa.table({"score": score, "morphometry_score": morph}), score, k)
    assert got["slide_score_mean_top_k"] == pytest.approx(np.sort(score)[::-1][:k].mean())
    finite = np.sort(morph[np.isfinite(morph)])[::-1]
    assert got["slide_morphometry_mean_top_k"] == pytest.approx(finite[:k].mean())
    assert "slide_morphometry_mean_top_k" not in slide_scores(pa.table({"score": score}), score, k)
    assert slide_scores(pa.table({"score": score}), score, 0)["slide_score_mean_top_k"] is None
