"""Score every cell of a slide: tiles -> nuclei -> crops -> engine -> kernel -> Parquet.

The pipeline:
- the main process loads the whole model (:mod:`cyto.infer.engine`) once per cohort, reads a
  low-resolution tissue mask and lists the tiles that hold tissue;
- worker processes (``workers``; 0 = in the main process) each open the slide once and, per
  tile, decode it with a margin, detect nuclei (or take them from a file), choose the sharpest
  focal plane per nucleus when several are given, and cut the crops at the engine's input size;
- tiles go out through a bounded queue and come back in order, so memory stays flat and cell ids
  are the same whatever the worker count;
- the main process batches crops through the engine and the numba kernel and writes the rows in
  resumable chunks (``.partial/`` in the output folder), each holding whole tiles and appearing
  by atomic rename. ``resume=True`` continues after the last finished chunk; the final
  ``scores.parquet`` appears by atomic rename once every tile is done.

Outputs: scores.parquet, topk.parquet, topk.geojson (QuPath points), ranked and blinded mosaics
with a key, summary.json (timings per stage, cells/s, pipeline efficiency, peak memory, slide
score, abnormal-burden estimate).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import resource
import shutil
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cyto import __version__
from cyto.data.images import resize_rgb
from cyto.errors import ConfigError, CytoError
from cyto.infer.nuclei import NucleusParams, detect_nuclei, read_nuclei_file
from cyto.infer.patches import crop_cells
from cyto.infer.slide import PLANE_SEP, ndpi_planes, open_plane, open_slide
from cyto.progress import progress

PARTIAL = ".partial"
STAGES = ("mask", "read", "detect", "crop", "engine", "write", "wait", "finish")


def default_workers() -> int:
    """One decode/detect process per spare core (the engine keeps the main process busy)."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


@dataclass(frozen=True)
class ScoreOptions:
    patch_size: int = 192
    tile: int = 1024
    batch_size: int = 64
    top_k: int = 400
    mosaic: int = 100
    backend: str = "auto"  # auto | onnx | trt | torch
    device: str = "auto"
    workers: int | None = None  # None: default_workers(); 0: all in the main process
    queue: int | None = None  # tiles in flight (None: 2 per worker, at least 2)
    nuclei: Path | None = None
    truth: Path | None = None  # ground-truth cells (x, y, label) to report Recall@K
    truth_radius: float = 20.0
    detection: NucleusParams = field(default_factory=NucleusParams)
    planes: str = "auto"  # auto (sibling files NAME_z+1.00um.ext) | none | comma-separated files
    rescale: bool = False  # resample crops to the model's training mpp when the slide differs
    resume: bool = False
    chunk_cells: int = 4096  # rows per resumable chunk (a crash loses at most these)

    def __post_init__(self) -> None:
        from cyto.infer.engine import BACKENDS

        if self.patch_size < 16 or self.tile < self.patch_size or self.batch_size < 1:
            raise ConfigError("need patch_size >= 16, tile >= patch_size and batch_size >= 1")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.top_k < 1 or self.mosaic < 0:
            raise ConfigError("top_k must be >= 1 and mosaic >= 0")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"workers must be >= 0, got {self.workers}")
        if self.chunk_cells < 1 or (self.queue is not None and self.queue < 1):
            raise ConfigError("chunk_cells and queue must be >= 1")

    def result_key(self) -> dict:
        """The options that change the score table (a resumed run must match them)."""
        return {
            "patch_size": self.patch_size,
            "tile": self.tile,
            "nuclei": str(self.nuclei) if self.nuclei else None,
            "detection": asdict(self.detection),
            "planes": self.planes,
            "rescale": self.rescale,
        }


