"""The bag check of weakly supervised methods: pooled instance scores per training bag, bag AUROC,
a status a user can act on, recorded in the bundle and printed loudly by `cyto train`."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from cyto.train.bagcheck import auroc, bag_check, pooled_bag_scores


def test_auroc_equals_sklearn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = rng.integers(0, 5, 200).astype(float)  # many ties
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))


def test_pooling_is_the_mean_of_each_bags_top_share():
    scores = np.array([1.0, 2, 3, 4, 10, 0, 0, 0, 0, 0])
    bags = np.array(["a"] * 5 + ["b"] * 5)
    names, pooled = pooled_bag_scores(scores, bags, top_fraction=0.4)  # top 2 of 5
    assert list(names) == ["a", "b"]
    assert pooled.tolist() == [7.0, 0.0]
    _, one = pooled_bag_scores(scores, bags, top_fraction=0.01)  # at least one cell
    assert one.tolist() == [10.0, 0.0]


def _bags(witness_score: float):
    """Six bags of 20 cells; bags p0-p2 are positive and each holds two witnesses."""
    rng = np.random.default_rng(1)
    scores, bags, labels = [], [], []
    for b in range(6):
        s = rng.normal(0, 1, 20)
        if b < 3:
            s[:2] = witness_score
        scores += list(s)
        bags += [f"p{b}" if b < 3 else f"n{b}"] * 20
        labels += [int(b < 3)] * 20
    return np.array(scores), np.array(bags), np.array(labels)


def test_a_model_that_ranks_witnesses_first_passes():
    check = bag_check(*_bags(witness_score=5.0))
    assert check["status"] == "ok" and check["bag_auroc"] == 1.0
    assert check["n_positive_bags"] == 3 and check["n_negative_bags"] == 3
    assert "ok" in check["message"]


def test_an_inverted_model_fails_loudly():
    scores, bags, labels = _bags(witness_score=-5.0)
    scores = scores - 10.0 * labels  # every cell of a positive bag below every negative one
    check = bag_check(scores, bags, labels)
    assert check["status"] == "failed" and check["bag_auroc"] <= 0.5
    assert "FAILED" in check["message"] and "do not use" in check["message"]


def test_cyto_train_prints_and_records_a_failed_check(tmp_path, synth_patches, monkeypatch):
    """A weakly supervised model whose ranking comes out inverted: `cyto train` warns on stderr,
    the bundle records the failed check and `cyto info` shows it."""
    from typer.testing import CliRunner

    from cyto.cli import app
    from cyto.data.dataset import PatchDataset
    from cyto.train.wssil import WSSIL

    files = sorted(synth_patches.rglob("*.jpg"))
    normals = [f for f in files if f.parent.name == "normal"]
    abnormals = [f for f in files if f.parent.name != "normal"]
    rows = ["path,label,bag,bag_label"]
    rows += [f"{f},normal,b{i % 6},{int(i % 6 >= 3)}" for i, f in enumerate(normals)]
    rows += [f"{f},{f.parent.name},b{3 + i % 3},1" for i, f in enumerate(abnormals)]
    manifest = tmp_path / "bags.csv"
    manifest.write_text("\n".join(rows) + "\n")

    # the images as training sees them (resized to load_size), keyed by their bytes
    ds = PatchDataset.from_path(manifest, normal="normal", size=40)
    in_positive_bag = {
        hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest(): int(bag_label)
        for im, bag_label in zip(ds.images, ds.bag_labels, strict=True)
    }

    def inverted(self, images, batch_size=128):  # every cell of a positive bag scored lowest
        return np.array(
            [
                -in_positive_bag[hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest()]
                for im in images
            ],
            dtype=np.float64,
        ) + np.random.default_rng(0).normal(0, 1e-3, len(images))

    monkeypatch.setattr(WSSIL, "score", inverted)
    out = tmp_path / "ws.cyto"
    args = ["train", "ws-sil", "--data", str(manifest), "--out", str(out), "--normal", "normal"]
    args += ["--preset", "fast", "--device", "cpu"]
    for kv in ("epochs=1", "load_size=40", "input_size=32", "batch_size=32", "mpp=0.12"):
        args += ["--set", kv]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "warning: bag check FAILED" in res.stderr
    assert "no training resolution" not in res.output  # given with --set mpp
    check = json.loads((out / "manifest.json").read_text())["bag_check"]
    assert check["status"] == "failed" and check["bag_auroc"] <= 0.5
    assert check["n_positive_bags"] == 3 and check["n_negative_bags"] == 3
    info = CliRunner().invoke(app, ["info", str(out)])
    assert "bag check FAILED" in info.output
    assert "training resolution: 0.12 um/px" in info.output
    # the training shares each scale check compares with, named (cyto info showed the
    # morphometric mean alone, and the warnings two other numbers: hostile round 25, 13)
    td = json.loads((out / "manifest.json").read_text())["training_data"]
    slide, folder = td["centre_nucleus_fraction"], td["nucleus_fraction"]
    assert (
        f"scale checks: a slide's cells against a median nucleus share of {slide:.3f} (cyto "
        f"score: the centre nucleus), a folder's against {folder:.3f} (cyto predict"
    ) in info.output, info.output


def test_a_bag_auroc_just_under_half_is_weak_not_failed():
    """5 + 5 bags at bag AUROC 0.48 (12 of 25 pairs) is what random bag labels give half the
    time: weak. Inverted beyond chance (0.12) fails."""
    from cyto.train.bagcheck import permutation_p

    y = np.array([1] * 5 + [0] * 5)
    bags = np.array([f"b{i}" for i in range(10)])
    s = np.array([10, 7, 5, 3, 2.5, 9, 8, 6, 4, 2], dtype=float)
    assert auroc(y, s) == pytest.approx(0.48)
    check = bag_check(s, bags, y, top_fraction=1.0)
    assert check["status"] == "weak" and "no higher" in check["message"]
    s = np.array([5, 4.5, 4.2, 1, 0.5, 10, 9, 8, 7, 4], dtype=float)  # 3 of 25 pairs
    assert auroc(y, s) == pytest.approx(0.12)
    assert permutation_p(y, s, lower=True) <= 0.05
    assert bag_check(s, bags, y, top_fraction=1.0)["status"] == "failed"


def test_a_pass_needs_more_than_random_bag_labels_give():
    """With 5 + 5 bags, a bag AUROC of 0.76 (19 of 25 pairs) happens to random bag labels about
    one time in ten: the check calls it weak, not ok."""
    from cyto.train.bagcheck import permutation_p

    y = np.array([1] * 5 + [0] * 5)
    perfect = np.arange(10, 0, -1).astype(float)  # every positive bag above every negative one
    assert permutation_p(y, perfect) == pytest.approx(1 / 252)
    s = np.array([10, 9, 8, 5, 4, 7, 6, 3, 2, 1], dtype=float)  # 21 of 25 pairs: AUROC 0.84
    assert auroc(y, s) == pytest.approx(0.84)
    assert permutation_p(y, s) <= 0.05
    s = np.array([10, 9, 8, 5, 2, 7, 6, 4, 3, 1], dtype=float)  # 19 of 25 pairs
    assert auroc(y, s) == pytest.approx(0.76)
    assert 0.05 < permutation_p(y, s) < 0.2
    bags = np.array([f"b{i}" for i in range(10)])
    check = bag_check(s, bags, y, top_fraction=1.0)
    assert check["status"] == "weak" and "random bag labels" in check["message"]
