"""Each cell's morphometry (cyto.detect.morphometry) on generated crops, the morphometric
one-class score and the ranking chosen from held-back cells (cyto.data.morphometry)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cyto.data.morphometry import (
    MIN_ABNORMAL,
    Feature,
    Morphometric,
    choose_ranking,
    few_abnormal_words,
    fused_score,
    ranked_values,
    resolve_rank_by,
    validation_record,
)
from cyto.data.scale import nucleus_fraction, zoom_patch
from cyto.detect.morphometry import CELL_MASKS, COLUMNS, _otsu, measure, measure_stain
from cyto.errors import ConfigError
from cyto.flags import python_words

NUCLEUS = (70, 30, 110)
GLASS = (235, 228, 232)


def _crop(size=96, nuclei=((0.0, 0.0, 10.0),), cyto=None, cyto_colour=(180, 170, 215), bg=GLASS,
          dark=NUCLEUS):  # fmt: skip
    """A crop: glass, an optional round cytoplasm (radius ``cyto``) and round nuclei given as
    (dy, dx, radius) from the centre."""
    yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = bg
    if cyto:
        img[np.hypot(yy, xx) <= cyto] = cyto_colour
    for dy, dx, r in nuclei:
        img[np.hypot(yy - dy, xx - dx) <= r] = dark
    return img


#: a cytoplasm of each kind of slide: MGG's pale lilac, Pap's light-green blue, H&E's eosin pink
CYTOPLASM = {"smear": (200, 185, 220), "pap": (150, 175, 225), "tissue": (235, 160, 200)}


@pytest.mark.parametrize("kind", ["smear", "pap", "tissue"])
def test_a_round_nucleus_measures_its_area_in_square_micrometres(kind):
    mpp = 0.25
    for r in (8.0, 12.0, 16.0):
        crop = _crop(nuclei=((0, 0, r),), cyto=40, cyto_colour=CYTOPLASM[kind])
        m = measure(crop, mpp, CELL_MASKS[kind])
        assert m["nucleus_area_um2"][0] == pytest.approx(np.pi * r * r * mpp * mpp, rel=0.12)
        assert m["nucleus_share"][0] == pytest.approx(np.pi * r * r / 96**2, rel=0.12)
        assert m["nuclei_in_cell"][0] == 1
        assert m["contour_irregularity"][0] < 0.08
        assert m["nucleus_od_ratio"][0] > 1.5  # darker than its cytoplasm
    # the pixel size unknown: shares, no areas
    m = measure(_crop(), None, CELL_MASKS[kind])
    assert np.isnan(m["nucleus_area_um2"][0]) and m["nucleus_share"][0] > 0


def test_the_nc_ratio_is_the_nucleus_over_its_cell():
    for r_n, r_c in ((8, 20), (10, 14), (12, 40)):
        m = measure(_crop(nuclei=((0, 0, r_n),), cyto=r_c), 0.25, CELL_MASKS["pap"])
        assert m["nc_ratio"][0] == pytest.approx(r_n**2 / r_c**2, rel=0.2)


def test_two_nuclei_of_one_cell_are_counted_and_a_speck_is_not():
    two = _crop(nuclei=((0, -6, 8), (0, 14, 8)), cyto=36)
    assert measure(two, 0.25, CELL_MASKS["pap"])["nuclei_in_cell"][0] == 2
    speck = _crop(nuclei=((0, 0, 10), (0, 16, 1.5)), cyto=36)
    assert measure(speck, 0.25, CELL_MASKS["pap"])["nuclei_in_cell"][0] == 1
    far = _crop(nuclei=((0, 0, 8), (40, 40, 8)), cyto=30)  # another cell's nucleus
    assert measure(far, 0.25, CELL_MASKS["pap"])["nuclei_in_cell"][0] == 1


def test_a_notched_outline_is_more_irregular_than_a_round_one():
    round_ = _crop(nuclei=((0, 0, 14),), cyto=40)
    notched = round_.copy()
    yy, xx = np.mgrid[:96, :96] - 47.5
    for angle in np.linspace(0, 2 * np.pi, 5, endpoint=False):  # four deep notches
        cy, cx = 14 * np.sin(angle), 14 * np.cos(angle)
        notched[np.hypot(yy - cy, xx - cx) <= 6] = (180, 170, 215)
    a = measure(round_, 0.25, CELL_MASKS["pap"])["contour_irregularity"][0]
    b = measure(notched, 0.25, CELL_MASKS["pap"])["contour_irregularity"][0]
    assert b > a + 0.1


def test_a_crop_without_a_nucleus_near_its_centre_measures_nothing():
    blank = np.full((1, 64, 64, 3), 235, dtype=np.uint8)
    away = _crop(nuclei=((40, 40, 5),))[None]
    for crops in (blank, away):
        m = measure(crops, 0.25, CELL_MASKS["pap"])
        assert m["nucleus_share"][0] == 0.0
        assert all(np.isnan(m[c][0]) for c in COLUMNS if c != "nucleus_share")
    assert set(measure(np.zeros((0, 32, 32, 3), np.uint8), 0.25).keys()) == set(COLUMNS)


def test_the_smear_mask_keeps_the_nucleus_size_rule_and_leaves_the_neighbours_out():
    """A crop from a smear holds neighbours: the whole-crop share counts them, the centre share
    is the centred cell's alone and follows its size (the square of the zoom)."""
    smear = CELL_MASKS["smear"]
    img = _crop(nuclei=((0, 0, 10),))
    alone = measure(img, None, smear)["nucleus_share"][0]
    assert alone == pytest.approx(np.pi * 10 * 10 / 96**2, rel=0.08)
    crowded = img.copy()
    yy, xx = np.mgrid[:96, :96]
    for cy, cx in ((12, 12), (12, 84), (84, 48)):  # three neighbours, cut by the crop's edge
        crowded[np.hypot(yy - cy, xx - cx) <= 9] = NUCLEUS
    assert nucleus_fraction(crowded)[0] > 1.8 * nucleus_fraction(img)[0]
    assert measure(crowded, None, smear)["nucleus_share"][0] == pytest.approx(alone, rel=0.01)
    zoomed = measure(zoom_patch(crowded, 1.5), None, smear)["nucleus_share"][0]
    assert zoomed == pytest.approx(2.25 * alone, rel=0.08)
    empty = np.full((96, 96, 3), 235, dtype=np.uint8)  # a cell off the centre window counts 0
    empty[:10, :10] = NUCLEUS
    assert measure(empty, None, smear)["nucleus_share"][0] == 0.0


