"""The torch nucleus detector's steps against SciPy / scikit-image, on random images."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage
from skimage.filters import threshold_otsu

from cyto.detect import torch_form as nt
from cyto.detect.numpy_form import haematoxylin

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("sigma", [0.3, 2.0, 8.0, 70.0])  # 70: a kernel wider than the image
def test_gaussian_is_scipys(sigma):
    img = RNG.random((90, 70)).astype(np.float32)
    got = nt.gaussian(torch.from_numpy(img), sigma).numpy()
    assert np.abs(got - ndimage.gaussian_filter(img, sigma)).max() < 1e-5


def test_haematoxylin_and_otsu_are_the_scipy_detectors():
    rgb = RNG.integers(0, 256, (60, 50, 3), dtype=np.uint8)
    h = nt.haematoxylin(torch.from_numpy(rgb))
    assert np.array_equal(h.numpy(), haematoxylin(rgb))
    smooth = ndimage.gaussian_filter(h.numpy(), 2.0)
    assert nt.otsu(torch.from_numpy(smooth)) == pytest.approx(threshold_otsu(smooth), abs=1e-4)
    with pytest.raises(ValueError):
        nt.otsu(torch.zeros((4, 4)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opening_labels_and_distances_are_ndimages(seed):
    rng = np.random.default_rng(seed)
    mask = ndimage.gaussian_filter(rng.random((160, 130)), 2 + seed) > 0.5
    opened = nt.binary_opening(torch.from_numpy(mask))
    assert np.array_equal(opened.numpy(), ndimage.binary_opening(mask))
    m = opened.numpy()
    want, n = ndimage.label(m)
    got = nt.label(opened).numpy()
    assert got.max() == n and np.array_equal(got, want)  # same numbers, raster order
    dist = nt.distance_transform(opened, 100).numpy()
    assert np.abs(dist - ndimage.distance_transform_edt(m)).max() < 1e-4


def test_empty_and_full_masks():
    assert nt.label(torch.zeros((5, 6), dtype=torch.bool)).sum() == 0
    full = torch.ones((7, 9), dtype=torch.bool)
    assert nt.label(full).unique().tolist() == [1]
    rgb = np.full((64, 64, 3), 240, dtype=np.uint8)  # blank glass
    assert len(nt.detect_nuclei_torch(rgb)) == 0


def test_a_small_nucleus_beside_a_large_one_is_found_by_both_detectors():
    """The torch detector once took its window maximum over every component, so the centre of a
    small nucleus a few pixels from a large one (lower than the large one's pixels in its window)
    was no peak there, while the SciPy detector, per component, found it."""
    from cyto.detect import NucleusParams
    from cyto.detect.numpy_form import detect_numpy

    yy, xx = np.mgrid[:120, :160]
    rgb = np.full((120, 160, 3), 235, dtype=np.uint8)
    nuclei = (np.hypot(yy - 60, xx - 50) <= 32) | (np.hypot(yy - 60, xx - 96) <= 9)
    rgb[nuclei] = (70, 40, 130)  # MGG purple
    params = NucleusParams(min_area=100, downsample=1)
    want = detect_numpy(rgb, params)
    assert len(want) == 2, want
    assert np.array_equal(nt.detect_nuclei_torch(rgb, params), want)
