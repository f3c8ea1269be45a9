"""Bad input, as a hostile but realistic user gives it: every case is one line on stderr, names
the file, exits non-zero, and never a traceback. The corpus is made here."""

from __future__ import annotations

import json
import os

import pytest

from cyto.detect import read_nuclei_file
from cyto.errors import ConfigError, DatasetError, InputPathError
from tests.cli_runner import run_cyto

NUCLEI = {
    "empty.csv": b"",
    "text.csv": b"x,y\nabc,3\n",
    "hole.csv": b"x,y\n1,\n",
    "list.geojson": b"[1, 2, 3]",
    "one.geojson": json.dumps(
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [5]}}
    ).encode(),
    "ring.geojson": json.dumps(
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": []}}
    ).encode(),
    "scalar.geojson": b"7",
}


@pytest.mark.parametrize("name", sorted(NUCLEI))
def test_bad_nuclei_files_are_one_clear_error(tmp_path, name):
    f = tmp_path / name
    f.write_bytes(NUCLEI[name])
    with pytest.raises(InputPathError, match=f"nuclei file {f}"):
        read_nuclei_file(f, 100, 100)


def test_a_bad_nuclei_file_through_the_cli(exported_dsvdd, tmp_path):
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    slide = write_slide(tmp_path / "s.tif", SlideSynthConfig(width=512, height=512)).paths[0]
    f = tmp_path / "text.csv"
    f.write_bytes(NUCLEI["text.csv"])
    proc = run_cyto(
        "score",
        str(slide),
        "--model",
        str(exported_dsvdd),
        "--out",
        str(tmp_path / "o"),
        "--nuclei",
        str(f),
    )
    assert proc.returncode == 2 and "x and y must be numbers" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_repeated_rows_of_a_manifest_are_refused(tmp_path):
    from PIL import Image

    from cyto.data.dataset import read_manifest

    rows = ["path,label"]
    for i in range(4):
        Image.new("RGB", (8, 8)).save(tmp_path / f"c{i}.png")
        rows.append(f"c{i}.png,normal")
    rows += ["c1.png,normal", "./c2.png,normal"]  # the same images again
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DatasetError, match=r"2 image\(s\) more than once \(row 6 repeats row 3"):
        read_manifest(tmp_path / "m.csv")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_setting_is_refused_before_any_data_is_read(value):
    from cyto.train.config import resolve_config
    from cyto.train.dsvdd import DSVDDConfig

    with pytest.raises(ConfigError) as refused:
        resolve_config(DSVDDConfig, "fast", overrides=[f"lr={value}"])
    # named as the user wrote it (hostile round 12, N19: "lr='nan' is not a valid ...")
    assert str(refused.value) == f"--set lr must be a finite number, got '{value}'"


def test_a_setting_refused_by_value_names_its_set_flag():
    from cyto.train.config import resolve_config
    from cyto.train.dsvdd import DSVDDConfig

    with pytest.raises(ConfigError) as refused:
        resolve_config(DSVDDConfig, "fast", overrides=["backbone="])
    assert str(refused.value).startswith("--set backbone must be one of ")
    with pytest.raises(ConfigError) as refused:
        resolve_config(DSVDDConfig, "fast", overrides=["epochs=two"])
    assert str(refused.value) == "--set epochs must be an integer, got 'two'"


