"""`cyto calibrate` on slide-negative slides, then `cyto score` with p-values, FDR flags, burden,
slide triage and the cohort table; what the calibration refuses and what it warns about."""

from __future__ import annotations

import csv
import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.seal import with_rows_seal
from cyto.stats import conformal
from tests.cli_runner import run_cyto
from tests.integration.test_score import score_cli


@pytest.fixture(scope="module")
def cohort(exported_dsvdd, tmp_path_factory):
    """A copy of the model, three negative slides scored with it, and a slide with 20%
    abnormal cells."""
    root = tmp_path_factory.mktemp("cal")
    model = root / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    negs = [
        write_slide(
            root / f"neg{i}.ndpi",
            SlideSynthConfig(width=1024, height=1024, n_cells=120, abnormal_fraction=0.0, seed=i),
        ).paths[0]
        for i in range(3)
    ]
    pos = write_slide(
        root / "pos.ndpi",
        SlideSynthConfig(width=1024, height=1024, n_cells=120, abnormal_fraction=0.2, seed=9),
    )
    proc = run_cyto(
        "score",
        *map(str, negs),
        "--model",
        str(model),
        "--out",
        str(root / "negs"),
        "--mosaic",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "model": model, "negs": negs, "pos": pos}


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_uncalibrated_runs_say_so_and_keep_a_cohort_table(cohort):
    rows = _csv(cohort["root"] / "negs" / "cohort.csv")
    assert [r["slide"].rsplit("/", 1)[-1] for r in rows] == ["neg0.ndpi", "neg1.ndpi", "neg2.ndpi"]
    assert {r["status"] for r in rows} == {"scored"} and {r["calibration"] for r in rows} == {
        "not calibrated"
    }
    # a second run into the same folder adds its row and keeps the others
    from cyto.cohort.table import cohort_row, write_cohort_table

    write_cohort_table(
        [cohort_row(cohort["root"] / "x.ndpi", cohort["root"] / "negs" / "x", None, "bad file")],
        cohort["root"] / "negs" / "cohort.csv",
    )
    rows = _csv(cohort["root"] / "negs" / "cohort.csv")
    assert len(rows) == 4 and rows[-1]["status"] == "failed" and rows[-1]["error"] == "bad file"
    summary = json.loads((cohort["root"] / "negs" / "neg0" / "summary.json").read_text())
    assert "cyto calibrate" in summary["burden"]["reason"]
    assert (
        "p_value"
        not in pq.read_table(cohort["root"] / "negs" / "neg0" / "scores.parquet").column_names
    )


