"""Score every cell of a slide: tiles -> nuclei -> crops -> scorer -> Parquet.

:func:`score_slide` is the orchestrator; each job is a module of its own:

- :mod:`cyto.infer.tiling`: tissue mask, tile list, worker processes that decode, detect and crop;
- :mod:`cyto.infer.planes`: focal planes and the sharpest one per cell;
- :mod:`cyto.runtime`: the scorer (backend + head), loaded once per cohort;
- :mod:`cyto.infer.store`: resumable row chunks (``resume=True`` continues an interrupted run);
- :mod:`cyto.infer.outputs`: scores.parquet, topk.parquet, topk.geojson, mosaics, truth labels;
- :mod:`cyto.infer.calibrate`: p-values against slide-negative slides, cells flagged at a false
  discovery rate, the abnormal burden with its interval, the slide test.

``summary.json`` records timings per stage, cells/s, pipeline efficiency, peak memory, the slide
score and the burden estimate; ``score_cohort`` keeps ``cohort.csv``, one row per slide.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path

import numpy as np

from cyto.errors import CytoError, InputPathError, OutputWriteError
from cyto.infer import calibrate
from cyto.infer.memory import peak_rss_mb
from cyto.infer.options import STAGES, ScoreOptions
from cyto.infer.outputs import (
    cohort_row,
    labels_from_truth,
    ranks,
    read_truth,
    table_metadata,
    truth_report,
    write_cohort_table,
    write_mosaics,
    write_score_table,
    write_top_k,
)
from cyto.infer.planes import check_plane_geometry, find_planes
from cyto.infer.slide import open_slide
from cyto.infer.store import (
    PARTIAL,
    ChunkStore,
    OutputLock,
    kept_words,
    schema,
    slide_identity,
    slide_key,
)
from cyto.infer.tiling import (
    QUEUE_MIN,
    Resolution,
    TileContext,
    TileFeed,
    broken_worker_error,
    max_cells_per_result,
    resolution,
    tile_jobs,
    tissue_mask,
)
from cyto.progress import progress
from cyto.runtime import Scorer, devices, load_scorer
from cyto.runtime.lane import EngineLane

Metrics = Callable[[np.ndarray, np.ndarray, int], dict]


class CellBatcher:
    """Tile results in, scored rows out: crops go through the engine lane in batches of at least
    ``4 * batch_size`` cells (in a background thread when ``overlap``, at most two batches out),
    rows go to the store in chunks of whole tiles. Crops may be host arrays or tensors already
    on the engine's device (``--decode torch`` in the main process)."""

    def __init__(
        self,
        scorer: Scorer,
        store: ChunkStore,
        slide_id: str,
        opts,
        first_id: int,
        first_tile: int,
        overlap: bool = False,
    ):
        self.scorer, self.store, self.slide_id, self.opts = scorer, store, slide_id, opts
        self.lane = EngineLane(scorer, opts.batch_size, overlap)
        self.n_cells = first_id  # cell ids continue where a resumed run stopped
        self.first_tile = first_tile  # the first tile not yet in a chunk
        self.pending: list[dict] = []
        self.out_cells = 0  # cells submitted to the lane and not yet taken back
        self.rows: list = []
        self.n_rows = 0
        self.write_s = 0.0

    @property
    def engine_s(self) -> float:
        return self.lane.wall_s

    def _pending_cells(self) -> int:
        return sum(len(p["meta"]) for p in self.pending)

    def add(self, res: dict, tiles_done: int) -> None:
        """Take a tile result; ``tiles_done`` counts the tiles complete so far (a chunk ends
        only where a tile ends, so a part of a dense tile never goes out alone)."""
        if len(res["meta"]):
            self.pending.append(res)
        if self._pending_cells() >= 4 * self.opts.batch_size:
            self.score_pending()
        held = self.n_rows + self.out_cells + self._pending_cells()
        if res["final"] and held >= self.opts.chunk_cells:
            self.flush(tiles_done)

    def score_pending(self) -> None:
        """Hand the pending crops to the lane (taking back the batches it had to finish)."""
        if not self.pending:
            return
        first = self.pending[0]["crops"]
        if isinstance(first, np.ndarray):
            crops = np.concatenate([p["crops"] for p in self.pending])
        else:
            import torch

            crops = torch.cat([p["crops"] for p in self.pending])
        meta = np.concatenate([p["meta"] for p in self.pending])
        tiles = np.concatenate([np.full(len(p["meta"]), p["tile"]) for p in self.pending])
        self.pending.clear()
        self.out_cells += len(meta)
        for scores, tag in self.lane.submit(crops, (meta, tiles)):
            self._rows(scores, *tag)

    def _rows(self, scores: np.ndarray, meta: np.ndarray, tiles: np.ndarray) -> None:
        import pyarrow as pa

        n = len(meta)
        self.out_cells -= n
        self.rows.append(
            pa.table(
                {
                    "slide_id": [self.slide_id] * n,
                    "cell_id": np.arange(self.n_cells, self.n_cells + n),
                    "x": meta[:, 0],
                    "y": meta[:, 1],
                    "nucleus_area": meta[:, 2],
                    "focal_plane_um": meta[:, 3],
                    "score": scores,
                    "tile": tiles,
                },
                schema=schema(),
            )
        )
        self.n_cells += n
        self.n_rows += n

    def flush(self, tiles_done: int) -> None:
        """Write the rows of every tile before ``tiles_done`` not yet in a chunk."""
        import pyarrow as pa

        self.score_pending()
        for scores, tag in self.lane.drain():
            self._rows(scores, *tag)
        if tiles_done <= self.first_tile:
            return
        t0 = time.perf_counter()
        table = pa.concat_tables(self.rows) if self.rows else schema().empty_table()
        self.store.write(table, self.first_tile, tiles_done)
        self.first_tile = tiles_done
        self.rows.clear()
        self.n_rows = 0
        self.write_s += time.perf_counter() - t0

    def close(self) -> None:
        self.lane.close()


