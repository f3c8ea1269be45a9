"""Synthetic cell patches: determinism, classes, and no shortcut through mean colour."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from cyto.data.dataset import PatchDataset
from cyto.data.synth.cells import ABNORMAL_CLASSES, CELL_CLASSES, sample_cell
from cyto.data.synth.patches import PatchSynthConfig, render_patch, write_patches
from cyto.errors import ConfigError


def _digest(folder):
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.jpg")):
        h.update(f.relative_to(folder).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    cfg = PatchSynthConfig(n_normal=4, n_abnormal=1, size=64, seed=11)
    write_patches(tmp_path / "a", cfg)
    write_patches(tmp_path / "b", cfg)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    write_patches(tmp_path / "c", PatchSynthConfig(n_normal=4, n_abnormal=1, size=64, seed=12))
    assert _digest(tmp_path / "c") != _digest(tmp_path / "a")


def test_adding_patches_keeps_the_earlier_ones(tmp_path):
    write_patches(tmp_path / "a", PatchSynthConfig(n_normal=2, n_abnormal=0, size=64, seed=1))
    write_patches(tmp_path / "b", PatchSynthConfig(n_normal=5, n_abnormal=0, size=64, seed=1))
    for name in ("normal_00001.jpg", "normal_00002.jpg"):
        assert (tmp_path / "a/normal" / name).read_bytes() == (
            tmp_path / "b/normal" / name
        ).read_bytes()


def test_every_class_is_written(synth_patches):
    assert sorted(p.name for p in synth_patches.iterdir()) == sorted(CELL_CLASSES)
    assert len(list((synth_patches / "normal").glob("*.jpg"))) == 120
    for cls in ABNORMAL_CLASSES:
        assert len(list((synth_patches / cls).glob("*.jpg"))) == 12


def test_no_partial_folder_left_behind(tmp_path, monkeypatch):
    """Nothing beside the dataset, whole or stopped; the dataset readable by the other users as
    any folder made here (a folder built under mkdtemp's 0700 and renamed was not)."""
    import os

    from cyto.data.synth import patches

    write_patches(tmp_path / "x", PatchSynthConfig(n_normal=1, n_abnormal=0, size=48))
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "x").stat().st_mode & 0o777 == 0o777 & ~umask
    monkeypatch.setattr(patches, "render_patch", lambda *a: (_ for _ in ()).throw(OSError(28)))
    with pytest.raises(OSError):
        write_patches(tmp_path / "y", PatchSynthConfig(n_normal=1, n_abnormal=0, size=48))
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_config_validation():
    from cyto.flags import python_words

    # in the caller's words: the command line's flags, a Python call's keywords (round 69, 8)
    with pytest.raises(ConfigError, match="^--n-normal must be >= 1 and --n-abnormal >= 0"):
        PatchSynthConfig(n_normal=0)
    with python_words("synth_patches"), pytest.raises(ConfigError, match="^n_normal= must be"):
        PatchSynthConfig(n_normal=0)
    with pytest.raises(ConfigError, match="at least 32"):
        PatchSynthConfig(size=8)


def test_morphology_differs_by_class():
    rng = np.random.default_rng(0)
    normal = [sample_cell("normal", rng) for _ in range(200)]
    enlarged = [sample_cell("enlarged", rng) for _ in range(200)]
    multi = [sample_cell("multinucleated", rng) for _ in range(200)]
    irregular = [sample_cell("irregular", rng) for _ in range(200)]
    assert np.mean([c.nuclei[0][2] for c in enlarged]) > 1.4 * np.mean(
        [c.nuclei[0][2] for c in normal]
    )
    assert all(len(c.nuclei) >= 2 for c in multi) and all(len(c.nuclei) == 1 for c in normal)
    amp = lambda cells: np.mean([sum(a for a, _ in c.contour) for c in cells])  # noqa: E731
    assert amp(irregular) > 3 * amp(normal)


def test_patch_is_centred_on_a_dark_nucleus():
    for cls in CELL_CLASSES:
        img = render_patch(cls, np.random.default_rng(5), size=192).astype(np.float32)
        centre = img[92:100, 92:100].mean()
        glass = np.percentile(img, 95)
        assert centre < glass - 60, cls


def test_abnormal_is_not_separable_by_colour(synth_patches):
    """A colour-histogram one-class baseline stays far from perfect Recall@K."""
    ds = PatchDataset.from_path(synth_patches, normal="normal")
    X = np.asarray(ds.images).reshape(len(ds), -1, 3)
    y = ds.labels.astype(int)
    feats = np.stack(
        [
            np.concatenate([np.histogram(x[:, c], bins=16, range=(0, 256))[0] for c in range(3)])
            / x.shape[0]
            for x in X
        ]
    )
    means = X.mean(axis=1)
    rng = np.random.default_rng(0)
    normal = np.flatnonzero(y == 0)
    rng.shuffle(normal)
    train, test = normal[:60], np.concatenate([normal[60:], np.flatnonzero(y == 1)])
    k = int(y[test].sum())
    for f in (feats, means):
        mu, sd = f[train].mean(0), f[train].std(0) + 1e-6
        score = np.linalg.norm((f[test] - mu) / sd, axis=1)
        recall_at_k = y[test][np.argsort(-score)[:k]].mean()
        assert recall_at_k < 0.75, recall_at_k
