"""cyto's user cache folder (:func:`cache_dir`, re-exported as ``cyto.cache_dir``) and where numba
keeps its compiled kernels. A bottom module: the package root and every layer import it, it imports
only :mod:`cyto.errors` (inside functions)."""

import errno as _errno
import os as _os
import re as _re
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
    # blanks around the path (a .env line `CYTO_CACHE_DIR= /x`) are not the folder's, and ~ is
    # the home as a shell would make it (they made ./~/x and './ /x' here, with no word)
    asked = (_os.environ.get("CYTO_CACHE_DIR") or "").strip() or None
    if asked is not None and asked.startswith("~"):
        home = _os.path.expanduser(asked)
        if home.startswith("~"):
            from cyto.errors import ConfigError

            who = "no home folder" if asked == "~" or asked.startswith("~/") else "no such user"
            raise ConfigError(
                f"CYTO_CACHE_DIR={asked} starts with a ~ that cannot be expanded here ({who}): "
                "give the folder's absolute path"
            )
        asked = home
    root = asked or _os.path.join(
        _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache"),
        "cyto",
    )
    if asked and _re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", asked):  # made ./s3:/b/cache here
        from cyto.errors import ConfigError

        raise ConfigError(
            f"CYTO_CACHE_DIR={asked} is a URL: cyto's cache is a folder on this machine; point "
            "it at one, or unset it"
        )
    path = _Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not _os.access(path, _os.W_OK):
            raise PermissionError(_errno.EACCES, "not writable")
    except OSError as exc:
        why = "a file, not a folder" if path.is_file() else (exc.strerror or type(exc).__name__)
        if asked:  # the folder the user named: never another one without a word
            from cyto.errors import ConfigError

            raise ConfigError(
                f"CYTO_CACHE_DIR={asked} cannot be cyto's cache folder ({why}): point it at a "
                "folder you can write, or unset it"
            ) from None
        # a read-only home: a private folder in the temp dir, said once per process
        path = _Path(_tempfile.gettempdir()) / f"cyto-cache-{getattr(_os, 'getuid', lambda: 0)()}"
        if root not in _SAID_CACHE:
            _SAID_CACHE.add(root)
            from cyto.errors import CytoWarning, warn_caller

            warn_caller(
                f"cyto's cache folder {root} cannot be written ({why}); using {path} (set "
                "CYTO_CACHE_DIR to choose one)",
                CytoWarning,
            )
    return path


#: the cache folders whose fallback was said (once per process)
_SAID_CACHE: set[str] = set()


def numba_cache_dir() -> str:
    """Where numba keeps compiled kernels: ``$NUMBA_CACHE_DIR`` when set, else cyto's user cache
    (:func:`cache_dir`)."""
    if _os.environ.get("NUMBA_CACHE_DIR"):
        return _os.environ["NUMBA_CACHE_DIR"]
    try:
        path = cache_dir() / "numba"
    except Exception:  # noqa: BLE001 (an unusable CYTO_CACHE_DIR is said where cyto uses it)
        path = _Path(_tempfile.gettempdir()) / f"cyto-numba-{getattr(_os, 'getuid', lambda: 0)()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not _os.access(path, _os.W_OK):
            raise PermissionError(path)
    except OSError:
        path = _Path(_tempfile.gettempdir()) / f"cyto-numba-{getattr(_os, 'getuid', lambda: 0)()}"
    return str(path)


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
