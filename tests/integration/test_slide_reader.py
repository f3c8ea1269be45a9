"""Slide readers: the real SVS / JPEG 2000 SVS / NDPI files and synthetic slides, through both
backends; edge padding; clear errors for bad files."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import InputPathError, UnsupportedSlideError
from cyto.slides import open_slide

REAL = {
    "cmu1_small_region.svs": ("aperio", (2220, 2967), 0.499),
    "tcga_hnsc_ts1.svs": ("aperio", (4443, 3567), None),
    "cmu1_small_region_rewrapped.ndpi": ("hamamatsu", (2048, 2048), 0.499),
}


@pytest.mark.openslide
@pytest.mark.pyvips
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_slides_through_both_backends(wsi_dir, name):
    import pyvips

    vendor, size, mpp = REAL[name]
    readers = [open_slide(wsi_dir / name, backend="openslide")]
    if pyvips.type_find("VipsForeign", "openslideload"):
        readers.append(open_slide(wsi_dir / name, backend="pyvips"))
    regions = []
    for r in readers:
        assert r.info.vendor == vendor
        assert (r.info.width, r.info.height) == size
        assert r.info.mpp == (pytest.approx(mpp, rel=1e-3) if mpp else None)
        region = r.read_region(r.info.width // 2, r.info.height // 2, 256, 192)
        assert region.shape == (192, 256, 3) and region.dtype == np.uint8
        regions.append(region)
        top = len(r.info.level_dims) - 1
        lw, lh = r.info.level_dims[top]
        whole = r.read_region(0, 0, lw, lh, level=top)
        assert whole.shape == (lh, lw, 3) and whole.std() > 5  # tissue, not blank glass
        r.close()
    for other in regions[1:]:
        assert np.abs(other.astype(int) - regions[0]).max() <= 2


@pytest.fixture(scope="module")
def synth_slides(tmp_path_factory):
    root = tmp_path_factory.mktemp("slides")
    cfg = SlideSynthConfig(width=1024, height=1024, seed=3, abnormal_fraction=0.1)
    return write_slide(root / "t.tif", cfg).paths[0], write_slide(root / "n.ndpi", cfg).paths[0]


@pytest.mark.pyvips
def test_synthetic_slides_and_edge_padding(synth_slides):
    tif, ndpi = synth_slides
    t = open_slide(tif)
    assert t.info.backend == "pyvips-tiffload" and t.info.mpp == pytest.approx(0.12, rel=1e-4)
    inside = t.read_region(0, 0, 100, 100)
    edge = t.read_region(-30, -40, 130, 140)
    np.testing.assert_array_equal(edge[40:, 30:], inside)
    assert (edge[:40] == 255).all() and (edge[:, :30] == 255).all()
    beyond = t.read_region(2000, 2000, 50, 50)
    assert (beyond == 255).all()
    n = open_slide(ndpi)
    assert n.info.vendor == "hamamatsu" and n.info.objective == 60
    assert (
        np.abs(
            n.read_region(300, 300, 128, 128).astype(int) - t.read_region(300, 300, 128, 128)
        ).mean()
        < 2
    )


@pytest.mark.openslide
def test_ndpi_plane_reader_decodes_exactly_what_openslide_does(synth_slides):
    from cyto.slides import open_plane
    from cyto.slides.ndpi import NdpiPlaneReader, ndpi_planes

    _, ndpi = synth_slides
    reference = open_slide(ndpi)
    plane0 = NdpiPlaneReader(ndpi, 0)  # the main plane, which OpenSlide reads too
    for x, y, w, h in [(0, 0, 300, 200), (517, 203, 333, 301), (900, 950, 300, 300)]:
        np.testing.assert_array_equal(
            plane0.read_region(x, y, w, h), reference.read_region(x, y, w, h)
        )
    assert ndpi_planes(ndpi) == []  # a single-plane file has no extra planes
    assert open_plane(f"{ndpi}#page=0").info.backend == "ndpi-plane"
    with pytest.raises(UnsupportedSlideError, match="page 99"):
        NdpiPlaneReader(ndpi, 99)


def test_bad_inputs(tmp_path, wsi_dir):
    with pytest.raises(InputPathError, match="does not exist"):
        open_slide(tmp_path / "missing.ndpi")
    text = tmp_path / "notes.ndpi"
    text.write_text("this is not a slide, just text with a slide's name\n" * 3)
    with pytest.raises(UnsupportedSlideError, match="not a whole-slide image"):
        open_slide(text)
    empty = tmp_path / "empty.svs"
    empty.write_bytes(b"")
    with pytest.raises(UnsupportedSlideError, match=r"empty file \(0 bytes\)"):
        open_slide(empty)
    # a few bytes: a TIFF's start cut short, or no slide at all (a text file of 6 bytes named
    # .tif was "empty or truncated": hostile round 58, 9)
    (tmp_path / "hello.tif").write_bytes(b"hello\n")
    with pytest.raises(UnsupportedSlideError, match=r"not a whole-slide image \(6 bytes, neither"):
        open_slide(tmp_path / "hello.tif")
    (tmp_path / "one.tif").write_bytes(b"I")  # one byte, said as one (round 59, 11)
    with pytest.raises(UnsupportedSlideError, match=r"truncated file \(1 byte: the start"):
        open_slide(tmp_path / "one.tif")
    (tmp_path / "cut.tif").write_bytes(b"II*\x00\x08\x00")
    with pytest.raises(
        UnsupportedSlideError, match=r"truncated file \(6 bytes: the start of a TIFF"
    ):
        open_slide(tmp_path / "cut.tif")
    with pytest.raises(UnsupportedSlideError, match="unknown slide backend"):
        open_slide(wsi_dir / "cmu1_small_region.svs", backend="gdal")
    truncated = tmp_path / "cut.ndpi"
    data = (wsi_dir / "cmu1_small_region_rewrapped.ndpi").read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    with pytest.raises(UnsupportedSlideError, match="cut.ndpi"):
        reader = open_slide(truncated)
        reader.read_region(0, 1500, 512, 512)  # the part past the cut


def test_transparent_pixels_become_the_padding_and_opaque_tiles_keep_their_rgb():
    """OpenSlide hands RGBA: an opaque tile (nearly all of them) is its RGB, unchanged (and
    not composited pixel by pixel), and a tile with transparent pixels shows white there."""
    from cyto.slides.base import PAD, _to_rgb

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (64, 48, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    opaque = _to_rgb(rgba)
    assert opaque.shape == (64, 48, 3) and opaque.flags.c_contiguous
    assert np.array_equal(opaque, rgba[..., :3])
    rgba[:8, :, 3] = 0  # outside the scanned area
    rgba[8:16, :, 3] = 128
    mixed = _to_rgb(rgba)
    assert (mixed[:8] == PAD).all() and np.array_equal(mixed[16:], rgba[16:, :, :3])
    half = rgba[8:16, :, :3].astype(np.float32) * (128 / 255) + PAD * (1 - 128 / 255)
    assert np.abs(mixed[8:16].astype(int) - np.rint(half)).max() <= 1


def test_the_tissue_mask_marks_stained_pixels_and_their_neighbours():
    """Optical density summed over the channels above 0.25, dilated by 3 px; every RGB value is
    measured as the per-pixel float32 formula does (``od = -log((rgb + 1) / 256)``)."""
    from types import SimpleNamespace

    from scipy import ndimage

    from cyto.slides.grid import tissue_mask

    rng = np.random.default_rng(0)
    low = np.full((64, 80, 3), 250, dtype=np.uint8)  # glass
    low[20:30, 10:20] = rng.integers(0, 256, size=(10, 10, 3), dtype=np.uint8)
    low[50, 70] = (200, 170, 210)  # one faintly stained pixel
    info = SimpleNamespace(level_dims=((800, 640), (80, 64)), level_downsamples=(1.0, 10.0))
    reader = SimpleNamespace(info=info, read_region=lambda x, y, w, h, level: low)
    mask, ds = tissue_mask(reader)
    od = -np.log((low.astype(np.float32) + 1.0) / 256.0).sum(axis=2)
    assert ds == 10.0
    np.testing.assert_array_equal(mask, ndimage.binary_dilation(od > 0.25, iterations=3))
    assert mask[50, 70] and mask[53, 70] and not mask[54, 70] and not mask[5, 60]
    # every pair of red and green values (blue at 255): the same threshold either way
    grid = np.full((256, 256, 3), 255, dtype=np.uint8)
    grid[..., 0], grid[..., 1] = np.meshgrid(*(np.arange(256, dtype=np.uint8),) * 2)
    reader.read_region = lambda x, y, w, h, level: grid
    info.level_dims = ((2560, 2560), (256, 256))
    mask, _ = tissue_mask(reader)
    od = -np.log((grid.astype(np.float32) + 1.0) / 256.0).sum(axis=2)
    np.testing.assert_array_equal(mask, ndimage.binary_dilation(od > 0.25, iterations=3))
