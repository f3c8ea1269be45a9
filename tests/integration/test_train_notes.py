"""What ``cyto train`` could not fit on its training cells is said, at training and after
(hostile round 18): crops of one colour (no stain vectors, no morphometric score) said in one
line each with why and what falls back; a ``--rank-by auto`` chosen on too few held-back
abnormal cells said by train, info and predict; a refused ``--rank-by morphometry`` gives the
reason training recorded."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from PIL import Image

from tests.cli_runner import run_cyto


@pytest.fixture(scope="module")
def grey_bundle(tmp_path_factory):
    """A bundle trained on crops that are each one flat colour (60 normal, 3 abnormal), with
    the lines the Python API said while training."""
    import cyto

    root = tmp_path_factory.mktemp("grey")
    rng = np.random.default_rng(0)
    for cls, n, lo, hi in (("NILM", 60, 120, 200), ("LSIL", 3, 60, 120)):
        (root / "cells" / cls).mkdir(parents=True)
        # each its own colour: two of one colour are one image twice, said as a copy
        for i, level in enumerate(rng.choice(np.arange(lo, hi), n, replace=False)):
            grey = np.full((40, 40, 3), level, np.uint8)
            Image.fromarray(grey).save(root / "cells" / cls / f"{i}.png")
    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cyto.train(
            "dsvdd", root / "cells", root / "grey.cyto", normal="NILM", preset="fast",
            overrides={"epochs": 1, "ae_epochs": 1, "n_seeds": 1, "input_size": 32,
                       "stain": "pap", "mpp": 0.258},
            device="cpu", echo=said.append,
        )  # fmt: skip
    return root, res, said, caught


def test_one_colour_crops_are_said_at_training_with_why_and_what_falls_back(grey_bundle):
    from cyto.errors import CytoWarning

    root, res, said, caught = grey_bundle
    # Python warnings at the caller's line, not echo lines (hostile round 21: a library call's
    # warnings are CytoWarnings whatever echo is; with echo=None they were nowhere)
    assert not [line for line in said if line.startswith("warning: ")], said
    warned = [w for w in caught if issubclass(w.category, CytoWarning)]
    assert all(w.filename == __file__ for w in warned), [(w.filename, w.lineno) for w in warned]
    stain, morph, few = (str(w.message) for w in warned)  # one each, in the caller's words
    assert stain.startswith("the stain of the training cells could not be estimated "
                            "(the stained pixels are all of one colour"), stain  # fmt: skip
    assert "not checked for another stain or lab" in stain
    assert morph.startswith("no morphometric score was fitted on the training normals "
                            "(the normal cells' nucleus_share does not vary"), morph  # fmt: skip
    assert "rank_by='auto' ranks by the model alone" in morph and "--" not in morph
    assert few.startswith("rank_by='auto''s choice rests on 3 held-back abnormal cell(s)")
    assert "abnormal=" in few and "--abnormal" not in few
    assert res.notes == (stain, morph, few)

    info = run_cyto("info", str(root / "grey.cyto"))
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert any(
        ln.startswith("  warning: the stain of the training cells could not be") for ln in lines
    )
    assert any(
        ln.startswith("  warning: no morphometric score was fitted") and "--rank-by auto" in ln
        for ln in lines
    ), info.stdout
    assert any(
        ln.startswith("  warning: --rank-by auto's choice rests on 3 held-back abnormal cell(s), "
                      "fewer than 20") and "--abnormal" in ln and "--rank-by" in ln
        for ln in lines
    ), info.stdout  # fmt: skip


def test_a_refused_morphometric_ranking_gives_the_reason_training_recorded(grey_bundle):
    root, *_ = grey_bundle
    proc = run_cyto(
        "predict", str(root / "grey.cyto"), "--data", str(root / "cells"), "--normal", "NILM",
        "--out", str(root / "m.parquet"), "--rank-by", "morphometry",
    )  # fmt: skip
    assert proc.returncode != 0
    line = proc.stderr.strip().splitlines()[-1]
    assert "at training the normal cells' nucleus_share does not vary" in line, line
    assert "trained before cyto recorded it" not in line


def test_predict_says_auto_chose_on_too_few_abnormal_cells(grey_bundle):
    root, *_ = grey_bundle
    proc = run_cyto(
        "predict", str(root / "grey.cyto"), "--data", str(root / "cells"), "--normal", "NILM",
        "--out", str(root / "a.parquet"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("ranked by ")]
    assert line.startswith("ranked by model (cyto.data.morphometry; --rank-by); warning: "
                           "--rank-by auto's choice rests on 3 held-back"), line  # fmt: skip


def test_score_says_auto_chose_on_too_few_abnormal_cells_before_any_slide(grey_bundle):
    from cyto.infer.options import check_rank_by

    root, *_ = grey_bundle
    line = check_rank_by(root / "grey.cyto", "auto")  # cyto score prints it as a warning
    assert line.startswith("ranked by model: --rank-by auto's choice rests on 3 held-back"), line
    assert check_rank_by(root / "grey.cyto", "model") is None  # chosen by the user: no word


def test_python_callers_are_warned_and_the_summary_records_it(grey_bundle, tmp_path):
    """cyto.predict and cyto.score_slide warn as the command line says it (the Python API said
    nothing: the choice rested on 3 held-back cells unseen), and each slide's summary.json
    records it beside the ranking it qualifies (cohort runs too: one summary a slide)."""
    import json

    import cyto
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.errors import CytoWarning

    root, *_ = grey_bundle
    with pytest.warns(CytoWarning, match=r"rank_by='auto''s choice rests on 3 held-back") as got:
        res = cyto.predict(
            root / "grey.cyto", root / "cells", tmp_path / "p.parquet", normal="NILM", echo=None
        )
    # pointed at the caller's line, not into cyto (round 19: cyto/api.py:47)
    assert [w.filename for w in got if "rests on" in str(w.message)] == [__file__]
    assert res["rank_by_caution"].startswith("rank_by='auto''s choice rests on 3")
    slide = write_slide(
        tmp_path / "s.tif", SlideSynthConfig(width=512, height=512, seed=1, n_cells=20)
    ).paths[0]
    with pytest.warns(CytoWarning, match=r"ranked by model: rank_by='auto''s choice rests on 3"):
        cyto.score_slide(slide, root / "grey.cyto", tmp_path / "s", echo=None, workers=0, mosaic=0)
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["rank_by"] == "model"
    assert summary["rank_by_caution"].startswith("ranked by model: rank_by='auto''s choice")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")  # asked by name: no word (the slide's own are said)
        cyto.score_slide(
            slide, root / "grey.cyto", tmp_path / "m", echo=None, workers=0, mosaic=0,
            rank_by="model",
        )  # fmt: skip
    assert not [w for w in got if "rests on" in str(w.message)]
    assert json.loads((tmp_path / "m" / "summary.json").read_text())["rank_by_caution"] is None


def test_a_folder_cyto_score_scored_is_warned_in_python_words_when_reused(grey_bundle, tmp_path):
    """Hostile round 36 (3): score_slide(resume=True) on a folder cyto score had scored warned the
    line its summary records, in the command line's words (--rank-by auto)."""
    import cyto
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.errors import CytoWarning

    root, *_ = grey_bundle
    slide = write_slide(
        tmp_path / "s.tif", SlideSynthConfig(width=512, height=512, seed=1, n_cells=20)
    ).paths[0]
    proc = run_cyto("score", str(slide), "--model", str(root / "grey.cyto"),
                    "--out", str(tmp_path / "c"), "--workers", "0", "--mosaic", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "c" / "s" / "summary.json").read_text())
    assert "--rank-by auto's choice" in summary["rank_by_caution"]  # as cyto score said it
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        cyto.score_slide(slide, root / "grey.cyto", tmp_path / "c" / "s", resume=True,
                         echo=None, workers=0, mosaic=0)  # fmt: skip
    said = [str(w.message) for w in got if issubclass(w.category, CytoWarning)]
    assert [m for m in said if m.startswith("ranked by model: rank_by='auto''s choice")], said
    assert not [m for m in said if "--rank-by" in m or "--set" in m], said


