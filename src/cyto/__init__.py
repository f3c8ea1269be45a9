"""cyto: one-class detection of rare malignant cells in whole-slide cytology images.

Implements the approach of *Needle in a Haystack: One-Class Representation Learning for Detecting
Rare Malignant Cells in Computational Cytology* (Chatterjee et al., 2024).

The public Python API is these names, and only these (everything else under ``cyto.`` is internal
and may change without notice):

- :func:`load_model`: a model bundle as a scorer verified on this machine (``.score(patches)``);
- :func:`score_slide`: score every cell of a whole-slide image; returns the score table;
- :func:`train`: train a registered method on cell patches into a model bundle;
- :func:`export`: export a bundle to ONNX (and reduced precisions, TensorRT engines);
- :func:`predict`: score a folder of cell patches into a Parquet table;
- :func:`info`: what a model bundle is and what ``rank_by="auto"`` ranks by (``cyto info``);
- :func:`evaluate`: the paper's metrics of a score table, per class too (``cyto eval scores``);
- :func:`synth_slide`: a slide with its truth, composed from real cell crops or drawn;
- :func:`cache_dir` and ``__version__``.

The calls live in :mod:`cyto.api` and are imported on first use (PEP 562), so ``import cyto``
loads no torch, onnxruntime, pyvips or numba.

Example:
    >>> import cyto
    >>> scorer = cyto.load_model("dsvdd.cyto")
    >>> table = cyto.score_slide("slide.ndpi", scorer, "scored/slide")
"""

import errno as _errno
import os as _os
import re as _re
import sys as _sys
import tempfile as _tempfile
import types as _types
from pathlib import Path as _Path

__version__ = "0.1.0"

#: the public API, re-exported lazily from :mod:`cyto.api`
_API = (
    "load_model",
    "score_slide",
    "train",
    "export",
    "predict",
    "info",
    "evaluate",
    "synth_slide",
)
#: public calls that share their name with a subpackage or module of cyto (``cyto.train`` is
#: also the training package): see :class:`_SharedName`
_SHARED = ("train", "export", "predict")
__all__ = ["__version__", "cache_dir", *_API]


def _api_call(name: str):
    from cyto import api

    return getattr(api, name)


class _SharedName:
    # ``cyto.train(...)`` is the public call; ``cyto.train.loop`` is still the training
    # package's module. Python binds ``cyto.train`` to the subpackage when it is first imported
    # (by any code), which would hide the call, so the package root answers ``cyto.train`` with
    # this object: calling it runs the call, any attribute it is asked for is the subpackage's
    # (``import cyto.train.loop as m`` and ``monkeypatch.setattr("cyto.predict.x", ...)`` go
    # on working); its doc and signature are the call's.
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return _api_call(self._name)(*args, **kwargs)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return _api_call(self._name).__doc__

    @property
    def __wrapped__(self):  # what inspect.signature and help() follow
        return _api_call(self._name)

    def _module(self):
        import importlib

        return importlib.import_module(f"{__name__}.{self._name}")

    def __getattr__(self, attr: str):
        return getattr(self._module(), attr)

    def __setattr__(self, attr: str, value) -> None:
        setattr(self._module(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._module(), attr)

    def __repr__(self) -> str:
        return f"<cyto.{self._name}: the public call (cyto.api.{self._name}) and the module>"


class _Package(_types.ModuleType):
    """The ``cyto`` module: its shared names answer with a :class:`_SharedName`, whatever the
    import system bound there (a property outranks the module's own attributes)."""


for _name in _SHARED:
    setattr(
        _Package,
        _name,
        property(
            lambda _self, _n=_name: _SharedName(_n),
            lambda self, value, _n=_name: self.__dict__.__setitem__(_n, value),
        ),
    )
_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    """The public calls of :mod:`cyto.api`, imported when first asked for (PEP 562)."""
    if name in _API:
        value = _api_call(name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'cyto' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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


def _numba_cache_dir() -> str:
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


_os.environ["NUMBA_CACHE_DIR"] = _numba_cache_dir()
if "numba" in _sys.modules:  # numba read its settings already: tell it too
    _sys.modules["numba"].config.CACHE_DIR = _os.environ["NUMBA_CACHE_DIR"]
