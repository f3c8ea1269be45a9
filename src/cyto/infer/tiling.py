"""Tiles: which tiles hold tissue, how a tile becomes crops, and the workers that do it.

The main process lists the tiles with tissue (a low-resolution mask) and feeds them to worker
processes (``spawn``) through a bounded queue; results come back in tile order, so memory stays
flat and cell ids are the same whatever the worker count. A worker opens the slide once, and per
tile decodes it once with a margin, finds the nuclei whose centre lies in the tile's core (or
takes them from a file), picks the sharpest focal plane per nucleus and cuts every crop at the
size the model takes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from cyto.data.images import resize_rgb
from cyto.detect import NucleusParams, detect_in_tile, in_core, read_nuclei_file
from cyto.detect.morphometry import measure_stain
from cyto.errors import CytoError, UnsupportedSlideError
from cyto.flags import said
from cyto.infer.memory import peak_rss_mb
from cyto.infer.patches import crop_cells
from cyto.infer.quality import crop_sharpness
from cyto.interrupts import spawn_pool
from cyto.slides import open_plane, open_slide
from cyto.slides.ahead import read_ahead
from cyto.slides.grid import tile_grid, tissue_mask
from cyto.slides.planes import sharpest
from cyto.slides.remote import SlideURL

# tile index, x0, y0, given nuclei (N, 3) or None, and (k, parts) when this job cuts the k-th
# part of a dense tile's crops (its nuclei already found)
Job = tuple[int, int, int, "np.ndarray | None", "tuple[int, int] | None"]
IN_FLIGHT_BYTES = 128 << 20  # crops held in tile results not yet consumed, at most
# tile jobs in flight at least: the engine scores 4 * batch_size cells at a time (~13 tiles of a
# 224 px grid); with 2 in flight it waited for every read (efficiency 0.81 int8 on 2 cores), with
# 8 for a third of them (0.89), with 16 for none (0.95; benchmarks/results/vm-2core/quantize)
QUEUE_MIN = 16


def max_cells_per_result(crop: int, planes: int, queue: int) -> int:
    """Crops per tile result, so that ``queue`` results in flight (and a worker's crops of every
    focal plane) stay within :data:`IN_FLIGHT_BYTES`: 436 at 80 px and 55 at 224 px with 16 in
    flight, 32 at 224 px with 28 in flight."""
    per_cell = crop * crop * 3 * max(1, planes)
    return max(32, IN_FLIGHT_BYTES // (max(1, queue) * per_cell))


def tile_jobs(info, tile: int, mask, mask_ds: float, nuclei_file=None) -> list[Job]:
    """The tiles to visit, in order: those with tissue, or those holding a given nucleus."""
    if nuclei_file is None:
        return [
            (i, x0, y0, None, None)
            for i, x0, y0 in tile_grid(info.width, info.height, tile, mask, mask_ds)
        ]
    # bucket the file's points by tile once, not once per tile
    cols = -(-info.width // tile)
    given = read_nuclei_file(nuclei_file, info.width, info.height)
    tile_of = (given[:, 1] // tile).astype(np.int64) * cols + (given[:, 0] // tile).astype(np.int64)
    pts = np.column_stack([given, np.zeros(len(given))])
    given_by_tile = {int(t): pts[tile_of == t] for t in np.unique(tile_of)}
    return [
        (i, x0, y0, given_by_tile[i], None)
        for i, x0, y0 in tile_grid(info.width, info.height, tile)
        if i in given_by_tile
    ]


@dataclass(frozen=True)
class TileContext:
    """What a worker needs to turn a tile into crops (picklable)."""

    slide: str | SlideURL  # a path, or a remote slide with what opens it
    planes: tuple[str, ...]
    plane_z: tuple[float, ...]  # z of the main plane (0.0) then of each extra plane
    tile: int
    margin: int
    src_patch: int  # crop size at level 0
    out_size: int  # crop size the engine takes
    detection: NucleusParams
    max_cells: int = 1 << 30  # crops per result: a denser tile comes back in parts
    decode: str = "cpu"  # torch: the main plane's JPEG tiles decoded by torchvision
    decode_device: str = "cpu"  # where: on cuda, detection and crops stay on the device too
    keep_on_device: bool = False  # device crops go to the engine as tensors (main process only)
    #: measure each crop's morphometry where it is cut (:mod:`cyto.detect.morphometry`), with
    #: the cell mask of this stain (the model's): in the workers, beside the reading, not in the
    #: engine's process; None: not measured
    stain: str | None = None
    #: the crops' pixel size in um (the slide's times the resampling), for the areas in um^2
    crop_mpp: float | None = None
    #: measure each crop's sharpness where it is cut (:mod:`cyto.infer.quality`), for the
    #: adequacy rule's focus check (NaN when not asked for: ``--adequacy none``)
    sharpness: bool = False


#: a tile worker's slide context and open readers (``ctx``, ``readers``, ``key``: the slide,
#: planes and decoding the readers were opened for), each thread's own: two slides scored at
#: once on threads of one process (two ``cyto.score_slide`` calls, tiles in the process) read
#: each other's tiles through one process-wide context, and each slide's folder got the
#: other's cells, sealed as its own (hostile round 48, 1). A worker process runs its tiles in
#: one thread; the part thread of a slide holds its own.
_TILES = threading.local()


def _state(name: str):
    return getattr(_TILES, name, None)


def _init_worker(ctx: TileContext | None) -> None:
    """A tile worker's start (``ctx`` None: a worker started before the slide's plan, which
    gets the context with each job). Its detection runs OpenCV in one thread: the workers are the
    parallelism (one per spare core), and OpenCV's own pool, a thread per core in every worker,
    only oversubscribed the cores (benchmarks/results/vm-2core/cv-threads)."""
    import cv2

    _TILES.ctx = ctx
    _close_readers()
    cv2.setNumThreads(1)


def _close_readers() -> None:
    """This thread's readers closed."""
    for r in _state("readers") or []:
        r.close()
    _TILES.readers, _TILES.key = None, None


