"""`cyto predict`'s scale: the check and ``--zoom auto`` read the normal class of a labelled
folder, and ``--patch-mpp`` zooms by the crops' field of view, not their pixel size alone
(hostile round 18, cases 9 and 10)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.cli_runner import run_cyto

BG = (235, 225, 230)
NUCLEUS = (70, 30, 110)
CYTOPLASM = (190, 160, 200)


def _cell(side: int, mpp: float, nucleus_um: float, cell_um: float = 7.0) -> np.ndarray:
    """A round cell at the centre of a ``side`` px crop of ``mpp`` um per pixel: a nucleus of
    radius ``nucleus_um`` in a cytoplasm of radius ``cell_um``, drawn 4x finer and averaged
    down, so the same cell at two pixel sizes differs by sampling only."""
    fine = side * 4
    yy, xx = (np.mgrid[:fine, :fine] - (fine - 1) / 2) * (mpp / 4)
    r = np.hypot(yy, xx)
    img = np.empty((fine, fine, 3), dtype=np.uint8)
    img[:] = BG
    img[r <= cell_um] = CYTOPLASM
    img[r <= nucleus_um] = NUCLEUS
    return np.asarray(Image.fromarray(img).resize((side, side), Image.BOX))


def _folder(root, side: int, mpp: float, radii: dict[str, list[float]]):
    for cls, values in radii.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i, r in enumerate(values):
            Image.fromarray(_cell(side, mpp, r)).save(root / cls / f"{i:03d}.png")
    return root


def _model(exported_dsvdd, tmp_path, **training):
    """The small Deep SVDD bundle, recorded as trained on 96 px crops at 0.25 um per pixel."""
    from cyto.bundle import add_files

    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    add_files(
        model,
        {},
        lambda m: {
            "config": {**m["config"], "mpp": 0.25},
            "training_data": {**m["training_data"], "patch_px": 96, **training},
        },
    )
    return model


RADII = {
    "normal": list(np.linspace(2.0, 2.6, 20)),
    "abnormal": list(np.linspace(4.0, 5.0, 21)),  # the median cell is an abnormal one
}


def _scale_warnings(call) -> tuple[object, list[str]]:
    from cyto.errors import ScaleWarning

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = call()
    said = [str(w.message) for w in said if issubclass(w.category, ScaleWarning)]
    return result, [m for m in said if m.startswith("these cells")]  # not the crops' side


def test_a_labelled_folder_is_checked_for_scale_by_its_normal_cells(exported_dsvdd, tmp_path):
    """Case 9: a folder of the training lab at the training scale, half of it enlarged nuclei,
    was told "these cells look 1.28x larger ... a model trained at this scale is advised": the
    median took the abnormal cells too, though ``normal=`` said which were normal."""
    import cyto
    from cyto.data.images import resize_rgb
    from cyto.detect.morphometry import scale_shares
    from cyto.runtime import load_scorer

    data = _folder(tmp_path / "cells", 96, 0.25, RADII)
    spec = load_scorer(exported_dsvdd, "onnx", "cpu", verify=False).spec
    normals = np.stack(
        [resize_rgb(_cell(96, 0.25, r), spec.crop_size) for r in RADII["normal"]]
    )  # the model's training normals: these very cells
    reference = float(np.median(scale_shares(normals, spec.stain)))
    model = _model(exported_dsvdd, tmp_path, nucleus_fraction=reference)

    def run(name, **kw):
        return cyto.predict(model, data, tmp_path / f"{name}.parquet", echo=None, **kw)

    summary, said = _scale_warnings(lambda: run("labelled", normal="normal"))
    assert said == [] and summary["auroc"] > 0.5
    # no labels: the median of every cell is all there is; half of them at the training scale,
    # the median can be either (not said: 95 % sure, round 20), enlarged cells alone are said
    _, said = _scale_warnings(lambda: run("unlabelled"))
    assert said == []
    enlarged = _folder(tmp_path / "enlarged", 96, 0.25, {"abnormal": RADII["abnormal"]})
    from cyto.errors import ScaleWarning

    with pytest.warns(ScaleWarning) as got:
        cyto.predict(model, enlarged, tmp_path / "e.parquet", echo=None)
    (w,) = [w for w in got if w.category is ScaleWarning and "these cells" in str(w.message)]
    assert "larger than the model's training cells" in str(w.message)
    assert "of 21 cells against" in str(w.message), w.message
    assert w.filename == __file__  # the caller's line (it was cyto/api.py's: round 20)
    # --zoom auto measures the normal class too: the training scale, kept at 1
    summary = run("auto", normal="normal", zoom="auto")
    assert summary["zoom"] == 1.0 and summary["zoom_from"].startswith("auto, kept at 1: ")
    assert "within" in summary["zoom_from"] and "the normal class" in summary["zoom_from"]
    # the command line: the same rule, no warning
    proc = run_cyto(
        "predict", str(model), "--data", str(data), "--normal", "normal",
        "--out", str(tmp_path / "cli.parquet"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "training cells (median nucleus share" not in proc.stderr, proc.stderr


def test_patch_mpp_zooms_by_the_field_of_view(exported_dsvdd, tmp_path):
    """Case 10: crops of 200 px at 0.129 um/px (the model's 100 px at 0.258: the same field)
    were zoomed 0.5x by the ratio of pixel sizes, halving the cells (AUROC 0.858 -> 0.612,
    areas 4x too small). The same cells drawn at the model's field and pixel size, at half the
    pixel size over the same field, and at the model's pixel size over twice its field score
    and measure alike."""
    import cyto

    model = _model(exported_dsvdd, tmp_path)
    radii = {"normal": list(np.linspace(1.5, 2.5, 12)), "abnormal": list(np.linspace(3.5, 5, 8))}
    runs = {}
    for name, side, mpp in (("model", 96, 0.25), ("finer", 192, 0.125), ("wider", 192, 0.25)):
        data = _folder(tmp_path / name, side, mpp, radii)
        out = tmp_path / f"{name}.parquet"
        summary = cyto.predict(model, data, out, normal="normal", patch_mpp=mpp, echo=None)
        table = pq.read_table(out).sort_by("path")
        runs[name] = (summary, {c: np.asarray(table[c]) for c in ("score", "nucleus_area_um2")})
    assert runs["model"][0]["zoom"] == pytest.approx(1.0)
    assert runs["finer"][0]["zoom"] == pytest.approx(1.0)  # the same field: no zoom
    assert runs["wider"][0]["zoom"] == pytest.approx(2.0)  # twice the field: its centre half
    assert "96 px x 0.25 um" in runs["finer"][0]["zoom_from"]
    truth = np.pi * np.concatenate([radii["abnormal"], radii["normal"]]) ** 2  # sorted by path
    base = runs["model"][1]
    assert np.median(base["nucleus_area_um2"] / truth) == pytest.approx(1.0, rel=0.15)
    for name in ("finer", "wider"):
        summary, table = runs[name]
        np.testing.assert_allclose(table["nucleus_area_um2"], base["nucleus_area_um2"], rtol=0.1)
        assert summary["auroc"] == pytest.approx(runs["model"][0]["auroc"], abs=0.05)
        order = [np.argsort(np.argsort(t["score"])) for t in (table, base)]
        assert np.corrcoef(*order)[0, 1] > 0.9  # the same cells, ranked alike


def test_crops_of_the_training_crops_side_are_not_told_another_scale(exported_dsvdd, tmp_path):
    """Hostile round 21: a model trained on 100 px crops, loaded at 64 px, was told of its own
    training crops "patches of 100 px are resized to the model's 64 px crops ... or the scores
    are of cells at another scale". Crops of the training crops' side are resized as they were
    in training; another side is said, with the side to give."""
    import cyto
    from cyto.errors import ScaleWarning

    model = _model(exported_dsvdd, tmp_path)  # recorded as trained on 96 px crops
    with cyto.load_model(model) as scorer:
        size = scorer.spec.crop_size
        assert size != 96
        own = np.stack([_cell(96, 0.25, 2.2)] * 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ScaleWarning)
            scorer.score(own)
        with pytest.warns(ScaleWarning, match=r"patches of 50 px .* give 96 px crops"):
            scorer.score(np.stack([_cell(50, 0.25, 2.2)] * 4))


def test_zoom_auto_kept_at_1_still_says_crops_of_another_field(exported_dsvdd, tmp_path):
    """Hostile round 25 (12): crops of 363 px for a model of 100 px were told "these crops are
    363 px a side ... pass --patch-mpp" without a zoom, and nothing with ``--zoom auto``, which
    compares the nuclei's share of each crop (what resizing keeps): kept at 1, the crops were
    resized as if of the model's field all the same. The line is said under auto too."""
    import cyto
    from cyto.detect.morphometry import scale_shares
    from cyto.runtime import load_scorer

    spec = load_scorer(exported_dsvdd, "onnx", "cpu", verify=False).spec
    wide = _folder(tmp_path / "wide", 192, 0.25, {"normal": list(np.linspace(4.0, 5.2, 16))})
    normals = np.stack([_cell(192, 0.25, r) for r in np.linspace(4.0, 5.2, 16)])
    from cyto.data.images import resize_rgb

    reference = float(
        np.median(scale_shares(np.stack([resize_rgb(c, spec.crop_size) for c in normals]), "mgg"))
    )
    model = _model(exported_dsvdd, tmp_path, nucleus_fraction=reference)
    from cyto.errors import ScaleWarning

    for zoom in (None, "auto"):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            summary = cyto.predict(
                model, wide, tmp_path / f"{zoom}.parquet", normal="normal", zoom=zoom, echo=None
            )
        lines = [
            str(w.message)
            for w in got
            if issubclass(w.category, ScaleWarning) and "training crops" in str(w.message)
        ]
        assert len(lines) == 1 and lines[0].startswith(
            "these crops are 192 px a side, the model's training crops 96 px"
        ), (zoom, lines)
    assert summary["zoom"] == 1.0, summary["zoom_from"]


def test_zoom_auto_under_an_mgg_model_says_why_a_stain_check_does_not_hold_it(
    exported_dsvdd, tmp_path
):
    """Under an MGG model, ``--zoom auto`` zoomed a folder (1.75x) right after its stain
    warning, where the docs said a folder of another stain is kept at 1 (hostile round 66, 5):
    MGG's nucleus rule reads optical density whatever the hue, so it zooms, and says why."""
    import cyto
    from cyto.data.images import resize_rgb
    from cyto.detect.morphometry import scale_shares
    from cyto.runtime import load_scorer

    spec = load_scorer(exported_dsvdd, "onnx", "cpu", verify=False).spec
    assert spec.stain == "mgg"
    normals = np.stack([resize_rgb(_cell(96, 0.25, r), spec.crop_size) for r in RADII["normal"]])
    model = _model(
        exported_dsvdd, tmp_path, nucleus_fraction=float(np.median(scale_shares(normals, "mgg")))
    )
    # the same cells at 1.6 times the pixel size: they look smaller
    data = _folder(tmp_path / "small", 96, 0.4, {"normal": RADII["normal"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = cyto.predict(model, data, tmp_path / "z.parquet", echo=None, zoom="auto")
    assert summary["zoom"] > 1.25, summary["zoom_from"]
    assert "read by their optical density, whatever the stain" in summary["zoom_from"]
