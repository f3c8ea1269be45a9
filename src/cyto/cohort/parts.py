"""A large slide scored as ranges of its tiles by several workers at once, then merged.

A part scores tiles ``start .. stop - 1`` of the slide's tile list (the list a single run walks,
in the same order) into ``OUT/SLIDE/.parts/tiles-START-STOP/``: its own lock and its own
resumable chunk store, keyed by model, slide identity, options and range; ``done.json`` marks
it finished. :func:`merge_parts` reads the parts in tile order, numbers the cells ``0..n-1`` in
that order (as a single run does) and writes the slide's outputs, so the score table is the
table of a single run. A part whose worker dies is resumed from its finished chunks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from cyto.errors import CytoError
from cyto.infer.finish import finish_slide
from cyto.infer.options import ScoreOptions
from cyto.infer.pipeline import refuse_finished_since, score_tiles, write_error
from cyto.infer.plan import SlidePlan, TileRun
from cyto.infer.store import ChunkStore
from cyto.locks import OutputLock
from cyto.runtime import Scorer
from cyto.slides import open_slide, open_with_planes
from cyto.tables import json_text

PARTS = ".parts"
DONE = "done.json"


def tile_ranges(n_tiles: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges of at most ``size`` tiles covering ``n_tiles`` tiles."""
    if size < 1:
        raise ValueError(f"a part holds at least one tile, got {size}")
    return [(a, min(a + size, n_tiles)) for a in range(0, n_tiles, size)]


@contextmanager
def _planned(slide: Path, scorer: Scorer, opts: ScoreOptions, echo):
    reader, planes = open_with_planes(slide, opts.planes)
    try:
        yield SlidePlan(slide, reader, planes, scorer, opts, echo)
    finally:
        reader.close()


def tiles_beyond(slide: Path, scorer: Scorer, opts: ScoreOptions, limit: int) -> int | None:
    """How many tiles a run over ``slide`` visits (those with tissue, or with given nuclei) when
    that is more than ``limit``, else None. A slide whose whole grid of tiles is within the
    limit is not planned at all (no tissue mask computed only to be computed again)."""
    reader = open_slide(Path(slide))
    try:
        info = reader.info
        grid = -(-info.width // opts.tile) * -(-info.height // opts.tile)
    finally:
        reader.close()
    if grid <= limit:
        return None
    with _planned(Path(slide), scorer, opts, lambda _m: None) as plan:
        return len(plan.jobs) if len(plan.jobs) > limit else None


def _part_dir(out_dir: Path, start: int, stop: int) -> Path:
    return Path(out_dir) / PARTS / f"tiles-{start:07d}-{stop:07d}"


def _key(plan: SlidePlan, scorer: Scorer, opts: ScoreOptions, start: int, stop: int) -> dict:
    return {**plan.store_key(scorer, opts, stop - start), "range": [start, stop]}


def _finished(folder: Path, key: dict) -> TileRun | None:
    try:
        done = json.loads((folder / DONE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return TileRun.from_json(done["run"]) if done.get("key") == key else None


def score_part(
    slide: Path, scorer: Scorer, out_dir: Path, opts: ScoreOptions, start: int, stop: int, echo
) -> TileRun:
    """Score tiles ``start .. stop - 1`` of ``slide`` into their part folder of ``out_dir``;
    with ``opts.resume`` a finished part is kept and an interrupted one continued. Returns
    what the run did (its timings, cells resumed, crowding)."""
    slide, out_dir = Path(slide), Path(out_dir)
    folder = _part_dir(out_dir, start, stop)
    try:
        with _planned(slide, scorer, opts, echo) as plan:
            if not 0 <= start < stop <= len(plan.jobs):
                raise CytoError(
                    f"{slide}: tiles {start}..{stop - 1} are outside its {len(plan.jobs)} tiles"
                )
            key = _key(plan, scorer, opts, start, stop)
            with OutputLock(folder):
                run = _finished(folder, key) if opts.resume else None
                if run is None:
                    (folder / DONE).unlink(missing_ok=True)
                    store = ChunkStore(folder, key)
                    run = score_tiles(plan, plan.jobs[start:stop], store, scorer, opts, echo)
                    tmp = folder / f".{DONE}.tmp"
                    tmp.write_text(json_text({"key": key, "run": run.as_json()}))
                    os.replace(tmp, folder / DONE)
    except OSError as exc:
        raise write_error(slide, out_dir, exc) from exc
    return run


def merge_parts(
    slide: Path,
    scorer: Scorer,
    out_dir: Path,
    opts: ScoreOptions,
    ranges: list[tuple[int, int]],
    echo,
    metrics=None,
    started: float | None = None,
) -> dict:
    """Write the outputs of a slide whose ``ranges`` (covering its tile list, in order) are all
    finished parts; returns the summary. ``started``: when scoring began (``time.time()``), for
    the slide's wall time."""
    import pyarrow as pa

    slide, out_dir = Path(slide), Path(out_dir)
    t_start = time.perf_counter() - (time.time() - started if started else 0.0)
    try:
        with _planned(slide, scorer, opts, echo) as plan, OutputLock(out_dir):
            refuse_finished_since(slide, out_dir)  # by another run, since this one began
            expect = 0
            tables, runs = [], []
            for start, stop in ranges:
                if start != expect:
                    raise CytoError(f"{slide}: the parts leave a gap at tile {expect}")
                expect = stop
                folder = _part_dir(out_dir, start, stop)
                key = _key(plan, scorer, opts, start, stop)
                run = _finished(folder, key)
                if run is None:
                    raise CytoError(
                        f"{slide}: the part with tiles {start}..{stop - 1} is not finished "
                        f"({folder}); score the slide again with --resume"
                    )
                runs.append(run)
                tables.append(ChunkStore(folder, key).read_all())
            if expect != len(plan.jobs):
                raise CytoError(f"{slide}: the parts end at tile {expect} of {len(plan.jobs)}")
            plan.identity = key["slide"][str(slide)]
            table = pa.concat_tables(tables)
            ids = pa.array(np.arange(table.num_rows, dtype=np.int64))
            table = table.set_column(table.schema.get_field_index("cell_id"), "cell_id", ids)
            runs[0].timings["mask"] += plan.mask_s
            summary = finish_slide(table, plan, runs, out_dir, scorer, opts, echo, metrics, t_start)
            shutil.rmtree(out_dir / PARTS, ignore_errors=True)
    except OSError as exc:
        raise write_error(slide, out_dir, exc) from exc
    return summary