def score_slide(
    slide: Path,
    model,
    out_dir: Path,
    opts: ScoreOptions = ScoreOptions(),
    echo=print,
    metrics: Metrics | None = None,
) -> dict:
    """Score one slide into ``out_dir``; returns the summary (also written as summary.json).

    ``model`` is a loaded :class:`~cyto.runtime.Scorer` (a cohort loads it once) or a bundle path,
    loaded here with ``opts.backend``, ``opts.device`` and ``opts.precision``. ``metrics``
    (e.g. :func:`cyto.eval.metrics.all_metrics`) adds the @K metrics to the truth report.
    """
    scorer = (
        model
        if isinstance(model, Scorer)
        else load_scorer(model, opts.backend, opts.device, opts.precision, verify=opts.verify)
    )
    slide, out_dir = Path(slide), Path(out_dir)
    t_start = time.perf_counter()
    reader = open_slide(slide)  # a bad slide fails here, before any output folder exists
    planes = find_planes(slide, opts.planes)
    check_plane_geometry(planes, reader.info.width, reader.info.height)
    made = not out_dir.exists()
    try:
        with OutputLock(out_dir):
            return _score_locked(
                slide, reader, planes, scorer, out_dir, opts, echo, metrics, t_start
            )
    except OSError as exc:
        raise write_error(slide, out_dir, exc) from exc
    except BaseException:
        # a run that failed before writing anything leaves no empty folder behind
        if made and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    finally:
        reader.close()


def write_error(slide: Path, out_dir: Path, exc: OSError) -> OutputWriteError:
    why = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is used up",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "no permission to write there",
        errno.EPERM: "no permission to write there",
    }.get(exc.errno, exc.strerror or str(exc))
    kept = out_dir / PARTIAL
    tail = (
        f"; the finished chunks are kept in {kept}: fix that and rerun with --resume"
        if kept.is_dir() and any(kept.glob("chunk-*"))
        else ""
    )
    where = Path(exc.filename) if exc.filename else out_dir
    if out_dir.resolve() not in (where.resolve(), *where.resolve().parents):
        return OutputWriteError(f"{slide}: input/output error on {where}: {why}")
    return OutputWriteError(f"{slide}: cannot write {where}: {why}{tail}")


def decode_device(device: str) -> str:
    """Where ``--decode torch`` decodes: the engine's CUDA device when there is one, else the
    CPU (``--device cpu`` keeps it there)."""
    if device == "cpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return "cuda" if device == "auto" else device


