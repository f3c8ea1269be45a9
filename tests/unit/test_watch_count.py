"""The line ``cyto score FOLDER --watch`` ends with counts what the watch did, by each slide's
last outcome (hostile round 7, H31: "2 slide(s) scored, 1 failed" after it scored one, kept one
scored before, and scored the one that failed once its file was whole)."""

from __future__ import annotations

from pathlib import Path

from cyto.cohort import watch
from cyto.cohort.local import REUSED
from cyto.errors import ConfigError, UnsupportedSlideError
from cyto.infer import ScoreOptions


class _Polls:
    """A stop event whose wait is Ctrl-C after ``n`` polls."""

    def __init__(self, n: int) -> None:
        self.left = n

    def is_set(self) -> bool:
        return False

    def wait(self, _seconds: float) -> None:
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt


def _watch(monkeypatch, tmp_path, folder, score_one, polls: int):
    """``watch_cohort`` over ``folder`` with ``score_one`` standing in for the scoring, until
    Ctrl-C after ``polls`` polls: (summaries, failures, what it said, cohort rows written)."""
    monkeypatch.setattr(watch, "open_model", lambda model, opts, echo: object())
    monkeypatch.setattr(watch, "score_one", score_one)
    rows: list[dict] = []
    monkeypatch.setattr(watch, "write_cohort_table", lambda new, _path: rows.extend(new))
    said: list[str] = []
    done, failed = watch.watch_cohort(
        [folder], tmp_path / "m.cyto", tmp_path / "ow", ScoreOptions(workers=0, mosaic=0),
        said.append, poll=0.01, settle=0.0, stop=_Polls(polls),
    )  # fmt: skip
    return done, failed, said, rows


def test_the_watch_ends_counting_scored_already_scored_and_failed(tmp_path, monkeypatch):
    folder = tmp_path / "wd"
    folder.mkdir()
    for name in ("half.tif", "new.tif", "old.tif"):
        (folder / name).write_bytes(b"II*\0" + b"\0" * 100)
    tries: dict[str, int] = {}

    def score_one(slide, target, scorer, opts, echo, metrics):
        slide = Path(slide)
        tries[slide.name] = tries.get(slide.name, 0) + 1
        if slide.name == "half.tif" and tries["half.tif"] == 1:
            with open(slide, "ab") as fh:  # the scanner finishes writing it
                fh.write(b"\0" * 100)
            raise UnsupportedSlideError(f"{slide}: damaged or truncated TIFF")
        summary = {"slide": str(slide), "cells_scored": 258, "seconds": 1.0, "cells_per_s": 258}
        if slide.name == "old.tif":  # scored by a run before this watch
            summary[REUSED] = "2026-12-01 10:00"
        return {**summary, "output": str(target)}

    done, failed, said, rows = _watch(monkeypatch, tmp_path, folder, score_one, 3)
    assert tries == {"half.tif": 2, "new.tif": 1, "old.tif": 1}, said
    assert said[-1] == "stopped watching: 2 slide(s) scored, 1 already scored, 0 failed"
    assert failed == [] and len(done) == 3
    # cohort.csv's rows: half.tif failed, then scored
    assert [(Path(r["slide"]).name, r["status"]) for r in rows] == [
        ("half.tif", "failed"),
        ("new.tif", "scored"),
        ("old.tif", "scored"),
        ("half.tif", "scored"),
    ]


def test_a_stopped_watch_exits_with_the_stops_code_mid_slide_and_after_a_failure(
    tmp_path, monkeypatch, exported_dsvdd
):
    """Hostile round 41 (1-2): stopped while a slide was scored, a watch exited 0 with no
    "stopped (SIGTERM)"; stopped after any slide of its life had failed, it exited 1, so a
    service manager read every `systemctl stop` as a crash. The stop's code, whatever happened
    on the way: Ctrl-C 130, SIGTERM 143, each after the watch's last line."""
    import pytest

    import cyto.interrupts as interrupts
    from tests.cli_runner import run_cyto

    folder = tmp_path / "wd"
    folder.mkdir()
    for name in ("a-bad.tif", "b-cut.tif"):
        (folder / name).write_bytes(b"II*\0" + b"\0" * 100)

    def score_one(slide, target, scorer, opts, echo, metrics):
        if Path(slide).name == "a-bad.tif":
            raise UnsupportedSlideError(f"{slide}: damaged or truncated TIFF")
        raise KeyboardInterrupt  # the stop, while this slide is scored

    model = exported_dsvdd  # read by the command's checks; the watch's scorer is stood in for
    monkeypatch.setattr(watch, "open_model", lambda model, opts, echo: object())
    monkeypatch.setattr(watch, "score_one", score_one)
    args = ["--model", str(model), "--out", str(tmp_path / "o"), "--watch", "--poll", "0.01"]
    for sigterm, code, last in ((False, 130, "interrupted"), (True, 143, "stopped (SIGTERM)")):
        monkeypatch.setattr(interrupts, "_terminated", sigterm)
        proc = run_cyto("score", str(folder), *args, "--settle", "0")
        said = proc.stdout + proc.stderr
        assert proc.returncode == code, said
        assert "stopped watching: 0 slide(s) scored, 1 failed" in proc.stdout, said
        assert proc.stderr.rstrip().endswith(last), said
    for poll, settle in (("inf", "0"), ("nan", "0"), ("1", "nan"), ("1", "inf"), ("1e10", "0")):
        with pytest.raises(ConfigError, match="--poll must be seconds > 0"):
            watch.watch_cohort([folder], model, tmp_path / "o", ScoreOptions(workers=0),
                               poll=float(poll), settle=float(settle))  # fmt: skip


