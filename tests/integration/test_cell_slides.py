"""Slides composed from real cell crops (cyto synth slide --cells): where each crop goes and what
the truth says, the one-line refusals, and a Pap slide of CRIC cells scored end to end."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from cyto.data.synth.from_cells import CellSlideConfig, place_cells, write_cell_slide
from tests.cli_runner import run_cyto

pytestmark = pytest.mark.pyvips


def _crops(root: Path, classes: dict[str, int], size: int = 64, seed: int = 0) -> Path:
    """A folder of crops: per class, cells with a nucleus of a class-specific size, each crop
    with a distinct colour stripe so it can be found again on the slide."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
    for cls, n in classes.items():
        (root / cls).mkdir(parents=True)
        r = 6 if cls == "normal" else 12
        for i in range(n):
            img = np.full((size, size, 3), 230, np.uint8)
            img[np.hypot(yy, xx) <= 26] = (150, 170, 220)
            img[np.hypot(yy, xx) <= r] = (60, 30, 100)
            img[:6, :] = rng.integers(0, 255, 3)  # the crop's own mark
            Image.fromarray(img).save(root / cls / f"{cls}_{i:03d}.png")
    return root


def test_each_crop_is_drawn_where_the_truth_says(tmp_path):
    cells = _crops(tmp_path / "crops", {"normal": 30, "big": 10})
    config = CellSlideConfig(
        cells=cells, normal=("normal",), mpp=0.25, abnormal_fraction=0.1, width=1024,
        height=1024, seed=3,
    )  # fmt: skip
    res = write_cell_slide(tmp_path / "s.tif", config)
    truth = pq.read_table(res.ground_truth).to_pylist()
    assert res.n_cells == len(truth) > 100 and res.n_abnormal == round(0.1 * len(truth))
    assert {r["class"] for r in truth if r["label"]} == {"big"}
    assert {r["class"] for r in truth if not r["label"]} == {"normal"}
    assert truth[0]["slide_id"] == "s"
    import pyvips

    slide = pyvips.Image.new_from_file(str(res.paths[0]))
    assert slide.get("xres") == pytest.approx(10000 / 0.25 / 10, rel=1e-3)  # 0.25 um/px in px/mm
    # each crop's centre lies at its truth point: the crop's nucleus, dark, round it
    for row in truth[:40]:
        x, y = int(round(row["x"])), int(round(row["y"]))
        patch = np.ndarray(
            buffer=slide.crop(x - 3, y - 3, 7, 7).write_to_memory(), dtype=np.uint8,
            shape=(7, 7, 3),
        )  # fmt: skip
        assert patch.mean() < 110, row  # nucleus, not cytoplasm or glass
    # the same seed and crops, the same bytes
    again = write_cell_slide(tmp_path / "t.tif", config)
    assert again.paths[0].read_bytes() == res.paths[0].read_bytes()


def test_every_crop_is_used_once_before_any_twice(tmp_path):
    cells = _crops(tmp_path / "crops", {"normal": 20, "big": 3})
    config = CellSlideConfig(
        cells=cells, normal=("normal",), mpp=0.25, abnormal_fraction=0.0, width=1024,
        height=1024, n_cells=50,
    )  # fmt: skip
    said: list[str] = []
    _, truth, n_abn = place_cells(config, said.append)
    used = np.unique(truth["source"].to_pylist(), return_counts=True)[1]
    assert n_abn == 0 and used.min() >= 2 and used.max() <= 3  # 50 = 2.5 rounds of 20
    # said: 34 planted cells that were 7 crops, each ~5 times, went without a word (round 18)
    assert said == [
        "note: 50 normal cells from 20 crop(s) of normal: each crop is used up to 3 times, so "
        "the slide holds copies of one cell (the recall counts them each); give more crops of "
        "the normal class, a smaller slide or fewer --n-cells"
    ]
    config = dataclasses.replace(config, abnormal_fraction=0.2, n_cells=20)
    said.clear()
    place_cells(config, said.append)
    assert said == [
        "note: 4 planted abnormal cells from 3 crop(s) of big: each crop is used up to 2 times, "
        "so the slide holds copies of one cell (the recall counts them each); give more crops "
        "of those classes or a lower --abnormal-fraction"
    ]
    # a witness rate asked of too few cells plants none: said as it is placed, not left to
    # cyto score --truth ("holds no abnormal cell"; hostile round 25, 22)
    for n_cells, fraction in ((20, 0.01), (49, 0.01), (90, 0.001)):
        config = dataclasses.replace(config, abnormal_fraction=fraction, n_cells=n_cells)
        said.clear()
        _, _, n_abn = place_cells(config, said.append)
        assert n_abn == 0 and said[-1].startswith(
            f"warning: --abnormal-fraction {fraction:g} of {n_cells} cells plants none ("
        ), said
    config = dataclasses.replace(config, abnormal_fraction=0.05, n_cells=20)
    said.clear()
    assert place_cells(config, said.append)[2] == 1 and said == []
    # rounded up as far, said too: 0.008 of 64 planted 1, a slide at 1.6 % (round 68, 9)
    config = dataclasses.replace(config, abnormal_fraction=0.008, n_cells=64)
    said.clear()
    assert place_cells(config, said.append)[2] == 1
    assert said[-1] == (
        "note: --abnormal-fraction 0.008 of 64 cells plants 1 (0.51 rounded): the slide's "
        "witness rate is 1.56%, not 0.80%"
    ), said