def _rgb_of_od(od) -> tuple[int, int, int]:
    return tuple(int(np.clip(round(256 * np.exp(-v) - 1), 0, 255)) for v in od)


@settings(max_examples=30, deadline=None)
@example(darkness=0.5078125, nucleus_od=1.5, radius=9.375)  # 1.27x: drawn in the suite once
@given(
    darkness=st.floats(0.25, 0.6),  # darker still: see cyto.detect.morphometry, where it fails
    nucleus_od=st.floats(1.2, 2.2),
    radius=st.floats(9.0, 14.0),
)
def test_the_pap_mask_finds_the_nucleus_in_stained_cytoplasm(darkness, nucleus_od, radius):
    """Pap cytoplasm is stained too, often dark blue (light green): its optical density reaches
    more than half a nucleus's, where the MGG rule (half the crop's 99th percentile) takes it
    for nucleus; three classes (glass, cytoplasm, nucleus) do not. (A nucleus a few pixels
    across at the measuring resolution comes out up to a third larger: the smoothing spreads
    it; the score compares cells measured alike.)"""
    haematoxylin = nucleus_od * np.array([0.9, 1.1, 0.5])
    light_green = darkness * nucleus_od * np.array([1.3, 0.9, 0.3])
    img = _crop(
        nuclei=((0, 0, radius),), cyto=40, cyto_colour=_rgb_of_od(light_green),
        dark=_rgb_of_od(haematoxylin),
    )  # fmt: skip
    want = np.pi * radius**2 / 96**2
    pap = measure(img, 0.25, CELL_MASKS["pap"])["nucleus_share"][0]
    # up to a third larger, as said above (it asked 1.25x, and 2 of 6 runs drew a 1.27x:
    # at darkness 0.508, OD 1.5, radius 9.4), and no more than a quarter smaller
    assert 0.75 * want <= pap <= 4 / 3 * want, pap / want


