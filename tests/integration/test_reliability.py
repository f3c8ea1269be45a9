"""Never a wrong table: one writer per output folder, output folders that cannot collide in a
cohort, a replaced slide is rescored, honest rates after a resume, no empty folders after a
failure, exit codes that follow the error."""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cyto.cohort import score_cohort
from cyto.cohort.run import slide_line
from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import OutputBusyError
from cyto.infer import ScoreOptions, score_slide
from cyto.infer.store import slide_identity
from cyto.locks import OutputLock
from cyto.runtime import load_scorer
from tests.cli_runner import run_cyto
from tests.integration.test_score import score_cli
from tests.killers import as_in_a_terminal
from tests.tables import same_table

OPTS = ScoreOptions(mosaic=0, workers=0, tile=512)


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    root = tmp_path_factory.mktemp("rel")
    (root / "a").mkdir()
    (root / "b").mkdir()
    a = write_slide(root / "a" / "s.tif", SlideSynthConfig(width=1024, height=768, seed=4))
    b = write_slide(root / "b" / "s.tif", SlideSynthConfig(width=768, height=1024, seed=5))
    return a, b


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 2048 x 3072 slide, scored in 96 tiles of 256 px: about 3.4 s of tiles on 2 CPU cores,
    long enough to interrupt mid-run (at 0.5 s) on a machine several times faster."""
    return write_slide(
        tmp_path_factory.mktemp("big") / "big.tif",
        SlideSynthConfig(width=2048, height=3072, seed=7),
    )


def _hold(folder: str, ready, stop) -> None:
    with OutputLock(folder):
        ready.set()
        stop.wait(60)


def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_taken_over(
    exported_dsvdd, slides, tmp_path
):
    out = tmp_path / "o" / "s"
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(out), ready, stop))
    holder.start()
    assert ready.wait(60)
    with pytest.raises(OutputBusyError, match=f"pid {holder.pid} on "):
        score_slide(slides[0].paths[0], exported_dsvdd, out, OPTS)
    assert not (out / "scores.parquet").exists()
    holder.kill()  # killed: its lock file stays, but the kernel dropped the lock
    holder.join()
    assert (out / ".lock").exists()
    summary = score_slide(slides[0].paths[0], exported_dsvdd, out, OPTS)
    assert summary["cells_scored"] > 0 and not (out / ".lock").exists()


def test_two_slides_scored_at_once_on_threads_each_get_their_own_cells(
    exported_dsvdd, slides, tmp_path
):
    """Hostile round 48, 1: two `cyto.score_slide` calls on threads of one process, tiles in
    the process (workers=0, a small slide's default), read their tiles through one
    process-wide context: each slide's folder got the other's cells, sealed as its own. Each
    thread scores its own slide, as one at a time does."""
    import threading

    alone = {}
    for name, s in zip("ab", slides, strict=True):
        score_slide(s.paths[0], exported_dsvdd, tmp_path / "alone" / name, OPTS)
        alone[name] = pq.read_table(tmp_path / "alone" / name / "scores.parquet")
    for attempt in range(3):  # the tiles of the two interleave differently each time
        out = tmp_path / f"threads{attempt}"
        errors: list[BaseException] = []

        def run(name, s, out=out, errors=errors):
            try:
                score_slide(s.paths[0], exported_dsvdd, out / name, OPTS, echo=lambda m: None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(n, s)) for n, s in zip("ab", slides, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        for name in "ab":
            table = pq.read_table(out / name / "scores.parquet")
            assert same_table(table, alone[name]), (attempt, name)


def test_a_busy_slide_is_refused_before_any_thread_or_worker_starts_for_it(
    exported_dsvdd, slides, tmp_path
):
    """Hostile round 47, 1: a cohort `cyto score` whose slide another run held said so, then
    aborted as it exited ("terminate called without an active exception", rc 134, on a busy
    machine): the refused slide's threshold thread and tile workers were started before the
    refusal and left running. A folder another run holds is refused before either starts."""
    import threading

    from cyto.infer import ScoreOptions
    from cyto.locks import OutputLock

    out = tmp_path / "o" / "s"
    before = set(threading.enumerate())
    with OutputLock(out), pytest.raises(OutputBusyError):
        score_slide(slides[0].paths[0], exported_dsvdd, out, ScoreOptions(mosaic=0, workers=1))
    started = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not started, started


def test_a_run_whose_every_slide_is_busy_is_refused_before_its_model_loads(
    exported_dsvdd, slides, tmp_path
):
    """Hostile round 25 (29): the second of two `cyto score` into one folder loaded the model
    and printed its engine lines and the UNVERIFIED warning before its refusal. A run whose
    every slide folder another run holds is refused first, in one line; a run with one free
    slide scores it and reports the busy one as failed, as before."""
    out = tmp_path / "o"
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(out / "s"), ready, stop))
    holder.start()
    try:
        assert ready.wait(60)
        proc = run_cyto("score", str(slides[0].paths[0]), "--model", str(exported_dsvdd),
                        "--out", str(out), "--mosaic", "0", "--workers", "0")  # fmt: skip
        assert proc.returncode == 3, proc.stderr
        said = proc.stdout + proc.stderr
        assert "model " not in proc.stdout and "UNVERIFIED" not in said, said
        (line,) = proc.stderr.strip().splitlines()
        assert f"being written by another cyto score (pid {holder.pid} on " in line, line
        # a cohort with a free slide goes on: the model loads, the free slide is scored
        other = tmp_path / "o2" / "t.tif"
        other.parent.mkdir()
        other.write_bytes(slides[1].paths[0].read_bytes())
        proc = run_cyto("score", str(slides[0].paths[0]), str(other), "--model",
                        str(exported_dsvdd), "--out", str(out), "--mosaic", "0", "--workers",
                        "0")  # fmt: skip
        assert proc.returncode == 3 and "being written by another" in proc.stdout + proc.stderr
        assert (out / "t" / "scores.parquet").is_file()
    finally:
        stop.set()
        holder.join(60)


def test_two_runs_on_one_folder_never_write_a_cell_twice(exported_dsvdd, slides, tmp_path):
    """Two `cyto score` at once on the same --out (a double-click): one is refused with exit
    code 3 (the folder busy), or with exit 2 when the other finished it while this one waited
    for the lock (it never replaces finished results without --overwrite: hostile round 9), or
    both finish one after the other; the table holds every cell once."""
    out = tmp_path / "twice"
    cmd = [
        sys.executable,
        "-m",
        "cyto",
        "score",
        str(slides[0].paths[0]),
        "--model",
        str(exported_dsvdd),
        "--out",
        str(out),
        "--mosaic",
        "0",
        "--workers",
        "0",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2], [0, 3]), results
    if codes == [0, 3]:
        assert any("being written by another cyto score" in err for _, err in results)
    if codes == [0, 2]:
        assert any("was finished by another run after this one began" in e for _, e in results)
    table = pq.read_table(out / "s" / "scores.parquet")
    ids = np.asarray(table["cell_id"])
    assert len(np.unique(ids)) == len(ids) == table.num_rows
    xy = set(zip(table["x"].to_pylist(), table["y"].to_pylist(), strict=True))
    assert len(xy) == table.num_rows
    summary = json.loads((out / "s" / "summary.json").read_text())
    assert summary["cells_scored"] == table.num_rows


def test_a_run_refused_a_folder_leaves_the_other_runs_row(exported_dsvdd, tmp_path):
    """Two runs on one --out: the one refused a slide's folder (another run holds it, or
    finished it since) wrote its "failed" row last, over the row of the run that scored it,
    and cohort.csv said failed beside a finished, sealed folder (hostile round 30, 6). The
    refused run's row yields: to the sealed folder's row, to the table's row while the other
    run is still at it; a slide no run has a row for is said failed."""
    import csv

    a, b = (
        write_slide(tmp_path / f"{n}.tif", SlideSynthConfig(width=768, height=768, seed=i)).paths[0]
        for i, n in enumerate("ab")
    )
    out = tmp_path / "out"

    def rows() -> dict[str, str]:
        with open(out / "cohort.csv", newline="") as fh:
            return {Path(r["slide"]).name: r["status"] for r in csv.DictReader(fh)}

    args = ("--model", str(exported_dsvdd), "--out", str(out), "--mosaic", "0")
    with OutputLock(out / a.stem, "cyto score"):  # another run holds a's folder
        proc = run_cyto("score", str(a), str(b), *args, "--workers", "0")
    assert proc.returncode == 3, proc.stderr
    assert rows() == {a.name: "failed", b.name: "scored"}  # nobody's row: said failed
    assert run_cyto("score", str(a), *args, "--resume").returncode == 0
    assert rows() == {a.name: "scored", b.name: "scored"}
    with OutputLock(out / a.stem, "cyto score"):  # scored, and held by another run again
        proc = run_cyto("score", str(a), str(b), *args, "--overwrite")
    assert proc.returncode == 3 and "being written by another cyto score" in proc.stderr
    assert rows() == {a.name: "scored", b.name: "scored"}
    # a folder finished since this run began: the sealed folder's row, drawn from its seal
    from cyto.cohort.table import cohort_row, write_cohort_table

    refused = cohort_row(a, out / a.stem, None, "finished by another run", another_run=True)
    write_cohort_table([refused], out / "cohort.csv")
    assert rows() == {a.name: "scored", b.name: "scored"}
    (out / "cohort.csv").unlink()
    write_cohort_table([refused], out / "cohort.csv")
    assert rows() == {a.name: "scored"}
    # a folder the other run is still at (no seal): the table's row of it stands
    theirs = cohort_row(tmp_path / "c.tif", out / "c", None, "their own failure")
    write_cohort_table([theirs], out / "cohort.csv")
    busy = cohort_row(tmp_path / "c.tif", out / "c", None, "busy", another_run=True)
    write_cohort_table([busy], out / "cohort.csv")
    with open(out / "cohort.csv", newline="") as fh:
        errors = {Path(r["slide"]).name: r["error"] for r in csv.DictReader(fh)}
    assert errors["c.tif"] == "their own failure"


def test_slides_with_the_same_name_get_their_own_folders(exported_dsvdd, slides, tmp_path):
    a, b = (s.paths[0] for s in slides)
    msgs = []
    done, failed = score_cohort([a, b, a], exported_dsvdd, tmp_path / "c", OPTS, msgs.append)
    assert not failed and len(done) == 2
    folders = sorted(p for p in (tmp_path / "c").iterdir() if p.is_dir())
    assert len(folders) == 2 and all(f.name.startswith("s-") for f in folders)
    # beside them the cohort table alone: its lock left no empty .cohort.csv.lock behind
    files = {p.name for p in (tmp_path / "c").iterdir() if not p.is_dir()}
    assert files == {"cohort.csv"}, files
    seen = {pq.read_schema(f / "scores.parquet").metadata[b"cyto.slide"].decode() for f in folders}
    assert seen == {str(a.resolve()), str(b.resolve())}
    assert {d["output"] for d in done} == {str(f) for f in folders}  # what the console names
    assert any("listed twice" in m for m in msgs) and any("also named s.tif" in m for m in msgs)
    # resuming the cohort finds each slide's own result
    msgs.clear()
    again = ScoreOptions(**{**OPTS.__dict__, "resume": True})
    done, _ = score_cohort([a, b], exported_dsvdd, tmp_path / "c", again, msgs.append)
    assert sum("already scored" in m for m in msgs) == 2
    assert {d["slide"] for d in done} == {str(a.resolve()), str(b.resolve())}
    # when it was scored, never the earlier run's time as if the slide had just run
    when = re.compile(r"already scored \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\)")
    assert sum(bool(when.search(m)) for m in msgs) == 2, msgs
    for d in done:
        line = slide_line(d, tmp_path / "c")
        assert when.search(line) and " s (" not in line and "cells/s" not in line, line


def test_a_replaced_slide_is_scored_again(exported_dsvdd, slides, tmp_path):
    slide = tmp_path / "x" / "s.tif"
    slide.parent.mkdir()
    shutil.copy(slides[0].paths[0], slide)
    first, _ = score_cohort([slide], exported_dsvdd, tmp_path / "o", OPTS, lambda m: None)
    shutil.copy(slides[1].paths[0], slide)  # another slide under the same path
    assert slide_identity(slide) != first[0]["slide_identity"]
    msgs = []
    resume = ScoreOptions(**{**OPTS.__dict__, "resume": True})
    done, _ = score_cohort([slide], exported_dsvdd, tmp_path / "o", resume, msgs.append)
    said = f"the slide file {slide.name}'s content"
    assert any(said in m and "scoring it again" in m for m in msgs), msgs
    assert done[0]["slide_identity"] == slide_identity(slides[1].paths[0])
    ref = score_slide(slides[1].paths[0], exported_dsvdd, tmp_path / "ref", OPTS)
    assert done[0]["cells_scored"] == ref["cells_scored"]


def _interrupted_at(call: int, slide, scorer, out, opts) -> None:
    """Score ``slide`` into ``out`` with a Ctrl-C at the scorer's ``call``-th batch."""
    real, calls = scorer.score, {"n": 0}

    def flaky(images, batch_size):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(images, batch_size)

    scorer.score = flaky
    try:
        with pytest.raises(KeyboardInterrupt):
            score_slide(slide, scorer, out, opts)
    finally:
        scorer.score = real


