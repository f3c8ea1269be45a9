"""Staging folders beside an output are named for their process and machine, and the next run
of the same target removes those a killed run left, never a live run's nor a user's file
(hostile round 46, 3: a killed `cyto synth slide` left its spool files for good)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cyto import staging


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _other(host: str) -> str:
    """Another machine's (or container's) tag."""
    return "0" * 12 if host != "0" * 12 else "1" * 12


names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\\0"),
    min_size=1,
    max_size=20,
).filter(lambda n: n not in (".", "..") and len(n.encode()) < 200)


@given(name=names)
def test_the_next_run_removes_what_killed_runs_left_and_nothing_else(tmp_path_factory, name):
    root = tmp_path_factory.mktemp("stage")
    target = root / name
    host = staging._host()
    dead, live = _dead_pid(), os.getppid()
    left = {
        "dead": root / f".{name}.writing-{dead}@{host}-x1",  # a killed run's: removed
        "dead file": root / f".{name}.saving-{dead}@{host}-x2",
        "live": root / f".{name}.writing-{live}@{host}-x3",  # a live run's: kept
        "other host": root / f".{name}.writing-{dead}@{_other(host)}-x4",  # kept
        "users": root / f".{name}.bak",  # kept
        "other target": root / f".{name}x.writing-{dead}@{host}-x5",  # another output's: kept
    }
    for key, path in left.items():
        if key.endswith("file"):
            path.write_bytes(b"spool")
        else:
            path.mkdir()
            (path / "p0_l0.spool").write_bytes(b"spool")
    made = staging.dir_beside(target, "writing")
    assert made.is_dir() and made.name.startswith(staging.prefix(target, "writing"))
    assert not left["dead"].exists() and not left["dead file"].exists()
    for key in ("live", "other host", "users", "other target"):
        assert left[key].exists(), key
    staging.sweep(target)  # its own, alive, stays
    assert made.is_dir()


def test_a_killed_synth_slide_leaves_nothing_the_next_run_keeps(tmp_path):
    """The real thing: `cyto synth slide` killed (SIGKILL) once its spool files are written,
    then run again to the same file: only the slide and its truth table are left."""
    out = tmp_path / "k1.tif"
    cmd = [sys.executable, "-m", "cyto", "synth", "slide", str(out), "--width", "4096",
           "--height", "4096", "--workers", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(staging.__file__).parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".k1.tif.writing-*/*.spool")):
        assert proc.poll() is None and time.monotonic() < deadline, "no spool file appeared"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(tmp_path.glob(".k1.tif.writing-*"))  # what the killed run left
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1.cells.parquet", "k1.tif"]


@pytest.mark.parametrize("kind", ["staged", "saving"])
def test_a_bundles_staging_of_a_killed_run_goes_with_the_next_write(tmp_path, kind):
    """A killed `cyto export` left `.X.cyto.staged-*` beside the bundle, and a killed save its
    folder: the next export or save of the same bundle removes it."""
    import numpy as np

    from cyto.bundle import save_bundle, staged_files

    path = tmp_path / "m.cyto"
    save_bundle(path, {"method": "dsvdd"}, {}, {"c": np.zeros(2)})
    stale = tmp_path / f".m.cyto.{kind}-{_dead_pid()}@{staging._host()}-abc"
    stale.mkdir()
    (stale / "encoder-int8.onnx").write_bytes(b"half")
    if kind == "staged":
        with staged_files(path):
            pass
    else:
        save_bundle(path, {"method": "dsvdd"}, {}, {"c": np.ones(2)}, overwrite=True)
    assert not stale.exists()


def test_machines_whose_names_begin_alike_and_containers_of_one_name_are_told_apart(
    monkeypatch,
):
    """Hostile round 48, 2: names cut to 16 letters made `cyto-scoring-worker-0` and `-1` one
    machine (pods sharing a volume, each with its own process ids), and a run on one removed the
    other's live staging folder."""
    import socket

    tags = set()
    for name in ("cyto-scoring-worker-0", "cyto-scoring-worker-1"):
        monkeypatch.setattr(socket, "gethostname", lambda name=name: name)
        tags.add(staging._host())
    spaces = iter(["pid:[4026531836]", "pid:[4026532999]"])
    monkeypatch.setattr(socket, "gethostname", lambda: "same-name")
    monkeypatch.setattr(os, "readlink", lambda path: next(spaces))
    tags |= {staging._host(), staging._host()}
    assert len(tags) == 4, tags


def test_a_folder_that_takes_no_staging_is_named_itself(tmp_path, monkeypatch):
    """Hostile round 48, 6: a writable bundle in a read-only folder: export and calibrate named
    the hidden staging folder they could not make (".X.cyto.staged-...: read-only"). The
    error names the folder that must take it."""
    import errno
    import tempfile

    from cyto.errors import system_words

    def read_only(prefix, dir):
        raise OSError(errno.EROFS, "Read-only file system", f"{dir}/{prefix}abc")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(OSError) as caught:
        staging.dir_beside(tmp_path / "X.cyto", "staged")
    assert system_words(caught.value) == f"{tmp_path}: the file system is read-only"