def test_the_mgg_rule_takes_dark_blue_cytoplasm_for_nucleus():
    """Why Pap cells get a mask of their own (the CRIC development cells: NILM against the
    low-grade lesions at AUROC 0.80 / 0.74 with the MGG rule, 0.84 / 0.81 with the Pap mask)."""
    img = _crop(
        nuclei=((0, 0, 11),), cyto=40, cyto_colour=_rgb_of_od(1.2 * np.array([1.3, 0.9, 0.3])),
        dark=_rgb_of_od(1.8 * np.array([0.9, 1.1, 0.5])),
    )  # fmt: skip
    want = np.pi * 11**2 / 96**2
    assert measure(img, 0.25, CELL_MASKS["smear"])["nucleus_share"][0] > 5 * want
    assert measure(img, 0.25, CELL_MASKS["pap"])["nucleus_share"][0] == pytest.approx(want, rel=0.2)


def test_the_histogram_thresholds_agree_with_scikit_image():
    from skimage.filters import threshold_multiotsu, threshold_otsu

    rng = np.random.default_rng(0)
    for _ in range(20):
        a = np.concatenate(
            [rng.normal(m, 0.1, rng.integers(200, 2000)) for m in rng.uniform(0, 3, 3)]
        ).astype(np.float32)
        span = float(a.max() - a.min())
        assert _otsu(a[None], 2)[0, 0] == pytest.approx(threshold_otsu(a, nbins=64), abs=span / 32)
        got = _otsu(a[None], 3)[0]
        want = threshold_multiotsu(a, classes=3, nbins=32)
        assert np.allclose(got, want, atol=span / 16)


def test_a_bad_crop_stack_is_one_line():
    with pytest.raises(ConfigError, match="uint8"):
        measure(np.zeros((2, 32, 32, 3), np.float32), 0.25)
    with pytest.raises(ConfigError, match="square"):
        measure(np.zeros((2, 32, 30, 3), np.uint8), 0.25)
    with pytest.raises(ConfigError, match="known: smear, pap, tissue"):
        measure_stain(np.zeros((1, 32, 32, 3), np.uint8), 0.25, "giemsa")