def test_calibrate_then_score_gives_p_values_flags_and_burden(cohort, tmp_path):
    root, model = cohort["root"], cohort["model"]
    tables = [root / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    proc = run_cyto("calibrate", str(model), *map(str, tables))
    assert proc.returncode == 0, proc.stderr
    assert "leave one slide out: BH at 0.1 flagged cells on" in proc.stdout
    manifest = json.loads((model / "manifest.json").read_text())
    cal = manifest["calibration"]
    assert cal["kind"] == "slides" and cal["normalization"] == "median"
    assert [s["cells"] for s in cal["slides"]] == [pq.read_table(t).num_rows for t in tables]
    assert cal["leave_one_slide_out"]["slides"] == 3 and "calibration.npz" in manifest["files"]
    # the crop side the slides were cut at: --patch-size was not given, the model's training
    # patches' side is recorded (as the side it cut)
    assert cal["valid_for"]["options"]["patch_size"] == 192
    info = run_cyto("info", str(model))
    assert (
        "calibration: " in info.stdout
        and "3 slide-negative slide(s), median normalization" in info.stdout
    )

    out = tmp_path / "o"
    proc = score_cli(
        cohort["pos"].paths[0],
        model,
        out,
        "--mosaic",
        "0",
        "--fdr",
        "0.2",
        "--truth",
        str(cohort["pos"].ground_truth),
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "pos" / "summary.json").read_text())
    b = summary["burden"]
    table = pq.read_table(out / "pos" / "scores.parquet")
    assert b["status"] == "ok", b
    assert "abnormal burden" in proc.stdout and "flagged at FDR 0.2" in proc.stdout
    # what the burden counts is said (hostile round 11, N32: "0.00% (95% CI 0.00-0.00%)" on a
    # slide with planted abnormal cells read as none): the cells above the normal threshold
    q = f"{100 * b['threshold_quantile_of_normals']:g}"
    assert re.search(rf"abnormal burden [0-9.]+% above the normal {q}th percentile \(95% CI",
                     proc.stdout), proc.stdout  # fmt: skip
    assert b["counts"].endswith("so the burden and its interval are a lower bound")
    # about 360 calibration cells cannot give a p-value small enough for BH on about 120 cells
    assert "abnormal-looking cells are never flagged. Calibrate on at least" in proc.stdout
    assert "to flag a single cell" in b["note"]
    # what the note says holds beside the count (hostile round 10, N34: "no cell can be
    # flagged" beside "7 cells flagged")
    fewest = int(re.search(r"fewer than (\d+) abnormal-looking", b["note"]).group(1))
    assert b["flagged_bh"] == 0 or b["flagged_bh"] >= fewest

    # the p-values are the rank rule against the slide-normalized calibration scores
    parts = [np.asarray(pq.read_table(t)["score"]) for t in tables]
    ref = np.sort(np.concatenate([conformal.normalize(p, "median")[0] for p in parts]))
    scores = np.asarray(table["score"])
    x = conformal.normalize(scores, "median")[0]
    want = np.array([(1 + np.sum(ref >= v)) / (len(ref) + 1) for v in x])
    np.testing.assert_allclose(np.asarray(table["p_value"]), want)
    flags = np.asarray(table["flagged_bh"])
    np.testing.assert_array_equal(flags, conformal.bh(want, 0.2))
    assert b["flagged_bh"] == int(flags.sum()) and b["fdr_alpha"] == 0.2
    assert b["flagged_adaptive"] == int(np.asarray(table["flagged_adaptive"]).sum())
    lo, hi = b["abnormal_cells_interval"]
    assert 0 <= lo <= b["abnormal_cells"] <= hi <= table.num_rows
    assert b["cells_above"] == int(np.sum(scores > b["threshold"]))
    assert 0 < b["slide_p_value"] <= 1
    # these slides' cells look 1.6x smaller than the small model's training cells (cyto score
    # warns): the default adequacy rule finds them unsatisfactory, and the triage says so
    # instead of 'no excess' (an excess would still be said first)
    assert summary["adequacy"]["result"] == "unsatisfactory"
    assert b["triage"].startswith(("excess; unsatisfactory: ", "unsatisfactory: "))
    row = _csv(out / "cohort.csv")[0]
    assert row["calibration"] == "ok" and int(row["flagged_bh"]) == b["flagged_bh"]
    assert float(row["abnormal_cells_low"]) == lo
    # off the model's scale no calibration cell is evaluable: the burden counts every cell, says
    # why, and the cohort table says what it counted
    assert b["counted"] == row["burden_counted"] == "all" and "fewer than 100" in b["counted_why"]
    assert b["cells"] == table.num_rows and cal["evaluable_cells"] == 0
    # the levels its flags and triage were drawn at, and the cells above (hostile round 69, 3
    # and 7): a second run into the table at other levels is said
    assert (row["fdr_alpha"], row["triage_level"]) == ("0.2", "0.05")
    assert int(row["cells_above"]) == b["cells_above"]
    proc = score_cli(
        cohort["negs"][0], model, out, "--mosaic", "0", "--fdr", "0.5", "--triage-level", "0.2"
    )
    assert proc.returncode == 0, proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert (
        f"{out / 'cohort.csv'} holds slides flagged and triaged at 2 levels (--fdr 0.2, "
        "--triage-level 0.05; --fdr 0.5, --triage-level 0.2): their flags and triage labels do "
        "not compare"
    ) in said, said

    # --fdr-confidence: flags from calibration-conditional p-values, p_value stays marginal
    proc = score_cli(
        cohort["pos"].paths[0],
        model,
        tmp_path / "c",
        "--mosaic",
        "0",
        "--fdr",
        "0.2",
        "--fdr-confidence",
        "0.9",
    )
    assert proc.returncode == 0, proc.stderr
    bc = json.loads((tmp_path / "c" / "pos" / "summary.json").read_text())["burden"]
    tc = pq.read_table(tmp_path / "c" / "pos" / "scores.parquet")
    np.testing.assert_allclose(np.asarray(tc["p_value"]), want)
    conditional = conformal.conditional_p_values(x, ref, 0.9)
    np.testing.assert_array_equal(np.asarray(tc["flagged_bh"]), conformal.bh(conditional, 0.2))
    assert bc["fdr_guarantee"] == "for this calibration with probability 0.9"
    assert b["fdr_guarantee"] == "on average over calibrations"
    assert "for this calibration" in proc.stdout

    # scored with other options than the calibration slides: said out loud, recorded
    proc = score_cli(
        cohort["pos"].paths[0],
        model,
        tmp_path / "p",
        "--mosaic",
        "0",
        "--patch-size",
        "160",
    )
    assert proc.returncode == 0, proc.stderr
    assert "scored unlike the calibration slides (--patch-size 192 -> 160" in proc.stdout
    s2 = json.loads((tmp_path / "p" / "pos" / "summary.json").read_text())
    assert any("--patch-size" in d for d in s2["burden"]["scored_unlike_calibration"])
    # --rescale only brings a slide to the model's scale, which the calibration assumes of its
    # own: no "calibrate again" (round 69, 4: told so, its scores unchanged at the model's scale)
    proc = score_cli(cohort["negs"][0], model, tmp_path / "r", "--mosaic", "0", "--rescale")
    assert proc.returncode == 0, proc.stderr
    assert "scored unlike the calibration slides" not in proc.stdout + proc.stderr, proc.stdout