class SlidePlan:
    """What every run over a slide's tiles shares: the resolution, the worker context and the
    tile list (all tiles of a slide, in order; a part of a slide is a range of it)."""

    def __init__(self, slide: Path, reader, planes, scorer: Scorer, opts: ScoreOptions, echo):
        info = reader.info
        slide_mpp = opts.slide_mpp or info.mpp
        model_mpp = opts.model_mpp or scorer.spec.mpp
        if slide_mpp is None:
            echo(
                f"warning: {slide.name} records no resolution (mpp): nucleus sizes assume "
                f"{opts.detection.mpp} um/px and its scale cannot be checked against the "
                "model's; pass --mpp UM_PER_PX"
            )
        if model_mpp is None:
            echo(
                "warning: the model records no training resolution (mpp), so the slide's scale "
                "cannot be checked against it; pass --model-mpp UM_PER_PX (that of the training "
                "patches)"
            )
        self.slide, self.planes, self.slide_mpp = slide, planes, slide_mpp
        self.res = resolution(
            slide_mpp, info.objective, model_mpp, opts.patch_size, opts.rescale, echo
        )
        t0 = time.perf_counter()
        mask, mask_ds = tissue_mask(reader)
        self.mask_s = time.perf_counter() - t0
        self.jobs = tile_jobs(info, opts.tile, mask, mask_ds, opts.nuclei)
        self.workers = opts.n_workers()
        # tiles in flight (why 16: tiling.QUEUE_MIN); max_cells below shrinks as the queue grows
        self.queue = opts.queue or max(QUEUE_MIN, 2 * self.workers)
        self.ctx = TileContext(
            slide=str(slide),
            planes=tuple(str(f) for _, f in planes),
            plane_z=(0.0, *(z for z, _ in planes)),
            tile=opts.tile,
            margin=self.res.crop_px_level0 // 2 + 32,
            src_patch=self.res.crop_px_level0,
            out_size=scorer.spec.crop_size,
            detection=opts.detection.at(slide_mpp),  # nuclei have a physical size
            max_cells=opts.max_cells
            or max_cells_per_result(scorer.spec.crop_size, len(planes) + 1, self.queue),
        )
        self.decode = "CPU readers"
        if opts.decode == "torch":
            from cyto.infer.device_tiles import open_device_tiles

            grid, why = open_device_tiles(slide)
            if grid is None:
                self.decode = why
                echo(f"{slide.name}: --decode torch: {why}")
            else:
                device = decode_device(opts.device)
                self.decode = f"{why} ({device})"
                self.ctx = replace(self.ctx, decode="torch", decode_device=device)
                if device != "cpu" and self.workers:
                    # the device does the decoding, detection and cropping: no worker processes
                    # (each would hold a CUDA context of its own)
                    self.workers = 0
                if not self.workers:  # crops stay tensors on the decode device for the engine
                    self.ctx = replace(self.ctx, keep_on_device=True)
        self.overlap = opts.overlaps(scorer.device)
        self.identity = ""  # the slide's identity, once a store has read it

    def store_key(self, scorer: Scorer, opts: ScoreOptions, jobs: int) -> dict:
        return {
            "model": scorer.bundle.manifest_hash,
            "slide": slide_key(self.slide, self.planes),
            "options": {**opts.result_key(), "precision": scorer.precision},
            "tiles": jobs,
        }


class TileRun:
    """The outcome of scoring a run of tiles into a chunk store."""

    def __init__(self) -> None:
        self.timings = dict.fromkeys(STAGES, 0.0)
        self.resumed_cells = 0
        self.resumed_tiles = 0
        self.crowd: dict | None = None
        self.loop_seconds = 0.0
        self.worker_rss_mb: float | None = None
        self.cells = 0  # cells scored by this run (not resumed)
        self.overlap = False  # the engine ran in a thread of its own
        self.engine_device_s = 0.0  # CUDA event time of the engine calls (0 off CUDA)
        self.h2d_bytes = 0  # bytes copied from host memory to the engine's device

    def as_json(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict) -> TileRun:
        run = cls()
        for name in vars(run):  # a field newer than the record keeps its default
            setattr(run, name, data.get(name, getattr(run, name)))
        return run


