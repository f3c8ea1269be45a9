"""One contract suite over every registered method: trains on tiny data, no NaNs, loss falls,
scores vary with the documented direction, bundle round trip, exact resume, and the weakly
supervised methods never need instance labels."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cyto.bundle import save_bundle
from cyto.runtime import load_scorer
from cyto.train import loop as loop_mod
from cyto.train.data import TrainData
from cyto.train.registry import get_method, method_names
from tests.train_helpers import make

WEAK = [n for n in method_names() if not get_method(n).instance_labels]  # ws-sil, its2clr
ONE_CLASS = [n for n in method_names() if get_method(n).one_class]  # droc, dsvdd


def test_registry_has_the_five_methods():
    assert method_names() == ["droc", "dsvdd", "fs-sil", "its2clr", "ws-sil"]
    assert (WEAK, ONE_CLASS) == (["its2clr", "ws-sil"], ["droc", "dsvdd"])
    from cyto.cli import METHOD_NAMES  # the CLI's help lists them without importing torch

    assert sorted(METHOD_NAMES) == method_names()


@pytest.fixture(scope="module")
def fitted(tiny):
    return {name: make(name).fit(tiny) for name in method_names()}


@pytest.mark.parametrize("name", method_names())
def test_loss_falls_and_is_finite(fitted, name):
    for phase, hist in fitted[name].history_.items():
        assert np.isfinite(hist).all(), phase
    main = list(fitted[name].history_.values())[-1]
    assert main[-1] < main[0], fitted[name].history_


@pytest.mark.parametrize("name", method_names())
def test_scores_vary_and_higher_is_abnormal(fitted, tiny, name):
    scores = fitted[name].score(tiny.images)
    assert scores.shape == (len(tiny),) and np.isfinite(scores).all()
    assert scores.std() > 1e-6
    assert roc_auc_score(tiny.labels, scores) > 0.65


@pytest.mark.parametrize("name", method_names())
def test_bundle_round_trip_gives_identical_scores(fitted, tiny, tmp_path, name):
    model = fitted[name]
    path = save_bundle(tmp_path / f"{name}.cyto", *model.bundle_parts(tiny))
    loaded = load_scorer(path, "torch", "cpu")
    np.testing.assert_allclose(
        loaded.score(tiny.images, 128), model.score(tiny.images, 128), rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("name", method_names())
def test_head_finishes_agree(fitted, tiny, tmp_path, name):
    """The numba finish every backend ends in, its numpy reference and the torch form that
    training evaluates give the same scores from the same graph output."""
    path = save_bundle(tmp_path / f"{name}.cyto", *fitted[name].bundle_parts(tiny))
    scorer = load_scorer(path, "torch", "cpu")
    raw = scorer.raw(tiny.images, batch_size=len(tiny.images))[0]
    got = scorer.head.finish(raw)
    np.testing.assert_allclose(got, scorer.head.reference(raw), rtol=1e-9, atol=1e-12)
    t = scorer.head.torch_finish(torch.from_numpy(raw)).double().numpy()
    np.testing.assert_allclose(t, got, rtol=1e-5, atol=1e-6)
    assert got.shape == (len(tiny.images),)


@pytest.mark.parametrize("name", method_names())
def test_resume_after_a_crash_continues_exactly(tiny, tmp_path, monkeypatch, name):
    """A crash in the middle of an epoch (after a batch's optimizer step, before the epoch's
    checkpoint), then --resume, gives exactly the uninterrupted model."""
    # three epochs: the crash comes in the last, after checkpoint 2, and the resumed run ends
    # that epoch from its checkpoint (Deep SVDD: its autoencoder epoch is checkpoint 1, so a
    # whole main epoch follows the crash); ITS2CLR keeps four, for a refit after the resume
    extra = {"epochs": 3, "ae_epochs": 1} if name == "dsvdd" else {"epochs": 3}
    if name == "its2clr":
        extra.update(epochs=4, agg_epochs=10)
    reference = make(name, **extra).fit(tiny).score(tiny.images)

    real_save, real_progress = loop_mod.save_checkpoint, loop_mod.progress
    state = {"saved": 0, "batches_after": 0}

    def counting_save(*args, **kwargs):
        real_save(*args, **kwargs)
        state["saved"] += 1

    @contextmanager
    def crashing_progress(*args, **kwargs):
        with real_progress(*args, **kwargs) as bar:
            advance = bar.advance

            def advance_then_crash(n=1):
                advance(n)
                if state["saved"] >= 2:
                    state["batches_after"] += 1
                    raise KeyboardInterrupt("simulated crash inside the epoch after checkpoint 2")

            bar.advance = advance_then_crash
            yield bar

    monkeypatch.setattr(loop_mod, "save_checkpoint", counting_save)
    monkeypatch.setattr(loop_mod, "progress", crashing_progress)
    ckpt = tmp_path / "state"
    with pytest.raises(KeyboardInterrupt):
        make(name, **extra).fit(tiny, ckpt_dir=ckpt)
    assert state == {"saved": 2, "batches_after": 1}  # one step into the next epoch, then died
    monkeypatch.setattr(loop_mod, "save_checkpoint", real_save)
    monkeypatch.setattr(loop_mod, "progress", real_progress)
    resumed = make(name, **extra).fit(tiny, ckpt_dir=ckpt, resume=True).score(tiny.images)
    np.testing.assert_allclose(resumed, reference, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", WEAK)
def test_weak_methods_train_without_instance_labels(tiny, name):
    blind = TrainData(tiny.images, None, tiny.bags, tiny.bag_labels, tiny.fingerprint)
    model = make(name, epochs=2, **({"agg_epochs": 5} if name == "its2clr" else {})).fit(blind)
    assert np.isfinite(model.score(blind.images)).all()


@pytest.mark.parametrize("name", ONE_CLASS)
def test_one_class_methods_train_on_normals_only(tiny, name, monkeypatch):
    seen = []
    from cyto.train import data as data_mod

    real = data_mod.apply_view

    def spy(view, images):
        seen.append(images.copy())
        return real(view, images)

    monkeypatch.setattr(f"cyto.train.{name}.apply_view", spy)
    make(name, epochs=1, **({"ae_epochs": 1, "n_seeds": 1} if name == "dsvdd" else {})).fit(tiny)
    normals = {im.tobytes() for im in tiny.images[tiny.labels == 0]}
    assert seen and all(im.tobytes() in normals for batch in seen for im in batch)


def test_a_resumed_run_says_what_it_continues_from(tmp_path):
    """``cyto train --resume`` went straight to "dsvdd-seed0 ... epoch 6/6", unsaid (hostile
    round 57, 7): each phase's last finished epoch kept is named."""
    import torch

    from cyto.train.api import resumed_words

    ckpt = tmp_path / "m.cyto.train-state"
    assert resumed_words(ckpt).startswith("no epoch of the interrupted run in ")
    (ckpt / "held-out").mkdir(parents=True)
    torch.save({"epoch": 2}, ckpt / "held-out" / "ae-seed0.pt")
    torch.save({"epoch": 4}, ckpt / "dsvdd-seed0.pt")
    assert resumed_words(ckpt) == (
        f"continuing the interrupted run in {ckpt}: dsvdd-seed0 after epoch 5, "
        "held-out/ae-seed0 after epoch 3"
    )