def _readers(ctx: TileContext) -> list:
    """The slide's readers (main plane first, then each extra plane), opened once per worker
    (per thread)."""
    key = (ctx.slide, ctx.planes, ctx.decode, ctx.decode_device)
    if _state("readers") is None or key != _state("key"):
        _close_readers()
        if ctx.decode == "torch":
            main = _TorchDecoded(ctx.slide, ctx.decode_device)
        else:
            main = open_slide(ctx.slide)
        _TILES.readers, _TILES.key = [main] + [open_plane(p) for p in ctx.planes], key
    return _TILES.readers


def _warm_worker(slide: str | SlideURL) -> None:
    """What a worker's first tile waited for (0.4 s on 2 cores), done while the main process
    loads the model and plans the slide: the detector's modules imported, the slide opened (its
    focal planes open with the first tile; a remote slide too). A slide that fails to open
    fails in the main process, or with its first tile, with the readable error, as before."""
    import scipy.ndimage  # noqa: F401 (imported for the first tile)
    import scipy.spatial  # noqa: F401
    import skimage.filters  # noqa: F401
    from PIL import Image  # noqa: F401

    if isinstance(slide, SlideURL):
        # opened with the first tile, from the blocks the plan fetched: a server that stalls
        # was asked by the worker too, its own four tries beside the plan's, and the run
        # waited for them after the plan gave up (hostile round 61, 4)
        return
    _readers(TileContext(slide, (), (0.0,), 1, 0, 1, 1, NucleusParams()))


def slide_threshold_of(reader, detection: NucleusParams, mask=None, mask_ds=None):
    """The slide's one detection threshold (:func:`cyto.detect.slide_threshold`) over the
    windows of a fixed grid that hold tissue (``mask``: the slide's tissue mask, made here when
    not given). The plan's, whether the plan or a worker ahead of it computes it."""
    from cyto.detect import THRESHOLD_WINDOW, slide_threshold

    if mask is None:
        mask, mask_ds = tissue_mask(reader)
    info = reader.info
    origins = [
        (x0, y0)
        for _, x0, y0 in tile_grid(info.width, info.height, THRESHOLD_WINDOW, mask, mask_ds)
    ]
    return slide_threshold(reader, origins, detection)


def start_workers(slide, workers: int):
    """``workers`` tile worker processes started now, before the model loads and the slide's
    plan (its tissue mask and threshold) is made, rather than after: each takes 1-3 s to start
    and import on 2 cores, and meanwhile opens the slide. None for no workers. Hand the pool
    to :class:`TileFeed` (which then shuts it down), or shut it down where no feed takes it."""
    if workers < 1:
        return None
    pool = spawn_pool(workers, _init_worker, (None,))
    for _ in range(workers):  # a submit starts a process while fewer than `workers` run
        pool.submit(_warm_worker, slide if isinstance(slide, SlideURL) else str(slide))
    return pool


