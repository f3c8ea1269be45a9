"""DICOMweb: the series of one slide read from a real Orthanc with its DICOMweb plugin
(tests/servers.py starts it on loopback), frame by frame, without a local copy. The series is
the DICOM folder of tests/integration/test_dicom.py uploaded as it is, so cyto must give the
folder's pixels and the folder's score table."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import InputPathError, UnsupportedSlideError
from cyto.slides import open_slide, slide_files
from cyto.slides.dicom import reads_dicom
from cyto.slides.remote import forget, slide_ref
from tests.cli_runner import run_cyto
from tests.dicom_wsi import write_dicom_wsi
from tests.servers import fault_server, orthanc
from tests.tables import same_table

pydicom = pytest.importorskip("pydicom")


def _openslide_4() -> bool:
    try:
        import openslide

        return reads_dicom(openslide)
    except (ImportError, OSError):
        return False


needs_openslide_4 = pytest.mark.skipif(
    not _openslide_4(), reason="needs openslide-python over OpenSlide 4 (openslide-bin)"
)


def _secondary_capture(path: Path, study: str) -> Path:
    """A small Secondary Capture image (not a whole slide) in ``study``, its own series."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = study, generate_uid()
    ds.Modality, ds.PatientName, ds.PatientID = "OT", "Test^Cyto", "cyto-1"
    ds.Rows = ds.Columns = 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit, ds.PixelRepresentation = 7, 0
    ds.PixelData = bytes(64)
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(DICOM folder, its dicomweb+http URL in Orthanc, the URL of a series that is not a
    slide, the level arrays, the server)."""
    root = tmp_path_factory.mktemp("dicomweb")
    res = write_slide(root / "s.tif", SlideSynthConfig(width=1024, height=768, seed=11))
    reader = open_slide(res.paths[0])
    levels = [
        reader.read_region(0, 0, w, h, level=i) for i, (w, h) in enumerate(reader.info.level_dims)
    ]
    mpp = reader.info.mpp
    reader.close()
    folder = root / "case-7"
    files = write_dicom_wsi(folder, levels, mpp, tile=256)
    first = pydicom.dcmread(files[0], stop_before_pixels=True)
    study, series = first.StudyInstanceUID, first.SeriesInstanceUID
    other = _secondary_capture(root / "sc.dcm", study)
    with orthanc(root / "orthanc", [*files, other]) as server:
        base = f"dicomweb+{server.dicomweb}/studies/{study}"
        non_slide = pydicom.dcmread(other, stop_before_pixels=True).SeriesInstanceUID
        yield folder, f"{base}/series/{series}", f"{base}/series/{non_slide}", levels, server


def test_a_dicomweb_series_reads_as_its_files(served):
    """Every level read from Orthanc is the written pixels, bit for bit, with the local
    folder's geometry; each tile is fetched once (one request per region of missing tiles)."""
    folder, url, _, levels, _ = served
    forget(slide_ref(url))
    reader = open_slide(url)
    try:
        info = reader.info
        assert (info.backend, info.vendor) == ("dicomweb", "dicom")
        assert str(info.path) == url
        assert info.level_dims == tuple((a.shape[1], a.shape[0]) for a in levels)
        for i, want in enumerate(levels):
            h, w = want.shape[:2]
            got = reader.read_region(-3, -5, w + 7, h + 9, level=i)
            assert np.all(got[:5] == 255) and np.all(got[:, :3] == 255)
            np.testing.assert_array_equal(got[5 : 5 + h, 3 : 3 + w], want)
        series = reader.series
        tiles = sum(lv.across * lv.down for lv in series.levels)
        raw = sum(lv.across * lv.down * lv.tile_w * lv.tile_h * 3 for lv in series.levels)
        requests, fetched = series.requests, series.fetched_bytes
        for i, want in enumerate(levels):  # again: from the tile cache, nothing fetched
            reader.read_region(0, 0, want.shape[1], want.shape[0], level=i)
        assert (series.requests, series.fetched_bytes) == (requests, fetched)
        assert requests == 1 + len(levels)  # the metadata, then one per level
        assert raw <= fetched <= 1.1 * raw + 20_000, (fetched, raw, tiles)
    finally:
        reader.close()
    if _openslide_4():  # the local folder, read by OpenSlide: the same slide
        local = open_slide(folder)
        try:
            assert local.info.level_dims == info.level_dims
            assert local.info.level_downsamples == info.level_downsamples
            assert local.info.mpp == pytest.approx(info.mpp, rel=1e-12)
        finally:
            local.close()
    assert slide_files([url]) == [slide_ref(url)]  # one slide, never a prefix


