"""DICOM whole-slide images: a slide is the folder of its .dcm instances, read by OpenSlide 4.

The slides here are written by ``tests/dicom_wsi.py`` (pydicom, uncompressed tiles) from a
synthetic TIFF's own levels, so the DICOM slide holds the TIFF's pixels exactly and cyto must
give the same cells and scores for both."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import InputPathError, UnsupportedSlideError
from cyto.slides import open_slide, slide_files
from cyto.slides.dicom import WSI_SOP_CLASS, reads_dicom, series_of
from tests.cli_runner import run_cyto
from tests.dicom_wsi import write_dicom_wsi
from tests.tables import same_table

pytest.importorskip("pydicom")


def _openslide_4() -> bool:
    try:
        import openslide

        return reads_dicom(openslide)
    except (ImportError, OSError):
        return False


needs_openslide_4 = pytest.mark.skipif(
    not _openslide_4(), reason="needs openslide-python over OpenSlide 4 (openslide-bin)"
)


@pytest.fixture(scope="module")
def tiff_and_levels(tmp_path_factory):
    root = tmp_path_factory.mktemp("dicom")
    res = write_slide(root / "s.tif", SlideSynthConfig(width=1024, height=768, seed=11))
    reader = open_slide(res.paths[0])
    levels = [
        reader.read_region(0, 0, w, h, level=i) for i, (w, h) in enumerate(reader.info.level_dims)
    ]
    mpp = reader.info.mpp
    reader.close()
    return res.paths[0], levels, mpp


@pytest.fixture
def dicom_slide(tiff_and_levels, tmp_path) -> Path:
    _, levels, mpp = tiff_and_levels
    write_dicom_wsi(tmp_path / "case-7", levels, mpp, tile=256)
    return tmp_path / "case-7"


def _dataset(
    path: Path, *, implicit: bool = False, referenced: str | None = None, private_un: bool = False
):
    """A small DICOM file of the WSI class; ``referenced``: a Referenced Series Sequence (of
    undefined length) naming another series before the file's own Series Instance UID;
    ``private_un``: a private sequence of VR UN and undefined length (its items implicit VR,
    as scanners' private tags often come) holding another Series Instance UID."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = WSI_SOP_CLASS
    meta.MediaStorageSOPInstanceUID = "1.2.3.4"
    meta.TransferSyntaxUID = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = WSI_SOP_CLASS, "1.2.3.4"
    if referenced:
        item = Dataset()
        item.SeriesInstanceUID = referenced
        ds.ReferencedSeriesSequence = [item]
        ds["ReferencedSeriesSequence"].is_undefined_length = True
    ds.SeriesInstanceUID = "1.2.3.99"
    ds.Rows = ds.Columns = 1
    ds.save_as(path, enforce_file_format=True, implicit_vr=implicit, little_endian=True)
    if private_un:  # (0009,1010) UN, undefined length, one item holding (0020,000E) implicit
        uid = b"1.2.3.77\0"
        inner = struct.pack("<HHI", 0x0020, 0x000E, len(uid)) + uid
        item = struct.pack("<HHI", 0xFFFE, 0xE000, 0xFFFFFFFF) + inner
        item += struct.pack("<HHI", 0xFFFE, 0xE00D, 0)
        seq = struct.pack("<HH", 0x0009, 0x1010) + b"UN\0\0" + struct.pack("<I", 0xFFFFFFFF)
        seq += item + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0)
        raw = path.read_bytes()
        at = raw.index(struct.pack("<HH", 0x0020, 0x000E))  # the file's own, after group 8
        path.write_bytes(raw[:at] + seq + raw[at:])
    return path


def test_the_series_is_read_from_the_header_in_either_syntax_past_nested_uids(
    tmp_path, monkeypatch
):
    assert series_of(_dataset(tmp_path / "e.dcm")) == (WSI_SOP_CLASS, "1.2.3.99")
    assert series_of(_dataset(tmp_path / "i.dcm", implicit=True)) == (WSI_SOP_CLASS, "1.2.3.99")
    # a referenced series inside a sequence is not the file's own
    nested = _dataset(tmp_path / "r.dcm", referenced="1.2.3.55")
    assert series_of(nested) == (WSI_SOP_CLASS, "1.2.3.99")
    private = _dataset(tmp_path / "p.dcm", private_un=True)
    assert series_of(private) == (WSI_SOP_CLASS, "1.2.3.99")
    # 100 kB of private data before the series: found past the first read
    big = _dataset(tmp_path / "b.dcm")
    raw = big.read_bytes()
    at = raw.index(struct.pack("<HH", 0x0020, 0x000E))
    blob = struct.pack("<HH", 0x0009, 0x1011) + b"OB\0\0" + struct.pack("<I", 100_000)
    big.write_bytes(raw[:at] + blob + b"\1" * 100_000 + raw[at:])
    assert series_of(big) == (WSI_SOP_CLASS, "1.2.3.99")
    # asked again unchanged: answered without reading the file; changed: read again
    import cyto.slides.dicom as dicom_module

    reads = []
    real = dicom_module._read_series
    monkeypatch.setattr(dicom_module, "_read_series", lambda p: reads.append(p) or real(p))
    for _ in range(3):
        assert series_of(nested) == (WSI_SOP_CLASS, "1.2.3.99")
    assert reads == []
    _dataset(nested, referenced="1.2.3.56")
    os.utime(nested, ns=(1, 1))  # another time of change, as a rewrite gives
    assert series_of(nested) == (WSI_SOP_CLASS, "1.2.3.99") and reads == [nested]
    (tmp_path / "x.dcm").write_bytes(b"\0" * 200)  # no DICM marker
    assert series_of(tmp_path / "x.dcm") is None
    (tmp_path / "t.dcm").write_bytes((tmp_path / "e.dcm").read_bytes()[:140])  # truncated
    assert series_of(tmp_path / "t.dcm") is None


