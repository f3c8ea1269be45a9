"""Crop folders as labs keep them (hostile round 43): class folders whose names differ only in
case (merged from a Windows or Mac disk), a Mac's ``._x.jpg`` metadata beside each copied crop,
byte-identical copies of a crop, grey crops among colour ones. Each is said, or refused, by the
one reader of class folders (``cyto.data.dataset.scan_folder``, ``_decode_all``) and by every
command that reads such a folder (predict, train, synth slide --cells)."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import cyto
from cyto.data.dataset import PatchDataset, load_records
from cyto.errors import CytoWarning, DatasetError


def _crop(path: Path, seed: int, size: int = 32, grey: bool = False) -> None:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    img[size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = (60, 30, 100)
    path.parent.mkdir(parents=True, exist_ok=True)
    (Image.fromarray(img).convert("L") if grey else Image.fromarray(img)).save(path)


@given(names=st.lists(st.text("aAbB", min_size=1, max_size=3), min_size=1, max_size=4, unique=True))
def test_class_folders_differing_only_in_case_are_refused_in_one_line(names):
    """``NILM`` and ``nilm`` were read as two classes: ``--normal NILM`` made the ``nilm``
    cells abnormal, and the metrics were of them, without a word (round 43, 2)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, name in enumerate(names):
            _crop(root / name / "c.png", i)
        folded = [n.casefold() for n in sorted(names)]
        if len(set(folded)) == len(folded):
            assert {r.cls for r in load_records(root)} == set(names)
            return
        with pytest.raises(DatasetError) as err:
            load_records(root)
        said = str(err.value)
        assert "\n" not in said and "differ only in case" in said
        a, b = said.removeprefix("class folders ").split(" of ")[0].split(" and ")
        assert a != b and a.casefold() == b.casefold() and {a, b} <= set(names)
        # the same labels in a manifest: refused alike
        rows = "".join(f"{n}/c.png,{n}\n" for n in names)
        (root / "m.csv").write_text("path,label\n" + rows)
        with pytest.raises(DatasetError, match=r"^labels .* of .*m\.csv differ only in case"):
            load_records(root / "m.csv")


def test_hidden_files_are_no_cells_and_are_said(tmp_path):
    """A Mac's ``._x.jpg`` (its metadata of x.jpg, copied onto every USB stick with it) stopped
    cyto train and predict as an unreadable image, where ``.DS_Store`` was passed over."""
    for i in range(3):
        _crop(tmp_path / "normal" / f"n{i}.png", i)
    (tmp_path / "normal" / "._n0.png").write_bytes(b"\0\5\26\7" + b"\0" * 60)
    (tmp_path / "normal" / ".DS_Store").write_bytes(b"\0" * 30)
    with pytest.warns(
        CytoWarning, match=r"1 hidden file\(s\) in the class folders of .*\._n0\.png"
    ):
        ds = PatchDataset.from_path(tmp_path, normal="normal", size=32)
    assert sorted(r.path.name for r in ds.records) == ["n0.png", "n1.png", "n2.png"]


def test_copies_of_a_crop_are_said_where_the_cells_are_read(tmp_path, exported_dsvdd):
    """Byte-identical copies (a copied file, a link to one) were each another cell in training
    and in predict's metrics without a note, where a manifest's repeated row is refused."""
    for i in range(4):
        _crop(tmp_path / "d" / "normal" / f"n{i}.png", i)
        _crop(tmp_path / "d" / "odd" / f"a{i}.png", 10 + i)
    shutil.copy(tmp_path / "d" / "normal" / "n0.png", tmp_path / "d" / "normal" / "n0 copy.png")
    (tmp_path / "d" / "odd" / "link.png").symlink_to(tmp_path / "d" / "normal" / "n1.png")
    # round 45 (8): a copy in another class is one cell under two labels, said first
    words = (
        r"2 of 10 images are byte-identical copies of another image of the set \(odd/link\.png = "
        r"normal/n1\.png\); 1 of them in another class than their original \(odd/link\.png = "
        r"normal/n1\.png: one cell labelled normal and odd\)"
    )
    with pytest.warns(CytoWarning, match=words):
        PatchDataset.from_path(tmp_path / "d", normal="normal", size=32)
    # round 45 (7): and where a slide is composed of them (its reuse note undercounted)
    with pytest.warns(CytoWarning, match=r"2 of 10 images are byte-identical copies"):
        cyto.synth_slide(tmp_path / "s.tif", cells=tmp_path / "d", normal="normal", mpp=0.25,
                         width=512, height=512, abnormal_fraction=0, echo=None)  # fmt: skip
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cyto.predict(exported_dsvdd, tmp_path / "d", tmp_path / "p.parquet", normal="normal",
                     echo=None)  # fmt: skip
    copies = [str(w.message) for w in seen if "byte-identical" in str(w.message)]
    assert len(copies) == 1 and copies[0].startswith("2 of 10 images"), copies


