"""Sweep settings: per-method ``--set`` items and the train fraction."""

from __future__ import annotations

import pytest

from cyto.errors import ConfigError
from cyto.eval.sweep import SweepSpec, method_configs, method_overrides

METHODS = ("dsvdd", "fs-sil", "ws-sil")


def test_plain_items_go_to_every_method_prefixed_ones_to_their_method():
    items = ("input_size=32", "dsvdd:ae_epochs=2", "fs-sil:epochs=3", "ws-sil:lr=0.01")
    assert method_overrides(items, "dsvdd", METHODS) == ["input_size=32", "ae_epochs=2"]
    assert method_overrides(items, "fs-sil", METHODS) == ["input_size=32", "epochs=3"]
    assert method_overrides(items, "ws-sil", METHODS) == ["input_size=32", "lr=0.01"]


def test_a_value_with_a_colon_is_not_a_method_prefix():
    assert method_overrides(("note=a:b",), "dsvdd", METHODS) == ["note=a:b"]


def test_a_prefix_naming_a_method_the_sweep_does_not_run_is_an_error():
    with pytest.raises(ConfigError, match="droc"):
        method_overrides(("droc:epochs=2",), "dsvdd", METHODS)


def test_train_fraction_must_be_a_share():
    with pytest.raises(ConfigError, match="train fraction"):
        SweepSpec(data=".", normal="n", abnormal=None, methods=METHODS, train_fraction=1.0)


def test_preset_paper_means_each_methods_own_recipe_and_sets_apply_per_method():
    spec = SweepSpec(
        data=".",
        normal="n",
        abnormal=None,
        methods=("dsvdd", "fs-sil"),
        preset="paper",
        overrides=("dsvdd:epochs=7",),
    )
    cfg = method_configs(spec)
    assert cfg["dsvdd"].backbone == "resnet18" and cfg["dsvdd"].input_size == 224
    assert cfg["dsvdd"].epochs == 7
    assert cfg["fs-sil"].epochs != 7
    fast = method_configs(SweepSpec(data=".", normal="n", abnormal=None, methods=("dsvdd",)))
    assert fast["dsvdd"].backbone == "smallcnn"


def test_a_refused_sweep_leaves_nothing_that_turns_its_corrected_rerun_away(tmp_path):
    from cyto.eval.sweep import run_sweep

    out = tmp_path / "sweep"
    bad = SweepSpec(
        data=tmp_path / "cells",
        normal="n",
        abnormal=None,
        methods=("dsvdd",),
        overrides=("droc:epochs=2",),
    )
    with pytest.raises(ConfigError, match="droc"):
        run_sweep(bad, out)
    assert not out.exists()
    missing = SweepSpec(data=tmp_path / "cells", normal="n", abnormal=None, methods=("dsvdd",))
    with pytest.raises(Exception, match="cells"):  # no data there: refused, nothing written
        run_sweep(missing, out)
    assert not (out / "sweep.json").exists()


def test_a_damaged_sweep_record_is_one_line_that_says_what_to_do(tmp_path, synth_patches):
    """A sweep.json cut short (a disk that filled while it was written in place, before it was
    written at once) stopped every rerun with a JSONDecodeError traceback."""
    from cyto.eval.sweep import run_sweep

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text('{"data": "cel')
    spec = SweepSpec(data=synth_patches, normal="normal", abnormal=None, methods=("dsvdd",))
    with pytest.raises(ConfigError, match="sweep.json is damaged .*delete it and rerun"):
        run_sweep(spec, out)


def _sweep_args(data, out, *more):
    return (
        "eval", "sweep", "--data", str(data), "--normal", "normal", "--out", str(out),
        "--methods", "dsvdd", "--device", "cpu", *more,
    )  # fmt: skip


@pytest.mark.parametrize("wr", ["0", "100", "nan"])
def test_a_witness_rate_out_of_range_is_refused_by_its_flag_before_anything_is_written(
    tmp_path, synth_patches, wr
):
    """Hostile round 7 (H34): ``--wr 0`` was refused only after sweep.json and models/ were
    written, so the corrected command was turned away as "a sweep with other settings"."""
    from tests.cli_runner import run_cyto

    out = tmp_path / "swx"
    proc = run_cyto(*_sweep_args(synth_patches, out, "--wr", f"9,{wr}"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: --wr takes witness rates in percent, each in (0, 100), got {float(wr):g}"
    )
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"^wrs= takes witness rates in percent"):
        from cyto.flags import python_words

        with python_words("sweep"):
            SweepSpec(data=".", normal="n", abnormal=None, methods=METHODS, wrs=(float(wr),))