def test_a_missing_onnxruntime_is_one_line_naming_the_extras(exported_dsvdd, tmp_path):
    """`pip install cyto` without an extra, then `cyto export`: the runtime names cyto[cpu] /
    cyto[gpu] (a broken import is treated the same), before the slow export touches the bundle."""
    import shutil

    copy = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()}
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "onnxruntime.py").write_text("raise ImportError('no onnxruntime here')\n")
    proc = run_cyto("export", str(copy), env={"PYTHONPATH": str(blocker)})
    assert proc.returncode != 0
    assert (
        "onnxruntime" in proc.stderr and "cyto[cpu]" in proc.stderr and "cyto[gpu]" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == before


def test_a_truth_table_is_checked_before_any_slide_is_scored(exported_dsvdd, tmp_path):
    """--truth that does not exist, or lacks its label column, is one line and exit 2 before
    anything is scored or written (issue 34: it surfaced after the whole slide, as 'cannot
    write OUT/...'); a well-formed CSV of x, y, label is used (it raised a traceback)."""
    import pyarrow.parquet as pq

    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    made = write_slide(tmp_path / "s.tif", SlideSynthConfig(width=768, height=768, n_cells=30))
    slide = made.paths[0]
    out = tmp_path / "o"
    base = ("score", str(slide), "--model", str(exported_dsvdd), "--out", str(out))
    for truth, words in (
        (tmp_path / "missing.csv", "does not exist"),
        (tmp_path / "nolabel.csv", "lacks label"),
    ):
        if truth.name == "nolabel.csv":
            truth.write_text("x,y\n10,10\n")
        proc = run_cyto(*base, "--truth", str(truth), "--workers", "0")
        assert proc.returncode == 2, proc.stderr
        assert "--truth" in proc.stderr and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "model " not in proc.stdout
        assert not out.exists()
    gt = pq.read_table(made.ground_truth)
    csv = tmp_path / "truth.csv"
    csv.write_text(
        "x,y,label\n"
        + "".join(
            f"{x},{y},{lab}\n"
            for x, y, lab in zip(
                gt["x"].to_pylist(), gt["y"].to_pylist(), gt["label"].to_pylist(), strict=True
            )
        )
    )
    proc = run_cyto(*base, "--truth", str(csv), "--workers", "0", "--mosaic", "0")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "s" / "summary.json").read_text())
    assert summary["truth"]["planted_abnormal"] == int(sum(gt["label"].to_pylist()))


def test_a_read_only_out_is_one_line_before_any_work(exported_dsvdd, tmp_path, monkeypatch):
    """An existing --out this user cannot write to (issue 34: an OSError traceback on the
    cohort table's lock file after the slides were tried). As root, mode bits do not stop a
    write, so the check is driven by an injected answer of os.access here; a cohort table that
    cannot be written (a full or read-only disk) is an OutputWriteError naming it."""
    import os

    from cyto.cohort import score_cohort
    from cyto.cohort import table as cohort_table
    from cyto.errors import OutputWriteError
    from cyto.infer.options import ScoreOptions

    out = tmp_path / "ro"
    out.mkdir()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == str(out) else real(p, mode)
    )
    loaded = []
    monkeypatch.setattr("cyto.cohort.local.load_scorer", lambda *a, **k: loaded.append(a))
    with pytest.raises(OutputWriteError, match=r"--out .*ro.* is read-only"):
        score_cohort([tmp_path / "s.tif"], exported_dsvdd, out, ScoreOptions(), echo=print)
    assert loaded == []  # refused before the model was loaded
    monkeypatch.setattr(os, "access", real)

    def full(rows, path, pending=()):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cohort_table, "_merge_cohort_table", full)
    with pytest.raises(OutputWriteError, match=r"cannot write the cohort table .*No space left"):
        cohort_table.write_cohort_table([], out / "cohort.csv")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_a_read_only_out_through_the_cli(exported_dsvdd, tmp_path):  # pragma: no cover - non-root
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    slide = write_slide(tmp_path / "s.tif", SlideSynthConfig(width=512, height=512)).paths[0]
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        proc = run_cyto("score", str(slide), "--model", str(exported_dsvdd), "--out", str(out))
    finally:
        out.chmod(0o755)
    assert proc.returncode != 0 and "read-only" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("given, bad", [("fp64", "fp64"), ("fp32,fp64,int4", "fp64,int4")])
def test_an_unknown_export_precision_is_said_as_typed(exported_dsvdd, given, bad):
    """Hostile round 35 (5): `cyto export --precision fp64` answered "got ['fp64']"."""
    import cyto

    proc = run_cyto("export", str(exported_dsvdd), "--precision", given)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: --precision takes fp32, fp16, bf16, int8 (comma-separated), got {bad}"
    ), proc.stderr
    with pytest.raises(ConfigError, match=rf"takes fp32, fp16, bf16, int8 .*, got {bad}$"):
        cyto.export(exported_dsvdd, precisions=given)
