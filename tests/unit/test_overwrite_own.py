"""--overwrite replaces only cyto's own outputs (issue 68, class 5): a folder cyto replaces as a
whole (a synthetic dataset, a bundle, a class folder of cut cells, the demo's folder) is
refused, with or without --overwrite, in one line naming a file cyto did not write there."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from cyto.data.synth.cells import CELL_CLASSES
from cyto.data.synth.patches import PatchSynthConfig, patch_names, write_patches
from cyto.errors import InputPathError
from cyto.outputs_check import RECORD, foreign_files, record_outputs, refuse_to_replace

TINY = PatchSynthConfig(n_normal=2, n_abnormal=0, size=32, seed=3)

# a path of a file: one to three parts of plain names
_part = st.text(alphabet="abcLYTnormal_0123456789.-", min_size=1, max_size=12).filter(
    lambda p: p not in (".", "..")
)
_rel = st.lists(_part, min_size=1, max_size=3).map("/".join)
_own = st.tuples(st.sampled_from(CELL_CLASSES), st.integers(1, 99999)).map(
    lambda t: f"{t[0]}/{t[0]}_{t[1]:05d}.jpg"
)


def _make(folder, paths):
    made = []
    for rel in paths:
        p = folder / rel
        if any(q.is_file() for q in [*p.parents, p] if q != folder and folder in q.parents):
            continue  # a file where a folder is asked for, or the same path twice
        if p.is_dir():
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
        made.append(rel)
    return made


_OWN = re.compile("(" + "|".join(CELL_CLASSES) + r")/\1_[0-9]{5,}\.jpg")


@given(own=st.lists(_own, max_size=6), other=st.lists(_rel, max_size=4))
def test_a_folder_is_replaced_only_when_every_file_is_cyto_s(own, other):
    with tempfile.TemporaryDirectory() as tmp:
        _check_folder(Path(tmp), own, other)


def _check_folder(folder, own, other):
    made = _make(folder, own + other)
    expected = sorted(r for r in made if not _OWN.fullmatch(r))
    names = patch_names()
    assert foreign_files(folder, names) == expected
    for overwrite in (False, True):
        if expected:
            with pytest.raises(InputPathError) as err:
                refuse_to_replace(folder, overwrite, known=names)
            line = str(err.value)
            assert "\n" not in line and expected[0] in line and "did not write" in line
        elif overwrite or not made:
            refuse_to_replace(folder, overwrite, known=names)
        else:
            with pytest.raises(InputPathError, match=r"exists \(pass --overwrite"):
                refuse_to_replace(folder, overwrite, known=names)


def test_the_record_vouches_for_what_cyto_wrote_and_nothing_added_later(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"1")
    record_outputs(tmp_path, "test")
    assert foreign_files(tmp_path) == []
    (tmp_path / "a" / "mine.txt").write_text("notes")
    assert foreign_files(tmp_path) == ["a/mine.txt"]
    (tmp_path / RECORD).write_text("not json")  # a damaged record vouches for nothing
    assert foreign_files(tmp_path) == ["a/mine.txt", "a/x.bin"]


def test_synth_patches_overwrite_keeps_the_users_own_images_and_notes(tmp_path):
    out = tmp_path / "patches"
    write_patches(out, TINY)
    (out / "LYT_user").mkdir()
    (out / "LYT_user" / "mine.jpg").write_bytes(b"my image")
    (out / "notes.txt").write_text("my notes")
    for overwrite in (False, True):
        with pytest.raises(InputPathError, match=r"holds (LYT_user/mine\.jpg|notes\.txt) and 1 "):
            write_patches(out, TINY, overwrite=overwrite)
    assert (out / "LYT_user" / "mine.jpg").read_bytes() == b"my image"
    assert (out / "notes.txt").read_text() == "my notes"
    (out / "LYT_user" / "mine.jpg").unlink()
    (out / "LYT_user").rmdir()
    (out / "notes.txt").unlink()
    write_patches(out, TINY, overwrite=True)  # cyto's own: replaced, as before


def test_a_dataset_is_known_by_its_names(tmp_path):
    out = tmp_path / "patches"
    write_patches(out, TINY)
    assert not (out / RECORD).exists()  # a dataset's folders hold images only
    (out / "normal" / "scan.jpg").write_bytes(b"x")
    with pytest.raises(InputPathError, match=r"holds normal/scan\.jpg that cyto did not write"):
        write_patches(out, TINY, overwrite=True)


def test_a_bundle_is_replaced_only_with_what_cyto_wrote_in_it(tmp_path):
    from cyto.bundle import save_bundle

    out = tmp_path / "m.cyto"
    parts = ({"method": "test"}, {}, {"c": np.zeros(2)})
    save_bundle(out, *parts)
    (out / "engines").mkdir()
    (out / "engines" / "plan.engine").write_bytes(b"derived")
    (out / ".manifest.json.k1ll3d").write_bytes(b"{")  # what a killed atomic write left
    save_bundle(out, *parts, overwrite=True)  # manifest-listed and derived files: cyto's
    (out / "README.md").write_text("my notes on this model")
    with pytest.raises(InputPathError, match=r"holds README\.md that cyto did not write"):
        save_bundle(out, *parts, overwrite=True)
    assert (out / "README.md").is_file()
    folder = tmp_path / "mine"  # no bundle at all: nothing in it is cyto's
    folder.mkdir()
    (folder / "scorer.npz").write_bytes(b"mine")
    with pytest.raises(InputPathError, match=r"holds scorer\.npz that cyto did not write"):
        save_bundle(folder, *parts, overwrite=True)


# --- an output never replaces an input (hostile round 3: `cyto predict --data m.parquet --out
# m.parquet --overwrite` replaced the user's own manifest with the score table) -----------------


@given(
    spelling=st.sampled_from(["same", "absolute", "dot", "link", "parent"]),
    overwrite=st.booleans(),
)
def test_an_output_that_is_an_input_is_refused_however_it_is_spelled(spelling, overwrite):
    from cyto.outputs_check import refuse_input_as_output

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "d").mkdir()
        data = root / "d" / "m.parquet"
        data.write_bytes(b"the user's manifest")
        (root / "ln").symlink_to(root / "d")
        out = {
            "same": data,
            "absolute": data.absolute(),
            "dot": root / "d" / "." / "m.parquet",
            "link": root / "ln" / "m.parquet",
            "parent": root / "d",  # a folder output holding the input
        }[spelling]
        with pytest.raises(InputPathError, match="an output never replaces an input") as err:
            refuse_to_replace(out, overwrite, inputs={"data": data, "MODEL": root / "x.cyto"})
        assert "\n" not in str(err.value) and "--data" in str(err.value)
        assert data.read_bytes() == b"the user's manifest"
        refuse_input_as_output(root / "other.parquet", "--out", {"data": data})  # elsewhere: fine


def test_predict_refuses_to_write_over_its_own_manifest(tmp_path):
    """From the CLI and from Python, in each one's words; the manifest is kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import cyto
    from cyto.errors import CytoError
    from tests.cli_runner import run_cyto

    manifest = tmp_path / "m.parquet"
    pq.write_table(pa.table({"path": ["a.png"], "label": ["normal"]}), manifest)
    before = manifest.read_bytes()
    proc = run_cyto("predict", str(tmp_path / "none.cyto"), "--data", str(manifest),
                    "--out", str(manifest), "--overwrite")  # fmt: skip
    assert proc.returncode == 2 and f"is the input --data {manifest}" in proc.stderr, proc.stderr
    with pytest.raises(CytoError, match=r"is the input data='.*m.parquet'"):
        cyto.predict(tmp_path / "none.cyto", manifest, out=manifest, overwrite=True)
    assert manifest.read_bytes() == before


