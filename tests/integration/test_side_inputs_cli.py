"""Side inputs through the CLI (issue 56): --truth of a two-slide table, a calibration slide
whose own truth plants abnormal cells, repeated --nuclei points, --planes of another slide, and
results that are replaced only with --overwrite. Every refusal is one line and exit 2."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.seal import with_rows_seal
from tests.cli_runner import run_cyto
from tests.integration.test_score import score_cli

FAST = ("--workers", "0", "--mosaic", "0")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two small slides with planted abnormal cells (their truth tables), and a z-stack."""
    root = tmp_path_factory.mktemp("side")
    cfg = {"width": 768, "height": 768, "n_cells": 40, "abnormal_fraction": 0.2}
    a = write_slide(root / "a.tif", SlideSynthConfig(**cfg, seed=1, planes=(0.0, 1.0)), workers=0)
    b = write_slide(root / "b.tif", SlideSynthConfig(**cfg, seed=2), workers=0)
    return root, a, b


def _one_line_error(proc, *words: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_a_truth_table_of_two_slides_gives_each_its_own_cells(exported_dsvdd, two, tmp_path):
    """Both slides' truth in one table: each slide counts its own planted cells (each got the
    other's as well); a table without a row of the slide says so in one warning line."""
    root, a, b = two
    both = pa.concat_tables([pq.read_table(a.ground_truth), pq.read_table(b.ground_truth)])
    truth = tmp_path / "both.parquet"
    pq.write_table(both, truth)
    out = tmp_path / "o"
    proc = score_cli(
        a.paths[0], exported_dsvdd, out, *FAST, "--planes", "none", "--truth", str(truth)
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "a" / "summary.json").read_text())
    assert summary["truth"]["planted_abnormal"] == a.n_abnormal

    only_b = tmp_path / "b_only.parquet"
    pq.write_table(pq.read_table(b.ground_truth), only_b)
    proc = score_cli(
        a.paths[0],
        exported_dsvdd,
        tmp_path / "o2",
        *FAST,
        "--planes",
        "none",
        "--truth",
        str(only_b),
    )
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "holds no cell of slide 'a'" in ln]
    assert len(said) == 1 and said[0].startswith("warning: --truth "), proc.stderr
    summary = json.loads((tmp_path / "o2" / "a" / "summary.json").read_text())
    assert summary["truth"]["planted_abnormal"] == 0
    assert summary["truth"]["truth_cells_of_slide"] == 0
    assert "--truth holds no cell of this slide" in proc.stdout, proc.stdout
    # unknown, not negative: no label column, so an expert's marks on the slide are not judged
    # against it (a hostile check: a review report said "0/2 truly abnormal, precision 0.00")
    assert "label" not in pq.read_schema(tmp_path / "o2" / "a" / "scores.parquet").names
    from cyto.review.report import write_report
    from cyto.review.session import build_session
    from cyto.review.store import MarkStore

    rv = build_session([tmp_path / "o2" / "a"], tmp_path / "rv", k=5, echo=lambda _: None)
    (case,) = rv.case_ids()
    store = MarkStore(rv.root, rv.key.get("session_id"))
    store.mark("ann", case, 0, True)
    store.mark("ann", case, 1, True)
    store.set_done("ann", case, True)
    store.close()
    rep = write_report(rv.root)
    assert not (rep["truth"] or {}).get("per_slide") and not (rep["truth"] or {}).get("overall")
    assert "true abnormal marked" not in (rv.root / "report" / "expert_table.md").read_text()


def test_calibrate_refuses_a_slide_whose_truth_plants_abnormal_cells(exported_dsvdd, two, tmp_path):
    import shutil

    root, a, _ = two
    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    out = tmp_path / "o"
    proc = score_cli(
        a.paths[0], model, out, *FAST, "--planes", "none", "--truth", str(a.ground_truth)
    )
    assert proc.returncode == 0, proc.stderr
    proc = run_cyto("calibrate", str(model), str(out / "a" / "scores.parquet"))
    _one_line_error(proc, str(a.paths[0]), f"{a.n_abnormal} abnormal cell(s)", "--truth")
    assert "calibration" not in json.loads((model / "manifest.json").read_text())

    # a slide-negative table calibrates once; a second calibration needs --overwrite (its
    # rows of another slide: a.tif's own truth, beside it, marks abnormal cells)
    neg = tmp_path / "neg.parquet"
    scored = pq.read_table(out / "a" / "scores.parquet").drop_columns(["label"])
    meta = {**scored.schema.metadata, b"cyto.slide": str(tmp_path / "neg.tif").encode()}
    pq.write_table(
        with_rows_seal(pa.concat_tables([scored] * 3), meta), neg
    )  # the 100 cells calibration needs
    assert run_cyto("calibrate", str(model), str(neg)).returncode == 0
    again = run_cyto("calibrate", str(model), str(neg))
    _one_line_error(again, "calibration.npz", "exists", "--overwrite")
    assert run_cyto("calibrate", str(model), str(neg), "--overwrite").returncode == 0