def _normals(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([_crop(nuclei=((0, 0, r),), cyto=36) for r in rng.uniform(9, 11, n)])


def test_the_pap_score_counts_enlargement_and_the_mgg_score_both_sides():
    normals = _normals()
    test = np.stack([_crop(nuclei=((0, 0, r),), cyto=36) for r in (10.0, 16.0, 6.0)])
    for stain, small_counts in (("mgg", True), ("pap", False)):
        fit = Morphometric.fit(measure_stain(normals, 0.25, stain), stain)
        s = fit.score(measure_stain(test, 0.25, stain))
        assert s[1] > 3 * max(s[0], 0.1)  # an enlarged nucleus
        assert (s[2] > 3 * max(s[0], 0.1)) == small_counts  # a small one: both sides only
        assert Morphometric.from_record(fit.as_record()).score(
            measure_stain(test, 0.25, stain)
        ) == pytest.approx(s, rel=1e-3)


def _blob(shape, size=96):
    """A Pap crop whose nucleus is ``shape(yy, xx)`` (a mask from offsets to the centre)."""
    img = _crop(size, nuclei=(), cyto=40, cyto_colour=CYTOPLASM["pap"])
    yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
    img[shape(yy, xx)] = NUCLEUS
    return img


def test_the_pap_score_discounts_a_large_outline_that_is_not_one_round_nucleus():
    """A large "nucleus" of irregular outline (on CRIC most often dense cytoplasm, a fold or
    overlapping nuclei; an enlarged low-grade nucleus is smooth) ranks below a round one of the
    same size: the enlargement's standard deviations are divided by 1 + DISCOUNT times the
    contour irregularity's above the normals'. A composed slide's planted lesions in its top 100
    went from 0.34 to 0.59 with it (benchmarks/science/pap/)."""
    from cyto.data.morphometry import DISCOUNT

    rng = np.random.default_rng(0)
    normals = np.stack([
        _blob(lambda y, x, r=r, d=d: (np.hypot(y, x) <= r) | (np.hypot(y, x - d) <= 0.8 * r))
        for r, d in zip(rng.uniform(9, 11, 40), rng.uniform(0, 8, 40), strict=True)
    ])  # fmt: skip
    fit = Morphometric.fit(measure_stain(normals, 0.25, "pap"), "pap")
    assert [(f.name, f.direction) for f in fit.features] == [
        ("nucleus_share", "up"), ("contour_irregularity", "discount"),
    ]  # fmt: skip
    round_ = _blob(lambda y, x: np.hypot(y, x) <= 16)
    crescent = _blob(lambda y, x: (np.hypot(y, x) <= 21) & (np.hypot(y, x - 13) > 13))
    m = measure_stain(np.stack([round_, crescent]), 0.25, "pap")
    assert m["nucleus_area_um2"][1] >= m["nucleus_area_um2"][0]  # the crescent is no smaller
    assert m["contour_irregularity"][1] > 0.2 > 0.05 > m["contour_irregularity"][0]
    s = fit.score(m)
    assert s[0] > 3 * s[1] > 0, s
    # the share's own score, divided as the docstring says
    share = Morphometric("pap", fit.features[:1]).score(m)
    irr = fit.features[1]
    z = max((m["contour_irregularity"][1] - irr.mean) / irr.sd, 0.0)
    assert s[1] == pytest.approx(share[1] / (1 + DISCOUNT * z))
    # kept by the bundle's record; a Pap bundle of an earlier cyto (the share alone) keeps its
    # scores
    assert Morphometric.from_record(fit.as_record()).score(m) == pytest.approx(s, rel=1e-3)
    old = fit.as_record()
    old["features"] = old["features"][:1]
    assert Morphometric.from_record(old).score(m) == pytest.approx(share, rel=1e-3)
    # normals whose outlines are all convex give no spread to discount by: the share alone,
    # never a refused training
    convex = Morphometric.fit(measure_stain(_normals(), 0.25, "pap"), "pap")
    assert [f.name for f in convex.features] in (
        ["nucleus_share"], ["nucleus_share", "contour_irregularity"],
    )  # fmt: skip
    flat = measure_stain(_normals(), 0.25, "pap")
    flat["contour_irregularity"] = np.zeros_like(flat["contour_irregularity"])
    assert [f.name for f in Morphometric.fit(flat, "pap").features] == ["nucleus_share"]


def test_a_pap_bundle_without_the_contour_discount_says_so():
    """A Pap bundle trained before the contour discount keeps its score (the share alone): it
    ranks differently from one trained now, which cyto info and cyto train say in one line;
    a bundle with the discount, or of another stain, says nothing of it."""
    from cyto.data.morphometry import unfitted_words

    fit = Morphometric.fit(measure_stain(_normals(), 0.25, "pap"), "pap").as_record()
    share = {"name": "nucleus_share", "direction": "up", "mean": -3.2, "sd": 0.15}
    irr = {"name": "contour_irregularity", "direction": "discount", "mean": 0.02, "sd": 0.02}
    old = {"morphometry": {**fit, "stain": "pap", "features": [share]}}
    (line,) = unfitted_words(old)
    assert line.startswith(
        "the morphometric score of these pap cells is without its contour_irregularity discount"
    ), line
    assert unfitted_words({"morphometry": {"stain": "pap", "features": [share, irr]}}) == []
    mgg = Morphometric.fit(measure_stain(_normals(), 0.25, "mgg"), "mgg").as_record()
    assert unfitted_words({"morphometry": mgg}) == [] and unfitted_words(None) == []


@given(median=st.floats(1.0, 2000.0), mpp=st.floats(0.05, 2.0))
def test_a_pap_training_whose_normal_nuclei_are_not_a_normal_size_doubts_its_pixel_size(
    median, mpp
):
    """Hostile round 26 (1): `--set mpp=0.5` for CRIC's 0.258 um/px crops trained without a
    word, its normal nuclei measured at a median of ~100 um^2 (a normal intermediate squamous
    nucleus is about 35, 40 as the Pap mask measures it) and its held-back AUROC fell from 0.814
    to 0.672; round 27 (7): 0.16 passed (19 um^2) under 2.25x about 35. Past 2x either way (a
    pixel size 1.41x off) the training and cyto info say so, with the pixel size that would give
    a normal nucleus; MGG (normals of many sizes) is not checked."""
    from cyto.data.morphometry import (
        NORMAL_NUCLEUS_UM2,
        NUCLEUS_AREA_SPREAD,
        nucleus_size_check,
        unfitted_words,
    )

    areas = np.full(40, median)
    areas[::7] = np.nan  # crops without a measured nucleus are left out
    check = nucleus_size_check("pap", areas, mpp)
    lines = unfitted_words({"nucleus_size_check": check})
    ratio = median / NORMAL_NUCLEUS_UM2["pap"]
    if 1 / NUCLEUS_AREA_SPREAD * 1.001 < ratio < NUCLEUS_AREA_SPREAD * 0.999:
        assert lines == []
    elif not 1 / NUCLEUS_AREA_SPREAD <= ratio <= NUCLEUS_AREA_SPREAD:
        (line,) = lines
        # from the median as the bundle records it (two decimals), as the line is worded
        recorded = check["median_um2"]
        likely = mpp * (NORMAL_NUCLEUS_UM2["pap"] / recorded) ** 0.5
        assert line.startswith(
            f"the training normals' nuclei measure a median of {recorded:.0f} um^2 at {mpp:.3g} "
            "um/px, where a normal pap cell's measures about 40 um^2: is the pixel size right? "
            f"Nearer {likely:.2g} um/px"
        ), line
    assert nucleus_size_check("mgg", areas, mpp) is None
    assert nucleus_size_check("pap", areas, None) is None
    assert nucleus_size_check("pap", areas[:5], mpp) is None  # too few to say


@pytest.mark.realdata
def test_cric_normals_at_their_pixel_size_pass_and_at_twice_it_are_doubted(cric, tmp_path):
    """The check on real Pap normals: CRIC's NILM crops at 0.258 um/px (found from the normal
    nucleus's size) measure a median near 40 um^2 and pass, as at 0.2 and 0.33; at 0.5 and
    0.16 (round 27, 7) they are doubted, with a pixel size near 0.258 named."""
    import os

    from cyto.data.dataset import PatchDataset
    from cyto.data.morphometry import unfitted_words
    from cyto.train.api import training_nuclei
    from cyto.train.data import TrainData

    (tmp_path / "NILM").mkdir()
    for f in sorted((cric / "NILM").glob("*.png"))[:120]:
        os.symlink(f, tmp_path / "NILM" / f.name)
    ds = PatchDataset.from_path(tmp_path, normal="NILM", size=64)
    data = TrainData(np.asarray(ds.images), np.zeros(len(ds), int), None, None, ds.fingerprint)
    said = {}
    for mpp in (0.16, 0.2, 0.258, 0.33, 0.5):
        nuclei = training_nuclei(data, "pap", mpp * 100 / 64, mpp)
        said[mpp] = [w for w in unfitted_words(nuclei) if "median" in w]
    assert said[0.2] == said[0.258] == said[0.33] == [], said
    for wrong in (0.16, 0.5):
        (line,) = said[wrong]
        assert f"at {wrong:g} um/px" in line, line
        likely = float(line.split("Nearer ")[1].split(" um/px")[0])
        assert 0.2 <= likely <= 0.3, line


def test_a_bundle_of_an_earlier_cyto_keeps_its_nucleus_size_score():
    """``nucleus_size`` (the log centre share's mean and sd) is the mgg score under its old name:
    the same numbers as before for every cell."""
    record = {"log_mean": -3.0, "log_sd": 0.4}
    old = Morphometric.from_record(None, record)
    shares = np.array([0.0, 0.01, 0.05, 0.2])
    want = np.abs(np.log(shares + 1e-3) + 3.0) / 0.4
    assert old.score({"nucleus_share": shares}) == pytest.approx(want)
    assert Morphometric.from_record(None, None) is None


def test_a_score_needs_normals_that_vary():
    with pytest.raises(ConfigError, match=">= 2 normal cells"):
        Morphometric.fit(measure_stain(_normals(1), 0.25, "pap"), "pap")
    same = np.stack([_crop()] * 5)
    with pytest.raises(ConfigError, match="does not vary"):
        Morphometric.fit(measure_stain(same, 0.25, "pap"), "pap")
    with pytest.raises(ConfigError, match="stain must be one of"):
        Morphometric.fit(measure_stain(_normals(), 0.25, "pap"), "papanicolaou")


def test_the_fused_score_is_the_mean_share_of_ranks_whatever_the_scales():
    model = np.array([0.1, 5.0, 2.0, 3.0])  # ranks 1, 4, 2, 3
    morph = np.array([900.0, 100.0, 800.0, 700.0])  # ranks 4, 1, 3, 2
    fused = fused_score(model, morph)
    assert fused.tolist() == pytest.approx([5 / 8, 5 / 8, 5 / 8, 5 / 8])
    assert fused_score(model * 1e6, np.log(morph)).tolist() == fused.tolist()
    assert ranked_values("model+morphometry", model, morph).tolist() == fused.tolist()
    assert ranked_values("morphometry", model, morph).tolist() == morph.tolist()
    with pytest.raises(ValueError):
        fused_score(model, morph[:3])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "morphometry", "model+morphometry"]),
                       st.floats(0.0, 1.0), min_size=1))  # fmt: skip
