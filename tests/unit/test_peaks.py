"""The detectors' distance-transform peaks: scikit-image's ``peak_local_max`` with labels, the same
coordinates in the same order, without its loop over every component; and the SciPy detector's
faster steps (distance transform, opening, window maximum, haematoxylin), the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from skimage.feature import peak_local_max

from cyto.detect.peaks import component_peaks


def _skimage(dist, labels, d):
    return peak_local_max(dist, min_distance=d, labels=labels, exclude_border=False)


def _field(seed: int):
    """Random blobs; some cut apart by one-pixel lines (components a pixel from each other, the
    case a single maximum filter gets wrong), some with whole-number plateaus (ties, peaks at
    exactly the spacing), some left unopened (one-pixel components: every pixel a peak)."""
    rng = np.random.default_rng(seed)
    h, w = rng.integers(20, 200, 2)
    mask = ndimage.gaussian_filter(rng.random((h, w)), rng.uniform(1, 6)) > rng.uniform(0.45, 0.55)
    if seed % 3 == 0:
        mask = ndimage.binary_opening(mask)
    if seed % 5 == 0:
        mask[:, :: int(rng.integers(4, 9))] = False
    labels, _ = ndimage.label(mask)
    dist = ndimage.distance_transform_edt(mask)
    if seed % 4 == 1:
        dist = np.round(dist)
    return dist, labels, int(rng.integers(1, 12))


@pytest.mark.parametrize("block", range(4))
def test_the_peaks_are_scikit_images(block):
    for seed in range(block * 60, block * 60 + 60):
        dist, labels, d = _field(seed)
        want = _skimage(dist, labels, d)
        sizes = np.bincount(labels.ravel())[1:] if seed % 2 else None  # as the detectors give
        got = component_peaks(dist, labels, d, sizes=sizes)
        assert np.array_equal(got, want), (seed, d, len(got), len(want))


def test_a_shallow_peak_beside_a_deeper_neighbour_is_kept():
    """Two components 2 px apart: the small one's centre is below the big one's pixels in its
    window, yet it is its own component's peak."""
    yy, xx = np.mgrid[:80, :120]
    big = np.hypot(yy - 40, xx - 40) <= 30
    small = np.hypot(yy - 40, xx - 80) <= 7
    labels, n = ndimage.label(big | small)
    assert n == 2
    dist = ndimage.distance_transform_edt(labels > 0)
    got = component_peaks(dist, labels, 24)
    assert [tuple(p) for p in got] == [(40, 40), (40, 80)]
    assert np.array_equal(got, _skimage(dist, labels, 24))


def test_edges_empty_and_no_background():
    empty = np.zeros((9, 9))
    assert component_peaks(empty, empty.astype(np.int32), 3).shape == (0, 2)
    full = np.ones((9, 9), dtype=np.int32)
    dist = ndimage.distance_transform_edt(full)  # no background at all
    assert np.array_equal(component_peaks(dist, full, 3), _skimage(dist, full, 3))


def test_a_crowded_tile_gives_scikit_images_peaks():
    """Hundreds of overlapping and touching discs at the size of a smear tile (what the function
    is for; its speed is measured in benchmarks/speed/detect_before_after.py, not here)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:768, :768]
    mask = np.zeros((768, 768), dtype=bool)
    for y, x, r in zip(
        rng.uniform(0, 768, 500), rng.uniform(0, 768, 500), rng.uniform(4, 12, 500), strict=True
    ):
        y0, x0 = int(max(0, y - r)), int(max(0, x - r))
        win = np.s_[y0 : int(y + r) + 1, x0 : int(x + r) + 1]
        mask[win] |= np.hypot(yy[win] - y, xx[win] - x) <= r
    labels, n = ndimage.label(mask)
    dist = ndimage.distance_transform_edt(mask)
    assert n > 200
    for d in (3, 6, 12):
        assert np.array_equal(component_peaks(dist, labels, d), _skimage(dist, labels, d)), d


def _one_peak_reference(peaks, dist, labels):
    """The rule as first written, one peak at a time: deepest first, a peak dropped when closer to
    a kept peak of its component than 1.5x that peak's depth."""
    depth = dist[peaks[:, 0], peaks[:, 1]]
    comp = labels[peaks[:, 0], peaks[:, 1]]
    depth2 = np.rint(depth.astype(float) ** 2)  # whole numbers, as the rule compares them
    kept, in_comp = [], {}
    for i in np.argsort(-depth, kind="stable"):
        same = in_comp.setdefault(int(comp[i]), [])
        if not any(4 * ((peaks[i] - peaks[j]) ** 2).sum() < 9 * depth2[j] for j in same):
            kept.append(int(i))
            same.append(int(i))
    return peaks[sorted(kept)]