def test_a_nucleus_given_twice_is_scored_once(exported_dsvdd, two, tmp_path):
    root, a, _ = two
    gt = pq.read_table(a.ground_truth)
    xs, ys = gt["x"].to_pylist()[:6], gt["y"].to_pylist()[:6]
    rows = [(x, y) for x, y in zip(xs, ys, strict=True)]
    nuclei = tmp_path / "n.csv"
    nuclei.write_text(
        "x,y\n" + "".join(f"{x},{y}\n" for x, y in rows + rows[:3] + [(xs[0] + 0.2, ys[0])])
    )
    out = tmp_path / "o"
    proc = score_cli(
        a.paths[0], exported_dsvdd, out, *FAST, "--planes", "none", "--nuclei", str(nuclei)
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: --nuclei " in proc.stderr and "4 of 10 point(s) repeat" in proc.stderr
    table = pq.read_table(out / "a" / "scores.parquet")
    assert table.num_rows == 6
    assert (
        len(
            {
                (round(x), round(y))
                for x, y in zip(table["x"].to_pylist(), table["y"].to_pylist(), strict=True)
            }
        )
        == 6
    )


def test_another_slide_is_no_focal_plane(exported_dsvdd, two, tmp_path):
    root, a, b = two
    out = tmp_path / "o"
    proc = score_cli(a.paths[0], exported_dsvdd, out, *FAST, "--planes", str(b.paths[0]))
    assert proc.returncode == 2, proc.stderr
    assert f"--planes: {b.paths[0]} does not show slide" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "a" / "scores.parquet").exists()
    # its own defocused plane is taken
    proc = score_cli(a.paths[0], exported_dsvdd, tmp_path / "p", *FAST, "--planes", str(a.paths[1]))
    assert proc.returncode == 0, proc.stderr


def _every(src, dst, k: int):
    """Every ``k``-th file of each class folder of ``src``, copied to ``dst``."""
    import shutil

    for cls in sorted(src.iterdir()):
        (dst / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir())[::k]:
            shutil.copy(f, dst / cls.name / f.name)
    return dst