def test_predict_says_crops_of_another_field_than_the_models_and_the_flag_to_cut_them(
    grey_bundle, tmp_path
):
    """Hostile round 19: crops fielded at 60 px (cyto data field's default: the longest crop)
    for a model of 40 px crops at the same pixel size were resized to the model's crop, their
    cells scored smaller and their areas misread, without a word."""
    from cyto.data.field import fit_field
    from cyto.errors import ScaleWarning

    root, *_ = grey_bundle
    wide = fit_field(root / "cells", tmp_path / "wide", px=60, echo=lambda s: None)["folder"]
    with pytest.warns(ScaleWarning) as got:
        cyto_predict(root, wide, tmp_path / "w.parquet")
    (line,) = [str(w.message) for w in got if "training crops" in str(w.message)]
    assert line.startswith("these crops are 60 px a side, the model's training crops 40 px")
    assert "scored 1.50x smaller" in line and "pass patch_mpp=0.258" in line, line
    assert line.endswith("(cyto data field --px 40)")
    with warnings.catch_warnings(record=True) as cut:  # cut to the model's field: no word
        warnings.simplefilter("always")
        cyto_predict(root, wide, tmp_path / "z.parquet", patch_mpp=0.258)
    assert not [w for w in cut if "training crops" in str(w.message)]
    out = str(tmp_path / "c.parquet")
    proc = run_cyto("predict", str(root / "grey.cyto"), "--data", str(wide), "--out", out)
    assert proc.returncode == 0 and "pass --patch-mpp 0.258 to cut each" in proc.stderr


