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
- :func:`calibrate`: calibrate a bundle on slide-negative slides, for p-values, FDR flags and
  burden (``cyto calibrate``);
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

import sys as _sys
import types as _types

from cyto.cachedir import cache_dir, set_numba_cache_dir
from cyto.version import __version__

#: the public API, re-exported lazily from :mod:`cyto.api`
_API = (
    "load_model",
    "score_slide",
    "train",
    "export",
    "predict",
    "info",
    "calibrate",
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

    def __get__(self, obj, objtype=None):
        # a descriptor without __set__ is what inspect.isroutine calls a method descriptor:
        # help() then documents this as the call, signature first, where it showed the doc
        # under no parameters (hostile round 56, 8)
        return self


class _Package(_types.ModuleType):
    """The ``cyto`` module: its shared names answer with a :class:`_SharedName`, whatever the
    import system bound there (a property outranks the module's own attributes)."""


#: one class per shared name, named as the call: ``help(cyto.train)`` is headed "train in
#: cyto", where it was "_SharedName in cyto" (help names an object of no function's type by it)
_SHARED_TYPES = {
    n: type(n, (_SharedName,), {"__slots__": (), "__doc__": _SharedName.__dict__["__doc__"]})
    for n in _SHARED
}

for _name in _SHARED:
    setattr(
        _Package,
        _name,
        property(
            lambda _self, _n=_name: _SHARED_TYPES[_n](_n),
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


set_numba_cache_dir()
