"""The rule of reuse (cyto.reuse): earlier work is reused only when its key and its artifacts
prove it is the work asked for; otherwise it is redone or refused in one line with flag names."""

from __future__ import annotations

import shutil

import pytest

import cyto.train.loop as loop_mod
from cyto.errors import BundleError

TINY = {
    "epochs": 2,
    "ae_epochs": 1,
    "n_seeds": 1,
    "load_size": 40,
    "input_size": 32,
    "batch_size": 32,
}


def _crash_after_first_checkpoint(monkeypatch):
    real_save = loop_mod.save_checkpoint

    def save_then_crash(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt("simulated crash after the first checkpoint")

    monkeypatch.setattr(loop_mod, "save_checkpoint", save_then_crash)
    return real_save


def _subset(src, dst, keep_every: int = 2):
    for cls in src.iterdir():
        (dst / cls.name).mkdir(parents=True)
        for i, f in enumerate(sorted(cls.iterdir())):
            if i % keep_every == 0:
                shutil.copy(f, dst / cls.name / f.name)
    return dst


def test_train_resume_refuses_another_runs_checkpoint(tmp_path, synth_patches, monkeypatch):
    """Example 1: `cyto train --resume` after a failed run on other data used to continue that
    run's checkpoint (the manifest named the new data, the weights came from the old)."""
    from cyto.train.api import checkpoint_dir, train

    out = tmp_path / "m.cyto"
    real_save = _crash_after_first_checkpoint(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        train(
            "dsvdd",
            synth_patches,
            out,
            normal="normal",
            preset="fast",
            overrides=TINY,
            device="cpu",
        )
    assert any(checkpoint_dir(out).glob("*.pt"))
    monkeypatch.setattr(loop_mod, "save_checkpoint", real_save)

    other = _subset(synth_patches, tmp_path / "other")
    with pytest.raises(BundleError, match=r"--resume: .*another run.*training cells"):
        train(
            "dsvdd",
            other,
            out,
            normal="normal",
            preset="fast",
            overrides=TINY,
            device="cpu",
            resume=True,
        )
    with pytest.raises(BundleError, match=r"--set lr .* -> "):
        train(
            "dsvdd",
            synth_patches,
            out,
            normal="normal",
            preset="fast",
            overrides={**TINY, "lr": 0.5},
            device="cpu",
            resume=True,
        )
    assert not out.exists()  # nothing was written from a foreign checkpoint
    # the run's own settings continue it
    result = train(
        "dsvdd",
        synth_patches,
        out,
        normal="normal",
        preset="fast",
        overrides=TINY,
        device="cpu",
        resume=True,
    )
    assert result.bundle.is_dir() and not checkpoint_dir(out).exists()


def test_train_resume_refuses_a_checkpoint_without_a_key(tmp_path, synth_patches):
    from cyto.train.api import checkpoint_dir, train

    out = tmp_path / "m.cyto"
    checkpoint_dir(out).mkdir()
    (checkpoint_dir(out) / "dsvdd-seed0.pt").write_bytes(b"not ours")
    with pytest.raises(BundleError, match="records no key"):
        train(
            "dsvdd",
            synth_patches,
            out,
            normal="normal",
            preset="fast",
            overrides=TINY,
            device="cpu",
            resume=True,
        )