def test_one_seed_places_the_same_normal_cells_with_or_without_lesions(tmp_path):
    """A composed negative and case of one seed differ only where cells are planted: the same
    places, the same normal crop and turn at every other place (the normal crops were drawn for
    the places left after planting, so the case's whole background was another draw; round 67,
    4). Copies are counted among the places each pool fills."""
    cells = _crops(tmp_path / "crops", {"normal": 30, "big": 10})
    config = CellSlideConfig(
        cells=cells, normal=("normal",), mpp=0.25, abnormal_fraction=0.0, width=1024,
        height=1024, n_cells=30, seed=9,
    )  # fmt: skip
    neg_place, neg, _ = place_cells(config)
    said: list[str] = []
    case_place, case, n_abn = place_cells(
        dataclasses.replace(config, abnormal_fraction=0.1), said.append
    )
    assert n_abn == 3 and said == []  # 27 normal places from 30 crops: none used twice
    planted = np.asarray(case["label"].to_pylist(), bool)
    classes = np.asarray(case["class"].to_pylist())
    assert planted.sum() == 3 and set(classes[planted]) == {"big"}
    for col in ("x", "y"):
        assert neg[col].to_pylist() == case[col].to_pylist()
    np.testing.assert_array_equal(neg_place.turn, case_place.turn)
    same = np.asarray(neg["source"].to_pylist())[~planted]
    np.testing.assert_array_equal(same, np.asarray(case["source"].to_pylist())[~planted])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--cells", "600"], "--n-cells 600"),
        (["--cells", "{crops}"], "needs --normal"),
        (["--cells", "{crops}", "--normal", "normal"], "needs --mpp"),
        (["--cells", "{crops}", "--normal", "NILM", "--mpp", "0.25"], "unknown class name"),
        (["--cells", "{crops}", "--normal", "normal", "--mpp", "0.25", "--planes", "-1,0,1"],
         "--planes"),
        (["--normal", "normal"], "name the classes of --cells"),
        (["--cells", "{crops}", "--normal", "normal", "--mpp", "0.25", "--n-cells", "100000"],
         "do not fit"),
    ],
)  # fmt: skip
def test_a_bad_composed_slide_is_one_line(tmp_path, args, said):
    crops = _crops(tmp_path / "crops", {"normal": 4, "big": 2})
    args = [a.format(crops=crops) for a in args]
    proc = run_cyto("synth", "slide", str(tmp_path / "s.tif"), "--width", "1024", "--height",
                    "1024", *args)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.tif").exists()