def test_an_output_onto_an_image_a_manifest_lists_is_named_as_that_input(tmp_path):
    """Hostile round 8 (N28): `cyto predict --data man.csv --out P/normal/normal_00001.jpg
    --overwrite` said "P/normal holds normal_00001.jpg that cyto did not write ... move it
    away": a training image the manifest lists, told to be moved. predict and data mosaic name
    it as an input, in each caller's words, and keep it."""
    import cyto
    from cyto.errors import CytoError
    from tests.cli_runner import run_cyto

    (tmp_path / "p" / "normal").mkdir(parents=True)
    image = tmp_path / "p" / "normal" / "normal_00001.png"
    Image.new("RGB", (32, 32), (200, 100, 120)).save(image)
    before = image.read_bytes()
    manifest = tmp_path / "man.csv"
    manifest.write_text("path,label\np/normal/normal_00001.png,normal\n")
    proc = run_cyto("predict", str(tmp_path / "none.cyto"), "--data", str(manifest),
                    "--out", str(image), "--overwrite")  # fmt: skip
    [line] = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and line.startswith(f"error: --out {image} is normal_00001.png")
    assert f"an image the input --data {manifest} lists" in line and "move it" not in line
    with pytest.raises(CytoError, match=r"an image the input data='.*man.csv' lists"):
        cyto.predict(tmp_path / "none.cyto", manifest, out=image, overwrite=True)
    proc = run_cyto("data", "mosaic", str(manifest), "--out", str(image), "--overwrite")
    assert proc.returncode == 2 and f"an image the input PATH {manifest} lists" in proc.stderr
    assert image.read_bytes() == before


def test_predict_overwrite_replaces_only_a_table_predict_wrote(tmp_path):
    """A hostile check (round 4): `cyto predict --out mine.parquet --overwrite` replaced any
    Parquet file of the user's with its score table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.cli_runner import run_cyto

    mine = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), mine)
    before = mine.read_bytes()
    (tmp_path / "d" / "normal").mkdir(parents=True)
    proc = run_cyto("predict", str(tmp_path / "none.cyto"), "--data", str(tmp_path / "d"),
                    "--out", str(mine), "--overwrite")  # fmt: skip
    assert proc.returncode == 2 and "mine.parquet that cyto did not write" in proc.stderr
    assert mine.read_bytes() == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_output_given_a_file_is_one_line_and_the_file_kept(tmp_path, overwrite):
    """Hostile round 9 (N28): `cyto demo --out SLIDE.tif --overwrite` ended in a raw
    FileExistsError; without --overwrite it advised passing --overwrite. Every command that
    writes a folder as a whole (``known`` given) says the output is a file, and keeps it."""
    from tests.cli_runner import run_cyto

    victim = tmp_path / "victim.tif"
    victim.write_bytes(b"a user's slide")
    args = ["demo", "--out", str(victim)] + (["--overwrite"] if overwrite else [])
    proc = run_cyto(*args)
    [line] = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and line == (
        f"error: --out {victim} is a file: this command writes a folder there; give a folder "
        "(it is created if missing)"
    ), proc.stderr
    with pytest.raises(InputPathError, match="is a file: this command writes a folder"):
        refuse_to_replace(victim, overwrite, known=())
    assert victim.read_bytes() == b"a user's slide"