def cyto_predict(root, data, out, **options):
    import cyto

    return cyto.predict(root / "grey.cyto", data, out, rank_by="model", echo=None, **options)


def test_a_folder_too_small_to_hold_back_says_so_and_why_everywhere(synth_patches, tmp_path):
    """Hostile round 33 (4, 5): 40 normal cells with abnormal classes beside them held nothing
    back without a word; `--rank-by auto` then ranked by the model (near chance on Pap), and
    predict said auto took it because "it ranked the bundle's held-back cells best". Train
    says why nothing was held back and what to give; info and predict give that reason."""
    import shutil

    import cyto
    from cyto.errors import CytoWarning
    from cyto.predict import _better_ranking

    cells = tmp_path / "cells"
    for cls, n in (("normal", 40), ("enlarged", 6)):
        (cells / cls).mkdir(parents=True)
        for f in sorted((synth_patches / cls).glob("*.jpg"))[:n]:
            shutil.copy(f, cells / cls / f.name)
    said: list[str] = []
    with pytest.warns(CytoWarning) as caught:
        cyto.train(
            "dsvdd", cells, tmp_path / "small.cyto", normal="normal", preset="fast",
            overrides={"epochs": 1, "ae_epochs": 1, "n_seeds": 1, "input_size": 32},
            device="cpu", echo=said.append,
        )  # fmt: skip
    why = (
        "40 normal cells, of which 20% holds back 8 and leaves 32 to train, where each takes at "
        "least 10: give 48 or more normal cells, or a holdout (in overrides=) from 0.25 to 0.75"
    )
    texts = [str(w.message) for w in caught]
    assert any(t.endswith(f"nothing was held back to compare them on: {why}") for t in texts), texts
    info = cyto.info(tmp_path / "small.cyto")
    assert info["rank_by_auto"] == "model"
    assert info["rank_by_reason"] == f"nothing was held back at training: {why}"
    proc = run_cyto("info", str(tmp_path / "small.cyto"))
    assert (
        "--rank-by auto ranks by model: nothing was held back at training: 40 normal cells, of "
        "which 20% holds back 8 and leaves 32 to train, where each takes at least 10: give 48 or "
        "more normal cells, or a --set holdout from 0.25 to 0.75"
    ) in proc.stdout, proc.stdout
    summary = {"auroc": 0.48, "auroc_model": 0.48, "auroc_morphometry": 0.83}
    with pytest.warns(CytoWarning) as caught:
        _better_ranking(summary, "model", True, info["manifest"]["validation"])
    (text,) = [str(w.message) for w in caught]
    # the reason is said beside the ranking (predict's caution): here only that it is so
    assert text.endswith("(auto took model: nothing was held back at training; cyto info)"), text
    assert "ranked the bundle's held-back cells best" not in text


