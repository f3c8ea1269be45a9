"""Stain vectors of a slide or a set of cell crops, estimated from their optical densities
(Macenko et al., *A method for normalizing histology slides for quantitative analysis*, ISBI
2009), and how far two sets' stains lie apart.

A stain's colour is a direction in optical-density space (R, G, B absorbances): the pixels of a
slide stained with two dyes lie near the plane of their two directions. The plane is that of the
two largest principal axes of the stained pixels' densities; within it, the directions at the 1st
and 99th percentile of the pixels' angle are the two stains. Applied to each set of cells as it
comes (a training folder, a folder to score, a slide's first cells), not to one reference fixed
in advance: an MGG, a Pap and an H&E slide get the vectors their own pixels show.

What they are for here: telling when cells come from another lab or stain batch than a model's
training cells. A one-class model learns the colours of its normal cells, and cells stained
otherwise can rank as abnormal whatever they are (lymphocytes of another lab, both MGG, ranked
at AUROC 0.44 by a bone-marrow model, unzoomed). :func:`compare` gives the angle between two
estimates; a set whose stain lies more than :data:`ADVISE_DEGREES` from the model's is said, as
a scale that differs is.

Where it cannot separate two stains (too few stained pixels, or pixels all of one colour: the
largest angle between them under :data:`MIN_SPREAD_DEGREES`), the estimate says why and is not
compared (``separable`` False); the nucleus detection and the cell masks never depend on it (the
Pap mask thresholds the total density: on the CRIC development cells the estimated haematoxylin
direction made the nuclei worse, AUROC of the nucleus area 0.74 against 0.77, because the
light-green cytoplasm of Pap absorbs as haematoxylin does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: each uint8 channel value's optical density
_OD = -np.log((np.arange(256, dtype=np.float64) + 1.0) / 256.0)
#: a pixel whose density in every channel is at least this is stained (Macenko's beta)
BETA = 0.15
#: at least this many stained pixels, for an estimate
MIN_PIXELS = 500
#: the two stains' directions at least this far apart (degrees), else one stain is all there is
MIN_SPREAD_DEGREES = 3.0
#: a set of cells whose stain lies further than this from the model's (degrees, the larger of
#: the two stains' angles) is said to be stained otherwise. Measured on sets of 200-560 normal
#: cells (benchmarks/science/pap/stain_angles.py; results in benchmarks/results/xeon-2core/pap/
#: stain/): within a lab, CRIC's development NILM blocks (many slides) 4.1-9.3, the bone-marrow
#: halves 1.6, the other lab's blood halves 7.6; between the two MGG labs 20.5-28.9; Pap against
#: MGG 21-34. A slide composed of CRIC's later crops read against a model of its earlier ones
#: (one lab): 9.3-9.8 over all its cells, 9.5 +- 0.9 (up to 11.6) over 128 drawn at random, up
#: to 12.5 over the first tiles' (the check's sample); so past 15, midway. It misses a lab
#: whose stain lies within the spread of one lab's own slides
ADVISE_DEGREES = 15.0
#: a sample of fewer cells than this reads a wider angle from its own lab's stain: 8-16 of a
#: one-lab slide's cells drawn at random read up to 15.9 degrees (99th percentile 14.8), a
#: sparse slide's 33 first cells 16.2 (hostile round 20). A batch of one lab's cells taken
#: together (consecutive CRIC ids: a few images) reads wider still: development NILM blocks
#: against a model of the first 240 read up to 24.8 degrees over 40 cells, 22.8 over 64 and
#: 18.3 over 80, 13.4 over 128 and 14.0 over 200 (80 later crops read 19.0 and were told
#: "another lab": hostile round 68, 2). Fewer cells are said to be stained otherwise only past
#: :data:`ADVISE_DEGREES_FEW`, below the labs apart (20.5-34; an MGG slide's 81 cells against a
#: Pap model's stain, 21-34 apart, must still be told): batches of 40-64 of one lab in a row
#: still pass it now and then (6 of 57), and a lab within 20 degrees goes unsaid
FEW_CELLS = 128
ADVISE_DEGREES_FEW = 20.0


@dataclass(frozen=True)
class StainEstimate:
    """Two unit stain vectors in optical-density space (R, G, B), the first the one nearer
    haematoxylin; how many stained pixels gave them; whether they are two stains at all."""

    vectors: tuple[tuple[float, float, float], tuple[float, float, float]]
    pixels: int
    separable: bool
    why: str = ""
    #: how many cells gave it (None: not recorded, a bundle of an earlier cyto)
    cells: int | None = None

    def as_record(self) -> dict:
        return {
            "vectors": [[round(v, 5) for v in vec] for vec in self.vectors],
            "pixels": self.pixels,
            "separable": self.separable,
            "why": self.why,
            "method": "Macenko 2009 (1st/99th percentile angles)",
            **({"cells": self.cells} if self.cells is not None else {}),
        }

    @classmethod
    def from_record(cls, record: dict | None) -> StainEstimate | None:
        if not record:
            return None
        a, b = (tuple(float(x) for x in v) for v in record["vectors"])
        cells = record.get("cells")
        return cls(
            (a, b),
            int(record["pixels"]),
            bool(record["separable"]),
            record.get("why", ""),
            None if cells is None else int(cells),
        )


#: the haematoxylin direction (Ruifrok and Johnston), to tell the two estimated stains apart
_HAEMATOXYLIN = np.array([0.65, 0.70, 0.29]) / np.linalg.norm([0.65, 0.70, 0.29])


#: the largest 8-bit value of a stained channel: its density is at least :data:`BETA`
_STAINED = int(np.floor(256.0 * np.exp(-BETA) - 1.0))


def od_pixels(images, most: int = 200_000, seed: int = 0, n: int | None = None) -> np.ndarray:
    """(M, 3) optical densities of the stained pixels of uint8 RGB ``images`` (a stack, a list,
    one image, or an iterable of ``n`` images read one at a time), at most ``most`` of them.

    Each image gives at most its share of ``10 * most`` pixels, drawn regularly as it comes, and
    keeps its stained ones as bytes: an iterable is never held whole, and what is held does not
    grow with the images (cyto predict's stain check streams 512 of a folder's)."""
    if isinstance(images, np.ndarray) and images.ndim == 3:
        images = images[None]
    if n is None:
        n = len(images)
    share = max(1, -(-10 * most // max(n, 1)))  # each image's pixels at most
    kept = []
    for im in images:
        flat = np.asarray(im, dtype=np.uint8).reshape(-1, 3)
        if len(flat) > share:
            flat = flat[:: -(-len(flat) // share)]
        kept.append(flat[(flat <= _STAINED).all(axis=1)])
    flat = np.concatenate(kept) if kept else np.zeros((0, 3), np.uint8)
    if len(flat) > most:
        flat = flat[np.sort(np.random.default_rng(seed).choice(len(flat), most, replace=False))]
    return _OD[flat]


def estimate(od: np.ndarray) -> StainEstimate:
    """The two stain vectors of stained pixels' densities ``od`` (:func:`od_pixels`)."""
    fallback = ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    if len(od) < MIN_PIXELS:
        return StainEstimate(
            fallback,
            len(od),
            False,
            f"{len(od)} pixels absorb in all three colour channels, fewer than {MIN_PIXELS}: "
            "too pale, or of a pure colour that absorbs in one or two of them",
        )
    _, vecs = np.linalg.eigh(np.cov(od.T))
    plane = vecs[:, [2, 1]]  # the two largest axes
    plane[:, 0] *= np.sign(plane[:, 0].sum()) or 1.0  # densities are positive
    t = od @ plane
    phi = np.arctan2(t[:, 1], t[:, 0])
    lo, hi = np.percentile(phi, [1, 99])
    a = plane @ np.array([np.cos(lo), np.sin(lo)])
    b = plane @ np.array([np.cos(hi), np.sin(hi)])
    a, b = (v * (np.sign(v.sum()) or 1.0) for v in (a, b))
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    if b @ _HAEMATOXYLIN > a @ _HAEMATOXYLIN:
        a, b = b, a
    spread = float(np.degrees(np.arccos(np.clip(a @ b, -1.0, 1.0))))
    vectors = (tuple(float(x) for x in a), tuple(float(x) for x in b))
    if spread < MIN_SPREAD_DEGREES:
        return StainEstimate(
            vectors, len(od), False,
            f"the stained pixels are all of one colour (the two directions {spread:.1f} degrees "
            "apart): one stain, or a grayscale image",
        )  # fmt: skip
    return StainEstimate(vectors, len(od), True)


