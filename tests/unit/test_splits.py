"""Held-out splits: by acquisition order every training cell of a class comes before every test
cell of that class, whatever order the files were listed in."""

import numpy as np
import pytest

from cyto.eval.splits import acquisition_key, order_split, stratified_split


def test_acquisition_key_reads_the_last_number_of_the_file_name():
    assert acquisition_key("bone_marrow/LYT/LYT_00017.jpg") == (17, "LYT_00017")
    assert acquisition_key("run3_cell_0100.png") < acquisition_key("run1_cell_0200.png")
    assert acquisition_key("LYT_00009.jpg") < acquisition_key("LYT_00010.jpg")  # not as text
    assert acquisition_key("zeta_12.jpg") < acquisition_key("alpha.jpg")  # unnumbered last


def test_order_split_trains_on_earlier_files_of_each_class():
    rng = np.random.default_rng(0)
    names = [f"LYT_{i:05d}.jpg" for i in range(1, 41)] + [f"BLA_{i:05d}.jpg" for i in range(1, 11)]
    order = rng.permutation(len(names))  # listed out of order
    names = [names[i] for i in order]
    groups = np.array([n[:3] for n in names])
    keys = [acquisition_key(n) for n in names]
    early, late = order_split(groups, keys, np.arange(len(names)), 0.25)
    assert len(early) + len(late) == len(names) and not set(early) & set(late)
    for cls, n_late in (("LYT", 10), ("BLA", 2)):
        e = [keys[i][0] for i in early if groups[i] == cls]
        lt = [keys[i][0] for i in late if groups[i] == cls]
        assert len(lt) == n_late and max(e) < min(lt)
    # a sub-pool splits the same way (the development pool's halves)
    first, second = order_split(groups, keys, early, 0.5)
    assert set(first) | set(second) == set(early)
    assert max(keys[i][0] for i in first if groups[i] == "LYT") < min(
        keys[i][0] for i in second if groups[i] == "LYT"
    )


def test_stratified_split_keeps_class_shares_and_differs_by_seed():
    groups = np.array(["a"] * 40 + ["b"] * 8)
    first, rest = stratified_split(groups, np.arange(48), 0.25, seed=1)
    assert (groups[first] == "a").sum() == 10 and (groups[first] == "b").sum() == 2
    assert set(first) | set(rest) == set(range(48))
    assert not np.array_equal(first, stratified_split(groups, np.arange(48), 0.25, seed=2)[0])


def test_order_split_rejects_a_fraction_outside_0_1():
    with pytest.raises(ValueError, match="late_fraction"):
        order_split(np.array(["a"]), [(1, "a")], np.arange(1), 1.0)
