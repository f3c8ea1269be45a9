"""Patch datasets: folders, manifests, conversions, unreadable files, decode-once cache."""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from cyto.data.dataset import PatchDataset, data_info, load_records
from cyto.data.images import MIN_CELL_SIDE, decode_image, read_image
from cyto.errors import DatasetError, InputPathError, UnreadableImageError


@pytest.mark.realdata
def test_real_bone_marrow_one_class_split(bone_marrow):
    ds = PatchDataset.from_path(bone_marrow, normal="LYT", abnormal="BLA,PMO,EOS,MON")
    assert len(ds) == 800
    assert ds.images.shape == (800, 250, 250, 3) and ds.images.dtype == np.uint8
    assert int((ds.labels == 0).sum()) == 600 and int(ds.labels.sum()) == 200
    assert set(ds.abnormal) == {"BLA", "PMO", "EOS", "MON"}
    # the arrays are the decoded JPEGs, not something else
    first = ds.records[0]
    np.testing.assert_array_equal(ds.images[0], read_image(first.path))


@pytest.mark.realdata
def test_real_data_subset_of_classes_and_resize(bone_marrow):
    ds = PatchDataset.from_path(bone_marrow, normal=["LYT"], abnormal=["BLA"], size=64)
    assert ds.images.shape == (700, 64, 64, 3)
    assert ds.excluded == 100  # PMO, EOS and MON left out and counted
    assert ds.normal == ("LYT",) and ds.abnormal == ("BLA",)


def test_default_abnormal_is_every_other_class(synth_patches):
    ds = PatchDataset.from_path(synth_patches, normal="normal")
    assert set(ds.abnormal) == {
        "enlarged",
        "irregular",
        "nucleolar",
        "coarse",
        "multinucleated",
        "hyperchromatic",
    }
    assert int((ds.labels == 0).sum()) == 120 and int(ds.labels.sum()) == 72


def _copy_dataset(src, dst, per_class=5):
    for cls_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cls_dir.name).mkdir(parents=True)
        for f in sorted(cls_dir.iterdir())[:per_class]:
            shutil.copy(f, dst / cls_dir.name / f.name)


