"""One writer per output folder.

:class:`OutputLock` holds an exclusive ``flock`` on ``FOLDER/.lock`` for a whole run, so a
second run into the same folder (a double-click, an overlapping cron job: ``cyto score`` of one
slide, ``cyto eval sweep``) is refused with the first one's PID, host and start time. The kernel
drops the lock when its process dies, so a lock left by a killed run is stale and taken over.

A file system that cannot lock at all (NFS without its lock daemon: ``ENOLCK``) does not stop the
work: :func:`flock_or_not` says so, and the run goes on unlocked (with a warning where a second
run would no longer be refused).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from cyto.errors import CytoWarning, OutputBusyError, warn_caller
from cyto.tables import json_text

LOCK = ".lock"
#: how long a run tries again for a lock that a reader's look (:func:`held`) may hold
PROBE_GRACE_S = 0.25
#: what flock answers on a file system that cannot lock
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def flock_or_not(fh, operation: int) -> bool:
    """``fcntl.flock(fh, operation)``; False where the file system cannot lock (the caller goes
    on unlocked, as it must there), any other failure raised (``LOCK_NB``'s BlockingIOError
    too)."""
    import fcntl

    try:
        fcntl.flock(fh, operation)
    except OSError as exc:
        if exc.errno not in NO_LOCKS:
            raise
        return False
    return True


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing) for the block: one writer at a time
    of what it guards (the cohort table, the engines index); unlocked where the file system
    cannot lock. Closing the file drops the lock."""
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: the atomic renames still hold
            yield
            return
        flock_or_not(fh, fcntl.LOCK_EX)
        yield


def another_out() -> str:
    """The way out of a busy output, in the caller's words (said when refused, not when made)."""
    from cyto.flags import said

    return f"give another {said('out')}"


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the folder ``folder`` itself for the block (no lock file is
    left beside what it guards): one writer at a time of what is made in it; unlocked where
    the file system cannot lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        flock_or_not(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def held(folder: Path) -> bool:
    """Whether a run holds ``folder``'s lock now (an :class:`OutputLock`), asked without taking
    it or writing to it: a shared lock tried and let go at once. False where there is no lock
    file, or the file system cannot lock."""
    import fcntl

    try:
        fh = open(Path(folder) / LOCK)  # noqa: SIM115 - closed below
    except OSError:
        return False
    try:
        if flock_or_not(fh, fcntl.LOCK_SH | fcntl.LOCK_NB):
            fcntl.flock(fh, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        fh.close()


class OutputLock:
    """One writer per output folder (see the module docstring): ``command`` names the kind of
    run in the refusal, ``instead`` what the user can do about it (None: give another output,
    in the caller's words: ``--out`` at the command line, ``out=`` from Python)."""

    def __init__(
        self, folder: Path, command: str = "cyto score", instead: str | None = None
    ) -> None:
        self.folder = Path(folder)
        self.command, self.instead = command, instead
        self.path = self.folder / LOCK
        self._fh = None

    def acquire(self) -> OutputLock:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held open for the whole run
        # a reader's look (held(): a shared lock taken and let go at once, by view, review,
        # data cells, calibrate, eval or a watch's poll) holds it for microseconds: a run
        # that met one was refused as busy, "pid ? on ?" (hostile round 48, 3: 289 of 3000
        # tries beside a polling process). A run's own holds for the whole run: tried again
        # for a moment before the refusal
        deadline = time.monotonic() + PROBE_GRACE_S
        while True:
            try:
                if not flock_or_not(fh, fcntl.LOCK_EX | fcntl.LOCK_NB):
                    warn_caller(
                        f"{self.folder}: this file system cannot lock files, so another "
                        f"{self.command} into this folder at the same time would not be refused",
                        CytoWarning,
                    )
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                error = self._refusal(self._holder(fh))
                fh.close()
                raise error from None
        fh.seek(0)
        fh.truncate()
        fh.write(
            json_text(
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

    def _holder(self, fh) -> str:
        """'FOLDER is being written by another COMMAND (pid N on HOST, since T)': the run that
        holds the lock, by what it wrote in it."""
        fh.seek(0)
        try:
            holder = json.loads(fh.read() or "{}")
        except json.JSONDecodeError:
            holder = {}
        return (
            f"{self.folder} is being written by another {self.command} (pid "
            f"{holder.get('pid', '?')} on {holder.get('host', '?')}, since "
            f"{holder.get('started', '?')})"
        )

    def _refusal(self, who: str) -> OutputBusyError:
        """The refusal of this run, naming the run that holds the lock (:meth:`_holder`)."""
        return OutputBusyError(f"{who}; wait for it to finish, or {self.instead or another_out()}")

    def holder(self) -> str | None:
        """Who holds the folder now (:meth:`_holder`'s words), asked without taking the lock or
        writing anything (:func:`held`); None where the folder is free (or cannot lock)."""
        if not held(self.folder):
            return None
        try:
            with open(self.path) as fh:
                return self._holder(fh)
        except OSError:  # the holder finished between the two looks
            return None

    def busy(self) -> OutputBusyError | None:
        """The refusal :meth:`acquire` would raise now (:meth:`holder`); None where the folder
        is free. A run asks before its slow start (loading a model) so that its refusal comes
        first."""
        who = self.holder()
        return None if who is None else self._refusal(who)

    def release(self) -> None:
        if self._fh is not None:
            self.path.unlink(missing_ok=True)
            self._fh.close()  # closing drops the flock
            self._fh = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