def test_the_training_folder_given_relative_is_recorded_absolute(tmp_path, monkeypatch):
    """A bundle trained on "cells" recorded "cells": export run from another folder could not
    find its golden cells there, and a bundle read elsewhere named no place (hostile round
    56, 9)."""
    import cyto

    rng = np.random.default_rng(1)
    (tmp_path / "cells" / "NILM").mkdir(parents=True)
    for i in range(40):
        crop = rng.integers(60, 220, (40, 40, 3), dtype=np.uint8)
        Image.fromarray(crop).save(tmp_path / "cells" / "NILM" / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyto.train(
            "dsvdd", "cells", "m.cyto", normal="NILM", preset="fast",
            overrides={"epochs": 1, "ae_epochs": 1, "n_seeds": 1, "input_size": 32},
            device="cpu", echo=None,
        )  # fmt: skip
    manifest = json.loads((tmp_path / "m.cyto" / "manifest.json").read_text())
    assert manifest["training_data"]["source"] == str(tmp_path / "cells")


def test_a_pap_model_trained_on_normal_cells_alone_is_told_what_was_measured(cric, tmp_path):
    """Hostile round 63, 6: a Pap model trained on NILM alone ranks by its network, which ranked
    held-out CRIC crops at AUROC 0.42 against 0.84 by morphometry; `cyto train` said only that
    nothing was held back, and cyto.train nothing at all. Both say what was measured on Pap
    cells and what to pass, each in its own words. Round 73, 1: said only to echo, it was gone
    with echo=None, and cyto.predict then ranked by the network unwarned: it is a warning of
    the bundle (TrainResult.notes, cyto.info's warnings, predict's rank_by caution)."""
    import os
    import warnings

    import cyto
    from cyto.errors import CytoWarning
    from tests.cli_runner import run_cyto

    nilm = tmp_path / "cells" / "NILM"
    nilm.mkdir(parents=True)
    for f in sorted((cric / "NILM").glob("*.png"), key=lambda p: int(p.stem))[:40]:
        os.symlink(f, nilm / f.name)
    quick = {"epochs": 1, "ae_epochs": 1, "n_seeds": 1, "input_size": 32, "stain": "pap"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cyto.train(
            "dsvdd", tmp_path / "cells", tmp_path / "a.cyto", normal="NILM", preset="fast",
            overrides={**quick, "mpp": 0.258}, device="cpu", echo=None,
        )  # fmt: skip
    pap = "it was trained on normal cells alone, so nothing held back chose; on Pap cells the"
    (note,) = [n for n in res.notes if pap in n]
    assert note.startswith("rank_by='auto' ranks by the model: "), note
    assert "rank by rank_by='morphometry'" in note and "--" not in note, note
    assert [str(w.message) for w in caught if issubclass(w.category, CytoWarning) and pap in
            str(w.message)] == [note]  # fmt: skip
    assert note in cyto.info(res.bundle)["warnings"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = cyto.predict(res.bundle, tmp_path / "cells", tmp_path / "p.parquet", echo=None)
    assert done["rank_by_caution"] == note, done["rank_by_caution"]
    assert any(pap in str(w.message) for w in caught), [str(w.message) for w in caught]
    sets = [f"--set={k}={v}" for k, v in {**quick, "mpp": 0.258}.items()]
    proc = run_cyto(
        "train", "dsvdd", "--data", str(tmp_path / "cells"), "--out", str(tmp_path / "b.cyto"),
        "--normal", "NILM", "--preset", "fast", "--device", "cpu", *sets,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if "nothing held back" in x]
    assert line.startswith("warning: --rank-by auto ranks by the model: it was trained on"), line
    assert "rank by --rank-by morphometry" in line, line


def test_a_normal_class_of_one_image_is_refused_naming_it(cric, tmp_path):
    """Hostile round 63, 3: a normal class of one image trained until Deep SVDD's scores
    collapsed, and the error spoke of the backbone's bias terms. It is refused before any
    training, naming the class and its count, at the command line and from Python alike."""
    import os

    import cyto
    from cyto.errors import DatasetError
    from tests.cli_runner import run_cyto

    files = sorted(cric.glob("*/*.png"))
    for cls, n in (("ASC-H", 1), ("LSIL", 5)):
        (tmp_path / "cells" / cls).mkdir(parents=True)
        for f in [f for f in files if f.parent.name == cls][:n]:
            os.symlink(f, tmp_path / "cells" / cls / f.name)
    proc = run_cyto(
        "train", "dsvdd", "--data", str(tmp_path / "cells"), "--out", str(tmp_path / "m.cyto"),
        "--normal", "ASC-H", "--preset", "fast", "--device", "cpu", "--set", "epochs=1",
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert "the normal class(es) ASC-H hold 1 image(s): a one-class model" in line, line
    assert "bias" not in proc.stderr and not (tmp_path / "m.cyto").exists()
    with pytest.raises(DatasetError, match=r"ASC-H hold 1 image\(s\)"):
        cyto.train("droc", tmp_path / "cells", tmp_path / "d.cyto", normal="ASC-H", echo=None)
