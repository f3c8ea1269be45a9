"""Stain normalization (``--set stain_norm=reinhard``): what a user relies on is that a colour shift
of the kind another lab's stain or scanner makes barely moves the scores, and that the bundle, its
ONNX graph and `cyto score` apply the normalization the model was trained with."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.bundle import save_bundle
from cyto.data.stain import lab_stats, normalize_images, reference
from cyto.runtime import load_scorer
from tests.train_helpers import make


def _cast(images: np.ndarray) -> np.ndarray:
    """Another lab's colours: a bluer stain and a dimmer, warmer scanner."""
    x = images.astype(np.float32) * np.array([0.82, 0.9, 1.0]) + np.array([12.0, 0.0, -10.0])
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def test_normalized_images_take_the_reference_statistics(tiny):
    ref = reference(tiny.images)
    shifted = _cast(tiny.images)
    before, _ = lab_stats(shifted)
    after, after_sd = lab_stats(normalize_images(shifted, ref))
    gap_before = np.abs(before - np.array(ref["mean"])).mean()
    gap_after = np.abs(after - np.array(ref["mean"])).mean()
    assert gap_after < 0.2 * gap_before
    np.testing.assert_allclose(after_sd.mean(0), ref["std"], rtol=0.15)
    # the colour cast is (nearly) gone: normalized, the shifted images are close to the originals
    cast_gap = np.abs(shifted.astype(int) - tiny.images).mean()
    norm_gap = np.abs(
        normalize_images(shifted, ref).astype(int) - normalize_images(tiny.images, ref)
    )
    assert norm_gap.mean() < 0.25 * cast_gap


@pytest.fixture(scope="module")
def stained(tiny, tmp_path_factory):
    model = make("fs-sil", epochs=3, stain_norm="reinhard").fit(tiny)
    path = save_bundle(tmp_path_factory.mktemp("stain") / "fs.cyto", *model.bundle_parts(tiny))
    return model, path


def test_a_colour_shift_barely_moves_the_scores_of_a_normalized_model(tiny):
    from scipy.stats import spearmanr

    plain = make("fs-sil", epochs=3).fit(tiny)
    normed = make("fs-sil", epochs=3, stain_norm="reinhard").fit(tiny)
    shifted = _cast(tiny.images)
    rho_plain = spearmanr(plain.score(tiny.images), plain.score(shifted)).statistic
    rho_normed = spearmanr(normed.score(tiny.images), normed.score(shifted)).statistic
    assert rho_normed > 0.95
    assert rho_normed > rho_plain


def test_the_bundle_and_its_onnx_graph_normalize_as_training_did(stained, tiny):
    from cyto.bundle import load_bundle
    from cyto.export.conformance import check_graph_file
    from cyto.export.onnx import export_onnx

    model, path = stained
    manifest = load_bundle(path).manifest
    assert manifest["stain_normalization"]["method"] == "reinhard"
    assert manifest["config"]["stain_norm"] == "reinhard"
    images = _cast(tiny.images[:20])
    want = model.score(images)
    np.testing.assert_allclose(load_scorer(path, "torch", "cpu").score(images), want, rtol=1e-5)
    export_onnx(path)
    got = load_scorer(path, "onnx", "cpu").score(images, batch_size=7)
    # ONNX Runtime may round a pixel differently where the float lands on .5: rank agreement
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    assert check_graph_file(path / "encoder.onnx", {"patches"}) == []


def test_a_bad_stain_setting_is_one_clear_error():
    from cyto.errors import ConfigError

    with pytest.raises(ConfigError, match="stain_norm must be none or reinhard"):
        make("fs-sil", stain_norm="macenko")


def test_stain_jitter_is_seeded_and_changes_colours_not_shapes(tiny):
    from cyto.data.augment import weak_view
    from cyto.data.stain import jitter

    img = tiny.images[0]
    same = jitter(img, np.zeros(3), np.ones(3))
    assert np.abs(same.astype(int) - img).max() <= 1  # no jitter: the image, up to rounding
    a = weak_view(32, seed=5, stain_jitter=0.3)(img)
    b = weak_view(32, seed=5, stain_jitter=0.3)(img)
    c = weak_view(32, seed=6, stain_jitter=0.3)(img)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    moved = jitter(img, np.array([0.5, -0.5, 0.5]), np.array([1.2, 0.8, 1.0]))
    assert np.abs(lab_stats(moved[None])[0] - lab_stats(img[None])[0]).max() > 0.01
    # the cell stays where it was: the darkest pixels are the same ones
    dark = img.sum(-1) < np.quantile(img.sum(-1), 0.2)
    dark_moved = moved.astype(int).sum(-1) < np.quantile(moved.astype(int).sum(-1), 0.2)
    assert (dark & dark_moved).sum() > 0.8 * dark.sum()


def test_a_model_trains_with_stain_jitter(tiny):
    from cyto.errors import ConfigError

    model = make("dsvdd", epochs=2, ae_epochs=1, n_seeds=1, stain_jitter=0.2).fit(tiny)
    assert np.isfinite(model.score(tiny.images[:8])).all()
    with pytest.raises(ConfigError, match="stain_jitter must be between 0 and 1, got 2.0"):
        make("dsvdd", stain_jitter=2.0)


def test_the_bag_check_of_a_normalized_model_scores_the_images_once_normalized(tiny, monkeypatch):
    """fit() trains on normalized images; its bag check must score the images it was given (which
    score() normalizes), not normalize the normalized ones a second time."""
    import cyto.train.bagcheck as bc

    seen = {}

    def spy(scores, bags, bag_labels, top_fraction=0.05):
        seen["scores"] = np.asarray(scores)
        return {"status": "ok", "bag_auroc": 1.0, "message": "spy"}

    monkeypatch.setattr(bc, "bag_check", spy)
    model = make("ws-sil", epochs=1, stain_norm="reinhard").fit(tiny)
    np.testing.assert_allclose(seen["scores"], model.score(tiny.images), rtol=1e-6)
