"""cyto's user cache folder (:func:`cache_dir`, re-exported as ``cyto.cache_dir``) and where numba
keeps its compiled kernels. A bottom module: the package root and every layer import it, it imports
only :mod:`cyto.errors` (inside functions)."""

import errno as _errno
import inspect as _inspect
import os as _os
import sys as _sys
import tempfile as _tempfile
from pathlib import Path as _Path


def cache_dir(*given, **named) -> _Path:
    """cyto's user cache: ``$CYTO_CACHE_DIR``, ``$XDG_CACHE_HOME/cyto`` or ``~/.cache/cyto``
    (never the installed source tree); a private folder in the temp dir where that is not
    writable. It takes no arguments (one line, as every public call refuses what it does not
    take)."""
    if given or named:
        from cyto.errors import ConfigError

        raise ConfigError(
            "cache_dir takes no arguments (set CYTO_CACHE_DIR to choose the folder), got "
            f"{len(given) + len(named)}"
        )
    return _cache_dir(say=True)


# help() and inspect.signature show what it takes, nothing (round 64, 9: "(*given, **named)")
cache_dir.__signature__ = _inspect.Signature(return_annotation=_Path)  # type: ignore[attr-defined]


def _cache_dir(say: bool) -> _Path:
    """:func:`cache_dir`; ``say``: warn of a fallback folder (not while cyto is imported, where
    the warning was printed raw, ``<frozen runpy>:112: CytoWarning: ...``, before the command
    line's one-line form was set up: hostile round 41, 4; the command's own first use says it)."""
    # blanks around the path, ~, a URL and a relative path: one reading of every folder a
    # variable names (cyto.envvars.env_folder; they made ./~/x, './ /x' and ./s3:/b here)
    from cyto.envvars import env_folder

    folder = env_folder("CYTO_CACHE_DIR")
    asked = None if folder is None else str(folder)
    root = asked or _os.path.join(
        _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache"),
        "cyto",
    )
    path = _Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not _os.access(path, _os.W_OK):
            raise PermissionError(_errno.EACCES, "not writable")
    except OSError as exc:
        why = _why_not_a_folder(path, exc)
        if asked:  # the folder the user named: never another one without a word
            from cyto.errors import ConfigError

            raise ConfigError(
                f"CYTO_CACHE_DIR={asked} cannot be cyto's cache folder ({why}): point it at a "
                "folder you can write, or unset it"
            ) from None
        # a read-only home: a private folder in the temp dir, said once per process
        path = private_temp("cyto-cache")
        if say and root not in _SAID_CACHE:
            _SAID_CACHE.add(root)
            from cyto.errors import CytoWarning, warn_caller

            warn_caller(
                f"cyto's cache folder {root} cannot be written ({why}); using {path} (set "
                "CYTO_CACHE_DIR to choose one)",
                CytoWarning,
            )
    return path


def _why_not_a_folder(path: _Path, exc: OSError) -> str:
    """Why the folder ``path`` could not be made or written, as what stands there (a broken
    link read "File exists": hostile round 54, 6)."""
    if path.is_symlink() and not path.exists():
        return f"a broken link to {_os.readlink(path)}"
    if path.is_file():
        return "a file, not a folder"
    return exc.strerror or type(exc).__name__


#: the cache folders whose fallback was said (once per process)
_SAID_CACHE: set[str] = set()


def numba_cache_dir() -> str:
    """Where numba keeps compiled kernels: ``$NUMBA_CACHE_DIR`` when set, else cyto's user cache
    (:func:`cache_dir`)."""
    if _os.environ.get("NUMBA_CACHE_DIR"):
        return _os.environ["NUMBA_CACHE_DIR"]
    try:
        path = _cache_dir(say=False) / "numba"
    except Exception:  # noqa: BLE001 (an unusable CYTO_CACHE_DIR is said where cyto uses it)
        return str(private_temp("cyto-numba"))
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not _os.access(path, _os.W_OK):
            raise PermissionError(_errno.EACCES, "not writable")
    except OSError as exc:
        # said where a kernel is first used (cyto.runtime.kernels.guard) and by cyto doctor:
        # the kernels moved to the temp dir without a word (hostile round 53, 6)
        why = _why_not_a_folder(path, exc)
        fallback = private_temp("cyto-numba")
        NUMBA_MOVED[str(fallback)] = f"{path} cannot be written ({why})"
        path = fallback
    return str(path)