def _tissue_mask(reader) -> tuple[np.ndarray | None, float]:
    """Boolean mask at the lowest level (True = not blank glass) and its downsample, or None
    when the slide has no level small enough to read whole (every tile is then visited)."""
    from scipy import ndimage

    level = len(reader.info.level_dims) - 1
    w, h = reader.info.level_dims[level]
    if w * h > 4096 * 4096:
        return None, 1.0
    low = reader.read_region(0, 0, w, h, level=level).astype(np.float32)
    od = -np.log((low + 1.0) / 256.0).sum(axis=2)
    mask = ndimage.binary_dilation(od > 0.25, iterations=3)
    return mask, reader.info.level_downsamples[level]


_PLANE_RE = re.compile(r"_z([+-]\d+(?:\.\d+)?)um$")


def find_planes(slide: Path, spec: str) -> list[tuple[float, str]]:
    """Extra focal planes of ``slide`` as (z in um, plane): ``auto`` takes the z-offset pages of
    an NDPI file, or sibling files named ``NAME_z+1.00um.ext`` (what ``cyto synth slide
    --planes`` writes for TIFF); ``none`` uses the main plane only; a comma-separated list names
    the files (z from their names, else their order)."""
    slide = Path(slide)
    if spec == "none":
        return []
    if spec == "auto" and slide.suffix.lower() == ".ndpi":
        return ndpi_planes(slide)
    if spec == "auto":
        found = []
        for f in sorted(slide.parent.glob(f"{slide.stem}_z*um{slide.suffix}")):
            m = _PLANE_RE.search(f.stem)
            if m and f != slide:
                found.append((float(m.group(1)), str(f)))
        return sorted(found)
    out = []
    for i, name in enumerate(p for p in spec.split(",") if p.strip()):
        f = Path(name.strip())
        if not f.is_file():
            raise ConfigError(f"focal plane file {f} does not exist")
        m = _PLANE_RE.search(f.stem)
        out.append((float(m.group(1)) if m else float(i + 1), str(f)))
    return out


def sharpness(crops: np.ndarray) -> np.ndarray:
    """Variance of the Laplacian of the grey central half of each crop (higher = sharper)."""
    from scipy import ndimage

    n, s = crops.shape[:2]
    q = s // 4
    grey = crops[:, q : s - q, q : s - q].astype(np.float32).mean(axis=3)
    lap = np.stack([ndimage.laplace(g) for g in grey]) if n else grey
    return lap.reshape(n, -1).var(axis=1)


@dataclass(frozen=True)
class TileContext:
    """What a worker needs to turn a tile into crops (picklable)."""

    slide: str
    planes: tuple[str, ...]
    plane_z: tuple[float, ...]  # z of the main plane (0.0) then of each extra plane
    tile: int
    margin: int
    src_patch: int  # crop size at level 0
    out_size: int  # crop size the engine takes
    detection: NucleusParams


_CTX: TileContext | None = None
_READERS: list | None = None


def _init_worker(ctx: TileContext) -> None:
    global _CTX, _READERS
    _CTX, _READERS = ctx, None


def _close_readers() -> None:
    global _READERS
    for r in _READERS or []:
        r.close()
    _READERS = None


