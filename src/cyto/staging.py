"""Folders a run builds an output in beside it, named for the process that owns them.

A run that writes a bundle, a slide, a review or a calibration builds it in a hidden folder
beside the target (``.NAME.KIND-PID@HOST-XXXX``) and renames it into place, or removes it when
it fails. A run killed outright (SIGKILL, power loss) removes nothing: a killed ``cyto synth
slide`` left its spool files (hostile round 46, 3: 460 KB for a 4096 px slide, growing with the
slide), a killed export its staging folder, and no later run took them away. The folder's name
says whose it is (``HOST``: this machine and its process-id namespace, :func:`_host`), so the
next run of the same target removes those whose process is gone from this machine (:func:`dir_
beside` does, before it makes its own), and never one of a live run: not of another run beside
it, nor of another machine or container sharing the folder (theirs are left, never guessed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _host() -> str:
    """Where a process id means one process: this machine (its whole name) and its process-id
    namespace (containers sharing a name and a volume each have their own), as 12 hex digits.
    The name cut to 16 letters made ``cyto-scoring-worker-0`` and ``-1`` one machine, and a
    run on one removed the other's live staging folder (hostile round 48, 2)."""
    import hashlib

    try:
        space = os.readlink("/proc/self/ns/pid")
    except OSError:
        space = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{space}".encode()).hexdigest()[:12]


def prefix(path: Path, kind: str) -> str:
    """The name a staging folder of ``path`` starts with: ``.NAME.KIND-PID@HOST-``."""
    return f".{Path(path).name}.{kind}-{os.getpid()}@{_host()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep(path: Path) -> list[Path]:
    """Remove the staging folders (and files) beside ``path`` that runs of this machine left
    when they were killed: those named by :func:`prefix` whose process is gone. Returns them."""
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.[a-z]+-(\d+)@([0-9a-f]{{12}})-")
    host = _host()
    gone = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return gone
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or m[2] != host or int(m[1]) == os.getpid() or _alive(int(m[1])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        gone.append(entry)
    return gone


def dir_beside(path: Path, kind: str) -> Path:
    """A new empty folder beside ``path`` to build it in (after :func:`sweep`), with the mode a
    plain ``mkdir`` gives under the umask: mkdtemp's 0700 would hide what is renamed out of it
    from the other users of a shared workstation."""
    path = Path(path)
    sweep(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=prefix(path, kind), dir=path.parent))
    except OSError as exc:
        # named by the folder that must take it, not the hidden name it was to have (a
        # writable bundle in a read-only folder was told ".X.cyto.staged-...: read-only":
        # hostile round 48, 6)
        raise OSError(exc.errno, exc.strerror, str(path.parent)) from exc
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


def umask() -> int:
    """This process's umask (read by setting it, and set back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged_dir(path: Path, kind: str) -> Iterator[Path]:
    """:func:`dir_beside` for the length of a ``with`` block, removed after it."""
    tmp = dir_beside(path, kind)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