def test_calibrate_takes_a_scored_folder_only_through_its_seal(cohort, tmp_path):
    """A hostile check: every score of a scored slide's table set to 0.5 (its seal broken), and
    cyto calibrate wrote a calibration from it with no word, where data cells, view and review
    refuse the folder. A table copied out on its own has no seal: taken as it is."""
    root, model = cohort["root"], tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    forged = tmp_path / "neg0"
    shutil.copytree(root / "negs" / "neg0", forged)
    table = pq.read_table(forged / "scores.parquet")
    i = table.column_names.index("score")
    table = table.set_column(i, "score", pa.array(np.full(table.num_rows, 0.5)))
    pq.write_table(table, forged / "scores.parquet")
    proc = run_cyto("calibrate", str(model), str(forged), str(root / "negs" / "neg1"))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err, proc.stderr
    assert "changed since they were written (scores.parquet)" in err and "score it again" in err
    assert (
        not (model / "calibration.npz").exists()
        or (model / "calibration.npz").read_bytes()
        == (cohort["model"] / "calibration.npz").read_bytes()
    )  # as it was: nothing calibrated from the forged table
    loose = tmp_path / "loose.parquet"
    shutil.copy(root / "negs" / "neg2" / "scores.parquet", loose)
    proc = run_cyto("calibrate", str(model), str(loose), str(root / "negs" / "neg1"), "--overwrite")
    assert proc.returncode == 0, proc.stderr


