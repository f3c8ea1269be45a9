"""One rule for a random seed (an integer 0 .. 2**32 - 1, what numpy takes), held wherever a seed
enters cyto: every command's ``--seed``, the training setting ``seed`` and the library calls that
take ``seed=``. A negative seed was a traceback from numpy (issue 68, hostile round 11: N17,
N26, N27); JPEG quality and the mosaic's row length ride along (N28, N40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cyto.errors import ConfigError
from tests.cli_runner import run_cyto

SEED_WORDS = "must be an integer between 0 and 4294967295 (a random seed)"


def _commands_with_seed() -> list[list[str]]:
    """The path (``["synth", "slide"]``) of every cyto command that takes ``--seed``, walked
    from the app itself, so a command added later is held to the rule too."""
    from tests.cli_runner import leaf_commands

    return [
        path
        for path, cmd in leaf_commands()
        if any("--seed" in getattr(p, "opts", ()) for p in cmd.params)
    ]


COMMANDS = _commands_with_seed()


def test_the_walk_finds_the_commands_that_take_a_seed():
    names = {" ".join(c) for c in COMMANDS}
    assert {
        "synth slide",
        "synth patches",
        "data cells",
        "data mosaic",
        "review serve",
        "demo",
        "eval sweep",
    } <= names


@pytest.mark.parametrize("seed", ["-1", "-3", str(2**32), "-99999999999"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_seed_option_refuses_a_seed_numpy_does_not_take(command, seed, tmp_path):
    res = run_cyto(*command, "--seed", seed)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert lines == [f"error: --seed {SEED_WORDS}, got {seed}"]


def test_a_negative_training_seed_is_one_line_at_the_command_line(tmp_path):
    res = run_cyto("train", "dsvdd", "--data", str(tmp_path), "--out", str(tmp_path / "m.cyto"),
                   "--normal", "normal", "--set", "seed=-1")  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"error: --set seed {SEED_WORDS}, got -1"]


@pytest.fixture(scope="module")
def small_patches(tmp_path_factory) -> Path:
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    out = tmp_path_factory.mktemp("seeds") / "p"
    write_patches(out, PatchSynthConfig(n_normal=5, n_abnormal=2, size=32))
    return out


def test_a_negative_training_seed_is_named_as_the_python_caller_wrote_it(small_patches, tmp_path):
    import cyto

    with pytest.raises(ConfigError) as err:
        cyto.train("dsvdd", small_patches, tmp_path / "m.cyto", normal="normal",
                   overrides={"seed": -1})  # fmt: skip
    assert str(err.value) == f"seed (in overrides=) {SEED_WORDS}, got -1"
    assert not (tmp_path / "m.cyto").exists()


def _library_calls(tmp: Path, patches: Path):
    from cyto.data.mosaic import class_mosaic
    from cyto.data.synth.from_cells import CellSlideConfig
    from cyto.data.synth.patches import PatchSynthConfig
    from cyto.data.synth.slide import SlideSynthConfig
    from cyto.demo import run_demo
    from cyto.eval.sweep import SweepSpec
    from cyto.review.cells import harvest_cells
    from cyto.review.session import build_session

    return {
        "SlideSynthConfig": lambda s: SlideSynthConfig(seed=s),
        "SlideSynthConfig.stain_seed": lambda s: SlideSynthConfig(stain_seed=s),
        "PatchSynthConfig": lambda s: PatchSynthConfig(seed=s),
        "CellSlideConfig": lambda s: CellSlideConfig(patches, ("normal",), mpp=0.25, seed=s),
        "SweepSpec": lambda s: SweepSpec(patches, "normal", None, ("dsvdd",), seed=s),
        "class_mosaic": lambda s: class_mosaic(patches, tmp / "m.png", seed=s),
        "harvest_cells": lambda s: harvest_cells([tmp], tmp / "cells", seed=s),
        "build_session": lambda s: build_session([tmp], tmp / "review", seed=s),
        "run_demo": lambda s: run_demo(tmp / "demo", seed=s),
    }


CALLS = list(_library_calls(Path("."), Path(".")))


@pytest.mark.parametrize("seed", [-1, -2, 2**32, 1.5])
@pytest.mark.parametrize("call", CALLS)
def test_every_library_call_that_takes_a_seed_refuses_a_bad_one(
    call, seed, small_patches, tmp_path
):
    with pytest.raises(ConfigError, match=r"must be an integer between 0 and 4294967295"):
        _library_calls(tmp_path, small_patches)[call](seed)
    assert not (tmp_path / "m.png").exists()


@pytest.mark.parametrize("quality", [0, 101, 1000, -5])
def test_synth_slide_refuses_a_jpeg_quality_outside_1_to_100(quality, tmp_path):
    res = run_cyto("synth", "slide", str(tmp_path / "s.tif"), "--quality", str(quality))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: --quality must be between 1 and 100 (JPEG quality), got {quality}"
    ]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("quality", [0, 101])
def test_every_synth_config_holds_jpeg_quality_to_one_rule(quality):
    from cyto.data.synth.from_cells import CellSlideConfig
    from cyto.data.synth.patches import PatchSynthConfig
    from cyto.data.synth.slide import SlideSynthConfig

    for make in (
        lambda: SlideSynthConfig(quality=quality),
        lambda: PatchSynthConfig(quality=quality),
        lambda: CellSlideConfig(Path("c"), ("normal",), mpp=0.25, quality=quality),
    ):
        with pytest.raises(ConfigError, match=r"between 1 and 100 \(JPEG quality\)"):
            make()


def test_a_mosaic_asked_for_more_images_than_a_class_holds_is_as_wide_as_the_largest(
    small_patches, tmp_path
):
    from PIL import Image

    out = tmp_path / "m.png"
    res = run_cyto("data", "mosaic", str(small_patches), "--out", str(out), "--per-class",
                   str(10**6), "--tile", "16")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == (
        "--per-class 1000000: the largest class holds 5 images; drawing at most 5 per class"
    )
    # 130 px of labels, 5 tiles of 16 px; 7 rows under a 24 px title
    assert Image.open(out).size == (130 + 5 * 16, 24 + 7 * 16)