def score_tiles(plan: SlidePlan, jobs: list, store: ChunkStore, scorer, opts, echo) -> TileRun:
    """Score ``jobs`` (the slide's tiles, or a range of them) into ``store``, continuing what it
    holds when ``opts.resume``; the detections of the first tiles are checked for crowding."""
    slide = plan.slide
    out = TileRun()
    done_tiles, n_done = store.start(opts.resume, echo)
    out.resumed_tiles, out.resumed_cells = done_tiles, n_done
    feed = TileFeed(plan.ctx, jobs[done_tiles:], plan.workers, plan.queue)
    cells = CellBatcher(scorer, store, slide.stem, opts, n_done, done_tiles, plan.overlap)
    t_loop = time.perf_counter()
    h2d_before = devices.h2d_bytes(devices.parse_device(scorer.device)[0])
    position = done_tiles
    first_xy: list[np.ndarray] = []  # detections of the first tiles, for the crowding check
    crowd = None
    try:
        with progress(f"score {slide.name}", total=len(jobs), unit="tiles") as bar:
            bar.advance(done_tiles)
            for tile in feed:
                for stage, seconds in tile["times"].items():
                    out.timings[stage] += seconds
                position += tile["final"]
                if crowd is None:
                    first_xy.append(tile["meta"][:, :2])
                    crowd = _check_crowding(first_xy, plan.res, plan.slide_mpp, opts, echo)
                cells.add(tile, position)
                bar.advance(int(tile["final"]))
                rate = (cells.n_cells - n_done) / max(time.perf_counter() - t_loop, 1e-9)
                bar.set_postfix(f"{cells.n_cells} cells, {rate:.0f} cells/s")
            cells.flush(position)
            if crowd is None:
                crowd = _check_crowding(first_xy, plan.res, plan.slide_mpp, opts, echo, last=True)
    except KeyboardInterrupt:
        echo(f"interrupted: {kept_words(store.dir)}")
        raise
    except BrokenProcessPool as exc:
        raise broken_worker_error(slide, store.dir, exc) from exc
    finally:
        cells.close()
        feed.close()
    out.timings.update(engine=cells.engine_s, write=cells.write_s, wait=feed.wait)
    out.loop_seconds = time.perf_counter() - t_loop
    out.cells = cells.n_cells - n_done
    out.overlap, out.engine_device_s = cells.lane.overlap, cells.lane.device_s
    out.h2d_bytes = devices.h2d_bytes(devices.parse_device(scorer.device)[0]) - h2d_before
    out.crowd = crowd
    out.worker_rss_mb = feed.worker_rss_mb if feed.pool is not None else None
    plan.identity = store.key["slide"][str(slide)]
    return out


def _score_locked(slide, reader, planes, scorer, out_dir, opts, echo, metrics, t_start) -> dict:
    """:func:`score_slide` once the output folder is ours."""
    plan = SlidePlan(slide, reader, planes, scorer, opts, echo)
    store = ChunkStore(out_dir, plan.store_key(scorer, opts, len(plan.jobs)))
    tiles = score_tiles(plan, plan.jobs, store, scorer, opts, echo)
    tiles.timings["mask"] = plan.mask_s
    summary = finish_slide(
        store.read_all(), plan, [tiles], out_dir, scorer, opts, echo, metrics, t_start
    )
    store.remove()
    return summary


def finish_slide(table, plan, runs, out_dir, scorer, opts, echo, metrics, t_start) -> dict:
    """Rank and write every output of a slide scored by ``runs`` (one, or one per range of
    tiles); writes and returns the summary."""
    timings = dict.fromkeys(STAGES, 0.0)
    for r in runs:
        for stage, seconds in r.timings.items():
            timings[stage] += seconds
    run = _Run(plan.slide, out_dir, scorer, opts, timings, t_start, plan.res, echo, metrics)
    run.identity = plan.identity
    run.resumed_cells = sum(r.resumed_cells for r in runs)
    summary = _finish(table, run)
    rss = [r.worker_rss_mb for r in runs if r.worker_rss_mb is not None]
    summary.update(
        {
            "loop_seconds": round(sum(r.loop_seconds for r in runs), 2),
            "workers": plan.workers,
            "peak_rss_workers_mb": round(max(rss), 1) if rss else None,
            "focal_planes_um": list(plan.ctx.plane_z),
            "detection_crowding": runs[0].crowd,
            "decode": plan.decode,
            "engine_lane": engine_lane(runs, scorer.device),
            "tiles": {"total": len(plan.jobs), "resumed_from": runs[0].resumed_tiles},
        }
    )
    if len(runs) > 1:
        summary["tiles"]["parts"] = len(runs)
        summary["tiles"]["resumed"] = sum(r.resumed_tiles for r in runs)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def engine_lane(runs: list[TileRun], device: str) -> dict:
    """How busy the engine was over the tile loop: the share of the loop spent in engine calls
    (wall time), on CUDA the GPU's busy fraction from CUDA events around those calls, and the
    bytes copied from host memory to the device per cell."""
    loop = sum(r.loop_seconds for r in runs)
    cells = sum(r.cells for r in runs)
    busy = sum(r.timings["engine"] for r in runs)
    cuda = device.startswith("cuda")
    return {
        "overlap": any(r.overlap for r in runs),
        "engine_busy_fraction": round(busy / loop, 3) if loop > 0 else None,
        "gpu_busy_fraction": (
            round(sum(r.engine_device_s for r in runs) / loop, 3) if cuda and loop > 0 else None
        ),
        "h2d_bytes_per_cell": (
            round(sum(r.h2d_bytes for r in runs) / cells, 1) if cuda and cells else None
        ),
    }


