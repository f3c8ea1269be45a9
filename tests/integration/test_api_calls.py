"""The Python calls of what was command-line only (hostile round 26, 14): cyto.synth_slide,
cyto.info and cyto.evaluate answer what `cyto synth slide`, `cyto info` and `cyto eval scores`
print, through the same library code, and refuse in the caller's words."""

from __future__ import annotations

import json
import os
import re
import warnings

import pytest

import cyto
from cyto.errors import ConfigError
from tests.cli_runner import run_cyto
from tests.integration.test_cell_slides import _crops

pytestmark = pytest.mark.pyvips


def test_a_slide_made_scored_and_judged_from_python_is_the_commands(exported_dsvdd, tmp_path):
    made = cyto.synth_slide(tmp_path / "s.tif", width=1024, height=1024, seed=2,
                            abnormal_fraction=0.1, echo=None)  # fmt: skip
    assert made["slide"] == str(tmp_path / "s.tif") and made["paths"] == [made["slide"]]
    assert made["truth"] == str(tmp_path / "s.cells.parquet") and made["size"] == [1024, 1024]
    assert made["n_abnormal"] > 0 and made["n_cells"] > made["n_abnormal"]
    # the command's slide of the same options and seed: the same bytes
    proc = run_cyto("synth", "slide", str(tmp_path / "c.tif"), "--width", "1024", "--height",
                    "1024", "--seed", "2", "--abnormal-fraction", "0.1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.tif").read_bytes() == (tmp_path / "s.tif").read_bytes()

    scored = tmp_path / "scored"
    with warnings.catch_warnings():  # its scale and verification: not what is judged here
        warnings.simplefilter("ignore")
        cyto.score_slide(made["slide"], exported_dsvdd, scored, truth=made["truth"], mosaic=0,
                         workers=0, echo=None)  # fmt: skip
    done = cyto.evaluate(scored, k=[10, 50], by_class=True, echo=None)
    proc = run_cyto("eval", "scores", str(scored), "--k", "10", "--k", "50", "--by-class",
                    "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert done == json.loads(proc.stdout)
    assert [r["k"] for r in done["overall"]] == [10, 50] and done["by_class"]
    alone = cyto.evaluate(scored, k=50, echo=None)
    assert alone == {"overall": done["overall"][1:], "by_class": None}

    about = cyto.info(exported_dsvdd)
    proc = run_cyto("info", str(exported_dsvdd), "--json")
    assert about["manifest"] == json.loads(proc.stdout)
    assert about["path"] == str(exported_dsvdd.resolve())
    proc = run_cyto("info", str(exported_dsvdd))
    line = f"--rank-by auto ranks by {about['rank_by_auto']}: {about['rank_by_reason']}"
    assert line in proc.stdout
    said = re.findall(r"^  warning: (.*)$", proc.stdout, flags=re.M)
    assert said == about["warnings"]


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"normal": "normal"}, "normal= and abnormal= name the classes of cells=DIR"),
        ({"cells": "{crops}"}, "cells=DIR needs normal=CLASS"),
        ({"cells": "{crops}", "normal": "normal"}, "cells=DIR needs mpp=UM_PER_PX"),
        ({"cells": "{crops}", "normal": "normal", "mpp": 0.25, "planes": [-1.0, 0.0, 1.0]},
         "planes: an option of a drawn slide; a slide composed from cells takes normal, "
         "abnormal, mpp, n_cells,"),
        ({"cells": "{crops}", "normal": "normal", "mpp": 0.25, "abnormal_fraction": 2.0},
         "abnormal_fraction= must be"),
        ({"cells": "600"}, "cells='600': cells= takes a folder of cell crops now; give the "
         "number of cells with n_cells=600"),
    ],
)  # fmt: skip
def test_a_bad_slide_from_python_is_one_line_in_its_words(tmp_path, given, words):
    crops = _crops(tmp_path / "crops", {"normal": 4, "big": 2})
    given = {k: str(crops) if v == "{crops}" else v for k, v in given.items()}
    with pytest.raises(ConfigError) as err:
        cyto.synth_slide(tmp_path / "s.tif", width=1024, height=1024, echo=None, **given)
    assert words in str(err.value)
    assert not re.search(r"(^|\s|\()--[a-z]", str(err.value)), err.value
    assert not (tmp_path / "s.tif").exists()


def test_a_model_given_by_a_relative_path_is_recorded_absolute(
    exported_dsvdd, synth_patches, tmp_path, monkeypatch
):
    """A table's cyto.model and the summary's model and output were the paths as given
    (relative: "api.cyto", "scored_api/check") beside the slide's absolute one, so a record read
    from another folder could not find its model (hostile round 26, 15)."""
    import pyarrow.parquet as pq

    made = cyto.synth_slide(tmp_path / "s.tif", width=1024, height=1024, seed=2, echo=None)
    monkeypatch.chdir(tmp_path)
    model = os.path.relpath(exported_dsvdd, tmp_path)  # ../m0/d.cyto
    proc = run_cyto("score", made["slide"], "--model", model, "--out", "scored", "--workers",
                    "0", "--mosaic", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    where = tmp_path / "scored" / "s"
    summary = json.loads((where / "summary.json").read_text())
    assert summary["model"] == str(exported_dsvdd.resolve())
    assert summary["output"] == str(where.resolve())
    meta = pq.read_schema(where / "scores.parquet").metadata
    assert meta[b"cyto.model"].decode() == str(exported_dsvdd.resolve())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyto.predict(model, synth_patches, "p.parquet", echo=None)
    meta = pq.read_schema(tmp_path / "p.parquet").metadata
    assert meta[b"cyto.model"].decode() == str(exported_dsvdd.resolve())


def test_an_unverified_graphs_reason_is_said_once_by_each_command(
    exported_dsvdd, synth_patches, tmp_path
):
    """A bundle without golden cells: its UNVERIFIED warning says why, once; the backend choice
    and the verification line said the same reason again (three times; hostile round 27, 3)."""
    made = cyto.synth_slide(tmp_path / "s.tif", width=1024, height=1024, seed=2, echo=None)
    runs = {
        "predict": run_cyto("predict", str(exported_dsvdd), "--data", str(synth_patches),
                            "--normal", "normal", "--out", str(tmp_path / "p.parquet")),
        "score": run_cyto("score", made["slide"], "--model", str(exported_dsvdd), "--out",
                          str(tmp_path / "scored"), "--workers", "0", "--mosaic", "0"),
    }  # fmt: skip
    for name, proc in runs.items():
        said = proc.stdout + proc.stderr
        assert proc.returncode == 0, said
        assert said.count("the bundle has no golden cells") == 1, (name, said)
        assert "UNVERIFIED: " in said, name
        assert "verification: unverified (why: see UNVERIFIED)" in said, name