class _TorchDecoded:
    """The main plane's JPEG tiles decoded by torchvision on ``device``
    (:class:`cyto.slides.device.DeviceTileReader`: the same pixels as the slide readers)."""

    def __init__(self, slide: str, device: str) -> None:
        import torch

        from cyto.slides.device import DeviceTileReader, open_device_tiles

        grid, why = open_device_tiles(slide)
        if grid is None:  # the plan checked it; the file changed since
            raise UnsupportedSlideError(f"{slide}: {why}")
        self.device = torch.device(device)
        self._reader = DeviceTileReader(grid, self.device)

    def read_tensor(self, x: int, y: int, w: int, h: int):
        return self._reader.read_region(x, y, w, h)

    def read_region(self, x: int, y: int, w: int, h: int) -> np.ndarray:
        return self._reader.read_region(x, y, w, h).cpu().numpy()

    def sync(self) -> None:
        """Wait for the device, so stage times are the device's (CUDA runs asynchronously)."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self._reader.close()


def job_region(ctx: TileContext, job: Job) -> tuple[int, int, int, int]:
    """(x, y, width, height) at level 0 that ``job`` reads: its tile and the margin, or, for
    a part of a dense tile, the region around its nuclei. The read-ahead
    (:mod:`cyto.slides.ahead`) fetches these regions, so it fetches what the jobs read."""
    _, x0, y0, given, part = job
    if part is None:
        m, size = ctx.margin, ctx.tile
        return x0 - m, y0 - m, size + 2 * m, size + 2 * m
    half = ctx.src_patch // 2 + 2
    ox, oy = int(given[:, 0].min()) - half, int(given[:, 1].min()) - half
    return ox, oy, int(given[:, 0].max()) + half - ox + 1, int(given[:, 1].max()) + half - oy + 1


def run_tile(job: Job, ctx: TileContext | None = None) -> dict:
    """Decode one tile (plus margin) once, find its nuclei and cut their crops from it.

    At most ``max_cells`` crops come back; the nuclei of a denser tile beyond those come back as
    ``rest``, for part jobs that read just the region around them and cut their crops. ``ctx``:
    the slide's context, sent with each job (None: the one the worker started with)."""
    if ctx is not None:
        _TILES.ctx = ctx
    ctx = _state("ctx")
    readers = _readers(ctx)
    t_index, x0, y0, given, part = job
    size = ctx.tile
    t0 = time.perf_counter()
    ox, oy, w, h = job_region(ctx, job)
    main = readers[0]
    # one plane decoded on a device: detection and crops use the tensor where it is, and only
    # the crops, at the engine's size, come back to the host
    on_device = isinstance(main, _TorchDecoded) and len(readers) == 1
    if on_device:
        tiles = [main.read_tensor(ox, oy, w, h)]
        main.sync()
    else:
        tiles = [r.read_region(ox, oy, w, h) for r in readers]
    t1 = time.perf_counter()
    core = (x0, y0, size, size)
    if part is not None:
        found = given
    elif given is None:
        found = detect_in_tile(tiles[0], ox, oy, core, ctx.detection)
    else:
        found = in_core(given, *core)
    rest = None
    if part is None and len(found) > ctx.max_cells:
        found, rest = found[: ctx.max_cells], found[ctx.max_cells :]
    t2 = time.perf_counter()
    plane = np.zeros(len(found), dtype=np.int64)
    crops = np.empty((0, ctx.out_size, ctx.out_size, 3), dtype=np.uint8)
    if len(found) and on_device:
        from cyto.slides.device import crop_cells_device

        cut = crop_cells_device(tiles[0], ox, oy, found, ctx.src_patch, ctx.out_size)
        crops = cut if ctx.keep_on_device else cut.cpu().numpy()
    elif len(found):
        stack = [crop_cells(t, ox, oy, found, ctx.src_patch) for t in tiles]
        chosen, plane = sharpest(stack)
        if ctx.src_patch != ctx.out_size:
            chosen = np.stack([resize_rgb(c, ctx.out_size) for c in chosen])
        crops = np.ascontiguousarray(chosen)
    t3 = time.perf_counter()
    measures = None
    if ctx.stain is not None:
        host = crops if isinstance(crops, np.ndarray) else crops.cpu().numpy()
        measures = measure_stain(host, ctx.crop_mpp, ctx.stain)
    # (its time counts with the morphometry's: the measures taken on the cut crops)
    sharp = crop_sharpness(crops) if ctx.sharpness else np.full(len(found), np.nan)
    t4 = time.perf_counter()
    meta = np.column_stack([found[:, :2], found[:, 2], np.asarray(ctx.plane_z)[plane], sharp])
    return {
        "tile": t_index,
        "x0": x0,
        "y0": y0,
        "part": part,
        "rest": rest,
        "crops": crops,
        "measures": measures,  # each crop's morphometry, or None when not asked for
        "meta": meta.reshape(-1, 5),  # x, y, nucleus area, focal plane, sharpness
        "times": {"read": t1 - t0, "detect": t2 - t1, "crop": t3 - t2, "nucleus": t4 - t3},
        "rss_mb": peak_rss_mb(),
    }