def test_results_are_replaced_only_with_overwrite(exported_dsvdd, synth_patches, tmp_path):
    """cyto predict replaced an existing --out table without --overwrite (train, synth and
    data cells refuse); so did data mosaic, a review report into another folder and demo."""
    # what is refused is the existing --out, not its size: a sixth of the patches (32 images,
    # every class) makes each predict's table
    data = _every(synth_patches, tmp_path / "patches", 6)
    table = tmp_path / "t.parquet"
    first = run_cyto(
        "predict", str(exported_dsvdd), "--data", str(data), "--out", str(table),
        "--skip-verify",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = table.read_bytes()  # the last run's table
    proc = run_cyto("predict", str(exported_dsvdd), "--data", str(data), "--out", str(table))
    _one_line_error(proc, f"--out {table} exists", "--overwrite")
    assert table.read_bytes() == before
    proc = run_cyto(
        "predict", str(exported_dsvdd), "--data", str(data), "--out", str(table),
        "--overwrite", "--skip-verify",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(table).num_rows > 0

    png = tmp_path / "m.png"
    png.write_bytes(b"x")
    proc = run_cyto("data", "mosaic", str(synth_patches), "--out", str(png))
    _one_line_error(proc, f"--out {png} exists", "--overwrite")

    report = tmp_path / "report"
    report.mkdir()
    (report / "expert_table.md").write_text("another report")
    proc = run_cyto("review", "report", str(tmp_path / "rv"), "--out", str(report))
    _one_line_error(proc, f"--out {report} exists", "--overwrite")

    # a report is no demo output: not even --overwrite makes the demo replace it
    proc = run_cyto("demo", "--out", str(report), "--overwrite")
    _one_line_error(proc, f"--out {report} holds expert_table.md that cyto did not write")
    assert [p.name for p in report.iterdir()] == ["expert_table.md"]


def test_a_scored_slide_is_scored_again_only_with_resume_or_overwrite(
    exported_dsvdd, two, tmp_path
):
    """A second `cyto score` into the folder of a finished slide replaced its results; now it
    takes --resume (kept where they still hold: not an overwrite) or --overwrite."""
    root, a, _ = two
    out = tmp_path / "o"
    args = (*FAST, "--planes", "none")
    assert score_cli(a.paths[0], exported_dsvdd, out, *args).returncode == 0
    before = (out / "a" / "scores.parquet").read_bytes()
    again = score_cli(a.paths[0], exported_dsvdd, out, *args)
    _one_line_error(again, f"--out {out / 'a'}", "--overwrite", "--resume")
    assert (out / "a" / "scores.parquet").read_bytes() == before
    resumed = score_cli(a.paths[0], exported_dsvdd, out, *args, "--resume")
    assert resumed.returncode == 0 and "already scored" in resumed.stdout, resumed.stdout
    redone = score_cli(a.paths[0], exported_dsvdd, out, *args, "--overwrite")
    assert redone.returncode == 0, redone.stderr
    assert "already scored" not in redone.stdout


@pytest.mark.parametrize("inside", ["", "scored", "scored/deeper"])
def test_scores_are_never_written_into_the_model_bundle(exported_dsvdd, two, tmp_path, inside):
    """Hostile round 5 (WS 5.9): `cyto score --out BUNDLE` and `score_slide(out=BUNDLE)` wrote a
    slide's folder and cohort.csv into the model bundle. Refused in one line, CLI and API alike,
    before anything is written."""
    import shutil

    import cyto
    from cyto.errors import CytoError

    slide = two[2].paths[0]
    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    before = sorted(p.name for p in model.rglob("*"))
    out = model / inside if inside else model
    proc = run_cyto("score", str(slide), "--model", str(model), "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"error: --out {out} ") and f"MODEL {model}" in line, line
    assert "an output never replaces an input" in line
    with pytest.raises(CytoError, match=r"out=.*model="):
        cyto.score_slide(slide, str(model), out / "s")
    with pytest.raises(CytoError, match=r"out=.*model="):
        cyto.score_slide(slide, cyto.load_model(model, device="cpu"), out / "s")
    assert sorted(p.name for p in model.rglob("*")) == before


def test_model_mpp_that_contradicts_the_bundle_is_refused_in_one_line(
    exported_dsvdd, two, tmp_path
):
    """Hostile round 5 (MIS 6.6): `--model-mpp 0.5` on a bundle that records 0.12 um/px was
    taken over the record without a word ("the model was trained at 0.5 um/px") and every cell
    was unevaluable. Refused in one line, CLI and API; the recorded value itself is accepted."""
    import json
    import shutil

    import cyto
    from cyto.bundle import add_files
    from cyto.errors import ConfigError

    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)  # trained at 0.12 um/px, as recorded
    add_files(model, {}, lambda m: {"config": {**m["config"], "mpp": 0.12}})
    slide = two[2].paths[0]
    proc = run_cyto("score", str(slide), "--model", str(model), "--out", str(tmp_path / "o"),
                    "--model-mpp", "0.5")  # fmt: skip
    line = _one_line_error(proc, "--model-mpp 0.5", "records its training resolution, 0.12")
    assert "leave it out" in line
    with pytest.raises(ConfigError, match=r"model_mpp=0\.5"):
        cyto.score_slide(slide, str(model), tmp_path / "p", model_mpp=0.5)
    same = run_cyto("score", str(slide), "--model", str(model), "--out", str(tmp_path / "q"),
                    "--model-mpp", "0.12", "--workers", "0")  # fmt: skip
    assert same.returncode == 0, same.stderr
    assert json.loads((tmp_path / "q" / "b" / "summary.json").read_text())


def test_a_slides_own_folder_given_as_out_is_refused(exported_dsvdd, two, tmp_path):
    """Hostile round 6 (N22): `cyto score b.tif --out o/b` where o/b is b's finished folder
    wrote o/b/b/ and a cohort.csv inside it. --out is the folder that holds the slides'."""
    slide = two[2].paths[0]
    common = ("--model", str(exported_dsvdd), "--workers", "0", "--mosaic", "0")
    assert run_cyto("score", str(slide), "--out", str(tmp_path / "o"), *common).returncode == 0
    inside = tmp_path / "o" / "b"
    before = sorted(p.name for p in inside.iterdir())
    proc = run_cyto("score", str(slide), "--out", str(inside), *common)
    line = _one_line_error(proc, f"--out {inside} is the output folder of one slide (b.tif)")
    assert f"give the folder that holds it ({tmp_path / 'o'})" in line
    assert sorted(p.name for p in inside.iterdir()) == before


def test_a_cohorts_folder_given_as_one_slides_out_is_refused(exported_dsvdd, two, tmp_path):
    """Hostile round 35 (1), the mirror of the test above: `score_slide(out=o)` where o is the
    folder cyto score wrote for its slides wrote this slide's results among their folders, and
    cyto score then refused the whole folder, --resume too."""
    import cyto
    from cyto.errors import InputPathError

    slide = two[2].paths[0]
    common = ("--model", str(exported_dsvdd), "--workers", "0", "--mosaic", "0")
    assert run_cyto("score", str(slide), "--out", str(tmp_path / "o"), *common).returncode == 0
    before = sorted(p.name for p in (tmp_path / "o").iterdir())
    for overwrite in (False, True):  # overwrite replaces a slide's results, never a cohort's
        with pytest.raises(InputPathError) as err:
            cyto.score_slide(slide, exported_dsvdd, tmp_path / "o", overwrite=overwrite)
        line = str(err.value)
        assert f"out='{tmp_path / 'o'}' is a folder cyto score wrote for the slides" in line, line
        assert f"such as out='{tmp_path / 'o' / 'b'}'" in line and "\n" not in line
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == before
    again = run_cyto("score", str(slide), "--out", str(tmp_path / "o"), "--resume", *common)
    assert again.returncode == 0, again.stderr


CYTO_SUMMARY = '{"slide": "s1.tif", "cells_scored": 3}'


@pytest.mark.parametrize(
    "layout, refused",
    [
        ({"cohort.csv": "slide,output,status\n"}, True),
        ({"cohort.csv": "slide,patient,diagnosis\n"}, False),  # a lab's own table (round 36, 2)
        ({"s1/summary.json": CYTO_SUMMARY}, True),
        ({"s1/summary.json": "{}"}, False),  # a summary.json of the user's own (round 36, 2)
        ({"s1/seal.json": "{}"}, False),  # no seal cyto writes
        ({"s1/.partial/state.json": "{}"}, True),  # a stopped run's
        ({"s1/notes.txt": "x", "s2/": ""}, False),  # folders of the user's own
        ({}, False),
    ],
)
def test_a_cohorts_layout_is_no_slides_folder_for_every_writer(tmp_path, layout, refused):
    """The rule every writer of one slide's folder goes through (score_slide, bench --work,
    each slide's folder of cyto score): what cyto score writes for its slides refuses it; files
    of the same names a user wrote do not."""
    from cyto.cohort.run import refuse_finished
    from cyto.errors import InputPathError

    folder = tmp_path / "o"
    folder.mkdir()
    for name, text in layout.items():
        path = folder / name
        if name.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for field in ("out", "work"):
        if refused:
            with pytest.raises(InputPathError, match="is a folder cyto score wrote for the slides"):
                refuse_finished(folder, "b.tif", True, field=field)
        else:
            refuse_finished(folder, "b.tif", True, field=field)


def test_score_slide_refusals_come_first_and_in_python_words(exported_dsvdd, two, tmp_path):
    """Hostile round 6: `score_slide(out=FILE)` said "--out ... is a file" (N3); `nuclei=FOLDER`
    said it "does not exist" (N4); a closed scorer read the slide and warned before it was
    refused, leaving a .partial folder (N6)."""
    import cyto
    from cyto.errors import ConfigError, InputPathError
    from cyto.runtime.scorer import CLOSED

    slide = two[2].paths[0]
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    with pytest.raises(InputPathError, match=r"^out='.*f\.txt' is a file; give a folder"):
        cyto.score_slide(slide, str(exported_dsvdd), a_file)
    with pytest.raises(InputPathError, match=r"^nuclei='.*' is a folder, not a table$"):
        cyto.score_slide(slide, str(exported_dsvdd), tmp_path / "o", nuclei=tmp_path)
    scorer = cyto.load_model(exported_dsvdd, device="cpu")
    scorer.close()
    said: list[str] = []
    with pytest.raises(ConfigError, match=f"^{CLOSED}$"):
        cyto.score_slide(slide, scorer, tmp_path / "c", echo=said.append)
    assert said == [] and not (tmp_path / "c").exists()
