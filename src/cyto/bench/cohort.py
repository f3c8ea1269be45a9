"""``cyto bench cohort``: a cohort of slides scored by one process, then on a Ray cluster.

Both runs score the same slides with the same options into separate folders; the rows give
slides, cells, wall seconds, cells/s and slides/h of each, the Ray run's speed-up over the plain
one, the time to join the cluster and start the engines (counted in the Ray run's wall time),
and whether every score table of the Ray run equals the plain run's.
"""

from __future__ import annotations

import time
from pathlib import Path

from cyto.bench.results import markdown_table
from cyto.errors import CytoError


def _row(mode: str, done: list[dict], failed: list, seconds: float, **extra) -> dict:
    cells = sum(int(s["cells_scored"]) for s in done)
    return {
        "mode": mode,
        "slides": len(done),
        "failed": len(failed),
        "cells": cells,
        "seconds": round(seconds, 2),
        "cells_per_s": round(cells / seconds, 1),
        "slides_per_h": round(3600 * len(done) / seconds, 1),
        **extra,
    }


def _nodes(table: Path) -> set[str]:
    """The Ray nodes that scored the cohort (cohort.csv's node column)."""
    import csv

    with open(table, newline="") as fh:
        return {n for row in csv.DictReader(fh) for n in row["node"].split()}


def _same_tables(a: Path, b: Path, done: list[dict]) -> bool:
    import pyarrow.parquet as pq

    for s in done:
        name = Path(s["slide"]).stem
        if not pq.read_table(a / name / "scores.parquet").equals(
            pq.read_table(b / name / "scores.parquet")
        ):
            return False
    return True


def bench_cohort(
    slides: list[Path],
    model: Path,
    work: Path,
    opts,
    address: str,
    split_tiles: int | None,
    echo=print,
) -> list[dict]:
    """[plain row, Ray row] (see the module docstring)."""
    from cyto.cohort import score_cohort
    from cyto.cohort.ray import import_ray, score_cohort_ray

    quiet = lambda _m: None  # noqa: E731 - the runs' own notes would drown the table
    echo(f"plain run: {len(slides)} slides in one process")
    t0 = time.perf_counter()
    done, failed = score_cohort(slides, model, work / "plain", opts, echo=quiet)
    plain = _row("one process", done, failed, time.perf_counter() - t0, actors=1)
    if not done:
        raise CytoError("no slide of the cohort could be scored; nothing to compare")
    echo(f"  {plain['cells_per_s']} cells/s; now on Ray ({address})")
    t0 = time.perf_counter()
    said: list[str] = []
    ready: list[float] = []  # when the engines were up: the cost of joining and starting

    def note(message: str) -> None:
        said.append(message)
        if "engine actor(s)" in message:
            ready.append(time.perf_counter() - t0)

    done_r, failed_r = score_cohort_ray(
        slides, model, work / "ray", opts, address, note, split_tiles=split_tiles
    )
    seconds = time.perf_counter() - t0
    started = [m for m in said if "engine actor(s)" in m]
    nodes = _nodes(work / "ray" / "cohort.csv")
    import_ray().shutdown()
    on_ray = _row(
        f"Ray ({address})",
        done_r,
        failed_r,
        seconds,
        actors=int(started[0].split()[0]) if started else None,
        nodes=len(nodes) or None,
        identical_tables=_same_tables(work / "plain", work / "ray", done),
        speedup=round(plain["seconds"] / seconds, 2),
        startup_s=round(ready[0], 2) if ready else None,
    )
    echo(f"  {on_ray['cells_per_s']} cells/s, speed-up {on_ray['speedup']}x")
    return [plain, on_ray]


def cohort_markdown(rows: list[dict]) -> list[str]:
    return markdown_table(
        rows,
        [
            ("mode", "run"),
            ("actors", "engines"),
            ("nodes", "nodes"),
            ("slides", "slides"),
            ("failed", "failed"),
            ("cells", "cells"),
            ("seconds", "wall s"),
            ("startup_s", "of which start-up s"),
            ("cells_per_s", "cells/s"),
            ("slides_per_h", "slides/h"),
            ("speedup", "speed-up"),
            ("identical_tables", "tables equal the plain run's"),
        ],
    )