def test_auto_takes_the_best_held_back_ranking_and_never_a_fusion_below_a_part(auroc):
    how, why = choose_ranking({"auroc": auroc, "normal_cells": 10, "abnormal_cells": 5})
    if "model" not in auroc:
        assert how == "model"
        return
    assert auroc[how] == max(auroc.values())  # the best
    if how == "model+morphometry":
        assert auroc[how] > auroc["model"] and auroc[how] > auroc.get("morphometry", -1)
    if how != "model":
        assert auroc[how] > auroc["model"]  # a tie keeps the model
    assert "AUROC" in why


def test_auto_reads_numbers_not_a_recorded_choice_and_ranks_by_the_model_without_them():
    record = {"auroc": {"model": 0.9, "morphometry": 0.7}, "chosen": "morphometry"}
    assert choose_ranking(record)[0] == "model"
    morph = Morphometric.from_record(None, {"log_mean": -3.0, "log_sd": 0.4})
    assert resolve_rank_by("auto", morph, None) == "model"
    assert resolve_rank_by("auto", morph, {"auroc": {"model": 0.6, "morphometry": 0.8}}) == (
        "morphometry"
    )
    assert resolve_rank_by("auto", None, {"auroc": {"model": 0.6, "morphometry": 0.8}}) == "model"
    assert resolve_rank_by("model+nucleus", morph, None) == "model+morphometry"  # the old name
    with pytest.raises(ConfigError, match="records no morphometry"):
        resolve_rank_by("morphometry", None, None)
    with pytest.raises(ConfigError, match="--rank-by must be one of"):
        resolve_rank_by("nuclei", morph, None)


