"""Streaming writers for pyramidal JPEG TIFF and Hamamatsu NDPI.

Both are written level by level from horizontal strips, so memory depends on the slide width, not
its area. Each level's compressed data goes to a spool file as it is produced; :func:`assemble`
then copies the spools into one file (data first, then its directory) in bounded chunks.

* Pyramidal TIFF: one tiled JPEG directory per level in the main IFD chain (what libvips' tiffload
  and OpenSlide's generic-tiff reader expect), YCbCr 4:4:4, resolution in pixels per centimetre.
* NDPI (OpenSlide vendor ``hamamatsu``): one directory per level holding a single JPEG with restart
  markers every ``tile`` pixels, the Hamamatsu tags 65420-65424 and the MCU-starts tag 65426. The
  JPEG of a whole level is built by stitching independently encoded strips: baseline JPEG with
  standard Huffman tables and restart markers resets the DC predictors at every marker, so strip
  scans can be joined at marker boundaries once the markers are renumbered. Next-IFD pointers are
  8 bytes, the layout of NDPI's 64-bit offset extension, so OpenSlide's NDPI parser reads them
  unambiguously.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image

from cyto.errors import SlideWriteError

# TIFF field types
BYTE, ASCII, SHORT, LONG, RATIONAL, SLONG, FLOAT = 1, 2, 3, 4, 5, 9, 11
_TYPE_FMT = {BYTE: "B", ASCII: "s", SHORT: "H", LONG: "I", RATIONAL: "II", SLONG: "i", FLOAT: "f"}
_TYPE_SIZE = {BYTE: 1, ASCII: 1, SHORT: 2, LONG: 4, RATIONAL: 8, SLONG: 4, FLOAT: 4}

# Hamamatsu NDPI private tags
NDPI_FORMAT_FLAG = 65420
NDPI_SOURCELENS = 65421
NDPI_XOFFSET = 65422
NDPI_YOFFSET = 65423
NDPI_ZOFFSET = 65424
NDPI_MCU_STARTS = 65426

_RST = re.compile(rb"\xff[\xd0-\xd7]")
_MAX_CLASSIC = 2**32 - 1


@dataclass(frozen=True)
class Tag:
    code: int
    type: int
    value: tuple | bytes | str

    def payload(self) -> tuple[int, bytes]:
        """``(count, little-endian bytes)`` of the value."""
        if self.type == ASCII:
            raw = (
                self.value if isinstance(self.value, bytes) else str(self.value).encode()
            ) + b"\0"
            # OpenSlide 4.0.1 assumes ASCII values live out of line: keep them >= 5 bytes.
            raw = raw.ljust(5, b"\0")
            return len(raw), raw
        values = tuple(self.value)  # type: ignore[arg-type]
        if self.type == RATIONAL:
            flat = [int(v) for pair in values for v in pair]
            return len(values), struct.pack(f"<{len(flat)}I", *flat)
        return len(values), struct.pack(f"<{len(values)}{_TYPE_FMT[self.type]}", *values)


def build_ifd(tags: list[Tag], offset: int, ndpi: bool) -> tuple[bytes, int]:
    """Encode one directory placed at ``offset``; returns ``(bytes, next_pointer_position)``.

    Out-of-line values follow the directory. With ``ndpi`` the next pointer is 8 bytes and one
    zero 4-byte word per entry follows it (the high halves of NDPI's 64-bit offsets).
    """
    tags = sorted(tags, key=lambda t: t.code)
    n = len(tags)
    ptr_size = 8 if ndpi else 4
    head = 2 + 12 * n + ptr_size + (4 * n if ndpi else 0)
    extra = bytearray()
    entries = bytearray(struct.pack("<H", n))
    for t in tags:
        count, raw = t.payload()
        if len(raw) <= 4:
            entries += struct.pack("<HHI", t.code, t.type, count) + raw.ljust(4, b"\0")
        else:
            pos = offset + head + len(extra)
            if pos > _MAX_CLASSIC:
                raise SlideWriteError("slide file exceeds 4 GiB; write a smaller slide")
            entries += struct.pack("<HHII", t.code, t.type, count, pos)
            extra += raw
            if len(extra) % 2:
                extra += b"\0"
    next_pos = offset + len(entries)
    entries += b"\0" * ptr_size
    if ndpi:
        entries += b"\0" * (4 * n)
    return bytes(entries + extra), next_pos


def encode_jpeg(rgb: np.ndarray, quality: int, restart_blocks: int = 0) -> bytes:
    """Baseline JPEG, 4:4:4 chroma (OpenSlide cannot read 4:2:0 NDPI), standard Huffman tables."""
    buf = io.BytesIO()
    kwargs = {"restart_marker_blocks": restart_blocks} if restart_blocks else {}
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality, subsampling=0, optimize=False, **kwargs)
    return buf.getvalue()


def split_jpeg(data: bytes) -> tuple[bytes, bytes]:
    """``(header up to and including the SOS segment, entropy-coded data without EOI)``."""
    pos = 2  # after SOI
    while pos < len(data):
        if data[pos] != 0xFF:
            raise SlideWriteError("malformed JPEG from the encoder")
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        pos += 2 + length
        if marker == 0xDA:  # SOS
            if data[-2:] != b"\xff\xd9":
                raise SlideWriteError("JPEG from the encoder lacks EOI")
            return data[:pos], data[pos:-2]
    raise SlideWriteError("JPEG from the encoder has no SOS marker")


def set_jpeg_height(header: bytes, height: int) -> bytes:
    """Rewrite the frame height of a baseline (SOF0) header."""
    pos = 2
    while pos < len(header):
        marker = header[pos + 1]
        length = struct.unpack(">H", header[pos + 2 : pos + 4])[0]
        if marker == 0xC0:
            return header[: pos + 5] + struct.pack(">H", height) + header[pos + 7 :]
        pos += 2 + length
    raise SlideWriteError("JPEG header has no baseline SOF0 frame")


@dataclass
class TiledLevel:
    """Collects strips of one pyramid level and spools its JPEG tiles."""

    width: int
    height: int
    tile: int
    quality: int
    spool: BinaryIO
    chunks: list[tuple[int, int]] = field(default_factory=list)
    _rows: list[np.ndarray] = field(default_factory=list)
    _buffered: int = 0
    _emitted: int = 0

    def push(self, strip: np.ndarray) -> None:
        self._rows.append(strip)
        self._buffered += strip.shape[0]
        while self._buffered >= self.tile:
            block = np.concatenate(self._rows, axis=0)
            self._emit(block[: self.tile])
            rest = block[self.tile :]
            self._rows = [rest] if rest.shape[0] else []
            self._buffered = rest.shape[0]

    def finish(self) -> None:
        if self._buffered:
            block = np.concatenate(self._rows, axis=0)
            pad = self.tile - block.shape[0]
            self._emit(np.pad(block, ((0, pad), (0, 0), (0, 0)), mode="edge"))
            self._rows, self._buffered = [], 0
        expected = -(-self.height // self.tile)
        if self._emitted != expected:
            raise SlideWriteError(
                f"level {self.width}x{self.height}: {self._emitted} tile rows "
                f"written, {expected} expected"
            )

    def _emit(self, rows: np.ndarray) -> None:
        t = self.tile
        across = -(-self.width // t)
        if rows.shape[1] < across * t:
            rows = np.pad(rows, ((0, 0), (0, across * t - rows.shape[1]), (0, 0)), mode="edge")
        for i in range(across):
            data = encode_jpeg(np.ascontiguousarray(rows[:, i * t : (i + 1) * t]), self.quality)
            self.chunks.append((self.spool.tell(), len(data)))
            self.spool.write(data)
        self._emitted += 1

    def tags(self) -> list[Tag]:
        return [
            Tag(322, LONG, (self.tile,)),
            Tag(323, LONG, (self.tile,)),
            Tag(324, LONG, tuple(o for o, _ in self.chunks)),  # rebased in assemble()
            Tag(325, LONG, tuple(n for _, n in self.chunks)),
        ]


@dataclass
class NdpiLevel:
    """Builds one NDPI level: a single JPEG with restart markers, stitched from strips."""

    width: int
    height: int
    tile: int
    quality: int
    spool: BinaryIO
    mcu_starts: list[int] = field(default_factory=list)
    _header: bytes | None = None
    _segments: int = 0
    _rows: int = 0
    _start: int = 0
    _end: int = 0

    def __post_init__(self) -> None:
        if self.width % self.tile or self.height % 8:
            raise SlideWriteError(
                f"NDPI level {self.width}x{self.height}: width must be a multiple of {self.tile} "
                "and height a multiple of 8"
            )
        self._start = self.spool.tell()

    def push(self, strip: np.ndarray) -> None:
        if strip.shape[0] % 8:
            raise SlideWriteError("NDPI strips must be a multiple of 8 rows high")
        data = encode_jpeg(np.ascontiguousarray(strip), self.quality, self.tile // 8)
        header, entropy = split_jpeg(data)
        if self._header is None:
            self._header = set_jpeg_height(header, self.height)
            self.spool.write(self._header)
        parts = _RST.split(entropy)
        expected = (self.width // self.tile) * (strip.shape[0] // 8)
        if len(parts) != expected:
            raise SlideWriteError(
                f"JPEG strip has {len(parts)} restart intervals, {expected} expected"
            )
        for part in parts:
            if self._segments:
                self.spool.write(bytes((0xFF, 0xD0 + (self._segments - 1) % 8)))
            self.mcu_starts.append(self.spool.tell() - self._start)
            self.spool.write(part)
            self._segments += 1
        self._rows += strip.shape[0]

    def finish(self) -> None:
        self.spool.write(b"\xff\xd9")
        self._end = self.spool.tell()
        if self._rows != self.height:
            raise SlideWriteError(f"NDPI level got {self._rows} rows, {self.height} expected")

    @property
    def chunks(self) -> list[tuple[int, int]]:
        return [(self._start, self._end - self._start)]

    def tags(self) -> list[Tag]:
        return [
            Tag(273, LONG, (self._start,)),  # rebased in assemble()
            Tag(278, LONG, (self.height,)),
            Tag(279, LONG, (self._end - self._start,)),
            Tag(NDPI_MCU_STARTS, LONG, tuple(self.mcu_starts)),
        ]


@dataclass
class Page:
    """One directory to write: its level, the spool holding its data and its other tags."""

    level: TiledLevel | NdpiLevel
    spool_path: Path
    tags: list[Tag]


_OFFSET_TAGS = (273, 324)


def assemble(out: Path, pages: list[Page], ndpi: bool) -> None:
    """Write pages (data, then directory) into ``out`` and link the directory chain."""
    with open(out, "wb") as f:
        f.write(b"II*\0" + b"\0" * (8 if ndpi else 4))
        prev_next = 4
        for page in pages:
            base = f.tell()
            with open(page.spool_path, "rb") as src:
                lo, hi = page.level.chunks[0][0], sum(page.level.chunks[-1])
                src.seek(lo)
                _copy(src, f, hi - lo)
            ifd_at = f.tell()
            if ifd_at % 2:
                f.write(b"\0")
                ifd_at += 1
            tags = []
            for t in page.level.tags() + page.tags:
                if t.code in _OFFSET_TAGS:
                    t = Tag(t.code, LONG, tuple(base + v - lo for v in t.value))  # type: ignore[union-attr]
                tags.append(t)
            if ifd_at > _MAX_CLASSIC:
                raise SlideWriteError(f"{out}: slide exceeds 4 GiB; write a smaller slide")
            raw, next_pos = build_ifd(tags, ifd_at, ndpi)
            f.write(raw)
            end = f.tell()
            f.seek(prev_next)
            f.write(struct.pack("<I", ifd_at))
            f.seek(end)
            prev_next = next_pos


def _copy(src: BinaryIO, dst: BinaryIO, n: int, chunk: int = 8 << 20) -> None:
    while n > 0:
        buf = src.read(min(chunk, n))
        if not buf:
            raise SlideWriteError("spool file ended early")
        dst.write(buf)
        n -= len(buf)
