"""``cyto data cells``: training cells from scored slides, as the paper collects them.

The paper's one-class models learn from the cells of slide-negative specimens. A model trained on
cells from another source (other patches, another lab) sees the slide's crowding, background and
crop as something to flag, and refining it with reviewed slide cells then mixes two kinds of
images: ``benchmarks/review/refine_loop.py --train-cells slides`` measures the difference. This
module cuts the cells that ``cyto score`` found on slides known to be negative, at the area the
model saw (``crop_px_level0`` of the score summary), into a class folder that ``cyto train``
reads, with a manifest (``cells-LABEL.csv``: path, label, slide, cell id, centre) saying where
each came from.

The folder is written under a temporary name and renamed when complete, so an interrupted run
never leaves a class folder that looks finished; one run at a time writes into an output folder
(a second is refused), and it clears what a killed run left.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np

from cyto.bundle import clear_temp_dirs_beside, temp_dir_beside
from cyto.errors import ConfigError
from cyto.flags import check_seed
from cyto.locks import OutputLock
from cyto.outputs_check import refuse_input_as_output, refuse_to_replace
from cyto.progress import progress
from cyto.review.session import crop_cells, find_scored, read_source
from cyto.stats.calibrate import refuse_planted, refuse_repeated_slides, warn_unsatisfactory


def harvest_cells(
    scored: list[Path],
    out: Path,
    label: str = "normal",
    per_slide: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    echo=print,
    options: dict | None = None,
) -> dict:
    """Cut the detected cells of each scored slide into ``out/label/``; returns the counts.

    ``per_slide``: at most this many cells per slide, drawn at random with ``seed`` (default all).
    A slide scored with ground truth that holds planted abnormal cells, or one its own
    calibrated scoring triaged ``excess``, is refused: its cells are not all normal.
    ``options``: the storage options of slides scored from URLs (``--storage-option``)."""
    if not label or any(c in label for c in "/\\") or label.startswith("."):
        raise ConfigError(f"--label must be a plain folder name, got {label!r}")
    if per_slide is not None and per_slide < 1:
        raise ConfigError(f"--per-slide must be >= 1, got {per_slide}")
    seed = check_seed(seed)
    sources = [read_source(f, options) for f in find_scored(scored)]
    refuse_repeated_slides([(s.identity, s.folder) for s in sources])  # its cells twice
    # an output there already refused before the slides' warnings (a second run said each
    # slide's adequacy at length, then that it exists: hostile round 75, 6); again under the
    # lock, where it holds
    out = Path(out)
    _refuse_target(sources, out, label, overwrite)
    for s in sources:
        refuse_planted(
            s.folder,
            s.planted,
            f"harvest {label} cells",
            s.burden,
            slide_path=s.slide,
            options=s.options,
        )
        warn_unsatisfactory(s.folder, s.adequacy, f"harvest {label} cells")
    with OutputLock(out, "cyto data cells"):
        # what a killed run (SIGKILL, power loss) left half cut: every writer holds the lock
        clear_temp_dirs_beside(out / label)
        return _harvest(sources, out, label, per_slide, seed, overwrite, echo)


def own_cells(out: Path, label: str) -> list[str]:
    """The crops an earlier run wrote in ``out/label`` (``003_SLIDE_CELLID.png``), as its
    manifest ``cells-LABEL.csv`` lists them: what ``--overwrite`` may replace. A name alone
    says nothing (a user's own ``001_mycell.png`` was deleted by its pattern)."""
    target = (Path(out) / label).resolve()
    try:
        with open(Path(out) / f"cells-{label}.csv", newline="") as fh:
            paths = [row.get("path") or "" for row in csv.DictReader(fh)]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return [Path(p).name for p in paths if p and Path(p).parent == target]


def _refuse_target(sources, out: Path, label: str, overwrite: bool) -> None:
    """``out/label`` refused as the folder written: a scored folder read is never it (it was
    called files "cyto did not write"), and what is there is replaced only with ``overwrite``,
    only where cyto wrote it."""
    target = out / label
    for s in sources:
        refuse_input_as_output(target, str(target), {"SCORED": s.folder})
    refuse_to_replace(target, overwrite, name=str(target), known=own_cells(out, label))


def _harvest(sources, out: Path, label: str, per_slide, seed: int, overwrite: bool, echo) -> dict:
    import pyarrow.parquet as pq

    target = out / label
    _refuse_target(sources, out, label, overwrite)
    rng = np.random.default_rng(seed)
    plan = []  # (source, file-name prefix, the cells' ids, x, y)
    for k, s in enumerate(sources):
        t = pq.read_table(s.folder / "scores.parquet", columns=["cell_id", "x", "y"]).to_pydict()
        idx = np.arange(len(t["cell_id"]))
        if per_slide is not None and len(idx) > per_slide:
            idx = np.sort(rng.choice(idx, per_slide, replace=False))
        prefix = f"{k:03d}_{Path(s.slide).stem}"  # two slides may share a name
        plan.append((s, prefix, *([t[c][i] for i in idx] for c in ("cell_id", "x", "y"))))
    total = sum(len(p[2]) for p in plan)
    if not total:
        raise ConfigError("the scored slides hold no detected cell")
    tmp = temp_dir_beside(target)
    manifest, partial = out / f"cells-{label}.csv", out / f".cells-{label}.csv.partial"
    rows = []
    try:
        with progress("cells", total=total, unit="cells") as bar:
            for s, prefix, ids, xs, ys in plan:
                names = [f"{prefix}_{cid}.png" for cid in ids]
                centres = list(zip(xs, ys, strict=True))
                paths = [tmp / n for n in names]
                crop_cells(s.slide, centres, s.crop_px, paths, bar.advance, s.identity, s.options)
                rows += [
                    (str((target / n).resolve()), label, s.slide, cid, x, y, s.identity)
                    for n, cid, (x, y) in zip(names, ids, centres, strict=True)
                ]
                echo(f"{Path(s.slide).name}: {len(ids)} cells ({s.crop_px} px)")
        with open(partial, "w", newline="") as fh:
            w = csv.writer(fh)
            # slide_identity: cyto train records the slides its cells came from, so that
            # cyto calibrate refuses a model's own training slides
            w.writerow(["path", "label", "slide", "cell_id", "x", "y", "slide_identity"])
            w.writerows(rows)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
        partial.replace(manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        partial.unlink(missing_ok=True)
        raise
    return {
        "cells": len(rows),
        "slides": len(plan),
        "folder": str(target),
        "manifest": str(manifest),
        "mpp": sorted({s.mpp for s, *_ in plan}, key=lambda m: (m is None, m or 0.0)),
    }


def mpp_words(mpps: list) -> str:
    """What a folder of cells cut from slides at level 0 says of its pixel size (the slides'
    resolutions, ``harvest_cells``'s ``mpp``), and how to train on it: a model trained on them
    was told "no training resolution given" while the tool had read it (hostile round 25)."""
    known = [m for m in mpps if m is not None]
    if len(mpps) == 1 and known:
        return (
            f"the crops are at {known[0]:.4g} um/px, their slides' resolution: train on them "
            f"with --set mpp={known[0]:.4g}"
        )
    if not known:
        return (
            "the slides record no resolution, so neither do the crops: train on them with "
            "--set mpp=UM_PER_PX, the slides' true pixel size"
        )
    shown = ", ".join("unknown" if m is None else f"{m:.4g}" for m in mpps)
    return (
        f"the slides are at several resolutions ({shown} um/px), and so are the crops, each at "
        "its slide's: harvest the slides of one resolution into a folder and train on each"
    )
