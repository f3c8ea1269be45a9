"""The bound on the viewer's tile cache, ``cyto.cache_dir()/view-tiles/``: whole slide folders
evicted, least recently used first, once the folder holds more than a cap.

- **The cap**: ``cyto view --tile-cache SIZE``, else ``$CYTO_VIEW_TILE_CACHE``, else
  :data:`DEFAULT_CAP` (``4GiB``, ``500MB``, ``0``: keep only the slides being shown).
- **Last use** is the time of the folder's ``used`` file (touched when a server opens the
  slide, about once a minute while it serves its tiles, and when it stops), so the order survives
  restarts and file systems mounted without access times. A folder made before this file existed
  counts from its ``key.json``.
- **A slide being shown is never evicted**: each server holds a shared ``flock`` on its slides'
  ``KEY/.lock``; the evictor takes that lock exclusively without waiting, and skips the folder
  when it cannot (another ``cyto view`` shows it). It renames an evicted folder to a hidden name
  in the same place before deleting it, so a server opening that slide meanwhile re-checks its
  lock (:func:`hold`) and starts a fresh folder instead of writing into one being deleted. A tile
  deleted under a server anyway (a cache emptied by hand, a file system without locks) is read
  from the slide again (:meth:`cyto.view.tiles.TilePyramid.read`).
- **When**: as a server starts, and again when the bytes it has written since the last check
  take the folder past the cap (a running count: no walk of the folder per tile).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from pathlib import Path

from cyto.envvars import env_text
from cyto.errors import ConfigError

#: the environment variable that sets the cap when ``--tile-cache`` is not given
CAP_ENV = "CYTO_VIEW_TILE_CACHE"
DEFAULT_CAP = 4 * 2**30
DEFAULT_WORDS = "4GiB"
FOLDER = "view-tiles"
#: a slide folder's last-use marker (its time) and the lock its servers hold shared
USED, LOCK = "used", ".lock"
#: how often a server touches ``used`` while it serves a slide's tiles (seconds)
TOUCH_EVERY_S = 60.0
#: when the slides being shown alone exceed the cap, the next check waits for this many more
#: bytes (a sixteenth of the cap, at least 16 MiB), not for the next tile
SLACK_MIN = 16 * 2**20
#: where an evicted folder goes before it is deleted (same file system: a rename)
TRASH = ".evicted-"

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SI = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str, what: str = "--tile-cache") -> int:
    """Bytes of a size written ``4GiB``, ``4G`` (binary), ``4GB`` (decimal), ``500MiB`` or a
    plain number of bytes; a one-line :class:`~cyto.errors.ConfigError` naming ``what``
    otherwise."""
    m = _SIZE.match(str(text))
    if not m or (m.group(3) and not m.group(2)):
        raise ConfigError(
            f"{what} {text!r} is not a size: give it like 4GiB, 500MB or 0 (only the slides "
            "being shown are kept)"
        )
    number, unit, binary, b = m.groups()
    unit = unit.lower()
    scale = _SI[unit] if unit and b and not binary else _UNITS[unit]
    return int(float(number) * scale)


def cap_source(value: str | int | None) -> str:
    """What set the cap :func:`cap_from` gives for ``value``, as said beside it: the flag, the
    variable, or the default (the variable's cap was credited to --tile-cache: hostile round
    41, 12)."""
    if value is not None:
        return "--tile-cache"
    if env_text(CAP_ENV):
        return f"${CAP_ENV}"
    return "the default; --tile-cache or $" + CAP_ENV + " sets it"


def cap_from(value: str | int | None) -> int:
    """The cap in bytes: ``value`` (``--tile-cache``), else ``$CYTO_VIEW_TILE_CACHE``, else
    :data:`DEFAULT_CAP`."""
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"--tile-cache {value} is not a size: give 0 or more bytes")
        return value
    if value is not None:
        return parse_size(value)
    env = env_text(CAP_ENV)
    if env:
        return parse_size(env, f"${CAP_ENV}")
    return DEFAULT_CAP


def _flock(fd: int, operation: int) -> bool:
    """:func:`cyto.locks.flock_or_not` on a descriptor; True where there is no ``fcntl`` (not
    POSIX: there is no lock to take, and a vanished tile is rendered again)."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - not POSIX
        return True
    from cyto.locks import flock_or_not

    return flock_or_not(fd, operation)


