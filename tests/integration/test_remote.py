"""Slides by URL, read in place from real servers started here on loopback (tests/servers.py):
nginx over HTTP with range requests. The same slide scored from the server and from its file
gives the same score table, cell for cell."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.slides import open_slide
from cyto.slides.remote import BLOCK, drop_blocks, forget, open_object, pinned_ref, slide_ref
from tests.cli_runner import run_cyto
from tests.servers import fake_gcs, fault_server, moto_s3, nginx
from tests.tables import same_table

pytestmark = pytest.mark.pyvips


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    """A small pyramidal JPEG-tiled TIFF (two levels), in a folder of its own."""
    root = tmp_path_factory.mktemp("served")
    write_slide(
        root / "s.tif",
        SlideSynthConfig(width=1536, height=1024, seed=2, abnormal_fraction=0.1),
        workers=0,
    )
    return root / "s.tif"


@pytest.fixture(scope="module")
def big_slide(tmp_path_factory):
    """A slide of many blocks (the plan and the tile workers read it in more than one range;
    the module's slide, two blocks, could come whole in one), with few cells: drawing the
    default's 1,500 took 9 s a test, and what these tests judge is its ranges, not its cells."""
    big = tmp_path_factory.mktemp("big") / "s.tif"
    write_slide(big, SlideSynthConfig(width=4096, height=3072, seed=2, n_cells=200), workers=0)
    assert big.stat().st_size > 6 * BLOCK
    return big


@pytest.fixture(scope="module")
def local_table(slide, exported_dsvdd, tmp_path_factory):
    """The module's slide scored from its file (`_score`, one tile worker): the table every
    remote run of it is compared with, scored once for the module."""
    out = tmp_path_factory.mktemp("local")
    proc = _score([str(slide)], exported_dsvdd, out)
    assert proc.returncode == 0, proc.stderr
    return pq.read_table(out / "s" / "scores.parquet")


@pytest.fixture(scope="module")
def http(slide, tmp_path_factory):
    with nginx(slide.parent, tmp_path_factory.mktemp("nginx")) as server:
        yield server


def test_remote_tiff_reads_as_the_file(slide, http):
    """Every level of a TIFF read over HTTP is the file's pixels, bit for bit, and its
    description is the file's; the bytes that came over the wire are the file's at most
    once (each block fetched once)."""
    remote, local = open_slide(f"{http.url}/s.tif"), open_slide(slide)
    try:
        assert remote.info.level_dims == local.info.level_dims
        assert remote.info.mpp == local.info.mpp
        assert str(remote.info.path) == f"{http.url}/s.tif"
        for level, (w, h) in enumerate(local.info.level_dims):
            a = remote.read_region(-7, -5, w + 9, h + 3, level)
            b = local.read_region(-7, -5, w + 9, h + 3, level)
            assert np.array_equal(a, b), level
    finally:
        remote.close()
        local.close()
        # a reader outside a scoring run leaves its blocks to the cache's bound; the next
        # test counts the bytes a run fetches itself
        drop_blocks(slide_ref(f"{http.url}/s.tif"))
    served = [s for s in http.served() if s[2].startswith("GET /s.tif")]
    assert all(status == 206 for status, *_ in served)  # ranges only, never the whole file
    assert all(if_match not in ("", "-") for *_, if_match in served)  # pinned to its ETag
    assert sum(size for _, size, *_ in served) <= slide.stat().st_size


def test_score_over_http_is_the_local_table(slide, http, exported_dsvdd, local_table, tmp_path):
    """`cyto score http://...` writes the table `cyto score FILE` writes, cell for cell; the
    summary names the URL. The plan and two tile workers share the blocks they fetch: the
    bytes over the wire are the file's at most once (no level read twice), and none of them
    stays in cyto's cache after the run."""
    before = len(http.served())
    out, source = tmp_path / "http", f"{http.url}/s.tif"
    proc = run_cyto(
        *("score", source, "--model", str(exported_dsvdd), "--out", str(out)),
        *("--workers", "2"),
        process=True,  # its own process: no object this test process opened before
    )
    assert proc.returncode == 0, proc.stderr
    # what a slow link reads before the first tile (the bar starts with the tiles) is said
    plan = "s.tif: planning its tiles: reading its overview and up to 16 windows from the server"
    assert plan in proc.stdout.splitlines(), proc.stdout
    table = pq.read_table(out / "s" / "scores.parquet")
    assert json.loads((out / "s" / "summary.json").read_text())["slide"] == source
    assert local_table.num_rows > 20
    # the file's table (scored with one tile worker: the workers change no cell)
    assert same_table(table, local_table)  # NaN where a nucleus had no measure
    fetched = sum(size for _, size, *_ in http.served()[before:])
    assert 0 < fetched <= slide.stat().st_size
    blocks = Path(os.environ["CYTO_CACHE_DIR"]) / "remote-blocks"
    assert not blocks.is_dir() or not any(blocks.rglob("*.blk"))


def test_view_and_data_cells_read_a_folder_scored_from_a_url(slide, http, exported_dsvdd, tmp_path):
    """cyto view and cyto data cells (and review, through the same door) of a slide scored from
    a URL read its pixels from that URL (they said "reads local slide files only"): the view's
    pixels and the cut cells are the local file's; an object changed since it was scored is one
    line, and nothing is cut from it."""
    import csv

    from PIL import Image

    from cyto.errors import CytoError
    from cyto.view.folder import open_view

    out = tmp_path / "out"
    proc = _score([f"{http.url}/s.tif"], exported_dsvdd, out)
    assert proc.returncode == 0, proc.stderr
    folder = out / "s"
    (view,) = open_view(folder)
    local = open_slide(slide)
    truth = slide.with_name("s.cells.parquet")
    try:
        assert np.array_equal(view.reader(0).read_region(0, 0, 300, 200),
                              local.read_region(0, 0, 300, 200))  # fmt: skip
        view.close()
        ds = tmp_path / "ds"
        # the slide's planted lesions, in the truth table cyto synth wrote beside it and served
        # beside it, are never cut as normal cells (they were, for a slide by URL: round 30, 17)
        planted = run_cyto("data", "cells", str(folder), "--out", str(ds), "--per-slide", "4")
        assert planted.returncode == 2 and not (ds / "normal").exists()
        assert (
            planted.stderr.strip()
            .splitlines()[-1]
            .endswith(
                f"the slide's ground truth beside it ({http.url}/s.cells.parquet) marks 10 cell(s) "
                "abnormal; harvest normal cells from negative slides only"
            )
        )
        truth.rename(truth.with_suffix(".kept"))  # from here, a slide served without its truth
        cut = run_cyto("data", "cells", str(folder), "--out", str(ds), "--per-slide", "4")
        assert cut.returncode == 0, cut.stderr
        crop = json.loads((folder / "summary.json").read_text())["resolution"]["crop_px_level0"]
        with open(ds / "cells-normal.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == 4
        for r in rows:
            x0, y0 = round(float(r["x"])) - crop // 2, round(float(r["y"])) - crop // 2
            want = local.read_region(x0, y0, crop, crop)
            assert np.array_equal(np.asarray(Image.open(r["path"]).convert("RGB")), want)
        st = slide.stat()  # another version of the object (nginx's ETag: time of change, size)
        os.utime(slide, ns=(st.st_atime_ns, st.st_mtime_ns + 7_000_000_000))
        bad = run_cyto("data", "cells", str(folder), "--out", str(tmp_path / "ds2"))
    finally:
        local.close()
        if truth.with_suffix(".kept").exists():
            truth.with_suffix(".kept").rename(truth)
    assert bad.returncode == 2 and "is not the slide it was scored as" in bad.stderr, bad.stderr
    # named as cyto view names it: the version the server states, not "its content changed"
    # (the same bytes copied anew are another version: hostile round 74, 1)
    assert f"the version of {http.url}/s.tif its server states (its ETag" in bad.stderr
    assert "its content changed" not in bad.stderr, bad.stderr
    # one line of error (the slide's adequacy warning, said by every command, beside it)
    errors = [x for x in bad.stderr.strip().splitlines() if not x.startswith("warning: ")]
    assert len(errors) == 1, bad.stderr
    assert not (tmp_path / "ds2" / "normal").exists()
    with pytest.raises(CytoError, match="the slide changed since it was scored") as err:
        open_view(folder)
    # a URL's identity is the version its server states, named so (round 62, 5)
    said = (
        r"the slide changed since it was scored \(the version of "
        + re.escape(f"{http.url}/s.tif")
        + r" its server states \(its ETag or time of change: the same bytes copied anew are "
        r"another version\) \w{12} -> \w{12}\)"
    )
    assert re.search(rf"cannot be shown: {said}: score it again$", str(err.value))


def _downloaded_reads_as(url: str, path) -> None:
    """``url`` read through its local copy (``--download``) is the file ``path``, level 0."""
    from cyto.slides.remote import SlideURL

    remote, local = open_slide(SlideURL(url, download=True)), open_slide(path)
    try:
        assert str(remote.info.path) == url
        w, h = local.info.level_dims[0]
        assert np.array_equal(remote.read_region(0, 0, w, h), local.read_region(0, 0, w, h))
    finally:
        remote.close()
        local.close()


def _score(source, model, out, *extra, **kw):
    return run_cyto(
        "score", *source, "--model", str(model), "--out", str(out), "--workers", "1", *extra, **kw
    )


def _everything_written(proc, out) -> str:
    """stdout, stderr and every file under ``out`` (text or not), for the grep of secrets."""
    parts = [proc.stdout, proc.stderr]
    parts += [f.read_bytes().decode("latin-1") for f in out.rglob("*") if f.is_file()]
    return "\n".join(parts)


def test_a_changed_object_is_scored_again(slide, http, exported_dsvdd, tmp_path):
    """The slide identity of a URL is its version: unchanged, --resume reuses the finished
    result; replaced (a new ETag), it is scored again and never mixed with the old run."""
    out, url = tmp_path / "out", f"{http.url}/s.tif"
    first = _score([url], exported_dsvdd, out)
    assert first.returncode == 0, first.stderr
    before = json.loads((out / "s" / "summary.json").read_text())["slide_identity"]
    again = _score([url], exported_dsvdd, out, "--resume")
    assert again.returncode == 0, again.stderr
    assert "already scored" in again.stdout
    st = slide.stat()  # a new version: nginx's ETag is the time of change and size
    os.utime(slide, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    changed = _score([url], exported_dsvdd, out, "--resume")
    assert changed.returncode == 0, changed.stderr
    assert "already scored" not in changed.stdout
    assert f"the version of {url} its server states" in changed.stdout, changed.stdout
    after = json.loads((out / "s" / "summary.json").read_text())["slide_identity"]
    assert after != before


def test_an_object_whose_server_states_no_version_is_known_by_its_bytes(
    slide, exported_dsvdd, tmp_path
):
    """Hostile round 61, 1: a server that states no version of an object (no ETag, no
    Last-Modified) had it known by its URL and size alone: a slide replaced by another of the
    same size was "already scored" under --resume, and its cells were cut from the other's
    pixels. Now it is known by its sampled bytes (as a local file is), said once."""
    other = tmp_path / "o.tif"
    write_slide(other, SlideSynthConfig(width=1536, height=1024, seed=7), workers=0)
    a, b = slide.read_bytes(), other.read_bytes()
    size = max(len(a), len(b))  # the same size: a TIFF's reader ignores what follows its data
    a, b = a.ljust(size, b"\0"), b.ljust(size, b"\0")
    out = tmp_path / "out"
    with fault_server(a, "no-version") as server:
        url = f"{server.url}/s.tif"
        first = _score([url], exported_dsvdd, out, process=True)  # its own console
        assert first.returncode == 0, first.stderr
        said = [ln for ln in first.stderr.splitlines() if "states no version" in ln]
        assert len(said) == 1 and said[0].startswith(f"note: {url}: "), first.stderr
        again = _score([url], exported_dsvdd, out, "--resume")
        assert again.returncode == 0 and "already scored" in again.stdout, again.stderr
        server.data = b  # another slide of the same size at the same address
        changed = _score([url], exported_dsvdd, out, "--resume")
    assert changed.returncode == 0, changed.stderr
    assert "already scored" not in changed.stdout, changed.stdout
    # named as what it is known by (it was "the version its server states", of a server
    # that states none)
    assert f"the content of {url} (its size and sampled bytes" in changed.stdout, changed.stdout


@pytest.mark.parametrize("size", [254_000, 3 << 20])
def test_an_unversioned_objects_sampled_bytes_come_once_and_hash_as_a_local_files(size):
    """Hostile round 74, 3: the sampled ranges of an object under 2 MiB overlap (its first and
    last MiB), and a 254 KB object came over 5x in a run. Each byte is fetched once a sampling;
    the identity is the hash of every range's bytes, as before."""
    import hashlib

    from cyto.slides.base import sampled_ranges
    from cyto.slides.remote import RemoteObject, SlideURL, forget

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    want = hashlib.sha256(b"cyto-slide-identity-v1:remote-bytes")
    for start, n in sampled_ranges(size):
        want.update(data[start : start + n])
    with fault_server(data, "no-version") as server:
        ref = SlideURL(f"{server.url}/u{size}.tif")
        forget(ref)
        before = server.sent
        obj = RemoteObject(ref)
        obj.identity()
        assert obj._sampled() == f"sampled:{want.hexdigest()}"
        fetched = server.sent - before
    assert fetched <= min(size, 3 << 20) + (64 << 10), (fetched, size)


def test_a_region_read_after_the_object_changed_is_refused_never_half_decoded(big_slide):
    """Hostile round 62, 1: after the object was replaced, a viewer's tile came back mostly
    black, served as the slide: libvips' TIFF loader decoded a tile whose reads had failed
    (412) from what it had, without an error. Every region read after the change is the
    file's own pixels (blocks fetched before it) or refused as a change, never other pixels."""
    from cyto.slides.remote import SlideChangedError, pinned_ref, slide_ref

    big = big_slide
    local = open_slide(big)
    places = [(0, 0), (2048, 1024), (3500, 2600), (1024, 2800), (3800, 100), (300, 1500)]
    refused = 0
    try:
        with fault_server(big.read_bytes(), "change", change_after=5) as server:
            remote = open_slide(pinned_ref(slide_ref(f"{server.url}/s.tif")))
            for x, y in places:
                try:
                    got = remote.read_region(x, y, 256, 256)
                except SlideChangedError:
                    refused += 1
                    continue
                assert np.array_equal(got, local.read_region(x, y, 256, 256)), (x, y)
            remote.close()
    finally:
        local.close()
    assert server.ranges > 5 and refused, (server.ranges, refused)


@pytest.mark.parametrize("mode", ["change", "change-dated"])
def test_an_object_that_changes_while_scored_stops_that_slide(
    big_slide, exported_dsvdd, tmp_path, monkeypatch, mode
):
    """An object replaced after the first range stops its slide in one line; nothing of the
    run is kept (no output folder, no chunks). Without read-ahead: it may fetch every block in
    one range before the change (a whole old version, rightly scored), and the fresh-clone
    check's run did so."""
    monkeypatch.setenv("CYTO_READ_AHEAD_MB", "0")
    out = tmp_path / "out"
    # a slide of several blocks: the plan and the tile worker read it in more than one range
    # (the module's slide, two blocks, could come whole in one: no change to see)
    big = big_slide
    # change-dated: a server that states the time of change and no ETag (hostile round 62,
    # 2: nothing was pinned; the run failed as "cannot be decoded", or mixed the versions)
    with fault_server(big.read_bytes(), mode, change_after=1) as server:
        # a process of its own: nothing this test process opened before (a RemoteObject of an
        # address a port reused) stands in for the object served here
        proc = _score([f"{server.url}/s.tif"], exported_dsvdd, out, process=True)
    assert proc.returncode == 1
    failed = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed:")]
    assert len(failed) == 1 and "changed while it was" in failed[0], proc.stderr
    assert f"{server.url}/s.tif" in failed[0]
    assert not (out / "s").exists()
    # the fault met inside libvips' read callback: said in that one line, never as Python's
    # "Exception ignored from cffi callback" traceback (hostile round 30, 4)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_every_reader_of_a_run_reads_the_version_it_pinned(slide, tmp_path, monkeypatch):
    """The tile workers and the threshold thread start first, each opening the slide itself;
    they were given the URL unpinned, so one that met a change before the run pinned its version
    left the run to open the new version and score it whole (the test above then failed, 1 run
    in 3-6). Now the run pins the server's version before anything reads it."""
    import cyto.infer.pipeline as pipeline

    given: list = []

    class Stop(Exception):
        pass

    def record(slide_arg, *_a, **_k):
        given.append(slide_arg)
        raise Stop

    monkeypatch.setattr(pipeline, "start_workers", record)
    with fault_server(slide.read_bytes()) as server:
        with pytest.raises(Stop):
            pipeline.score_slide(f"{server.url}/s.tif", None, tmp_path / "out")
        monkeypatch.setattr(pipeline, "start_workers", lambda *_a, **_k: None)
        monkeypatch.setattr(pipeline.ThresholdAhead, "start", record)
        with pytest.raises(Stop):
            pipeline.score_slide(f"{server.url}/s.tif", None, tmp_path / "out")
    assert [g.etag for g in given] == ['"v1"', '"v1"']


def test_a_run_asks_the_server_again_for_a_url_served_anew(slide):
    """A process that scored a URL before (cyto watch, a script) kept its opened object, and a
    later run of the same URL, served anew with other bytes, was pinned to the old version and
    read the old blocks from memory. A run now starts from the server's version."""
    from tests.servers import FaultServer

    first = FaultServer(b"x" * 1000)
    port = first.server_address[1]
    threading.Thread(target=first.serve_forever, daemon=True).start()
    ref = slide_ref(f"http://127.0.0.1:{port}/s.tif")
    try:
        assert open_object(pinned_ref(ref)).size == 1000
    finally:
        first.shutdown()
        first.server_close()
    second = FaultServer(slide.read_bytes(), port=port)  # the same address, other bytes
    threading.Thread(target=second.serve_forever, daemon=True).start()
    try:
        assert open_object(pinned_ref(ref)).size == slide.stat().st_size
    finally:
        second.shutdown()
        second.server_close()


def test_403_and_404_are_one_line_each_naming_the_url(slide, exported_dsvdd, tmp_path):
    data = slide.read_bytes()
    with fault_server(data, "404") as missing, fault_server(data, "403") as denied:
        urls = [f"{missing.url}/gone.tif", f"{denied.url}/locked.tif"]
        proc = _score(urls, exported_dsvdd, tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert failed == [
        f"failed: {urls[0]}: not found (404)",
        f"failed: {urls[1]}: access denied (403): check the credentials (environment, "
        "profile, --storage-option, CYTO_BEARER_TOKEN)",
    ]


def test_a_dropped_connection_is_retried_and_said_once(slide):
    """The first range's connection closes mid-answer: retried, said once, and the pixels
    are the file's."""
    local = open_slide(slide)
    with fault_server(slide.read_bytes(), "drop-once") as server:
        import logging

        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())
        logging.getLogger("cyto.remote").addHandler(handler)
        try:
            remote = open_slide(f"{server.url}/drop.tif")
            w, h = local.info.level_dims[0]
            assert np.array_equal(remote.read_region(0, 0, w, h), local.read_region(0, 0, w, h))
        finally:
            logging.getLogger("cyto.remote").removeHandler(handler)
    assert len(records) == 1 and "connection was dropped" in records[0], records
    assert server.ranges >= 2


def test_a_damaged_shared_block_is_fetched_again_never_read_as_the_slide(slide, monkeypatch):
    """A hostile check: 3 bytes flipped in a kept block (remote-blocks/ID/0.blk) were read as
    the slide's, and the top score moved with no word. Each shared block is sealed."""
    import logging

    from cyto import cache_dir

    monkeypatch.setenv("CYTO_READ_AHEAD_MB", "0")
    local = open_slide(slide)
    w, h = local.info.level_dims[0]
    want = local.read_region(0, 0, w, h)
    with fault_server(slide.read_bytes()) as server:
        url = f"{server.url}/damaged.tif"
        assert np.array_equal(open_slide(url).read_region(0, 0, w, h), want)
        kept = sorted((cache_dir() / "remote-blocks").rglob("*.blk"))
        assert kept
        for block in kept:  # every block of every slide read here: ours among them
            data = bytearray(block.read_bytes())
            data[10:13] = bytes(b ^ 0xFF for b in data[10:13])
            block.write_bytes(bytes(data))
        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())
        logging.getLogger("cyto.remote").addHandler(handler)
        try:
            before = server.ranges
            forget(slide_ref(url))  # another process: nothing of the slide in memory
            assert np.array_equal(open_slide(url).read_region(0, 0, w, h), want)
        finally:
            logging.getLogger("cyto.remote").removeHandler(handler)
    assert server.ranges > before  # fetched again
    assert sum("did not match its seal" in r for r in records) == 1, records


def test_a_server_without_byte_ranges_is_said_so_not_a_changed_object(slide):
    """A hostile check (round 2): `python -m http.server` answers a range with the whole file
    (200), and cyto said the object "changed (or was cut short) while it was read"."""
    from cyto.errors import UnsupportedSlideError

    with (
        fault_server(slide.read_bytes(), "no-ranges") as server,
        pytest.raises(UnsupportedSlideError, match="does not serve ranges") as err,
    ):
        open_slide(f"{server.url}/whole.tif").read_region(0, 0, 64, 64)
    said = str(err.value)
    assert "changed" not in said and "--download" in said and "\n" not in said


def test_a_server_without_byte_ranges_is_refused_before_its_whole_body_is_read(slide):
    """Round 30 (10): the whole object a server sends instead of a range was read into memory
    (fsspec's cat_file) before cyto refused it: a slide of gigabytes, in memory, to be thrown
    away. The answer's status is read, its body left unread: the connection is closed after a
    few of its megabytes (a socket's buffers)."""
    from cyto.errors import UnsupportedSlideError

    data = slide.read_bytes() + bytes(96 << 20)  # a TIFF of 96 MiB more: read by its offsets
    with (
        fault_server(data, "no-ranges") as server,
        pytest.raises(UnsupportedSlideError, match=f"whole object \\({len(data):,} bytes\\)"),
    ):
        open_slide(f"{server.url}/big.tif").read_region(0, 0, 64, 64)
    time.sleep(0.5)  # the server's last write fails once the client has hung up
    assert server.sent < 24 << 20, server.sent


def test_a_server_without_byte_ranges_is_read_through_a_copy_with_download(
    slide, tmp_path, monkeypatch
):
    """The advice of the test above holds: with --download a TIFF from a server that serves no
    ranges is fetched whole to cyto's cache and read there, the file's pixels (failed before,
    issue 68, hostile round 3: --download gave the very same error)."""

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    with fault_server(slide.read_bytes(), "no-ranges") as server:
        url = f"{server.url}/whole.tif"
        _downloaded_reads_as(url, slide)
    copies = list((tmp_path / "cache" / "remote").rglob("whole.tif"))
    assert len(copies) == 1 and copies[0].read_bytes() == slide.read_bytes()


def test_a_damaged_download_is_fetched_again_and_said_once(slide, tmp_path, monkeypatch):
    """Hostile round 5 (MIS 1.8): bytes of the --download copy in cyto's cache zeroed, every
    run failed "cannot be decoded", blaming the slide. The copy is checked against the bytes
    fetched; a damaged one is fetched again, said once."""
    import warnings

    from cyto.errors import CytoWarning

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    with fault_server(slide.read_bytes(), "no-ranges") as server:
        url = f"{server.url}/whole.tif"
        _downloaded_reads_as(url, slide)
        [copy] = list((tmp_path / "cache" / "remote").rglob("whole.tif"))
        data = bytearray(copy.read_bytes())
        data[len(data) // 3 : len(data) // 3 + 4096] = bytes(4096)
        copy.write_bytes(bytes(data))
        forget(slide_ref(url))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            _downloaded_reads_as(url, slide)
    lines = [str(w.message) for w in said if issubclass(w.category, CytoWarning)]
    assert len(lines) == 1 and "is not as it was fetched; fetching it again" in lines[0], lines
    assert copy.read_bytes() == slide.read_bytes()


def test_two_threads_downloading_one_slide_share_one_copy(slide, tmp_path, monkeypatch):
    """A slide's plan and its tiles open a --download slide in two threads of one process:
    each wrote, then renamed or removed, the same temporary file, and a cohort's NDPI failed
    "No such file or directory: .n.ndpi.PID.part" (hostile round 30). One fetches, the other
    waits for its copy; both read the file's bytes, fetched once."""
    import time

    from cyto.slides.remote import RemoteObject, download

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    fetched, started = [], threading.Barrier(2)
    real = RemoteObject._fetch

    def slow(self, start, end):
        fetched.append(start)
        time.sleep(0.05)  # both threads are inside download() while the copy is written
        return real(self, start, end)

    monkeypatch.setattr(RemoteObject, "_fetch", slow)
    with fault_server(slide.read_bytes(), "ok") as server:
        obj = open_object(slide_ref(f"{server.url}/s.tif"))
        got, failed = [], []

        def fetch():
            started.wait()
            try:
                got.append(download(obj, chunk=64 << 10))
            except Exception as exc:  # noqa: BLE001 - what the other thread's rename left
                failed.append(exc)

        threads = [threading.Thread(target=fetch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failed == [] and len(got) == 2 and got[0] == got[1]
    assert got[0].read_bytes() == slide.read_bytes()
    assert len(fetched) == -(-len(slide.read_bytes()) // (64 << 10))  # fetched once
    assert not [p for p in got[0].parent.iterdir() if p.name.endswith(".part")]


def test_a_fault_inside_libvips_read_is_one_error_not_a_traceback(slide, monkeypatch):
    """A server gone while libvips reads a tile through its source: the fault raised in the
    read callback was printed by Python as "Exception ignored from cffi callback" with its
    traceback, three times in a run, before the slide failed in one line (hostile round 30,
    4). The callback keeps it and tells libvips the read failed; the reader raises it."""
    import sys

    from cyto.slides.remote import RemoteAccessError, RemoteIO

    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    with fault_server(slide.read_bytes(), "ok") as server:
        forget(slide_ref(f"{server.url}/gone.tif"))
        reader = open_slide(slide_ref(f"{server.url}/gone.tif"))
        try:

            def gone(self, size=-1):
                raise RemoteAccessError(f"{server.url}/gone.tif: the server could not be reached")

            monkeypatch.setattr(RemoteIO, "read", gone)
            w, h = reader.info.level_dims[0]
            with pytest.raises(RemoteAccessError, match="could not be reached"):
                reader.read_region(0, 0, w, h)
        finally:
            reader.close()
    assert ignored == []


@pytest.mark.parametrize(
    "body, name, said",
    [
        (b"PAR1" + b"\0" * 64, "thing", "a Parquet table, not a slide"),
        (b"<!DOCTYPE HTML>\n<html><body>" + b"x" * 64, "thing", "an HTML page"),
        # round 30 (15): a damaged .tif or .svs was told to pass --download
        (b"\0garbage" * 16, "a.tif", "not a TIFF, although named .tif"),
        (b"\0garbage" * 16, "b.SVS", "not a TIFF, although named .svs"),
    ],
)
def test_an_object_that_is_no_slide_is_said_so_without_download_advice(body, name, said):
    """A hostile check (round 2): a URL to a .parquet table was told to pass --download."""
    from cyto.errors import UnsupportedSlideError

    with (
        fault_server(body) as server,
        pytest.raises(UnsupportedSlideError, match=said) as err,
    ):
        open_slide(f"{server.url}/{name}")
    assert "--download" not in str(err.value)


def test_a_server_that_cannot_be_reached_is_said_so_once_not_a_dropped_connection():
    """A hostile check: with nothing listening, "the connection was dropped; retrying (said once
    per slide)" came twice (two readers of the slide), then "the connection was dropped"."""
    import logging

    from cyto.errors import CytoError
    from cyto.slides.remote import RemoteObject, slide_ref
    from tests.servers import free_port

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("cyto.remote").addHandler(handler)
    port = free_port()
    url = f"http://127.0.0.1:{port}/none.tif"
    # where it was tried is named (a stale AWS_ENDPOINT_URL went unseen: round 72, 4)
    reached = f"the server at 127.0.0.1:{port} could not be reached"
    try:
        for _ in range(2):  # two readers of one slide in one process
            with pytest.raises(CytoError) as err:
                RemoteObject(slide_ref(url)).identity()
            assert reached in str(err.value) and "dropped" not in str(err.value)
    finally:
        logging.getLogger("cyto.remote").removeHandler(handler)
    assert len(records) == 1 and reached in records[0], records
    s3 = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "AKIDLAB", "secret": "s3cr3t"}
    with pytest.raises(CytoError) as err:
        RemoteObject(slide_ref("s3://bucket/a.tif", s3)).identity()
    assert f"the server at http://127.0.0.1:{port} could not be reached" in str(err.value)
    assert "s3cr3t" not in str(err.value)


def test_an_s3_slide_without_credentials_says_where_they_are_looked_for(monkeypatch, tmp_path):
    """With no key anywhere, botocore refuses before any request; cyto said "cannot read it
    (NoCredentialsError)" (found by a test of hostile round 72's unreachable endpoint)."""
    from cyto.errors import InputPathError
    from cyto.flags import python_words
    from cyto.slides.remote import RemoteObject, slide_ref
    from tests.servers import free_port

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    ref = slide_ref("s3://bucket/a.tif", {"endpoint_url": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(InputPathError) as err:
        RemoteObject(ref).identity()
    assert str(err.value) == (
        "s3://bucket/a.tif: no credentials for this store were found: set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (or a profile, AWS_PROFILE), give --storage-option key=... "
        "--storage-option secret=..., or anon=true for a public bucket"
    )
    with python_words("score_slide"), pytest.raises(InputPathError, match="storage_options key="):
        RemoteObject(slide_ref("s3://bucket/b.tif", ref.options)).identity()


def test_an_http_prefix_lists_its_slides_by_their_own_urls(slide, http):
    """A hostile check (round 2): `cyto score http://HOST/folder/` over a server's folder
    listing named each slide `http://http://HOST/...` and said "could not be reached"; and a
    prefix on a server that cannot be reached said "holds no slide"."""
    from cyto.errors import CytoError
    from cyto.slides import slide_files
    from cyto.slides.remote import SlideURL
    from tests.servers import free_port

    assert slide_files([SlideURL(f"{http.url}/listed/")]) == [SlideURL(f"{http.url}/listed/s.tif")]
    # a folder the server does not list (nginx's 403) is said to be one, not only a credentials
    # problem (hostile round 72, 3)
    with pytest.raises(CytoError) as err:
        slide_files([SlideURL(f"{http.url}/")])
    assert "access denied (403)" in str(err.value)
    assert "or the server lists no folders: an http:// prefix is read from the server's" in str(
        err.value
    )
    with pytest.raises(CytoError) as err:
        slide_files([SlideURL(f"http://127.0.0.1:{free_port()}/listed/")])
    assert "could not be reached" in str(err.value), str(err.value)


def test_a_stalled_server_fails_its_slide_alone(slide, exported_dsvdd, tmp_path, monkeypatch):
    """A server that never answers a range is timed out (CYTO_REMOTE_TIMEOUT), retried and
    given up: that slide fails in one line, and the cohort goes on."""
    out = tmp_path / "out"
    # read at each request: the run goes in this process (no process start to wait for)
    monkeypatch.setenv("CYTO_REMOTE_TIMEOUT", "0.25")
    with fault_server(slide.read_bytes(), "stall") as server:
        proc = _score([f"{server.url}/stalled.tif", str(slide)], exported_dsvdd, out)
    assert proc.returncode == 1, proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed:")]
    assert failed == [
        f"failed: {server.url}/stalled.tif: the server did not answer within "
        "CYTO_REMOTE_TIMEOUT=0.25 s (4 tries); giving up"
    ], proc.stderr
    # four tries in all, as said: the plan's reader, the threshold thread ahead of it and a
    # tile worker each tried four times, 12 ranges asked (hostile round 61, 4)
    assert server.ranges == 4, server.seen
    assert (out / "s" / "scores.parquet").is_file()


def test_credentials_and_query_strings_are_never_printed(slide, http, exported_dsvdd, tmp_path):
    """A bearer token (CYTO_BEARER_TOKEN) opens nginx's private folder, a query string rides
    along; neither appears in any output, file or line, where the URL is printed without it.
    A password in a URL's user info is not printed in its error either."""
    out, token, sig = tmp_path / "out", "s3cr3t-t0ken", "sig-6f1e2d"
    url = f"{http.url}/private/s.tif?X-Amz-Signature={sig}&X-Amz-Credential=AKIDEXAMPLE"
    proc = _score([url], exported_dsvdd, out, env={"CYTO_BEARER_TOKEN": token})
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(out / "s" / "scores.parquet")
    assert table.num_rows > 20
    written = _everything_written(proc, out)
    for secret in (token, sig, "AKIDEXAMPLE", "X-Amz"):
        assert secret not in written
    summary = json.loads((out / "s" / "summary.json").read_text())
    assert summary["slide"] == f"{http.url}/private/s.tif"
    assert any(sig in line for _, _, line, _ in http.served())  # it was sent to the server
    denied = _score(
        [f"http://user:pa55w0rd@127.0.0.1:{http.port}/forbidden/s.tif"],
        exported_dsvdd,
        tmp_path / "denied",
    )
    assert denied.returncode == 2
    assert "pa55w0rd" not in _everything_written(denied, tmp_path)
    assert f"failed: http://127.0.0.1:{http.port}/forbidden/s.tif: access denied" in denied.stderr
    # the token comes before the URL's user info, as the how-to says: the two together failed
    # "cannot read it (ValueError)" (aiohttp refuses both; hostile round 72, 1)
    both = _score(
        [f"http://user:pa55w0rd@127.0.0.1:{http.port}/private/s.tif"],
        exported_dsvdd,
        tmp_path / "both",
        env={"CYTO_BEARER_TOKEN": token},
    )
    assert both.returncode == 0, both.stderr
    assert pq.read_table(tmp_path / "both" / "s" / "scores.parquet").equals(table)


@pytest.mark.openslide
def test_a_format_that_needs_a_local_file_says_so_or_is_downloaded(
    exported_dsvdd, tmp_path, monkeypatch
):
    """An NDPI by URL is refused in one line without --download, and the run leaves none of
    the blocks it read to tell its format in cyto's cache (a folder of them was left for each
    refused slide, hostile round 49, 1); with it, a copy in cyto's cache (named by the object's
    version) is read, the pixels the file's."""
    from cyto.errors import UnsupportedSlideError
    from cyto.infer import ScoreOptions, score_slide

    served = tmp_path / "served"
    write_slide(served / "n.ndpi", SlideSynthConfig(width=1024, height=512, seed=4), workers=0)
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    with nginx(served, tmp_path / "nginx") as server:
        url = f"{server.url}/n.ndpi"
        with pytest.raises(UnsupportedSlideError, match="pass --download"):
            score_slide(url, exported_dsvdd, tmp_path / "o", ScoreOptions(mosaic=0))
        assert not any((tmp_path / "cache" / "remote-blocks").rglob("*.blk"))
        # from Python, the keyword score_slide takes (it said only to copy it: round 52, 9)
        import cyto

        with pytest.raises(UnsupportedSlideError, match="pass download=True to score_slide"):
            cyto.score_slide(url, exported_dsvdd, tmp_path / "o", mosaic=0, echo=None)
        # cyto score's tile workers, one still starting, read them too (round 52, 1)
        proc = run_cyto("score", url, "--model", str(exported_dsvdd), "--out",
                        str(tmp_path / "o"), "--mosaic", "0", "--workers", "2")  # fmt: skip
        assert proc.returncode == 1 and "pass --download" in proc.stderr, proc.stderr
        import multiprocessing as mp

        deadline = time.monotonic() + 30  # whatever the run left running ends first
        while mp.active_children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any((tmp_path / "cache" / "remote-blocks").rglob("*.blk"))
        assert not (tmp_path / "o").exists()
        with pytest.raises(UnsupportedSlideError, match="pass --download"):
            open_slide(url)
        _downloaded_reads_as(url, served / "n.ndpi")
    copies = list((tmp_path / "cache" / "remote").rglob("n.ndpi"))
    assert len(copies) == 1 and copies[0].read_bytes() == (served / "n.ndpi").read_bytes()


@pytest.fixture(scope="module")
def s3(slide, tmp_path_factory):
    """moto's S3 server holding the slide as s3://slides/cohort/s.tif (and a non-slide)."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as server:
        client = server.client()
        client.create_bucket(Bucket="slides")
        client.put_object(Bucket="slides", Key="cohort/s.tif", Body=slide.read_bytes())
        client.put_object(Bucket="slides", Key="cohort/notes.txt", Body=b"not a slide")
        yield server


def test_s3_slide_reads_as_the_file_with_storage_options(slide, s3, monkeypatch):
    """An S3-protocol server named by --storage-option endpoint_url (credentials in the
    options); the pixels are the file's; a prefix lists its slides; a missing key is a 404
    line; a key replaced after opening stops the read (If-Match on the ETag)."""
    from cyto.errors import InputPathError
    from cyto.slides import slide_files
    from cyto.slides.remote import RemoteObject, SlideChangedError, SlideURL, parse_options

    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    options = parse_options([f"endpoint_url={s3.endpoint}", f"key={s3.KEY}", f"secret={s3.SECRET}"])
    assert slide_files([SlideURL("s3://slides/cohort/", options)]) == [
        SlideURL("s3://slides/cohort/s.tif", options)
    ]
    remote, local = open_slide(SlideURL("s3://slides/cohort/s.tif", options)), open_slide(slide)
    try:
        for level, (w, h) in enumerate(local.info.level_dims):
            a, b = remote.read_region(0, 0, w, h, level), local.read_region(0, 0, w, h, level)
            assert np.array_equal(a, b)
    finally:
        remote.close()
        local.close()
    with pytest.raises(InputPathError, match=r"s3://slides/cohort/gone.tif: not found \(404\)$"):
        open_slide(SlideURL("s3://slides/cohort/gone.tif", options))
    # a bucket that is not there said so, as --out says it (it read as a missing object:
    # hostile round 74, 6)
    with pytest.raises(InputPathError) as err:
        open_slide(SlideURL("s3://nosuchbucket/a.tif", options))
    assert str(err.value) == "s3://nosuchbucket/a.tif: there is no bucket 'nosuchbucket' (404)"
    s3.client().put_object(Bucket="slides", Key="scratch/moving.tif", Body=slide.read_bytes())
    moving = RemoteObject(SlideURL("s3://slides/scratch/moving.tif", options))
    assert moving.read(0, 4) == slide.read_bytes()[:4]  # its first block, then replaced:
    s3.client().put_object(Bucket="slides", Key="scratch/moving.tif", Body=slide.read_bytes()[::-1])
    with pytest.raises(SlideChangedError, match="changed while it was read"):
        moving.read(moving.size - 4, 4)


def test_score_from_s3_prefix_with_env_credentials(
    slide, s3, exported_dsvdd, local_table, tmp_path
):
    """`cyto score s3://bucket/prefix/` with the standard AWS variables (endpoint and keys)
    scores the slides under the prefix; the table is the local file's, cell for cell, and
    the secret key appears in no output."""
    out = tmp_path / "s3"
    # a process of its own (the variables alone say where and who): every line it and its
    # tile worker print is searched for the secret
    proc = _score(["s3://slides/cohort/"], exported_dsvdd, out, env=s3.env())
    assert proc.returncode == 0, proc.stderr
    a = pq.read_table(out / "s" / "scores.parquet").to_pydict()
    assert a == local_table.to_pydict()
    assert json.loads((out / "s" / "summary.json").read_text())["slide"] == (
        "s3://slides/cohort/s.tif"
    )
    assert s3.SECRET not in _everything_written(proc, out)


@pytest.fixture(scope="module")
def gcs(slide):
    """fake-gcs-server (what gcsfs's own tests run) holding the slide as gs://slides/cohort/s.tif."""
    with fake_gcs() as server:
        server.fs.mkdir("slides")
        server.fs.pipe("slides/cohort/s.tif", slide.read_bytes())
        server.fs.pipe("slides/cohort/notes.txt", b"not a slide")
        yield server


def test_score_from_gcs_is_the_local_table_and_its_output_goes_back_there(
    slide, gcs, exported_dsvdd, local_table, monkeypatch
):
    """`cyto score gs://bucket/prefix/` (gcsfs, pointed at the emulator by the standard
    STORAGE_EMULATOR_HOST) scores the slide under the prefix to the local file's table, cell
    for cell; `--out gs://...` writes the outputs there, and `--resume` trusts them through
    their seal. (One scoring run does both: the prefix in, the outputs back to the server.)"""
    token = ("--storage-option", "token=anon")
    for name, value in gcs.env().items():
        monkeypatch.setenv(name, value)
    remote_out = "gs://results/run1"
    gcs.fs.mkdir("results")
    proc = _score(["gs://slides/cohort/"], exported_dsvdd, remote_out, *token)
    assert proc.returncode == 0, proc.stderr
    written = {p.rpartition("/")[2] for p in gcs.fs.find("results/run1")}
    assert {"scores.parquet", "summary.json"} <= written, written
    got = pq.read_table(io.BytesIO(gcs.fs.cat("results/run1/s/scores.parquet")))
    assert same_table(got, local_table)
    summary = json.loads(gcs.fs.cat("results/run1/s/summary.json"))
    assert summary["slide"] == "gs://slides/cohort/s.tif"
    again = _score(["gs://slides/cohort/s.tif"], exported_dsvdd, remote_out, *token, "--resume")
    assert again.returncode == 0 and "already scored" in again.stdout + again.stderr, again.stderr


def test_a_gcs_object_replaced_while_read_stops_the_read(slide, gcs):
    """Every range names the generation opened: an object replaced after its first block
    stops the read with one line (it read the new object's bytes with no word)."""
    from cyto.slides.remote import RemoteObject, SlideChangedError, SlideURL

    gcs.fs.pipe("slides/scratch/moving.tif", slide.read_bytes())
    moving = RemoteObject(SlideURL("gs://slides/scratch/moving.tif", {"token": "anon"}), block=4096)
    assert moving.version and moving.read(0, 4) == slide.read_bytes()[:4]
    gcs.fs.pipe("slides/scratch/moving.tif", slide.read_bytes()[::-1])
    with pytest.raises(SlideChangedError, match="changed while it was read") as err:
        moving.read(moving.size - 4, 4)
    assert "\n" not in str(err.value) and "gs://slides/scratch/moving.tif" in str(err.value)


def _unreachable_gcs(exported_dsvdd, monkeypatch, tmp_path, wait: float):
    """``cyto score gs://slides/a.tif`` against a store that hangs up every connection, gcsfs's
    backoff cut to ``wait`` s a retry: (the run, the requests that reached the store)."""
    import asyncio
    import logging
    import socket
    import types

    import gcsfs.retry

    async def short_wait(_seconds):
        await asyncio.sleep(wait)

    monkeypatch.setattr(gcsfs.retry, "asyncio", types.SimpleNamespace(sleep=short_wait))
    # logging as in a user's process, where nothing set it up (pytest's capture is a handler)
    monkeypatch.setattr(logging.root, "handlers", [])
    listener = socket.create_server(("127.0.0.1", 0))
    tries = []

    def hang_up() -> None:  # every connection closed at once, unanswered
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            tries.append(conn.recv(300).split(b"\r\n")[0])
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        proc = _score(["gs://slides/a.tif"], exported_dsvdd, tmp_path / "o", "--storage-option",
                      "token=anon")  # fmt: skip
    finally:
        listener.close()
    return proc, tries


def test_an_unreachable_gcs_is_tried_as_gcsfs_tries_it_and_said_in_one_line(
    exported_dsvdd, monkeypatch, tmp_path
):
    """Round 30 (5): a `gs://` store that answers nothing took two and a half minutes and
    printed gcsfs's tracebacks, six a request, under cyto's own four tries: gcsfs retries each
    request itself (with its backoff, over half a minute), so cyto sends it once and says the
    outcome in one line. (gcsfs's backoff is cut to nothing here; the requests are counted.)"""
    proc, tries = _unreachable_gcs(exported_dsvdd, monkeypatch, tmp_path, 0.0)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "gs://slides" in line]
    assert any(
        line.endswith("gs://slides/a.tif: the connection was dropped (6 tries by gcsfs); giving up")
        for line in lines
    ), lines
    assert not any("not answered after" in line for line in lines), lines  # it was not long
    # one open of the object: gcsfs asks for it as an object and as a folder, six tries each
    # (24 requests); never those under each of four tries of cyto's (96)
    assert 0 < len(tries) <= 24, len(tries)


def test_gcsfs_retrying_a_while_is_said_once_before_it_gives_up(
    exported_dsvdd, monkeypatch, tmp_path
):
    """Hostile round 74, 2: an unreachable `gs://` store was silent for 36-53 s (gcsfs's own
    tries, unseen by cyto) before its one line, where S3 and HTTP say their first retry. A
    request not answered after a while is said once per slide, as a retry is."""
    from cyto.slides import remote

    monkeypatch.setattr(remote, "GCSFS_SAY_AFTER_S", 0.3)
    proc, _ = _unreachable_gcs(exported_dsvdd, monkeypatch, tmp_path, 0.1)  # 0.5 s a request
    said = [x for x in (proc.stdout + proc.stderr).splitlines() if "not answered after" in x]
    assert said == [
        "note: gs://slides/a.tif: not answered after 0.3 s: gcsfs tries each request up to 6 "
        "times, over about half a minute, before it gives up (said once per slide)"
    ], proc.stderr
    assert proc.stderr.rstrip().endswith("giving up") or "giving up" in proc.stdout, proc.stderr


@pytest.mark.parametrize("scheme", ["https", "dicomweb+https"])
def test_an_https_url_of_a_plain_http_server_is_said_to_be_one_once(scheme):
    """Round 30 (15): `dicomweb+https://` to a plain HTTP server said "cannot read it
    (SSLError)", and `https://` "could not be reached" after four tries. A TLS handshake
    that fails fails the same way again: said in one line, naming the plain scheme, and never
    retried."""
    from cyto.errors import CytoError

    path = "/dicom-web/studies/1.2/series/1.2.3" if scheme.startswith("dicomweb") else "/a.tif"
    with fault_server(b"x" * 4096) as server:
        host = server.url.split("://", 1)[1]
        with pytest.raises(CytoError) as err:
            open_slide(f"{scheme}://{host}{path}").read_region(0, 0, 64, 64)
        tried = server.connections
    plain = scheme.replace("https", "http")
    assert str(err.value) == (
        f"{scheme}://{host}{path}: the TLS handshake failed: does the server speak HTTPS? (a "
        f"plain HTTP server is named {plain}://)"
    )
    assert tried <= 3  # one open (fsspec's HEAD, then GET), not retried: it was four


@pytest.mark.parametrize("mode", ["ok", "no-ranges"])
def test_a_download_counts_its_bytes(slide, mode, tmp_path, monkeypatch, capfd):
    """Round 30 (9): a `--download` copy of a slide of gigabytes over a slow link was fetched
    without a word. It is counted as it comes, by range or as one whole answer (a progress
    bar; in a log, a line every ten seconds and one when it ends)."""
    from cyto.slides.remote import download, open_object, slide_ref

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CYTO_PROGRESS", "1")
    data = slide.read_bytes()
    with fault_server(data, mode) as server:
        copy = download(open_object(slide_ref(f"{server.url}/counted.tif")), chunk=64 << 10)
    assert copy.read_bytes() == data
    mib = f"{len(data) / (1 << 20):.1f}"  # to one decimal (it said 0.417671)
    lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith("fetching")]
    assert lines and lines[-1].startswith(f"fetching counted.tif: {mib}/{mib} MiB ("), lines


def test_download_copies_are_kept_within_their_bound_the_least_recently_used_going_first(
    slide, tmp_path, monkeypatch, caplog
):
    """Round 30 (11): every `--download` copy was kept for good (a cohort of NDPI slides in
    object storage filled the disk with its copies). They are kept within CYTO_DOWNLOAD_MB, the
    least recently used going first, never the copy just fetched nor one being fetched."""
    import fcntl
    import logging

    from cyto.errors import ConfigError
    from cyto.slides.remote import download, open_object, slide_ref

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    data = slide.read_bytes()
    size_mb = len(data) / (1 << 20)
    monkeypatch.setenv("CYTO_DOWNLOAD_MB", f"{2.5 * size_mb}")  # room for two copies
    with fault_server(data) as server:

        def fetch(name: str):
            return download(open_object(slide_ref(f"{server.url}/{name}")))

        a, b = fetch("a.tif"), fetch("b.tif")
        time.sleep(0.05)
        assert fetch("a.tif") == a  # used again: b is now the least recently used
        with caplog.at_level(logging.WARNING, logger="cyto.remote"):
            c = fetch("c.tif")
        assert a.is_file() and c.is_file() and not b.exists()
        assert "removed 1 --download copy not used lately" in caplog.text
        # a copy being fetched (its lock held) is never removed, even the least recently used
        with open(a.parent / f".{a.name}.lock", "a+") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            time.sleep(0.05)
            fetch("c.tif")
            d = fetch("d.tif")
            assert a.is_file() and d.is_file() and not c.exists()
        assert fetch("b.tif").read_bytes() == data  # a removed copy is fetched again
        # a bound below one copy is said (the cache stayed over it unsaid: round 62, 6)
        monkeypatch.setenv("CYTO_DOWNLOAD_MB", "0.25")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cyto.remote"):
            fetch("f.tif")
        assert "the --download copy of f.tif" in caplog.text, caplog.text
        assert "alone is over CYTO_DOWNLOAD_MB=0.25: " in caplog.text, caplog.text
        monkeypatch.setenv("CYTO_DOWNLOAD_MB", "lots")
        with pytest.raises(
            ConfigError,
            match=r"^CYTO_DOWNLOAD_MB='lots': give MiB, a number 0 or more, e.g. 20480$",
        ):
            fetch("e.tif")


def test_a_download_copy_is_never_removed_while_a_reader_has_it_open(slide, tmp_path, monkeypatch):
    """Hostile round 32 (5): the bound on the `--download` copies removed a copy a viewer had
    open (libvips opens the file again by name between reads): each of its tiles then said
    "cannot be decoded". A copy is held while a reader of it is open, in any process."""
    from cyto.slides.remote import slide_ref

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CYTO_DOWNLOAD_MB", "0")  # every copy but the newest goes, if it can
    with fault_server(slide.read_bytes(), "no-ranges") as server:  # read through copies only

        def reader(name: str):
            return open_slide(slide_ref(f"{server.url}/{name}", download=True))

        def copy(name: str) -> Path:
            return next((tmp_path / "cache" / "remote").glob(f"*/{name}"))

        viewed = reader("a.tif")
        first = viewed.read_region(0, 0, 256, 256)
        reader("b.tif").close()  # fetched after a: a is the least recently used
        assert copy("a.tif").is_file()  # it was removed here
        assert np.array_equal(viewed.read_region(0, 0, 256, 256), first)
        viewed.close()
        reader("c.tif").close()
        assert not list((tmp_path / "cache" / "remote").glob("*/a.tif"))  # let go: removed


@contextlib.contextmanager
def _silent_server():
    """A loopback port that takes every connection and never answers: (its URL, the
    connections taken so far)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    held: list = []

    def hold() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=hold, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_a_stalled_s3_endpoint_is_tried_as_cyto_says_not_five_times_more(
    exported_dsvdd, monkeypatch, tmp_path
):
    """Hostile round 31 (5): an S3 endpoint that takes connections and never answers took 20
    minutes a slide at the default timeout, saying "(4 tries)": s3fs retried each timed-out
    request five times itself under each of cyto's four. Each request is sent as often as
    cyto says."""
    with _silent_server() as (endpoint, held):
        for name, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_DEFAULT_REGION": "us-east-1",
            "CYTO_REMOTE_TIMEOUT": "0.25",
        }.items():
            monkeypatch.setenv(name, value)
        proc = _score(["s3://slides/a.tif"], exported_dsvdd, tmp_path / "o")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "failed: s3://slides/a.tif: the server did not answer within CYTO_REMOTE_TIMEOUT=0.25 s "
        "(4 tries); giving up"
    )
    # four tries of one open (s3fs asks for the object, then for it as a folder): it was forty
    assert 0 < len(held) <= 8, len(held)


def test_a_silent_http_server_is_asked_once_a_try(exported_dsvdd, monkeypatch, tmp_path):
    """Hostile round 32 (4): an HTTP server that takes connections and never answers was
    asked three times a try (fsspec's HEAD, its GET, cyto's probe of one byte), each timed
    out in turn: twelve timeouts a slide, saying "(4 tries)". One request a try."""
    monkeypatch.setenv("CYTO_REMOTE_TIMEOUT", "0.25")
    with _silent_server() as (server, held):
        proc = _score([f"{server}/a.tif"], exported_dsvdd, tmp_path / "o")
        taken = len(held)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"failed: {server}/a.tif: the server did not answer within CYTO_REMOTE_TIMEOUT=0.25 s "
        "(4 tries); giving up"
    )
    assert taken == 4, taken  # it was 12


def test_gcs_requests_are_timed_out_by_cyto_remote_timeout(monkeypatch):
    """Hostile round 32 (4): gs:// ignored CYTO_REMOTE_TIMEOUT (gcsfs waits for ever unless
    told): its file system is given the timeout, and an option the user gives wins."""
    pytest.importorskip("gcsfs")
    from cyto.slides.remote import SlideURL, _filesystem

    monkeypatch.setenv("CYTO_REMOTE_TIMEOUT", "1.5")
    fs, _, _ = _filesystem(SlideURL("gs://bucket/a.tif", options={"token": "anon"}))
    assert (fs.requests_timeout.connect, fs.requests_timeout.sock_read) == (1.5, 1.5)
    fs, _, _ = _filesystem(
        SlideURL("gs://bucket/a.tif", options={"token": "anon", "requests_timeout": 9})
    )
    assert fs.requests_timeout == 9


def test_a_retry_is_said_once_for_the_processes_of_a_run(tmp_path):
    """Orthanc stopped mid-slide: the plan's process and a tile worker each said "...;
    retrying (said once per slide)", for two causes (hostile round 49, 4). Readers in other
    processes (each with its own record of what it said) that share the slide's blocks' folder
    say it once between them; a reader with no shared folder says it as before."""
    import cyto.slides.remote as remote

    class Reader(remote.Requests):
        def __init__(self, shared):
            self.ref, self._shared = remote.slide_ref("http://127.0.0.1:9/s.tif"), shared

    saved = set(remote._SAID_RETRY)
    try:
        said = []
        for _ in range(3):  # three processes of one run: none knows what the others said
            remote._SAID_RETRY.clear()
            said.append(Reader(tmp_path)._first_to_say_retry())
        assert said == [True, False, False]
        old = time.time() - remote.RETRY_SAID_S - 5  # a run killed long ago left its marker
        os.utime(tmp_path / remote.RETRY_SAID, (old, old))
        remote._SAID_RETRY.clear()
        assert Reader(tmp_path)._first_to_say_retry()
        remote._SAID_RETRY.clear()
        assert Reader(None)._first_to_say_retry()  # no folder shared: said here
        assert not Reader(None)._first_to_say_retry()  # and once in this process
    finally:
        remote._SAID_RETRY.clear()
        remote._SAID_RETRY.update(saved)