def run_tile(job: tuple[int, int, int, np.ndarray | None]) -> dict:
    """Decode one tile (plus margin) once, find its nuclei and cut every crop from it."""
    global _READERS
    ctx = _CTX
    if _READERS is None:
        _READERS = [open_slide(ctx.slide)] + [open_plane(p) for p in ctx.planes]
    t_index, x0, y0, given = job
    m, size = ctx.margin, ctx.tile
    t0 = time.perf_counter()
    tiles = [r.read_region(x0 - m, y0 - m, size + 2 * m, size + 2 * m) for r in _READERS]
    t1 = time.perf_counter()
    if given is None:
        found = detect_nuclei(tiles[0], ctx.detection)
        found[:, 0] += x0 - m
        found[:, 1] += y0 - m
    else:
        found = given
    inside = (
        (found[:, 0] >= x0)
        & (found[:, 0] < x0 + size)
        & (found[:, 1] >= y0)
        & (found[:, 1] < y0 + size)
    )
    found = found[inside]
    t2 = time.perf_counter()
    plane = np.zeros(len(found), dtype=np.int64)
    crops = np.empty((0, ctx.out_size, ctx.out_size, 3), dtype=np.uint8)
    if len(found):
        stack = [crop_cells(t, x0 - m, y0 - m, found, ctx.src_patch) for t in tiles]
        if len(stack) > 1:
            plane = np.argmax(np.stack([sharpness(c) for c in stack]), axis=0)
            chosen = np.stack(stack)[plane, np.arange(len(found))]
        else:
            chosen = stack[0]
        if ctx.src_patch != ctx.out_size:
            chosen = np.stack([resize_rgb(c, ctx.out_size) for c in chosen])
        crops = np.ascontiguousarray(chosen)
    t3 = time.perf_counter()
    meta = np.column_stack([found[:, :2], found[:, 2], np.asarray(ctx.plane_z)[plane]])
    return {
        "tile": t_index,
        "crops": crops,
        "meta": meta.reshape(-1, 4),
        "times": {"read": t1 - t0, "detect": t2 - t1, "crop": t3 - t2},
        "rss_mb": peak_rss_mb(),
    }


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("slide_id", pa.string()),
            ("cell_id", pa.int64()),
            ("x", pa.float64()),
            ("y", pa.float64()),
            ("nucleus_area", pa.float64()),
            ("score", pa.float64()),
            ("focal_plane_um", pa.float64()),
            ("tile", pa.int64()),
        ]
    )


