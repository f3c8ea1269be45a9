"""The rule of reuse (cyto.reuse): earlier work is reused only when its key and its artifacts
prove it is the work asked for; otherwise it is redone or refused in one line with flag names."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import cyto.train.loop as loop_mod
from cyto.errors import ConfigError
from tests.cli_runner import run_cyto

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


def _train(data, out, overrides=TINY, **kw):
    """A tiny Deep SVDD run of cyto train's library call."""
    from cyto.train.api import train

    kw = {"normal": "normal", "preset": "fast", "device": "cpu", **kw}
    return train("dsvdd", data, out, overrides=overrides, **kw)


def test_train_resume_refuses_another_runs_checkpoint(tmp_path, synth_patches, monkeypatch):
    """Example 1: `cyto train --resume` after a failed run on other data used to continue that
    run's checkpoint (the manifest named the new data, the weights came from the old)."""
    from cyto.train.api import checkpoint_dir

    out = tmp_path / "m.cyto"
    real_save = _crash_after_first_checkpoint(monkeypatch)
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _train(synth_patches, out, echo=said.append)
    assert any(checkpoint_dir(out).rglob("*.pt"))  # the held-back probe's run comes first
    # Ctrl-C says what was kept, as cyto score does
    assert said and said[-1].startswith("interrupted: the last finished epoch"), said
    assert "--resume" in said[-1]
    monkeypatch.setattr(loop_mod, "save_checkpoint", real_save)

    other = _subset(synth_patches, tmp_path / "other")
    with pytest.raises(ConfigError, match=r"--resume: .*another run.*training cells"):
        _train(other, out, resume=True)
    with pytest.raises(ConfigError, match=r"--set lr .* -> "):
        _train(synth_patches, out, overrides={**TINY, "lr": 0.5}, resume=True)
    assert not out.exists()  # nothing was written from a foreign checkpoint
    # the run's own settings continue it
    result = _train(synth_patches, out, resume=True)
    assert result.bundle.is_dir() and not checkpoint_dir(out).exists()


def test_train_resume_refuses_a_checkpoint_without_a_key(tmp_path, synth_patches):
    from cyto.train.api import checkpoint_dir

    out = tmp_path / "m.cyto"
    checkpoint_dir(out).mkdir()
    (checkpoint_dir(out) / "dsvdd-seed0.pt").write_bytes(b"not ours")
    with pytest.raises(ConfigError, match="records no key"):
        _train(synth_patches, out, resume=True)


# --- a finished slide is reused only when its outputs are still what it wrote (examples 2, 3)


def _opts(**kw):
    from cyto.infer import ScoreOptions

    return ScoreOptions(**{"mosaic": 0, "workers": 0, "tile": 512, "resume": True, **kw})


@pytest.fixture(scope="module")
def two_slides(tmp_path_factory):
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    root = tmp_path_factory.mktemp("reuse")
    (root / "a").mkdir()
    (root / "b").mkdir()
    a = write_slide(root / "a" / "s.tif", SlideSynthConfig(width=768, height=768, seed=4))
    b = write_slide(root / "b" / "s.tif", SlideSynthConfig(width=768, height=768, seed=5))
    return a, b