@needs_openslide_4
def test_a_dicom_folder_reads_as_the_slide_it_was_written_from(tiff_and_levels, dicom_slide):
    _, levels, mpp = tiff_and_levels
    for given in (dicom_slide, dicom_slide / "level-1.dcm"):  # the folder, or any instance
        reader = open_slide(given)
        try:
            info = reader.info
            assert (info.backend, info.vendor) == ("openslide", "dicom")
            assert info.path == given
            assert info.level_dims == tuple((a.shape[1], a.shape[0]) for a in levels)
            assert info.mpp == pytest.approx(mpp, rel=1e-6)
            for i, want in enumerate(levels):
                got = reader.read_region(0, 0, want.shape[1], want.shape[0], level=i)
                np.testing.assert_array_equal(got, want)
        finally:
            reader.close()
    # given in a folder of slides, the DICOM folder is one slide among the files
    assert slide_files([dicom_slide]) == [dicom_slide]
    # files without a suffix, as DICOM exports often name them, are the same slide
    bare = dicom_slide.parent / "bare"
    bare.mkdir()
    for f in dicom_slide.iterdir():
        shutil.copy(f, bare / f.stem.replace("level-", "IM000"))
    for given in (bare, bare / "IM0001"):
        reader = open_slide(given)
        assert reader.info.level_dims == tuple((a.shape[1], a.shape[0]) for a in levels)
        np.testing.assert_array_equal(reader.read_region(0, 0, 64, 64), levels[0][:64, :64])
        reader.close()
    # the folder above the slides' folders: each DICOM slide in it, one level down
    assert slide_files([dicom_slide.parent]) == [bare, dicom_slide]
    # the GPU decode and the focal-plane search leave a DICOM slide to OpenSlide, saying so
    from cyto.slides.device import open_device_tiles
    from cyto.slides.planes import find_planes

    assert open_device_tiles(dicom_slide) == (None, "DICOM (OpenSlide's reader): CPU readers")
    assert find_planes(dicom_slide, "auto") == []
    from cyto.doctor import slide_checks

    formats = next(c for c in slide_checks() if c.item == "formats")
    assert "DICOM WSI" in formats.detail


def test_a_folder_of_two_series_or_none_is_refused_in_one_line(tiff_and_levels, tmp_path):
    _, levels, mpp = tiff_and_levels
    both = tmp_path / "both"
    write_dicom_wsi(both / "a", levels[:1], mpp)
    write_dicom_wsi(both / "b", levels[:1], mpp)
    shutil.move(both / "b" / "level-0.dcm", both / "a" / "other.dcm")
    with pytest.raises(InputPathError, match="holds 2 DICOM whole slides.*its own folder"):
        slide_files([both / "a"])
    with pytest.raises(InputPathError, match="holds 2 DICOM whole slides"):
        open_slide(both / "a")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.dcm").write_bytes(b"not dicom")
    with pytest.raises(InputPathError, match="without a DICOM whole-slide image"):
        open_slide(tmp_path / "junk")
    with pytest.raises(UnsupportedSlideError, match="x.dcm: not a DICOM whole-slide image"):
        open_slide(tmp_path / "junk" / "x.dcm")
    # other DICOM objects beside slide files are not slides: the files are scored alone
    shutil.copy(tiff_and_levels[0], tmp_path / "junk" / "s.tif")
    assert slide_files([tmp_path / "junk"]) == [tmp_path / "junk" / "s.tif"]


@needs_openslide_4
def test_cyto_score_on_a_dicom_folder_gives_the_tiffs_table_and_resumes_by_content(
    tiff_and_levels, dicom_slide, exported_dsvdd, tmp_path
):
    tiff, levels, mpp = tiff_and_levels
    args = ("--model", str(exported_dsvdd), "--workers", "0", "--mosaic", "0")
    ref = run_cyto("score", str(tiff), "--out", str(tmp_path / "t"), *args)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    got = run_cyto("score", str(dicom_slide), "--out", str(tmp_path / "d"), *args)
    assert got.returncode == 0, got.stdout + got.stderr
    a = pq.read_table(tmp_path / "d" / "case-7" / "scores.parquet")  # named by its folder
    b = pq.read_table(tmp_path / "t" / "s" / "scores.parquet")
    assert a.num_rows > 20
    assert set(a.column("slide_id").to_pylist()) == {"case-7"}
    # the same cells and values; lengths in um within 1e-8: DICOM writes the pixel size as a
    # decimal string of at most 16 characters (this one 10 significant digits)
    assert same_table(a.drop(["slide_id"]), b.drop(["slide_id"]), rtol=1e-8)
    meta = a.schema.metadata
    size = sum(f.stat().st_size for f in dicom_slide.glob("*.dcm"))
    assert int(meta[b"cyto.slide_bytes"]) == size  # the instances', not the folder entry's

    again = run_cyto("score", str(dicom_slide), "--out", str(tmp_path / "d"), "--resume", *args)
    assert "already scored" in again.stdout, again.stdout
    # an instance rewritten in the same series (other pixels): the slide is not the one scored
    other = [np.ascontiguousarray(lv[::-1]) for lv in levels]
    series = series_of(dicom_slide / "level-0.dcm")[1]
    write_dicom_wsi(tmp_path / "x", other, mpp, tile=256, series_uid=series)
    shutil.copy(tmp_path / "x" / "level-1.dcm", dicom_slide / "level-1.dcm")
    changed = run_cyto("score", str(dicom_slide), "--out", str(tmp_path / "d"), "--resume", *args)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "already scored" not in changed.stdout, changed.stdout