def test_corrupt_files_fail_by_default_and_are_counted_when_skipped(tmp_path, synth_patches):
    data = tmp_path / "d"
    _copy_dataset(synth_patches, data)
    truncated = data / "normal" / "truncated.jpg"
    good = next((data / "normal").glob("normal_*.jpg")).read_bytes()
    truncated.write_bytes(good[: len(good) // 3])
    (data / "coarse" / "text.png").write_text("hello")

    with pytest.raises(UnreadableImageError) as err:
        PatchDataset.from_path(data, normal="normal")
    assert "truncated.jpg" in str(err.value) or "text.png" in str(err.value)
    assert "--skip-unreadable" in str(err.value)

    ds = PatchDataset.from_path(data, normal="normal", skip_unreadable=True)
    assert sorted(p.name for p, _ in ds.skipped) == ["text.png", "truncated.jpg"]
    assert len(ds) == 7 * 5
    info = data_info(data)
    assert sorted(p.name for p, _ in info.unreadable) == ["text.png", "truncated.jpg"]
    assert info.n_files == 7 * 5 + 2


def test_manifest_with_bags_csv_and_parquet(tmp_path, synth_patches):
    recs = load_records(synth_patches)
    normals = [r for r in recs if r.cls == "normal"][:6]
    abns = [r for r in recs if r.cls == "enlarged"][:2]
    rows = []
    for i, r in enumerate(normals):
        rows.append((str(r.path), r.cls, f"slide{i % 3}", 0 if i % 3 else 1))
    for r in abns:
        rows.append((str(r.path.relative_to(synth_patches)), r.cls, "slide0", 1))
    table = pa.table(
        {
            "path": [r[0] for r in rows],
            "label": [r[1] for r in rows],
            "slide_id": [r[2] for r in rows],
            "bag_label": [r[3] for r in rows],
        }
    )
    # relative paths resolve against the manifest's folder
    pq.write_table(table, synth_patches / "manifest.parquet")
    csv = synth_patches / "manifest.csv"
    csv.write_text(
        "path,label,slide_id,bag_label\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows)
    )
    try:
        for manifest in (synth_patches / "manifest.parquet", csv):
            ds = PatchDataset.from_path(manifest, normal="normal")
            assert len(ds) == 8
            assert ds.bags[:3] == ["slide0", "slide1", "slide2"]
            assert ds.bag_labels[:3] == [1, 0, 0]
            assert int(ds.labels.sum()) == 2
            assert data_info(manifest).bags == 3
    finally:
        (synth_patches / "manifest.parquet").unlink()
        csv.unlink()


def test_manifest_errors(tmp_path):
    bad = tmp_path / "m.csv"
    bad.write_text("file_name,kind\na.jpg,LYT\n")
    with pytest.raises(DatasetError, match="needs a path column"):
        load_records(bad)
    lab = tmp_path / "l.csv"
    lab.write_text("path,label,bag_label\na.jpg,LYT,7\n")
    with pytest.raises(DatasetError, match="bag_label must be 0 or 1"):
        load_records(lab)
    with pytest.raises(InputPathError, match="neither a folder nor a manifest"):
        load_records(tmp_path / "m.txt" if (tmp_path / "m.txt").write_text("x") else None)


_PAD = st.sampled_from(["", " ", "  ", "\t"])


@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["LYT", "BLA", "ASC-US"]), _PAD, _PAD, st.sampled_from(["s1", "s2"])
        ),
        min_size=1,
        max_size=12,
    ),
    parquet=st.booleans(),
)
def test_labels_and_bags_are_read_without_the_spaces_around_them(rows, parquet):
    """Hostile round 39 (2): a manifest label " LYT" (a spreadsheet's export) was a class of its
    own, abnormal by default, beside LYT: normal cells counted as abnormal in training, predict
    and every metric. A label and a bag name are what they say without the spaces around them,
    from CSV and Parquet alike."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        table = pa.table(
            {
                "path": [f"c{i}.png" for i in range(len(rows))],
                "label": [f"{a}{label}{b}" for label, a, b, _ in rows],
                "bag": [f"{bag}{a}" for _, a, _, bag in rows],
                "bag_label": [int(bag == "s1") for *_, bag in rows],
            }
        )
        manifest = Path(tmp) / ("m.parquet" if parquet else "m.csv")
        if parquet:
            pq.write_table(table, manifest)
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, manifest)
        records = load_records(manifest)
    assert [r.cls for r in records] == [label for label, *_ in rows]
    assert [r.bag for r in records] == [bag for *_, bag in rows]


def test_a_bag_whose_rows_disagree_on_its_label_is_refused(tmp_path):
    """Hostile round 39 (3): one row of a positive bag edited to bag_label 0 was read three
    ways (WS-SIL each row's, ItS2CLR the first row's, the bag check the last row's)."""
    m = tmp_path / "m.csv"
    m.write_text("path,label,bag,bag_label\na.png,LYT,s1,1\nb.png,BLA,s1,1\nc.png,LYT,s2,0\n")
    assert [r.bag_label for r in load_records(m)] == [1, 1, 0]
    m.write_text("path,label,bag,bag_label\na.png,LYT,s1,0\nb.png,BLA,s1,1\nc.png,LYT,s2,0\n")
    with pytest.raises(DatasetError) as err:
        load_records(m)
    assert "bag 's1' has bag_label 0 in row 2 and 1 in row 3" in str(err.value)
    assert "\n" not in str(err.value)


def test_class_choice_errors(synth_patches):
    with pytest.raises(DatasetError, match="unknown class name"):
        PatchDataset.from_path(synth_patches, normal="LYT")
    with pytest.raises(DatasetError, match="normal and abnormal"):
        PatchDataset.from_path(synth_patches, normal="normal", abnormal="normal,coarse")
    with pytest.raises(DatasetError, match="no normal class"):
        PatchDataset.from_path(synth_patches, normal="")


def test_grayscale_rgba_and_16bit_are_converted(tmp_path):
    gray = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (16, 1))
    Image.fromarray(gray, "L").save(tmp_path / "g.png")
    rgba = np.zeros((16, 16, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 0
    rgba[:8, :, 3] = 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    sixteen = np.arange(256, dtype=np.uint16).reshape(16, 16) * 250
    Image.fromarray(sixteen).save(tmp_path / "s.tif")

    g = read_image(tmp_path / "g.png")
    assert g.shape == (16, 16, 3) and (g[..., 0] == g[..., 2]).all()
    a = read_image(tmp_path / "a.png")
    assert a.shape == (16, 16, 3)
    assert tuple(a[0, 0]) == (200, 0, 0)  # opaque pixels keep their colour
    assert tuple(a[15, 0]) == (255, 255, 255)  # transparent pixels become white glass
    s = read_image(tmp_path / "s.tif")
    assert s.dtype == np.uint8 and s.shape == (16, 16, 3)
    assert s[15, 15, 0] == round(63750 * 255 / 65535)


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 40), w=st.integers(1, 40))
def test_an_image_too_small_to_hold_a_cell_is_refused_by_name(h, w):
    """An image whose longer side is under 16 px holds no cell: every reader of cell images
    refuses it naming the file, as an unreadable one (cyto predict scored 8 x 8 px files,
    enlarged 12x, as cells without a word); a crop cut at its image's edge (100 x 10) is read."""
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 120, np.uint8)).save(buf, format="PNG")
    if max(h, w) < MIN_CELL_SIDE:
        with pytest.raises(UnreadableImageError) as err:
            decode_image(buf.getvalue(), "cells/x.png")
        assert str(err.value).startswith(
            f"cannot read image cells/x.png: {w} x {h} px is too small"
        )
        assert "skip" in str(err.value)
    else:
        assert decode_image(buf.getvalue(), "cells/x.png").shape == (h, w, 3)


def test_decode_image_rejects_garbage():
    with pytest.raises(UnreadableImageError, match="cannot read image"):
        decode_image(b"\x89PNG\r\n\x1a\n garbage", "x.png")


def test_decode_once_cache_is_memory_mapped_and_identical(tmp_path, synth_patches):
    first = PatchDataset.from_path(synth_patches, normal="normal", size=48, cache_dir=tmp_path)
    cached = list(tmp_path.glob("patches-*.npy"))
    assert len(cached) == 1
    second = PatchDataset.from_path(synth_patches, normal="normal", size=48, cache_dir=tmp_path)
    assert isinstance(second.images, np.memmap)
    np.testing.assert_array_equal(np.asarray(first.images), np.asarray(second.images))
    assert first.fingerprint == second.fingerprint


def test_fingerprint_follows_content_and_choice(tmp_path, synth_patches):
    data = tmp_path / "d"
    _copy_dataset(synth_patches, data, per_class=3)
    a = PatchDataset.from_path(data, normal="normal").fingerprint
    assert PatchDataset.from_path(data, normal="normal").fingerprint == a
    assert PatchDataset.from_path(data, normal="normal", abnormal="coarse").fingerprint != a
    victim = next((data / "normal").glob("*.jpg"))
    img = np.asarray(Image.open(victim)).copy()
    img[0, 0] = 0
    Image.fromarray(img).save(victim, quality=95)
    assert PatchDataset.from_path(data, normal="normal").fingerprint != a


def test_mixed_sizes_stay_a_list_unless_resized(tmp_path):
    """Sides a few px apart (within SIZE_SPREAD: one field of view)."""
    for cls, side in (("A", 30), ("B", 32)):
        (tmp_path / cls).mkdir()
        Image.fromarray(np.full((side, side, 3), 100, np.uint8)).save(tmp_path / cls / "x.png")
    ds = PatchDataset.from_path(tmp_path, normal="A")
    assert isinstance(ds.images, list) and [im.shape for im in ds.images] == [
        (30, 30, 3),
        (32, 32, 3),
    ]
    ds = PatchDataset.from_path(tmp_path, normal="A", size=24)
    assert ds.images.shape == (2, 24, 24, 3)
    sub = ds.subset([1])
    assert len(sub) == 1 and sub.labels.tolist() == [1]