def test_a_slide_another_run_holds_is_said_once_and_one_removed_is_no_failure(
    tmp_path, monkeypatch
):
    """Hostile round 41 (10, 14): a second watch said "slide X" at every poll while the other
    run held it (60 lines for a 10-minute slide); a slide deleted while it was scored was a
    failure ("the image data there cannot be decoded"), a failed row in cohort.csv and exit 1.
    Round 42 (3): once the other run let it go, this watch scored it without a "slide X" line."""
    from cyto.errors import OutputBusyError
    from cyto.locks import OutputLock

    folder = tmp_path / "wd"
    folder.mkdir()
    for name in ("held.tif", "gone.tif"):
        (folder / name).write_bytes(b"II*\0" + b"\0" * 100)
    tries: dict[str, int] = {}
    other_run = OutputLock(tmp_path / "ow" / "held").acquire()  # held by another run

    def score_one(slide, target, scorer, opts, echo, metrics):
        slide = Path(slide)
        tries[slide.name] = tries.get(slide.name, 0) + 1
        if slide.name == "held.tif" and tries["held.tif"] < 4:
            if tries["held.tif"] == 3:
                other_run.release()  # it stops: the next look finds the slide free
            raise OutputBusyError(f"{target} is being written by another cyto score")
        if slide.name == "gone.tif":
            slide.unlink()  # removed while it is scored
            raise UnsupportedSlideError(f"{slide}: the image data there cannot be decoded")
        summary = {"slide": str(slide), "cells_scored": 9, "seconds": 1.0, "cells_per_s": 9}
        return {**summary, "output": str(target)}

    done, failed, said, rows = _watch(monkeypatch, tmp_path, folder, score_one, 6)
    assert tries["held.tif"] == 4, said
    # said when first tried, and again when taken up once the other run let it go
    announced = [
        i for i, line in enumerate(said) if line.startswith("slide ") and "held.tif" in line
    ]
    left = [i for i, line in enumerate(said) if line.startswith("held.tif: left to the run")]
    assert len(announced) == 2 and len(left) == 1 and announced[0] < left[0] < announced[1], said
    assert any(line.endswith("gone.tif was removed while it was scored: not counted")
               for line in said), said  # fmt: skip
    assert failed == [] and said[-1].endswith(", 0 failed"), said
    assert [Path(r["slide"]).name for r in rows] == ["held.tif"], rows


def test_a_restart_says_each_slide_kept_as_it_was_in_one_line(tmp_path, monkeypatch):
    """A watch restarted over a folder already scored printed three lines a slide (its header,
    "already scored ... skipping" and its report: 128 lines for 40 slides, hostile round 76,
    10). A slide kept as it was is said by its report line alone; one scored has its header
    before what is said of it."""
    from cyto.cohort.local import SkippedLine

    folder = tmp_path / "wd"
    folder.mkdir()
    for name in ("new.tif", "old.tif", "old copy.tif"):
        (folder / name).write_bytes(b"II*\0" + b"\0" * 100)

    def score_one(slide, target, scorer, opts, echo, metrics):
        slide = Path(slide)
        summary = {"slide": str(slide), "cells_scored": 258, "seconds": 1.0, "cells_per_s": 258}
        summary["slide_identity"] = slide.stem.split()[0]  # a copy holds the same content
        if slide.name == "old.tif":  # as score_one says a slide reused as it was
            echo(
                SkippedLine(
                    f"{slide.name}: already scored (2026-12-01 10:00) in {target}; skipping"
                )
            )
            summary[REUSED] = "2026-12-01 10:00"
        else:  # as a scoring starts
            echo("resume: no unfinished run here; starting from the beginning")
            echo(f"warning: {slide.name}: a warning of its own")
        return {**summary, "output": str(target)}

    _, _, said, _ = _watch(monkeypatch, tmp_path, folder, score_one, 2)
    # a copy of a slide under another name is said (hostile round 76, 8)
    assert [line for line in said if "holds the same slide" in line] == [
        "note: old.tif holds the same slide as old copy.tif (the same content): both are "
        "scored, and each counts in cohort.csv; remove the copy if it is one"
    ], said
    said = [line for line in said if "holds the same slide" not in line and "copy" not in line]
    old = [line for line in said if "old.tif" in line]
    assert len(old) == 1 and old[0].startswith("old.tif: already scored (2026-12-01 10:00)"), said
    new = [line for line in said if "new.tif" in line]
    assert new[0] == f"slide {folder / 'new.tif'}" and "a warning of its own" in new[1], said
    assert len(new) == 3 and not any(line.startswith("resume:") for line in said), said
