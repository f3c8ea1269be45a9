"""NDPI focal planes: the z-offset directories of a Hamamatsu file, which OpenSlide does not
expose, found and read at level 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.errors import UnsupportedSlideError
from cyto.slides.base import PLANE_SEP, SlideInfo, in_slide, padded

_END_MARKERS = frozenset(range(0xD0, 0xD8)) | {0xD9}  # RST0-7, EOI


def _set_sof_size(header: bytes, width: int, height: int) -> bytes:
    """Rewrite the frame size of a JPEG header (SOI ... SOS)."""
    out = bytearray(header)
    pos = 2
    while pos + 4 <= len(out):
        if out[pos] != 0xFF:
            break
        marker = out[pos + 1]
        length = int.from_bytes(out[pos + 2 : pos + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            out[pos + 5 : pos + 7] = height.to_bytes(2, "big")
            out[pos + 7 : pos + 9] = width.to_bytes(2, "big")
            return bytes(out)
        pos += 2 + length
    raise UnsupportedSlideError("NDPI plane: no JPEG frame header found")


class NdpiPlaneReader:
    """One focal plane of an NDPI file (a z-offset directory), which OpenSlide does not expose.

    An NDPI level is one JPEG with restart markers; tag 65426 gives where each restart interval
    starts (tifffile reads it as a grid of tiles, one per interval). A region is decoded by
    building a small JPEG from the header (frame size rewritten) and the intervals that cover
    it, renumbering the restart markers, as OpenSlide does for the main plane. Level 0 only.
    """

    def __init__(self, path: Path, page: int) -> None:
        import tifffile

        self.path = Path(path)
        try:
            with tifffile.TiffFile(self.path) as tf:
                p = tf.pages[page]
                header = p.jpegheader
                self.offsets = np.asarray(p.dataoffsets, dtype=np.int64)
                self.counts = np.asarray(p.databytecounts, dtype=np.int64)
                self.tw, self.th = int(p.tilewidth), int(p.tilelength)
                width, height = int(p.imagewidth), int(p.imagelength)
        except (OSError, IndexError, ValueError, tifffile.TiffFileError) as exc:
            raise UnsupportedSlideError(f"{path}: cannot read NDPI page {page} ({exc})") from exc
        if not header or not self.tw or width % self.tw:
            raise UnsupportedSlideError(
                f"{path}: NDPI page {page} is not one restart-marked JPEG whose intervals align "
                "with its rows"
            )
        self.header = header
        self.cols = width // self.tw
        self._fh = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        self.info = SlideInfo(
            path=self.path,
            backend="ndpi-plane",
            vendor="hamamatsu",
            width=width,
            height=height,
            level_dims=((width, height),),
            level_downsamples=(1.0,),
            mpp=None,
            objective=None,
        )

    def _read(self, x: int, y: int, w: int, h: int) -> np.ndarray:
        from io import BytesIO

        from PIL import Image

        c0, c1 = x // self.tw, (x + w - 1) // self.tw
        r0, r1 = y // self.th, (y + h - 1) // self.th
        n_cols = c1 - c0 + 1
        parts = [_set_sof_size(self.header, n_cols * self.tw, (r1 - r0 + 1) * self.th)]
        n = 0
        for r in range(r0, r1 + 1):
            k0 = r * self.cols + c0
            start = int(self.offsets[k0])
            stop = int(self.offsets[k0 + n_cols - 1] + self.counts[k0 + n_cols - 1])
            self._fh.seek(start)
            blob = self._fh.read(stop - start)
            for k in range(k0, k0 + n_cols):
                seg = blob[self.offsets[k] - start : self.offsets[k] - start + self.counts[k]]
                if len(seg) >= 2 and seg[-2] == 0xFF and seg[-1] in _END_MARKERS:
                    seg = seg[:-2]  # the marker after the interval
                if n:
                    parts.append(bytes((0xFF, 0xD0 + (n - 1) % 8)))
                parts.append(seg)
                n += 1
        parts.append(b"\xff\xd9")
        try:
            img = np.asarray(Image.open(BytesIO(b"".join(parts))).convert("RGB"))
        except OSError as exc:
            raise UnsupportedSlideError(f"{self.path}: cannot decode NDPI plane ({exc})") from exc
        oy, ox = y - r0 * self.th, x - c0 * self.tw
        return img[oy : oy + h, ox : ox + w]

    def read_region(self, x: int, y: int, w: int, h: int, level: int = 0) -> np.ndarray:
        if level != 0:
            raise UnsupportedSlideError("NDPI focal planes are read at level 0 only")
        box = in_slide(x, y, w, h, self.info.width, self.info.height)
        return padded(self._read(*box) if box else None, box, x, y, w, h)

    def close(self) -> None:
        self._fh.close()


def ndpi_planes(path: Path) -> list[tuple[float, str]]:
    """The extra focal planes of an NDPI file as (z in um, plane spec for :func:`open_plane`)."""
    import logging

    import tifffile

    # tifffile logs files it cannot fully parse (64-bit NDPI offsets); those have no extra planes
    logging.getLogger("tifffile").setLevel(logging.ERROR)
    try:
        with tifffile.TiffFile(path) as tf:
            pages = list(tf.pages)
            if not pages:  # e.g. 64-bit NDPI offsets that tifffile cannot follow
                return []
            base = pages[0]
            z0 = base.tags[65424].value if 65424 in base.tags else 0
            found = []
            for i, p in enumerate(pages[1:], start=1):
                if p.imagewidth != base.imagewidth or 65424 not in p.tags:
                    continue
                z = p.tags[65424].value
                if z != z0:
                    found.append(((z - z0) / 1000.0, f"{path}{PLANE_SEP}{i}"))
    except (OSError, ValueError, IndexError, tifffile.TiffFileError):
        return []
    return sorted(found)