def test_read_ahead_fetches_the_frames_the_reads_need_once(served, tmp_path, monkeypatch):
    """Read-ahead over level 0's tile regions (cyto.slides.ahead) fetches their frames into the
    shared folder, each once; the reads that follow ask the server nothing, and give the
    written pixels. A second reader of the series (a tile worker: an empty tile cache of its
    own) takes the frames from the shared folder, not the server."""
    from cyto.slides.ahead import read_ahead
    from cyto.slides.dicomweb import DicomWebSeries
    from cyto.slides.remote import drop_blocks

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path))
    _, url, _, levels, _ = served
    ref = slide_ref(url)
    forget(ref)
    reader = open_slide(url)
    series = reader.series
    h, w = levels[0].shape[:2]
    regions = [(x - 40, y - 40, 336, 336) for y in range(0, h, 256) for x in range(0, w, 256)]
    regions = regions[: len(regions) // 2]
    try:
        shared = series.shared()
        held = sorted(p.name for p in shared.iterdir())
        assert not held, (shared, held)  # a folder of this test's cache: nothing shared yet
        before = (series.requests, series.fetched_bytes)
        ahead = read_ahead(ref, regions)
        deadline = time.monotonic() + 30
        while ahead.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not ahead.running and ahead.failed is None
        lv = series.levels[0]
        frames = {t for r in regions for t in ahead._source.units(r)}
        frame_bytes = len(frames) * lv.tile_w * lv.tile_h * 3
        fetched = series.fetched_bytes - before[1]
        why = (fetched, frame_bytes, ahead.fetched_bytes, ahead.regions_fetched, len(regions))
        assert frame_bytes <= fetched <= 1.1 * frame_bytes, why
        assert len(frames) < lv.across * lv.down  # only the regions' frames
        after = (series.requests, series.fetched_bytes)
        for x, y, rw, rh in regions:
            got = reader.read_region(x, y, rw, rh)
            x0, y0 = max(x, 0), max(y, 0)
            want = levels[0][y0 : y + rh, x0 : x + rw]
            np.testing.assert_array_equal(
                got[y0 - y : y0 - y + want.shape[0], x0 - x : x0 - x + want.shape[1]], want
            )
        assert (series.requests, series.fetched_bytes) == after
        worker = DicomWebSeries(ref)  # another process's series: its own tile cache
        metadata = worker.requests
        worker.tiles(0, sorted(frames))
        assert worker.requests == metadata
    finally:
        reader.close()
        drop_blocks(ref)
        forget(ref)


@needs_openslide_4
def test_jpeg_frames_read_over_dicomweb_are_the_local_files_pixels(served, tmp_path):
    """A series of baseline JPEG frames (YCbCr 4:2:2, quality 90) in Orthanc: every level read over
    DICOMweb (the stored JPEG frames, decoded by Pillow) is the same folder read locally by
    OpenSlide (its libjpeg), pixel for pixel; both are within JPEG's loss of the pixels
    written."""
    _, _, _, levels, server = served
    folder = tmp_path / "jpeg"
    files = write_dicom_wsi(folder, levels, 0.25, tile=256, jpeg_quality=90)
    server.upload(files)
    first = pydicom.dcmread(files[0], stop_before_pixels=True)
    assert first.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.50"
    url = (
        f"dicomweb+{server.dicomweb}/studies/{first.StudyInstanceUID}"
        f"/series/{first.SeriesInstanceUID}"
    )
    remote, local = open_slide(url), open_slide(folder)
    try:
        assert remote.info.level_dims == local.info.level_dims
        for i, written in enumerate(levels):
            h, w = written.shape[:2]
            a = remote.read_region(0, 0, w, h, level=i)
            b = local.read_region(0, 0, w, h, level=i)
            np.testing.assert_array_equal(a, b)
            loss = np.abs(a.astype(np.int16) - written[..., :3].astype(np.int16))
            assert loss.mean() < 3.0 and loss.max() <= 64, (i, loss.mean(), loss.max())
    finally:
        remote.close()
        local.close()
        forget(slide_ref(url))


def test_not_a_slide_404_and_a_bad_url_are_one_line_each(served):
    _, url, non_slide, _, _ = served
    with pytest.raises(UnsupportedSlideError) as err:
        open_slide(non_slide)
    assert str(err.value) == (
        f"{non_slide}: not a whole slide: its 1 instance(s) are of SOP class "
        "1.2.840.10008.5.1.4.1.1.7, none a VL Whole Slide Microscopy Image "
        "(1.2.840.10008.5.1.4.1.1.77.1.6)"
    )
    # a 404 says which part the server does not know: the series, the study or the root (they
    # read alike: hostile round 49, 4)
    study = url.split("/studies/")[1].split("/")[0]
    gone = url.rsplit("/", 1)[0] + "/1.2.3.4.5"
    with pytest.raises(InputPathError) as err:
        open_slide(gone)
    assert re.fullmatch(
        rf"{re.escape(gone)}: not found \(404\): the study {re.escape(study)} holds no series "
        r"1\.2\.3\.4\.5 \(\d other series in it\): check the series UID",
        str(err.value),
    ), str(err.value)
    no_study = url.replace(f"/studies/{study}/", "/studies/1.2.3/")
    with pytest.raises(InputPathError) as err:
        open_slide(no_study)
    assert str(err.value).endswith("not found (404): no study 1.2.3 on the server: check the "
                                   "study UID")  # fmt: skip
    with pytest.raises(InputPathError) as err:  # a query string rides along to the searches
        open_slide(f"{no_study}?includefield=all")
    assert "no study 1.2.3 on the server: check the study UID" in str(err.value), str(err.value)

    no_root = url.replace("/dicom-web/", "/nope/")
    with pytest.raises(InputPathError) as err:
        open_slide(no_root)
    assert str(err.value).endswith(
        "answers no DICOMweb search (QIDO-RS), so which part is unknown cannot be asked: check "
        "the study UID, the series UID and the DICOMweb root (Orthanc's is /dicom-web)"
    )
    with pytest.raises(InputPathError, match="a DICOMweb URL names one series"):
        open_slide(url.split("/series/")[0])


def test_a_server_that_answers_404_for_an_unknown_studys_series_names_the_study():
    """Servers answer a search of an unknown study's series with 404 (Orthanc with 200 and
    none): "no study" either way, also where the URL carries a query string (the search was
    told by its URL's end, which a query string hid: the root was blamed)."""
    from cyto.slides.dicomweb import DicomWebSeries, _Status

    asked = []

    def get(url, accept):
        asked.append(url)
        if "/studies/1.2.3/series" in url:
            raise _Status(404, url)
        return b"[]", "application/dicom+json"  # the search of studies answers

    for query in ("", "token=x"):
        series = DicomWebSeries.__new__(DicomWebSeries)
        series.root, series.study, series.series, series.query = (
            "http://h/dw",
            "1.2.3",
            "4.5",
            query,
        )
        series._get = get
        assert series._what_is_missing() == "no study 1.2.3 on the server: check the study UID"
    assert asked[-2] == "http://h/dw/studies/1.2.3/series?token=x"


def test_a_series_that_changes_is_another_slide_and_stops_a_pinned_run(served, tmp_path):
    """The identity of a series is its instances: one added makes another slide; a run pinned
    to the instances it opened stops in one line when the series has others."""
    from pydicom.uid import generate_uid

    from cyto.infer.store import slide_identity
    from cyto.slides.remote import SlideChangedError, pinned_ref

    *_, levels, server = served
    study, series = generate_uid(), generate_uid()
    small = [np.ascontiguousarray(levels[0][:200, :300])]
    uids = {"series_uid": series, "study_uid": study}
    files = write_dicom_wsi(tmp_path / "a", small, 0.5, tile=128, **uids)
    server.upload(files)
    url = f"dicomweb+{server.dicomweb}/studies/{study}/series/{series}"
    run = pinned_ref(slide_ref(url))  # what a run reads, as cyto.infer.pipeline pins it
    before = slide_identity(slide_ref(url))
    assert slide_identity(run) == before  # asked again unchanged: the same slide
    half = [np.ascontiguousarray(small[0][::2, ::2])]
    more = write_dicom_wsi(tmp_path / "b", half, 1.0, tile=128, first_instance=1, **uids)
    server.upload(more)
    forget(run)  # a tile worker opens the series anew
    with pytest.raises(SlideChangedError, match=r"the series changed while it was scored"):
        open_slide(run)
    assert slide_identity(slide_ref(url)) != before
    reader = open_slide(url)  # the series as it is now: two levels
    assert reader.info.level_dims == ((300, 200), (150, 100))
    reader.close()


def test_403_names_the_url_without_credentials(tmp_path, monkeypatch):
    """A server that refuses: one line naming the URL without its user info and query string;
    the bearer token of CYTO_BEARER_TOKEN is never printed."""
    monkeypatch.setenv("CYTO_BEARER_TOKEN", "tok-5ecret")
    with fault_server(b"x", "403") as denied:
        host = denied.url.split("://", 1)[1]
        url = f"dicomweb+http://ann:pw-5ecret@{host}/dw/studies/1.2/series/3.4?sig=q-5ecret"
        with pytest.raises(InputPathError) as err:
            open_slide(url)
        seen = list(denied.seen)
    said = str(err.value)
    assert said == (
        f"dicomweb+http://{host}/dw/studies/1.2/series/3.4: access denied (403): check the "
        "credentials (the URL's user:password, --storage-option headers=..., CYTO_BEARER_TOKEN)"
    )
    assert "5ecret" not in said
    assert any("/dw/studies/1.2/series/3.4/metadata?sig=q-5ecret" in line for line in seen)


def test_a_series_takes_its_credentials_from_the_storage_options_too(monkeypatch):
    """Hostile round 31 (8): a table records a DICOMweb URL without its user info, so `cyto
    data cells` and `cyto view` of a slide scored from a PACS with basic auth had no way to be
    given the password: `--storage-option headers=...` was taken without a word and not sent."""
    from cyto.slides.remote import SlideURL

    monkeypatch.delenv("CYTO_BEARER_TOKEN", raising=False)
    with fault_server(b"x", "403") as denied:
        host = denied.url.split("://", 1)[1]
        url = f"dicomweb+http://{host}/dw/studies/1.2/series/3.4"
        given = {"headers": {"Authorization": "Basic YWxpY2U6cHc="}}
        with pytest.raises(InputPathError):
            open_slide(SlideURL(url, given))
        with pytest.raises(InputPathError):  # the URL's own user info, when nothing is given
            open_slide(f"dicomweb+http://ann:pw@{host}/dw/studies/1.2/series/3.4")
        sent = list(denied.authorization)
    assert sent[0] == "Basic YWxpY2U6cHc=" and sent[-1] == "Basic YW5uOnB3"


@needs_openslide_4
def test_cyto_score_over_dicomweb_is_the_folders_table_and_resumes(
    served, exported_dsvdd, tmp_path
):
    """`cyto score dicomweb+http://...` writes the table `cyto score FOLDER` writes, cell for
    cell (two tile workers, each reading the series itself); --resume says already scored."""
    folder, url, _, _, _ = served
    args = ("--model", str(exported_dsvdd), "--mosaic", "0")
    ref = run_cyto("score", str(folder), "--out", str(tmp_path / "f"), "--workers", "0", *args)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    got = run_cyto("score", url, "--out", str(tmp_path / "w"), "--workers", "2", *args)
    assert got.returncode == 0, got.stdout + got.stderr
    series = url.rsplit("/", 1)[1]
    a = pq.read_table(tmp_path / "w" / series / "scores.parquet")  # named by its series
    b = pq.read_table(tmp_path / "f" / "case-7" / "scores.parquet")
    assert a.num_rows > 20
    assert same_table(a.drop(["slide_id"]), b.drop(["slide_id"]), rtol=1e-8)
    summary = json.loads((tmp_path / "w" / series / "summary.json").read_text())
    assert summary["slide"] == url
    again = run_cyto(
        "score", url, "--out", str(tmp_path / "w"), "--workers", "0", "--resume", *args
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already scored" in again.stdout, again.stdout
