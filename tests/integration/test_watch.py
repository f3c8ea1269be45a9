"""``cyto score FOLDER --watch``: slides scored as a scanner writes them, never half-written."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cyto.cohort.watch import watch_cohort
from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.infer import ScoreOptions, score_slide
from cyto.locks import OutputLock
from tests.cli_runner import run_cyto
from tests.killers import as_in_a_terminal
from tests.tables import same_table

OPTS = ScoreOptions(workers=0, mosaic=0, top_k=20)
SETTLE = 1.0


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("watch-src")
    return write_slide(root / "a.tif", SlideSynthConfig(width=768, height=768, seed=21)).paths[0]


class _Watch:
    """``watch_cohort`` in a thread, its messages and finished slides kept as they come."""

    def __init__(self, folder: Path, model: Path, out: Path) -> None:
        self.said: list[str] = []
        self.finished: list[dict] = []
        self.stop = threading.Event()
        self.result = None

        def run() -> None:
            self.result = watch_cohort(
                [folder], model, out, OPTS, self.said.append, poll=0.1, settle=SETTLE,
                stop=self.stop, on_slide=self.finished.append,
            )  # fmt: skip

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait_for(self, what, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert self.thread.is_alive(), self.said
            assert time.monotonic() < deadline, self.said
            time.sleep(0.05)

    def close(self):
        self.stop.set()
        self.thread.join(60)
        return self.result


def test_a_slide_is_scored_once_written_whole_and_a_bad_one_is_said_once(
    made, exported_dsvdd, tmp_path, monkeypatch
):
    folder, out = tmp_path / "scanner", tmp_path / "out"
    folder.mkdir()
    watch = _Watch(folder, exported_dsvdd, out)
    try:
        watch.wait_for(lambda: any(m.startswith("watching ") for m in watch.said))
        # the scanner writes the slide in parts, each sooner than --settle after the last:
        # nothing is read until it has stood unchanged
        data = made.read_bytes()
        target = folder / "a.tif"
        parts = 4
        for i in range(parts):
            with open(target, "ab") as fh:
                fh.write(data[i * len(data) // parts : (i + 1) * len(data) // parts])
            time.sleep(SETTLE / 3)
            assert not any(m.startswith("slide ") for m in watch.said), watch.said
        watch.wait_for(lambda: len(watch.finished) == 1)
        (folder / "broken.tif").write_bytes(b"II*\0" + b"\0" * 400)  # a damaged TIFF
        watch.wait_for(lambda: any(m.startswith("failed: ") for m in watch.said))
        time.sleep(SETTLE * 2)  # unchanged: not tried again
    finally:
        done, failed = watch.close()
    assert [s["cells_scored"] for s in done] == [watch.finished[0]["cells_scored"]]
    assert [p.name for p, _ in failed] == ["broken.tif"]
    assert sum(m.startswith("failed: ") for m in watch.said) == 1, watch.said
    assert not any(m.startswith("resume: ") for m in watch.said), watch.said  # no noise
    # the table is the one a plain run of the whole file gives
    ref = score_slide(made, exported_dsvdd, tmp_path / "ref", OPTS, echo=lambda _: None)
    got = pq.read_table(out / "a" / "scores.parquet")
    assert got.num_rows == ref["cells_scored"] > 10
    assert same_table(
        got.drop(["slide_id"]),
        pq.read_table(tmp_path / "ref" / "scores.parquet").drop(["slide_id"]),
    )
    rows = (out / "cohort.csv").read_text().splitlines()
    assert len(rows) == 3 and any(",scored," in r for r in rows), rows

    # a second watch of the same folder (named relative to here) keeps what is scored and finds
    # the new slides only; one that another run is writing is left to that run, not failed
    shutil.copy(made, folder / "b.tif")
    shutil.copy(made, folder / "c.tif")
    lock = OutputLock(out / "c").acquire()
    monkeypatch.chdir(tmp_path)
    again = _Watch(Path("scanner"), exported_dsvdd, Path("out"))
    try:
        again.wait_for(lambda: len(again.finished) == 2)
        again.wait_for(lambda: any(m.startswith("c.tif: left to the run") for m in again.said))
        time.sleep(0.5)  # looked at again while held: said once
        lock.release()  # that run stopped: the watch scores c
        again.wait_for(lambda: len(again.finished) == 3)
    finally:
        lock.release()
        done, failed = again.close()
    assert sum(m.startswith("c.tif: left to the run") for m in again.said) == 1, again.said
    assert (out / "c" / "scores.parquet").is_file()
    assert any("a.tif: already scored" in m for m in again.said), again.said
    assert (out / "b" / "scores.parquet").is_file()
    assert [p.name for p, _ in failed] == ["broken.tif"], again.said  # tried once by each watch


def test_watch_takes_folders_on_this_machine_only(made, exported_dsvdd, tmp_path):
    res = run_cyto("score", str(made), "--model", str(exported_dsvdd), "--out", str(tmp_path),
                   "--watch")  # fmt: skip
    assert res.returncode == 2 and "--watch takes folders to watch" in res.stderr, res.stderr
    res = run_cyto("score", str(made.parent), "--model", str(exported_dsvdd), "--out",
                   str(tmp_path), "--watch", "--ray", "local")  # fmt: skip
    assert res.returncode == 2 and "does not take --ray" in res.stderr, res.stderr
    res = run_cyto("score", str(made.parent), "--model", str(exported_dsvdd), "--out",
                   str(tmp_path), "--watch", "--poll", "0")  # fmt: skip
    assert res.returncode == 2 and "--poll must be seconds > 0" in res.stderr, res.stderr
    # taken and not done before: "already scored ... skipping" (hostile round 76, 5)
    res = run_cyto("score", str(made.parent), "--model", str(exported_dsvdd), "--out",
                   str(tmp_path), "--watch", "--overwrite")  # fmt: skip
    assert res.returncode == 2 and "--overwrite would score them all again" in res.stderr


def test_a_slide_whose_output_failed_is_tried_again_and_a_folder_gone_is_said(
    made, exported_dsvdd, tmp_path, monkeypatch
):
    """Hostile round 76, 1 and 4: a slide whose output could not be written (a full disk)
    stayed failed until the watch was restarted, as it is tried again only when its files
    change; a watched folder unmounted or moved away was not said (the watch looked healthy).
    The write failure is tried again after a while; the folder gone, and back, is said."""
    from cyto.cohort import watch as watch_module
    from cyto.errors import OutputWriteError

    monkeypatch.setattr(watch_module, "RETRY_WRITE_S", 0.5)
    real, full = watch_module.score_one, {"on": True}

    def score_one(*args, **kwargs):
        if full["on"]:
            raise OutputWriteError("cannot write out/a/.partial: the disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(watch_module, "score_one", score_one)
    folder, out = tmp_path / "scanner", tmp_path / "out"
    folder.mkdir()
    shutil.copy(made, folder / "a.tif")
    watch = _Watch(folder, exported_dsvdd, out)
    try:
        watch.wait_for(lambda: any(m.startswith("failed: ") for m in watch.said))
        full["on"] = False  # room freed: tried again, the slide's files unchanged
        watch.wait_for(lambda: len(watch.finished) == 1)
        folder.rename(tmp_path / "away")
        watch.wait_for(lambda: any("is gone" in m for m in watch.said))
        time.sleep(0.5)  # said once, not each poll
        (tmp_path / "away").rename(folder)
        watch.wait_for(lambda: any(m.endswith("is back") for m in watch.said))
    finally:
        done, failed = watch.close()
    [line] = [m for m in watch.said if m.startswith("failed: ")]
    assert line.endswith("(this watch tries it again in 0.5 s)"), line
    assert not failed and len(done) == 1, watch.said
    assert [m for m in watch.said if "is gone" in m] == [
        f"watch: {folder} is gone (unmounted or moved?): looked for every poll"
    ]
    assert ",scored," in (out / "cohort.csv").read_text()


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_ends_the_watch_with_what_it_scored(made, exported_dsvdd, tmp_path, stop):
    """Ctrl-C, or a service manager's SIGTERM to every process of the service (systemd,
    `docker stop`; hostile round 37, 5: the watch died saying nothing but a leaked-semaphore
    warning), ends the watch with what it scored."""
    import os
    import signal
    import subprocess
    import sys

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(made, folder / "a.tif")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cyto", "score", str(folder), "--model", str(exported_dsvdd),
         "--out", str(tmp_path / "out"), "--watch", "--poll", "0.2", "--settle", "0",
         "--workers", "0" if stop == "ctrl-c" else "1", "--mosaic", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "CYTO_PROGRESS": "0"},
        preexec_fn=as_in_a_terminal,
        start_new_session=stop == "sigterm",  # a group of its own, signalled whole
    )  # fmt: skip
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("a.tif: "):  # the slide's one-line report: it is scored
                break
        if stop == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    said = "".join(lines) + rest
    assert proc.returncode == (130 if stop == "ctrl-c" else 143), said
    assert "stopped watching: 1 slide(s) scored, 0 failed" in said, said
    assert said.rstrip().endswith("interrupted" if stop == "ctrl-c" else "stopped (SIGTERM)")
    assert "Traceback" not in said and "leaked" not in said, said
    assert (tmp_path / "out" / "a" / "scores.parquet").is_file()


def test_a_slide_finished_by_another_run_while_waiting_for_its_lock_is_reused(
    made, exported_dsvdd, tmp_path, monkeypatch
):
    """Hostile round 42 (3): two watches of one folder scored each slide twice: the second
    looked for finished results while the first still wrote them, waited for the lock, and
    scored the slide again once it was free (a `.partial` in the finished folder meanwhile).
    A resumed run that found nothing to reuse looks again once it holds the lock."""
    import cyto.cohort.local as local
    from cyto.cohort.local import REUSED, score_one
    from cyto.runtime import load_scorer

    target = tmp_path / "out" / "a"
    score_slide(made, exported_dsvdd, target, OPTS, echo=lambda _: None)  # the other run's
    scores = (target / "scores.parquet").read_bytes()
    real = local.judge_finished
    looks: list[bool] = []

    def not_yet_then_real(*args, **kwargs):  # the first look: before the other run finished
        looks.append(True)
        return (None, None) if len(looks) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(local, "judge_finished", not_yet_then_real)
    said: list[str] = []
    scorer = load_scorer(exported_dsvdd, "auto", "cpu", "auto")
    opts = ScoreOptions(**{**OPTS.__dict__, "resume": True})
    summary = score_one(made, target, scorer, opts, said.append, None)
    assert summary.get(REUSED) and len(looks) == 2, said
    assert any("already scored" in line for line in said), said
    assert (target / "scores.parquet").read_bytes() == scores
    assert not (target / ".partial").exists()
