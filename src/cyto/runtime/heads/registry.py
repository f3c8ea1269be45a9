"""Heads by name: ``@register_head`` on the class; unknown names fail with the known ones."""

from __future__ import annotations

from cyto.errors import BundleError

HEADS: dict[str, type] = {}


def register_head(cls: type) -> type:
    if cls.name in HEADS:
        raise ValueError(f"head {cls.name!r} registered twice")
    HEADS[cls.name] = cls
    return cls


def head_class(name: str, where: object = "bundle") -> type:
    if name not in HEADS:
        raise BundleError(
            f"{where}: unknown scorer head {name!r}; this cyto knows {', '.join(sorted(HEADS))} "
            "(upgrade cyto?)"
        )
    return HEADS[name]