def estimate_images(images, most: int = 200_000, n: int | None = None) -> StainEstimate:
    """:func:`estimate` over the stained pixels of ``images`` (:func:`od_pixels`)."""
    return estimate(od_pixels(images, most, n=n))


def compare(a: StainEstimate, b: StainEstimate) -> float | None:
    """Degrees between two estimates: the larger of the angles between their stains paired the
    nearer way (which of two stains is called first can flip where both lie about as near
    haematoxylin: Pap's light green and eosin do). None when either could not separate its
    stains."""
    if not (a.separable and b.separable):
        return None

    def angle(u, v) -> float:
        return float(np.degrees(np.arccos(np.clip(np.dot(u, v), -1.0, 1.0))))

    (a1, a2), (b1, b2) = a.vectors, b.vectors
    return min(max(angle(a1, b1), angle(a2, b2)), max(angle(a1, b2), angle(a2, b1)))


def advise_degrees(n_cells: int, model_cells: int | None = None) -> float:
    """The angle past which ``n_cells`` cells are said to be stained otherwise, against a
    model's stain estimated from ``model_cells`` (None: not recorded): the fewer decides."""
    fewest = n_cells if model_cells is None else min(n_cells, model_cells)
    return ADVISE_DEGREES if fewest >= FEW_CELLS else ADVISE_DEGREES_FEW


