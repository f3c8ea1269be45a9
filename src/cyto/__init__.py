"""cyto: one-class detection of rare malignant cells in whole-slide cytology images.

Implements the approach of *Needle in a Haystack: One-Class Representation Learning for Detecting
Rare Malignant Cells in Computational Cytology* (Chatterjee et al., 2024).
"""

import os as _os
import sys as _sys
import tempfile as _tempfile
from pathlib import Path as _Path

__version__ = "0.1.0"


def cache_dir() -> _Path:
    """cyto's user cache: ``$CYTO_CACHE_DIR``, ``$XDG_CACHE_HOME/cyto`` or ``~/.cache/cyto``
    (never the installed source tree); a private folder in the temp dir where that is not
    writable."""
    root = _os.environ.get("CYTO_CACHE_DIR") or _os.path.join(
        _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache"),
        "cyto",
    )
    path = _Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not _os.access(path, _os.W_OK):
            raise PermissionError(path)
    except OSError:  # a read-only home
        path = _Path(_tempfile.gettempdir()) / f"cyto-cache-{getattr(_os, 'getuid', lambda: 0)()}"
    return path


def _numba_cache_dir() -> str:
    """Where numba keeps compiled kernels: ``$NUMBA_CACHE_DIR`` when set, else cyto's user cache
    (:func:`cache_dir`)."""
    if _os.environ.get("NUMBA_CACHE_DIR"):
        return _os.environ["NUMBA_CACHE_DIR"]
    path = cache_dir() / "numba"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not _os.access(path, _os.W_OK):
            raise PermissionError(path)
    except OSError:
        path = _Path(_tempfile.gettempdir()) / f"cyto-numba-{getattr(_os, 'getuid', lambda: 0)()}"
    return str(path)


_os.environ["NUMBA_CACHE_DIR"] = _numba_cache_dir()
if "numba" in _sys.modules:  # numba read its settings already: tell it too
    _sys.modules["numba"].config.CACHE_DIR = _os.environ["NUMBA_CACHE_DIR"]