class TileFeed:
    """Tile results in tile order, with at most ``queue`` jobs in flight.

    ``workers`` processes do the work (0: the calling process). A result holds at most
    ``ctx.max_cells`` crops: the rest of a dense tile's cells follow in part jobs, yielded right
    after it and before the next tile, so what is held in flight is bounded by crops, not by
    tiles. Each result says whether it completes its tile (``final``). ``wait`` adds up the
    seconds the caller spent waiting for a result; ``worker_rss_mb`` the workers' peak resident
    memory. ``pool``: workers already started (:func:`start_workers`), which the feed then owns
    and shuts down; every job goes with the context.

    With workers, the part jobs run in a thread of the calling process: a part job only reads
    the region around its cells and cuts their crops (10-15 ms), and in the workers' queue it
    waited behind every tile already sent (up to ``queue``): the engine waited 0.2-0.6 s for
    the first dense tile's rest on 2 cores.
    """

    def __init__(
        self, ctx: TileContext, jobs: list[Job], workers: int, queue: int, pool=None
    ) -> None:
        self.ctx, self.jobs, self.queue = ctx, jobs, max(1, queue)
        self.wait = 0.0
        self.worker_rss_mb = 0.0
        self.pool, self.handed = pool, pool is not None
        if pool is not None and workers < 1:  # the plan runs the tiles here after all
            pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        if self.pool is None and workers > 0 and jobs:
            self.pool = spawn_pool(workers, _init_worker, (ctx,))
        elif self.pool is None:
            _init_worker(ctx)
        self.parts_here = (
            ThreadPoolExecutor(1, thread_name_prefix="cyto-parts")
            if self.pool is not None
            else None
        )
        # a remote slide's next tiles fetched ahead of the readers, in the jobs' order (the
        # parts of dense tiles read within their tile's region, fetched with it)
        self.ahead = (
            read_ahead(ctx.slide, [job_region(ctx, j) for j in jobs if j[4] is None])
            if ctx.decode == "cpu" and isinstance(ctx.slide, SlideURL)  # only a remote slide's
            else None
        )

    def __iter__(self) -> Iterator[dict]:
        todo: deque = deque(self.jobs)
        parts: deque = deque()  # part jobs of the dense tile being consumed
        inflight: deque = deque()  # in the order results are yielded
        front = 0  # part jobs at the front of inflight (they come before the next tiles)
        tiles_read = 0  # tile jobs (not parts) whose results came back

        def submit() -> None:
            nonlocal front
            if parts:
                job = parts.popleft()
                inflight.insert(front, self._submit(job))
                front += 1
            elif todo:
                job = todo.popleft()
                inflight.append(self._submit(job))

        while len(inflight) < self.queue and todo:
            submit()
        while inflight:
            item = inflight.popleft()
            front = max(front - 1, 0)
            if self.pool is not None:
                t0 = time.perf_counter()
                res = item.result()
                self.wait += time.perf_counter() - t0
            else:
                res = run_tile(item)
            rest, part = res.pop("rest"), res["part"]
            if rest is not None:
                step = self.ctx.max_cells
                n = -(-len(rest) // step)
                for k in range(n):
                    chunk = rest[k * step : (k + 1) * step]
                    parts.append((res["tile"], res["x0"], res["y0"], chunk, (k, n)))
            res["final"] = rest is None and (part is None or part[0] == part[1] - 1)
            if part is None and self.ahead is not None:
                tiles_read += 1
                self.ahead.consumed(tiles_read)
            while len(inflight) < self.queue and (parts or todo):
                submit()
            self.worker_rss_mb = max(self.worker_rss_mb, res["rss_mb"])
            yield res

    def _submit(self, job: Job):
        """A worker's future for ``job`` (a part job's: the thread's), or the job itself, run
        when its turn comes."""
        if self.pool is None:
            return job
        if job[4] is not None:  # a dense tile's part: next in line, not behind the queue
            return self.parts_here.submit(run_tile, job, self.ctx)
        return self.pool.submit(run_tile, job, self.ctx)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()  # no fetch starts after this: the slide ends, or was stopped
        if self.pool is not None:
            # a pool handed in is waited for by its owner (score_slide), after the slide is
            # finished: the workers' exit (0.2-0.7 s on 2 cores) runs beside the finishing
            self.pool.shutdown(wait=not self.handed, cancel_futures=True)
            # the part thread's readers are its own: closed there, then the thread goes
            self.parts_here.submit(_close_readers).result()
            self.parts_here.shutdown(wait=True, cancel_futures=True)
        _close_readers()  # this thread's: the workers=0 tiles'


def broken_worker_error(slide, store_dir, exc: BrokenProcessPool) -> CytoError:
    from cyto.infer.store import kept_words

    return CytoError(
        f"{slide}: a worker process stopped ({exc or 'killed, out of memory?'}); "
        f"{kept_words(store_dir)} (and fewer {said('workers')})"
    )
