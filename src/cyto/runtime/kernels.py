"""numba's kept kernels: derived engines too, loaded only from files a record vouches for.

The scorer heads' finishes are numba kernels compiled with ``cache=True``: numba keeps their
machine code in cyto's cache (``$NUMBA_CACHE_DIR``, :func:`cyto.cachedir.numba_cache_dir`) as
an index (``.nbi``) and pickled object code (``.nbc``), and loads it in the next process without
any check of its own. A damaged index stops the run with a raw unpickling error; damaged machine
code can load and compute other scores. So the rule of :mod:`cyto.runtime.derived` holds here
too, in numba's own files:

1. After the kernels have run in a process (:meth:`cyto.runtime.scorer.Scorer.warm`, and at
   its exit), every kept kernel file is recorded: its name, sha256 and size, in
   ``cyto-kernels.json`` beside them, written last (:func:`record`).
2. Before any kernel loads in a process (the heads' package runs :func:`guard` as it is
   imported), every kept kernel file that its record does not vouch for is removed, so numba
   compiles that kernel anew; a file the record names whose bytes changed is said once, in one
   line (a file numba wrote in a process that did not get to record it is removed quietly).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
from pathlib import Path

from cyto.cachedir import NUMBA_MOVE_SAID_ELSEWHERE
from cyto.errors import warn_caller
from cyto.tables import json_text

RECORD = "cyto-kernels.json"
RECORD_FORMAT = "cyto-numba-kernels"
SUFFIXES = (".nbi", ".nbc")

_guarded: set[Path] = set()


def cache_folder() -> Path:
    """numba's cache folder as cyto set it (importing :mod:`cyto` sets ``NUMBA_CACHE_DIR``)."""
    from cyto.cachedir import numba_cache_dir

    return Path(numba_cache_dir())


def moved_why(folder: Path | str) -> str | None:
    """Why numba's kernels are kept in ``folder``, a temp folder, not in cyto's cache (None:
    they are not moved)."""
    from cyto.cachedir import NUMBA_MOVED

    return NUMBA_MOVED.get(str(folder))


def _kept(folder: Path) -> dict[str, Path]:
    """numba's kernel files under ``folder``, by their path relative to it."""
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p
        for p in folder.rglob("*")
        if p.suffix in SUFFIXES and p.is_file() and ".tmp." not in p.name
    }


def _digest(path: Path) -> tuple[str, int] | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest(), len(data)


def _read(folder: Path) -> dict[str, dict]:
    return _read_record(folder)[0]


