"""Scorer heads, one module each: its arrays, its numba finish, its torch form, its description.

Adding a head means adding one module here (and importing it below).
"""

from __future__ import annotations

from cyto.runtime import kernels

kernels.guard()  # before any head's kernel loads: only kept kernels their record vouches for

from cyto.runtime.heads import dsvdd, knn, logit, ocsvm, softmax  # noqa: E402, F401 - they register
from cyto.runtime.heads.base import Head  # noqa: E402
from cyto.runtime.heads.registry import HEADS, head_class  # noqa: E402


def head_for(bundle) -> Head:
    """The head of a loaded bundle, with its arrays."""
    spec = bundle.spec
    cls = head_class(spec.head, bundle.path)
    cls.require(bundle.scorer, bundle.path)
    return cls.from_bundle(spec, bundle.scorer)


__all__ = ["HEADS", "Head", "head_class", "head_for"]