def test_calibrate_refuses_what_cannot_calibrate(cohort, tmp_path):
    root, model = cohort["root"], cohort["model"]
    t0 = root / "negs" / "neg0" / "scores.parquet"
    same = run_cyto("calibrate", str(model), str(t0), str(t0))
    assert same.returncode == 2 and "score the same slide" in same.stderr
    # a slide's cyto score folder stands for its table (it was "does not exist")
    same = run_cyto("calibrate", str(model), str(t0.parent), str(t0))
    assert same.returncode == 2 and "score the same slide" in same.stderr, same.stderr
    # a cohort's folder may hold slides that are not negative: refused, naming them
    whole = run_cyto("calibrate", str(model), str(root / "negs"))
    assert whole.returncode == 2 and len(whole.stderr.strip().splitlines()) == 1, whole.stderr
    assert "holds the scores of 3 slide(s) (neg0, neg1, neg2)" in whole.stderr
    assert "never the whole folder" in whole.stderr
    # a slide given for its scores (the natural mistake) is said to be one, to be scored first
    # (it was "the file is corrupted"; issue 68, hostile round 3)
    slide = run_cyto("calibrate", str(model), str(cohort["negs"][1]))
    assert slide.returncode == 2 and len(slide.stderr.strip().splitlines()) == 1, slide.stderr
    assert "neg1.ndpi is a slide, not a score table: score it first (cyto score" in slide.stderr
    assert "corrupted" not in slide.stderr and "/neg1 or its scores.parquet" in slide.stderr
    empty = run_cyto("calibrate", str(model), str(tmp_path))
    assert empty.returncode == 2 and "a folder without scores.parquet" in empty.stderr
    table = pq.read_table(t0)
    meta = dict(table.schema.metadata)
    meta[b"cyto.scoring_id"] = b"another-model"
    other = tmp_path / "other.parquet"
    pq.write_table(table.replace_schema_metadata(meta), other)
    proc = run_cyto("calibrate", str(model), str(other))
    assert proc.returncode == 2 and "another model" in proc.stderr
    meta = dict(table.schema.metadata)
    meta[b"cyto.precision"] = b"int8"
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(table.replace_schema_metadata(meta), mixed)
    t1 = root / "negs" / "neg1" / "scores.parquet"
    proc = run_cyto("calibrate", str(model), str(mixed), str(t1))
    # named as the table and what moved, as the user set it (hostile round 37, 3: two JSON dumps
    # under "result_key"); the precision that ran here depends on the CPU (bf16 or fp32)
    line = proc.stderr.strip().splitlines()[-1]  # after the slides' adequacy warnings
    assert proc.returncode == 2 and line.startswith(
        f"error: {t1} was scored otherwise than {mixed}"
    )
    assert "(the precision run (auto's choice, or --precision) int8 -> " in line, line
    other_slide = pq.read_table(t1)  # another slide's table, scored with another --tile
    meta = dict(other_slide.schema.metadata)
    key = json.loads(meta[b"cyto.result_key"])
    meta[b"cyto.result_key"] = json.dumps({**key, "tile": key["tile"] * 2}).encode()
    tiled = tmp_path / "tiled.parquet"
    pq.write_table(other_slide.replace_schema_metadata(meta), tiled)
    proc = run_cyto("calibrate", str(model), str(t0), str(tiled))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"error: {tiled} was scored otherwise than {t0} (--tile {key['tile']} -> "
        f"{key['tile'] * 2}): score every slide-negative slide the same way"
    ), proc.stderr
    bad = run_cyto("calibrate", str(model), str(t1), "--normalize", "zscore")
    assert bad.returncode == 2 and "--normalize must be one of" in bad.stderr
    small = tmp_path / "small.parquet"
    pq.write_table(with_rows_seal(table.slice(0, 2)), small)  # cyto's table, too few cells
    proc = run_cyto("calibrate", str(model), str(small))
    assert proc.returncode == 2 and "at least 100 scored cells" in proc.stderr
    fdr = score_cli(cohort["negs"][0], model, tmp_path / "x", "--fdr", "1.5")
    assert fdr.returncode == 2 and "--fdr must be between 0 and 1" in fdr.stderr
    conf = score_cli(cohort["negs"][0], model, tmp_path / "x", "--fdr-confidence", "90")
    assert conf.returncode == 2 and "--fdr-confidence must be between 0 and 1" in conf.stderr