def _read_record(folder: Path) -> tuple[dict[str, dict], bool]:
    """(the files ``folder``'s record vouches for, whether the record is there but does not
    read as one: not JSON, or not this cyto's format); ({}, False) where there is none."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except OSError:
        return {}, False
    except ValueError:
        return {}, True
    ours = isinstance(record, dict) and record.get("format") == RECORD_FORMAT
    files = record.get("files") if ours else None
    return (files, False) if isinstance(files, dict) else ({}, True)


def _lock(folder: Path):
    from cyto.locks import file_lock

    folder.mkdir(parents=True, exist_ok=True)
    return file_lock(folder / ".kernels.lock")


def guard(folder: Path | None = None) -> list[str]:
    """Remove every kept kernel file under ``folder`` (numba's cache) that its record does not
    vouch for; returns the names of those the record named whose bytes changed (said once as a
    :class:`~cyto.errors.CytoWarning`). Runs once per folder and process."""
    from cyto.errors import CytoWarning

    folder = Path(folder) if folder is not None else cache_folder()
    if folder in _guarded:
        return []
    _guarded.add(folder)
    atexit.register(_record_quietly, folder)
    moved = moved_why(folder)
    if moved and str(folder) not in NUMBA_MOVE_SAID_ELSEWHERE:
        warn_caller(
            f"{moved}: numba's kernels are kept in {folder} instead (remove what is there, or "
            "make it a folder you can write, to keep them in cyto's cache)",
            CytoWarning,
        )
    changed = []
    try:
        with _lock(folder):
            files, damaged = _read_record(folder)
            if damaged and _kept(folder):  # every kept kernel goes: said so
                from cyto.reuse import say_damaged_record

                say_damaged_record(
                    folder / RECORD, "the record of numba's kept kernels", "compiled anew"
                )
            # something else under a kernel file's name (a folder): numba's load would end in
            # a raw IsADirectoryError; it is no kernel, and goes
            for odd in [p for p in folder.rglob("*") if p.suffix in SUFFIXES and p.is_dir()]:
                import shutil

                shutil.rmtree(odd, ignore_errors=True)
                changed.append(odd.relative_to(folder).as_posix())
            for name, path in _kept(folder).items():
                known = files.get(name)
                got = _digest(path)
                if isinstance(known, dict) and got == (known.get("sha256"), known.get("size")):
                    continue
                if isinstance(known, dict):
                    changed.append(name)
                with contextlib.suppress(OSError):
                    path.unlink()
    except OSError:  # a cache that cannot be written: numba cannot keep kernels there either
        return []
    if changed:
        warn_caller(
            f"kept numba kernel {changed[0]}"
            + (f" and {len(changed) - 1} other(s)" if len(changed) > 1 else "")
            + f" in {folder} did not match its record (changed or damaged): not loaded; "
            "compiled anew",
            CytoWarning,
        )
    return changed


def record(folder: Path | None = None) -> None:
    """Record every kept kernel file under ``folder`` (numba's cache) as it is now: called
    after the kernels ran in this process, so what numba wrote is what the record names."""
    from cyto.bundle import atomic_write

    folder = Path(folder) if folder is not None else cache_folder()
    with _lock(folder):
        files = {}
        for name, path in sorted(_kept(folder).items()):
            got = _digest(path)
            if got is not None:
                files[name] = {"sha256": got[0], "size": got[1]}
        if files == _read(folder):
            return
        body = {"format": RECORD_FORMAT, "version": 1, "files": files}
        atomic_write(folder / RECORD, json_text(body, indent=1, sort_keys=True).encode())


def _record_quietly(folder: Path) -> None:
    with contextlib.suppress(OSError):
        record(folder)


class KeptKernel:
    """A numba kernel whose kept machine code, when it fails to load (a file damaged in a way
    its record vouches for: a record edited to match it), is removed and compiled anew, said
    once in one line, never a raw LLVM or unpickling traceback. An error the kernel compiled
    anew meets too is the kernel's own, and raised as it is. Anything else (``signatures``,
    ``py_func``) is the dispatcher's."""

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.__doc__ = dispatcher.py_func.__doc__
        self.__name__ = dispatcher.py_func.__name__
        self.__wrapped__ = dispatcher.py_func

    def __getattr__(self, name: str):
        return getattr(self.__dict__["dispatcher"], name)

    def __call__(self, *args):
        try:
            return self.dispatcher(*args)
        except Exception as exc:  # noqa: BLE001 - which of them a damaged file raises varies
            removed = _forget_kept(self.dispatcher)
            from cyto.errors import SYSTEM_ERRORS

            # the cache took nothing (a full disk, a read-only folder): the machine's error
            unkept = isinstance(exc, OSError) and exc.errno in SYSTEM_ERRORS
            if not removed and unkept:
                # nothing kept, and the cache takes nothing (a full disk, a read-only
                # folder): compiled for this run alone, not kept (a first run on a full cache
                # stopped here: hostile round 48)
                return self._uncached(exc, args)
            if not removed:
                raise
            result = self.dispatcher(*args)  # compiled anew; its own error, if any, is raised
            from cyto.errors import CytoWarning, first_line

            if unkept:
                # the kernel could not be written (a full cache disk): none was kept to load
                # (the line said a kept kernel "did not load": hostile round 47, 8)
                said = _not_kept_words(removed[0], exc)
            else:
                said = (
                    f"kept numba kernel {removed[0]} did not load ({first_line(exc)}): removed "
                    "and compiled anew"
                )
            warn_caller(said, CytoWarning)
            return result

    def _uncached(self, exc: OSError, args):
        import numba

        from cyto.errors import CytoWarning

        options = {k: v for k, v in self.dispatcher.targetoptions.items() if k != "cache"}
        self.dispatcher = numba.njit(**options)(self.dispatcher.py_func)
        result = self.dispatcher(*args)
        warn_caller(_not_kept_words(self.__name__, exc), CytoWarning)
        return result


def _not_kept_words(name: str, exc: OSError) -> str:
    """The line for a kernel the cache could not take (a full disk, a read-only folder)."""
    from cyto.errors import SYSTEM_ERRORS

    return (
        f"numba kernel {name} could not be kept in cyto's cache "
        f"({SYSTEM_ERRORS[exc.errno]}): compiled for this run only"
    )


def _forget_kept(dispatcher) -> list[str]:
    """Remove the kept files (index and machine code) of ``dispatcher``'s kernel; their names."""
    files = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    folder, index = getattr(files, "_cache_path", None), getattr(files, "_index_name", None)
    if not folder or not isinstance(index, str):
        return []
    folder = Path(folder)
    stem = index[: -len(".nbi")] if index.endswith(".nbi") else index
    removed = []
    for path in sorted(folder.glob(f"{stem}*")):
        if path.suffix in SUFFIXES:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    return removed
