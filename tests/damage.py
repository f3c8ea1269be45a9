"""Generated damage to a file's bytes, for the tests of what cyto keeps and checks (kept
kernels, a review's marks log): one rule, so each kind means the same in every test."""

from __future__ import annotations

import os

#: flip: one byte inverted; cut: the bytes from ``where`` on gone (at least one kept); grow:
#: a byte added; replace: random bytes of the same length; noise: up to 512 random bytes at
#: ``where``
KINDS = ("flip", "cut", "grow", "replace", "noise")


def damaged(data: bytes, kind: str, where: float) -> bytes:
    """``data`` damaged the ``kind`` way at the fraction ``where`` (0 <= where < 1) of it."""
    out = bytearray(data)
    at = int(where * len(out))
    if kind == "flip":
        out[at] ^= 0xFF
    elif kind == "cut":
        out = out[: max(at, 1)]
    elif kind == "grow":
        out += b"\0"
    elif kind == "replace":
        out = bytearray(os.urandom(len(out)))
    elif kind == "noise":
        out[at : at + 512] = os.urandom(len(out[at : at + 512]))
    else:
        raise ValueError(f"unknown damage {kind!r}; known: {', '.join(KINDS)}")
    return bytes(out)