def test_the_validation_record_holds_each_rankings_auroc():
    labels = np.array([0, 0, 0, 1, 1])
    model = np.array([0.1, 0.2, 0.9, 0.3, 0.8])
    morph = np.array([0.0, 0.1, 0.2, 0.9, 0.8])
    rec = validation_record(labels, model, morph, {"NILM": 3, "LSIL": 2})
    assert rec["auroc"]["morphometry"] == 1.0 and rec["auroc"]["model"] == pytest.approx(4 / 6)
    assert rec["normal_cells"] == 3 and rec["abnormal_cells"] == 2
    assert choose_ranking(rec)[0] == "morphometry"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.floats(-5, 5)), min_size=2, max_size=60),
    st.randoms(use_true_random=False),
)
def test_tied_cells_are_ranked_by_the_models_score_not_by_where_they_come_from(cells, rnd):
    """A one-sided morphometric score ties many cells (at 0); their order follows the model's
    score, so a folder read class by class does not hand its first class the tied ranks."""
    from cyto.infer.outputs import ranks

    ranked = np.array([c[0] for c in cells], dtype=float)
    model = np.array([c[1] for c in cells])
    order, rank = ranks(ranked, then=model)
    assert sorted(rank.tolist()) == list(range(1, len(cells) + 1))
    keys = list(zip(-ranked[order], -model[order], strict=True))
    assert keys == sorted(keys)
    perm = np.array(rnd.sample(range(len(cells)), len(cells)))
    _, again = ranks(ranked[perm], then=model[perm])
    pairs = set(zip(ranked.tolist(), model.tolist(), strict=True))
    if len(pairs) == len(cells):  # no full ties: the same rank whatever the input order
        assert np.array_equal(again, rank[perm])


