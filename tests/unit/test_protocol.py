"""The witness-rate protocol: bags, injection, one-class purity, test-pool counts, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.errors import ConfigError, DatasetError
from cyto.eval.protocol import PAPER_COUNTS, WRProtocol

LABELS = np.array([0] * 600 + [1] * 200)


def test_bags_are_disjoint_equal_and_normal_before_injection():
    p = WRProtocol(LABELS, seed=1)
    sizes = {len(b) for b in p.normal_bags}
    assert sizes == {30}
    cells = np.concatenate(p.normal_bags)
    assert len(set(cells.tolist())) == len(cells) == 300
    assert (LABELS[cells] == 0).all()
    assert not set(cells.tolist()) & set(p.test_normals.tolist())


@pytest.mark.parametrize("wr", [9.0, 5.0, 1.0, 0.5, 0.1, 0.05])
def test_injection_is_uniform_and_one_class_training_is_pure(wr):
    p = WRProtocol(LABELS, seed=2)
    t = p.trial(wr, 0)
    c = p.counts(wr)
    injected = [int(LABELS[b].sum()) for b in t.bags]
    assert sum(injected) == c.train
    assert injected[5:] == [0] * 5  # the strictly normal bags
    assert max(injected[:5]) - min(injected[:5]) <= 1
    assert (LABELS[t.normal_bags] == 0).all()
    idx, bag, bag_label = t.all_bag_cells
    assert ((bag_label == 1) == (bag < 5)).all()
    # test pool: every held-out normal plus the WR-specific abnormal sample
    assert int(LABELS[t.test].sum()) == c.test
    assert int((LABELS[t.test] == 0).sum()) == len(p.test_normals)
    assert not set(t.test.tolist()) & set(idx.tolist())


def test_counts_scale_with_the_pools_and_the_paper_table_on_full_size():
    p = WRProtocol(LABELS, seed=0)
    assert p.counts(9.0).train == round(0.09 * 300)
    assert p.counts(0.05).train == 1  # the floor of one cell
    assert p.counts(0.05).effective_train_wr > 0.05
    big = np.array([0] * 29100 + [1] * 3000)
    full = WRProtocol(big, seed=0, train_fraction=0.7)
    for wr, (tr, te) in PAPER_COUNTS.items():
        c = full.counts(wr)
        assert (c.train, c.test) == (tr, te)


def test_paper_counts_need_both_pools_at_paper_size():
    # a large training pool with a small test pool scales the counts (a tuple comparison took
    # the paper's 396 test abnormals for a 2,200-cell test pool)
    labels = np.array([0] * 22000 + [1] * 4000)
    p = WRProtocol(labels, seed=0, train_fraction=0.9)
    c = p.counts(9.0)
    assert len(p.test_normals) == 2200
    assert (c.train, c.test) == (round(0.09 * 19800), round(0.09 * 2200))
    # the WR a bag-level learner sees: abnormal share of the positive bags
    n_pos = sum(len(b) for b in p.normal_bags[:5])
    assert c.positive_bag_wr == pytest.approx(100 * c.train / (n_pos + c.train))


def test_same_seed_same_split_and_trials_resample_only_the_test_abnormals():
    a, b = WRProtocol(LABELS, seed=5), WRProtocol(LABELS, seed=5)
    for x, y in zip(a.normal_bags, b.normal_bags, strict=True):
        assert np.array_equal(x, y)
    t0, t1 = a.trial(5.0, 0), a.trial(5.0, 1)
    assert all(np.array_equal(x, y) for x, y in zip(t0.bags, t1.bags, strict=True))
    assert not np.array_equal(np.sort(t0.test), np.sort(t1.test))
    assert np.array_equal(a.trial(5.0, 1).test, b.trial(5.0, 1).test)
    other = WRProtocol(LABELS, seed=6)
    assert not np.array_equal(other.normal_bags[0], a.normal_bags[0])


def test_errors():
    with pytest.raises(DatasetError, match="too few"):
        WRProtocol(np.array([0] * 5 + [1] * 5))
    with pytest.raises(DatasetError, match="needs"):
        WRProtocol(np.array([0] * 600 + [1] * 4)).counts(9.0)
    with pytest.raises(ConfigError, match="witness rate"):
        WRProtocol(LABELS).counts(0)