@pytest.mark.realdata
@pytest.mark.slow
def test_a_pap_slide_of_real_cells_is_ranked_end_to_end(tmp_path, cric):
    """A Pap model from CRIC's earlier NILM cells (with its held-back cells deciding the ranking)
    scores a slide composed from later crops, the low-grade lesions planted at 5 %: the Pap
    detection finds the crops' nuclei, every cell carries its morphometry, and the planted cells
    rank above chance."""
    from cyto.data.dataset import acquisition_key

    early, late = tmp_path / "early", tmp_path / "late"
    for cls, (n_early, n_late) in {"NILM": (300, 300), "LSIL": (60, 40), "ASC-US": (0, 40)}.items():
        files = sorted((cric / cls).glob("*.png"), key=acquisition_key)
        for dest, chosen in ((early, files[:n_early]), (late, files[-n_late:])):
            if not chosen:
                continue
            (dest / cls).mkdir(parents=True, exist_ok=True)
            for f in chosen:
                os.symlink(f, dest / cls / f.name)
    model = tmp_path / "pap.cyto"
    proc = run_cyto(
        "train", "dsvdd", "--data", str(early), "--normal", "NILM", "--out", str(model),
        "--preset", "fast", "--set", "stain=pap", "--set", "mpp=0.258", "--set", "load_size=64",
        "--set", "input_size=32", "--set", "epochs=1", "--set", "ae_epochs=0",
        "--set", "n_seeds=1", "--set", "tta_views=orig",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "held-back cells (60 normal, 60 abnormal)" in proc.stdout
    slide = tmp_path / "pap.tif"
    proc = run_cyto(
        "synth", "slide", str(slide), "--cells", str(late), "--normal", "NILM",
        "--abnormal-fraction", "0.05", "--mpp", "0.258", "--width", "2560", "--height", "2560",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    truth = slide.with_name("pap.cells.parquet")
    out = tmp_path / "scored"
    proc = run_cyto(
        "score", str(slide), "--model", str(model), "--out", str(out), "--truth", str(truth),
        "--workers", "0", "--mosaic", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warned = [w for w in (proc.stdout + proc.stderr).splitlines() if "warning" in w.lower()]
    # no scale or stain mismatch (one lab); the bundle, not exported, is UNVERIFIED
    assert [w for w in warned if not w.startswith("warning: UNVERIFIED")] == [], warned
    summary = json.loads((out / "pap" / "summary.json").read_text())
    assert summary["detection_crowding"]["detection"] == "pap"  # --detection auto: the stain's
    table = pq.read_table(out / "pap" / "scores.parquet")
    gt = pq.read_table(truth)
    from cyto.detect import match

    xy = np.column_stack([np.asarray(table["x"]), np.asarray(table["y"])])
    centres = np.column_stack([np.asarray(gt["x"]), np.asarray(gt["y"])])
    # the crops' own nuclei are found (a NILM crop's annotated point is often off its nucleus:
    # within 10 um here; benchmarks/science/pap/ measures it within 3 um on the crops)
    assert match(xy, centres, 10 / 0.258)[0] >= 0.85
    # each class's: a 16 um background opening took the large pale nuclei of low-grade lesions
    # off whole (9 of this slide's 13 ASC-US cells found)
    kind = np.asarray(gt["class"])
    for cls in ("NILM", "LSIL", "ASC-US"):
        assert match(xy, centres[kind == cls], 10 / 0.258)[0] >= 0.8, cls
    area = np.asarray(table["nucleus_area_um2"], dtype=float)
    assert np.isfinite(area).mean() > 0.9 and 20 < np.nanmedian(area) < 120
    # the planted cells rank above chance (a slide holds every nucleus the crops show, debris and
    # neighbours' nuclei too, unlike the annotated training cells: benchmarks/science/pap/)
    truth = summary["truth"]
    chance = min(400, table.num_rows) / table.num_rows
    assert truth["planted_recall_at_k"] > 1.5 * chance and truth["auroc"] > 0.55
    # each class against the normals, from the slide's own table (round 26, 7: no class column)
    assert set(table["class"].to_pylist()) <= {"NILM", "LSIL", "ASC-US", "unmatched"}
    proc = run_cyto("eval", "scores", str(out / "pap"), "--by-class", "--k", "100")
    assert proc.returncode == 0, proc.stderr
    assert "against NILM,unmatched" in proc.stdout and "LSIL" in proc.stdout, proc.stdout
    # the MGG detection on this Pap slide: its cells look another size because that preset
    # measures their nuclei otherwise; the warning and the adequacy reason say so, not the
    # slide's resolution, whose advice (pass --mpp, --rescale) would be wrong (round 18)
    proc = run_cyto(
        "score", str(slide), "--model", str(model), "--out", str(tmp_path / "smear"),
        "--workers", "0", "--mosaic", "0", "--detection", "smear",
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "--detection smear is not the detection of the model's pap-stained training cells" in (
        said
    )
    assert "leave out --detection (auto takes pap)" in said
    assert "resolution" not in said and "--rescale" not in said, said
    # an MGG slide given to this Pap model: the stain warning, and the adequacy says what was
    # read of the cells is limited by it ("satisfactory" beside the warning: round 58)
    mgg = tmp_path / "mgg.tif"
    proc = run_cyto(
        "synth", "slide", str(mgg), "--width", "1024", "--height", "1024", "--mpp", "0.258"
    )  # at the model's resolution: the stain, not the scale, is what differs
    assert proc.returncode == 0, proc.stderr
    proc = run_cyto(
        "score", str(mgg), "--model", str(model), "--out", str(tmp_path / "other"),
        "--workers", "0", "--mosaic", "0", "--detection", "pap",
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "stained otherwise than the model's" in said, said
    adequacy = json.loads((tmp_path / "other" / "mgg" / "summary.json").read_text())["adequacy"]
    assert adequacy["cell_stain"]["advised"], adequacy
    assert adequacy["result"] != "satisfactory", adequacy
    assert any(
        "stained otherwise than the model's training cells" in r for r in adequacy["reasons"]
    )


def test_crops_of_other_sides_are_said_padded_or_cut_by_count(tmp_path):
    """Round 19 (case 16): "170 of 177 crops are not 94 px a side: padded ... or cut" left out
    how many lost their edges; padded and cut are counted apart (crops of sizes within one
    field of view, :data:`cyto.data.dataset.SIZE_SPREAD`: farther apart they are refused)."""
    from PIL import Image

    cells = _crops(tmp_path / "crops", {"normal": 6, "big": 2})
    for i, side in enumerate((60, 62, 66)):
        Image.new("RGB", (side, side), (200, 190, 210)).save(cells / "normal" / f"odd{i}.png")
    config = CellSlideConfig(
        cells=cells, normal=("normal",), mpp=0.25, abnormal_fraction=0.0, width=512, height=512,
        n_cells=10,
    )  # fmt: skip
    said: list[str] = []
    place_cells(config, said.append)
    side = Image.open(next((cells / "big").iterdir())).size[0]
    (line,) = [s for s in said if "px a side" in s]
    cut = sum(s > side for s in (60, 62, 66))
    assert line == (
        f"note: 3 of 11 crops are not {side} px a side, never resampled: {3 - cut} padded with "
        f"their edge colour, {cut} cut about their centre (a cell wider than the field loses "
        "its edges)"
    ), line


def test_an_unreadable_crop_is_one_line_that_advises_only_what_synth_slide_has(tmp_path):
    """Hostile round 23 (6.4): a transparent crop in --cells stopped `cyto synth slide` with
    "pass --skip-unreadable", an option it does not have ("No such option"). The line names
    the file and why, and advises fixing or removing it; no slide is left behind."""
    crops = _crops(tmp_path / "crops", {"normal": 4, "big": 2})
    blank = np.zeros((64, 64, 4), np.uint8)  # every pixel transparent
    Image.fromarray(blank, "RGBA").save(crops / "normal" / "blank.png")
    proc = run_cyto("synth", "slide", str(tmp_path / "s.tif"), "--width", "1024", "--height",
                    "1024", "--cells", str(crops), "--normal", "normal",
                    "--mpp", "0.25")  # fmt: skip
    # exit 1, as a slide that cannot be read (it was 2, a usage error: hostile round 33, 11)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"cannot read image {crops / 'normal' / 'blank.png'}: 0 of its pixels" in line, line
    assert line.endswith("(fix or remove the file)") and "--skip-unreadable" not in line, line
    assert not (tmp_path / "s.tif").exists()


def test_crops_of_sizes_apart_are_refused_as_train_and_predict_refuse_them(tmp_path):
    """Hostile round 25 (24): `cyto train` and `cyto predict` refused a folder of 100 px and
    363 px crops in one line, and `cyto synth slide --cells` cut the 363 px blood cells to
    100 px Pap "NILM" crops with a note. One rule for every reader of a crop folder; crops
    of one size beside a few cut at their image's edge are composed as before."""
    crops = _crops(tmp_path / "crops", {"normal": 6})
    _crops(tmp_path / "big", {"normal": 3}, size=160)
    for i, f in enumerate(sorted((tmp_path / "big" / "normal").iterdir())):
        f.rename(crops / "normal" / f"wide{i}.png")
    out = tmp_path / "s.tif"
    proc = run_cyto(
        "synth", "slide", str(out), "--cells", str(crops), "--normal", "normal", "--mpp",
        "0.25", "--width", "1024", "--height", "1024", "--abnormal-fraction", "0",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "holds cell crops of 2 sizes" in line and "cyto data field" in line, line
    assert not out.exists()