def test_decode_stream_keeps_order_and_positions_and_stops_decoding_when_left(
    tmp_path, monkeypatch
):
    """decode_stream (behind cyto predict and every dataset load) yields the records in order,
    each read one with its position, the unreadable ones by path when skipping, and a caller
    that leaves the loop early stops the decoding of the chunks it never asked for."""
    from cyto.data.dataset import decode_stream, one_size

    (tmp_path / "A").mkdir()
    for i in range(10):
        Image.fromarray(np.full((16, 16, 3), i, np.uint8)).save(tmp_path / "A" / f"{i}.png")
    (tmp_path / "A" / "5.png").write_bytes(b"not a png")
    records = load_records(tmp_path)
    assert [r.path.name for r in records][:3] == ["0.png", "1.png", "2.png"]
    assert one_size(records)  # the unreadable one is the decoder's to report

    with pytest.raises(UnreadableImageError, match="5.png"):
        list(decode_stream(records, chunk=3))
    parts = list(decode_stream(records, chunk=3, skip=True))
    assert [p.n for p in parts] == [3, 3, 3, 1]
    assert [i for p in parts for i in p.index] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert [int(im[0, 0, 0]) for p in parts for im in p.images] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert [path.name for p in parts for path, _ in p.skipped] == ["5.png"]

    import cyto.data.dataset as dataset

    decoded = []
    real = dataset._decode_one
    monkeypatch.setattr(dataset, "_decode_one", lambda r, size: decoded.append(r) or real(r, size))
    stream = decode_stream(records * 50, chunk=10, skip=True)  # 500 records in chunks of 10
    next(stream)
    stream.close()  # the caller leaves after one chunk
    assert len(decoded) <= 20, len(decoded)  # the chunk read and the next, no more

    Image.fromarray(np.full((17, 16, 3), 0, np.uint8)).save(tmp_path / "A" / "z.png")
    assert not one_size(load_records(tmp_path))


