"""A bundle knows the images it was trained on, and `cyto predict` says which of the images it
scores are among them (hostile round 39, 7: a model's own training cells were scored and their
AUROC reported without a word)."""

from __future__ import annotations

import shutil
import warnings

import pytest

from cyto.errors import CytoWarning
from tests.cli_runner import run_cyto


@pytest.fixture(scope="module")
def folders(synth_patches, tmp_path_factory):
    """A training folder (30 normal, 6 abnormal cells), a held-out one of other cells, a
    mixed one: 5 training images (copied, under other names) among 15 held-out ones, and a
    converted one: 4 training images saved again as TIFF (the same pixels in other bytes)
    among 10 held-out ones."""
    root = tmp_path_factory.mktemp("trained-on")
    normal = sorted((synth_patches / "normal").iterdir())
    enlarged = sorted((synth_patches / "enlarged").iterdir())
    picks = {
        "train": (normal[:30], enlarged[:6]),
        "held": (normal[30:50], enlarged[6:10]),
        "mixed": (normal[:5] + normal[50:60], enlarged[10:12]),
    }
    for name, (norm, abn) in picks.items():
        for cls, files in (("normal", norm), ("enlarged", abn)):
            (root / name / cls).mkdir(parents=True)
            for i, f in enumerate(files):
                shutil.copy(f, root / name / cls / f"{name}-{i}{f.suffix}")
    from PIL import Image

    for cls, files in (("normal", normal[:4] + normal[60:68]), ("enlarged", enlarged[10:12])):
        (root / "converted" / cls).mkdir(parents=True)
        for i, f in enumerate(files):
            with Image.open(f) as im:
                im.convert("RGB").save(root / "converted" / cls / f"c-{i}.tif")
    from cyto.train.api import train

    model = root / "m.cyto"
    overrides = ["epochs=1", "ae_epochs=0", "n_seeds=1", "tta_views=orig", "holdout=0"]
    train("dsvdd", root / "train", model, normal="normal", preset="fast", overrides=overrides)
    return root, model


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("held", None),
        ("train", "every image scored is among the images"),
        ("mixed", "5 of the 17 images scored are among the images"),
        # a training crop saved again losslessly was a held-out cell: the bytes alone were known
        ("converted", "4 of the 14 images scored are among the images"),
    ],
)
def test_predict_says_which_scored_images_the_model_was_trained_on(folders, name, said, tmp_path):
    import cyto

    root, model = folders
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = cyto.predict(model, root / name, tmp_path / "p.parquet", normal="normal")
    lines = [str(w.message) for w in caught if issubclass(w.category, CytoWarning)]
    found = [ln for ln in lines if "was trained on or chose its ranking on" in ln]
    assert summary["trained_on"] == {"held": 0, "train": 36, "mixed": 5, "converted": 4}[name]
    if said is None:
        assert not found, found
        return
    assert len(found) == 1 and found[0].startswith(said), found
    assert "not one of held-out cells" in found[0]
    # the table flags the rows (the warning alone was lost by the next step: hostile round 40, 2)
    import pyarrow.parquet as pq

    flags = pq.read_table(tmp_path / "p.parquet")["trained_on"].to_pylist()
    assert sum(flags) == summary["trained_on"]
    if name != "mixed":
        return
    proc = run_cyto(
        "predict", str(model), "--data", str(root / name), "--normal", "normal",
        "--out", str(tmp_path / "c.parquet"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stdout + proc.stderr
    judged = run_cyto("eval", "scores", str(tmp_path / "c.parquet"), "--k", "5")
    assert judged.returncode == 0, judged.stderr
    assert "note: 5 of the 17 rows of c.parquet are images its model was trained on" in (
        judged.stdout
    )
    # and in the JSON a script reads (the note alone went to stderr there: round 42, 7)
    import json

    rows = json.loads(run_cyto("eval", "scores", str(tmp_path / "c.parquet"), "--json").stdout)
    assert [r["trained_on"] for r in rows] == [5]
    classes = run_cyto("eval", "scores", str(tmp_path / "c.parquet"), "--json", "--by-class")
    assert json.loads(classes.stdout)["overall"][0]["trained_on"] == 5


def test_a_bundle_that_records_no_training_images_says_so_beside_its_metrics(folders, tmp_path):
    """An earlier cyto's bundle cannot say which images it was trained on: where predict gives
    metrics, it says the overlap cannot be said (hostile round 40, 10), and says nothing of it
    for a folder without labels."""
    from cyto.bundle import TRAINING_CELLS, _write_manifest, load_bundle

    root, model = folders
    old = tmp_path / "old.cyto"
    shutil.copytree(model, old)
    manifest = load_bundle(old, weights=False).manifest
    del manifest["files"][TRAINING_CELLS]
    (old / TRAINING_CELLS).unlink()
    _write_manifest(old, manifest, seal=True)
    said: list[str] = []
    import cyto

    summary = cyto.predict(old, root / "train", tmp_path / "p.parquet", normal="normal",
                           echo=said.append)  # fmt: skip
    assert summary["trained_on"] is None and "auroc" in summary
    assert any("records no training images" in line for line in said), said
    said.clear()
    cyto.predict(old, root / "train", tmp_path / "q.parquet", echo=said.append)
    assert not any("training images" in line for line in said), said


def test_the_record_of_the_training_images_is_checked_as_the_bundle_is(folders, tmp_path):
    """The record is one of the bundle's files, held to its checksum: a record edited to hide
    the training images is refused as any edited bundle file is."""
    import numpy as np

    import cyto
    from cyto.bundle import TRAINING_CELLS
    from cyto.errors import BundleError

    root, model = folders
    copy = tmp_path / "m.cyto"
    shutil.copytree(model, copy)
    np.save(copy / TRAINING_CELLS, np.zeros(1, dtype=np.uint64))
    with pytest.raises(BundleError, match=TRAINING_CELLS):
        cyto.predict(copy, root / "train", tmp_path / "p.parquet", normal="normal")