#: numba's kernel folder in the temp dir, by that folder, with why cyto's cache could not keep
#: them (:func:`numba_cache_dir`)
NUMBA_MOVED: dict[str, str] = {}
#: such folders whose move a caller says itself (cyto doctor, in its numba row: the warning at
#: the first kernel used was said beside it, hostile round 54, 11); set before cyto.runtime
#: is imported, which uses the first kernel
NUMBA_MOVE_SAID_ELSEWHERE: set[str] = set()


def private_temp(name: str) -> _Path:
    """``NAME-UID`` in the temp dir, this user's alone (0700): where a cache falls back to when
    its folder cannot be written. It holds compiled kernels (code that is loaded), verification
    records and slides' cells, so a folder of that name that another user made, or one others
    could write into, is never taken; one of this user's that others could read is closed (the
    fallback was made 0755, and another user's 0777 folder was taken without a word: hostile
    round 41, 3). Passed over, the next of ``NAME-UID-1`` .. ``-15`` that can be this user's is
    taken, so that the next run finds it again (a fresh random folder at every call kept
    nothing and filled the temp dir: hostile round 42, 1); the same folder all the process."""
    if name in _PRIVATE:
        return _PRIVATE[name]
    uid = getattr(_os, "getuid", lambda: 0)()
    root = _Path(_tempfile.gettempdir())
    for candidate in [root / f"{name}-{uid}", *(root / f"{name}-{uid}-{i}" for i in range(1, 16))]:
        if _own_private(candidate, uid):
            _PRIVATE[name] = candidate
            return candidate
    _PRIVATE[name] = _Path(_tempfile.mkdtemp(prefix=f"{name}-{uid}-"))  # 0700, this user's
    return _PRIVATE[name]


#: the private temp folder of each name, chosen once per process (:func:`private_temp`)
_PRIVATE: dict[str, _Path] = {}


def _own_private(path: _Path, uid: int) -> bool:
    """Made (0700), or found this user's and closed to others' writes (closed to their reads
    too); False for a folder another user made or others could write into, or a file."""
    import stat

    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = _os.lstat(path)
        # not this user's, or one others could write into (what is in it may be theirs)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
            return False
        if st.st_mode & 0o077:  # this user's, readable by others (an earlier cyto's): closed
            _os.chmod(path, 0o700)
    except OSError:
        return False
    return True


def set_numba_cache_dir() -> None:
    """Point numba at :func:`numba_cache_dir` (the package root does this when cyto is imported)."""
    _os.environ["NUMBA_CACHE_DIR"] = numba_cache_dir()
    if "numba" in _sys.modules:  # numba read its settings already: tell it too
        _sys.modules["numba"].config.CACHE_DIR = _os.environ["NUMBA_CACHE_DIR"]


def size_words(n: int) -> str:
    """A size of what the cache holds, in words: ``1.5 GiB``, ``412.0 KiB``, ``12 B``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def places_of(values) -> tuple:
    """:data:`cyto.errors.PLACES` of a command or call given ``values`` (its arguments as
    given: the paths among them, and in lists of them): those paths, then cyto's cache (where
    a full disk that names no file is looked for), named only if one is met: resolved now, the
    cache's fallback was said before the command ran (doctor's row)."""
    paths = (
        v
        for value in values
        for v in (value if isinstance(value, (list, tuple)) else (value,))
        if isinstance(v, _Path)
    )
    return (*dict.fromkeys(str(p) for p in paths), cache_dir)