def test_one_peak_per_nucleus_keeps_the_rule():
    from cyto.detect.params import _one_peak_per_nucleus

    for seed in range(30):
        dist, labels, _ = _field(seed)
        peaks = component_peaks(dist, labels, 2)  # many peaks: many clashes to settle
        want = _one_peak_reference(peaks, dist, labels)
        assert np.array_equal(_one_peak_per_nucleus(peaks, dist, labels), want), seed


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_gap_of_exactly_one_and_a_half_depths_is_settled_alike_in_both_precisions(dtype):
    """Depth sqrt(8) and a gap of sqrt(18) = 1.5 sqrt(8): not closer than 1.5 depths, so both
    peaks stay. In float64 the gap came out below 1.5 depths and the second peak was dropped, in
    float32 (the torch detector) it stayed: the detectors disagreed on CMU-1 (5,069 / 5,070)."""
    from cyto.detect.params import _one_peak_per_nucleus

    dist = np.zeros((20, 20), dtype=dtype)
    dist[10, 10], dist[13, 13] = np.sqrt(dtype(8)), 2
    labels = np.ones((20, 20), dtype=np.int32)
    peaks = np.array([[10, 10], [13, 13]])
    assert np.array_equal(_one_peak_per_nucleus(peaks, dist, labels), peaks)
    dist[13, 12] = 1  # one pixel closer: dropped
    near = np.array([[10, 10], [13, 12]])
    assert np.array_equal(_one_peak_per_nucleus(near, dist, labels), near[:1])


def test_the_fast_distance_transform_is_scipys_to_the_bit():
    from cyto.detect.numpy_form import distance

    rng = np.random.default_rng(4)
    masks = [
        ndimage.gaussian_filter(rng.random(tuple(rng.integers(3, 300, 2))), rng.uniform(0.5, 8))
        > rng.uniform(0.3, 0.6)
        for _ in range(40)
    ]
    one = np.zeros((9, 7), dtype=bool)
    one[4, 3] = True
    masks += [np.ones((6, 9), dtype=bool), np.zeros((6, 9), dtype=bool), one]
    for m in masks:
        want = ndimage.distance_transform_edt(m)
        got = distance(m)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_the_fast_opening_is_scipys():
    from cyto.detect.numpy_form import opening

    rng = np.random.default_rng(5)
    for i in range(60):
        m = rng.random(tuple(rng.integers(1, 200, 2))) > rng.uniform(0.1, 0.9)
        if i % 2:
            m = ndimage.gaussian_filter(m.astype(float), 2) > 0.5
        assert np.array_equal(opening(m), ndimage.binary_opening(m)), i
    full = np.ones((5, 6), dtype=bool)  # the border is background: an all-foreground image erodes
    assert np.array_equal(opening(full), ndimage.binary_opening(full))


def test_the_fast_window_maximum_is_scipys():
    from cyto.detect.peaks import window_maximum

    rng = np.random.default_rng(6)
    for i in range(40):
        a = np.round(rng.random(tuple(rng.integers(1, 150, 2))) * 9, 1)  # ties, as distances have
        a[rng.random(a.shape) < 0.3] = 0
        if i % 3 == 0:
            a = a[::2, 1::3]  # a view, not contiguous
        for size in (3, 5, 11, 17):
            want = ndimage.maximum_filter(a, size=size, mode="nearest")
            got = window_maximum(a, size)
            assert got.dtype == want.dtype and np.array_equal(got, want), (i, size)


def test_the_fast_haematoxylin_is_the_tables_and_skimages():
    """The per-channel tables summed in channel order in float32 (the torch detector's numbers
    too), and skimage's ``rgb2hed`` within float32 rounding; RGBA and views as well."""
    from skimage.color import rgb2hed

    from cyto.detect.numpy_form import haematoxylin
    from cyto.detect.params import _H_FROM_RGB, _HED_LOG

    rng = np.random.default_rng(7)
    rgba = rng.integers(0, 256, (97, 131, 4), dtype=np.uint8)
    rgba[:5, :5, :3] = 255  # white glass: no haematoxylin
    rgba[5:9, :5, :3] = 0
    tables = [(_HED_LOG * w).astype(np.float32) for w in _H_FROM_RGB]
    for rgb in (rgba[..., :3], rgba, np.ascontiguousarray(rgba[::-1, ::2, :3])):
        want = tables[0][rgb[..., 0]]
        want += tables[1][rgb[..., 1]]
        want += tables[2][rgb[..., 2]]
        np.maximum(want, 0, out=want)
        got = haematoxylin(rgb)
        assert got.dtype == np.float32 and np.array_equal(got, want)
        ref = np.maximum(rgb2hed(rgb[..., :3])[..., 0], 0)
        np.testing.assert_allclose(got, ref, atol=1e-5)
    assert np.all(haematoxylin(rgba)[:5, :5] == 0)
