"""``cyto data cells``: what it refuses to cut and what it refuses to replace (hostile round 5:
a user's own ``001_*.png`` deleted by ``--overwrite``; a scored folder given as ``--out`` called
files "cyto did not write"; a slide its calibration could not judge cut as normal cells)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from tests.cli_runner import run_cyto


@pytest.fixture(scope="module")
def cohort(exported_dsvdd, tmp_path_factory) -> Path:
    """A cohort folder of two scored negative slides (n1/, n2/)."""
    from cyto.infer import ScoreOptions, score_slide

    root = tmp_path_factory.mktemp("cells")
    for i in (1, 2):
        slide = write_slide(
            root / f"n{i}.tif",
            SlideSynthConfig(width=768, height=768, n_cells=60, abnormal_fraction=0.0, seed=i),
            workers=0,
        )
        opts = ScoreOptions(mosaic=0, workers=0, top_k=10)
        score_slide(slide.paths[0], exported_dsvdd, root / "out" / f"n{i}", opts, echo=lambda _: 0)
    return root / "out"


def test_overwrite_replaces_only_the_cells_its_manifest_lists(cohort, tmp_path):
    """A user's own image under cyto's naming pattern (001_mycell.png) was deleted by
    --overwrite: what cyto wrote is what cells-LABEL.csv lists, nothing else."""
    ds = tmp_path / "ds"
    (ds / "normal").mkdir(parents=True)
    (ds / "normal" / "001_mycell.png").write_bytes(b"the user's own cell")
    proc = run_cyto("data", "cells", str(cohort / "n1"), "--out", str(ds), "--overwrite")
    assert proc.returncode == 2, proc.stderr
    assert "001_mycell.png" in proc.stderr and "cyto did not write" in proc.stderr
    assert (ds / "normal" / "001_mycell.png").read_bytes() == b"the user's own cell"
    # cyto's own cells (those its manifest lists) are replaced
    shutil.rmtree(ds)
    assert run_cyto("data", "cells", str(cohort / "n1"), "--out", str(ds)).returncode == 0
    again = run_cyto("data", "cells", str(cohort / "n2"), "--out", str(ds), "--overwrite")
    assert again.returncode == 0, again.stderr
    assert all(p.name.startswith("000_n2_") for p in (ds / "normal").iterdir())


def test_a_scored_folder_given_as_the_output_is_named_as_an_input(cohort, tmp_path):
    """`cyto data cells COHORT --out COHORT --label n2` said COHORT/n2 "holds files that cyto
    did not write" (cyto score wrote them): it is one of the scored folders read."""
    copy = tmp_path / "c"
    shutil.copytree(cohort, copy)
    proc = run_cyto("data", "cells", str(copy), "--out", str(copy), "--label", "n2")
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "is the input" in line and str(copy / "n2") in line, line
    assert "did not write" not in line


def test_a_slide_its_calibration_could_not_judge_is_not_cut_as_normal():
    """A 30 %-abnormal slide's calibrated scoring said "calibration mismatch" (its scores do
    not look like the negatives'), not "excess", and its cells were cut as normal."""
    from cyto.errors import ConfigError
    from cyto.stats.calibrate import CALIBRATION_MISMATCH, refuse_planted

    burden = {
        "status": CALIBRATION_MISMATCH,
        "reason": "this slide's scores do not look like the calibration slides' (median 3 IQR "
        "above): another stain?",
    }
    with pytest.raises(ConfigError, match="could not judge the slide .* harvest normal cells"):
        refuse_planted("hot.tif", 0, "harvest normal cells", burden)
    refuse_planted("n1.tif", 0, "harvest normal cells", {"status": "ok", "triage": "no excess"})


def test_a_busy_folder_is_said_once_in_plain_words(cohort, tmp_path):
    """Hostile round 5 (7.6): "wait for it to finish, or wait for it to finish, or give another
    --out" (data cells, train, review report, refine)."""
    from cyto.locks import OutputLock

    ds = tmp_path / "ds"
    with OutputLock(ds):
        proc = run_cyto("data", "cells", str(cohort / "n1"), "--out", str(ds))
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip()
    assert line.count("wait for it to finish") == 1 and line.endswith("give another --out"), line


def test_a_slide_whose_own_ground_truth_beside_it_marks_abnormal_cells_gives_no_normals(
    exported_dsvdd, tmp_path
):
    """Hostile round 14 (15): a slide cyto synth planted abnormal cells in, scored without
    --truth, gave all its cells to `cyto data cells` as normal, its truth table
    (NAME.cells.parquet) beside it; `cyto calibrate` took them as negatives the same way. The
    table beside the slide is known as --truth is; one without abnormal cells refuses nothing."""
    from cyto.infer import ScoreOptions, score_slide

    slide = write_slide(
        tmp_path / "s1.tif",
        SlideSynthConfig(width=768, height=768, n_cells=60, abnormal_fraction=0.1, seed=3),
        workers=0,
    ).paths[0]
    opts = ScoreOptions(mosaic=0, workers=0, top_k=10)
    score_slide(slide, exported_dsvdd, tmp_path / "out" / "s1", opts, echo=lambda _: 0)
    truth = tmp_path / "s1.cells.parquet"
    model = shutil.copytree(exported_dsvdd, tmp_path / "m.cyto")  # calibrate writes into it
    for args in (
        ("data", "cells", str(tmp_path / "out" / "s1"), "--out", str(tmp_path / "ds")),
        ("calibrate", str(model), str(tmp_path / "out" / "s1")),
    ):
        proc = run_cyto(*args)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip()
        assert f"ground truth beside it ({truth}) marks" in line, line
        assert "from negative slides only" in line, line
    assert not (tmp_path / "ds" / "normal").exists()
    assert not (model / "calibration.npz").exists()


def test_the_cells_pixel_size_is_said_with_how_to_train_on_it(cohort, tmp_path):
    """Hostile round 25 (19): cells cut from slides read at a known resolution were trained on
    with "no training resolution given ... --set mpp=UM_PER_PX", though `cyto data cells` had
    read it. It says the crops' pixel size (their slides', cut at level 0) and the setting."""
    import json

    from cyto.review.cells import mpp_words

    mpp = json.loads((cohort / "n1" / "summary.json").read_text())["resolution"]["slide_mpp"]
    proc = run_cyto("data", "cells", str(cohort), "--out", str(tmp_path / "ds"))
    assert proc.returncode == 0, proc.stderr
    said = (
        f"note: the crops are at {mpp:.4g} um/px, their slides' resolution: train on them "
        f"with --set mpp={mpp:.4g}"
    )
    assert said in proc.stdout, proc.stdout
    assert "--set mpp=UM_PER_PX" in mpp_words([None])
    assert "several resolutions (0.25, unknown um/px)" in mpp_words([0.25, None])