def test_a_sweep_the_data_cannot_run_leaves_nothing_behind_and_names_flags(tmp_path, synth_patches):
    """A witness rate the data has too few abnormal cells for was refused after the folder was
    claimed; and a folder that holds another sweep names the flags that differ (--wr, not
    --wrs)."""
    from tests.cli_runner import run_cyto

    out = tmp_path / "swx"
    proc = run_cyto(*_sweep_args(synth_patches, out, "--wr", "99", "--set", "epochs=1"))
    assert proc.returncode == 2 and "abnormal" in proc.stderr, proc.stderr
    assert not out.exists()
    out.mkdir()
    spec = {"wrs": [5.0], "trials": 10, "methods": ["dsvdd"]}
    (out / "sweep.json").write_text(__import__("json").dumps(spec))
    proc = run_cyto(*_sweep_args(synth_patches, out, "--wr", "9", "--trials", "1"))
    assert proc.returncode == 2
    said = proc.stderr.strip()
    assert "--wr 5 -> 9" in said and "--trials 10 -> 1" in said and "--wrs" not in said, said


def _contents(folder):
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


def test_a_sweep_refused_for_a_users_results_table_leaves_their_folder_as_it_was(
    tmp_path, synth_patches
):
    """Hostile round 10 (N27): refused for a user's results.csv, the sweep had already written
    sweep.json into the user's folder. Every refusal comes before the first write."""

    out = tmp_path / "mine"
    (out / "models").mkdir(parents=True)
    (out / "models" / "notes.txt").write_text("mine\n")
    (out / "results.csv").write_text("mine\n")
    refused_as_it_was(synth_patches, out, f"{out / 'results.csv'} is not a sweep's results table "
                      "(its header is not cyto's)")  # fmt: skip
    # a user's file where the sweep keeps a model: refused the same way, before any write
    (out / "results.csv").unlink()
    (out / "models" / "dsvdd.cyto").write_text("mine\n")
    refused_as_it_was(
        synth_patches,
        out,
        f"{out / 'models' / 'dsvdd.cyto'} is not a model bundle this sweep wrote",
    )


def refused_as_it_was(data, out, why: str) -> None:
    """The sweep into ``out`` is refused with ``why`` and leaves ``out`` as it was."""
    from tests.cli_runner import run_cyto

    before = _contents(out)
    proc = run_cyto(*_sweep_args(data, out, "--wr", "5", "--trials", "1", *FAST))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: {why}: delete it and rerun, or use another --out"
    assert _contents(out) == before


FAST = ("--set", "epochs=1", "--set", "ae_epochs=1", "--set", "n_seeds=1")


def test_a_sweep_never_writes_into_its_data(tmp_path, synth_patches):
    """Hostile round 10 (N26): ``--out`` equal to ``--data``, or inside it, wrote results,
    models and plots (images) into the dataset, its class folders included; train refuses its
    own ``--data`` as ``--out`` ("an output never replaces an input"), and so does the sweep."""
    import shutil

    from cyto.eval.sweep import run_sweep
    from cyto.flags import python_words
    from tests.cli_runner import run_cyto

    data = tmp_path / "cells"
    shutil.copytree(synth_patches, data)
    before = _contents(data)
    for out, what in (
        (data, "is"),
        (data / "normal", "lies inside"),
        (data / "normal" / "r", "lies inside"),
    ):
        proc = run_cyto(*_sweep_args(data, out, "--wr", "5", "--trials", "1", *FAST))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == (
            f"error: --out {out} {what} the input --data {data}: an output never replaces an "
            "input; give another place to write to"
        )
        assert _contents(data) == before
    spec = SweepSpec(data=data, normal="normal", abnormal=None, methods=("dsvdd",), wrs=(5.0,))
    with (
        python_words("sweep"),
        pytest.raises(Exception, match=r"^out=.* lies inside the input data="),
    ):
        run_sweep(spec, data / "normal")
    assert _contents(data) == before


@pytest.mark.parametrize("item", ["holdout=0.5", "dsvdd:holdout=0.3", "refit=false"])
def test_the_one_class_hold_back_settings_are_refused_by_the_sweep(item, tmp_path, synth_patches):
    """Hostile round 40 (3): the sweep took --set holdout for Deep SVDD, recorded it in its
    bundles and did nothing with it (its one-class methods train on the normal bags alone):
    refused in one line, before anything is written."""
    from cyto.eval.sweep import SweepSpec, run_sweep

    spec = SweepSpec(data=synth_patches, normal="normal", abnormal=None,
                     methods=("dsvdd", "fs-sil"), wrs=(9.0,), overrides=(item,))  # fmt: skip
    with pytest.raises(ConfigError) as err:
        run_sweep(spec, tmp_path / "sw", echo=lambda _: None)
    words = str(err.value)  # the methods named (round 42, 6)
    assert f"--set {item!r}: {item.split(':')[-1].split('=')[0]!r} holds normal cells back" in words
    assert "the sweep holds none back for any method (dsvdd, fs-sil)" in words
    assert not (tmp_path / "sw").exists()