def hold(folder: Path) -> int | None:
    """A descriptor holding a shared lock on ``folder/.lock`` (the folder made if missing), so
    no evictor removes the folder while it is held; close it to let go. None where the file
    system cannot lock. The lock file is checked to be still the folder's after the lock is
    taken: an evictor may have renamed the folder away meanwhile, and then a fresh one is made."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    for _ in range(100):
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # renamed away between the two calls
            continue
        if not _flock(fd, fcntl.LOCK_SH):
            os.close(fd)
            return None
        try:
            if os.stat(folder / LOCK).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(f"{folder}: the tile cache folder keeps being removed while it is opened")


def touch(folder: Path) -> None:
    """Record a use of ``folder`` now (its ``used`` file's time)."""
    with contextlib.suppress(OSError):
        (folder / USED).touch()


def _tree_bytes(path: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:  # removed meanwhile
        return 0
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                total += _tree_bytes(Path(e.path))
            else:
                total += e.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def _last_use(folder: Path) -> float:
    for name in (USED, "key.json"):
        with contextlib.suppress(OSError):
            return (folder / name).stat().st_mtime
    with contextlib.suppress(OSError):
        return folder.stat().st_mtime
    return 0.0


class TileCache:
    """The ``view-tiles`` folder under ``cache_root`` kept to ``cap`` bytes (see the module
    docstring). :meth:`trim` evicts; :meth:`wrote` counts what a server adds and trims when the
    count takes the folder past the cap."""

    def __init__(self, cache_root: Path, cap: int = DEFAULT_CAP) -> None:
        self.root = Path(cache_root) / FOLDER
        self.cap = int(cap)
        self.keep: set[str] = set()  # this process's slides: never evicted by it
        self.total = 0  # bytes in the folder at the last trim, less what it evicted
        self.added = 0  # bytes this process wrote since
        self._check_at = self.cap
        self._count = threading.Lock()
        self._trimming = threading.Lock()

    def folder(self, key: str) -> Path:
        return self.root / key

    def trim(self) -> list[str]:
        """Evict least recently used slide folders until the folder holds at most the cap;
        never those of :attr:`keep` nor any another process holds. The names evicted, oldest
        first."""
        import fcntl

        with self._count:
            self.added = 0
        evicted = []
        try:
            entries = [Path(e.path) for e in os.scandir(self.root) if e.is_dir()]
        except FileNotFoundError:
            entries = []
        for e in entries:
            if e.name.startswith(TRASH):  # left by an evictor that died: already evicted
                shutil.rmtree(e, ignore_errors=True)
        folders = [e for e in entries if not e.name.startswith(".")]
        sizes = {f.name: _tree_bytes(f) for f in folders}
        total = sum(sizes.values())
        for f in sorted(folders, key=_last_use):
            if total <= self.cap:
                break
            if f.name in self.keep:
                continue
            try:
                fd = os.open(f / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:  # gone meanwhile (another evictor)
                continue
            try:
                try:
                    _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another cyto view shows this slide
                trash = self.root / f"{TRASH}{f.name}-{os.getpid()}-{threading.get_ident()}"
                try:
                    os.rename(f, trash)
                except OSError:
                    continue
            finally:
                os.close(fd)
            shutil.rmtree(trash, ignore_errors=True)
            total -= sizes[f.name]
            evicted.append(f.name)
        with self._count:
            self.total = total
            # over the cap with nothing left to evict (the slides shown): wait for some slack
            over = total > self.cap
            self._check_at = total + max(self.cap // 16, SLACK_MIN) if over else self.cap
        return evicted

    def wrote(self, nbytes: int) -> None:
        """Count ``nbytes`` written into the cache; trim once the count takes it past the cap
        (in the calling thread, one trim at a time: other requests go on meanwhile)."""
        with self._count:
            self.added += nbytes
            due = self.total + self.added > self._check_at
        if due and self._trimming.acquire(blocking=False):
            try:
                self.trim()
            finally:
                self._trimming.release()


class Touch:
    """``used`` touched at most every :data:`TOUCH_EVERY_S` seconds (a tile served calls it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._last = time.monotonic()
        touch(folder)

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._last > TOUCH_EVERY_S:
            self._last = now
            touch(self.folder)
