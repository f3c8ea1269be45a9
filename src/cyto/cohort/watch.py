"""Scoring slides as the scanner writes them (``cyto score FOLDER --watch``).

The model is loaded and verified once; the folders are then listed every ``poll`` seconds. A
slide is scored once it has stayed unchanged (the sizes and times of change of its files) for
``settle`` seconds, so a file the scanner is still writing is never read half-written. Each
slide goes to ``OUT/NAME`` as in a plain run (a name taken by another slide's results gets a
folder of its own) and ``OUT/cohort.csv`` gains its row. Slides scored before, by this watch or
an earlier run with the same model and settings, are kept, not scored again (``--resume``); a
slide that fails is reported and tried again only once its files change (one whose output
could not be written, a full disk, after five minutes too); a slide another run
is scoring (two watches of one folder) is left to it and looked at again later, when it is
found scored (or free, if that run stopped). Ctrl-C stops the watch;
a slide being scored then keeps its finished chunks for the next run.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cyto.cohort.local import (
    REUSED,
    SkippedLine,
    check_inputs,
    once_per_cohort,
    open_model,
    refuse_slide_folder,
    score_one,
    slide_folders,
    twins_said,
    unforeseen,
)
from cyto.cohort.run import slide_line
from cyto.cohort.table import cohort_row, failure_words, say_models, write_cohort_table
from cyto.errors import ConfigError, CytoError, InputPathError, OutputBusyError, OutputWriteError
from cyto.infer import ScoreOptions
from cyto.infer.finish import Metrics
from cyto.locks import OutputLock
from cyto.slides import slide_files
from cyto.slides.dicom import dicom_files

Stamp = tuple[int, int, int]


def stamp(slide: Path) -> Stamp | None:
    """(files, bytes, latest time of change in ns) of a slide: its file, a DICOM slide's
    instances, or a MIRAX file with its data folder; None when it cannot be read now."""
    try:
        files = dicom_files(slide) if slide.is_dir() else [slide]
        data = slide.with_suffix("")
        if slide.suffix.lower() == ".mrxs" and data.is_dir():
            files += [f for f in data.iterdir() if f.is_file()]
        stats = [f.stat() for f in files]
    except OSError:
        return None
    if not stats:
        return None
    return len(stats), sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats)


def _listed(folders: list[Path], warned: set[str], echo) -> list[Path]:
    """The slides in ``folders`` now; a folder without one yet is not an error here, and a
    folder that cannot be used (two DICOM series in it) is said once; one gone (unmounted,
    moved) is said once, and again when it is back (the watch looked healthy and scored
    nothing: hostile round 76, 4)."""
    found: list[Path] = []
    for folder in folders:
        gone = f"gone:{folder}"
        if not folder.is_dir():
            if gone not in warned:
                warned.add(gone)
                echo(f"watch: {folder} is gone (unmounted or moved?): looked for every poll")
            continue
        if gone in warned:
            warned.discard(gone)
            echo(f"watch: {folder} is back")
        try:
            found += slide_files([folder])
        except InputPathError as exc:
            if "without a slide in it" not in str(exc) and str(exc) not in warned:
                warned.add(str(exc))
                echo(f"watch: {exc}")
    return found


#: the longest --poll (seconds)
DAY = 86_400.0
#: seconds after which a slide whose output could not be written (a full disk) is tried again
RETRY_WRITE_S = 300.0


def watch_cohort(
    folders: list[Path],
    model: Path,
    out: Path,
    opts: ScoreOptions,
    echo: Callable[[str], None] = print,
    metrics: Metrics | None = None,
    poll: float = 10.0,
    settle: float = 30.0,
    stop: threading.Event | None = None,
    on_slide: Callable[[dict], None] | None = None,
) -> tuple[list[dict], list[tuple[Path, CytoError]]]:
    """Score the slides of ``folders`` as they appear, until Ctrl-C (or ``stop`` is set).
    Returns (summaries, failures as (slide, error)) of this watch, a failure being a slide
    whose last try failed (one scored once its files were whole is not); ``on_slide`` is called
    with each slide's summary as it finishes."""
    folders = [Path(f) for f in folders]
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"--watch takes folders to watch; {folder} is not a folder")
    # finite: inf overflowed the clock (a traceback), nan spun at 100 % CPU or let every slide
    # through unsettled (hostile round 41, 8-9)
    # and a poll within a day (1e10 s overflowed the clock too: hostile round 42, 4)
    if not (math.isfinite(poll) and 0 < poll <= DAY) or not (math.isfinite(settle) and settle >= 0):
        raise ConfigError(
            f"--poll must be seconds > 0 (a day at most) and --settle seconds >= 0, got "
            f"{poll:g} and {settle:g}"
        )
    check_inputs(out, opts, model)
    refuse_slide_folder(out)
    Path(out).mkdir(parents=True, exist_ok=True)
    opts = ScoreOptions(**{**opts.__dict__, "resume": True})  # keep what is already scored
    scorer = open_model(model, opts, echo)
    echo(
        f"watching {', '.join(map(str, folders))} every {poll:g} s: a slide is scored once its "
        f"files have not changed for {settle:g} s; Ctrl-C stops"
    )
    stop = stop or threading.Event()
    seen: dict[Path, tuple[Stamp, float]] = {}  # slide -> (its stamp, when first seen so)
    handled: dict[Path, Stamp] = {}  # slide -> the stamp it was scored (or failed) at
    # slide -> when its output, not the slide, failed (a full disk): tried again after
    # RETRY_WRITE_S whatever its files do (it stayed failed until a restart: round 76, 1)
    write_failed: dict[Path, float] = {}
    done: list[dict] = []
    # slide -> its last outcome: "scored" (by this watch), "kept" (already scored) or the
    # error of its last try; a slide that failed and was scored once whole counts as scored
    outcome: dict[Path, str | CytoError] = {}
    warned: set[str] = set()
    busy: set[Path] = set()  # slides another run was scoring when last looked at
    once = once_per_cohort(echo)
    twins = twins_said(echo)

    def said(message: str) -> None:  # every new slide is a fresh start: not news in a watch
        if not message.startswith("resume: no unfinished run here"):
            once(message)

    try:
        while not stop.is_set():
            now = time.monotonic()
            for slide in _listed(folders, warned, echo):
                st = stamp(slide)
                if slide in write_failed and now - write_failed[slide] >= RETRY_WRITE_S:
                    del write_failed[slide]
                    handled.pop(slide, None)  # its output may be written now
                if st is None or handled.get(slide) == st:
                    continue
                if seen.get(slide, (None, 0.0))[0] != st:
                    seen[slide] = (st, now)
                if now - seen[slide][1] < settle:
                    continue  # still being written, or not for long enough unchanged
                handled[slide] = st
                ((real, target),) = slide_folders([slide], out, echo)  # its real path
                if slide in busy and OutputLock(target).busy() is None:
                    # that run let it go (stopped, or finished it): this watch takes it up, and
                    # says so (the slide was scored here unannounced: hostile round 42, 3)
                    busy.discard(slide)
                # (a slide another run holds: said once, not each poll)
                header = [] if slide in busy else [f"slide {real}"]

                def header_out(header: list[str] = header) -> None:
                    """The slide's header, once, before anything is said of it: a slide kept
                    as it was is said by its report line alone."""
                    while header:
                        echo(header.pop())

                def said_of_it(message: str, header_out=header_out) -> None:
                    if not isinstance(message, SkippedLine):
                        header_out()
                        said(message)

                try:
                    summary = score_one(real, target, scorer, opts, said_of_it, metrics)
                except OutputBusyError as exc:  # another run (another watch) is scoring it
                    del handled[slide]  # looked at again: then it is found scored, or free
                    if slide not in busy:
                        busy.add(slide)
                        header_out()
                        echo(f"{slide.name}: left to the run that holds {target} ({exc})")
                    continue
                except Exception as exc:  # whatever one slide does, the watch goes on
                    if not os.path.lexists(real):  # removed while scored: no failure of its
                        # own (it was "undecodable image data", a failed row and exit 1:
                        # hostile round 41, 14); scored again if it comes back
                        handled.pop(slide, None)
                        seen.pop(slide, None)
                        header_out()
                        echo(f"{real} was removed while it was scored: not counted")
                        continue
                    if not isinstance(exc, CytoError):
                        exc = unforeseen(real, exc)
                    outcome[real] = exc
                    row = cohort_row(real, target, None, str(exc))
                    again = ""
                    if isinstance(exc, OutputWriteError):  # not the slide's fault: tried again
                        write_failed[slide] = now
                        again = f" (this watch tries it again in {RETRY_WRITE_S:g} s)"
                    header_out()
                    echo(f"failed: {failure_words(real, exc)}{again}")
                else:
                    done.append(summary)
                    # kept from a run before: a slide this watch scored stays scored
                    kept = summary.get(REUSED) and outcome.get(real) != "scored"
                    outcome[real] = "kept" if kept else "scored"
                    row = cohort_row(real, target, summary)
                    if not summary.get(REUSED):
                        header_out()
                    echo(slide_line(summary, out))
                    twins(real, summary)
                    if on_slide is not None:
                        on_slide(summary)
                write_cohort_table([row], Path(out) / "cohort.csv")
                say_models(Path(out) / "cohort.csv")  # when the mix changes
            stop.wait(poll)
    except KeyboardInterrupt:
        echo(f"stopped watching: {_tally(outcome)}")
    failed = [(slide, exc) for slide, exc in outcome.items() if isinstance(exc, CytoError)]
    return done, failed


def _tally(outcome: dict[Path, str | CytoError]) -> str:
    """What a watch did, by each slide's last outcome: '1 slide(s) scored, 1 already scored,
    0 failed' (a slide kept from an earlier run is not one this watch scored, and one that
    failed half-written and was scored once whole did not fail)."""
    scored = sum(o == "scored" for o in outcome.values())
    kept = sum(o == "kept" for o in outcome.values())
    failed = sum(isinstance(o, CytoError) for o in outcome.values())
    also = f", {kept} already scored" if kept else ""
    return f"{scored} slide(s) scored{also}, {failed} failed"