class ChunkStore:
    """Resumable row chunks in ``out_dir/.partial``: each file holds whole tiles, written to a
    temporary name and renamed, and records how many tiles of the run's tile list are done."""

    def __init__(self, out_dir: Path, key: dict) -> None:
        self.dir = out_dir / PARTIAL
        self.key = key

    def start(self, resume: bool, echo) -> tuple[int, int]:
        """(tiles done, cells done): what an earlier run left, when resuming a matching run."""
        import pyarrow.parquet as pq

        state = self.dir / "state.json"
        if resume and state.is_file():
            old = json.loads(state.read_text())
            if old == self.key:
                done_tiles = done_cells = 0
                for f in sorted(self.dir.glob("chunk-*.parquet")):
                    meta = pq.read_schema(f).metadata or {}
                    done_tiles = max(done_tiles, int(meta.get(b"cyto.tiles_done", b"0")))
                    done_cells += pq.read_metadata(f).num_rows
                for f in self.dir.glob("*.tmp"):
                    f.unlink()
                echo(f"resuming: {done_tiles} tiles and {done_cells} cells already scored")
                return done_tiles, done_cells
            echo("resume: the earlier run used another model, slide or options; starting over")
        elif resume:
            echo("resume: no unfinished run here; starting from the beginning")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        state.write_text(json.dumps(self.key, indent=1))
        return 0, 0

    def write(self, table, tiles_done: int) -> None:
        import pyarrow.parquet as pq

        n = len(list(self.dir.glob("chunk-*.parquet")))
        table = table.replace_schema_metadata({"cyto.tiles_done": str(tiles_done)})
        tmp = self.dir / f"chunk-{n:06d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.dir / f"chunk-{n:06d}.parquet")

    def read_all(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted(self.dir.glob("chunk-*.parquet"))
        if not files:
            return _schema().empty_table()
        return pa.concat_tables([pq.read_table(f).replace_schema_metadata(None) for f in files])

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _slide_key(slide: Path, planes: list[tuple[float, str]]) -> dict:
    files = [slide] + [Path(p.split(PLANE_SEP)[0]) for _, p in planes]
    return {str(f): [f.stat().st_size, int(f.stat().st_mtime)] for f in files}


def proc_status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (``VmRSS``, ``VmHWM``) in MB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM, which starts afresh in a spawned
    worker (``ru_maxrss`` would carry over the parent's peak across exec on Linux)."""
    hwm = proc_status_mb("VmHWM")
    if hwm is not None:
        return hwm
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def score_slide(
    slide: Path,
    model,
    out_dir: Path,
    opts: ScoreOptions = ScoreOptions(),
    echo=print,
) -> dict:
    """Score one slide into ``out_dir``; returns the summary (also written as summary.json).

    ``model`` is a loaded :class:`~cyto.infer.engine.Engine` (a cohort loads it once) or a bundle
    path, loaded here with ``opts.backend`` and ``opts.device``.
    """
    import pyarrow as pa

    from cyto.infer.engine import Engine, load_engine

    engine = model if isinstance(model, Engine) else load_engine(model, opts.backend, opts.device)
    slide = Path(slide)
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    reader = open_slide(slide)
    info = reader.info
    planes = find_planes(slide, opts.planes)
    for _z, f in planes:
        pr = open_plane(f)
        if (pr.info.width, pr.info.height) != (info.width, info.height):
            raise ConfigError(
                f"focal plane {f} is {pr.info.width}x{pr.info.height}, the slide "
                f"{info.width}x{info.height}: planes must share one geometry"
            )
        pr.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    timings = dict.fromkeys(STAGES, 0.0)
    src_patch, notes = _resolution(info, engine, opts, echo)
    t0 = time.perf_counter()
    mask, mask_ds = _tissue_mask(reader)
    timings["mask"] = time.perf_counter() - t0
    reader.close()
    given_by_tile: dict[int, np.ndarray] = {}
    cols = -(-info.width // opts.tile)
    if opts.nuclei is not None:  # bucket the file's points by tile once, not once per tile
        given = read_nuclei_file(opts.nuclei, info.width, info.height)
        tile_of = (given[:, 1] // opts.tile).astype(np.int64) * cols + (
            given[:, 0] // opts.tile
        ).astype(np.int64)
        pts = np.column_stack([given, np.zeros(len(given))])
        for t in np.unique(tile_of):
            given_by_tile[int(t)] = pts[tile_of == t]
    jobs = []
    for y0 in range(0, info.height, opts.tile):
        for x0 in range(0, info.width, opts.tile):
            t_index = (y0 // opts.tile) * cols + x0 // opts.tile
            if opts.nuclei is not None:
                if t_index not in given_by_tile:
                    continue
            elif mask is not None:
                mx0, my0 = int(x0 / mask_ds), int(y0 / mask_ds)
                mx1 = int((x0 + opts.tile) / mask_ds) + 1
                my1 = int((y0 + opts.tile) / mask_ds) + 1
                if not mask[my0:my1, mx0:mx1].any():
                    continue
            jobs.append((t_index, x0, y0, given_by_tile.get(t_index)))
    ctx = TileContext(
        slide=str(slide),
        planes=tuple(str(f) for _, f in planes),
        plane_z=(0.0, *(z for z, _ in planes)),
        tile=opts.tile,
        margin=src_patch // 2 + 32,
        src_patch=src_patch,
        out_size=engine.input_size,
        detection=opts.detection.at(info.mpp),  # nuclei have a physical size
    )
    key = {
        "model": engine.bundle.manifest_hash,
        "slide": _slide_key(slide, planes),
        "options": opts.result_key(),
        "tiles": len(jobs),
    }
    store = ChunkStore(out_dir, key)
    done_tiles, n_cells = store.start(opts.resume, echo)
    workers = default_workers() if opts.workers is None else opts.workers
    queue = opts.queue or max(2, 2 * workers)
    slide_id = slide.stem
    schema = _schema()
    pending: list[dict] = []  # tile results whose crops wait for the engine
    rows: list = []  # scored tables not yet in a chunk
    n_rows = 0

    def run_engine() -> None:
        nonlocal n_cells, n_rows
        if not pending:
            return
        crops = np.concatenate([p["crops"] for p in pending])
        meta = np.concatenate([p["meta"] for p in pending])
        tiles = np.concatenate([np.full(len(p["meta"]), p["tile"]) for p in pending])
        t0 = time.perf_counter()
        scores = engine.score(crops, opts.batch_size)
        timings["engine"] += time.perf_counter() - t0
        ids = np.arange(n_cells, n_cells + len(crops))
        rows.append(
            pa.table(
                {
                    "slide_id": [slide_id] * len(crops),
                    "cell_id": ids,
                    "x": meta[:, 0],
                    "y": meta[:, 1],
                    "nucleus_area": meta[:, 2],
                    "focal_plane_um": meta[:, 3],
                    "score": scores,
                    "tile": tiles,
                },
                schema=schema,
            )
        )
        n_cells += len(crops)
        n_rows += len(crops)
        pending.clear()

    def write_chunk(tiles_done: int) -> None:
        nonlocal n_rows
        run_engine()
        t0 = time.perf_counter()
        table = pa.concat_tables(rows) if rows else schema.empty_table()
        store.write(table, tiles_done)
        rows.clear()
        n_rows = 0
        timings["write"] += time.perf_counter() - t0

    pool = None
    if workers > 0 and len(jobs) > done_tiles:
        pool = ProcessPoolExecutor(
            workers,
            mp_context=mp.get_context("spawn"),
            initializer=_init_worker,
            initargs=(ctx,),
        )
    else:
        _init_worker(ctx)
    todo = iter(jobs[done_tiles:])
    inflight: deque = deque()

    def submit() -> None:
        job = next(todo, None)
        if job is not None:
            inflight.append(pool.submit(run_tile, job) if pool else job)

    t_loop = time.perf_counter()
    worker_rss = 0.0
    try:
        for _ in range(queue):
            submit()
        position = done_tiles
        with progress(f"score {slide.name}", total=len(jobs), unit="tiles") as bar:
            bar.advance(done_tiles)
            while inflight:
                item = inflight.popleft()
                t0 = time.perf_counter()
                res = item.result() if pool else run_tile(item)
                timings["wait"] += time.perf_counter() - t0 if pool else 0.0
                submit()
                worker_rss = max(worker_rss, res["rss_mb"])
                for k2, v in res["times"].items():
                    timings[k2] += v
                if len(res["meta"]):
                    pending.append(res)
                position += 1
                if sum(len(p["meta"]) for p in pending) >= 4 * opts.batch_size:
                    run_engine()
                if n_rows + sum(len(p["meta"]) for p in pending) >= opts.chunk_cells:
                    write_chunk(position)
                bar.advance()
                rate = n_cells / max(time.perf_counter() - t_loop, 1e-9)
                bar.set_postfix(f"{n_cells} cells, {rate:.0f} cells/s")
            if position > done_tiles or not any(store.dir.glob("chunk-*.parquet")):
                write_chunk(position)
    except KeyboardInterrupt:
        echo(
            f"interrupted: finished chunks are kept in {store.dir}; rerun with --resume to continue"
        )
        raise
    except BrokenProcessPool as exc:
        raise CytoError(
            f"{slide}: a worker process stopped ({exc or 'killed, out of memory?'}); finished "
            f"chunks are kept in {store.dir}: rerun with --resume (and fewer --workers)"
        ) from exc
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        else:
            _close_readers()
    loop_seconds = time.perf_counter() - t_loop
    table = store.read_all()
    summary = _finish(
        table, out_dir, slide, engine, opts, timings, t_start, echo, loop_seconds, notes
    )
    summary["workers"] = workers
    summary["peak_rss_workers_mb"] = round(worker_rss, 1) if pool is not None else None
    summary["focal_planes_um"] = list(ctx.plane_z)
    summary["tiles"] = {"total": len(jobs), "resumed_from": done_tiles}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    store.remove()
    return summary


def _resolution(info, engine, opts: ScoreOptions, echo) -> tuple[int, dict]:
    """Crop size at level 0, after comparing the slide's mpp with the model's training mpp."""
    model_mpp, slide_mpp = engine.model_mpp, info.mpp
    notes = {"slide_mpp": slide_mpp, "model_mpp": model_mpp, "objective": info.objective}
    src = opts.patch_size
    if model_mpp and slide_mpp:
        ratio = model_mpp / slide_mpp
        notes["mpp_ratio"] = round(ratio, 4)
        if abs(ratio - 1.0) > 0.1:
            if opts.rescale:
                src = max(16, int(round(opts.patch_size * ratio)))
                echo(
                    f"note: slide at {slide_mpp:.3g} um/px, model trained at {model_mpp:.3g}: "
                    f"cutting {src} px crops and resampling them to {opts.patch_size}"
                )
            else:
                echo(
                    f"warning: slide at {slide_mpp:.3g} um/px but the model was trained at "
                    f"{model_mpp:.3g} um/px ({ratio:.2f}x); cells will look "
                    f"{'larger' if ratio > 1 else 'smaller'} than in training. Pass --rescale "
                    "to resample the crops"
                )
    elif opts.rescale:
        echo(
            "warning: --rescale needs the mpp of both the slide and the model "
            f"(slide: {slide_mpp}, model: {model_mpp}); crops are not resampled"
        )
    notes["crop_px_level0"] = src
    return src, notes


def _finished_summary(target: Path, engine) -> dict | None:
    """The summary of a finished run of this model in ``target``, if there is one."""
    summary = target / "summary.json"
    if not summary.is_file() or not (target / "scores.parquet").is_file():
        return None
    if (target / PARTIAL).exists():
        return None
    data = json.loads(summary.read_text())
    return data if data.get("model_sha256") == engine.bundle.manifest_hash else None


def score_cohort(
    slides: list[Path], model: Path, out: Path, opts: ScoreOptions, echo=print
) -> tuple[list[dict], list[tuple[Path, str]]]:
    """Score several slides with one model load; a slide that fails is reported, the next goes
    on. Returns (summaries, failures as (slide, reason))."""
    from cyto.infer.engine import load_engine

    engine = load_engine(model, opts.backend, opts.device)
    echo(f"model {model} ({engine.bundle.method}) on {engine.describe()}")
    done, failed = [], []
    for slide in slides:
        target = Path(out) / Path(slide).stem
        previous = _finished_summary(target, engine)
        if opts.resume and previous is not None:
            echo(f"{Path(slide).name}: already scored in {target}; skipping")
            done.append(previous)
            continue
        try:
            done.append(score_slide(slide, engine, target, opts, echo=echo))
        except CytoError as exc:
            failed.append((Path(slide), str(exc)))
            echo(f"error: {slide}: {exc}")
    return done, failed


def _finish(table, out_dir, slide, engine, opts, timings, t_start, echo, loop_seconds, notes):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.bundle import sha256_file

    t_fin = time.perf_counter()
    n_cells = table.num_rows
    scores = np.asarray(table["score"], dtype=np.float64) if n_cells else np.empty(0)
    order = np.argsort(-scores, kind="stable")
    rank = np.empty(len(scores), dtype=np.int64)
    rank[order] = np.arange(1, len(scores) + 1)
    table = table.append_column("rank", pa.array(rank))
    labels = truth_idx = None
    if opts.truth is not None and n_cells:
        labels, truth_idx, planted = _labels_from_truth(table, opts.truth, opts.truth_radius)
        table = table.append_column("label", pa.array(labels.astype(np.int8)))
    bundle = engine.bundle
    meta = {
        "cyto.version": __version__,
        "cyto.model": str(bundle.path),
        "cyto.manifest_sha256": bundle.manifest_hash,
        "cyto.method": bundle.method,
        "cyto.slide": str(slide),
        "cyto.slide_sha256": sha256_file(Path(slide)),
        "cyto.backend": engine.backend,
        "cyto.device": engine.device,
        "cyto.timings": json.dumps(timings),
    }
    table = table.replace_schema_metadata(meta)
    partial = out_dir / ".scores.parquet.tmp"
    pq.write_table(table, partial, row_group_size=8192)
    os.replace(partial, out_dir / "scores.parquet")
    k = min(opts.top_k, n_cells)
    top = table.take(pa.array(order[:k])) if k else table.slice(0, 0)
    pq.write_table(top, out_dir / "topk.parquet")
    write_geojson(table, order, k, out_dir / "topk.geojson")
    if n_cells == 0:
        echo(f"warning: no cells found in {slide}; wrote an empty score table")
    summary = {
        "slide": str(slide),
        "model": str(bundle.path),
        "model_sha256": bundle.manifest_hash,
        "method": bundle.method,
        "backend": engine.backend,
        "device": engine.device,
        "cells_scored": int(n_cells),
        "slide_score_mean_top_k": float(scores[order[:k]].mean()) if k else None,
        "burden": burden(scores, bundle.manifest.get("calibration")),
        "resolution": notes,
    }
    if labels is not None:
        from cyto.eval.metrics import all_metrics

        summary["truth"] = all_metrics(scores, labels, k)
        top = order[:k]  # a detection's label is its matched truth cell's label
        hit_cells = set(truth_idx[top][(truth_idx[top] >= 0) & (labels[top] == 1)].tolist())
        summary["truth"]["planted_abnormal"] = planted
        summary["truth"]["planted_found_in_top_k"] = len(hit_cells)
        summary["truth"]["planted_recall_at_k"] = len(hit_cells) / planted if planted else None
    if opts.mosaic and n_cells:
        crop = int(notes.get("crop_px_level0") or opts.patch_size)
        summary["mosaic"] = str(_mosaic(slide, table, order, labels, opts, out_dir, crop))
    timings["finish"] = time.perf_counter() - t_fin
    seconds = time.perf_counter() - t_start
    stage_total = sum(v for k2, v in timings.items() if k2 != "wait") or 1e-9
    engine_rate = n_cells / timings["engine"] if timings["engine"] > 0 else None
    summary.update(
        {
            "seconds": round(seconds, 2),
            "loop_seconds": round(loop_seconds, 2),
            "cells_per_s": round(n_cells / max(seconds, 1e-9), 1),
            "engine_cells_per_s": round(engine_rate, 1) if engine_rate else None,
            "pipeline_efficiency": (
                round(n_cells / max(seconds, 1e-9) / engine_rate, 3) if engine_rate else None
            ),
            "timings_s": {k2: round(v, 2) for k2, v in timings.items()},
            "stage_share": {
                k2: round(v / stage_total, 3) for k2, v in timings.items() if k2 != "wait"
            },
            "peak_rss_mb": peak_rss_mb(),
            "options": {
                k2: (str(v) if isinstance(v, Path) else v) for k2, v in asdict(opts).items()
            },
        }
    )
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def burden(scores: np.ndarray, calibration: dict | None, q: str = "0.99") -> dict | None:
    """Abnormal-burden estimate: cells above the model's normal-cell quantile ``q``, less the
    share that normal cells alone put there (1 - q), as the paper's Discussion proposes."""
    if not calibration or q not in calibration.get("quantiles", {}) or len(scores) == 0:
        return None
    thr = float(calibration["quantiles"][q])
    above = int((scores > thr).sum())
    expected = (1.0 - float(q)) * len(scores)
    excess = max(0.0, above - expected)
    return {
        "threshold": thr,
        "threshold_quantile_of_normals": float(q),
        "cells_above": above,
        "expected_from_normal_cells": round(expected, 1),
        "excess_cells": round(excess, 1),
        "excess_fraction": round(excess / len(scores), 5),
        "calibration": calibration.get("source"),
    }


def _labels_from_truth(table, truth: Path, radius: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Label each detected cell by the nearest ground-truth cell, if within ``radius`` (or 0.8
    of that cell's radius, when the truth table gives it).

    Returns (label per detection, matched truth index or -1, number of planted abnormal cells).
    """
    import pyarrow.parquet as pq
    from scipy.spatial import cKDTree

    gt = pq.read_table(truth)
    pts = np.stack([np.asarray(gt["x"]), np.asarray(gt["y"])], axis=1)
    dist, idx = cKDTree(pts).query(np.stack([np.asarray(table["x"]), np.asarray(table["y"])], 1))
    truth_labels = np.asarray(gt["label"])
    reach = np.full(len(pts), radius)
    if "cell_radius" in gt.column_names:  # a big cell's nucleus may be found off its centre
        reach = np.maximum(reach, 0.8 * np.asarray(gt["cell_radius"], dtype=np.float64))
    hit = dist <= reach[idx]
    labels = np.where(hit, truth_labels[idx], 0).astype(np.int64)
    return labels, np.where(hit, idx, -1), int(truth_labels.sum())


def _mosaic(slide, table, order, labels, opts, out_dir: Path, crop: int) -> Path:
    """Review mosaics of the top cells, 10 per row.

    ``topk_mosaic.png`` is in ranked order, with true abnormal cells (when ground truth is given)
    boxed with an x. ``topk_mosaic_blinded.png`` shows the same cells in a random order without
    marks, for blinded review as in the paper; ``topk_mosaic_blinded_key.json`` maps each grid
    position to its cell and rank.
    """
    from PIL import Image, ImageDraw

    n = min(opts.mosaic, len(order))
    side, cols = 96, 10
    rows = -(-n // cols)
    reader = open_slide(slide)
    xs, ys = np.asarray(table["x"]), np.asarray(table["y"])
    ids = np.asarray(table["cell_id"])
    half = crop // 2  # the level-0 size the model saw (after any --rescale)
    tiles = []
    for i in order[:n]:
        cell = reader.read_region(int(round(xs[i])) - half, int(round(ys[i])) - half, crop, crop)
        tiles.append(Image.fromarray(cell).resize((side, side), Image.Resampling.BILINEAR))
    reader.close()

    def grid(sequence: list[int], marks: bool) -> Image.Image:
        canvas = Image.new("RGB", (cols * side, rows * side), "white")
        draw = ImageDraw.Draw(canvas)
        for pos, k in enumerate(sequence):
            cx, cy = (pos % cols) * side, (pos // cols) * side
            canvas.paste(tiles[k], (cx, cy))
            if marks and labels is not None and labels[order[k]] == 1:
                draw.rectangle(
                    [cx + 1, cy + 1, cx + side - 2, cy + side - 2], outline="white", width=3
                )
                draw.line([cx + 6, cy + 6, cx + 20, cy + 20], fill="white", width=3)
                draw.line([cx + 20, cy + 6, cx + 6, cy + 20], fill="white", width=3)
        return canvas

    path = out_dir / "topk_mosaic.png"
    grid(list(range(n)), marks=True).save(path)
    shuffled = [int(k) for k in np.random.default_rng(0).permutation(n)]
    grid(shuffled, marks=False).save(out_dir / "topk_mosaic_blinded.png")
    key = [
        {
            "position": pos,
            "row": pos // cols,
            "col": pos % cols,
            "cell_id": int(ids[order[k]]),
            "rank": k + 1,
        }
        for pos, k in enumerate(shuffled)
    ]
    (out_dir / "topk_mosaic_blinded_key.json").write_text(json.dumps(key, indent=1))
    return path


def write_geojson(table, order, k: int, path: Path) -> Path:
    """The top-K cells as GeoJSON points (level-0 pixels) that QuPath imports as detections."""
    xs, ys = np.asarray(table["x"]), np.asarray(table["y"])
    scores, ids = np.asarray(table["score"]), np.asarray(table["cell_id"])
    features = [
        {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [float(xs[i]), float(ys[i])]},
            "properties": {
                "objectType": "detection",
                "name": f"rank {r + 1}",
                "classification": {"name": "cyto top-K"},
                "measurements": {"score": float(scores[i]), "rank": r + 1, "cell_id": int(ids[i])},
            },
        }
        for r, i in enumerate(order[:k])
    ]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path