def test_a_log_share_is_shown_as_a_share_with_its_transform_named():
    """cyto info printed the mean and sd of log(share + floor) as the share: 'nucleus_share
    (up) -2.935 +- 1.022' (hostile round 18, case 2)."""
    words = Feature("nucleus_share", "up", -2.935, 1.022).words()
    assert words == (
        "nucleus_share (up: nuclear enlargement) 0.0521 (0.0181 to 0.147 within one sd; "
        "log(nucleus_share + 0.001) -2.935 +- 1.022)"
    ), words
    nc = Feature("nc_ratio", "up", 0.0, 1.0).words()
    assert nc.startswith("nc_ratio (up) 0.5 (") and "logit of nc_ratio 0.000 +- 1.000" in nc
    # a discount (1 - solidity in [0, 1]) has no span to show: "-0.00588 to 0.18" read as a
    # negative irregularity
    disc = Feature("contour_irregularity", "discount", 0.0871, 0.093).words()
    # each part named in the cytologist's words too (round 27, 1)
    assert disc == (
        "contour_irregularity (discount: 1 - solidity: irregular outlines are rarely one "
        "nucleus) 0.0871 +- 0.093: the score divided by 1 + 0.5 x its sds above the normals'"
    ), disc


def test_auto_on_too_few_held_back_abnormal_cells_is_said_in_the_callers_words():
    few = {"auroc": {"model": 0.775, "model+morphometry": 0.975}, "abnormal_cells": 1}
    assert few_abnormal_words(few) == (
        "--rank-by auto's choice rests on 1 held-back abnormal cell(s), fewer than 20 (an "
        "AUROC's standard error on so few is about 0.1 or more): train with more abnormal "
        "cells (--abnormal), or choose the ranking with --rank-by"
    )
    with python_words("train"):
        assert "(abnormal=), or choose the ranking with rank_by=" in few_abnormal_words(few)
    assert few_abnormal_words({**few, "abnormal_cells": MIN_ABNORMAL}) is None
    assert few_abnormal_words(None) is None  # nothing held back: said elsewhere


@pytest.mark.parametrize("kind", ["smear", "pap", "tissue"])
def test_ink_on_a_crop_is_neither_nucleus_nor_cell_and_moves_no_threshold(kind):
    """A black bar, a pen stroke or a black frame on a crop (hostile round 20) took the upper
    class of the crop's own threshold to itself: the cell's nucleus fell in with its cytoplasm
    and the ink was measured. Opaque pixels are left out of the crop's thresholds and of both
    masks (the detectors' rule, :func:`cyto.detect.params.clear_of_opaque`), so the centre
    nucleus measures as on a clean crop, wherever the ink lies and however much of it."""
    mpp, r = 0.25, 10.0
    clean = _crop(nuclei=((0, 0, r),), cyto=34, cyto_colour=CYTOPLASM[kind])
    want = measure(clean, mpp, CELL_MASKS[kind])
    rng = np.random.default_rng(7)
    inked = []
    for _ in range(12):
        crop = clean.copy()
        width, at = int(rng.integers(2, 9)), int(rng.integers(0, 12))
        if rng.random() < 0.5:
            crop[:, at : at + width] = rng.integers(0, 8)  # a bar at the left edge
        else:
            crop[:width] = crop[-width:] = crop[:, :width] = crop[:, -width:] = 0  # a frame
        inked.append(crop)
    got = measure(np.stack(inked), mpp, CELL_MASKS[kind])
    for name in ("nucleus_area_um2", "nucleus_share"):
        # as the clean crop within the mask's own error on a round nucleus (a ring of the
        # 48 px working resolution: 12 %, test_a_round_nucleus_...)
        assert got[name] == pytest.approx(np.full(12, want[name][0]), rel=0.17), name
    assert (got["nuclei_in_cell"] == 1).all()
    assert got["nucleus_od"] == pytest.approx(np.full(12, want["nucleus_od"][0]), rel=0.1)
    # a crop of nothing but ink has no nucleus to measure
    black = measure(np.zeros((1, 96, 96, 3), np.uint8), mpp, CELL_MASKS[kind])
    assert black["nucleus_share"][0] == 0 and np.isnan(black["nucleus_area_um2"][0])
    # a thin bar across the centre nucleus, and a dot on it: filled from around, the nucleus
    # measures as on the clean crop (left out, the Pap mask measured the cytoplasm: 6x its
    # share; cut out with what the smoothing carried, the nucleus was gone and the cell ranked
    # as the most normal: code review, hostile round 21)
    across, dot = clean.copy(), clean.copy()
    across[46:49, 30:67] = 0
    dot[44:50, 44:50] = 3
    for crop in (across, dot):
        m = measure(crop, mpp, CELL_MASKS[kind])
        assert m["nucleus_area_um2"][0] == pytest.approx(want["nucleus_area_um2"][0], rel=0.17)
        assert m["nuclei_in_cell"][0] == 1