CROWDED = 6  # other detections per crop, median: far more than a smear at the model's scale


def _check_crowding(
    first_xy: list[np.ndarray], res: Resolution, mpp, opts, echo, last: bool = False
) -> dict | None:
    """After the first tiles with 100 detections (or 16 tiles with 20, or all tiles of a small
    slide), say when crops are crowded."""
    from cyto.infer.nuclei import crowding

    xy = np.concatenate(first_xy) if first_xy else np.empty((0, 2))
    enough = len(xy) >= 100 or (len(first_xy) >= 16 and len(xy) >= 20)
    if not (enough or last):
        return None
    report = crowding(xy, res.crop_px_level0, mpp)
    report["detection"] = opts.detection.kind
    if report["median_others_per_crop"] > CROWDED and opts.detection.kind == "smear":
        echo(
            f"warning: detections are crowded: a {res.crop_px_level0} px crop holds a median of "
            f"{report['median_others_per_crop']:.0f} other detections (nearest neighbours "
            f"{report['median_nn']} {report['nn_unit']} apart), where a cytology smear at the "
            "model's scale shows about one cell per crop. A tissue section? Then pass "
            "--detection tissue. Otherwise is the slide's resolution wrong? Check --mpp and "
            "--rescale, or give the nuclei with --nuclei"
        )
    return report


_COLUMN_TYPES = {"p_value": "float64", "flagged_bh": "bool", "flagged_adaptive": "bool"}


def _calibrated(scores: np.ndarray, run: _Run) -> dict:
    """The calibration's columns and burden block (:func:`cyto.infer.calibrate.apply`), or why
    there are none; says out loud when the run differs from the calibration's."""
    bundle = run.scorer.bundle
    cal = calibrate.Calibration.of(bundle)
    if cal is None:
        return {
            "burden": {
                "status": "not calibrated",
                "reason": "no slide-negative calibration in this bundle: run cyto calibrate "
                f"{bundle.path} NEGATIVE/scores.parquet ... for p-values, FDR flags and burden",
            }
        }
    differs = cal.differences(run.scorer, run.opts.result_key())
    if any(d.startswith("model ") for d in differs):
        return {
            "burden": {
                "status": "calibration mismatch",
                "reason": "the calibration was made with another model: calibrate again",
            }
        }
    out = calibrate.apply(
        scores,
        cal,
        alpha=run.opts.fdr_alpha,
        triage_level=run.opts.triage_level,
        confidence=run.opts.fdr_confidence,
    )
    if differs:
        run.echo(
            f"warning: {run.slide.name}: scored unlike the calibration slides ("
            + "; ".join(differs)
            + "): p-values, FDR flags and burden assume the same scoring; calibrate again on "
            "slide-negative slides scored this way"
        )
        out["burden"]["scored_unlike_calibration"] = differs
    if out["burden"]["status"] != "ok":
        run.echo(f"warning: {run.slide.name}: {out['burden']['reason']}")
    elif "note" in out["burden"]:
        run.echo(f"note: {run.slide.name}: {out['burden']['note']}")
    return out


class _Run:
    """What the finishing step of one slide needs to know about its run."""

    def __init__(self, slide, out_dir, scorer, opts, timings, t_start, res, echo, metrics):
        self.slide: Path = slide
        self.out_dir: Path = out_dir
        self.scorer: Scorer = scorer
        self.opts: ScoreOptions = opts
        self.timings: dict = timings
        self.t_start: float = t_start
        self.res: Resolution = res
        self.echo = echo
        self.metrics: Metrics | None = metrics
        self.identity: str = ""
        self.resumed_cells: int = 0


