"""Every numeric training setting has a range, held before training in the caller's words
(hostile round 11, N17: ``--set seed=-1`` reached numpy as a raw ValueError; a negative
learning rate, embedding size or crop share reached torch)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cyto.errors import ConfigError
from cyto.train.registry import get_method, method_names
from tests.cli_runner import run_cyto


def _numeric_fields(cfg_cls) -> list[str]:
    hints = typing.get_type_hints(cfg_cls)
    out = []
    for f in dataclasses.fields(cfg_cls):
        args = set(typing.get_args(hints[f.name])) or {hints[f.name]}
        if args & {int, float} and bool not in args:
            out.append(f.name)
    return out


CONFIGS = {m: get_method(m).Config for m in method_names()}


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_every_numeric_setting_has_a_range(method):
    cfg = CONFIGS[method]
    missing = [n for n in _numeric_fields(cfg) if n not in cfg.ranges()]
    assert not missing, f"{method}: numeric settings without a range: {missing}"
    cfg()  # the defaults lie in their ranges
    for preset in cfg.presets.values():
        cfg(**preset)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_setting_outside_its_range_is_one_line_naming_it(data):
    method = data.draw(st.sampled_from(sorted(CONFIGS)))
    cfg = CONFIGS[method]
    name, bounds = data.draw(st.sampled_from(sorted(cfg.ranges().items())))
    kind = typing.get_type_hints(cfg)[name]
    whole = int in (set(typing.get_args(kind)) or {kind})
    outside = []
    if bounds.lo is not None:
        outside.append(bounds.lo - (1 if whole else 0.5) if not bounds.open_lo else bounds.lo)
    if bounds.hi is not None:
        outside.append(bounds.hi + 1)
    value = data.draw(st.sampled_from(outside))
    value = int(value) if whole else float(value)
    with pytest.raises(ConfigError) as refused:
        cfg(**{name: value})
    assert str(refused.value).startswith(f"--set {name} must be "), str(refused.value)
    assert f"got {value!r}" in str(refused.value)


def test_a_negative_seed_is_refused_at_the_command_line(tmp_path, synth_patches):
    from tests.cli_runner import run_cyto

    proc = run_cyto(
        "train", "dsvdd", "--data", str(synth_patches), "--normal", "normal", "--preset",
        "fast", "--set", "seed=-1", "--out", str(tmp_path / "m.cyto"),
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        "error: --set seed must be an integer between 0 and 4294967295 (a random seed), got -1"
    )
    assert not (tmp_path / "m.cyto").exists()


@pytest.mark.parametrize("method", sorted(CONFIGS))
@pytest.mark.parametrize("setting", ["holdout=0.5", "refit=false"])
def test_the_one_class_settings_are_refused_by_the_methods_that_hold_nothing_back(
    method, setting, tmp_path, synth_patches
):
    """Hostile round 39 (5): fs-sil, ws-sil and its2clr took --set holdout and refit and ignored
    them (the same losses and scores). A one-class method has them; the others refuse them in
    one line, from Python as at the command line, before any cell is read."""
    from cyto.train.api import train
    from cyto.train.config import resolve_config

    cls = CONFIGS[method]
    if get_method(method).one_class:
        cfg = resolve_config(cls, "fast", overrides=[setting])
        assert cfg.holdout == 0.5 or cfg.refit is False
        return
    with pytest.raises(ConfigError) as err:
        train(method, tmp_path / "no-data", tmp_path / "m.cyto", normal="x", overrides=[setting])
    words = str(err.value)
    assert f"{setting.split('=')[0]!r} is a setting of the one-class methods (dsvdd, droc)" in words
    assert f"; {method} trains on the abnormal classes'" in words  # named (hostile round 40, 4)
    assert "\n" not in words and not (tmp_path / "m.cyto").exists()
    proc = run_cyto("train", method, "--data", str(synth_patches), "--normal", "normal",
                    "--out", str(tmp_path / "c.cyto"), "--set", setting)  # fmt: skip
    assert proc.returncode == 2 and "a setting of the one-class methods" in proc.stderr
    assert "stopped" not in proc.stdout + proc.stderr and not list(tmp_path.glob("c.cyto*"))
