"""A slide as a deep-zoom pyramid: 256-pixel JPEG tiles read on request through the slide's own
readers (:mod:`cyto.slides`, those ``cyto score`` read it with) and kept on disk.

Deep-zoom level ``L`` of a ``W`` x ``H`` slide is the slide shrunk by ``2 ** (max_level - L)``,
``max_level = ceil(log2(max(W, H)))`` (level ``max_level`` is level 0 of the slide, pixel for
pixel); OpenSeadragon asks for tile ``(col, row)`` of a level. A tile is read from the slide level
closest above it in resolution and shrunk with an area filter; where that region is large (a slide
without a pyramid) it is read and shrunk in bands, so a tile never holds more than
:data:`MAX_READ_PX` pixels of the slide in memory.

The disk cache lives in ``cyto.cache_dir()/view-tiles/KEY``, ``KEY`` a hash of the identity of the
slide and of each focal-plane file (:func:`cyto.infer.store.slide_key`), the tile size, the JPEG
quality and this format's version: a slide changed or replaced under its name gets another folder,
so a stale tile is never served. Tiles are written to a temporary name and renamed into place,
each sealed: its JPEG bytes followed by a trailer holding the sha256 of the slide folder's key,
the tile's place and those bytes (:func:`_seal`), so a tile that was damaged, cut, or copied from
another place or slide is not served: it is rendered again and said once (the rule of
:mod:`cyto.runtime.derived`, for the viewer's derived files).
The folder is kept to a cap, whole slide folders evicted least recently used first, never one
being shown (:mod:`cyto.view.cache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import shutil
import threading
from pathlib import Path

import numpy as np

from cyto.errors import warn_caller
from cyto.tables import json_text

FORMAT = "cyto-view-tiles/2"  # 2: each tile sealed (_seal)
TILE = 256
QUALITY = 82
#: most pixels of the slide a tile reads at once (a band of a larger region)
MAX_READ_PX = 4096 * 4096
#: tiles rendered at the same time (each reads its region and holds it until shrunk)
RENDERING = 2


def max_level(width: int, height: int) -> int:
    """The deep-zoom level that is the slide at full resolution."""
    return max(0, math.ceil(math.log2(max(width, height, 1))))


class TilePyramid:
    """The deep-zoom tiles of one slide (every focal plane), rendered once and cached on disk."""

    def __init__(
        self, slide, cache_root: Path, tile: int = TILE, quality: int = QUALITY, cache=None
    ) -> None:
        """``cache`` (:class:`cyto.view.cache.TileCache`) counts the tiles written, to keep the
        folder to its cap; without it nothing is counted."""
        from cyto.reuse import check_reuse, key_sha256, read_record
        from cyto.view.cache import FOLDER, LOCK, Touch, hold

        self.slide, self.tile, self.quality = slide, tile, quality
        self.max_level = max_level(slide.width, slide.height)
        key = {"format": FORMAT, "slide": slide.identity, "tile": tile, "quality": quality}
        self.dir = Path(cache_root) / FOLDER / key_sha256(key)[:32]
        self.cache = cache
        if cache is not None:
            cache.keep.add(self.dir.name)
        self._held = hold(self.dir)  # no evictor removes the folder while it is held
        record = self.dir / "key.json"
        if not check_reuse(read_record(record), key).ok:  # half-made or foreign: start anew
            for e in self.dir.iterdir():
                if e.is_dir():
                    shutil.rmtree(e, ignore_errors=True)
                elif e.name != LOCK:
                    e.unlink(missing_ok=True)
            _atomic(record, json_text(key, indent=1).encode())
        self.used = Touch(self.dir)
        self._rendering = threading.Semaphore(RENDERING)
        self._said_damaged = False

    def close(self) -> None:
        """Record the slide's last use and let evictors have its folder."""
        from cyto.view.cache import touch

        touch(self.dir)
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def level_size(self, level: int) -> tuple[int, int]:
        scale = 2 ** (self.max_level - level)
        return -(-self.slide.width // scale), -(-self.slide.height // scale)

    def exists(self, plane: int, level: int, col: int, row: int) -> bool:
        """Whether the tile is one of this pyramid's (plane, level and position in range)."""
        if not (0 <= plane < len(self.slide.z) and 0 <= level <= self.max_level):
            return False
        w, h = self.level_size(level)
        return 0 <= col < -(-w // self.tile) and 0 <= row < -(-h // self.tile)

    def path(self, plane: int, level: int, col: int, row: int) -> Path:
        return self.dir / f"p{plane}" / str(level) / f"{col}_{row}.jpeg"

    def read(self, plane: int, level: int, col: int, row: int) -> bytes:
        """The tile's JPEG bytes: from the cache, else rendered and cached (the caller checked
        :meth:`exists`). A tile evicted under it (another ``cyto view`` trimming the cache, the
        cache deleted by hand) is rendered again."""
        path = self.path(plane, level, col, row)
        where = f"{self.dir.name}/{path.relative_to(self.dir).as_posix()}"
        self.used()
        data = self._kept(path, where)
        if data is not None:
            return data
        with self._rendering:
            data = self._kept(path, where)  # another request rendered it meanwhile
            if data is not None:
                return data
            data = self.render(plane, level, col, row)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic(path, _seal(data, where))
        except FileNotFoundError:  # the folder was removed meanwhile: served, not cached
            return data
        if self.cache is not None:
            self.cache.wrote(len(data))
        return data

    def _kept(self, path: Path, where: str) -> bytes | None:
        """The kept tile's JPEG bytes when its seal holds; None when there is none, or when it
        was damaged or put there from elsewhere (said once per pyramid: rendered again)."""
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        data = _unseal(blob, where)
        if data is None and not self._said_damaged:
            self._said_damaged = True
            from cyto.errors import CytoWarning

            warn_caller(
                f"a kept viewer tile ({path.relative_to(self.dir.parent)}) does not match its "
                "seal (damaged, or copied from elsewhere): not served; rendered from the slide "
                "again",
                CytoWarning,
            )
        return data

    def render(self, plane: int, level: int, col: int, row: int) -> bytes:
        """The JPEG bytes of one tile, read from the slide."""
        from PIL import Image

        scale = 2 ** (self.max_level - level)
        lw, lh = self.level_size(level)
        t = self.tile
        tw, th = min(t, lw - col * t), min(t, lh - row * t)
        W, H = self.slide.width, self.slide.height
        x0, y0 = col * t * scale, row * t * scale
        x1, y1 = min(W, (col * t + tw) * scale), min(H, (row * t + th) * scale)
        reader = self.slide.reader(plane)
        info = reader.info
        # the smallest slide level that still has at least the tile's resolution
        best = max(i for i, d in enumerate(info.level_downsamples) if d <= scale * 1.001)
        d = info.level_downsamples[best]
        rx, ry = int(x0 / d), int(y0 / d)
        rw = max(1, min(info.level_dims[best][0], math.ceil(x1 / d)) - rx)
        rh = max(1, min(info.level_dims[best][1], math.ceil(y1 / d)) - ry)
        band = max(1, MAX_READ_PX // rw)
        out = np.empty((th, tw, 3), np.uint8)
        for r0 in range(0, rh, band):
            r1 = min(rh, r0 + band)
            o0, o1 = round(r0 * th / rh), round(r1 * th / rh)
            if o1 <= o0:
                continue
            region = reader.read_region(rx, ry + r0, rw, r1 - r0, level=best)
            if region.shape[:2] == (o1 - o0, tw):
                out[o0:o1] = region
            else:
                out[o0:o1] = np.asarray(
                    Image.fromarray(region).resize((tw, o1 - o0), Image.Resampling.BOX)
                )
        buf = io.BytesIO()
        Image.fromarray(out).save(buf, format="JPEG", quality=self.quality)
        return buf.getvalue()


#: what ends every kept tile: this, then 16 bytes of sha256 (:func:`_seal`)
SEAL = b"cyto-tile-seal/1"


def _seal(data: bytes, where: str) -> bytes:
    """A tile's JPEG bytes as kept: followed by :data:`SEAL` and the first 16 bytes of the
    sha256 of ``where`` (the slide folder's key and the tile's place) and the bytes."""
    return data + SEAL + hashlib.sha256(where.encode() + b"\0" + data).digest()[:16]


def _unseal(blob: bytes, where: str) -> bytes | None:
    """The JPEG bytes of a kept tile of ``where`` whose seal holds, else None."""
    n = len(SEAL) + 16
    if len(blob) <= n or blob[-n:-16] != SEAL:
        return None
    data = blob[:-n]
    if hashlib.sha256(where.encode() + b"\0" + data).digest()[:16] != blob[-16:]:
        return None
    return data


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