def test_rates_after_a_resume_count_this_run_only(exported_dsvdd, slides, tmp_path, monkeypatch):
    from cyto.runtime import load_scorer

    opts = ScoreOptions(mosaic=0, workers=0, tile=256, chunk_cells=8, batch_size=8)
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    _interrupted_at(4, slides[0].paths[0], scorer, tmp_path / "r", opts)
    s = score_slide(
        slides[0].paths[0],
        scorer,
        tmp_path / "r",
        ScoreOptions(**{**opts.__dict__, "resume": True}),
    )
    assert s["cells_resumed"] > 0 and s["cells_this_run"] > 0
    assert s["cells_resumed"] + s["cells_this_run"] == s["cells_scored"]
    # summary.json rounds seconds to 0.01 s and the rate to 0.1 cells/s: the rate must be this
    # run's cells over a duration within that rounding of the one reported
    lo = s["cells_this_run"] / (s["seconds"] + 0.005) - 0.05
    hi = s["cells_this_run"] / max(s["seconds"] - 0.005, 1e-9) + 0.05
    assert lo <= s["cells_per_s"] <= hi
    assert s["cells_per_s"] < s["cells_scored"] / (s["seconds"] + 0.005)


def test_a_failed_slide_leaves_no_folder_and_exits_with_its_code(exported_dsvdd, tmp_path):
    junk = tmp_path / "junk.svs"
    junk.write_bytes(b"not a slide at all, just text" * 10)
    proc = score_cli(tmp_path / "missing.ndpi", exported_dsvdd, tmp_path / "o")
    assert proc.returncode == 2 and "missing.ndpi: no such file" in proc.stderr
    assert proc.stderr.count("no such file") == 1  # printed once
    # said before the model is loaded and verified, and nothing is written
    assert "verification" not in proc.stdout + proc.stderr and not (tmp_path / "o").exists()
    # a missing slide among others is reported while the rest are scored
    proc = score_cli([tmp_path / "missing.ndpi", junk], exported_dsvdd, tmp_path / "o")
    assert proc.returncode == 2 and proc.stderr.count("does not exist") == 1, proc.stderr
    assert "not a whole-slide image" in proc.stderr and "verification" in proc.stdout
    proc = score_cli(junk, exported_dsvdd, tmp_path / "o")
    assert proc.returncode == 1 and "not a whole-slide image" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o" / "missing").exists() and not (tmp_path / "o" / "junk").exists()


