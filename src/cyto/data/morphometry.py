"""A one-class score without a network: how far a cell's nucleus size is from the normal cells'.

Nuclear size is the oldest criterion of cytology: a blast, a promyelocyte or a monocyte has a
larger nucleus than a lymphocyte, and an erythroblast's is smaller. :class:`NucleusSize` keeps two
numbers of the training normals, the mean and the standard deviation of the log of the share of
a patch covered by its centre nucleus (:func:`cyto.data.scale.centre_nucleus_fraction`), and
scores a cell by how many standard deviations its own log share lies from that mean, on either
side. It needs cells at the training scale (``--zoom``): the share of a patch grows with the
square of the magnification.

Alone it ranks later bone-marrow files well and another lab's cells less well; beside Deep
SVDD, as the mean of each cell's two ranks within the cells being ranked (:func:`fused_score`),
it was chosen on the development blocks under a rule fixed before the runs (AUROC 0.812 ->
0.877) and held on the final block of later files: AUROC 0.774 -> 0.843, Recall@5 % at WR 1 %
3.4x -> 6.5x chance (``benchmarks/results/vm-2core/heldout/order/nucleus/``). ``cyto predict``
and ``cyto score`` rank a Deep SVDD bundle's cells that way by default (``--rank-by``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cyto.data.scale import centre_nucleus_fraction
from cyto.errors import ConfigError

#: added to the share before its log, so a patch without a centre nucleus (share 0) scores far
#: out but finite
SHARE_FLOOR = 1e-3

#: the methods whose cells ``--rank-by auto`` ranks by the fused score: those it was chosen for
FUSED_METHODS = ("dsvdd",)
RANK_BY = ("auto", "model", "model+nucleus")


def log_share(shares: np.ndarray) -> np.ndarray:
    """(N,) log of centre-nucleus shares (plus :data:`SHARE_FLOOR`): what the score compares."""
    return np.log(np.asarray(shares, dtype=np.float64) + SHARE_FLOOR)


@dataclass(frozen=True)
class NucleusSize:
    """The nucleus-size score of cells against normal cells' mean and spread (see the module)."""

    mean: float
    sd: float

    @classmethod
    def fit(cls, normals: np.ndarray) -> NucleusSize:
        """The mean and standard deviation of ``normals``' log centre-nucleus shares."""
        return cls.from_shares(centre_nucleus_fraction(normals))

    @classmethod
    def from_shares(cls, shares: np.ndarray) -> NucleusSize:
        """:meth:`fit` from the normals' centre-nucleus shares already measured."""
        if len(shares) < 2:
            raise ConfigError(f"a nucleus-size score needs >= 2 normal cells, got {len(shares)}")
        values = log_share(shares)
        sd = float(values.std())
        if not sd > 0:
            raise ConfigError(
                "the normal cells' nuclei all have the same size: no spread to score against "
                "(are the patches blank or identical?)"
            )
        return cls(float(values.mean()), sd)

    def score(self, images: np.ndarray) -> np.ndarray:
        """(N,) |log share - mean| / sd: higher is further from the normal cells' sizes."""
        return self.score_shares(centre_nucleus_fraction(images))

    def score_shares(self, shares: np.ndarray) -> np.ndarray:
        """:meth:`score` from centre-nucleus shares already measured."""
        return np.abs(log_share(shares) - self.mean) / self.sd

    def as_record(self) -> dict[str, float]:
        """What a bundle's manifest keeps (``training_data.nucleus_size``)."""
        return {"log_mean": round(self.mean, 6), "log_sd": round(self.sd, 6)}

    @classmethod
    def from_record(cls, record: dict | None) -> NucleusSize | None:
        """The score a manifest recorded, or None (a bundle from before, or no normals)."""
        if not record:
            return None
        return cls(float(record["log_mean"]), float(record["log_sd"]))


def fused_score(*scores: np.ndarray) -> np.ndarray:
    """(N,) the mean over ``scores`` of each cell's rank within these N cells, as a share of N
    (ties share their mean rank): in (0, 1], higher is more abnormal under both. It depends on
    the cells ranked together (a folder, a slide), not on the scores' scales."""
    from scipy.stats import rankdata

    if not scores or len({len(s) for s in scores}) != 1:
        raise ValueError("fused_score needs one or more score arrays of one length")
    n = max(len(scores[0]), 1)
    return np.mean([rankdata(s) / n for s in scores], axis=0)


def scorer_rank_by(scorer, rank_by: str) -> tuple[str, NucleusSize | None]:
    """``rank_by`` resolved for a loaded scorer's bundle (:func:`resolve_rank_by`), and the
    nucleus-size score to compute per cell (None when the ranking does not use it)."""
    nucleus = NucleusSize.from_record(scorer.spec.nucleus_size)
    how = resolve_rank_by(rank_by, scorer.bundle.method, nucleus)
    return how, nucleus if how == "model+nucleus" else None


def resolve_rank_by(rank_by: str, method: str, nucleus: NucleusSize | None) -> str:
    """``model`` or ``model+nucleus`` for ``--rank-by``: ``auto`` fuses for the methods in
    :data:`FUSED_METHODS` whose bundle records the nucleus size; an explicit
    ``model+nucleus`` on a bundle without the record is a one-line error."""
    if rank_by not in RANK_BY:
        raise ConfigError(f"--rank-by must be one of {', '.join(RANK_BY)}, got {rank_by!r}")
    if rank_by == "auto":
        return "model+nucleus" if method in FUSED_METHODS and nucleus is not None else "model"
    if rank_by == "model+nucleus" and nucleus is None:
        raise ConfigError(
            "--rank-by model+nucleus: this bundle records no nucleus size of its training "
            "normals (trained before cyto recorded it, or without normal cells); retrain it, or "
            "rank by the model alone"
        )
    return rank_by