def _damage(folder, how, other_folder):
    import pyarrow.parquet as pq

    if how == "truncated table":
        data = (folder / "scores.parquet").read_bytes()
        (folder / "scores.parquet").write_bytes(data[: len(data) // 2])
    elif how == "replaced table":
        table = pq.read_table(folder / "scores.parquet")
        pq.write_table(table.slice(0, table.num_rows // 2), folder / "scores.parquet")
    elif how == "another slide's table":
        shutil.copy(other_folder / "scores.parquet", folder / "scores.parquet")
    elif how == "top-K missing":
        (folder / "topk.parquet").unlink()
    elif how == "mosaic missing":
        (folder / "topk_mosaic_blinded.png").unlink()


@pytest.mark.parametrize(
    "how",
    [
        "truncated table",
        "replaced table",
        "another slide's table",
        "top-K missing",
        "mosaic missing",
        "intact",
    ],
)
def test_resume_reuses_a_finished_slide_only_when_its_outputs_hold(
    exported_dsvdd, two_slides, tmp_path, how
):
    """Example 2: `cyto score --resume` said 'already scored; skipping' when scores.parquet had
    been truncated or replaced, or topk.parquet or the mosaics were missing: only summary.json
    was read."""
    import pyarrow.parquet as pq

    from cyto.cohort import score_cohort

    a, b = (s.paths[0] for s in two_slides)
    opts = _opts(mosaic=16)
    [first], _ = score_cohort([a], exported_dsvdd, tmp_path / "o", opts, lambda m: None)
    score_cohort([b], exported_dsvdd, tmp_path / "p", opts, lambda m: None)
    folder = tmp_path / "o" / "s"
    _damage(folder, how, tmp_path / "p" / "s")
    said: list[str] = []
    [again], _ = score_cohort([a], exported_dsvdd, tmp_path / "o", opts, said.append)
    if how == "intact":
        assert any("already scored" in m for m in said), "\n".join(said)
        return
    assert not any("; skipping" in m for m in said), said
    # the folder's seal (cyto.seal) finds each of these before its tables are read; a table
    # as it was written keeps its cells, the outputs drawn from it are written again
    kept = how in ("top-K missing", "mosaic missing")
    then = "its cells are kept" if kept else "scoring it again"
    assert any("changed since they were written" in m and then in m for m in said), said
    assert (again["cells_this_run"] == 0) == kept, said
    assert pq.read_table(folder / "scores.parquet").num_rows == first["cells_scored"]
    assert (folder / "topk.parquet").is_file() and (folder / "topk_mosaic_blinded.png").is_file()


def test_a_resume_keeps_scores_as_exact_as_its_engines_and_names_the_engine_that_made_them(
    exported_dsvdd, two_slides, tmp_path, monkeypatch
):
    """`cyto score --backend onnx --resume` kept a slide OpenVINO had scored at bf16 (as
    `--backend auto` picks it on a CPU with bf16), unsaid: a finished run's scores are kept
    only where they are as exact as this run's engine makes them (the same precision, or a
    finer one: a plain --resume that auto took to bf16 scored a cohort finished at fp32 again,
    hostile round 48, 5), and one kept from another engine says which; the line that a slide
    is scored again is said once (it was said twice)."""
    import cyto.cohort.local as local
    from cyto.cohort import score_cohort

    a = two_slides[0].paths[0]
    out = tmp_path / "o"
    real = local.load_scorer
    engine: dict[str, str] = {}

    def loaded(*args, **kw):
        scorer = real(*args, **kw)
        for field, value in engine.items():
            setattr(scorer.backend, field, value)
        return scorer

    monkeypatch.setattr(local, "load_scorer", loaded)

    def run() -> tuple[dict, list[str]]:
        said: list[str] = []
        [summary], _ = score_cohort([a], exported_dsvdd, out, _opts(backend="onnx"), said.append)
        return summary, said

    engine.update(name="openvino", precision="bf16")  # as auto takes it on a bf16 CPU
    first, _ = run()
    assert (first["backend"], first["precision"]) == ("openvino", "bf16")
    engine.clear()  # onnx at fp32: finer than bf16, scored again, each engine named once
    again, said = run()
    line = "scored on openvino at bf16, this run's engine is onnx at fp32; scoring it again"
    assert sum(line in m for m in said) == 1, said
    assert not any("already scored" in m for m in said), said
    assert again["precision"] == "fp32" and again.get(local.REUSED) is None
    for field, value in (("name", "openvino"), ("precision", "int8")):
        engine.update({field: value})  # another backend at fp32, then a coarser precision
        kept, said = run()
        [line] = [m for m in said if "already scored" in m]
        assert ", on onnx at fp32) in " in line, line
        assert kept.get(local.REUSED) is not None


def test_python_callers_are_warned_of_unverified_scores_and_of_a_resume_that_scores_again(
    exported_dsvdd, two_slides, synth_patches, tmp_path
):
    """Hostile round 26 (4, 8): from Python with ``echo=None``, scoring with a graph nothing
    checked here (a bundle without golden cells) and ``resume=True`` replacing finished results
    scored with other options (its truth block and label column gone) were said nowhere;
    `cyto predict` did not say UNVERIFIED at all. Each is a ``CytoWarning`` at the caller's
    line, and a `warning:` line at the command line."""
    import warnings

    import cyto
    from cyto.errors import CytoWarning

    a = two_slides[0].paths[0]
    out = tmp_path / "o"

    def warned(call) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        return [str(w.message) for w in caught if issubclass(w.category, CytoWarning)]

    first = warned(lambda: cyto.score_slide(a, exported_dsvdd, out, echo=None, mosaic=0,
                                            workers=0, top_k=20))  # fmt: skip
    assert any(m.startswith(f"UNVERIFIED: {exported_dsvdd} scores with a graph") for m in first)
    again = warned(lambda: cyto.score_slide(a, exported_dsvdd, out, echo=None, mosaic=0,
                                            workers=0, tile=256, resume=True))  # fmt: skip
    assert any("scored with other settings" in m and "scoring it again" in m for m in again), again
    table = tmp_path / "p.parquet"
    said = warned(lambda: cyto.predict(exported_dsvdd, synth_patches, table, normal="normal",
                                       echo=None))  # fmt: skip
    assert any(m.startswith("UNVERIFIED: ") for m in said), said
    proc = run_cyto("predict", str(exported_dsvdd), "--data", str(synth_patches), "--out",
                    str(tmp_path / "q.parquet"), "--normal", "normal")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "warning: UNVERIFIED: " in proc.stdout + proc.stderr


def test_resume_rescored_when_a_side_file_changed_under_its_name(
    exported_dsvdd, two_slides, tmp_path
):
    """A --truth file edited under the same name is another input: the finished slide is not
    reused with the old truth report."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.cohort import score_cohort

    a = two_slides[0]
    truth = tmp_path / "truth.parquet"
    shutil.copy(a.ground_truth, truth)
    opts = _opts(truth=truth)
    score_cohort([a.paths[0]], exported_dsvdd, tmp_path / "o", opts, lambda m: None)
    table = pq.read_table(truth)
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("x"), "x", pa.array(table["x"].to_numpy() + 1.0)
        ),
        truth,
    )
    said: list[str] = []
    score_cohort([a.paths[0]], exported_dsvdd, tmp_path / "o", opts, said.append)
    assert any("the --truth file's content" in m for m in said), said


def test_two_namesakes_scored_apart_keep_their_folders_when_scored_together(
    exported_dsvdd, two_slides, tmp_path
):
    """Example 3: a/s.tif and b/s.tif, scored in two earlier runs into one --out, then together
    with --resume: one of them was scored again into a new folder, and cohort.csv got two rows
    for it."""
    import csv

    from cyto.cohort import score_cohort

    a, b = (s.paths[0] for s in two_slides)
    out = tmp_path / "o"
    score_cohort([a], exported_dsvdd, out, _opts(), lambda m: None)
    score_cohort([b], exported_dsvdd, out, _opts(), lambda m: None)
    folders = sorted(f.name for f in out.iterdir() if f.is_dir())
    said: list[str] = []
    done, failed = score_cohort([a, b], exported_dsvdd, out, _opts(), said.append)
    assert not failed and sum("already scored" in m for m in said) == 2, said
    assert sorted(f.name for f in out.iterdir() if f.is_dir()) == folders
    with open(out / "cohort.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and len({r["output"] for r in rows}) == 2, rows


# --- an export seals a graph only with the golden cells that verify it (example 5)


def test_an_export_killed_before_its_golden_cells_leaves_the_bundle_as_it_was(
    tiny, tmp_path, monkeypatch, synth_patches
):
    """Example 5: an export killed part way left encoder.onnx sealed without golden cells;
    `cyto score` then ran that never-checked graph with exit 0, and `cyto doctor` said
    everything runs."""
    from cyto.bundle import load_bundle, save_bundle
    from cyto.doctor import diagnose, render
    from cyto.export.api import export_bundle
    from tests.train_helpers import make

    m = make("dsvdd", epochs=1, ae_epochs=1, n_seeds=1, tta_views=("orig",)).fit(tiny)
    path = tmp_path / "m.cyto"
    save_bundle(path, *m.bundle_parts(tiny))
    before = load_bundle(path, weights=False).manifest["files"]

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while the golden cells were scored")

    import cyto.runtime.scorer as scorer_mod

    real = scorer_mod.load_scorer
    monkeypatch.setattr(scorer_mod, "load_scorer", killed)
    from cyto.export.api import stopped_words

    said: list[str] = []
    with pytest.raises(KeyboardInterrupt), stopped_words(path, said.append):
        export_bundle(path, cells=synth_patches, echo=said.append)
    assert said[-1].startswith(f"interrupted: {path} keeps "), said
    monkeypatch.setattr(scorer_mod, "load_scorer", real)
    after = load_bundle(path, weights=False).manifest["files"]
    assert after == before  # neither the graph nor half of the golden set was sealed
    assert not (path / "encoder.onnx").exists()
    assert not list(tmp_path.glob(".m.cyto.staged-*"))

    # a bundle whose graph has no golden cells (an older cyto's export) is a problem for the
    # doctor, and cyto score says so on the console and in the slide's line
    from cyto.export.onnx import export_onnx

    export_onnx(path)
    report = diagnose([path], "cpu")
    text = render(report)
    assert report.exit_code == 1 and "unverified" in text and "everything asked" not in text
    from cyto.cohort.local import open_model
    from cyto.infer import ScoreOptions

    said: list[str] = []
    open_model(path, ScoreOptions(), said.append).close()
    assert any(m.startswith("warning: UNVERIFIED") for m in said), said
    from cyto.cohort.run import slide_line

    summary = {
        "slide": "s.tif",
        "cells_scored": 5,
        "seconds": 1.0,
        "cells_per_s": 5.0,
        "verification": {"status": "unverified"},
    }
    assert "UNVERIFIED scores" in slide_line(summary, tmp_path)


# --- a verification record is this scorer's, and its decision is the gate's (example 4)


def test_a_hand_edited_verification_record_is_judged_by_its_numbers(golden_bundle):
    """Example 4a: a record edited by hand (a Spearman of 0.10 recorded as "passed") was
    trusted: the cached decision was read as a boolean. A record that holds its own sha256 is
    one cyto wrote (an unsealed edit is said and checked again: test_verify); one whose
    "passed" its numbers do not bear out is judged by the numbers."""
    from cyto.errors import VerificationError
    from cyto.reuse import sealed_record
    from cyto.runtime import load_scorer

    s = load_scorer(golden_bundle, "onnx", "cpu")
    assert s.verification.status == "passed"
    s.close()
    [record_file] = (golden_bundle / "verified").glob("*.json")
    record = json.loads(record_file.read_text())
    record["parity"].update(spearman=0.10, top10_overlap=0.2, max_diff_of_range=0.4)
    assert record["passed"] is True
    record_file.write_text(json.dumps(sealed_record(record)))
    with pytest.raises(VerificationError, match="Spearman 0.1000"):
        load_scorer(golden_bundle, "onnx", "cpu")
    # a record whose numbers are gone is no record: verified again, here
    record["parity"] = {"passed": True}
    record_file.write_text(json.dumps(record))
    again = load_scorer(golden_bundle, "onnx", "cpu")
    assert again.verification.status == "passed" and not again.verification.cached


def test_a_failure_on_record_says_so_and_doctor_runs_the_check_again(golden_bundle):
    """Hostile round 9, N6: a record edited to fail (or a stale one) refused a passing graph
    for good; doctor showed it as FAILED with no word that it was read, not run, and nothing
    said how to check again. The refusal now says it was read and names doctor, and doctor
    runs the check (and keeps what it found); so does auto's note of a choice it passes over.
    The failing records are written as cyto writes one (with their own sha256: a stale failure,
    not an edit, which is checked again at once)."""
    from cyto.doctor import diagnose, render
    from cyto.errors import VerificationError
    from cyto.reuse import sealed_record
    from cyto.runtime import load_scorer

    load_scorer(golden_bundle, "onnx", "cpu").close()
    [record_file] = (golden_bundle / "verified").glob("*.json")
    record = json.loads(record_file.read_text())
    record["parity"].update(spearman=0.5, top10_overlap=0.2, max_diff_of_range=0.4)
    record_file.write_text(json.dumps(sealed_record(record)))
    with pytest.raises(VerificationError, match="not run now") as refused:
        load_scorer(golden_bundle, "onnx", "cpu")
    assert f"cyto doctor {golden_bundle} runs the check again" in str(refused.value)
    report = diagnose([golden_bundle], "cpu", "fp32")
    [row] = [r for r in report.rows if r.backend == "onnx"]
    assert row.status == "passed" and row.source == "ran now", render(report)
    again = load_scorer(golden_bundle, "onnx", "cpu")  # the record doctor wrote
    assert again.verification.passed and again.verification.cached
    again.close()
    # auto passes over a choice whose record fails, and names doctor there too (round 53, 4)
    first = load_scorer(golden_bundle, "auto", "cpu")
    first.close()
    sha = first.verification.record["key_sha256"]
    [record_file] = [
        f
        for f in (golden_bundle / "verified").glob("*.json")
        if json.loads(f.read_text())["key_sha256"] == sha
    ]
    record = json.loads(record_file.read_text())
    record["parity"].update(spearman=0.5, top10_overlap=0.2, max_diff_of_range=0.4)
    record_file.write_text(json.dumps(sealed_record(record)))
    other = load_scorer(golden_bundle, "auto", "cpu")
    other.close()
    [over] = [n for n in other.notes if n.startswith("failed verification, not used: ")]
    assert "not run now" in over and over.endswith(
        f"; cyto doctor {golden_bundle} runs the check again"
    ), other.notes


def test_a_changed_scoring_setting_is_verified_again(golden_bundle):
    """Example 4b: a bundle whose scorer settings changed (an unsealed format-1 manifest with
    another TTA blend) still read "passed (cached)" while most of its scores differed."""
    import warnings

    from cyto.errors import VerificationError
    from cyto.runtime import load_scorer

    s = load_scorer(golden_bundle, "torch", "cpu")
    assert s.verification.status == "passed"
    s.close()
    manifest_file = golden_bundle / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    assert len(manifest["tta_views"]) > 1
    del manifest["manifest_sha256"]  # the seal
    manifest["format_version"] = 1
    manifest["tta_lambda"] = 1.0 - float(manifest.get("tta_lambda", 0.0))
    manifest_file.write_text(json.dumps(manifest))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(VerificationError):
            load_scorer(golden_bundle, "torch", "cpu")


# --- resume equals a fresh run, wherever the first run stopped and whatever changed since


@pytest.fixture(scope="module")
def fresh_tables(exported_dsvdd, two_slides, tmp_path_factory):
    """The uninterrupted score tables of slide a, at top-K 5 and 3 (the same cells and ranks)."""
    import pyarrow.parquet as pq

    from cyto.infer import score_slide

    out = {}
    for k in (5, 3):
        folder = tmp_path_factory.mktemp("fresh") / "s"
        score_slide(
            two_slides[0].paths[0],
            exported_dsvdd,
            folder,
            _opts(tile=256, chunk_cells=8, top_k=k, resume=False),
            echo=lambda m: None,
        )
        out[k] = (pq.read_table(folder / "scores.parquet"), pq.read_table(folder / "topk.parquet"))
    return out


def _cells(table):
    cols = ["cell_id", "x", "y", "score", "rank"]
    return {c: table[c].to_pylist() for c in cols}


@hsettings(max_examples=4)
@given(stop_after=st.integers(0, 6), top_k=st.sampled_from([5, 3]))
def test_resume_equals_a_fresh_run_wherever_it_stopped(
    exported_dsvdd, two_slides, fresh_tables, tmp_path_factory, stop_after, top_k
):
    """A run stopped after any number of chunks, resumed with the same or another --top-k,
    writes exactly the table and top-K an uninterrupted run with the resumed settings writes."""
    import pyarrow.parquet as pq

    import cyto.infer.store as store_mod
    from cyto.infer import score_slide

    folder = tmp_path_factory.mktemp("stopped") / "s"
    slide = two_slides[0].paths[0]
    real_write, written = store_mod.ChunkStore.write, []

    def write_then_stop(self, *args, **kwargs):
        if len(written) >= stop_after:
            raise KeyboardInterrupt("stopped between chunks")
        real_write(self, *args, **kwargs)
        written.append(args)

    store_mod.ChunkStore.write = write_then_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            score_slide(
                slide,
                exported_dsvdd,
                folder,
                _opts(tile=256, chunk_cells=8, top_k=5),
                echo=lambda m: None,
            )
    finally:
        store_mod.ChunkStore.write = real_write
    said: list[str] = []
    score_slide(
        slide, exported_dsvdd, folder, _opts(tile=256, chunk_cells=8, top_k=top_k), echo=said.append
    )
    if stop_after:
        assert any(m.startswith("resuming: ") for m in said), said
    table, top = fresh_tables[top_k]
    assert _cells(pq.read_table(folder / "scores.parquet")) == _cells(table)
    assert _cells(pq.read_table(folder / "topk.parquet")) == _cells(top)


def test_namesakes_whose_names_are_not_utf8_get_folders_apart(tmp_path):
    """Two slides of one cohort named b'slide-\\xff.tif' in two folders: naming their folders
    apart hashed the path as UTF-8 and aborted the cohort."""
    import os

    from cyto.cohort.local import slide_folders

    name = os.fsdecode(b"slide-\xff.tif")
    slides = [tmp_path / "a" / name, tmp_path / "b" / name]
    pairs = slide_folders(slides, tmp_path / "out")
    folders = [target.name for _, target in pairs]
    assert len(set(folders)) == 2 and all(f.startswith("slide-\\xff-") for f in folders), folders


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_side_tables_whose_names_are_not_utf8_are_read(tmp_path, suffix):
    """A --nuclei or --truth file named b'cells-\\xff.csv' ended in a UnicodeEncodeError
    traceback: Arrow takes paths as UTF-8 only (cyto.tables reads them by a file handle)."""
    import os

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from cyto.detect.points import read_nuclei_file
    from cyto.infer.outputs import read_truth

    path = tmp_path / os.fsdecode(b"cells-\xff" + suffix.encode())
    table = pa.table({"x": [10.0, 50.0], "y": [20.0, 60.0], "label": [0, 1]})
    with open(path, "wb") as fh:
        (pacsv.write_csv if suffix == ".csv" else pq.write_table)(table, fh)
    assert list(read_truth(path)["x"]) == [10.0, 50.0]
    assert len(read_nuclei_file(path, 100, 100)) == 2


def test_a_full_disk_under_trainings_checkpoint_is_one_line_naming_it(
    tmp_path, synth_patches, monkeypatch
):
    """Hostile round 47, 2: `cyto train --out` on a full disk printed "stopped: ..." and then 60
    lines of torch's traceback ("unexpected pos"), named no disk, and left the half-written
    checkpoint. A checkpoint is written as any file: one line naming it, nothing half-written,
    and a --resume with room continues."""
    import errno
    import os
    import types

    import cyto.bundle as bundle_mod
    from cyto.train.api import checkpoint_dir
    from tests.cli_runner import run_cyto

    real_fdopen = os.fdopen
    room = {"bytes": 4096}  # what the disk takes before it is full

    class FullDisk:  # a file written by cyto.bundle.atomic_write, on a disk that fills
        def __init__(self, fd, mode):
            self.fh = real_fdopen(fd, mode)

        def write(self, data):
            if len(data) > room["bytes"]:
                self.fh.write(bytes(data[: room["bytes"]]))
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.fh.write(data)

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    full_os = types.SimpleNamespace(
        **{k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
    )
    full_os.fdopen = FullDisk
    monkeypatch.setattr(bundle_mod, "os", full_os)
    out = tmp_path / "m.cyto"
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    args = ["train", "dsvdd", "--data", str(synth_patches), "--out", str(out), "--normal",
            "normal", "--preset", "fast", "--device", "cpu", *sets]  # fmt: skip
    proc = run_cyto(*args)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected pos" not in proc.stderr, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert line.endswith(": the disk is full") and str(checkpoint_dir(out)) in line, line
    assert not list(checkpoint_dir(out).rglob("*.partial"))
    assert not [p for p in checkpoint_dir(out).rglob(".*") if p.name != ".lock"]
    room["bytes"] = 1 << 40
    again = run_cyto(*args, "--resume")
    assert again.returncode == 0, again.stderr
    assert out.is_dir()