def stain_check(model: StainEstimate | None, cells: StainEstimate, n_cells: int) -> dict | None:
    """How the stain of ``cells`` (estimated from ``n_cells`` cells) compares with the model's
    training cells': the angle, and whether it is past :func:`advise_degrees` (``advised``) of
    the fewer of the two sets of cells (a model's reference from 40 training cells read its
    own lab's later cells 17 degrees apart, and told them to train on "this lab's" cells:
    hostile round 33). None without the model's record."""
    if model is None:
        return None
    angle = compare(model, cells)
    return {
        "degrees": None if angle is None else round(angle, 2),
        "cells": int(n_cells),
        **({"model_cells": model.cells} if model.cells is not None else {}),
        "advised": angle is not None and angle > advise_degrees(int(n_cells), model.cells),
        "separable": cells.separable,
        "why": cells.why or model.why,
        "cells_vectors": [[round(v, 4) for v in vec] for vec in cells.vectors],
    }


#: the stains a model records (its ``stain`` setting), as the stain lines name them
STAIN_NAMES = {"mgg": "May-Grünwald-Giemsa", "pap": "Papanicolaou", "he": "H&E"}


def stain_words(
    check: dict, what: str, cause: str | None = None, model_stain: str | None = None
) -> str | None:
    """One line for a stain check: another stain batch or lab (``advised``), or stains that
    could not be separated; None when there is nothing to say. ``cause``: a cause of the run's
    own to say first, and what to do about it, in place of another lab's (a ``--detection``
    other than the model's finds other parts of the cells: a Pap slide of the model's own lab
    was told to train on "this lab's" cells; hostile round 25). ``model_stain``: the stain the
    model records, named in the line (Pap cells given to a model of MGG-stained blood cells were
    told only "another lab": hostile round 50, 4)."""
    if check is None:
        return None
    if check["degrees"] is None:
        return (
            f"{what}: the stain could not be estimated ({check['why']}), so whether these cells "
            "were stained as the model's training cells is not checked"
        )
    if not check["advised"]:
        return None
    n, ref = check.get("cells"), check.get("model_cells")
    past = ADVISE_DEGREES if n is None else advise_degrees(n, ref)
    on = "" if n is None else f" over {n} cells"
    on += f" against the model's {ref}" if ref is not None and ref < FEW_CELLS else ""
    trained = ""
    if model_stain in STAIN_NAMES:
        trained = f", {STAIN_NAMES[model_stain]}-stained (stain={model_stain})"
    said = (
        f"{what} look stained otherwise than the model's training cells{trained} (stain "
        f"vectors {check['degrees']:.1f} degrees apart{on}, more than {past:g})"
    )
    if cause is not None:
        return f"{said}: {cause}"
    if trained:
        return (
            f"{said}: cells of another stain or another lab; a one-class model can rank such "
            "normal cells as the most abnormal: train a model on normal cells of this stain "
            "and this lab (docs/how-to/another-lab.md)"
        )
    return (
        f"{said}: a one-class model can rank another lab's normal cells as the most abnormal; "
        "train a model on this lab's normal cells (docs/how-to/another-lab.md)"
    )