def test_a_dataset_is_held_once_while_it_is_read(tmp_path):
    """Loading decoded every image into a list and stacked it at the end: at the peak every
    image was held twice (the paper's 18,369 cells at 224 px: 5.5 GB instead of 2.8). They now
    go into one array as they are decoded; skipped files leave no empty row."""
    import tracemalloc

    rng = np.random.default_rng(0)
    for cls, n in (("A", 2400), ("B", 600)):
        (tmp_path / cls).mkdir()
        for i in range(n):
            cell = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(cell).save(tmp_path / cls / f"{i:04d}.png", compress_level=0)
    (tmp_path / "B" / "0000.png").write_bytes(b"not a png")
    tracemalloc.start()
    try:
        ds = PatchDataset.from_path(tmp_path, normal="A", skip_unreadable=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    held = ds.images.nbytes
    assert ds.images.shape == (2999, 64, 64, 3) and len(ds.skipped) == 1
    # a list and its stack: 2x and more; one array: 1x and the chunks being decoded
    assert peak < 1.6 * held, (peak, held)
    assert np.array_equal(ds.images[-1], read_image(tmp_path / "B" / "0599.png"))


def test_a_flat_folder_of_images_is_said_so_not_called_empty(tmp_path):
    """Hostile round 9 (N5): `cyto predict --data p/normal` (300 images, no class sub-folders)
    said "no images found in p/normal". It names the images it holds and what to do."""
    flat = tmp_path / "normal"
    flat.mkdir()
    for i in range(3):
        Image.new("RGB", (16, 16), (i, 0, 0)).save(flat / f"c{i}.png")
    with pytest.raises(InputPathError) as err:
        load_records(flat)
    said = str(err.value)
    assert said.startswith(f"{flat} holds 3 images but no class sub-folders"), said
    assert "no images found" not in said and "\n" not in said
    empty = tmp_path / "empty"
    (empty / "normal").mkdir(parents=True)  # a class folder with no image in it
    with pytest.raises(InputPathError, match="no images found in"):
        load_records(empty)


def test_an_output_file_given_a_folder_is_advised_a_name_beside_it_not_inside(tmp_path):
    """Hostile round 9 (N29): `cyto predict --data p --out p` advised "e.g. p/scores.parquet",
    which puts the table inside the input dataset."""
    from cyto.outputs_check import check_out_file

    data = tmp_path / "p"
    data.mkdir()
    with pytest.raises(InputPathError) as err:
        check_out_file(data)
    assert str(err.value).endswith(f"e.g. {tmp_path / 'p-scores.parquet'}"), str(err.value)


def _crops(root, sides: dict[str, list[int]]) -> None:
    """Class folders of plain crops: ``{"NILM": [100, 100, 300]}``, one PNG per side."""
    for cls, list_ in sides.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i, side in enumerate(list_):
            img = np.full((side, side, 3), 200, np.uint8)
            img[side // 3 : 2 * side // 3, side // 3 : 2 * side // 3] = (90, 40, 120)
            Image.fromarray(img).save(root / cls / f"c{i:02d}_{side}.png")


@settings(max_examples=20, deadline=None)
@given(
    common=st.integers(MIN_CELL_SIDE, 60),
    ratio=st.floats(0.4, 2.5),
    n_common=st.integers(2, 4),
    n_rare=st.integers(1, 2),
)
def test_crops_of_several_sizes_are_refused_naming_sizes_counts_and_a_file(
    tmp_path_factory, common, ratio, n_common, n_rare
):
    """Hostile round 18 (case 21): a folder of 100 px crops with two padded to 300 px (the same
    pixel size) was resized crop by crop to the model's input, so the padded cells measured
    nuclear area 222 -> 25 um^2 and dropped in rank, without a word. Crops whose longer sides
    differ by more than SIZE_SPREAD are refused in one line; sides within it are read."""
    from cyto.data.dataset import SIZE_SPREAD

    rare = max(MIN_CELL_SIDE, round(common * ratio))
    root = tmp_path_factory.mktemp("mixed")
    _crops(root, {"A": [common] * n_common, "B": [rare] * n_rare + [common]})
    spread = max(common, rare) / min(common, rare)
    if spread <= SIZE_SPREAD:
        assert len(PatchDataset.from_path(root, normal="A", size=24)) == n_common + n_rare + 1
        return
    with pytest.raises(DatasetError) as err:
        PatchDataset.from_path(root, normal="A", size=24)
    said = str(err.value)
    assert "\n" not in said
    assert said.startswith(
        f"{root} holds cell crops of 2 sizes ({n_common + 1} at {common} px, "
        f"{n_rare} at {rare} px; the longer side), e.g. {root / 'B' / f'c00_{rare}.png'}: "
    ), said
    assert said.endswith(
        f"centre them in one field at their own scale (cyto data field {root} --out NEW); else "
        "cut them alike, or sort them into folders by size and run each"
    ), said


def test_crops_cut_at_their_image_edge_or_a_few_px_apart_are_one_size(tmp_path):
    """A CRIC crop cut at its image's edge (100 x 46 px) is padded, never resized, and PBC's
    363 and 369 px crops span one field of view: neither is refused."""
    _crops(tmp_path, {"A": [100, 100, 103], "B": [100]})
    Image.new("RGB", (100, 46), (200, 200, 200)).save(tmp_path / "B" / "edge.png")
    assert len(PatchDataset.from_path(tmp_path, normal="A", size=32)) == 5


def test_training_on_crops_of_several_sizes_is_refused_in_one_line_cli_and_python(tmp_path):
    """`cyto train` and cyto.train read the folder through the one rule, before any training."""
    import cyto
    from tests.cli_runner import run_cyto

    data = tmp_path / "mix"
    _crops(data, {"NILM": [40] * 6, "LSIL": [40, 120]})
    first = f"{data} holds cell crops of 2 sizes (7 at 40 px, 1 at 120 px; the longer side)"
    with pytest.raises(DatasetError, match=re.escape(first)):
        cyto.train("dsvdd", data, tmp_path / "m.cyto", normal="NILM", preset="fast")
    proc = run_cyto(
        "train", "dsvdd", "--data", str(data), "--normal", "NILM", "--out",
        str(tmp_path / "m.cyto"), "--preset", "fast",
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {first}, e.g. {data / 'LSIL' / 'c01_120.png'}: ")
    assert "the 1 crop(s) of 120 px would look 3x smaller than those of 40 px" in lines[0]
    assert not (tmp_path / "m.cyto").exists()


@pytest.mark.parametrize("what", ["empty", "txt"])
def test_a_class_folder_without_images_is_said_so_not_called_an_unknown_name(tmp_path, what):
    """Hostile round 18 (case 26): `--abnormal ASC-H` where ASC-H/ is empty (or `--normal
    NILM` where NILM/ holds only a .txt) was "unknown class name(s) ASC-H in DIR": the name was
    right, the folder holds no image."""
    import cyto
    from cyto.data.dataset import one_class_split
    from tests.cli_runner import run_cyto

    _crops(tmp_path, {"LSIL": [32, 32], "NILM": [32, 32]})
    (tmp_path / "ASC-H").mkdir()
    if what == "txt":
        (tmp_path / "ASC-H" / "notes.txt").write_text("to scan")
    line = (
        f"the class folder(s) ASC-H in {tmp_path} exist but hold no image (readable types: "
        ".jpg, .jpeg, .png, .tif, .tiff, .bmp, .webp, .gif): put the class's cell crops there, "
        "or name a class that has them (LSIL, NILM)"
    )
    for call in (
        lambda: PatchDataset.from_path(tmp_path, normal="NILM", abnormal="ASC-H"),
        lambda: PatchDataset.from_path(tmp_path, normal="ASC-H"),
        lambda: one_class_split({"LSIL": 2, "NILM": 2}, "NILM", "ASC-H", tmp_path),
        lambda: cyto.train("dsvdd", tmp_path, tmp_path / "m.cyto", normal="ASC-H"),
    ):
        with pytest.raises(DatasetError) as err:
            call()
        assert str(err.value) == line
    for args in (
        ("train", "dsvdd", "--data", str(tmp_path), "--normal", "NILM", "--abnormal", "ASC-H",
         "--out", str(tmp_path / "m.cyto")),
        ("data", "info", str(tmp_path), "--normal", "NILM", "--abnormal", "ASC-H"),
    ):  # fmt: skip
        proc = run_cyto(*args)
        assert proc.stderr.strip().splitlines() == [f"error: {line}"], proc.stderr
    with pytest.raises(DatasetError, match="unknown class name"):  # a wrong name stays one
        PatchDataset.from_path(tmp_path, normal="NILLM")


def test_images_outside_the_class_folders_and_broken_links_are_said_not_dropped(tmp_path):
    """Hostile round 19: an image in a sub-folder of a class folder, one beside the class
    folders and a link whose target is gone were in no count and no unreadable list."""
    import warnings

    from cyto.data.dataset import data_info
    from cyto.errors import CytoWarning

    _crops(tmp_path, {"A": [20, 20], "B": [20]})
    (tmp_path / "A" / "sub").mkdir()
    Image.new("RGB", (20, 20)).save(tmp_path / "A" / "sub" / "nested.png")
    Image.new("RGB", (20, 20)).save(tmp_path / "loose.png")
    (tmp_path / "B" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.warns(CytoWarning) as got:
        info = data_info(tmp_path)
    (line,) = [str(w.message) for w in got if "outside its class folders" in str(w.message)]
    assert line.startswith(f"images of {tmp_path} lie outside its class folders' own files (e.g.")
    assert got[0].filename == __file__  # the caller's line, not cyto's
    assert info.n_files == 4 and [p.name for p, _ in info.unreadable] == ["gone.png"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CytoWarning)
        with pytest.raises(DatasetError, match=r"cannot read image .*gone.png: No such file"):
            PatchDataset.from_path(tmp_path, normal="A")


def test_a_crop_too_small_for_a_cell_is_unreadable_to_data_info_as_to_every_reader(tmp_path):
    """data info listed a 3 x 3 px crop as a size; train refused it as unreadable (round 19).
    A file PIL cannot identify is named by its path, not PIL's buffer (<_io.BytesIO ...>)."""
    from cyto.data.dataset import data_info
    from cyto.data.images import read_image
    from cyto.errors import UnreadableImageError

    _crops(tmp_path, {"A": [20]})
    Image.new("RGB", (3, 3)).save(tmp_path / "A" / "speck.png")
    (tmp_path / "A" / "junk.png").write_bytes(b"not an image")
    info = data_info(tmp_path)
    reasons = dict((p.name, why) for p, why in info.unreadable)
    assert reasons["speck.png"].startswith("3 x 3 px is too small to hold a cell"), reasons
    assert "3x3" not in info.sizes
    with pytest.raises(UnreadableImageError) as err:
        read_image(tmp_path / "A" / "junk.png")
    assert "BytesIO" not in str(err.value)
    assert f"cannot identify image file '{tmp_path / 'A' / 'junk.png'}'" in str(err.value)


def test_class_folders_one_level_too_high_are_said_with_the_folder_to_give(tmp_path):
    """data/train/CLASS/*.png given as data: every class folder is empty at its own level, and
    "no images found" was said of a folder of images (review of round 19)."""
    from cyto.data.dataset import load_records

    _crops(tmp_path / "train", {"A": [20], "B": [20]})
    with pytest.raises(InputPathError) as err:
        load_records(tmp_path)
    said = str(err.value)
    assert said.startswith(f"no images directly in the class sub-folders of {tmp_path}, but deeper")
    assert f"give the folder whose sub-folders hold the images ({tmp_path / 'train'})" in said


def test_a_sets_own_oblong_size_is_not_taken_for_crops_cut_at_an_edge():
    """PBC's images are 360 x 363 px: 794 of 800 were "not square (BA_26315.jpg: 360x363 px,
    cut at the edge of its image?)" (hostile round 20). Where most of a set shares one oblong
    size it is named as the set's own; a few crops of sizes of their own are asked about."""

    from cyto.data.images import oblong_words

    own = [(Path(f"{i}.jpg"), (363, 360)) for i in range(794)]
    line = oblong_words(own, 800)
    assert line == "794 of 800 images are not square (794 of them 360x363 px: the set's own size)"
    few = [(Path("edge.png"), (64, 40)), (Path("b.png"), (100, 46))]
    assert oblong_words(few, 55) == (
        "2 of 55 images are not square (edge.png: 40x64 px, cut at the edge of its image?)"
    )


def _crop(side_h: int, side_w: int, value: int = 200) -> np.ndarray:
    img = np.full((side_h, side_w, 3), value, np.uint8)
    img[side_h // 2 - 4 : side_h // 2 + 4, side_w // 2 - 4 : side_w // 2 + 4] = 40  # a nucleus
    return img


def test_crops_cut_at_an_edge_are_padded_square_without_a_load_size(tmp_path):
    """CRIC's crops cut at its images' edges (100 x 52 px) kept their shape without a load
    size, and training stacked them beside the square ones in a traceback (hostile round 57,
    1): each is padded to a square of its longer side with its edge colour, never resampled."""
    import warnings

    from cyto.train.data import TrainData

    (tmp_path / "NILM").mkdir()
    for i in range(4):
        Image.fromarray(_crop(64, 64)).save(tmp_path / "NILM" / f"{i}.png")
    Image.fromarray(_crop(64, 40)).save(tmp_path / "NILM" / "edge.png")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = PatchDataset.from_path(tmp_path, normal="NILM", workers=1)
    assert any("edge.png: 40x64 px" in str(w.message) and "padded" in str(w.message) for w in seen)
    data = TrainData.from_dataset(ds)
    assert data.images.shape == (5, 64, 64, 3)
    edge = data.images[[r.path.name for r in ds.records].index("edge.png")]
    assert (edge[:, :12] == 200).all() and (edge[:, -12:] == 200).all()  # the edge colour
    assert (edge[28:36, 28:36] == 40).all()  # the nucleus where it was, not stretched


def test_square_crops_of_near_sizes_are_one_line_for_training(tmp_path):
    """Crops within the size check's spread (64 and 62 px) reach training as several sizes:
    one line naming them and the load size, not numpy's "inhomogeneous shape" ValueError."""
    from cyto.train.data import TrainData

    (tmp_path / "NILM").mkdir()
    for i, side in enumerate((64, 64, 62)):
        Image.fromarray(_crop(side, side)).save(tmp_path / "NILM" / f"{i}.png")
    ds = PatchDataset.from_path(tmp_path, normal="NILM", workers=1)
    words = (
        r"share one size \(they are 62x62, 64x64 px, crops cut at an edge padded square\): "
        r"pass a load size \(--set load_size=64\)"
    )
    with pytest.raises(DatasetError, match=words):
        TrainData.from_dataset(ds)


def test_cyto_warns_only_through_warn_caller_so_every_warning_points_at_the_users_line():
    """A fixed ``stacklevel`` points into cyto whenever the path to the warning is one frame
    longer or shorter (hostile round 20: ``cyto.predict``'s scale and stain warnings were
    attributed to ``cyto/api.py:479``, its crop-side warning to the caller, so a filter by
    module caught one and not the other). Every warning of ``src/cyto`` goes through
    :func:`cyto.errors.warn_caller`, which walks out of the package."""
    import ast

    src = Path(__file__).resolve().parents[2] / "src" / "cyto"
    fixed = []
    for path in sorted(src.rglob("*.py")):
        if path == src / "errors.py":
            continue  # warn_caller itself
        for node in ast.walk(ast.parse(path.read_text())):
            f = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "warn"
                and getattr(f.value, "id", None) == "warnings"
            ):
                fixed.append(f"{path.relative_to(src)}:{node.lineno}")
    assert fixed == [], fixed


def test_every_library_call_hands_its_echo_on_through_one_rule():
    """A library call's ``warning:`` lines are ``CytoWarning``s at the caller's line whatever
    ``echo`` is (hostile round 21: ``cyto.score_slide`` with ``echo=None`` lost its scale and
    adequacy warnings; ``cyto.train``'s and ``cyto.export``'s went only to ``echo``). Every
    ``echo=`` that ``cyto/api.py`` hands to a command's code is :func:`cyto.api._said`'s, and
    the rule warns ``warning:`` lines and passes every other line on."""
    import ast
    import warnings

    from cyto.api import _said
    from cyto.errors import CytoWarning

    api = Path(__file__).resolve().parents[2] / "src" / "cyto" / "api.py"
    handed = []
    for node in ast.walk(ast.parse(api.read_text())):
        for kw in node.keywords if isinstance(node, ast.Call) else ():
            if kw.arg == "echo":
                handed.append(ast.unparse(kw.value))
    # _said(echo) or _said(echo, notes) (synth_slide keeps its notes for its answer too)
    ruled = {h for h in handed if h == "words" or re.fullmatch(r"_said\(echo(, \w+)?\)", h)}
    assert handed and set(handed) == ruled, handed
    lines: list[str] = []
    rng = np.random.default_rng(0)
    for echo in (lines.append, None):
        for _ in range(20):
            text = "".join(rng.choice(list("ab :-warning"), size=int(rng.integers(1, 20))))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _said(echo)(f"warning: {text}")
                _said(echo)(text if not text.startswith("warning: ") else "note")
            (w,) = caught
            assert w.category is CytoWarning and str(w.message) == text
            assert w.filename == __file__
    assert len(lines) == 20 and not any(ln.startswith("warning: ") for ln in lines)
    # a line that knows its category is warned in it (a slide's scale lines: ScaleWarning)
    from cyto.errors import ScaleWarning, StainWarning, WarningLine

    for kind in (ScaleWarning, StainWarning, CytoWarning):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _said(None)(WarningLine("warning: look 2x smaller", kind))
        (w,) = caught
        assert w.category is kind and str(w.message) == "look 2x smaller"


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_a_wholly_transparent_crop_holds_no_cell_to_every_reader(tmp_path, mode):
    """Hostile round 21 (case 3.5): crops whose every pixel is transparent were composited onto
    white and scored and ranked without a word. They are unreadable, with why, to the decoder
    (train, predict: ``--skip-unreadable`` leaves them out, counted) and to ``cyto data
    info`` alike; a crop transparent only in part (a cut-out cell) is read as before."""
    from cyto.data.dataset import data_info
    from cyto.data.images import read_image
    from cyto.errors import UnreadableImageError

    rng = np.random.default_rng(len(mode))
    _crops(tmp_path, {"A": [40, 40]})
    rgba = rng.integers(0, 256, (40, 40, 4), dtype=np.uint8)
    for name, alpha in (("none.png", 0), ("part.png", None)):
        a = rgba.copy()
        if alpha is None:
            a[..., 3] = 0
            a[10:30, 10:30, 3] = 255  # an opaque cell amid transparent pixels
        else:
            a[..., 3] = alpha
        im = Image.fromarray(a, "RGBA")
        if mode == "LA":
            im = im.convert("LA")
        elif mode == "P":  # a palette whose transparent entry is every pixel's (or not)
            pal = im.convert("RGB").quantize(8)
            idx = np.asarray(pal).copy()
            idx[a[..., 3] == 0] = 8
            im = Image.fromarray(idx, "P")
            im.putpalette(pal.getpalette()[:24] + [255, 255, 255])
            im.info["transparency"] = 8
        im.save(tmp_path / "A" / name, transparency=8) if mode == "P" else im.save(
            tmp_path / "A" / name
        )
    with pytest.raises(UnreadableImageError, match="0 of its pixels are at least half opaque"):
        read_image(tmp_path / "A" / "none.png")
    assert read_image(tmp_path / "A" / "part.png").shape == (40, 40, 3)
    reasons = dict((p.name, why) for p, why in data_info(tmp_path).unreadable)
    assert list(reasons) == ["none.png"], reasons
    assert (
        "0 of its pixels are at least half opaque (a cell takes at least 64): the rest is (nearly) "
        "transparent, so "
        "it shows no cell" in reasons["none.png"]
    )


@pytest.mark.parametrize(
    "variant", ["alpha1", "one_pixel", "rgb_key", "grey_key", "grey16_key", "bilevel_key"]
)
def test_a_crop_all_but_transparent_holds_no_cell_either(tmp_path, variant):
    """Hostile round 23 (6.5, 6.6): alpha 1 everywhere, alpha 0 but for one opaque pixel, and an
    RGB or grey PNG whose colour key makes every pixel transparent were still scored (the RGB
    one a flat pink square ranked most abnormal). Fewer opaque pixels than the smallest
    crop's holds no cell, to the decoder and to data info."""
    from cyto.data.dataset import data_info
    from cyto.data.images import read_image
    from cyto.errors import UnreadableImageError

    (tmp_path / "A").mkdir()
    path = tmp_path / "A" / "x.png"
    rgb = np.random.default_rng(3).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    if variant in ("alpha1", "one_pixel"):
        alpha = np.full((40, 40, 1), 1 if variant == "alpha1" else 0, np.uint8)
        alpha[20, 20] = 255
        Image.fromarray(np.concatenate([rgb, alpha], axis=2), "RGBA").save(path)
    elif variant == "rgb_key":
        Image.new("RGB", (40, 40), (250, 200, 210)).save(path, transparency=(250, 200, 210))
    elif variant == "grey16_key":  # round 24: a 16-bit grey PNG's colour key
        Image.fromarray(np.full((40, 40), 5000, np.uint16)).save(path, transparency=5000)
    elif variant == "bilevel_key":
        Image.new("1", (40, 40), 1).save(path, transparency=1)
    else:
        Image.new("L", (40, 40), 200).save(path, transparency=200)
    with pytest.raises(UnreadableImageError, match="of its pixels are at least half opaque"):
        read_image(path)
    assert [p.name for p, _ in data_info(tmp_path).unreadable] == ["x.png"]


@pytest.mark.parametrize("suffix", [".webp", ".gif"])
def test_webp_and_gif_crops_are_read_as_cells_not_left_out(tmp_path, suffix):
    """Hostile round 23 (6.6): WebP and GIF crops in a class folder were left out without a
    count (not among the image types), so a folder of them was "no images". They are cells
    like PNG crops; a GIF whose transparent index covers it shows no cell."""
    from cyto.data.dataset import PatchDataset, data_info
    from cyto.data.images import read_image

    (tmp_path / "A").mkdir()
    rgb = np.random.default_rng(4).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    for i in range(3):
        Image.fromarray(rgb).save(tmp_path / "A" / f"c{i}{suffix}")
    info = data_info(tmp_path)
    assert info.classes == {"A": 3} and not info.unreadable, info
    assert len(PatchDataset.from_path(tmp_path, normal="A")) == 3
    assert read_image(tmp_path / "A" / f"c0{suffix}").shape == (40, 40, 3)
    if suffix == ".gif":
        Image.new("P", (40, 40), 0).save(tmp_path / "A" / "blank.gif", transparency=0)
        assert [p.name for p, _ in data_info(tmp_path).unreadable] == ["blank.gif"]


@pytest.mark.parametrize("fmt", ["GIF", "TIFF", "WEBP", "PNG"])
def test_a_crop_of_several_frames_is_no_one_cell_to_any_reader(tmp_path, fmt):
    """Hostile round 24: an animated GIF crop was read from its first frame only, unsaid (the
    cell might be any frame). A crop of several frames (animated GIF, WebP or PNG, a multi-page
    TIFF) is unreadable with why to the decoder (train, predict: ``--skip-unreadable`` leaves it
    out, counted) and to ``cyto data info``; a file of one frame is read as before."""
    from cyto.data.dataset import data_info
    from cyto.data.images import read_image
    from cyto.errors import UnreadableImageError

    (tmp_path / "A").mkdir()
    rng = np.random.default_rng(5)
    frames = [Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)) for _ in range(3)]
    suffix = {"GIF": ".gif", "TIFF": ".tif", "WEBP": ".webp", "PNG": ".png"}[fmt]
    many, one = tmp_path / "A" / f"many{suffix}", tmp_path / "A" / f"one{suffix}"
    frames[0].save(many, format=fmt, save_all=True, append_images=frames[1:])
    frames[1].save(one, format=fmt)
    with pytest.raises(UnreadableImageError, match="it holds 3 frames") as err:
        read_image(many)
    assert "save the cell's frame as an image of its own" in str(err.value)
    assert read_image(one).shape == (40, 40, 3)
    assert [p.name for p, _ in data_info(tmp_path).unreadable] == [many.name]


def test_images_of_a_type_not_read_as_cells_are_said_not_left_out_unsaid(tmp_path):
    """Hostile round 24: .jp2, .tga, .ppm and .jfif crops in a class folder were left out
    without a count. They are said once, by type, with what to do; other files (notes, a
    hidden file) are not images and stay unsaid."""
    import warnings

    from cyto.data.dataset import load_records
    from cyto.errors import CytoWarning

    _crops(tmp_path, {"A": [20, 20]})
    for name in ("x.ppm", "y.tga", "z.jfif"):
        kind = {"z.jfif": "JPEG"}.get(name)
        Image.new("RGB", (20, 20), (120, 90, 160)).save(tmp_path / "A" / name, format=kind)
    (tmp_path / "A" / "notes.txt").write_text("scanned 2026")
    (tmp_path / "A" / ".DS_Store").write_bytes(b"\0")
    with pytest.warns(CytoWarning) as got:
        records = load_records(tmp_path)
    assert len(records) == 2
    (line,) = [str(w.message) for w in got if "not read as cells" in str(w.message)]
    assert line.startswith(
        f"3 file(s) in the class folders of {tmp_path} are images of a type cyto does not read "
        "as cells (.jfif, .ppm, .tga; e.g. "
    ), line
    assert "convert them to one of .jpg" in line and got[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a folder of crops and notes alone: nothing said
        for name in ("x.ppm", "y.tga", "z.jfif"):
            (tmp_path / "A" / name).unlink()
        assert len(load_records(tmp_path)) == 2


@given(st.text(min_size=1, max_size=12))
def test_a_class_named_in_another_case_accent_or_unicode_form_is_offered(name):
    """Hostile round 33 (12): "LSIL e grade" for the folder "LSIL é grade" got no "did you
    mean" (a case slip did); nor would a name typed composed for a folder named on a Mac
    (decomposed). Any spelling equal but for case, accents or Unicode form is offered."""
    import unicodedata

    from cyto.data.dataset import case_hint, shown_class

    offered = f" (did you mean {shown_class(name)}?)"
    bare = "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))
    for typed in (name.upper(), name.casefold(), unicodedata.normalize("NFD", name), bare):
        if typed != name:
            assert case_hint(typed, [name]).startswith(offered[:-1]), typed
    assert case_hint("LSIL e grade", ["LSIL é grade", "NILM"]) == " (did you mean LSIL é grade?)"
    assert case_hint("LSIL  é grade", ["LSIL é grade"]) == " (did you mean LSIL é grade?)"
    assert case_hint("HSIL", ["LSIL é grade", "NILM"]) == ""
    # told apart by the Unicode form alone, it looks the same on screen: said so (round 34, 5)
    typed = unicodedata.normalize("NFC", "LSIL é grade")
    hint = case_hint(typed, [unicodedata.normalize("NFD", typed)])
    assert "the same letters in another Unicode form" in hint, hint


@settings(max_examples=25, deadline=None)
@given(
    depth=st.sampled_from([8, 10, 12, 14, 16]),
    fmt=st.sampled_from([".png", ".tif"]),
    alpha=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_16_bit_colour_crops_are_read_by_the_bits_their_values_take(depth, fmt, alpha, seed):
    """A 12-bit camera's crops saved as 16-bit colour (values 0-4095) were read by their top
    byte: nearly black (a maximum of 15), with no word, and a model "told" NILM from LSIL by it
    (hostile round 50, 1). Any 8-bit crop saved at a camera's depth in a 16-bit colour PNG or
    TIFF (white at the depth's top), opaque or not, reads back as itself, and is
    said (its depth) in the one line of modes."""
    import tempfile

    import cv2

    from cyto.data.images import mode_words, read_image

    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    rgb[0, 0] = 255  # the glass
    deep = np.rint(rgb * ((2.0**depth - 1) / 255)).astype(np.uint16)  # the depth's full scale
    if alpha:
        deep = np.concatenate([deep, np.full((24, 24, 1), 65535, np.uint16)], axis=2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"c{fmt}"
        assert cv2.imwrite(str(path), deep[..., [2, 1, 0, 3][: deep.shape[2]]])
        notes: list = []
        got = read_image(path, notes)
    assert np.array_equal(got, rgb)
    assert notes == [(path, f"RGB;16, {depth}-bit values")]
    said = mode_words(notes, 3)
    assert said.startswith(f"1 of 3 images are colour of 16 bits a channel (c{fmt}: RGB;16, ")
    assert f"({depth}-bit values), not by their top byte" in said


@given(
    name=st.text(st.characters(categories=["Lu", "Nd"]), min_size=1, max_size=8),
    before=st.sampled_from(["", " ", "  "]),
    after=st.sampled_from(["", " ", "\t"]),
)
def test_a_class_folder_whose_name_begins_or_ends_in_a_space_is_said_so(name, before, after):
    """A folder ``NILM `` (a trailing space) answered ``--normal NILM`` with "did you mean
    NILM ?", the name the user had typed (hostile round 50, 3): the folder's name is quoted
    where a space begins or ends it, the hint says which, and so does the list of classes."""
    import tempfile

    from cyto.data.dataset import resolve_classes
    from cyto.errors import DatasetError

    folder = f"{before}{name}{after}"
    if folder == name:
        return
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / folder).mkdir()
        (Path(tmp) / "OTHER").mkdir()
        with pytest.raises(DatasetError) as err:
            resolve_classes([folder, "OTHER"], name, None, Path(tmp))
    said = str(err.value)
    edge = "begins and ends" if before and after else "begins" if before else "ends"
    shown = "'" + folder.replace("\t", "\\t") + "'"  # a tab seen, not blank
    assert f"(did you mean {shown}? the folder's name {edge} with a space or tab" in said, said
    assert shown in said.split("; classes there: ")[1], said  # the list quotes it too
    # a folder beside its twin without the space: both shown, the difference named (round 51)
    with pytest.raises(DatasetError) as err:
        from cyto.data.dataset import _refuse_case_twins

        _refuse_case_twins("class folders {} of X", {name, folder})
    assert f"{name} and {shown}" in str(err.value) or f"{shown} and {name}" in str(err.value)
    assert "differ only in spaces at an end" in str(err.value)


def _png_grey_alpha_16(path: Path, grey: np.ndarray, alpha: np.ndarray) -> None:
    """A 16-bit grey-and-alpha PNG (colour type 4), which neither PIL nor OpenCV writes."""
    import struct
    import zlib

    rows = np.dstack([grey, alpha]).astype(">u2")
    raw = b"".join(b"\0" + row.tobytes() for row in rows)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    head = struct.pack(">IIBBBBB", grey.shape[1], grey.shape[0], 16, 4, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )  # fmt: skip


def test_a_16_bit_grey_crop_with_alpha_is_read_by_its_bits_and_said_grey(tmp_path):
    """PIL opens a 16-bit grey-and-alpha PNG as RGBA of its top bytes: a 12-bit camera's such
    crop was read nearly black (a maximum of 15) with no word, its nucleus measured 5x too
    large (hostile round 51, 1). It reads as the 8-bit crop it holds, said as 16-bit grey."""
    from cyto.data.dataset import data_info
    from cyto.data.images import mode_words, read_image

    grey = np.random.default_rng(5).integers(0, 256, (24, 24), dtype=np.uint8)
    grey[0, 0] = 255
    (tmp_path / "A").mkdir()
    path = tmp_path / "A" / "c.png"
    _png_grey_alpha_16(path, np.rint(grey * (4095 / 255)), np.full((24, 24), 65535))
    notes: list = []
    got = read_image(path, notes)
    assert np.array_equal(got, np.repeat(grey[..., None], 3, axis=2))
    assert notes == [(path, "LA;16")]
    assert mode_words(notes, 2).startswith("1 of 2 images are 16-bit grayscale (c.png: mode LA;")
    assert data_info(tmp_path).modes == {"LA;16": 1}


def test_colour_crops_read_at_several_depths_are_told_to_be_converted_by_their_cameras():
    """Each 16-bit crop's depth is read from its own values: a dim 12-bit crop (brightest at
    1020) read as 10-bit, 4x brighter than its neighbour at 1030 (hostile round 51, 4). Where
    a set's crops read at several depths, the line says so and what to do."""
    from cyto.data.images import mode_words

    one = [(Path("a.png"), "RGB;16, 12-bit values"), (Path("b.png"), "RGB;16, 12-bit values")]
    two = [*one, (Path("c.png"), "RGB;16, 10-bit values")]
    assert "one depth" not in mode_words(one, 3)
    said = mode_words(two, 3)
    assert "(10-bit values or 12-bit values), not by their top byte; images of one camera " in said
    assert said.endswith("convert them to 8 bits by it yourself")
