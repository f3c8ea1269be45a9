"""ItS2CLR's pieces that decide the sign of its ranking: the aggregator, the pseudo-label score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cyto.errors import DatasetError
from cyto.train.its2clr import ItS2CLRConfig, fit_aggregator, negative_distance


def _near_constant_bags(seed: int = 0):
    """10 bags of 30 unit-length embeddings that differ by little (as a young encoder's do);
    bags 0-4 are positive and hold 3 witnesses each, shifted along one direction."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=32)
    feats, bag_index, witness = [], [], []
    for b in range(10):
        x = base + rng.normal(0, 0.02, (30, 32))
        w = np.zeros(30, dtype=bool)
        if b < 5:
            x[:3, 0] += 0.08
            w[:3] = True
        feats.append(x / np.linalg.norm(x, axis=1, keepdims=True))
        bag_index.append(np.arange(b * 30, (b + 1) * 30))
        witness.append(w)
    bag_y = np.array([1] * 5 + [0] * 5)
    return np.concatenate(feats).astype(np.float32), bag_index, bag_y, np.concatenate(witness)


def test_the_aggregator_learns_from_near_constant_embeddings_and_ranks_witnesses_first():
    """Before: the aggregator read the raw unit-length embeddings and learned nothing (equal bag
    logits), so its instance head was a random direction and ItS2CLR's ranking could invert."""
    feats, bag_index, bag_y, witness = _near_constant_bags()
    cfg = ItS2CLRConfig(backbone="smallcnn", agg_epochs=60, agg_lr=2e-3)
    agg = fit_aggregator(feats, bag_index, bag_y, cfg, seed=0)
    h = torch.from_numpy(feats)
    with torch.no_grad():
        bag_logits = np.array([agg(h[idx])[0].item() for idx in bag_index])
        c = agg.instance(h).squeeze(1).numpy()
    assert bag_logits[bag_y == 1].min() > bag_logits[bag_y == 0].max()
    negative_cells = np.concatenate([bag_index[b] for b in range(5, 10)])
    # the witnesses score above the cells of negative bags
    w, n = c[witness], c[negative_cells]
    assert (w[:, None] > n[None, :]).mean() > 0.9


def test_negative_distance_ranks_cells_unlike_the_negatives_first():
    rng = np.random.default_rng(1)
    neg = rng.normal(0, 1, (200, 8))
    pos_normal = rng.normal(0, 1, (40, 8))
    witness = rng.normal(0, 1, (5, 8)) + 6.0
    feats = np.concatenate([neg, pos_normal, witness]).astype(np.float32)
    d = negative_distance(feats, np.arange(200), k=5)
    assert d[-5:].min() > d[:240].max()
    # a negative cell is not its own neighbour: negatives and new normals score alike
    assert abs(np.median(d[:200]) - np.median(d[200:240])) < 0.25 * np.median(d[:200])


def test_negative_distance_subsamples_a_large_reference_and_needs_two_negatives():
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(500, 4)).astype(np.float32)
    a = negative_distance(feats, np.arange(400), k=3, seed=7, max_ref=100)
    b = negative_distance(feats, np.arange(400), k=3, seed=7, max_ref=100)
    assert np.array_equal(a, b) and np.isfinite(a).all()
    with pytest.raises(DatasetError, match="at least 2 cells"):
        negative_distance(feats, np.arange(1), k=3)


def test_the_knn_score_is_the_distance_to_the_nearest_negatives_and_aggregator_stays(tiny):
    """Default: the bundle scores a cell by its distance to the k nearest negative-bag cells
    (what picks the pseudo-labels); the bag check leaves each training cell out of its own
    neighbours. ``instance_score=aggregator`` keeps Liu et al.'s instance logit."""
    from cyto.train.its2clr import negative_distance
    from tests.train_helpers import make

    data = tiny  # 6 bags, 3 negative
    knn = make("its2clr").fit(data)
    assert knn.scorer_kind == "knn"
    _, weights, arrays = knn.export_state(data)
    assert set(arrays) == {"negatives", "shift", "scale", "k"} and int(arrays["k"][0]) == 5
    emb = knn.embed(data.images)
    neg = knn.negative_cells_
    # a cell outside the negative bags: its score is exactly negative_distance's
    pos = np.setdiff1d(np.arange(len(data)), neg)
    want = negative_distance(emb, neg, 5, knn.config.seed, knn.config.score_ref)[pos]
    np.testing.assert_allclose(knn.score(data.images)[pos], want, rtol=1e-4, atol=1e-5)
    # the bag check: negative-bag cells are not their own neighbours
    loo = knn._training_scores(data.images)
    assert (loo[neg] > knn.score(data.images)[neg]).all()
    agg = make("its2clr", instance_score="aggregator").fit(data)
    assert agg.scorer_kind == "mil" and agg.export_state(data)[2] == {}