def test_grey_crops_among_colour_ones_are_said_when_a_slide_is_composed(tmp_path):
    """The grey crops of a colour folder went onto a composed slide without a word, where
    predict and train said them (round 43, 5)."""
    import cyto

    for i in range(30):
        _crop(tmp_path / "c" / "normal" / f"n{i:02d}.png", i, grey=i < 2)
    words = r"^2 of 30 images are grayscale \(n00\.png: mode L\)"
    with pytest.warns(CytoWarning, match=words):  # from Python: a warning ("warning: " said)
        cyto.synth_slide(tmp_path / "s.tif", cells=tmp_path / "c", normal="normal", mpp=0.25,
                         width=512, height=512, abnormal_fraction=0, echo=None)  # fmt: skip


def test_grey_crops_are_said_as_a_stain_warning(tmp_path):
    """Hostile round 73, 6: grey crops ("they carry no stain colour") were a plain CytoWarning,
    so a filter on StainWarning (another stain) missed them; a StainWarning is a CytoWarning."""
    from cyto.data.dataset import PatchDataset
    from cyto.errors import StainWarning

    for i in range(6):
        _crop(tmp_path / "c" / "normal" / f"n{i}.png", i, grey=i < 2)
    with pytest.warns(StainWarning, match=r"^2 of 6 images are grayscale .*no stain colour"):
        PatchDataset.from_path(tmp_path / "c", normal="normal", size=32)


@pytest.mark.parametrize(
    "twin",
    ["LSIL e\u0301", "\uff2c\uff33\uff29\uff2c \u00e9", "LSIL\u200b \u00e9"],
    ids=["decomposed", "full-width", "zero-width"],
)
def test_a_class_name_that_looks_like_another_is_refused_spelled_out_and_accents_are_not(
    tmp_path, twin
):
    """A Mac's decomposed "é" beside a typed one; round 45 (9): full-width letters and a
    zero-width space passed as a class of their own, and the refusal showed two names that look
    the same ("Ünorm and Ünorm")."""
    for name in ("LSIL \u00e9", twin, "LSIL e"):  # typed é, its twin, no accent
        _crop(tmp_path / "d" / name / "c.png", 0)
    with pytest.raises(DatasetError, match="differ only in case or form") as err:
        load_records(tmp_path / "d")
    typed = ascii("LSIL \u00e9")
    said = str(err.value)
    assert f"{typed} and {ascii(twin)}" in said or f"{ascii(twin)} and {typed}" in said, said
    shutil.rmtree(tmp_path / "d" / twin)
    assert {r.cls for r in load_records(tmp_path / "d")} == {"LSIL \u00e9", "LSIL e"}


def test_a_link_to_another_class_folder_and_a_hidden_folder_of_images_are_said(tmp_path):
    for i in range(2):
        _crop(tmp_path / "NILM" / f"n{i}.png", i)
    (tmp_path / "nilm").symlink_to(tmp_path / "NILM")
    with pytest.raises(DatasetError, match=r"^class folders NILM and nilm .* are one folder"):
        load_records(tmp_path)
    (tmp_path / "nilm").unlink()
    _crop(tmp_path / "._LSIL" / "a.png", 5)
    _crop(tmp_path / "NILM" / ".n9.png", 9)  # a hidden image, no Mac's metadata
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert {r.cls for r in load_records(tmp_path)} == {"NILM"}
    said = [str(w.message) for w in seen]
    assert any(s.startswith("hidden folder(s) ._LSIL of ") for s in said), said
    assert any("(names starting with '.', e.g. .n9.png)" in s for s in said), said


def test_data_info_splits_the_images_that_can_be_read(tmp_path):
    """Round 43 (4): ``cyto data info --normal`` counted the unreadable files in its one-class
    split ("normal 37", of which 4 train and predict could not read), listed only below it."""
    import json

    from tests.cli_runner import run_cyto

    for i in range(3):
        _crop(tmp_path / "normal" / f"n{i}.png", i)
        _crop(tmp_path / "odd" / f"a{i}.png", 10 + i)
    (tmp_path / "normal" / "zero.png").write_bytes(b"")
    shutil.copy(tmp_path / "odd" / "a0.png", tmp_path / "odd" / "a0 copy.png")
    proc = run_cyto("data", "info", str(tmp_path), "--normal", "normal")
    assert proc.returncode == 0, proc.stderr
    assert "one-class split of the readable images: normal 3 (normal), abnormal 4" in proc.stdout
    assert "  normal       4" in proc.stdout  # the files, as listed
    # round 45 (7): copies said before any training, as train and predict say them
    assert "copies: 1 of 7 images are byte-identical copies of another image of the set (" in (
        proc.stdout
    )
    proc = run_cyto("data", "info", str(tmp_path), "--normal", "normal", "--json")
    split = json.loads(proc.stdout)["split"]
    assert (split["normal"], split["abnormal"]) == (3, 4)