@given(n=st.integers(0, 400), share=st.floats(0.01, 0.99))
def test_the_hold_back_advice_names_counts_and_shares_that_hold_back(n, share):
    """Hostile round 34 (2): 15 normal cells at holdout 0.5 were told "give 19", and 19 then
    "a smaller holdout" (20 is the least that holds back; no share does below it), 10 at 0.9
    "give 11" (100). Every count and share the advice names holds back, the count is the
    least, and below 20 normal cells no share is offered."""
    import re

    from cyto.data.morphometry import MIN_HELD, holdout_why

    why = holdout_why(n, share)
    held = round(share * n)
    assert (why is None) == (held >= MIN_HELD and n - held >= MIN_HELD)
    if why is None:
        return
    if n < 2 * MIN_HELD:
        assert "no share holds back from fewer than 20" in why and "from 0." not in why, why
        return
    lo, hi = (float(x) for x in re.search(r"from ([0-9.]+) to ([0-9.]+)", why).groups())
    assert holdout_why(n, lo) is None and holdout_why(n, hi) is None, why
    more = re.search(r"give (\d+) or more normal cells", why)
    if more:
        need = int(more[1])
        assert holdout_why(need, share) is None and holdout_why(need - 1, share) is not None


def test_a_hold_back_turned_off_is_the_reason_said():
    """Hostile round 34 (6): `--set holdout=0` with abnormal classes said nothing at training,
    and info a vague reason: the reason names the setting."""
    from cyto.data.morphometry import choose_ranking, few_abnormal_words, holdout_why

    assert holdout_why(300, 0.0) == "--set holdout is 0"
    skipped = {"skipped": {"normal_cells": 300, "holdout": 0.0}}
    assert choose_ranking(skipped) == (
        "model",
        "nothing was held back at training: --set holdout is 0",
    )
    assert few_abnormal_words(skipped).endswith(
        "nothing was held back to compare them on: --set holdout is 0"
    )


def test_the_nucleus_od_is_in_the_natural_log_units_its_documentation_names():
    """`nucleus_od` is -ln(I / I0) summed over R, G, B; it was documented as "OD", which a lab
    reads as log10 (QuPath's), 2.3x off (hostile round 50, 2). The measured value of a flat
    nucleus is the natural-log sum, and the unit names it, in the code and in the outputs page."""
    from pathlib import Path

    crop = _crop(nuclei=((0, 0, 16.0),), cyto=40, cyto_colour=CYTOPLASM["pap"])
    got = measure(crop, 0.25, CELL_MASKS["pap"])["nucleus_od"][0]
    natural = sum(-np.log((v + 1) / 256) for v in NUCLEUS)
    assert got == pytest.approx(natural, rel=0.05)
    unit, words = COLUMNS["nucleus_od"]
    assert unit == "OD, natural log" and "x 0.434" in words
    page = Path(__file__).parents[2] / "docs" / "reference" / "outputs.md"
    assert "| `nucleus_od` | OD, natural log |" in page.read_text()


@pytest.mark.parametrize(
    ("training", "stain", "said"),
    [
        ({"abnormal": [], "morphometry": {"x": 1}}, "pap", True),
        ({"abnormal": ["LSIL"], "morphometry": {"x": 1}}, "pap", False),  # FS-SIL, labelled
        ({"morphometry": {"x": 1}}, "pap", False),  # an earlier cyto: unknown, not said
        ({"abnormal": [], "morphometry": {"x": 1}}, "mgg", False),
        ({"abnormal": []}, "pap", False),  # no morphometric score to rank by
    ],
)
def test_a_pap_bundle_of_normals_alone_is_warned_and_no_other(training, stain, said):
    """Hostile round 73, 1: a Pap bundle trained on NILM alone ranked by its network (near
    chance on Pap cells) with the advice only in a training note. The warning is the bundle's
    (cyto info's warnings), for that bundle alone: not one trained with abnormal classes."""
    from cyto.data.morphometry import ranking_said

    manifest = {"config": {"stain": stain}, "training_data": training, "validation": None}
    warned = [w for w in ranking_said(manifest)["warnings"] if "normal cells alone" in w]
    assert bool(warned) is said, warned
