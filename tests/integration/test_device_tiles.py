"""JPEG tiles decoded by torchvision (issue 15's device path, run here on the CPU): the same
pixels as the slide readers, the same crops as the CPU path, and a clear fallback otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cyto.data.images import resize_rgb
from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.infer.patches import crop_cells
from cyto.slides import open_slide
from cyto.slides.device import (
    DeviceTileReader,
    crop_cells_device,
    open_device_tiles,
    resize_like_pil,
)
from tests.tables import same_table

REGIONS = [(0, 0, 300, 200), (-50, -40, 700, 600), (300, 500, 1024, 1024), (900, 950, 400, 300)]


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("device_tiles")
    cfg = SlideSynthConfig(width=1280, height=1100, seed=5, abnormal_fraction=0.1)
    return write_slide(root / "t.tif", cfg).paths[0], write_slide(root / "n.ndpi", cfg).paths[0]


def _same_as_reader(path, regions):
    grid, why = open_device_tiles(path)
    assert grid is not None, why
    reader, dev = open_slide(path), DeviceTileReader(grid, "cpu")
    try:
        for x, y, w, h in regions:
            want = reader.read_region(x, y, w, h)
            got = dev.read_region(x, y, w, h)
            assert got.dtype == torch.uint8 and tuple(got.shape) == (h, w, 3)
            assert np.array_equal(got.numpy(), want), (path, (x, y, w, h))
        assert dev.decoded_tiles > 0 and dev.bytes_read > 0
    finally:
        dev.close()
        reader.close()


def test_jpeg_tiff_tiles_decode_to_the_readers_pixels(synth):
    tif, _ = synth
    _same_as_reader(tif, REGIONS)


def test_overlapping_regions_decode_each_tile_once(synth):
    """The pipeline's reads (slide tiles with a margin, row by row) overlap: the cache decodes
    every JPEG tile once, and a cache too small for a row still gives the same pixels."""
    tif, _ = synth
    grid, _ = open_device_tiles(tif)
    size, m = 512, 96
    regions = [
        (x0 - m, y0 - m, size + 2 * m, size + 2 * m)
        for y0 in range(0, grid.height, size)
        for x0 in range(0, grid.width, size)
    ]
    cached, small = DeviceTileReader(grid, "cpu"), DeviceTileReader(grid, "cpu")
    small.cache_tiles = 1  # at most what one region needs
    reader = open_slide(tif)
    try:
        for r in regions:
            want = reader.read_region(*r)
            assert np.array_equal(cached.read_region(*r).numpy(), want)
            assert np.array_equal(small.read_region(*r).numpy(), want)
        n_tiles = len(grid.offsets)
        assert cached.decoded_tiles == n_tiles
        assert small.decoded_tiles > 1.5 * n_tiles  # margins re-read the neighbours' tiles
    finally:
        cached.close(), small.close(), reader.close()


def test_ndpi_and_other_codecs_fall_back_to_the_cpu_readers(synth, tmp_path):
    _, ndpi = synth
    grid, why = open_device_tiles(ndpi)
    assert grid is None and "CPU readers" in why
    flat = tmp_path / "flat.tif"
    import tifffile

    tifffile.imwrite(flat, np.zeros((64, 64, 3), np.uint8))  # not tiled
    grid, why = open_device_tiles(flat)
    assert grid is None and "not tiled" in why


@pytest.mark.realdata
def test_aperio_abbreviated_rgb_jpeg_and_jpeg2000(wsi_dir):
    # CMU-1: tiles share JPEGTables and store RGB samples (no YCbCr): both must be handled
    _same_as_reader(wsi_dir / "cmu1_small_region.svs", REGIONS)
    grid, why = open_device_tiles(wsi_dir / "tcga_hnsc_ts1.svs")
    assert grid is None and "not JPEG" in why


def test_device_crops_are_the_cpu_paths_bytes(synth):
    tif, _ = synth
    tile = open_slide(tif).read_region(0, 0, 1024, 1024)
    centres = np.array([[300.0, 300.0], [500.4, 611.6], [700.0, 800.0], [96.0, 96.0]])
    want = crop_cells(tile, 0, 0, centres, 192)
    t = torch.from_numpy(tile)
    assert np.array_equal(crop_cells_device(t, 0, 0, centres, 192, 192).numpy(), want)
    for out in (64, 80, 224):  # shrink by 3, by 2.4, and enlarge
        resized = np.stack([resize_rgb(c, out) for c in want])
        assert np.array_equal(crop_cells_device(t, 0, 0, centres, 192, out).numpy(), resized)
    with pytest.raises(ValueError, match="margin"):
        crop_cells_device(t, 0, 0, np.array([[10.0, 10.0]]), 192, 192)
    assert crop_cells_device(t, 0, 0, np.empty((0, 2)), 192, 64).shape == (0, 64, 64, 3)


@pytest.mark.parametrize("size,out", [(192, 97), (50, 33), (50, 200), (81, 80)])
def test_resize_is_pillows_fixed_point_arithmetic(size, out):
    crops = np.random.default_rng(size + out).integers(0, 256, (3, size, size, 3), np.uint8)
    want = np.stack([resize_rgb(c, out) for c in crops])
    assert np.array_equal(resize_like_pil(torch.from_numpy(crops), out).numpy(), want)


def test_cyto_score_decode_torch_gives_the_same_table_and_says_which_path_ran(
    synth, exported_dsvdd, tmp_path
):
    import pyarrow.parquet as pq

    from cyto.infer import ScoreOptions, score_slide

    tif, ndpi = synth
    base = ScoreOptions(mosaic=0, workers=0, tile=512)
    torch_opts = ScoreOptions(**{**base.__dict__, "decode": "torch"})
    a = score_slide(tif, exported_dsvdd, tmp_path / "cpu", base)
    b = score_slide(tif, exported_dsvdd, tmp_path / "torch", torch_opts)
    assert a["decode"] == "CPU readers" and "torchvision" in b["decode"]
    cols = ["x", "y", "score"]
    ta = pq.read_table(tmp_path / "cpu" / "scores.parquet", columns=cols)
    tb = pq.read_table(tmp_path / "torch" / "scores.parquet", columns=cols)
    assert ta.num_rows > 0 and same_table(ta, tb)
    # the whole device path (decode, torch detector, crops on the device; here the CPU)
    from dataclasses import replace

    all_torch = ScoreOptions(
        **{**torch_opts.__dict__, "detection": replace(base.detection, detector="torch")}
    )
    score_slide(tif, exported_dsvdd, tmp_path / "all", all_torch)
    tc = pq.read_table(tmp_path / "all" / "scores.parquet", columns=cols)
    assert same_table(tc, ta)
    msgs: list[str] = []
    c = score_slide(ndpi, exported_dsvdd, tmp_path / "ndpi", torch_opts, msgs.append)
    assert "NDPI" in c["decode"] and any("--decode torch" in m and "NDPI" in m for m in msgs)
