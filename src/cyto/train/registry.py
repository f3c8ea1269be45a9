"""The method registry: ``@register("dsvdd")`` maps a name to a method class."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from cyto.errors import ConfigError

_METHODS: dict[str, type] = {}
_MODULES = ("fssil", "wssil", "dsvdd", "droc", "its2clr")


def register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if name in _METHODS and _METHODS[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        _METHODS[name] = cls
        return cls

    return deco


def _load_all() -> None:
    for mod in _MODULES:
        importlib.import_module(f"cyto.train.{mod}")


def method_names() -> list[str]:
    _load_all()
    return sorted(_METHODS)


def get_method(name: str) -> type:
    _load_all()
    if name not in _METHODS:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]
