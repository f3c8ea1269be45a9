"""Signals in the tests: an engine dying mid-slide, for the tests of resume on Ray (SIGKILL the
process that holds a slide folder's lock once a finished chunk of the slide is there), and a
child started with the signal dispositions of a terminal's command."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path


def as_in_a_terminal() -> None:
    """``preexec_fn`` of a child that a test stops by a signal as a terminal would: SIGINT and
    SIGHUP handled as a shell's foreground command has them. A child inherits SIG_IGN, so a
    suite run in a background job (SIGINT) or under ``nohup`` (SIGHUP) started cyto with them
    ignored, which cyto rightly keeps, and the tests of Ctrl-C and a closed terminal failed."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class ChunkKiller(threading.Thread):
    """Kills (SIGKILL) the process that holds a folder's lock once a chunk has been written
    there (renamed into place, not a .tmp): a worker dying mid-slide, with part of the slide
    already on disk."""

    def __init__(self, folder: Path, chunks_glob: str) -> None:
        super().__init__(daemon=True)
        self.folder, self.glob, self.killed = folder, chunks_glob, None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for chunk in self.folder.glob(self.glob):
                lock = chunk.parent.parent / ".lock"
                try:
                    pid = json.loads(lock.read_text())["pid"]
                except (OSError, ValueError, KeyError):
                    continue
                os.kill(pid, signal.SIGKILL)
                self.killed = pid
                return
            time.sleep(0.01)