def test_the_slide_identity_is_fast_and_content_based(tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:  # a sparse 4 GiB file: cheap on disk
        fh.seek(4 * 2**30 - 1)
        fh.write(b"\0")
    t0 = time.perf_counter()
    ident = slide_identity(big)
    assert time.perf_counter() - t0 < 5
    copy = tmp_path / "copy.bin"
    with open(copy, "wb") as fh:
        fh.seek(4 * 2**30 - 1)
        fh.write(b"\0")
    assert slide_identity(copy) == ident
    with open(copy, "r+b") as fh:  # one changed byte inside a sampled block
        fh.seek(2**20 + (4 * 2**30 - 2 * 2**20) // 32 * 5 + 100)
        fh.write(b"x")
    assert slide_identity(copy) != ident


@pytest.mark.parametrize("suffix", [".tif", ".ndpi"])
def test_truncated_slides_are_refused_at_any_offset(tmp_path, suffix):
    from cyto.errors import UnsupportedSlideError
    from cyto.slides import open_slide

    res = write_slide(tmp_path / f"s{suffix}", SlideSynthConfig(width=1024, height=1024, seed=1))
    data = res.paths[0].read_bytes()
    for frac in (0.05, 0.3, 0.6, 0.9, 0.99):
        cut = tmp_path / f"cut{suffix}"
        cut.write_bytes(data[: int(len(data) * frac)])
        with pytest.raises(UnsupportedSlideError, match="damaged or truncated|truncated"):
            open_slide(cut)


@pytest.mark.realdata
@pytest.mark.openslide
def test_a_truncated_svs_is_not_read_as_a_plain_tiff(wsi_dir, exported_dsvdd, tmp_path):
    svs = wsi_dir / "cmu1_small_region.svs"
    data = svs.read_bytes()
    cut = tmp_path / "cut.svs"
    cut.write_bytes(data[: int(len(data) * 0.9)])
    proc = score_cli(cut, exported_dsvdd, tmp_path / "o")
    assert proc.returncode == 1, proc.stdout
    assert "says it is an Aperio SVS, but OpenSlide cannot open it" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o" / "cut").exists()


def test_the_format_sniff_reads_a_few_bytes_not_the_file(tmp_path, monkeypatch):
    """A 4 GiB file must not be read whole to learn it is a TIFF (8: 4.7 GB peak before)."""
    from pathlib import Path

    from cyto.errors import UnsupportedSlideError
    from cyto.slides import open_slide

    big = tmp_path / "big.tif"
    with open(big, "wb") as fh:  # a TIFF header, 4 GiB sparse
        fh.write(b"II*\0" + (0xFFFFFF00).to_bytes(4, "little"))  # a directory of zeros
        fh.seek(4 * 2**30 - 1)
        fh.write(b"\0")

    def whole_file(self):  # pragma: no cover - the test fails if it is called
        raise AssertionError(f"{self} read whole")

    monkeypatch.setattr(Path, "read_bytes", whole_file)
    with pytest.raises(UnsupportedSlideError, match="damaged or truncated"):
        open_slide(big)


def test_a_full_disk_keeps_the_chunks_and_resume_finishes(
    exported_dsvdd, slides, tmp_path, monkeypatch
):
    """A disk that fills while the final table is written: one clear error that says the chunks
    are kept, and --resume then finishes with the uninterrupted table."""
    import errno

    import pyarrow.parquet as pq_mod

    opts = ScoreOptions(mosaic=0, workers=0, tile=256, chunk_cells=16)
    ref = score_slide(slides[0].paths[0], exported_dsvdd, tmp_path / "ref", opts)
    real = pq_mod.write_table

    def full(table, where, *a, **k):
        if "scores.parquet" in str(where):
            raise OSError(errno.ENOSPC, "No space left on device", str(where))
        return real(table, where, *a, **k)

    monkeypatch.setattr(pq_mod, "write_table", full)
    from cyto.errors import OutputWriteError

    with pytest.raises(
        OutputWriteError, match=r"the disk is full; \d+ finished chunk\(s\) are kept"
    ):
        score_slide(slides[0].paths[0], exported_dsvdd, tmp_path / "o" / "s", opts)
    monkeypatch.setattr(pq_mod, "write_table", real)
    s = score_slide(
        slides[0].paths[0],
        exported_dsvdd,
        tmp_path / "o" / "s",
        ScoreOptions(**{**opts.__dict__, "resume": True}),
    )
    assert s["cells_scored"] == ref["cells_scored"] and s["cells_this_run"] == 0
    a = pq.read_table(tmp_path / "o" / "s" / "scores.parquet").replace_schema_metadata(None)
    b = pq.read_table(tmp_path / "ref" / "scores.parquet").replace_schema_metadata(None)
    assert same_table(a, b)
    # a run that scored no tile itself judges the slide by the first tiles' checks, as the
    # uninterrupted run did (it judged the cells at the model's scale: no check had run)
    for field in ("detection_crowding", "cell_scale", "adequacy"):
        assert s[field] == ref[field], field


@pytest.mark.parametrize("failing", [0, 2])
@pytest.mark.parametrize("library", ["arrow", "python"])
@pytest.mark.parametrize("relative", [False, True])
def test_a_chunk_that_cannot_be_written_is_named_with_what_a_rerun_keeps(
    exported_dsvdd, slides, tmp_path, monkeypatch, failing, library, relative
):
    """Hostile round 35 (2): the folder of chunks turned unwritable mid-run was said as the
    slide's folder (Arrow's error names no file), and nothing was said of what a rerun keeps;
    round 36 (1): with an output folder given relative to the working folder, as the docs give
    it, Arrow quotes the chunk's path relative too."""
    import errno

    import pyarrow.parquet as pq_mod

    from cyto.errors import OutputWriteError

    real, written = pq_mod.write_table, []

    def refused(table, where, *a, **k):
        if ".partial" in str(where) and len(written) == failing:
            if library == "arrow":  # as pyarrow raises it: no filename, the path in the text
                raise PermissionError(
                    errno.EPERM, f"Failed to open local file '{where}'. Detail: [errno 1]"
                )
            raise PermissionError(errno.EACCES, "Permission denied", str(where))
        if ".partial" in str(where):
            written.append(where)
        return real(table, where, *a, **k)

    monkeypatch.setattr(pq_mod, "write_table", refused)
    opts = ScoreOptions(mosaic=0, workers=0, tile=256, chunk_cells=16)
    monkeypatch.chdir(tmp_path)
    out = Path("o") if relative else tmp_path / "o"
    with pytest.raises(OutputWriteError) as err:
        score_slide(slides[0].paths[0], exported_dsvdd, out, opts)
    line = str(err.value)
    assert f"cannot write {out / '.partial'}/chunk-" in line, line
    assert "no permission" in line and "\n" not in line
    if failing:
        assert f"; {failing} finished chunk(s) are kept in {out / '.partial'}" in line
    else:
        assert line.endswith("; no chunk was finished yet: a rerun starts it over"), line


def test_bad_output_folders_are_one_line(exported_dsvdd, slides, tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    proc = score_cli(slides[0].paths[0], exported_dsvdd, a_file)
    assert proc.returncode == 2 and "is a file; give a folder" in proc.stderr
    proc = score_cli(slides[0].paths[0], exported_dsvdd, a_file / "below")
    assert proc.returncode == 1 and "cannot write" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_to_the_process_group_prints_no_worker_traceback(
    exported_dsvdd, big, tmp_path, stop
):
    """Ctrl-C in a terminal, a service manager's SIGTERM (systemd stops a service so: every
    process of it at once), or the SIGHUP of a terminal or SSH session that closed, mid-slide
    with tile workers: no worker's traceback, the exit code a shell or service manager reads
    (130, 143, 129) and what is left to resume, in words. SIGHUP killed cyto where it stood,
    saying nothing and leaving what it held (hostile round 55, 2)."""
    import os
    import signal

    cmd = [
        sys.executable,
        "-m",
        "cyto",
        "score",
        str(big.paths[0]),
        "--model",
        str(exported_dsvdd),
        "--out",
        str(tmp_path / "o"),
        "--workers",
        "2",
        "--tile",
        "256",
        "--mosaic",
        "0",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=as_in_a_terminal,
    )
    deadline = time.time() + 120
    state = tmp_path / "o" / "big" / ".partial" / "state.json"
    while time.time() < deadline and not state.exists():  # the tile loop is starting
        time.sleep(0.1)
    time.sleep(0.5)
    os.killpg(proc.pid, getattr(signal, stop))  # what Ctrl-C in a terminal does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}[stop], err
    assert "Traceback" not in err, err
    assert err.rstrip().endswith({"SIGINT": "interrupted"}.get(stop, f"stopped ({stop})")), err
    # what is left to resume, in words: the finished chunks, or none yet
    assert "rerun with --resume" in out + err or "no chunk was finished yet" in out + err


def test_a_file_system_that_cannot_lock_still_scores_and_says_what_it_loses(
    exported_dsvdd, slides, tmp_path, monkeypatch
):
    """NFS without its lock daemon answers every flock with ENOLCK: the slide is scored and the
    cohort table written, unlocked, with a warning that a second run would not be refused
    (before, every slide failed on its lock file)."""
    import errno
    import fcntl

    def no_locks(fh, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    proc = score_cli(slides[0].paths[0], exported_dsvdd, tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert "this file system cannot lock files, so another cyto score" in proc.stderr
    assert (tmp_path / "o" / "cohort.csv").is_file()
    assert len(list((tmp_path / "o").glob("*/scores.parquet"))) == 1


def test_workers_ignore_ctrl_c_and_leave_it_to_the_main_process():
    """An idle worker that gets the terminal's SIGINT stays alive and prints nothing (before, it
    died with a KeyboardInterrupt traceback and broke the pool)."""
    import os
    import signal

    from cyto.detect import NucleusParams
    from cyto.infer.tiling import TileContext, TileFeed

    ctx = TileContext("s.tif", (), (0.0,), 512, 32, 64, 64, NucleusParams())
    # children of a shell's background job start with SIGINT ignored; a terminal's do not
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = TileFeed(ctx, [None], workers=1, queue=1).pool  # the slide pipeline's pool
    try:
        pid = pool.submit(os.getpid).result(timeout=60)
        signal.signal(signal.SIGINT, before)
        os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert pool.submit(os.getpid).result(timeout=60) == pid
    finally:
        signal.signal(signal.SIGINT, before)
        pool.shutdown()


def test_tile_workers_run_opencv_in_one_thread(monkeypatch):
    """The workers are the parallelism: OpenCV's own pool in each (a thread per core by default)
    only oversubscribed the cores."""
    import cv2

    from cyto.detect import NucleusParams
    from cyto.infer.tiling import TileContext, TileFeed

    monkeypatch.setenv("OPENCV_FOR_THREADS_NUM", "4")  # OpenCV's default, whatever the cores
    ctx = TileContext("s.tif", (), (0.0,), 512, 32, 64, 64, NucleusParams())
    pool = TileFeed(ctx, [None], workers=1, queue=1).pool
    try:
        assert pool.submit(cv2.getNumThreads).result(timeout=60) == 1
    finally:
        pool.shutdown()


def test_missing_resolutions_warn_and_the_flags_fix_them(exported_dsvdd, slides, tmp_path):
    import tifffile

    from cyto.bundle import load_bundle

    assert load_bundle(exported_dsvdd, weights=False).spec.mpp is None  # trained without mpp
    plain = tmp_path / "plain.tif"  # no resolution tags at all
    img = np.full((768, 768, 3), 235, np.uint8)
    img[300:340, 300:340] = (90, 60, 150)
    tifffile.imwrite(plain, img, tile=(256, 256))
    msgs: list[str] = []
    s = score_slide(plain, exported_dsvdd, tmp_path / "a", OPTS, msgs.append)
    assert any("records no resolution (mpp)" in m and "--mpp" in m for m in msgs), msgs
    assert any("--model-mpp" in m for m in msgs)
    assert s["resolution"]["slide_mpp"] is None
    msgs.clear()
    opts = ScoreOptions(**{**OPTS.__dict__, "slide_mpp": 0.24, "model_mpp": 0.12})
    s = score_slide(plain, exported_dsvdd, tmp_path / "b", opts, msgs.append)
    assert not any("records no" in m for m in msgs), msgs
    assert s["resolution"]["slide_mpp"] == 0.24 and s["resolution"]["mpp_ratio"] == 0.5
    assert any("--rescale" in m for m in msgs)  # now the scales can be compared, and differ


def test_crowded_detections_are_reported(exported_dsvdd, slides, tmp_path):
    from cyto.detect import crowding

    grid = np.stack(np.meshgrid(np.arange(0, 2000, 20), np.arange(0, 2000, 20)), -1)
    dense = crowding(grid.reshape(-1, 2), 192, 0.5)  # a nucleus every 20 px: ~100 per crop
    assert dense["median_others_per_crop"] > 50 and dense["median_nn"] == 10.0
    sparse = crowding(grid.reshape(-1, 2) * 10, 192, 0.5)
    assert sparse["median_others_per_crop"] == 0
    s = score_slide(slides[0].paths[0], exported_dsvdd, tmp_path / "s", OPTS)
    assert s["detection_crowding"]["median_others_per_crop"] <= 2  # a synthetic smear


@pytest.mark.realdata
def test_a_tissue_section_at_half_a_micron_warns_about_crowding(
    wsi_dir, exported_dsvdd, real_slides_scored, tmp_path
):
    smear = real_slides_scored["cmu1_small_region.svs"]  # scored with the smear settings
    crowd, msgs = smear["summary"]["detection_crowding"], list(smear["said"])
    assert crowd["median_others_per_crop"] > 6 and crowd["nn_unit"] == "um"
    assert any("detections are crowded" in m and "--detection tissue" in m for m in msgs), msgs

    # the same section with the tissue preset: one detection per nucleus (neighbours farther
    # apart than the smear settings' 5.7 um), crowding recorded but expected, so not warned
    from cyto.detect import detection_preset

    msgs.clear()
    opts = ScoreOptions(**{**OPTS.__dict__, "detection": detection_preset("tissue")})
    t = score_slide(
        wsi_dir / "cmu1_small_region.svs", exported_dsvdd, tmp_path / "u", opts, msgs.append
    )
    tissue = t["detection_crowding"]
    assert tissue["detection"] == "tissue" and crowd["detection"] == "smear"
    assert tissue["median_nn"] >= 7.0 and tissue["median_nn"] > crowd["median_nn"], (tissue, crowd)
    assert not any("detections are crowded" in m for m in msgs), msgs


def test_dense_tiles_come_in_parts_and_give_the_same_table(exported_dsvdd, slides, tmp_path):
    """Memory in flight is bounded by crops, not tiles: a tile with more cells than a result may
    hold comes back in parts (yielded before the next tile), and the table is the same."""
    import pyarrow.parquet as pq_mod

    from cyto.infer import tiling

    slide = slides[0].paths[0]
    # the same table to the bit from other batch shapes: ONNX Runtime's fp32 (OpenVINO's fp32
    # kernels differ per batch shape within float rounding)
    opts = ScoreOptions(**{**OPTS.__dict__, "backend": "onnx", "precision": "fp32"})
    ref = score_slide(slide, exported_dsvdd, tmp_path / "ref", opts)
    sizes: list[tuple[int, bool]] = []
    real_iter = tiling.TileFeed.__iter__

    def spy(self):
        for res in real_iter(self):
            sizes.append((len(res["crops"]), res["final"]))
            yield res

    tiling.TileFeed.__iter__ = spy
    try:
        for workers in (0, 2):
            sizes.clear()
            parts = ScoreOptions(**{**opts.__dict__, "max_cells": 5, "workers": workers})
            s = score_slide(slide, exported_dsvdd, tmp_path / f"w{workers}", parts)
            assert max(n for n, _ in sizes) <= 5 and any(not f for _, f in sizes)
            assert s["tiles"]["total"] == ref["tiles"]["total"] == sum(f for _, f in sizes)
            a = pq_mod.read_table(tmp_path / f"w{workers}" / "scores.parquet")
            b = pq_mod.read_table(tmp_path / "ref" / "scores.parquet")
            assert same_table(a.replace_schema_metadata(None), b.replace_schema_metadata(None))
    finally:
        tiling.TileFeed.__iter__ = real_iter
    # interrupted inside a dense tile, then resumed: the uninterrupted table again
    from cyto.runtime import load_scorer

    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    real, calls = scorer.score, {"n": 0}

    def flaky(images, batch_size):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(images, batch_size)

    opts = ScoreOptions(**{**OPTS.__dict__, "max_cells": 5, "chunk_cells": 8, "batch_size": 2})
    scorer.score = flaky
    with pytest.raises(KeyboardInterrupt):
        score_slide(slide, scorer, tmp_path / "r", opts)
    scorer.score = real
    score_slide(slide, scorer, tmp_path / "r", ScoreOptions(**{**opts.__dict__, "resume": True}))
    a = pq_mod.read_table(tmp_path / "r" / "scores.parquet").replace_schema_metadata(None)
    assert same_table(
        a, pq_mod.read_table(tmp_path / "ref" / "scores.parquet").replace_schema_metadata(None)
    )


def test_a_4_gib_file_scores_in_the_memory_of_a_small_one(exported_dsvdd, slides, tmp_path):
    """The same slide followed by a 4 GiB hole (a sparse file: nothing is written): no step
    reads the whole file, so the peak memory of `cyto score` does not move. One run scores the
    small file, then the big one: the peak recorded is the process's high-water mark so far."""
    small = tmp_path / "small.tif"
    shutil.copy(slides[0].paths[0], small)
    big = tmp_path / "big.tif"
    shutil.copy(slides[0].paths[0], big)
    with open(big, "r+b") as fh:
        fh.truncate(4 * 2**30 + 12345)
    proc = score_cli(
        [small, big],
        exported_dsvdd,
        tmp_path / "o",
        "--workers",
        "0",
        "--mosaic",
        "0",
        process=True,
    )
    assert proc.returncode == 0, proc.stderr
    peaks = {}
    for path in (small, big):
        summary = json.loads((tmp_path / "o" / path.stem / "summary.json").read_text())
        peaks[path.stem] = summary["peak_rss_mb"]
        cells = summary["cells_scored"]
    assert cells > 0
    assert peaks["big"] < peaks["small"] + 100, peaks


def test_workers_read_ahead_within_the_crop_budget(exported_dsvdd, slides, tmp_path):
    """The engine scores 4 * batch_size cells at a time; with 2 tiles in flight it waited for
    every read of a sparse slide. Now at least QUEUE_MIN tiles are in flight, and the crops they
    can hold stay within IN_FLIGHT_BYTES."""
    from cyto.infer import tiling

    seen = {}
    real_init = tiling.TileFeed.__init__

    def spy(self, ctx, jobs, workers, queue, **kw):
        seen.update(queue=queue, max_cells=ctx.max_cells, out=ctx.out_size)
        real_init(self, ctx, jobs, workers, queue, **kw)

    tiling.TileFeed.__init__ = spy
    try:
        opts = ScoreOptions(**{**OPTS.__dict__, "workers": 1})
        score_slide(slides[0].paths[0], exported_dsvdd, tmp_path / "o", opts)
    finally:
        tiling.TileFeed.__init__ = real_init
    assert seen["queue"] >= tiling.QUEUE_MIN >= 16
    crop_bytes = seen["out"] ** 2 * 3
    assert seen["queue"] * seen["max_cells"] * crop_bytes <= tiling.IN_FLIGHT_BYTES


def test_a_slide_finished_by_resume_reports_no_rate(exported_dsvdd, slides, tmp_path, monkeypatch):
    """Stopped after every chunk was written: the resumed run scores no cell, so it reports no
    rate (it said 0.0 cells/s). Stopped before any chunk: the message says there is nothing to
    resume (it said the finished chunks were kept)."""
    import cyto.infer.finish as pl
    from cyto.runtime import load_scorer

    opts = ScoreOptions(mosaic=0, workers=0, tile=256, chunk_cells=4096, batch_size=8)
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    real_score, msgs = scorer.score, []

    def stop_at_once(images, batch_size):
        raise KeyboardInterrupt

    scorer.score = stop_at_once
    with pytest.raises(KeyboardInterrupt):
        score_slide(slides[0].paths[0], scorer, tmp_path / "r0", opts, msgs.append)
    assert any("no chunk was finished yet" in m for m in msgs), msgs
    assert not any("are kept" in m for m in msgs), msgs
    scorer.score = real_score

    real_write = pl.write_score_table

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pl, "write_score_table", stop)
    with pytest.raises(KeyboardInterrupt):
        score_slide(slides[0].paths[0], scorer, tmp_path / "r", opts)
    monkeypatch.setattr(pl, "write_score_table", real_write)
    s = score_slide(
        slides[0].paths[0],
        scorer,
        tmp_path / "r",
        ScoreOptions(**{**opts.__dict__, "resume": True}),
    )
    assert s["cells_this_run"] == 0 and s["cells_resumed"] == s["cells_scored"] > 0
    assert s["cells_per_s"] is None and s["engine_cells_per_s"] is None


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (from /proc)."""
    import os

    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_main_process(exported_dsvdd, big, tmp_path):
    """SIGKILL of cyto score (no handler can run) while its worker decodes tiles: the worker
    goes too, instead of living on under PID 1 with its memory (issue 34)."""
    import os
    import signal

    cmd = [sys.executable, "-m", "cyto", "score", str(big.paths[0]), "--model"]
    cmd += [str(exported_dsvdd), "--out", str(tmp_path / "o"), "--workers", "1", "--tile", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    state = tmp_path / "o" / "big" / ".partial" / "state.json"
    workers: list[int] = []
    while time.time() < deadline and not (state.exists() and workers):
        time.sleep(0.1)
        workers = [c for c in _children(proc.pid) if b"spawn_main" in _cmdline(c)]
    assert workers, "no worker process appeared"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 20
    alive = workers
    while alive and time.time() < deadline:
        time.sleep(0.1)
        alive = [w for w in workers if os.path.exists(f"/proc/{w}") and _zombie(w) is False]
    for w in alive:  # a failing run leaves nothing behind either
        os.kill(w, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their killed parent"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _scores_times_100(path):
    import pyarrow.compute as pc

    t = pq.read_table(path)
    i = t.schema.get_field_index("score")
    pq.write_table(t.set_column(i, "score", pc.multiply(t["score"], 100.0)), path)


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda p: p.write_bytes(b""), "is damaged"),  # a disk that filled while it was written
        # a hostile check (round 3): the same rows and columns, every score x100, were resumed
        # into the sealed table with no word
        (_scores_times_100, "is not as this run wrote it"),
    ],
)
def test_a_damaged_or_edited_chunk_is_scored_again_on_resume(
    exported_dsvdd, slides, tmp_path, damage, said
):
    """A chunk in .partial that is cut short or edited, then --resume: the chunk's tiles are
    scored again and the table equals an uninterrupted run's (issue 34: an ArrowInvalid
    traceback aborted the cohort)."""
    from cyto.runtime import load_scorer

    opts = ScoreOptions(mosaic=0, workers=0, tile=256, chunk_cells=8, batch_size=8)
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    _interrupted_at(5, slides[0].paths[0], scorer, tmp_path / "r", opts)
    chunks = sorted((tmp_path / "r" / ".partial").glob("chunk-*.parquet"))
    assert len(chunks) >= 2, chunks
    damage(chunks[1])  # the second of them
    msgs = []
    resume = ScoreOptions(**{**opts.__dict__, "resume": True})
    s = score_slide(slides[0].paths[0], scorer, tmp_path / "r", resume, msgs.append)
    assert any(f"{chunks[1].name} {said}" in m for m in msgs), msgs
    ref = score_slide(slides[0].paths[0], scorer, tmp_path / "ref", opts)
    got, want = (
        pq.read_table(p / "scores.parquet").sort_by([("x", "ascending"), ("y", "ascending")])
        for p in (tmp_path / "r", tmp_path / "ref")
    )
    assert s["cells_scored"] == ref["cells_scored"] == got.num_rows
    assert got["x"].to_pylist() == want["x"].to_pylist()
    np.testing.assert_allclose(np.asarray(got["score"]), np.asarray(want["score"]))


def test_a_symlink_loop_fails_alone_and_the_cohort_goes_on(exported_dsvdd, slides, tmp_path):
    """A slide path that is a symlink loop aborted the whole cohort with a RuntimeError before
    any slide was scored (issue 34). One bad slide must never stop a cohort."""
    loop = tmp_path / "loop.tif"
    loop.symlink_to(loop)
    out = tmp_path / "o"
    proc = run_cyto(
        "score", str(loop), str(slides[0].paths[0]), "--model", str(exported_dsvdd),
        "--out", str(out), "--workers", "0", "--mosaic", "0",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "loop.tif" in proc.stderr
    assert "a link that leads nowhere" in proc.stderr
    assert (out / "s" / "scores.parquet").is_file()
    rows = (out / "cohort.csv").read_text().splitlines()
    assert len(rows) == 3  # a header, the failed slide, the scored one


def _cohort_rows(out) -> list[dict]:
    import csv

    with open(out / "cohort.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_later_run_never_replaces_another_slides_results(exported_dsvdd, slides, tmp_path):
    """`cyto score A/s.tif --out o`, then `cyto score B/s.tif --out o`: B's results replaced A's
    folder and cohort row (issue 34). B goes to a folder of its own, A's stays as it was; a rerun
    of B finds its folder again."""
    a, b = slides[0].paths[0], slides[1].paths[0]
    out = tmp_path / "o"
    opts = ScoreOptions(mosaic=0, workers=0, tile=512, resume=True)
    said: list[str] = []
    [first], _ = score_cohort([a], exported_dsvdd, out, opts, said.append)
    before = (out / "s" / "scores.parquet").read_bytes()
    [second], _ = score_cohort([b], exported_dsvdd, out, opts, said.append)
    assert (out / "s" / "scores.parquet").read_bytes() == before
    assert json.loads((out / "s" / "summary.json").read_text())["slide"] == str(a.resolve())
    other = Path(second["output"])
    assert other.parent == out and other.name.startswith("s-"), other
    assert json.loads((other / "summary.json").read_text())["slide"] == str(b.resolve())
    assert any("holds the results of another slide" in m for m in said), said
    rows = _cohort_rows(out)
    assert sorted(r["slide"] for r in rows) == sorted([str(a.resolve()), str(b.resolve())])
    said.clear()
    [again], _ = score_cohort([b], exported_dsvdd, out, opts, said.append)
    assert again["output"] == second["output"] and any("already scored" in m for m in said)
    assert len(_cohort_rows(out)) == 2


def test_one_out_folder_spelled_three_ways_is_one_cohort(
    exported_dsvdd, slides, tmp_path, monkeypatch
):
    """The same --out given relative, absolute, and relative from another folder made three rows
    for one slide in cohort.csv (issue 34)."""
    a = slides[0].paths[0]
    opts = ScoreOptions(mosaic=0, workers=0, tile=512, resume=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    score_cohort([a], exported_dsvdd, Path("o"), opts, lambda m: None)
    score_cohort([a], exported_dsvdd, tmp_path / "o", opts, lambda m: None)
    monkeypatch.chdir(tmp_path / "elsewhere")
    score_cohort([a], exported_dsvdd, Path("../o"), opts, lambda m: None)
    rows = _cohort_rows(tmp_path / "o")
    assert len(rows) == 1, rows
    assert rows[0]["output"] == str(tmp_path.resolve() / "o" / "s")
    assert [p.name for p in (tmp_path / "o").iterdir() if p.is_dir()] == ["s"]


def test_a_slide_linked_under_a_case_name_is_named_by_the_link(exported_dsvdd, slides, tmp_path):
    """A lab links an archive's slide in under a case number to pseudonymize it: its output
    folder, cohort row, summary and every line were named by the link's target, the archive's
    file name (hostile round 66, 6). The link names them; its target listed beside it is the
    same slide, scored once."""
    target = slides[0].paths[0]
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "case-017.tif").symlink_to(target)
    out = tmp_path / "o"
    said: list[str] = []
    opts = ScoreOptions(mosaic=0, workers=0, tile=512)
    done, failed = score_cohort([cases / "case-017.tif", target], exported_dsvdd, out, opts,
                                said.append)  # fmt: skip
    assert len(done) == 1 and not failed
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["case-017"]
    [row] = _cohort_rows(out)
    assert row["slide"] == str(cases / "case-017.tif")
    summary = json.loads((out / "case-017" / "summary.json").read_text())
    assert summary["slide"] == str(cases / "case-017.tif")
    assert not [m for m in said if str(target) in m or "s.tif" in m], said
    assert any("case-017.tif" in m for m in said), "\n".join(said)


@pytest.mark.pyvips
def test_a_damaged_tile_is_one_line_in_the_decoders_words(exported_dsvdd, slides, tmp_path):
    """A slide with a damaged JPEG tile: the error began with libvips' "unable to write to
    memory" and ran over four lines (issue 34). One line, saying what the decoder found."""
    import tifffile

    good = slides[0].paths[0]
    with tifffile.TiffFile(good) as tf:
        offset, count = tf.pages[0].dataoffsets[1], tf.pages[0].databytecounts[1]
    data = bytearray(good.read_bytes())
    noise = np.random.default_rng(0).integers(0, 256, count - 22, dtype=np.uint8)
    data[offset + 20 : offset + count - 2] = noise.tobytes()
    bad = tmp_path / "bad.tif"
    bad.write_bytes(bytes(data))
    proc = score_cli(bad, exported_dsvdd, tmp_path / "o", "--workers", "0", "--mosaic", "0")
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot be decoded" in lines[0] and "Corrupt JPEG data" in lines[0], lines
    assert "unable to write to memory" not in lines[0]


def test_resume_scores_again_when_the_settings_changed(exported_dsvdd, slides, tmp_path):
    """`cyto score --resume` reused a finished table made with other settings: a second run with
    --top-k 3 (or another detection) kept the first run's 400-cell top-K and its cells (QA). A
    finished slide is reused only with the options it was scored with."""
    slide = slides[0].paths[0]
    out = tmp_path / "o"
    said: list[str] = []
    first_opts = ScoreOptions(mosaic=0, workers=0, tile=512, resume=True, top_k=5)
    [first], _ = score_cohort([slide], exported_dsvdd, out, first_opts, said.append)
    assert pq.read_table(out / "s" / "topk.parquet").num_rows == 5
    said.clear()
    fewer = ScoreOptions(mosaic=0, workers=0, tile=512, resume=True, top_k=3)
    [again], _ = score_cohort([slide], exported_dsvdd, out, fewer, said.append)
    assert not any("; skipping" in m for m in said), "\n".join(said)
    assert any("other settings or inputs (--top-k 5 -> 3)" in m for m in said), said
    assert pq.read_table(out / "s" / "topk.parquet").num_rows == 3
    assert json.loads((out / "s" / "summary.json").read_text())["options"]["top_k"] == 3
    said.clear()  # the same settings again: reused
    score_cohort([slide], exported_dsvdd, out, fewer, said.append)
    assert any("already scored" in m for m in said), said
    # another detection finds other cells: scored again, and the table holds the new cells
    said.clear()
    stricter = replace(fewer.detection, min_area=2500)  # about half the nuclei
    [third], _ = score_cohort(
        [slide], exported_dsvdd, out, replace(fewer, detection=stricter), said.append
    )
    assert any("--detection smear's min_area 300 -> 2500" in m for m in said), said
    plain = score_slide(
        slide, load_scorer(exported_dsvdd), tmp_path / "plain", replace(fewer, resume=False)
    )
    assert plain["cells_scored"] == first["cells_scored"] > third["cells_scored"] > 0
    assert third["cells_scored"] == pq.read_table(out / "s" / "scores.parquet").num_rows


def test_a_restart_with_other_outputs_keeps_the_cells_and_writes_the_outputs_again(
    exported_dsvdd, slides, tmp_path
):
    """A lab restarts `cyto score --resume` (a watch) with another top-K, an error rate the
    bundle has no calibration for, a ranking or an adequacy rule: every finished slide was
    scored again, cell by cell (hostile round 76, 9). Where only what is drawn from the table
    differs, the cells are kept and the outputs written again from them: the tables and the
    adequacy are a fresh run's with those options, and no cell is scored. A setting that shapes
    the rows (the tile; a rule that needs the crops' sharpness a run under `--adequacy none` did
    not keep) still scores the slide again, said."""
    slide = slides[0].paths[0]
    out = tmp_path / "o"
    said: list[str] = []

    def run(opts):
        said.clear()
        done, failed = score_cohort([slide], exported_dsvdd, out, opts, said.append)
        assert not failed and len(done) == 1, "\n".join(said)
        return done[0]

    first = ScoreOptions(mosaic=0, workers=0, tile=512, resume=True, top_k=5)
    n = run(first)["cells_scored"]
    later = replace(
        first, top_k=3, mosaic=4, fdr_alpha=0.05, rank_by="morphometry", adequacy="lbc-cervical"
    )
    again = run(later)
    assert again["cells_this_run"] == 0 and again["cells_resumed"] == n, "\n".join(said)
    assert any("(--top-k 5 -> 3" in m and "its cells are kept" in m for m in said), said
    assert not any("scoring it again" in m or "scored again" in m for m in said), said
    # a rule said by its name, not its fields and sources (hostile round 77, 6)
    [line] = [m for m in said if "its cells are kept" in m]
    assert "general -> lbc-cervical" in line and len(line) < 600, line
    fresh = score_slide(
        slide, load_scorer(exported_dsvdd), tmp_path / "fresh", replace(later, resume=False)
    )
    for name in ("scores.parquet", "topk.parquet"):
        assert same_table(pq.read_table(out / "s" / name), pq.read_table(tmp_path / "fresh" / name))
    summary = json.loads((out / "s" / "summary.json").read_text())
    assert summary["rank_by"] == fresh["rank_by"] == "morphometry" and summary["mosaic"]
    for key in ("cell_scale", "adequacy", "burden"):
        assert summary[key] == fresh[key], key
    assert run(later).get("reused_from"), said  # these settings again: reused as they are
    assert any("already scored" in m and "; skipping" in m for m in said), said
    # a table under --adequacy none keeps no sharpness: kept for none, scored again for a rule
    assert run(replace(later, adequacy="none"))["cells_this_run"] == 0
    # each said with why the cells are not kept (the engine, the sharpness: hostile round 77, 5);
    # the engine the other of the one auto took on this CPU
    other = "onnx" if summary["backend"] != "onnx" else "openvino"
    for changed, why in (
        (later, "sharpness, which the adequacy rule judges, was not measured"),
        (replace(later, tile=256), "--tile 512 -> 256"),
        (replace(later, backend=other, top_k=4), f"this run's engine is {other}/cpu"),
    ):
        assert run(changed)["cells_this_run"] > 0, said
        assert any("scoring it again" in m and why in m for m in said), said
        assert not any("its cells are kept" in m for m in said), said


def test_a_kept_restart_reads_as_kept_not_as_a_resumed_crash(exported_dsvdd, slides, tmp_path):
    """Hostile round 77, 7: a restart that kept a slide's cells said "resuming: 4 tiles and 258
    cells already scored", drew a tile bar at 0 cells/s and ended "(all 258 from finished
    chunks)", as a run resumed after a crash: it says the cells were kept, once, and no bar."""
    args = ("score", str(slides[0].paths[0]), "--model", str(exported_dsvdd), "--out")
    args += (str(tmp_path / "o"), "--workers", "0", "--tile", "512", "--mosaic", "0")
    env = {"CYTO_PROGRESS": "1"}
    assert run_cyto(*args, env=env).returncode == 0
    proc = run_cyto(*args, "--resume", "--top-k", "3", env=env)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "its cells are kept" in said, said
    for crash in ("resuming:", "finished chunks", "tiles/s", "cells/s"):
        assert crash not in said, said
    summary = json.loads((tmp_path / "o" / "s" / "summary.json").read_text())
    assert summary["rows_kept"] and summary["cells_this_run"] == 0
    line = slide_line(summary, tmp_path / "o")
    assert "kept from the finished run" in line and "its outputs written again" in line, line
    # the precision `auto` took, asked for by name, scores the same cells: kept (round 77, 8)
    ran = summary["precision"]
    proc = run_cyto(*args, "--resume", "--top-k", "3", "--precision", ran)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"--precision auto -> {ran}" in said, said
    assert "its cells are kept" in said and "scoring it again" not in said, said


def test_a_resume_finds_focal_planes_added_since_and_a_slide_moved_with_its_planes(
    exported_dsvdd, tmp_path
):
    """A slide scored with `--planes auto` before its focal-plane files were beside it was
    reused by a plain `--resume` once they were, its table without them (hostile round 77, 3);
    and a slide moved to another folder had its cells "kept", then "scored again after all
    (... the same content ...)" (round 77, 4). Planes added since: scored again, said; the
    slide and its planes moved: its cells kept, said once."""
    made = write_slide(
        tmp_path / "a" / "p.tif",
        SlideSynthConfig(width=1024, height=768, seed=6, planes=(-1.0, 0.0, 1.0)),
    )
    slide, planes = made.paths[0], made.paths[1:]
    aside = tmp_path / "aside"
    aside.mkdir()
    for f in planes:
        shutil.move(f, aside / f.name)
    out, said = tmp_path / "o", []
    opts = replace(OPTS, resume=True)
    [first], _ = score_cohort([slide], exported_dsvdd, out, opts, said.append)
    for f in planes:
        shutil.move(aside / f.name, f)
    said.clear()
    [again], _ = score_cohort([slide], exported_dsvdd, out, opts, said.append)
    assert again["cells_this_run"] > 0 and again.get("reused_from") is None, said
    assert any("the slide's files (its focal planes)" in m for m in said), said
    moved = tmp_path / "b"
    shutil.copytree(slide.parent, moved)
    said.clear()
    [kept], _ = score_cohort([moved / slide.name], exported_dsvdd, out, replace(opts, top_k=5),
                             said.append)  # fmt: skip
    assert kept["cells_this_run"] == 0, said
    assert not any("after all" in m for m in said), said


def test_a_ray_engine_keeps_the_cells_of_a_slide_it_would_split(exported_dsvdd, slides, tmp_path):
    """On a Ray cluster a slide of more tiles than ``split_tiles`` is scored in parts unless its
    finished run is reused: its cells kept for other outputs were instead sent out in parts
    and scored again (after a line saying they were kept). The engine actor's own call, without
    a cluster."""
    from cyto.cohort.ray import SlideWorker

    slide = slides[0].paths[0]
    out = tmp_path / "o" / "s"
    first = ScoreOptions(mosaic=0, workers=0, tile=256, top_k=5)
    n = score_slide(slide, exported_dsvdd, out, first)["cells_scored"]
    worker = object.__new__(SlideWorker)  # as the actor holds it, its engine loaded
    worker.node, worker.scorer = "here", load_scorer(exported_dsvdd)
    worker.opts = replace(first, top_k=3)
    got = worker.score(str(slide), str(out), True, None, split=2)  # 16 tiles: in parts otherwise
    summary = got["result"].get("summary")
    assert summary is not None and summary["cells_resumed"] == n, got
    assert sum("its cells are kept" in m for m in got["messages"]) == 1, got["messages"]


def test_a_slide_removed_while_it_is_scored_stops_and_leaves_nothing(exported_dsvdd, big, tmp_path):
    """A slide deleted while it was scored was read to its end through the open files, then
    failed, its chunks left in OUT for a slide that is gone (hostile round 76, 6). Its removal is
    found within a second: the slide fails in one line, before its last tiles, and its folder
    goes (this run made it)."""
    import threading

    from cyto.infer.store import PARTIAL

    slide = tmp_path / "in" / "gone.tif"
    slide.parent.mkdir()
    shutil.copy(big.paths[0], slide)
    out = tmp_path / "o"
    opts = replace(OPTS, tile=256)
    removed = threading.Event()

    def remove_once_scoring() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out / "gone" / PARTIAL).is_dir():
            time.sleep(0.01)
        slide.unlink()
        removed.set()

    threading.Thread(target=remove_once_scoring, daemon=True).start()
    said: list[str] = []
    done, failed = score_cohort([slide], exported_dsvdd, out, opts, said.append)
    assert removed.is_set() and not done and len(failed) == 1, said
    assert "gone.tif was removed while it was scored: nothing scored of it is kept" in str(
        failed[0][1]
    )
    assert not (out / "gone").exists() and not any("96/96" in m for m in said), said


def test_a_slide_copied_in_under_two_names_is_said(exported_dsvdd, slides, tmp_path):
    """The same scan copied into a folder twice was scored twice, two rows in cohort.csv and no
    word (hostile round 76, 8): said in a note naming both, once; another slide is not."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.tif", "b.tif"):
        shutil.copy(slides[0].paths[0], folder / name)
    shutil.copy(slides[1].paths[0], folder / "c.tif")
    said: list[str] = []
    done, failed = score_cohort(sorted(folder.iterdir()), exported_dsvdd, tmp_path / "o", OPTS,
                                said.append)  # fmt: skip
    assert len(done) == 3 and not failed, said
    notes = [m for m in said if "holds the same slide" in m]
    assert notes == [
        "note: b.tif holds the same slide as a.tif (the same content): both are scored, and "
        "each counts in cohort.csv; remove the copy if it is one"
    ], said


def test_a_console_closed_by_its_reader_is_not_an_output_error(exported_dsvdd, slides, tmp_path):
    """`cyto score ... 2>&1 | head`: the reader goes, and the slide was recorded "failed ...
    cannot write o/s: Broken pipe" (hostile round 9, N4). A closed console is no error of the
    outputs: the slide is scored whole, sealed, and its cohort row says so."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    out = tmp_path / "o"
    proc = subprocess.run(
        [sys.executable, "-m", "cyto", "score", str(slides[0].paths[0]), "--model",
         str(exported_dsvdd), "--out", str(out), "--workers", "0", "--mosaic", "0"],
        stdout=write, stderr=write, timeout=300,
    )  # fmt: skip
    os.close(write)
    assert proc.returncode == 0
    assert (out / "s" / "seal.json").is_file() and not (out / "s" / ".partial").exists()
    [row] = _cohort_rows(out)
    assert "Broken pipe" not in str(row) and "fail" not in str(row).lower(), row


def test_ctrl_c_in_a_cohort_advises_what_a_rerun_needs(
    exported_dsvdd, slides, tmp_path, monkeypatch
):
    """Hostile round 10, N41: a Ctrl-C on the second slide said "no chunk was finished yet:
    rerun to start over", and a plain rerun was refused for the finished first slide. The
    cohort says --resume keeps the finished slides; that advice, followed, finishes the run."""
    from cyto.cohort import local

    a, b = slides[0].paths[0], slides[1].paths[0]
    out = tmp_path / "o"
    real, calls = local.score_at, {"n": 0}

    def stopped_at_the_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(local, "score_at", stopped_at_the_second)
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        score_cohort([a, b], exported_dsvdd, out, OPTS, said.append)
    assert said[-1] == (
        f"interrupted after 1 of 2 slides were finished in {out}: rerun with --resume to keep "
        "them and continue"
    ), said
    monkeypatch.setattr(local, "score_at", real)
    done, failed = score_cohort([a, b], exported_dsvdd, out, replace(OPTS, resume=True), print)
    assert len(done) == 2 and not failed


def test_cyto_s_own_outputs_are_no_slide(exported_dsvdd, slides, tmp_path):
    """Hostile round 11, N30: cyto's own abnormality map given as a slide was read at 50 um/px
    ("0.00x", then "416.67x smaller", and advice to pass --rescale). A file a scored folder's
    seal lists is refused in one line naming the slide it came from."""
    out = tmp_path / "o"
    done = score_cli(slides[0].paths[0], exported_dsvdd, out, "--mosaic", "0", "--qupath", "map")
    assert done.returncode == 0, done.stderr
    own = out / "s" / "abnormality.ome.tif"
    proc = score_cli(own, exported_dsvdd, tmp_path / "again", "--mosaic", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        f"{own} is one of cyto's own outputs of the scored folder {out / 's'} (its seal lists "
        f"it), not a slide: give the slide it was scored from ({slides[0].paths[0]})"
    ) in proc.stderr, proc.stderr


def test_a_scale_no_resampling_bridges_is_said_so_in_one_measure():
    """N30's words: "(0.00x)" beside "416.67x smaller", and --rescale advised where the crops
    it would cut are under 16 px. One measure (times larger or smaller), and advice that helps."""
    from cyto.infer.scale import resolution

    said: list[str] = []
    resolution(50.0, None, 0.12, 96, False, said.append)
    assert said == [
        "warning: slide at 50 um/px but the model was trained at 0.12 um/px; cells will look "
        "417x smaller than in training. No resampling bridges that: check that this is a slide "
        "and its pixel size (--mpp)"
    ]
    said.clear()
    resolution(0.25, None, 0.12, 96, False, said.append)
    assert said == [
        "warning: slide at 0.25 um/px but the model was trained at 0.12 um/px; cells will look "
        "2.08x smaller than in training. If 0.25 um/px is its true resolution, pass --rescale "
        "to resample the crops"
    ]


def test_a_cohort_table_says_which_model_scored_each_slide_and_warns_of_two(
    exported_dsvdd, exported_bundles, slides, tmp_path
):
    """Hostile round 54, 1: two bundles of one name scored slides into one --out, and cohort.csv
    held their rows side by side, with no model column and not a word; --resume with the other
    model scored again only the slides it was given. Each row names its model; a table that
    comes to hold two says so in one warning, of the table as the run leaves it."""
    import warnings

    from cyto.bundle import load_bundle

    a = slides[0].paths[0]
    b = shutil.copy(slides[1].paths[0], tmp_path / "b.tif")  # its own name, its own folder
    other = tmp_path / "B" / exported_dsvdd.name  # another Deep SVDD network, of one name
    shutil.copytree(exported_bundles["dsvdd"], other)
    out = tmp_path / "co"
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        score_cohort([a], exported_dsvdd, out, OPTS, lambda m: None)
    assert not [w for w in first if "models" in str(w.message)]
    with warnings.catch_warnings(record=True) as second:
        warnings.simplefilter("always")
        score_cohort([b], other, out, OPTS, lambda m: None)
    with open(out / "cohort.csv", newline="") as fh:
        rows = {Path(r["slide"]).name: r for r in csv.DictReader(fh)}
    shas = {load_bundle(p).manifest_hash: str(p.resolve()) for p in (exported_dsvdd, other)}
    assert len(shas) == 2
    assert {(r["model"], r["model_sha256"]) for r in rows.values()} == {
        (m, sha) for sha, m in shas.items()
    }
    [said] = [str(w.message) for w in second if "models" in str(w.message)]
    assert f"{out / 'cohort.csv'} holds slides scored by 2 models" in said, said
    scales = {r["scale_sha256"] for r in rows.values()}
    assert len(scales) == 2 and all(s[:12] in said for s in scales), said
    # said of the table as a run leaves it: a run that resumes both with the one model (b kept,
    # a scored again) is mixed after its first slide only (it was said so there: round 55, 1)
    again = ScoreOptions(**{**OPTS.__dict__, "resume": True})
    with warnings.catch_warnings(record=True) as third:
        warnings.simplefilter("always")
        score_cohort([b, a], other, out, again, lambda m: None)
    assert not [str(w.message) for w in third if "models" in str(w.message)]
    with open(out / "cohort.csv", newline="") as fh:
        assert {r["model"] for r in csv.DictReader(fh)} == {str(other.resolve())}


def test_a_bundle_exported_again_is_one_scale_and_one_calibrated_again_is_not(
    exported_dsvdd, slides, tmp_path
):
    """Hostile round 69, 10: a bundle exported again (to add a form: the same graphs, byte for
    byte) made the cohort table warn that its slides were scored by "2 models or versions of
    one ... not on one scale": the manifest's sha256 changed, what scores did not. The table
    compares what the scores, flags and burden depend on (scale_sha256): the same after an
    export into the same graphs, another after a calibration."""
    import warnings

    from cyto.export.onnx import export_onnx
    from cyto.stats.calibrate import calibrate_from_tables

    a = slides[0].paths[0]
    b = shutil.copy(slides[1].paths[0], tmp_path / "b.tif")
    c = shutil.copy(slides[1].paths[0], tmp_path / "c.tif")
    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    out = tmp_path / "co"

    def run(slide) -> list[str]:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            score_cohort([slide], model, out, OPTS, lambda m: None)
        return [str(w.message) for w in got if "models or versions" in str(w.message)]

    assert run(a) == []
    before = (model / "manifest.json").read_bytes()
    export_onnx(model)  # again: the same graph
    assert (model / "manifest.json").read_bytes() != before
    assert run(b) == []
    with open(out / "cohort.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert (
        len({r["model_sha256"] for r in rows}) == 2 and len({r["scale_sha256"] for r in rows}) == 1
    )
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    neg = write_slide(
        tmp_path / "neg.tif",
        SlideSynthConfig(width=1024, height=1024, n_cells=120, abnormal_fraction=0.0, seed=5),
    ).paths[0]
    score_cohort([neg], model, tmp_path / "negs", OPTS, lambda m: None)
    calibrate_from_tables(model, [tmp_path / "negs" / "neg"], min_cells=10)
    [said] = run(c)
    assert "holds slides scored by 2 models or versions of one" in said and "calibration" in said