def _finish(table, run: _Run) -> dict:
    """Rank the cells and write every output; returns the summary."""
    import pyarrow as pa

    opts, bundle, timings = run.opts, run.scorer.bundle, run.timings
    t_fin = time.perf_counter()
    n_cells = table.num_rows
    scores = np.asarray(table["score"], dtype=np.float64) if n_cells else np.empty(0)
    order, rank = ranks(scores)
    table = table.append_column("rank", pa.array(rank))
    k = min(opts.top_k, n_cells)
    calibrated = _calibrated(scores, run)
    for name, column in calibrated.get("columns", {}).items():  # None: the flags are withheld
        values = [None] * n_cells if column is None else column
        table = table.append_column(name, pa.array(values, type=_COLUMN_TYPES[name]))
    burden = calibrated["burden"]
    labels = None
    truth = None
    if opts.truth is not None and n_cells:
        labels, truth_idx, planted = labels_from_truth(table, opts.truth, opts.truth_radius)
        table = table.append_column("label", pa.array(labels.astype(np.int8)))
        truth = truth_report(scores, order, labels, truth_idx, planted, k, run.metrics)
    meta = table_metadata(run.scorer, run.slide, run.identity, timings, opts.result_key())
    write_score_table(table, run.out_dir, meta)
    write_top_k(table, order, k, run.out_dir)
    if n_cells == 0:
        run.echo(f"warning: no cells found in {run.slide}; wrote an empty score table")
    summary = {
        "slide": str(run.slide),
        "output": str(run.out_dir),
        "slide_identity": run.identity,
        "model": str(bundle.path),
        "model_sha256": bundle.manifest_hash,
        "method": bundle.method,
        "backend": run.scorer.backend.name,
        "device": run.scorer.device,
        "precision": run.scorer.precision,
        "graph": run.scorer.graph_file,
        # the check of this graph on the bundle's golden cells, on this machine ("skipped":
        # the user's explicit override)
        "verification": (
            run.scorer.verification.as_json() if run.scorer.verification is not None else None
        ),
        "cells_scored": int(n_cells),
        "slide_score_mean_top_k": float(scores[order[:k]].mean()) if k else None,
        "burden": burden,
        "resolution": run.res.as_json(),
    }
    if truth is not None:
        summary["truth"] = truth
    if opts.mosaic and n_cells:
        summary["mosaic"] = str(
            write_mosaics(
                run.slide, table, order, labels, opts.mosaic, run.out_dir, run.res.crop_px_level0
            )
        )
    timings["finish"] = time.perf_counter() - t_fin
    seconds = time.perf_counter() - run.t_start
    stage_total = sum(v for k2, v in timings.items() if k2 != "wait") or 1e-9
    # rates of this run only: a resumed run scored just the cells after the resume point
    new_cells = n_cells - run.resumed_cells
    engine_rate = new_cells / timings["engine"] if timings["engine"] > 0 else None
    summary.update(
        {
            "seconds": round(seconds, 2),
            "cells_this_run": int(new_cells),
            "cells_resumed": int(run.resumed_cells),
            # none when every cell came from finished chunks: this run scored nothing
            "cells_per_s": round(new_cells / max(seconds, 1e-9), 1) if new_cells else None,
            "engine_cells_per_s": round(engine_rate, 1) if engine_rate else None,
            "pipeline_efficiency": (
                round(new_cells / max(seconds, 1e-9) / engine_rate, 3) if engine_rate else None
            ),
            "timings_s": {k2: round(v, 2) for k2, v in timings.items()},
            "stage_share": {
                k2: round(v / stage_total, 3) for k2, v in timings.items() if k2 != "wait"
            },
            "peak_rss_mb": peak_rss_mb(),
            "options": opts.as_json(),
        }
    )
    (run.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def finished_summary(target: Path, scorer: Scorer, slide: Path, echo) -> dict | None:
    """The summary of a finished run of this model on this very slide in ``target``, if any."""
    summary = target / "summary.json"
    if not summary.is_file() or not (target / "scores.parquet").is_file():
        return None
    if (target / PARTIAL).exists():
        return None
    try:
        data = json.loads(summary.read_text())
    except json.JSONDecodeError:
        return None
    if data.get("model_sha256") != scorer.bundle.manifest_hash:
        return None
    if data.get("slide_identity") != slide_identity(slide):
        echo(f"{slide.name}: the slide file changed since {target} was scored; scoring it again")
        return None
    return data


def score_one(slide: Path, target: Path, scorer: Scorer, opts: ScoreOptions, echo, metrics) -> dict:
    """One slide of a cohort into ``target``: with ``opts.resume``, a finished run of this model
    on this very slide is reused, an interrupted one continued."""
    if slide.is_file() and opts.resume:
        previous = finished_summary(target, scorer, slide, echo)
        if previous is not None:
            echo(f"{slide.name}: already scored in {target}; skipping")
            return previous
    return score_slide(slide, scorer, target, opts, echo=echo, metrics=metrics)


def check_out_folder(out: Path) -> None:
    if Path(out).exists() and not Path(out).is_dir():
        raise InputPathError(f"--out {out} is a file; give a folder (it is created if missing)")


def check_writable(out: Path) -> None:
    """``out``, or the nearest folder above it that exists, must take new files: a read-only
    --out used to fail on its lock file with a traceback after the slides were scored."""
    import os

    here = Path(out).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise OutputWriteError(f"cannot write --out {out}: {here} is a file, not a folder")
    if not os.access(here, os.W_OK | os.X_OK):
        raise OutputWriteError(
            f"--out {out}: {here} is read-only for this user; give a folder you can write to"
        )


def check_inputs(out: Path, opts: ScoreOptions) -> None:
    """Every input the options name, checked before any work starts (a bad --truth or
    --nuclei file used to surface only after a whole slide was scored)."""
    check_out_folder(out)
    check_writable(out)
    if opts.truth is not None:
        read_truth(opts.truth)
    if opts.nuclei is not None and not Path(opts.nuclei).is_file():
        raise InputPathError(f"nuclei file {opts.nuclei} does not exist")


def _resolved(path: Path) -> Path:
    """The slide's real path; one that cannot be resolved (a symlink loop) stays as given, so
    that slide fails on its own when it is opened and the cohort goes on."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return path.absolute()


def output_folders(slides: list[Path], out: Path) -> list[tuple[Path, Path]]:
    """(slide, its output folder): ``OUT/STEM``, or ``OUT/STEM-<hash of the path>`` for slides
    whose names collide in the cohort (``a/slide.ndpi`` and ``b/slide.ndpi``), so no slide's
    result can overwrite another's. The same slide listed twice is scored once."""
    import hashlib

    unique = list(dict.fromkeys(_resolved(Path(s)) for s in slides))
    stems: dict[str, int] = {}
    for s in unique:
        stems[s.stem] = stems.get(s.stem, 0) + 1
    out = Path(out)
    pairs = []
    for s in unique:
        name = s.stem
        if stems[s.stem] > 1:
            name = f"{s.stem}-{hashlib.sha1(str(s).encode()).hexdigest()[:8]}"
        pairs.append((s, out / name))
    return pairs


def score_cohort(
    slides: list[Path],
    model: Path,
    out: Path,
    opts: ScoreOptions,
    echo=print,
    metrics: Metrics | None = None,
) -> tuple[list[dict], list[tuple[Path, CytoError]]]:
    """Score several slides with one model load; a slide that fails is reported, the next goes
    on. Returns (summaries, failures as (slide, error))."""
    check_inputs(out, opts)
    scorer = load_scorer(model, opts.backend, opts.device, opts.precision, verify=opts.verify)
    echo(f"model {model} ({scorer.bundle.method}) on {scorer.describe()}")
    for note in scorer.notes:
        echo(f"  backend choice: {note}")
    if scorer.verification is not None:
        echo(f"  verification: {scorer.verification.words()}")
    done, failed, rows = [], [], []
    pairs = output_folders(slides, out)
    if len(pairs) < len(slides):
        echo(f"note: {len(slides) - len(pairs)} slide(s) listed twice are scored once")
    for slide, target in pairs:
        if target.name != slide.stem:
            echo(
                f"note: another slide of this cohort is also named {slide.name}: "
                f"{slide} -> {target}"
            )
        try:
            summary = score_one(slide, target, scorer, opts, echo, metrics)
            done.append(summary)
            rows.append(cohort_row(slide, target, summary))
        except CytoError as exc:
            failed.append((slide, exc))
            rows.append(cohort_row(slide, target, None, str(exc)))
        if Path(out).is_dir():
            write_cohort_table(rows, Path(out) / "cohort.csv")
    return done, failed
