"""Score every cell of a slide: tiles -> nuclei -> crops -> scorer -> Parquet.

:func:`score_slide` is the orchestrator; each job is a module of its own:

- :mod:`cyto.slides`: the slide and its focal planes, opened once;
- :mod:`cyto.infer.plan`: resolution, tissue mask, tile list, the workers' context;
- :mod:`cyto.infer.tiling`: worker processes that decode, detect (:mod:`cyto.detect`) and crop;
- :mod:`cyto.infer.scale`: the slide's scale against the model's (the resolutions, the cells' size);
- :mod:`cyto.infer.batcher`: crops through the scorer (:mod:`cyto.runtime`) in batches;
- :mod:`cyto.infer.store`: resumable row chunks (``resume=True`` continues an interrupted run);
- :mod:`cyto.infer.finish`: ranks, the calibration's columns (:mod:`cyto.stats`), every output
  (:mod:`cyto.infer.outputs`: scores.parquet, topk.parquet, topk.geojson, mosaics, truth labels).

``summary.json`` records timings per stage, cells/s, pipeline efficiency, peak memory, the slide
score and the burden estimate. Many slides: :mod:`cyto.cohort`.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path

import numpy as np

from cyto.errors import (
    SYSTEM_ERRORS,
    InputPathError,
    OutputWriteError,
    StainWarning,
    WarningLine,
    first_line,
    os_error_path,
)
from cyto.flags import passing, said
from cyto.infer.batcher import CellBatcher
from cyto.infer.finish import Metrics, finish_slide, rank_by
from cyto.infer.memory import trim_malloc
from cyto.infer.options import ScoreOptions, as_cut
from cyto.infer.plan import SlidePlan, ThresholdAhead, TileRun, check_model_mpp
from cyto.infer.scale import Resolution, check_scale, detection_cause
from cyto.infer.store import KEPT_ROWS, PARTIAL, ChunkStore, kept_words, rows_differ
from cyto.infer.tiling import TileFeed, broken_worker_error, start_workers
from cyto.locks import OutputLock
from cyto.progress import progress, quiet
from cyto.runtime import Scorer, devices, load_scorer
from cyto.slides import open_slide, open_with_planes
from cyto.slides.base import printable
from cyto.slides.remote import (
    SlideChangedError,
    SlideURL,
    drop_blocks,
    pinned_ref,
    slide_ref,
)


def score_slide(
    slide: Path,
    model,
    out_dir: Path,
    opts: ScoreOptions = ScoreOptions(),
    echo=print,
    metrics: Metrics | None = None,
    pool=None,
    ahead: ThresholdAhead | None = None,
) -> dict:
    """Score one slide into ``out_dir``; returns the summary (also written as summary.json).

    ``model`` is a loaded :class:`~cyto.runtime.Scorer` (a cohort loads it once) or a bundle path,
    loaded here with ``opts.backend``, ``opts.device`` and ``opts.precision``. ``metrics``
    (e.g. :func:`cyto.eval.metrics.all_metrics`) adds the @K metrics to the truth report.
    ``pool``: tile workers already started for this slide
    (:func:`~cyto.infer.tiling.start_workers`); by default they start here, first. ``ahead``:
    the slide's detection threshold being measured already (:class:`~cyto.infer.plan.
    ThresholdAhead`); by default it starts here, before the model loads.
    """
    # the summary names the slide by its absolute path: a review opened elsewhere finds it
    slide, out_dir = slide_ref(slide).absolute(), Path(out_dir)
    # a remote slide is pinned to the server's version before anything reads it: the tile
    # workers and the threshold thread below opened it on their own, and one that met a change
    # before the run had pinned it left the run to open the new version and score it whole
    slide = pinned_ref(slide)
    refuse_own_output(slide)
    # a folder another run is writing is refused before anything starts for it: the tile
    # workers and the threshold thread of a refused slide were left running as a cohort ended,
    # and the process aborted as it exited ("terminate called without an active exception",
    # rc 134: hostile round 47, 1); the lock itself is taken below, as before
    busy = OutputLock(out_dir).busy()
    if busy is not None:
        raise busy
    if opts.workers is None and pool is None and not isinstance(slide, SlideURL):
        opts = replace(opts, workers=_auto_workers(slide, opts.tile))
    # the tile workers start first: a worker takes 1-3 s to start on 2 cores, which the model's
    # loading and the slide's plan now hide (the engine waited for it: 2.3 s of a 9 s slide)
    if pool is None and opts.decode == "cpu":
        pool = start_workers(slide, opts.n_workers())
    try:
        if ahead is None:  # measured while the model loads (0.3-1.2 s of the plan on 2 cores)
            ahead = ThresholdAhead.start(slide, opts)
        summary = _score_slide(slide, model, out_dir, opts, echo, metrics, pool, ahead)
    except BaseException as exc:
        # a remote slide refused before its run began (its format, read from its first
        # blocks: an NDPI without --download) left those blocks (hostile round 49, 1), and a
        # tile worker still starting read them again once started (round 52, 1): its workers
        # end before its blocks go (not on a Ctrl-C, which leaves them to the bound)
        settle = isinstance(slide, SlideURL) and not isinstance(exc, KeyboardInterrupt)
        if pool is not None:  # a worker still starting exits once started
            pool.shutdown(wait=settle, cancel_futures=True)
        if ahead is not None:  # its reader let go before the process may exit (0.3-1.2 s)
            ahead.join()
        drop_blocks(slide)
        raise
    if pool is not None:  # told to stop when the last tile came in; gone by now, or soon
        pool.shutdown(wait=True)
    return summary


def _auto_workers(slide: Path, tile: int) -> int | None:
    """:func:`~cyto.infer.options.auto_workers` of a local slide by its level-0 size; None (the
    default) where it cannot be opened here: the plan meets that with the readable error."""
    from cyto.infer.options import auto_workers

    try:
        reader = open_slide(slide)
    except Exception:  # noqa: BLE001 - said by the plan, in its words
        return None
    try:
        return auto_workers(reader.info.width, reader.info.height, tile)
    finally:
        reader.close()


def _score_slide(slide: Path, model, out_dir: Path, opts, echo, metrics, pool, ahead) -> dict:
    scorer = (
        model
        if isinstance(model, Scorer)
        else load_scorer(model, opts.backend, opts.device, opts.precision, verify=opts.verify)
    )
    rank_by(scorer, opts)  # a --rank-by this bundle cannot take fails before any work
    check_model_mpp(scorer, opts)  # and so does a --model-mpp the bundle contradicts
    # the crop side as cut (--patch-size, else the model's training patches'): what the table,
    # --resume and a calibration record and compare, whether the flag was given or not
    opts = as_cut(opts, scorer.spec)
    t_start = time.perf_counter()
    # a bad slide or focal plane fails here, before any output folder exists
    reader, planes = open_with_planes(slide, opts.planes)
    slide = pinned_ref(slide)  # a remote slide: this version only, in every process
    made = not out_dir.exists()
    try:
        with OutputLock(out_dir):
            refuse_finished_since(slide, out_dir)
            return _score_locked(
                slide, reader, planes, scorer, out_dir, opts, echo, metrics, t_start, pool, ahead
            )
    except SlideChangedError:
        # rows of two versions must never meet: this run's chunks go (a finished earlier
        # result in the folder stays, and says which version it scored)
        shutil.rmtree(out_dir / PARTIAL, ignore_errors=True)
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    except OSError as exc:
        raise write_error(slide, out_dir, exc) from exc
    except BaseException:
        # a run that failed before writing anything leaves no empty folder behind
        if made and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    finally:
        reader.close()
        drop_blocks(slide)


def refuse_own_output(slide: Path) -> None:
    """A file a scored folder's seal lists (cyto's abnormality map, a mosaic) is no slide:
    refused in one line naming the slide it came from. Scored, its map read as a slide at
    50 um/px, "416.67x smaller", with advice to pass --rescale (hostile round 11, N30)."""
    from cyto.seal import SUMMARY, sealed_output_of

    folder = sealed_output_of(Path(str(slide)))
    if folder is None:
        return
    try:
        source = json.loads((folder / SUMMARY).read_text()).get("slide")
    except (OSError, ValueError, AttributeError):
        source = None
    came = f": give the slide it was scored from ({source})" if isinstance(source, str) else ""
    raise InputPathError(
        f"{slide} is one of cyto's own outputs of the scored folder {folder} (its seal lists "
        f"it), not a slide{came}"
    )


def write_error(slide: Path, out_dir: Path, exc: OSError) -> OutputWriteError:
    """One line for an OSError met writing ``out_dir``: the file it could not write (a chunk
    under ``.partial`` too, whose error from Arrow names no file), why, and what a rerun keeps:
    the finished chunks, or none (said either way: hostile round 35, 2)."""
    why = SYSTEM_ERRORS.get(exc.errno, exc.strerror or str(exc))
    tail = f"; {kept_words(out_dir / PARTIAL, then='fix that and ')}"
    path = os_error_path(exc)
    where = Path(path) if path else out_dir
    if out_dir.resolve() not in (where.resolve(), *where.resolve().parents):
        return OutputWriteError(f"{slide}: input/output error on {where}: {why}")
    return OutputWriteError(f"{slide}: cannot write {where}: {why}{tail}")


def score_tiles(
    plan: SlidePlan, jobs: list, store: ChunkStore, scorer, opts, echo, pool=None
) -> TileRun:
    """Score ``jobs`` (the slide's tiles, or a range of them) into ``store``, continuing what it
    holds when ``opts.resume``; the detections of the first tiles are checked for crowding.
    ``pool``: tile workers already started (:func:`~cyto.infer.tiling.start_workers`)."""
    slide = plan.slide
    out = TileRun()
    done_tiles, n_done = store.start(opts.resume, echo)
    out.resumed_tiles, out.resumed_cells, out.kept = done_tiles, n_done, store.kept
    feed = TileFeed(plan.ctx, jobs[done_tiles:], plan.workers, plan.queue, pool=pool)
    cells = CellBatcher(
        scorer, store, printable(slide.stem), opts, n_done, done_tiles, plan.overlap
    )
    t_loop = time.perf_counter()
    h2d_before = devices.h2d_bytes(devices.parse_device(scorer.device)[0])
    position = done_tiles
    first_xy: list[np.ndarray] = []  # detections of the first tiles, for the crowding check
    shares: list[np.ndarray] = []  # and their crops' nucleus shares, for the scale check
    stained: list[np.ndarray] = []  # and a few of their crops, for the stain check
    trimmed = time.perf_counter()
    crowd = None
    kept = store.read_checks() if done_tiles else None
    if kept is not None:  # the first tiles' checks, made by the run this one resumes
        crowd, out.scale, out.stain = kept["crowd"], kept.get("scale"), kept.get("stain")
    try:
        with (
            quiet(store.kept),
            progress(f"score {slide.name}", len(jobs), "tiles", done_tiles) as bar,
        ):
            for tile in feed:
                for stage, seconds in tile["times"].items():
                    out.timings[stage] += seconds
                position += tile["final"]
                if crowd is None:
                    first_xy.append(tile["meta"][:, :2])
                    shares.append(_nucleus_shares(tile, scorer))
                    stained.append(_some_crops(tile))
                    crowd = _check_crowding(first_xy, plan.res, plan.slide_mpp, opts, echo)
                    if crowd is not None:  # the stain first: another's sizes say nothing
                        out.stain = _check_stain(stained, plan, scorer, opts, echo)
                        out.scale = check_scale(shares, plan, scorer, opts, echo, out.stain)
                        store.save_checks({"crowd": crowd, "scale": out.scale, "stain": out.stain})
                cells.add(tile, position)
                if tile["final"] and time.perf_counter() - trimmed >= TRIM_SECONDS:
                    trim_malloc()  # the crops' fragments, left in the threads' malloc arenas
                    trimmed = time.perf_counter()
                    _refuse_removed(slide)
                bar.advance(int(tile["final"]))
                # the cells found so far (the engine lane keeps up to two batches out, so on
                # a small slide the scored count stayed 0 until the last tiles)
                rate = (cells.seen - n_done) / max(time.perf_counter() - t_loop, 1e-9)
                bar.set_postfix(f"{cells.seen} cells, {rate:.0f} cells/s")
            cells.flush(position)
            rate = (cells.n_cells - n_done) / max(time.perf_counter() - t_loop, 1e-9)
            bar.set_postfix(f"{cells.n_cells} cells, {rate:.0f} cells/s")
            if crowd is None:
                crowd = _check_crowding(first_xy, plan.res, plan.slide_mpp, opts, echo, last=True)
                out.stain = _check_stain(stained, plan, scorer, opts, echo)
                out.scale = check_scale(shares, plan, scorer, opts, echo, out.stain)
    except KeyboardInterrupt:
        echo(f"interrupted: {kept_words(store.dir)}")
        raise
    except BrokenProcessPool as exc:
        _refuse_removed(slide)
        raise broken_worker_error(slide, store.dir, exc) from exc
    except Exception:  # whatever a removed slide's reading raised first, it is said as removed
        _refuse_removed(slide)
        raise
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


def _score_locked(
    slide, reader, planes, scorer, out_dir, opts, echo, metrics, t_start, pool=None, ahead=None
) -> dict:
    """:func:`score_slide` once the output folder is ours."""
    plan = SlidePlan(slide, reader, planes, scorer, opts, echo, ahead)
    store = ChunkStore(out_dir, plan.store_key(scorer, opts, len(plan.jobs)))
    _keep_rows(store, out_dir, plan.slide, opts, echo)
    tiles = score_tiles(plan, plan.jobs, store, scorer, opts, echo, pool=pool)
    tiles.timings["mask"] = plan.mask_s
    summary = finish_slide(
        store.read_all(), plan, [tiles], out_dir, scorer, opts, echo, metrics, t_start
    )
    store.remove()
    return summary


def _keep_rows(store: ChunkStore, out_dir: Path, slide: Path, opts, echo) -> None:
    """The finished run's table as the store's chunk, when ``score_one`` found that only what
    is drawn from it differs (:data:`~cyto.infer.store.KEPT_ROWS`) and its rows are those this
    run would score (:func:`~cyto.infer.store.rows_differ`, said when they are not): the run
    resumes with every tile done, and writes the outputs again from those cells."""
    from cyto.tables import read_table

    kept = KEPT_ROWS.get()
    if kept is None or kept[0] != out_dir or not opts.resume or (out_dir / PARTIAL).exists():
        return
    summary = kept[1]
    why = rows_differ(summary.get("rows_key"), store.key)
    if summary.get("detection_crowding") is None:
        why.append("its first tiles' checks are not recorded")
    if not why:
        checks = {"crowd": summary["detection_crowding"], "scale": summary.get("cell_scale")}
        checks["stain"] = summary.get("cell_stain")
        try:
            missing = store.keep(read_table(out_dir / "scores.parquet"), checks)
            why = [f"its table lacks {', '.join(missing)}"] if missing else []
        except (OSError, ValueError) as exc:  # gone or damaged since it was judged
            why = [f"its table cannot be read ({first_line(exc)})"]
        if not why:
            return
        store.remove()
    echo(f"{slide.name}: {out_dir}: its cells are scored again after all ({'; '.join(why)})")


def _refuse_removed(slide) -> None:
    """A slide file (or DICOM folder) on this machine removed while it is scored: the open files
    still read, and it was scored to its end only to fail there, its chunks left behind for a
    slide that is gone (hostile round 76, 6). Looked at once a second, and when reading it
    fails (a tile reader opening it anew finds no file); its rows are not kept
    (:class:`~cyto.errors.SlideChangedError`, as for a remote slide replaced while read)."""
    import os

    if not isinstance(slide, SlideURL) and not os.path.lexists(slide):
        raise SlideChangedError(
            f"{slide} was removed while it was scored: nothing scored of it is kept"
        )


#: seconds between two malloc trims of the scoring loop: about one per tile on 2 CPU cores (a
#: tile takes about 1 s, a trim 2 ms), not one per tile at a GPU's hundreds of tiles per second
TRIM_SECONDS = 1.0
CROWDED = 6  # other detections per crop, median: far more than a smear at the model's scale


def _check_crowding(
    first_xy: list[np.ndarray], res: Resolution, mpp, opts, echo, last: bool = False
) -> dict | None:
    """After the first tiles with 100 detections (or 16 tiles with 20, or all tiles of a small
    slide), say when crops are crowded."""
    from cyto.detect import crowding

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
            f"{passing('detection', 'tissue')}. Otherwise is the slide's resolution wrong? Check "
            f"{said('slide_mpp')} and {said('rescale')}, or give the nuclei with {said('nuclei')}"
        )
    return report


def _nucleus_shares(tile: dict, scorer) -> np.ndarray:
    """The centre nucleus share of each of a tile result's crops, as the worker measured it with
    the model's cell mask (:mod:`cyto.detect.morphometry`); nothing when the bundle records no
    training share to compare them with."""
    from cyto.detect.morphometry import measure_stain

    crops = tile["crops"]
    if not len(crops) or scorer.spec.centre_nucleus_fraction is None:
        return np.empty(0)
    if tile.get("measures") is not None:
        return tile["measures"]["nucleus_share"]
    if hasattr(crops, "cpu"):
        crops = crops.cpu().numpy()
    return measure_stain(crops, scorer.spec.crop_mpp, scorer.spec.stain)["nucleus_share"]


#: crops of each of the first tiles kept for the stain check: a sample of a hundred cells or
#: more where the first tiles hold them (32 read 32 cells of a Pap slide whose first tile held
#: a hundred, so an H&E section, 19.8 degrees from a Pap model, was held to the few cells'
#: 20 degrees: hostile round 25, 14)
STAIN_CROPS_PER_TILE = 128


def _some_crops(tile: dict) -> np.ndarray:
    """Up to :data:`STAIN_CROPS_PER_TILE` of a tile result's crops, drawn evenly, on the host."""
    crops = tile["crops"]
    if not len(crops):
        return np.empty((0, 1, 1, 3), dtype=np.uint8)
    pick = np.unique(np.linspace(0, len(crops) - 1, STAIN_CROPS_PER_TILE).astype(int))
    crops = crops[pick]
    return crops.cpu().numpy() if hasattr(crops, "cpu") else np.asarray(crops)


def refuse_finished_since(slide, out_dir: Path) -> None:
    """Under the folder's lock: a run that found no finished results before it began
    (:data:`cyto.outputs_check.FRESH_ONLY`) refuses the folder another run has finished since,
    in the words of the check it passed: two `cyto score` into one --out 3 s apart replaced the
    first's results without --overwrite (the check ran before the lock was taken)."""
    from cyto.errors import OutputTakenError
    from cyto.flags import passing
    from cyto.outputs_check import FRESH_ONLY, UNFINISHED_AT_START, FinishedMeanwhile
    from cyto.seal import SUMMARY

    finished = (out_dir / SUMMARY).is_file() and (out_dir / "scores.parquet").is_file()
    if finished and UNFINISHED_AT_START.get():  # a resumed run: reused, not scored again
        raise FinishedMeanwhile(str(out_dir))
    if FRESH_ONLY.get() and finished:
        raise OutputTakenError(
            f"{passing('out', out_dir)} (the finished results of {Path(str(slide)).name}) was "
            "finished by another run after this one began; pass "
            f"{passing('overwrite')} to replace it, or {passing('resume')} to keep it"
        )


def _check_stain(stained: list[np.ndarray], plan, scorer, opts, echo) -> dict | None:
    """With the scale check: say when the first tiles' cells look stained otherwise than the
    model's training cells (:mod:`cyto.detect.stain`), or that their stain could not be
    estimated. None when the bundle records no training stain."""
    from cyto.detect.stain import StainEstimate, estimate_images, stain_check, stain_words

    model = StainEstimate.from_record(scorer.spec.stain_vectors)
    crops = [c for c in stained if len(c)]
    if model is None or not crops:
        return None
    check = stain_check(model, estimate_images(crops), sum(len(c) for c in crops))
    words = stain_words(
        check, f"the cells of {plan.slide.name}", detection_cause(scorer, opts), scorer.spec.stain
    )
    if words is not None:
        echo(WarningLine(f"warning: {words}", StainWarning))
    return check
