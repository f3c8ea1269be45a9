"""Held-out splits of a labelled cell set: random (stratified) and by acquisition order.

A random split of cells from the same patients and sessions puts near-duplicates on both sides and
overstates how a model ranks cells of *later* patients. Public cell sets are usually numbered in
the order they were acquired (Matek et al.'s ``LYT_00001.jpg``, ``LYT_00002.jpg``, ...), so the
file's index is the nearest thing to a date: :func:`order_split` trains on the earlier files of
each class and tests on the later ones, what a lab sees when this year's model meets next year's
slides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cyto.data.dataset import acquisition_key

__all__ = ["acquisition_key", "order_split", "stratified_split"]


def stratified_split(
    groups: Sequence[str] | np.ndarray, idx: np.ndarray, frac: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(first, rest)`` of ``idx``: a random ``frac`` of each group (class), drawn with ``seed``;
    both sorted."""
    groups = np.asarray(groups)
    rng = np.random.default_rng(seed)
    first, rest = [], []
    for value in np.unique(groups[idx]):
        members = rng.permutation(idx[groups[idx] == value])
        cut = int(round(frac * len(members)))
        first.append(members[:cut])
        rest.append(members[cut:])
    return _sorted(first), _sorted(rest)


def order_split(
    groups: Sequence[str] | np.ndarray,
    keys: Sequence[tuple[int, str]],
    idx: np.ndarray,
    late_fraction: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(early, late)`` of ``idx``: per group (class), the last ``late_fraction`` of its members
    in ``keys`` order (see :func:`acquisition_key`) are ``late``, the others ``early``; both sorted.
    Every cell of ``early`` was acquired before every cell of ``late`` of the same class."""
    if not 0 < late_fraction < 1:
        raise ValueError(f"late_fraction must be in (0, 1), got {late_fraction}")
    groups = np.asarray(groups)
    early, late = [], []
    for value in np.unique(groups[idx]):
        members = idx[groups[idx] == value]
        members = np.array(sorted(members, key=lambda i: keys[i]), dtype=np.int64)
        cut = len(members) - int(round(late_fraction * len(members)))
        early.append(members[:cut])
        late.append(members[cut:])
    return _sorted(early), _sorted(late)


def _sorted(parts: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
