"""Read-ahead along the tile order for remote slides.

The tile workers read a remote slide region by region, and each region's blocks (a TIFF's byte
ranges, a DICOMweb series' frames) that no process holds yet are fetched when the worker asks for
them: with a server 20 ms away, each miss is 20 ms a worker waits. The plan knows the order in
which the tiles will be read, so :class:`ReadAhead` fetches the next regions' blocks in a few
threads of the plan's process into the folder the workers share (``remote-blocks/`` in cyto's
cache, :meth:`cyto.slides.remote.RemoteObject.shared`), before the workers ask.

- **Only what is read**: the units of a region are exactly those the worker's read of that
  region needs (the TIFF tiles of level 0 the region meets, rounded to the blocks the worker's
  read fetches; a DICOMweb level's frames the region meets), and only regions the run will read
  are given. A unit another process is fetching is left to it, one already shared is skipped: no
  byte is fetched twice.
- **Bounded**: at most ``CYTO_READ_AHEAD_MB`` (default 32, ``0``: off) fetched ahead of the
  regions the run has consumed, and never more than half the shared folder's bound
  (``CYTO_REMOTE_BLOCKS_MB``), so nothing fetched ahead is evicted before it is read.
- **Never fatal**: a fetch that fails stops the read-ahead (said at debug level only); the
  worker that needs the region then fetches it itself and meets the fault in its usual one line.
- **Stops**: at the last region, and at :meth:`ReadAhead.close` (the slide's end, an error,
  Ctrl-C): no new fetch starts; one in flight ends with its request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from cyto.slides.remote import (
    SHARED_BYTES,
    SHARED_BYTES_ENV,
    SlideURL,
    megabytes,
    open_object,
)

#: megabytes fetched ahead of the regions consumed, at most (0: no read-ahead)
AHEAD_ENV = "CYTO_READ_AHEAD_MB"
AHEAD_BYTES = 32 << 20
#: fetches in flight at once: two hide a request's latency behind the other's transfer
THREADS = 2

log = logging.getLogger("cyto.remote")

Region = tuple[int, int, int, int]  # x, y, width, height at level 0


def budget() -> int:
    """Bytes read-ahead may hold ahead of the run: ``CYTO_READ_AHEAD_MB``, at most half the
    shared block folder's bound."""

    return min(megabytes(AHEAD_ENV, AHEAD_BYTES), megabytes(SHARED_BYTES_ENV, SHARED_BYTES) // 2)


class _Blocks:
    """The blocks of a remote TIFF that a region of level 0 needs: those holding the TIFF
    tiles the region meets (libvips reads each such tile's bytes, through those blocks)."""

    def __init__(self, obj) -> None:
        import numpy as np
        import tifffile

        self.obj = obj
        with tifffile.TiffFile(obj.file()) as tf:
            page = tf.pages[0]
            if not page.is_tiled or page.tiledepth > 1 or page.planarconfig == 2:
                raise ValueError("not a tiled TIFF of one plane")
            self.tw, self.th = page.tilewidth, page.tilelength
            self.width, self.height = page.imagewidth, page.imagelength
            self.offsets = np.asarray(page.dataoffsets, np.int64)
            self.counts = np.asarray(page.databytecounts, np.int64)
        self.cols = -(-self.width // self.tw)

    def units(self, region: Region) -> list[int]:
        x, y, w, h = region
        x0, y0 = max(x, 0), max(y, 0)
        x1, y1 = min(x + w, self.width), min(y + h, self.height)
        if x0 >= x1 or y0 >= y1:
            return []
        block = self.obj.block
        out: set[int] = set()
        for ty in range(y0 // self.th, (y1 - 1) // self.th + 1):
            for tx in range(x0 // self.tw, (x1 - 1) // self.tw + 1):
                i = ty * self.cols + tx
                if i >= len(self.counts) or self.counts[i] <= 0:
                    continue  # an empty tile: nothing to read
                start, end = int(self.offsets[i]), int(self.offsets[i] + self.counts[i])
                out.update(range(start // block, (end - 1) // block + 1))
        return sorted(out)

    def prefetch(self, units: list[int]) -> int:
        return self.obj.prefetch(units)


class _Frames:
    """The frames of a DICOMweb series' level 0 that a region meets."""

    def __init__(self, series) -> None:
        self.series = series
        self.level = series.levels[0]

    def units(self, region: Region) -> list[tuple[int, int]]:
        from cyto.slides.base import in_slide

        box = in_slide(*region, self.level.width, self.level.height)
        return [] if box is None else list(self.level.tiles(*box))

    def prefetch(self, units: list[tuple[int, int]]) -> int:
        return self.series.prefetch(0, units)


class ReadAhead:
    """Fetches the units (blocks, frames) of ``regions``, in their order, ahead of the run (see
    the module docstring). ``source``: what maps a region to its units and fetches them
    (``units(region)``, ``prefetch(units) -> bytes fetched``). Tell it how many regions the
    run has consumed with :meth:`consumed`; :meth:`close` stops it."""

    def __init__(
        self, source, regions: Sequence[Region], limit: int, threads: int = THREADS
    ) -> None:
        self._source = source
        self._regions = list(regions)
        self.limit = max(1, limit)
        self._cond = threading.Condition()
        self._next = 0  # the next region to fetch
        self._done = 0  # regions the run has consumed
        self._cost: dict[int, int] = {}  # bytes fetched for each region not yet consumed
        self._ahead = 0  # their sum
        self._stop = False
        self.fetched_bytes = 0
        self.regions_fetched = 0
        self.failed: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._run, name=f"cyto-read-ahead-{k}", daemon=True)
            for k in range(max(1, threads))
        ]
        for t in self._threads:
            t.start()

    def _take(self) -> int | None:
        with self._cond:
            while not self._stop and self._next < len(self._regions) and self._ahead >= self.limit:
                self._cond.wait()
            if self._stop or self._next >= len(self._regions):
                return None
            i = self._next
            self._next += 1
            return i

    def _run(self) -> None:
        while (i := self._take()) is not None:
            try:
                got = self._source.prefetch(self._source.units(self._regions[i]))
            except Exception as exc:  # noqa: BLE001 - the worker that needs it meets it itself
                log.debug("read-ahead stopped at region %d: %s", i, exc)
                with self._cond:
                    self.failed = exc
                    self._stop = True
                    self._cond.notify_all()
                return
            with self._cond:
                self.fetched_bytes += got
                self.regions_fetched += 1
                if i >= self._done:
                    self._cost[i] = got
                    self._ahead += got

    def consumed(self, n: int) -> None:
        """The run has read the first ``n`` regions: their bytes leave the budget, and those
        not fetched yet are not fetched."""
        with self._cond:
            for i in range(self._done, n):
                self._ahead -= self._cost.pop(i, 0)
            self._done = max(self._done, n)
            self._next = max(self._next, self._done)
            self._cond.notify_all()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def close(self, wait: float = 0.0) -> None:
        """Stop: no fetch starts after this; ``wait`` seconds for one in flight to end."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(wait)


def read_ahead(slide, regions: Sequence[Region]) -> ReadAhead | None:
    """A :class:`ReadAhead` over the level-0 ``regions`` of a remote slide, in the order they
    will be read; None for a local slide, one read through a local copy (``--download``), a
    layout it cannot map (a TIFF in strips), or with ``CYTO_READ_AHEAD_MB=0``."""
    if not isinstance(slide, SlideURL) or slide.download or not regions:
        return None
    limit = budget()
    if limit <= 0:
        return None
    obj = open_object(slide)
    try:
        source = _Frames(obj) if slide.dicomweb else _Blocks(obj)
    except Exception as exc:  # noqa: BLE001 - no read-ahead: the workers read as before
        log.debug("%s: no read-ahead (%s)", slide, exc)
        return None
    return ReadAhead(source, regions, limit)
