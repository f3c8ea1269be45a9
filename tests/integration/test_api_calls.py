"""The Python calls of what was command-line only (hostile round 26, 14): cyto.synth_slide,
cyto.info and cyto.evaluate answer what `cyto synth slide`, `cyto info` and `cyto eval scores`
print, through the same library code, and refuse in the caller's words."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings

import pytest

import cyto
from cyto.errors import ConfigError, CytoError, CytoWarning, InputPathError
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
    # the truth report of the Python call is cyto score's, metrics and all (round 28, 2)
    proc = run_cyto("score", made["slide"], "--model", str(exported_dsvdd), "--out",
                    str(tmp_path / "cli"), "--truth", made["truth"], "--workers", "0",
                    "--mosaic", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    truth = json.loads((scored / "summary.json").read_text())["truth"]
    assert truth == json.loads((tmp_path / "cli" / "s" / "summary.json").read_text())["truth"]
    # the slide's topk.parquet under another name: judged, it was the slide's (round 29, 1)
    shutil.copy(scored / "topk.parquet", tmp_path / "mine.parquet")
    with pytest.raises(InputPathError, match="holds a slide's top cells only"):
        cyto.evaluate(tmp_path / "mine.parquet", echo=None)
    assert {"auroc", "recall_at_k", "planted_recall_at_k"} <= set(truth)
    done = cyto.evaluate(scored, k=[10, 50], by_class=True, echo=None)
    proc = run_cyto("eval", "scores", str(scored), "--k", "10", "--k", "50", "--by-class",
                    "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert {k: v for k, v in done.items() if k != "notes"} == json.loads(proc.stdout)
    assert [r["k"] for r in done["overall"]] == [10, 50] and done["by_class"]
    alone = cyto.evaluate(scored, k=50, echo=None)
    assert {k: v for k, v in alone.items() if k != "notes"} == {
        "overall": done["overall"][1:],
        "by_class": None,
    }
    # a slide of few planted cells: said so, and nothing else (round 63, 4)
    assert all(n.startswith("the table has ") for n in alone["notes"]), alone["notes"]

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


def test_a_callers_own_echo_gets_the_progress_lines(tmp_path, monkeypatch, capsys):
    """A notebook that logs a call's lines (``echo=log.info``) got none of its progress: those
    went to stderr past the caller's echo (hostile round 56, 6); ``print`` keeps stderr's."""
    monkeypatch.setenv("CYTO_PROGRESS", "1")
    lines: list[str] = []
    cyto.synth_slide(tmp_path / "s.tif", width=1024, height=1024, seed=2, echo=lines.append)
    assert any(line.startswith("synth slide s.tif: 2/2 rows (") for line in lines), lines
    assert "synth slide" not in capsys.readouterr().err
    cyto.synth_slide(tmp_path / "t.tif", width=1024, height=1024, seed=2, echo=print)
    assert "synth slide t.tif: 2/2 rows (" in capsys.readouterr().err


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
    # loaded here, used from another folder: the bundle as it was loaded (round 28, 1: the
    # path was resolved when the table was written, against the folder moved to); its load
    # warns UNVERIFIED as every run with it does (it was silent: hostile round 53, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scorer = cyto.load_model(model)
    said = [str(w.message) for w in caught if issubclass(w.category, CytoWarning)]
    assert len(said) == 1 and said[0].startswith("UNVERIFIED: "), said
    assert f"cyto.export({str(exported_dsvdd.resolve())!r}) to add them" in said[0], said
    assert caught[0].filename == __file__  # at the caller's line
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cyto.predict(scorer, synth_patches, "q.parquet", echo=None)
        cyto.score_slide(made["slide"], scorer, "again", workers=0, mosaic=4, echo=None)
    # its UNVERIFIED advice names the bundle where it is, not as typed elsewhere (round 29, 11)
    unverified = [str(w.message) for w in caught if "UNVERIFIED" in str(w.message)]
    assert unverified and all(
        f"cyto.export({str(exported_dsvdd.resolve())!r}) to add" in u for u in unverified
    )
    meta = pq.read_schema(tmp_path / "elsewhere" / "q.parquet").metadata
    assert meta[b"cyto.model"].decode() == str(exported_dsvdd.resolve())
    summary = json.loads((tmp_path / "elsewhere" / "again" / "summary.json").read_text())
    assert summary["model"] == str(exported_dsvdd.resolve())
    # the mosaic beside them, absolute too (round 28, 16)
    assert summary["mosaic"] == str(tmp_path / "elsewhere" / "again" / "topk_mosaic.png")
    # cyto.info takes the loaded scorer as predict and score_slide do (round 28, 14)
    assert cyto.info(scorer) == cyto.info(exported_dsvdd)


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
    # the slide's line advises what the warning does (it said "see cyto doctor"; round 28, 17)
    assert "UNVERIFIED scores (no golden cells: cyto export the model)" in runs["score"].stdout


def test_load_model_says_why_a_graph_is_unverified_where_its_warning_is_silenced(exported_dsvdd):
    """``load_model(echo=print)`` said "verification: unverified (why: see UNVERIFIED)" of a
    warning that a caller who silenced warnings never saw (hostile round 64, 10): its line says
    the reason itself; the CytoWarning is still raised for a caller without echo."""
    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cyto.load_model(exported_dsvdd, backend="onnx", echo=said.append).close()
    line = next(x for x in said if x.startswith("verification: "))
    assert "see UNVERIFIED" not in line, said
    assert "unverified: the bundle has no golden cells" in line, line
    assert "run cyto.export(" in line, line  # in Python's words
    assert any("UNVERIFIED: " in str(w.message) for w in caught), [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def table(exported_dsvdd, synth_patches, tmp_path_factory):
    """A predict table of the synthetic patches: class, label, score, rank."""
    out = tmp_path_factory.mktemp("eval") / "p.parquet"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyto.predict(exported_dsvdd, synth_patches, out, normal="normal", echo=None)
    return out


def test_evaluate_says_what_it_judged_and_refuses_what_it_would_ignore(table, tmp_path):
    """Round 28: K clamped to a class's pool said (4), the review extract refused (5), k=[]
    refused (6), the options named as the caller wrote them (7), a class option without
    by_class refused (8)."""
    said: list[str] = []
    done = cyto.evaluate(table, k=10_000, by_class=True, echo=said.append)
    # the notes come back too, with echo=None (round 29, 3)
    assert cyto.evaluate(table, k=10_000, by_class=True, echo=None)["notes"] == [
        line.removeprefix("note: ") for line in said if line.startswith("note: ")
    ]
    pool = done["by_class"][0]["n_normal"] + done["by_class"][0]["n_class"]
    assert done["by_class"][0]["by_k"][0]["k"] == pool
    assert any(line.startswith("note: k=10000 is more than the cells of a class") for line in said)
    proc = run_cyto("eval", "scores", str(table), "--by-class", "--k", "10000")
    assert "note: --k 10000 is more than the cells of a class" in proc.stdout, proc.stdout
    for given, words in (
        ({"k": []}, "k= names no K"),
        ({"normal": "normal"}, "normal= names the classes of the by-class rows: add by_class=True"),
        ({"class_column": "cls"}, "class_column= names the classes"),
        ({"by_class": True, "normal": "XYZ"}, "normal= XYZ: no such class"),
        ({"by_class": True, "class_column": "nope"}, "has no column 'nope' (class_column='nope')"),
        ({"score_column": "nope"}, "has no column 'nope' (score_column='nope')"),
        ({"label_column": "nope"}, "has no column 'nope' (label_column='nope')"),
    ):
        with pytest.raises(CytoError) as err:  # ConfigError, or MetricError of the table
            cyto.evaluate(table, echo=None, **given)
        assert words in str(err.value), (given, str(err.value))
        assert not re.search(r"(^|\s|\()--[a-z]", str(err.value)), err.value
    proc = run_cyto("eval", "scores", str(table), "--normal", "normal")
    assert proc.returncode == 2 and "--normal names the classes" in proc.stderr, proc.stderr
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    topk = tmp_path / "s" / "topk.csv"  # a CSV copy keeps its name, not its metadata
    topk.parent.mkdir()
    pacsv.write_csv(pq.read_table(table), topk)
    with pytest.raises(InputPathError, match="holds a slide's top cells only"):
        cyto.evaluate(topk, echo=None)
    # a cohort's folder and its cohort.csv: what to give instead (round 29, 13)
    (tmp_path / "cohort" / "s1").mkdir(parents=True)
    shutil.copy(table, tmp_path / "cohort" / "s1" / "scores.parquet")
    with pytest.raises(InputPathError, match=r"is a cohort's folder .*: give one slide's, e\.g\."):
        cyto.evaluate(tmp_path / "cohort", echo=None)
    (tmp_path / "cohort" / "cohort.csv").write_text("slide,output\n")
    with pytest.raises(InputPathError, match="is a cohort's table .*not a score table"):
        cyto.evaluate(tmp_path / "cohort" / "cohort.csv", echo=None)


def test_predict_says_the_classes_it_leaves_out(exported_dsvdd, synth_patches, tmp_path):
    """abnormal= naming some abnormal classes left the others' crops out of the table without
    a word; abnormal= without normal= was ignored (round 28, 8)."""
    classes = sorted(p.name for p in synth_patches.iterdir() if p.name != "normal")
    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = cyto.predict(exported_dsvdd, synth_patches, tmp_path / "p.parquet", normal="normal",
                           abnormal=[classes[0]], echo=said.append)  # fmt: skip
    left = [line for line in said if "left out" in line]
    assert len(left) == 1 and all(c in left[0] for c in classes[1:]), said
    assert res["left_out"] == {c: len(list((synth_patches / c).iterdir())) for c in classes[1:]}
    assert "neither normal= nor abnormal=" in left[0]
    n = {c: len(list((synth_patches / c).iterdir())) for c in ("normal", classes[0])}
    assert res["n"] == sum(n.values())
    # a table without labels is judged per class, and the refusal says how (round 29, 13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyto.predict(exported_dsvdd, synth_patches, tmp_path / "u.parquet", echo=None)
    with pytest.raises(CytoError, match=r"judge its classes with by_class=True and normal=CLASS"):
        cyto.evaluate(tmp_path / "u.parquet", echo=None)
    with pytest.raises(ConfigError, match="abnormal= names the abnormal classes against normal="):
        cyto.predict(exported_dsvdd, synth_patches, tmp_path / "q.parquet", abnormal=classes[0],
                     echo=None)  # fmt: skip
    assert not (tmp_path / "q.parquet").exists()


def test_a_composed_slides_notes_come_back_and_its_format_matches_its_name(tmp_path):
    """synth_slide(echo=None) said nowhere that each crop was used several times, which changes
    what the recall counts (round 28, 11); fmt="ndpi" wrote an NDPI under .tif (12)."""
    crops = _crops(tmp_path / "crops", {"normal": 6, "big": 2})
    made = cyto.synth_slide(tmp_path / "s.tif", cells=crops, normal=["normal"], mpp=0.25,
                            width=1024, height=1024, abnormal_fraction=0.05, echo=None)  # fmt: skip
    assert any("each crop is used up to" in n for n in made["notes"]), made["notes"]
    # greyscale crops make a grey slide: said, as predict says it of them (round 29, 4)
    from PIL import Image

    grey = tmp_path / "grey"
    for cls in ("normal", "big"):
        (grey / cls).mkdir(parents=True)
        for f in sorted((crops / cls).iterdir()):
            Image.open(f).convert("L").save(grey / cls / f.name)
    with pytest.warns(CytoWarning, match="the crops are greyscale"):
        made = cyto.synth_slide(tmp_path / "g.tif", cells=grey, normal="normal", mpp=0.25,
                                width=1024, height=1024, echo=None)  # fmt: skip
    assert any(n.startswith("the crops are greyscale") for n in made["notes"]), made["notes"]
    with pytest.raises(ConfigError, match=r"fmt='ndpi' and the name 't.tif' \(tiff\) disagree"):
        cyto.synth_slide(tmp_path / "t.tif", width=1024, height=1024, fmt="ndpi", echo=None)
    proc = run_cyto("synth", "slide", str(tmp_path / "t.tif"), "--format", "ndpi")
    assert proc.returncode == 2 and "--format ndpi and the name 't.tif'" in proc.stderr
    assert not (tmp_path / "t.tif").exists()


def test_an_empty_class_folder_left_out_of_every_other_class_is_said(exported_dsvdd, tmp_path):
    """abnormal= left to its default (every other class) left an empty class folder out without
    a word, where naming it is refused (round 29, 13): said by predict, synth_slide and train."""
    crops = _crops(tmp_path / "crops", {"normal": 6, "big": 2})
    (crops / "LSIL").mkdir()
    lines: list[str] = []
    cyto.synth_slide(tmp_path / "s.tif", cells=crops, normal="normal", mpp=0.25, width=1024,
                     height=1024, abnormal_fraction=0.1, echo=lines.append)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyto.predict(exported_dsvdd, crops, tmp_path / "p.parquet", normal="normal",
                     echo=lines.append)  # fmt: skip
    proc = run_cyto("train", "dsvdd", "--data", str(crops), "--normal", "normal", "--out",
                    str(tmp_path / "t.cyto"), "--preset", "fast", "--set", "epochs=1", "--set",
                    "ae_epochs=0", "--set", "n_seeds=1", "--set", "tta_views=orig", "--set",
                    "input_size=32", "--set", "load_size=64")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in [*lines, *proc.stdout.splitlines()] if "hold no image" in ln]
    assert len(said) == 3, said
    assert all("the class folder(s) LSIL in" in ln for ln in said)
    assert "abnormal=" in said[0] and "--abnormal" in said[2]
    # named, it is refused, as before
    with pytest.raises(CytoError, match="exist but hold no image"):
        cyto.synth_slide(tmp_path / "t.tif", cells=crops, normal="normal", abnormal="LSIL",
                         mpp=0.25, width=1024, height=1024, echo=None)  # fmt: skip


def test_info_of_a_scorer_is_the_model_it_loaded(exported_bundles, tmp_path):
    """`cyto.info(scorer)` read the bundle's folder again: after the folder was swapped for
    another bundle it described that one, while the scorer went on scoring with the model it
    had loaded (hostile round 29, 13); after the folder was deleted it failed. It describes the
    loaded model."""
    path = tmp_path / "m.cyto"
    shutil.copytree(exported_bundles["dsvdd"], path)
    scorer = cyto.load_model(path, verify=False)
    before = cyto.info(path)
    shutil.rmtree(path)
    other = next(name for name in exported_bundles if name != "dsvdd")
    shutil.copytree(exported_bundles[other], path)
    assert cyto.info(path)["manifest"]["method"] == other
    assert cyto.info(scorer) == before and before["manifest"]["method"] == "dsvdd"
    shutil.rmtree(path)
    assert cyto.info(scorer) == before
    cyto.info(scorer)["manifest"]["method"] = "changed"  # an answer of its own each call
    assert cyto.info(scorer) == before


def test_a_scorer_and_its_bundle_print_in_one_line(exported_dsvdd):
    """Hostile round 54, 10: a loaded model shown in a notebook printed the whole manifest, the
    verification record and the golden cells' pixels (about 20,000 characters)."""
    import cyto

    scorer = cyto.load_model(exported_dsvdd)
    shown = repr(scorer)
    assert "\n" not in shown and len(shown) < 300, shown[:400]
    assert str(exported_dsvdd.resolve()) in shown and scorer.describe() in shown, shown
    assert scorer.verification.status in shown, shown
    bundle = repr(scorer.bundle)
    assert "\n" not in bundle and len(bundle) < 300 and "dsvdd" in bundle, bundle[:400]
    scorer.close()
    assert repr(scorer).endswith(", closed>"), repr(scorer)


def test_python_callers_are_advised_python_calls(exported_dsvdd, tmp_path):
    """Hostile round 56, 3: a Python caller was advised the command line's steps ('cyto export
    ... --no-onnx --precision int8 --calib CELLS', "train one with 'cyto train'")."""
    import cyto
    from cyto.errors import BundleError, CytoError

    with pytest.raises(CytoError) as refused:
        cyto.load_model(exported_dsvdd, "onnx", "cpu", "int8")
    said = str(refused.value)
    assert (
        f"cyto.export({str(exported_dsvdd)!r}, onnx=False, precisions='int8', calib=CELLS)" in said
    ), said
    assert "cyto export" not in said and "--" not in said, said
    with pytest.raises(BundleError) as refused:
        cyto.load_model(tmp_path / "none.cyto")
    assert str(refused.value).endswith("train one with cyto.train"), refused.value