def test_the_python_calibrate_is_cyto_calibrate(cohort, tmp_path, capsys):
    """A notebook had no way to calibrate but a shell (train, export, score_slide: calls;
    calibrate: the command only): cyto.calibrate stores the calibration cyto calibrate stores,
    says its lines, and refuses as it does, in a Python caller's words."""
    import cyto
    from cyto.errors import ConfigError, InputPathError

    root = cohort["root"]
    tables = [root / "negs" / f"neg{i}" for i in range(3)]
    by = {how: tmp_path / f"{how}.cyto" for how in ("cli", "api")}
    for path in by.values():
        shutil.copytree(cohort["model"], path)
    proc = run_cyto("calibrate", str(by["cli"]), *map(str, tables), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    said: list[str] = []
    cal = cyto.calibrate(by["api"], [str(t) for t in tables], overwrite=True, echo=said.append)
    records = {
        h: json.loads((p / "manifest.json").read_text())["calibration"] for h, p in by.items()
    }
    assert records["api"] == records["cli"] == {k: v for k, v in cal.items() if k != "lines"}
    for name in ("scores", "slide", "evaluable"):
        a, b = (np.load(p / "calibration.npz")[name] for p in by.values())
        assert np.array_equal(a, b), name
    assert said == cal["lines"] and [x.replace(str(by["api"]), "M") for x in said] == [
        x.replace(str(by["cli"]), "M") for x in proc.stdout.strip().splitlines()
    ]
    assert said[0].startswith(f"calibrated {by['api']} on ") and said[-1].startswith("assumes: ")
    # one table, a string; echo=None says nothing; the calibration is replaced only when asked
    cyto.calibrate(str(by["api"]), str(tables[0]), overwrite=True, echo=None)
    assert capsys.readouterr().out == ""
    with pytest.raises(InputPathError, match=r"exists \(pass overwrite=True to replace it"):
        cyto.calibrate(by["api"], tables, echo=None)
    # refused as the command refuses, named as a Python caller writes it
    same = run_cyto("calibrate", str(by["cli"]), str(tables[0]), str(tables[0]), "--overwrite")
    with pytest.raises(ConfigError) as err:
        cyto.calibrate(by["api"], [tables[0], tables[0]], overwrite=True, echo=None)
    # (after the slides' adequacy warnings)
    assert same.returncode == 2 and same.stderr.strip().splitlines()[-1] == f"error: {err.value}"
    with pytest.raises(ConfigError, match="^normalize= must be one of median, median-iqr, none"):
        cyto.calibrate(by["api"], tables, normalize="zscore", overwrite=True)
    with pytest.raises(InputPathError, match="never the whole folder"):
        cyto.calibrate(by["api"], root / "negs", overwrite=True)


def test_a_slide_unlike_the_calibration_slides_gets_no_burden(cohort, tmp_path):
    """Calibration slides whose scores all sit 10 IQRs higher (as another stain would put
    them): a slide of this lab is called a mismatch, with no burden and no flags, and the console
    says why."""
    root = cohort["root"]
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    shifted = []
    for i in range(3):
        table = pq.read_table(root / "negs" / f"neg{i}" / "scores.parquet")
        s = np.asarray(table["score"])
        iqr = np.subtract(*np.percentile(s, [75, 25]))
        moved = table.set_column(table.column_names.index("score"), "score", pa.array(s + 10 * iqr))
        shifted.append(tmp_path / f"shifted{i}.parquet")
        # as cyto writes a table (its rows sealed): scores of another preparation
        pq.write_table(with_rows_seal(moved, table.schema.metadata), shifted[-1])
    # the copy holds the module's calibration: this one replaces it
    assert run_cyto("calibrate", str(model), *map(str, shifted), "--overwrite").returncode == 0
    slide = cohort["negs"][0]
    out = tmp_path / "o"
    proc = score_cli(slide, model, out, "--mosaic", "0")
    assert proc.returncode == 0, proc.stderr
    assert "do not look like the calibration slides' (median_shift_iqr -" in proc.stdout
    b = json.loads((out / slide.stem / "summary.json").read_text())["burden"]
    assert b["status"] == "calibration mismatch" and "abnormal_cells" not in b
    table = pq.read_table(out / slide.stem / "scores.parquet")
    assert table["flagged_bh"].null_count == table.num_rows
    assert _csv(out / "cohort.csv")[0]["calibration"] == "calibration mismatch"


def test_a_slide_with_no_cells_gets_no_burden_and_no_traceback(cohort, tmp_path):
    """An empty slide scored with a calibrated bundle (issue 34: a TypeError after every output
    was written): the outputs, a one-line 'no cells' burden and exit 0."""
    root = cohort["root"]
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    tables = [root / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    assert run_cyto("calibrate", str(model), *map(str, tables), "--overwrite").returncode == 0
    blank = write_slide(
        tmp_path / "blank.tif",
        SlideSynthConfig(width=512, height=512, n_cells=0, rbc_per_cell=0, debris_per_cell=0),
    ).paths[0]
    out = tmp_path / "o"
    proc = score_cli(blank, model, out, "--mosaic", "0")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "burden: no cells" in proc.stdout
    b = json.loads((out / "blank" / "summary.json").read_text())["burden"]
    assert b["status"] == "no cells"
    assert pq.read_table(out / "blank" / "scores.parquet").num_rows == 0


def test_two_calibrations_of_one_bundle_at_once_leave_one_whole(cohort, tmp_path, monkeypatch):
    """Two ``cyto calibrate`` runs on one bundle at once: each stages its scores in a file of
    its own (they shared one name, so one run's file was taken or deleted under the other), and
    the bundle ends verified with the last one's calibration."""
    import cyto.stats.calibrate as cal
    from cyto.bundle import verify_bundle

    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    tables = [cohort["root"] / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    real, started = cal.add_files, []

    def meanwhile(*args, **kwargs):
        if not started:  # the other run, on two of the slides, ends first
            started.append(True)
            cal.calibrate_from_tables(model, tables[:2], overwrite=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(cal, "add_files", meanwhile)
    cal.calibrate_from_tables(model, tables, overwrite=True)
    manifest = verify_bundle(model)
    assert len(manifest["calibration"]["slides"]) == 3
    assert [p.name for p in tmp_path.rglob("*.partial")] == []


def test_of_two_calibrations_at_once_without_overwrite_the_second_is_refused(
    cohort, exported_dsvdd, tmp_path, monkeypatch
):
    """A hostile check (round 3): two `cyto calibrate` runs (no --overwrite) on one bundle at
    once both said "calibrated" and one calibration was lost; run one after the other, the
    second is refused. The check that a calibration exists is made again under the bundle's
    lock, where it is written."""
    import cyto.stats.calibrate as cal
    from cyto.bundle import verify_bundle
    from cyto.errors import CytoError

    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)  # never calibrated (other tests calibrate cohort's)
    assert not (model / "calibration.npz").exists()
    tables = [cohort["root"] / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    real, started = cal.add_files, []

    def meanwhile(*args, **kwargs):
        if not started:  # the other run, past its own first check too, writes first
            started.append(True)
            cal.calibrate_from_tables(model, tables[:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(cal, "add_files", meanwhile)
    with pytest.raises(CytoError, match=r"calibration.npz\) exists \(pass --overwrite"):
        cal.calibrate_from_tables(model, tables)
    assert len(verify_bundle(model)["calibration"]["slides"]) == 2  # the first one's, whole


def test_a_damaged_calibration_is_replaced_by_the_calibrate_its_checksum_error_names(
    cohort, tmp_path
):
    """Failed before: the line advised 're-export or retrain', and cyto calibrate --overwrite
    refused with the same line (issue 68, hostile round 3): the command advised now repairs it,
    a removed calibration alike."""
    root = cohort["root"]
    model = tmp_path / "c.cyto"
    shutil.copytree(cohort["model"], model)
    tables = [str(root / "negs" / f"neg{i}") for i in range(3)]
    # the module's model may be calibrated already (by a test before): replaced, whole
    assert run_cyto("calibrate", str(model), *tables, "--overwrite").returncode == 0
    cal = model / "calibration.npz"
    z = dict(np.load(cal))
    z["scores"] = z["scores"] * 0.5
    np.savez(cal, **z)
    info = run_cyto("info", str(model))
    assert info.returncode != 0 and "calibration.npz does not match its checksum" in info.stderr
    assert f"calibrate it again: cyto calibrate {model} NEGATIVE_SCORES... --overwrite" in (
        info.stderr
    )
    proc = run_cyto("calibrate", str(model), *tables, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert run_cyto("info", str(model)).returncode == 0
    cal.unlink()
    info = run_cyto("info", str(model))
    assert "calibration.npz is missing" in info.stderr and "--overwrite" in info.stderr
    assert run_cyto("calibrate", str(model), *tables, "--overwrite").returncode == 0
    assert run_cyto("info", str(model)).returncode == 0


def test_a_calibration_slide_scored_again_is_said_to_be_no_test_of_itself(cohort, tmp_path):
    """Hostile round 7 (H9): one of a bundle's own calibration slides, scored with it, was
    triaged "no excess" (its cells are in the null it is held against) and nothing said so.
    It is said in one warning line and recorded in its burden; another slide is not."""
    root = cohort["root"]
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    tables = [root / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    assert run_cyto("calibrate", str(model), *map(str, tables), "--overwrite").returncode == 0
    out = tmp_path / "o"
    proc = score_cli(cohort["negs"][1], model, out, "--mosaic", "0")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stdout.splitlines() if "own negative slides" in ln]
    assert len(said) == 1 and said[0].startswith("warning: neg1.ndpi is one of this"), said
    b = json.loads((out / "neg1" / "summary.json").read_text())["burden"]
    assert b.get("calibration_slide") is True
    proc = score_cli(cohort["pos"].paths[0], model, out, "--mosaic", "0")
    assert proc.returncode == 0 and "own negative slides" not in proc.stdout
    b = json.loads((out / "pos" / "summary.json").read_text())["burden"]
    assert "calibration_slide" not in b


def test_calibrate_says_when_a_slide_its_adequacy_rule_judged_unsatisfactory(cohort, tmp_path):
    """Hostile round 7 (H28): a slide judged unsatisfactory (0 evaluable cells, off scale) was
    taken as a negative slide with no word; the count of evaluable cells was said as counted
    though the burden counts every cell below 100. One warning line naming it and why."""
    root = cohort["root"]
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    tables = [root / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    proc = run_cyto("calibrate", str(model), *map(str, tables), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "its adequacy is unsatisfactory" in ln]
    # the test slides are judged unsatisfactory for this tiny model (off its scale)
    summaries = [json.loads((t.parent / "summary.json").read_text()) for t in tables]
    judged = [s for s in summaries if (s.get("adequacy") or {}).get("result") == "unsatisfactory"]
    assert judged and len(said) == len(judged), proc.stderr
    assert said[0].startswith("warning: ") and "neg" in said[0]
    cal = json.loads((model / "manifest.json").read_text())["calibration"]
    if cal["evaluable_cells"] is not None and cal["evaluable_cells"] < 100:
        assert "the burden counts every cell: only" in proc.stdout, proc.stdout


def test_calibrate_says_when_a_slide_was_triaged_excess(cohort, tmp_path):
    """Hostile round 9 (N27): a slide cyto's own calibrated scoring triaged 'excess'
    (p=4e-06) was taken as slide-negative with no word (`cyto data cells` refuses it). It is
    still taken (a new calibration may correct the one that triaged it), and said in one line."""
    from cyto.seal import seal_outputs

    root = cohort["root"]
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    folder = tmp_path / "neg0"
    shutil.copytree(root / "negs" / "neg0", folder)
    summary = json.loads((folder / "summary.json").read_text())
    summary["burden"] = {"status": "ok", "triage": "excess", "slide_p_value": 4e-06}
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, summary["outputs"])  # as the run that triaged it sealed it
    tables = [folder / "scores.parquet"] + [
        root / "negs" / f"neg{i}" / "scores.parquet" for i in (1, 2)
    ]
    proc = run_cyto("calibrate", str(model), *map(str, tables), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "triaged it 'excess'" in ln]
    assert len(said) == 1 and "slide p=4e-06" in said[0] and said[0].startswith("warning: ")


def test_a_calibration_holds_the_score_the_cells_are_ranked_by(cohort, tmp_path):
    """A Pap bundle ranked by its morphometry was calibrated on the model's score, which its
    held-back cells put at chance: a slide of 5 % lesions was triaged "no excess" while its
    ranking found 12 of 14 (hostile round 58, 1). The calibration holds what ranks the cells
    (the morphometric score here), says so, and a slide ranked otherwise is told what its
    burden follows."""
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)  # calibrated already where another test ran first
    negs = tmp_path / "negs"
    proc = run_cyto("score", *map(str, cohort["negs"]), "--model", str(model), "--out",
                    str(negs), "--mosaic", "0", "--rank-by", "morphometry")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tables = [negs / f"neg{i}" / "scores.parquet" for i in range(3)]
    # one table ranked otherwise: a calibration holds one score
    other = tmp_path / "other"
    proc = run_cyto("score", str(cohort["negs"][0]), "--model", str(model), "--out", str(other),
                    "--mosaic", "0", "--rank-by", "model")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = run_cyto("calibrate", str(model), str(tables[1]), str(other / "neg0"))
    assert proc.returncode == 2 and "is ranked by morphometry and" in proc.stderr, proc.stderr
    assert "score the slide-negative slides with one --rank-by" in proc.stderr
    proc = run_cyto("calibrate", str(model), *map(str, tables), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert (
        "holding the morphometric score (morphometry_score), which ranks the cells" in proc.stdout
    )
    cal = json.loads((model / "manifest.json").read_text())["calibration"]
    assert cal["column"] == "morphometry_score" and cal["rank_by"] == "morphometry"
    # a calibration of another score than auto ranks by is said by calibrate and info, not
    # only by a slide scored later (hostile round 59, 2)
    auto = json.loads((cohort["root"] / "negs" / "neg0" / "summary.json").read_text())["rank_by"]
    info = run_cyto("info", str(model))
    other = "its calibration holds 'morphometry_score' (slides scored with --rank-by morphometry)"
    assert (other in proc.stderr + proc.stdout) == (auto != "morphometry"), proc.stderr
    assert (other in info.stdout) == (auto != "morphometry"), info.stdout
    with np.load(model / "calibration.npz") as z:
        held = np.sort(z["scores"])
    morph = np.concatenate([pq.read_table(t)["morphometry_score"].to_numpy() for t in tables])
    np.testing.assert_allclose(held, np.sort(morph))
    out = tmp_path / "o"
    proc = score_cli(cohort["pos"].paths[0], model, out, "--mosaic", "0", "--rank-by",
                     "morphometry")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    b = json.loads((out / "pos" / "summary.json").read_text())["burden"]
    assert b["status"] == "ok" and b["column"] == "morphometry_score", b
    assert "ranked_otherwise" not in b and "calibration holds" not in proc.stdout
    table = pq.read_table(out / "pos" / "scores.parquet")
    p = table["p_value"].to_numpy()
    morph = table["morphometry_score"].to_numpy()
    assert np.all(np.diff(p[np.argsort(-morph, kind="stable")]) >= -1e-12)  # p follows morph
    proc = score_cli(cohort["pos"].paths[0], model, tmp_path / "m", "--mosaic", "0",
                     "--rank-by", "model")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ("the cells are ranked by model, but the calibration holds 'morphometry_score': "
            "p-values, FDR flags and burden follow 'morphometry_score'") in proc.stdout  # fmt: skip


def test_a_loaded_model_scores_with_the_calibration_it_loaded_wherever_it_is_used(
    cohort, tmp_path, monkeypatch
):
    """Hostile round 64 (1, 2): a scorer read its bundle's calibration from disk at each
    slide, by the path as given: recalibrated after `load_model`, its p-values were the new
    calibration's while its summary recorded the old one's slides and manifest; loaded by a
    relative path, a script that moved to another folder scored a whole slide and then failed
    ("input/output error on m.cyto/calibration.npz"), or took another bundle's calibration
    that stood at the same relative path there. What a loaded model scores with is read when
    it loads."""
    import cyto

    root = cohort["root"]
    tables = [root / "negs" / f"neg{i}" for i in range(3)]
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    model = home / "models" / "m.cyto"
    shutil.copytree(cohort["model"], model)
    proc = run_cyto("calibrate", str(model), *map(str, tables), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    expected = cyto.score_slide(cohort["pos"].paths[0], str(model), tmp_path / "expected")
    assert "p_value" in expected.column_names

    monkeypatch.chdir(home)
    scorer = cyto.load_model("models/m.cyto", echo=None)
    # recalibrated on two of the slides after the model was loaded
    proc = run_cyto("calibrate", str(model), *map(str, tables[:2]), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    # and another bundle at the same relative path of the folder the script moves to
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(model, elsewhere / "models" / "m.cyto")
    monkeypatch.chdir(elsewhere)
    got = cyto.score_slide(cohort["pos"].paths[0], scorer, tmp_path / "got")
    assert np.array_equal(got.column("p_value").to_numpy(), expected.column("p_value").to_numpy())
    summary = json.loads((tmp_path / "got" / "summary.json").read_text())
    want = json.loads((tmp_path / "expected" / "summary.json").read_text())
    assert summary["burden"] == want["burden"]
    assert summary["model_sha256"] == want["model_sha256"]


class _Killed(BaseException):
    """The process dying where it is raised (no handler of cyto's runs after it)."""


def test_a_calibrate_killed_before_its_manifest_leaves_the_calibration_it_replaced(
    cohort, tmp_path, monkeypatch
):
    """Hostile round 65 (1): `cyto calibrate --overwrite` killed after the new calibration.npz
    was renamed into place and before the manifest named it lost the calibration it replaced,
    and the bundle was refused ("does not match its checksum ... changed or corrupted") until it
    was calibrated again. The replaced file is kept until the manifest is written; the next
    load puts it back, said once, and the step runs again as if never begun."""
    import cyto.bundle as bundle
    from cyto.stats.calibrate import calibrate_from_tables

    root = cohort["root"]
    tables = [root / "negs" / f"neg{i}" / "scores.parquet" for i in range(3)]
    model = tmp_path / "m.cyto"
    shutil.copytree(cohort["model"], model)
    assert run_cyto("calibrate", str(model), *map(str, tables), "--overwrite").returncode == 0
    before = {n: (model / n).read_bytes() for n in ("manifest.json", "calibration.npz")}

    def killed(*_a, **_k):
        raise _Killed

    monkeypatch.setattr(bundle, "_write_manifest", killed)
    with pytest.raises(_Killed):
        calibrate_from_tables(model, tables[:2], overwrite=True)
    monkeypatch.undo()
    assert (model / "calibration.npz").read_bytes() != before["calibration.npz"]  # the new one
    info = run_cyto("info", str(model))
    assert info.returncode == 0, info.stderr
    assert "stopped as it replaced calibration.npz" in info.stderr, info.stderr
    assert {n: (model / n).read_bytes() for n in before} == before
    assert not list(model.glob(".*.prev"))
    again = run_cyto("calibrate", str(model), *map(str, tables[:2]), "--overwrite")
    assert again.returncode == 0 and "stopped as it replaced" not in again.stderr, again.stderr
    manifest = json.loads((model / "manifest.json").read_text())
    assert len(manifest["calibration"]["slides"]) == 2 and not list(model.glob(".*.prev"))
