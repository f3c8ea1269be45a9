"""The paper's augmentations: shapes, dtypes and determinism under a seed."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.data.augment import (
    STRONG_NAMES,
    eval_view,
    pseudo_abnormal_view,
    size_preserving_view,
    strong_transforms,
    weak_view,
)


@pytest.fixture(scope="module")
def image():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(250, 250, 3), dtype=np.uint8)
    img[100:150, 100:150] = (80, 40, 160)
    return img


@pytest.mark.parametrize(
    "make",
    [
        lambda: weak_view(224, seed=5),
        lambda: pseudo_abnormal_view(224, 250, seed=5),
        lambda: pseudo_abnormal_view(224, 250, seed=5, mode="all"),
        lambda: eval_view(224),
        lambda: size_preserving_view(224, seed=5),
    ],
)
def test_shapes_and_dtypes(make, image):
    out = make()(image)
    assert out.shape == (3, 224, 224)
    assert out.dtype == np.float32
    assert np.isfinite(out).all()
    assert out.flags["C_CONTIGUOUS"]


def test_weak_views_are_seeded(image):
    a = [weak_view(seed=1)(image) for _ in range(2)]
    np.testing.assert_array_equal(a[0], a[1])
    view = weak_view(seed=1)
    first, second = view(image), view(image)
    assert not np.array_equal(first, second)  # successive views differ: they are random
    np.testing.assert_array_equal(first, a[0])
    assert not np.array_equal(weak_view(seed=2)(image), a[0])


def test_pseudo_abnormal_views_are_seeded(image):
    v1, v2 = pseudo_abnormal_view(seed=9), pseudo_abnormal_view(seed=9)
    for _ in range(3):
        np.testing.assert_array_equal(v1(image), v2(image))


def test_strong_set_members_each_change_the_image(image):
    members = strong_transforms(224, 250)
    assert tuple(members) == STRONG_NAMES
    import albumentations as A

    for name, t in members.items():
        pipe = A.Compose([t, A.Resize(224, 224)], seed=0)
        out = pipe(image=image)["image"]
        ref = A.Compose([A.Resize(224, 224)], seed=0)(image=image)["image"]
        assert out.shape == (224, 224, 3), name
        assert not np.array_equal(out, ref), f"{name} left the image unchanged"


def test_center_crop_keeps_the_paper_ratio_for_small_patches():
    members = strong_transforms(96, 96)
    crop = members["center_crop"].transforms[0]
    assert crop.height == round(96 * 180 / 250)


def test_eval_view_is_deterministic_and_normalized(image):
    a, b = eval_view(224)(image), eval_view(224)(image)
    np.testing.assert_array_equal(a, b)
    flat = np.full((32, 32, 3), 255, np.uint8)
    out = eval_view(32)(flat)
    np.testing.assert_allclose(
        out[:, 0, 0], [(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225], rtol=1e-5
    )


def test_rejects_wrong_input(image):
    with pytest.raises(ValueError, match="uint8"):
        weak_view()(image.astype(np.float32))
    with pytest.raises(ValueError, match="mode"):
        pseudo_abnormal_view(mode="some")


def test_size_preserving_views_are_seeded_and_never_zoom():
    img = np.zeros((100, 100, 3), np.uint8)
    img[40:60, 40:60] = 200  # a square "nucleus" of 20x20 px in the middle
    a, b = size_preserving_view(100, seed=4), size_preserving_view(100, seed=4)
    for _ in range(5):
        va, vb = a(img), b(img)
        np.testing.assert_array_equal(va, vb)
        bright = (va.mean(axis=0) > 1.0).sum()
        assert 300 <= bright <= 500  # about 20x20 px whatever the view: no crop, no zoom
