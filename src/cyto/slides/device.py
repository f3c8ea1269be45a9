"""Slide tiles decoded, and cells cut, where the engine runs (issue 15).

Tiled TIFFs whose tiles are JPEG (pyramidal TIFF, Aperio SVS) are read as raw tile bytes at the
offsets the TIFF records and decoded in one batch by torchvision on the engine's device: nvJPEG on
CUDA, libjpeg-turbo on the CPU. Everything else (NDPI's restart-interval JPEG, JPEG 2000, other
codecs, files tifffile cannot follow) keeps the CPU readers of :mod:`cyto.slides.readers`;
:func:`open_device_tiles` says which, and why.

Two details make the bytes decode as OpenSlide decodes them:

* abbreviated tiles (Aperio) get the shared ``JPEGTables`` spliced in front of their scan;
* tiles whose TIFF photometric is RGB (not YCbCr) are JPEG streams of RGB samples, which a
  decoder would take for YCbCr without a marker: an Adobe APP14 segment with transform 0 says
  "no colour transform", as libtiff's ``JPEGCOLORMODE`` does for OpenSlide.

:func:`crop_cells_device` cuts cell crops from a decoded tile by indexing (no copy to the host) and
resizes them as the training images were: Pillow's box filter when shrinking, bicubic when
enlarging, reproduced in its fixed-point arithmetic so the crops are the CPU path's bytes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cyto.runtime import devices
from cyto.slides.base import PAD

JPEG = 7  # TIFF compression: JPEG ("new style")
PHOTOMETRIC_RGB, PHOTOMETRIC_YCBCR = 2, 6
# APP14 "Adobe", version 100, flags 0, transform 0: the samples are RGB, not YCbCr
_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"


@dataclass(frozen=True)
class TileGrid:
    """Level 0 of a JPEG-tiled TIFF: geometry and where each tile's bytes are."""

    path: Path
    width: int
    height: int
    tile_w: int
    tile_h: int
    offsets: tuple[int, ...]
    counts: tuple[int, ...]
    tables: bytes  # JPEGTables (SOI ... EOI), or b"" for self-contained tiles
    rgb: bool  # photometric RGB: mark the streams as untransformed

    @property
    def across(self) -> int:
        return -(-self.width // self.tile_w)


def open_device_tiles(path: Path | str) -> tuple[TileGrid | None, str]:
    """The slide's JPEG tile grid, or None and the reason the CPU readers must decode it."""
    import logging

    import tifffile

    from cyto.slides.dicom import is_dicom_file
    from cyto.slides.remote import SlideURL

    if isinstance(path, SlideURL):
        if path.dicomweb:
            return None, "a DICOMweb slide (its frames decoded by cyto): CPU readers"
        return None, "a remote slide (read by libvips in place): CPU readers"
    path = Path(path)
    if path.is_dir() or is_dicom_file(path):
        return None, "DICOM (OpenSlide's reader): CPU readers"
    logging.getLogger("tifffile").setLevel(logging.ERROR)
    try:
        with tifffile.TiffFile(path) as tf:
            if tf.is_ndpi:
                return None, "NDPI (restart-interval JPEG): CPU readers"
            if not tf.pages:
                return None, "tifffile cannot follow this file's directories: CPU readers"
            page = tf.pages[0]
            if not page.is_tiled:
                return None, "level 0 is not tiled: CPU readers"
            if page.compression != JPEG:
                name = getattr(page.compression, "name", str(page.compression))
                return None, f"tiles are {name}, not JPEG: CPU readers"
            if (
                page.samplesperpixel != 3
                or page.bitspersample != 8
                or page.planarconfig != 1
                or page.photometric not in (PHOTOMETRIC_RGB, PHOTOMETRIC_YCBCR)
            ):
                return None, "tiles are not 8-bit interleaved RGB/YCbCr: CPU readers"
            grid = TileGrid(
                path=path,
                width=int(page.imagewidth),
                height=int(page.imagelength),
                tile_w=int(page.tilewidth),
                tile_h=int(page.tilelength),
                offsets=tuple(int(o) for o in page.dataoffsets),
                counts=tuple(int(c) for c in page.databytecounts),
                tables=bytes(page.jpegtables or b""),
                rgb=page.photometric == PHOTOMETRIC_RGB,
            )
    except (OSError, ValueError, IndexError, tifffile.TiffFileError) as exc:
        return None, f"tifffile cannot read it ({exc}): CPU readers"
    down = -(-grid.height // grid.tile_h)
    if len(grid.offsets) != grid.across * down:
        return None, "tile table does not match the level's size: CPU readers"
    return grid, "JPEG tiles decoded by torchvision on the engine's device"


def _stream(grid: TileGrid, raw: bytes) -> bytes:
    """A tile's bytes as a complete JPEG: tables spliced in, RGB marked as such."""
    if grid.tables:  # tables = SOI ... EOI, tile = SOI ... : SOI + tables + tile scan
        raw = grid.tables[:-2] + raw[2:]
    if grid.rgb:
        raw = raw[:2] + _ADOBE_RGB + raw[2:]
    return raw


#: decoded tiles kept, at most, whatever the slide's width (a 512 px RGB tile is 0.75 MiB)
CACHE_BYTES = 256 << 20


class DeviceTileReader:
    """``read_region`` of level 0 into a (h, w, 3) uint8 tensor on ``device``; outside the slide
    is white, as the CPU readers pad it.

    Regions overlap (each slide tile is read with a margin), so decoded tiles are kept in a
    least-recently-used cache on the device: the tile rows a region spans, across the whole
    slide, within :data:`CACHE_BYTES` (``cache_tiles`` sets another count). Read row by row,
    each tile is then decoded once instead of up to four times (``decoded_tiles`` counts)."""

    def __init__(self, grid: TileGrid, device: torch.device | str = "cpu") -> None:
        from collections import OrderedDict

        self.grid, self.device = grid, torch.device(device)
        self._file = open(grid.path, "rb")  # noqa: SIM115 (closed by close())
        self.decoded_tiles = 0
        self.bytes_read = 0
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.cache_tiles: int | None = None  # None: the tile rows of a region, slide-wide
        self._auto = 0

    def close(self) -> None:
        self._file.close()
        self._cache.clear()

    def _raw(self, index: int) -> bytes:
        g = self.grid
        self._file.seek(g.offsets[index])
        raw = self._file.read(g.counts[index])
        self.bytes_read += len(raw)
        return _stream(g, raw)

    def _tiles(self, indices: list[int], keep: int) -> list[torch.Tensor]:
        """The decoded (3, tile_h, tile_w) tiles, those not cached decoded in one batch."""
        from torchvision.io import ImageReadMode, decode_jpeg

        missing = [i for i in indices if i not in self._cache]
        if missing:
            data = [torch.frombuffer(bytearray(self._raw(i)), dtype=torch.uint8) for i in missing]
            devices.count_h2d(sum(len(d) for d in data), self.device)  # the JPEG bytes go over
            with warnings.catch_warnings():  # torchvision 0.29 points to TorchCodec; still works
                warnings.simplefilter("ignore", DeprecationWarning)
                decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
            self.decoded_tiles += len(decoded)
            self._cache.update(zip(missing, decoded, strict=True))
        out = []
        for i in indices:
            self._cache.move_to_end(i)
            out.append(self._cache[i])
        while len(self._cache) > max(keep, len(indices)):
            self._cache.popitem(last=False)
        return out

    def read_region(self, x: int, y: int, w: int, h: int) -> torch.Tensor:
        g = self.grid
        out = torch.full((h, w, 3), PAD, dtype=torch.uint8, device=self.device)
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, g.width), min(y + h, g.height)
        if x0 >= x1 or y0 >= y1:
            return out
        cols = range(x0 // g.tile_w, (x1 - 1) // g.tile_w + 1)
        rows = range(y0 // g.tile_h, (y1 - 1) // g.tile_h + 1)
        where = [(r, c) for r in rows for c in cols]
        if self.cache_tiles is None:  # the next row of regions re-reads these rows' tiles
            fits = CACHE_BYTES // (g.tile_w * g.tile_h * 3)
            self._auto = max(self._auto, len(rows) * g.across + len(cols))
            keep = min(self._auto, fits)
        else:
            keep = self.cache_tiles
        tiles = self._tiles([r * g.across + c for r, c in where], keep)
        for (r, c), t in zip(where, tiles, strict=True):
            tx, ty = c * g.tile_w, r * g.tile_h
            ax, ay = max(x0, tx), max(y0, ty)  # the part of this tile inside the region
            bx, by = min(x1, tx + g.tile_w), min(y1, ty + g.tile_h)
            out[ay - y : by - y, ax - x : bx - x] = t[
                :, ay - ty : by - ty, ax - tx : bx - tx
            ].permute(1, 2, 0)
        return out


def crop_cells_device(
    tile: torch.Tensor, tile_x: int, tile_y: int, centres: np.ndarray, size: int, out_size: int
) -> torch.Tensor:
    """(N, out_size, out_size, 3) uint8 crops centred on level-0 ``centres`` from a (H, W, 3)
    tile whose top-left pixel is at (``tile_x``, ``tile_y``), on the tile's device: the crops of
    :func:`cyto.infer.patches.crop_cells`, resized like :func:`cyto.data.images.resize_rgb`."""
    xy = np.asarray(centres, dtype=np.float64)[:, :2]
    n = len(xy)
    if n == 0:
        return torch.empty((0, out_size, out_size, 3), dtype=torch.uint8, device=tile.device)
    half = size // 2
    x0 = np.rint(xy[:, 0]).astype(np.int64) - half - tile_x
    y0 = np.rint(xy[:, 1]).astype(np.int64) - half - tile_y
    if (
        (x0 < 0).any()
        or (y0 < 0).any()
        or (x0 + size > tile.shape[1]).any()
        or (y0 + size > tile.shape[0]).any()
    ):
        raise ValueError(f"a crop does not fit in the tile; read it with a margin of {half} px")
    step = torch.arange(size, device=tile.device)
    rows = torch.from_numpy(y0).to(tile.device)[:, None] + step  # (N, size)
    cols = torch.from_numpy(x0).to(tile.device)[:, None] + step
    crops = tile[rows[:, :, None], cols[:, None, :]]  # (N, size, size, 3)
    if size == out_size:
        return crops
    return resize_like_pil(crops, out_size)


PRECISION_BITS = 22  # Pillow's fixed point for 8-bit images (32 - 8 - 2)


def _box(x: np.ndarray) -> np.ndarray:
    return ((x > -0.5) & (x <= 0.5)).astype(np.float64)


def _bicubic(x: np.ndarray) -> np.ndarray:
    a, x = -0.5, np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def pil_weights(in_size: int, out_size: int) -> np.ndarray:
    """(out, in) integer weights of Pillow's resize along one axis, box filter when shrinking
    and bicubic when enlarging (``resize_rgb``), in Pillow's fixed point (``precompute_coeffs``
    and ``normalize_coeffs_8bpc``), as float64 holding integers."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    kernel, support = (_box, 0.5) if in_size > out_size else (_bicubic, 2.0)
    support *= filterscale
    w = np.zeros((out_size, in_size))
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        k = kernel((np.arange(xmin, xmax) - center + 0.5) / filterscale)
        total = k.sum()
        if total != 0.0:
            k = k / total
        one = float(1 << PRECISION_BITS)
        w[xx, xmin:xmax] = np.where(k < 0, np.trunc(-0.5 + k * one), np.trunc(0.5 + k * one))
    return w


def _pass(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One Pillow pass along the last axis: rounded fixed-point sum, clipped to 0..255."""
    acc = torch.matmul(x, w.T) + float(1 << (PRECISION_BITS - 1))
    return torch.floor(acc / float(1 << PRECISION_BITS)).clamp_(0, 255)


def resize_like_pil(crops: torch.Tensor, out_size: int) -> torch.Tensor:
    """(N, S, S, 3) uint8 crops resized to ``out_size`` as ``cyto.data.images.resize_rgb`` does
    with Pillow: the horizontal pass, rounded to 8 bits, then the vertical pass (float64 holds
    Pillow's integer sums exactly)."""
    size = crops.shape[1]
    w = torch.from_numpy(pil_weights(size, out_size)).to(crops.device)
    x = crops.permute(0, 3, 1, 2).to(torch.float64)  # (N, 3, H, W)
    x = _pass(x, w)  # along the rows (width)
    x = _pass(x.transpose(2, 3), w).transpose(2, 3)  # down the columns (height)
    return x.to(torch.uint8).permute(0, 2, 3, 1).contiguous()
