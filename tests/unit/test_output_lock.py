"""A run's lock of its output folder against readers' looks (hostile round 48, 3: a reader's
look at whether a run is writing a folder, a shared lock taken and let go at once, made a
`cyto score` starting at that moment fail as busy, "pid ? on ?", 289 of 3000 tries)."""

from __future__ import annotations

import os
import threading

from cyto.errors import OutputBusyError
from cyto.locks import OutputLock, held


def test_a_run_is_never_refused_for_a_readers_look(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    stop = threading.Event()
    looks = [0]

    def look() -> None:  # as view, review, data cells or a watch's poll do, without pause
        while not stop.is_set():
            held(folder)
            looks[0] += 1

    reader = threading.Thread(target=look)
    reader.start()
    refused = 0
    try:
        for _ in range(300):
            try:
                OutputLock(folder).acquire().release()
            except OutputBusyError:
                refused += 1
    finally:
        stop.set()
        reader.join()
    assert looks[0] > 300 and refused == 0, (looks[0], refused)


def test_a_run_that_holds_the_folder_still_refuses_the_second(tmp_path):
    folder = tmp_path / "s"
    with OutputLock(folder):
        assert held(folder)
        try:
            OutputLock(folder).acquire()
        except OutputBusyError as exc:
            assert f"pid {os.getpid()} on " in str(exc)
        else:
            raise AssertionError("a second run into a held folder was let in")
    assert not held(folder)
