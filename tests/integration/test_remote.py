"""Slides by URL, read in place from real servers started here on loopback (tests/servers.py):
nginx over HTTP with range requests. The same slide scored from the server and from its file
gives the same score table, cell for cell."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.slides import open_slide
from tests.cli_runner import run_cyto
from tests.servers import nginx

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
    served = [s for s in http.served() if s[2].startswith("GET /s.tif")]
    assert all(status == 206 for status, *_ in served)  # ranges only, never the whole file
    assert all(if_match not in ("", "-") for *_, if_match in served)  # pinned to its ETag
    assert sum(size for _, size, *_ in served) <= slide.stat().st_size


def test_score_over_http_is_the_local_table(slide, http, exported_dsvdd, tmp_path):
    """`cyto score http://...` writes the table `cyto score FILE` writes, cell for cell; the
    summary names the URL and the slide's remote identity."""
    tables = {}
    for name, source in (("local", str(slide)), ("http", f"{http.url}/s.tif")):
        out = tmp_path / name
        proc = run_cyto(
            "score", source, "--model", str(exported_dsvdd), "--out", str(out), "--workers", "1"
        )
        assert proc.returncode == 0, proc.stderr
        tables[name] = pq.read_table(out / "s" / "scores.parquet")
        summary = json.loads((out / "s" / "summary.json").read_text())
        assert summary["slide"] == source if name == "http" else True
    assert tables["local"].num_rows > 20
    assert tables["http"].to_pydict() == tables["local"].to_pydict()
