"""One writer per output folder.

:class:`OutputLock` holds an exclusive ``flock`` on ``FOLDER/.lock`` for a whole run, so a
second run into the same folder (a double-click, an overlapping cron job: ``cyto score`` of one
slide, ``cyto eval sweep``) is refused with the first one's PID, host and start time. The kernel
drops the lock when its process dies, so a lock left by a killed run is stale and taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from cyto.errors import OutputBusyError

LOCK = ".lock"


class OutputLock:
    """One writer per output folder (see the module docstring): ``command`` names the kind of
    run in the refusal, ``instead`` what the user can do about it."""

    def __init__(
        self, folder: Path, command: str = "cyto score", instead: str = "give another --out"
    ) -> None:
        self.folder = Path(folder)
        self.command, self.instead = command, instead
        self.path = self.folder / LOCK
        self._fh = None

    def acquire(self) -> OutputLock:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held open for the whole run
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            try:
                holder = json.loads(fh.read() or "{}")
            except json.JSONDecodeError:
                holder = {}
            fh.close()
            raise OutputBusyError(
                f"{self.folder} is being written by another {self.command} (pid "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')}, since "
                f"{holder.get('started', '?')}); wait for it to finish, or {self.instead}"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                }
            )
        )
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self.path.unlink(missing_ok=True)
            self._fh.close()  # closing drops the flock
            self._fh = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
