"""A one-class score without a network, from the cells' morphometry, and ranking with it.

:class:`Morphometric` keeps, for each of a few morphometric features of the training normals
(measured by :func:`cyto.detect.morphometry.measure`), their mean and standard deviation after a
transform (the log of the nucleus's share of the crop, the logit of the N/C ratio), and scores a
cell by how many standard deviations its features lie from the normals', summed over features:
on either side (``both``), or only on the side the cytology criteria call abnormal (``up``:
larger, denser, more irregular). A ``discount`` feature divides that sum by ``1 +``
:data:`DISCOUNT` times its own standard deviations above the normals' (a measure that says the
object measured is unlikely to be one nucleus). It needs cells at the training scale
(``--zoom``): a nucleus's share of its crop grows with the square of the magnification.

Which features and sides come with the stain (:data:`MORPHOMETRY`), chosen on development blocks:

* ``mgg`` (May-Grünwald-Giemsa marrow and blood): the nucleus's share, on both sides (a blast's
  nucleus is larger than a lymphocyte's, an erythroblast's smaller). It ranked later bone-marrow
  files well and, beside Deep SVDD, raised the fused ranking from AUROC 0.774 to 0.843 on the final
  block (``benchmarks/results/vm-2core/heldout/order/nucleus/``).
* ``pap`` (Papanicolaou, cervical): the nucleus's share, larger only (nuclear enlargement, the first
  Bethesda criterion), discounted by the contour's irregularity (1 - solidity). On the CRIC
  development blocks the share alone ranked NILM against ASC-US, LSIL and ASC-H at AUROC
  0.836 / 0.808 (two blocks); the N/C ratio, the contour, the optical density and a
  Mahalanobis or k-nearest-neighbour score over all of them, added as abnormal, ranked worse
  (0.74-0.79), because normal squamous cells vary in those more than the low-grade lesions
  differ from them. The other way round the contour helps: a large "nucleus" with an irregular
  outline is, on a normal cell, most often dense cytoplasm, a fold or overlapping nuclei, and
  an enlarged low-grade nucleus is smooth. The discount raised the crops' AUROC to 0.840 /
  0.823 and, on slides composed of the held-out half's crops, the planted lesions found in the
  top 100 cells from 0.34 to 0.59 (3 seeds a block; ``benchmarks/science/pap/``).
* ``he``: as ``mgg``.

Ranking (``--rank-by``): ``model``, ``morphometry``, or ``model+morphometry``, the mean of each
cell's two ranks within the cells ranked together (:func:`fused_score`). ``auto`` takes what the
bundle's held-back cells ranked best (:func:`choose_ranking`): ``cyto train`` holds back a share of
the normal cells when the training folder also holds abnormal classes (``--abnormal``, never
trained on by a one-class method), and records how each ranking ordered them; without that
record, the model alone. A fusion is taken only where it ranked the held-back cells above both of
its parts, so ``auto`` never fuses its way below the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cyto.errors import ConfigError
from cyto.flags import passing, said, setting

#: added to a share before its log, so a crop without a nucleus near its centre (share 0) scores
#: far out but finite
SHARE_FLOOR = 1e-3

RANK_BY = ("auto", "model", "morphometry", "model+morphometry")
#: earlier names of the rankings, still taken
RANK_BY_ALIASES = {"model+nucleus": "model+morphometry"}
#: the rankings a bundle's held-back cells compare (``validation`` in its manifest)
RANKINGS = ("model", "morphometry", "model+morphometry")
#: the column a cyto score table's ``rank`` follows under each ranking (its ``cyto.rank_by``
#: metadata), and how a reader names its values
RANKED_COLUMN = {
    "model": "score",
    "morphometry": "morphometry_score",
    "model+morphometry": "fused_score",
    "model+nucleus": "fused_score",
}
#: the columns of a cyto table that hold a rank, 1 = most abnormal (lower = more abnormal, the
#: other way round from every score column): a reader of a chosen score column reads them so
RANK_COLUMNS = ("rank",)
RANKED_LABEL = {
    "score": "score",
    "morphometry_score": "morphometric score",
    "fused_score": "fused score",
}
DIRECTIONS = ("both", "up", "down", "discount")
#: how much one standard deviation of a ``discount`` feature above the normals' divides the score
#: by (``score / (1 + DISCOUNT * z)``): chosen on CRIC's development blocks from 0.1-2 (0.25-0.5
#: raised both the crops' AUROC and a composed slide's top 100; ``benchmarks/science/pap/``)
DISCOUNT = 0.5
STAINS = ("mgg", "pap", "he")
#: the cell mask (:data:`cyto.detect.morphometry.CELL_MASKS`) each stain's cells are measured with
MASK_OF_STAIN = {"mgg": "smear", "pap": "pap", "he": "tissue"}
#: the features the morphometric score of each stain compares, and on which side (see the module)
MORPHOMETRY: dict[str, tuple[tuple[str, str], ...]] = {
    "mgg": (("nucleus_share", "both"),),
    "pap": (("nucleus_share", "up"), ("contour_irregularity", "discount")),
    "he": (("nucleus_share", "both"),),
}


#: a normal cell's nucleus of each stain whose normals have one typical size, in um^2, as cyto's
#: mask of that stain measures it: the intermediate squamous cell's, about 35 um^2 in The
#: Bethesda System, which the Pap mask (its outline a little wider) measures at a median of 40
#: on CRIC's development NILM crops at their 0.258 um/px (41-46 on other subsets of them;
#: ``benchmarks/science/pap/``). Marrow and blood normals differ too much by cell type for one
NORMAL_NUCLEUS_UM2 = {"pap": 40.0}
#: how far the training normals' median nucleus may lie from it before the pixel size is
#: doubted: 2x in area, a pixel size 1.41x off. CRIC at 0.5 for 0.258 read a median of 152-171
#: um^2 and ranked the held-back cells at AUROC 0.672 for 0.814 (hostile round 26, 1); at 0.16
#: 19 um^2 (passed under 2.25x about 35: round 27, 7); at 0.2 and 0.33, 27 and 73
NUCLEUS_AREA_SPREAD = 2.0


def nucleus_size_check(stain: str, areas_um2, mpp: float | None) -> dict | None:
    """What a bundle records to check its pixel size by its normals' nuclei: their median area
    (``areas_um2``, NaN where none was measured) and the pixel size the user gave (``mpp``: a
    wrong one scales the areas by its square); None for a stain without one typical normal
    nucleus, or without a pixel size."""
    areas = np.asarray(areas_um2, dtype=np.float64)
    areas = areas[np.isfinite(areas)]
    if stain not in NORMAL_NUCLEUS_UM2 or not mpp or len(areas) < 10:
        return None
    return {"stain": stain, "median_um2": round(float(np.median(areas)), 2), "mpp": mpp}


def _nucleus_size_words(check: dict | None) -> str | None:
    if not check or check.get("stain") not in NORMAL_NUCLEUS_UM2:
        return None
    typical, median = NORMAL_NUCLEUS_UM2[check["stain"]], float(check["median_um2"])
    if 1 / NUCLEUS_AREA_SPREAD <= median / typical <= NUCLEUS_AREA_SPREAD:
        return None
    likely = float(check["mpp"]) * (typical / median) ** 0.5
    return (
        f"the training normals' nuclei measure a median of {median:.0f} um^2 at "
        f"{check['mpp']:.3g} um/px, where a normal {check['stain']} cell's measures about "
        f"{typical:.0f} um^2: is the pixel size right? Nearer {likely:.2g} um/px would give "
        f"them that size; a wrong one measures every nucleus wrong, and with it the "
        f"morphometric score (and a choice of {passing('rank_by', 'auto')} made by it) (give "
        f"{setting('mpp')} the crops' own pixel size)"
    )


def _transform(name: str, values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if name == "nucleus_share":
        return np.log(v + SHARE_FLOOR)
    if name == "nc_ratio":
        v = np.clip(v, 0.0, 1.0)
        return np.log((v + 0.01) / (1.01 - v))
    if name in ("nucleus_area_um2", "nucleus_od_ratio"):
        return np.log(v + SHARE_FLOOR)
    return v


#: how each feature's transform (:func:`_transform`) is named where its mean and sd are shown
_TRANSFORM_WORDS = {
    "nucleus_share": f"log({{}} + {SHARE_FLOOR:g})",
    "nucleus_area_um2": f"log({{}} + {SHARE_FLOOR:g})",
    "nucleus_od_ratio": f"log({{}} + {SHARE_FLOOR:g})",
    "nc_ratio": "logit of {}",
}


#: what a feature on a side means in the cytologist's words, where ``cyto info`` shows it (round
#: 27, 1: "nucleus_share (up)" and "(discount)" needed methods.md open beside them)
_MEANING = {
    ("nucleus_share", "up"): "nuclear enlargement",
    ("nucleus_share", "both"): "a nucleus larger or smaller",
    ("contour_irregularity", "discount"): "1 - solidity: irregular outlines are rarely one nucleus",
}


def _inverse(name: str, t: float) -> float:
    """The feature's value whose :func:`_transform` is ``t``."""
    if name in ("nucleus_share", "nucleus_area_um2", "nucleus_od_ratio"):
        return float(np.exp(t) - SHARE_FLOOR)
    if name == "nc_ratio":
        e = float(np.exp(t))
        return (1.01 * e - 0.01) / (1.0 + e)
    return float(t)


@dataclass(frozen=True)
class Feature:
    """One feature of the score: its transform's mean and spread over the normals, and the side
    that counts."""

    name: str
    direction: str
    mean: float
    sd: float

    def words(self) -> str:
        """The feature in its own units (a share as a share): the value its transform's mean
        maps back to, the span of one sd either side, then the transform's own mean and sd
        (what the score measures against). A log share printed as the share read as a negative
        share (hostile round 18, case 2)."""
        what = _MEANING.get((self.name, self.direction))
        side = self.direction if what is None else f"{self.direction}: {what}"
        if self.direction == "discount":  # no span: below the mean it does nothing
            return (
                f"{self.name} ({side}) {self.mean:.3g} +- {self.sd:.3g}: the score divided by "
                f"1 + {DISCOUNT:g} x its sds above the normals'"
            )
        lo, mid, hi = (_inverse(self.name, self.mean + k * self.sd) for k in (-1, 0, 1))
        return (
            f"{self.name} ({side}) {mid:.3g} ({lo:.3g} to {hi:.3g} within one sd; "
            f"{_TRANSFORM_WORDS.get(self.name, self.name).format(self.name)} "
            f"{self.mean:.3f} +- {self.sd:.3f})"
        )


@dataclass(frozen=True)
class Morphometric:
    """The morphometric one-class score (see the module): fit on normal cells' measures."""

    stain: str
    features: tuple[Feature, ...]

    @classmethod
    def fit(cls, measures: dict[str, np.ndarray], stain: str) -> Morphometric:
        """The score of ``stain``'s features (:data:`MORPHOMETRY`) fitted on the normal cells'
        ``measures`` (:func:`cyto.detect.morphometry.measure`)."""
        if stain not in MORPHOMETRY:
            raise ConfigError(f"stain must be one of {', '.join(STAINS)}, got {stain!r}")
        fitted = []
        for name, direction in MORPHOMETRY[stain]:
            values = _transform(name, measures[name])
            values = values[np.isfinite(values)]
            # rounding is no spread
            varies = len(values) >= 2 and float(values.std()) > 1e-9 * max(
                1.0, abs(float(values.mean()))
            )
            if direction == "discount" and not varies:
                # the normals give no spread to discount by (every outline convex): no discount
                continue
            if len(values) < 2:
                raise ConfigError(
                    f"a morphometric score needs >= 2 normal cells with a measured {name}, got "
                    f"{len(values)} (are the patches blank, or at another scale?)"
                )
            if not varies:
                raise ConfigError(
                    f"the normal cells' {name} does not vary: no spread to score against "
                    "(are the patches blank or identical?)"
                )
            fitted.append(Feature(name, direction, float(values.mean()), float(values.std())))
        return cls(stain, tuple(fitted))

    def score(self, measures: dict[str, np.ndarray]) -> np.ndarray:
        """(N,) the summed standard deviations from the normals, divided by ``1 +``
        :data:`DISCOUNT` times the ``discount`` features' standard deviations above theirs:
        higher is more abnormal. A feature not measured for a cell (NaN) adds nothing."""
        total, discount = None, None
        for f in self.features:
            z = (_transform(f.name, measures[f.name]) - f.mean) / f.sd
            if f.direction == "discount":
                z = np.nan_to_num(np.maximum(z, 0.0), nan=0.0)
                discount = z if discount is None else discount + z
                continue
            if f.direction == "up":
                z = np.maximum(z, 0.0)
            elif f.direction == "down":
                z = np.maximum(-z, 0.0)
            else:
                z = np.abs(z)
            z = np.nan_to_num(z, nan=0.0)
            total = z if total is None else total + z
        if discount is not None:
            total = total / (1.0 + DISCOUNT * discount)
        return total

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    def as_record(self) -> dict:
        """What a bundle's manifest keeps (``training_data.morphometry``)."""
        return {
            "stain": self.stain,
            "features": [
                {
                    "name": f.name,
                    "direction": f.direction,
                    "mean": round(f.mean, 6),
                    "sd": round(f.sd, 6),
                }
                for f in self.features
            ],
        }

    @classmethod
    def of_spec(cls, spec) -> Morphometric | None:
        """The score a bundle's model spec records (:class:`cyto.bundle.ModelSpec`), or None."""
        return cls.from_record(spec.morphometry, spec.nucleus_size)

    @classmethod
    def from_record(
        cls, record: dict | None, nucleus_size: dict | None = None
    ) -> Morphometric | None:
        """The score a manifest recorded; a bundle of an earlier cyto recorded the nucleus-size
        score of MGG cells (``nucleus_size``: the mean and spread of the log centre share), the
        same score under its old name. None when neither is recorded."""
        if record:
            return cls(
                str(record["stain"]),
                tuple(
                    Feature(str(f["name"]), str(f["direction"]), float(f["mean"]), float(f["sd"]))
                    for f in record["features"]
                ),
            )
        if nucleus_size:
            return cls(
                "mgg",
                (
                    Feature(
                        "nucleus_share", "both", float(nucleus_size["log_mean"]),
                        float(nucleus_size["log_sd"]),
                    ),
                ),
            )  # fmt: skip
        return None


def fused_score(*scores: np.ndarray) -> np.ndarray:
    """(N,) the mean over ``scores`` of each cell's rank within these N cells, as a share of N
    (ties share their mean rank): in (0, 1], higher is more abnormal under both. It depends on
    the cells ranked together (a folder, a slide), not on the scores' scales."""
    from scipy.stats import rankdata

    if not scores or len({len(s) for s in scores}) != 1:
        raise ValueError("fused_score needs one or more score arrays of one length")
    n = max(len(scores[0]), 1)
    return np.mean([rankdata(s) / n for s in scores], axis=0)


def ranked_column(columns, rank_by: str | None = None) -> str:
    """The column a cyto table's ``rank`` follows: the one of its ranking (``rank_by``, its
    ``cyto.rank_by`` metadata), else ``fused_score`` where there is one, else ``score``, else
    ``morphometry_score`` where it is the only one (a table of that score alone)."""
    column = RANKED_COLUMN.get(rank_by or "")
    if column is not None and column in columns:
        return column
    if "fused_score" in columns:
        return "fused_score"
    if "score" not in columns and "morphometry_score" in columns:
        return "morphometry_score"
    return "score"


def ranked_values(how: str, model: np.ndarray, morph: np.ndarray | None) -> np.ndarray:
    """The values cells are ordered by under ranking ``how`` (:data:`RANKINGS`)."""
    if how == "model":
        return np.asarray(model, dtype=np.float64)
    if morph is None:
        raise ValueError(f"ranking {how!r} needs the morphometric score")
    if how == "morphometry":
        return np.asarray(morph, dtype=np.float64)
    return fused_score(model, morph)


def validation_record(
    labels: np.ndarray, model: np.ndarray, morph: np.ndarray | None, classes: dict[str, int]
) -> dict:
    """What ``cyto train`` records of its held-back cells: how many of each class, and the AUROC
    of each ranking (:data:`RANKINGS`) over them (labels: 1 = abnormal)."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels)
    auroc = {}
    for how in RANKINGS:
        if how != "model" and morph is None:
            continue
        auroc[how] = round(float(roc_auc_score(labels, ranked_values(how, model, morph))), 6)
    return {
        "normal_cells": int((labels == 0).sum()),
        "abnormal_cells": int((labels == 1).sum()),
        "classes": dict(classes),
        "auroc": auroc,
    }


#: the fewest normal cells a hold-back takes, and leaves to train
MIN_HELD = 10


def holdout_why(n_normal: int, share: float) -> str | None:
    """Why ``n_normal`` normal cells hold none back at ``share`` (:func:`holdout_split`), in
    words with what would hold some back; None where they do. Said at training, and recorded
    (a folder of 40 NILM with abnormal classes beside them held nothing back without a word,
    and ``--rank-by auto`` then ranked by a model near chance: hostile round 33; the advice
    holds both bounds, a hold-back and what is left to train: round 34)."""
    if share <= 0:
        return f"{setting('holdout')} is 0"

    def holds(n: int) -> bool:  # MIN_HELD held back, and as many left to train
        return MIN_HELD <= round(share * n) <= n - MIN_HELD

    if holds(n_normal):
        return None
    n_held = int(round(share * n_normal))
    what = (
        f"{n_normal} normal cells, of which {share:.0%} holds back {n_held} and leaves "
        f"{n_normal - n_held} to train, where each takes at least {MIN_HELD}"
    )
    if n_normal < 2 * MIN_HELD:
        return (
            f"{what}: no share holds back from fewer than {2 * MIN_HELD}; give more normal "
            f"cells, or choose the ranking with {said('rank_by')}"
        )
    # the least count at this share (none where a share near 0 or 1 needs over 100,000)
    need = next((n for n in range(n_normal, 100_000) if holds(n)), None)
    # the shares that hold back 10 to n - 10, to two decimals within them
    lo = math.ceil(MIN_HELD / n_normal * 100) / 100
    hi = math.floor((n_normal - MIN_HELD) / n_normal * 100) / 100
    shares = f"a {setting('holdout')} from {lo:.2f} to {hi:.2f}"
    more = f"give {need} or more normal cells, or " if need is not None else ""
    return f"{what}: {more}{shares}"


def _skipped_words(validation: dict) -> str:
    """Why a bundle's training held nothing back (its record: the normal cells, the share)."""
    n, share = int(validation["skipped"]["normal_cells"]), float(validation["skipped"]["holdout"])
    return holdout_why(n, share) or f"{n} normal cells, {setting('holdout')} {share:g}"


def choose_ranking(validation: dict | None) -> tuple[str, str]:
    """(ranking, why) for ``--rank-by auto``, recomputed from a bundle's held-back AUROCs each
    time (a recorded choice is never read): the best of the rankings; the model's unless another
    ranked the held-back cells strictly higher, and a fusion only above both of its parts."""
    if validation and validation.get("skipped"):
        return "model", f"nothing was held back at training: {_skipped_words(validation)}"
    if not validation or not validation.get("auroc"):
        return "model", "no held-back abnormal cells were recorded at training"
    auroc = {k: float(v) for k, v in validation["auroc"].items() if k in RANKINGS}
    if "model" not in auroc:
        return "model", "the held-back record has no model AUROC"
    best = "model"
    if auroc.get("morphometry", -1.0) > auroc["model"]:
        best = "morphometry"
    fused = auroc.get("model+morphometry", -1.0)
    if fused > auroc["model"] and fused > auroc.get("morphometry", -1.0):
        best = "model+morphometry"
    words = ", ".join(f"{k} {v:.3f}" for k, v in auroc.items())
    return best, (
        f"held-back cells ({validation.get('normal_cells')} normal, "
        f"{validation.get('abnormal_cells')} abnormal) ranked at AUROC {words}"
    )


#: fewer held-back abnormal cells than this, and ``--rank-by auto``'s choice is said to rest on
#: too few. An AUROC over n abnormal cells has a standard error of at least about
#: sqrt(A (1 - A) / n) (Hanley and McNeil 1982, the abnormal cells' term, many normal cells):
#: 0.09 at A = 0.8 and n = 20, 0.4 at n = 1, about the gaps between the rankings it chooses
#: among (CRIC Pap, 80 abnormal cells: morphometry 0.81, model+morphometry 0.71, model 0.47)
MIN_ABNORMAL = 20


#: what was measured of Pap cells, said where nothing chose a Pap bundle's ranking
PAP_MEASURED = (
    "on Pap cells the networks of cyto's presets were measured near chance and the morphometric "
    "score well (CRIC: AUROC 0.84; docs/how-to/pap-cytology.md)"
)


def pap_unchosen_words() -> str:
    """What to do with a Pap bundle whose ranking nothing held back chose: rank by its
    morphometric score, or train with abnormal classes beside the normal ones."""
    return (
        f"{PAP_MEASURED}: rank by {passing('rank_by', 'morphometry')}, or train with abnormal "
        "classes beside the normal ones, so held-back cells choose"
    )


def few_abnormal_words(
    validation: dict | None,
    stain: str | None = None,
    morphometry: bool = False,
    alone: bool = False,
) -> str | None:
    """One line where ``--rank-by auto``'s choice rests on fewer than :data:`MIN_ABNORMAL`
    held-back abnormal cells (recomputed from the bundle's record each time), or on none
    where abnormal cells were given but too few normal ones to hold any back, or, for a Pap
    bundle with a morphometric score (``stain``, ``morphometry``), on none because it was
    trained on normal cells alone (``alone``): it ranked by a network near chance, said in a note of
    its training that ``echo=None`` dropped (hostile round 73, 1); else None."""
    if validation and validation.get("skipped"):
        return (
            f"{passing('rank_by', 'auto')} ranks by the model, never compared with the "
            f"morphometric score (on Pap cells the fast presets rank near chance, the "
            f"morphometric score does not; choose with {said('rank_by')}): abnormal cells were "
            f"given, but nothing was held back to compare them on: {_skipped_words(validation)}"
        )
    if not validation and alone and stain == "pap" and morphometry:
        return (
            f"{passing('rank_by', 'auto')} ranks by the model: it was trained on normal cells "
            f"alone, so nothing held back chose; {pap_unchosen_words()}"
        )
    if not validation or not validation.get("auroc"):
        return None
    n = int(validation.get("abnormal_cells") or 0)
    if n >= MIN_ABNORMAL:
        return None
    return (
        f"{passing('rank_by', 'auto')}'s choice rests on {n} held-back abnormal cell(s), fewer "
        f"than {MIN_ABNORMAL} (an AUROC's standard error on so few is about 0.1 or more): train "
        f"with more abnormal cells ({said('abnormal')}), or choose the ranking with "
        f"{said('rank_by')}"
    )


def unfitted_words(training: dict | None) -> list[str]:
    """One line for each thing ``cyto train`` could not fit on its training normals (their
    stain vectors, their morphometric score), with why and what falls back; [] when both were
    fitted (or a bundle of an earlier cyto records no reason)."""
    training = training or {}
    lines = []
    stain = training.get("stain_vectors") or {}
    if stain and not stain.get("separable", True):
        lines.append(
            f"the stain of the training cells could not be estimated ({stain.get('why')}), so "
            "cells scored with this model are not checked for another stain or lab; train on "
            "colour crops of the stain to have them checked"
        )
    why = training.get("morphometry_why")
    if training.get("morphometry") is None and why:
        lines.append(
            f"no morphometric score was fitted on the training normals ({why}): "
            f"{passing('rank_by', 'auto')} ranks by the model alone and "
            f"{said('rank_by')} morphometry is refused; check that the crops are cells of the "
            f"stain {setting('stain')} names, at its scale, and train again"
        )
    size = _nucleus_size_words(training.get("nucleus_size_check"))
    if size:
        lines.append(size)
    record = training.get("morphometry") or {}
    kept = {f.get("name") for f in record.get("features", [])}
    wanted = {name for name, side in MORPHOMETRY.get(record.get("stain"), ()) if side == "discount"}
    if record and wanted - kept:
        lines.append(
            f"the morphometric score of these {record['stain']} cells is without its "
            f"{', '.join(sorted(wanted - kept))} discount (a bundle of an earlier cyto, or "
            "normals whose outlines did not vary), so a large irregular 'nucleus' (dense "
            "cytoplasm, a fold, overlapping nuclei) ranks by its size alone; training again "
            "adds it where the normals' outlines vary"
        )
    return lines


def calibrated_column(rank_by: str | None) -> str:
    """The score table's column a calibration holds under the ranking ``rank_by`` (a table's
    ``cyto.rank_by``): what ranks its cells where that is each cell's own score (the model's
    ``score``, the ``morphometry_score``); a fused ranking ranks cells within their slide, so
    no calibration of other slides can hold it, and the model's score is held. A Pap bundle
    ranked by its morphometry was calibrated on the model's score, which its own held-back
    cells put at chance: a slide of 5 % lesions was triaged "no excess" (hostile round 58, 1)."""
    return "morphometry_score" if rank_by == "morphometry" else "score"


def spec_caution(spec) -> str | None:
    """:func:`few_abnormal_words` of a loaded bundle's model spec (:class:`cyto.bundle.ModelSpec`):
    the one caller's form of ``cyto score`` and ``cyto predict`` alike."""
    morphometric = Morphometric.of_spec(spec) is not None
    return few_abnormal_words(spec.validation, spec.stain, morphometric, spec.normals_alone)


def ranking_said(manifest: dict) -> dict:
    """What ``--rank-by auto`` ranks a bundle's cells by and why, and the warnings of what its
    training could not fit or rests on too few cells: one record for ``cyto info``'s lines and
    :func:`cyto.info`'s answer (``rank_by_auto``, ``rank_by_reason``, ``warnings``)."""
    validation = manifest.get("validation")
    how, why = choose_ranking(validation)
    from cyto.bundle import normals_alone

    training = manifest.get("training_data") or {}
    stain = (manifest.get("config") or {}).get("stain")
    few = few_abnormal_words(
        validation, stain, bool(training.get("morphometry")), normals_alone(training)
    )
    warnings = unfitted_words(manifest.get("training_data")) + ([few] if few else [])
    other = held_otherwise(manifest.get("calibration"), validation)
    return {
        "rank_by_auto": how,
        "rank_by_reason": why,
        "warnings": warnings + ([other] if other else []),
    }


def held_otherwise(cal: dict | None, validation: dict | None) -> str | None:
    """Why a bundle's calibration (its manifest record) holds another score than ``--rank-by
    auto`` ranks its cells by, or None: said by ``cyto score`` alone, after the slide, where
    ``cyto info`` read "auto ranks by morphometry" beside "of the model's score" and ``cyto
    calibrate`` said nothing (hostile round 59, 2)."""
    cal = cal or {}
    held, how = cal.get("column") or "score", choose_ranking(validation)[0]
    if cal.get("kind") != "slides" or held == calibrated_column(how):
        return None
    return (
        f"its calibration holds {held!r} (slides scored with --rank-by "
        f"{cal.get('rank_by') or 'model'}), but --rank-by auto ranks by {how}: p-values, FDR "
        "flags and burden of slides ranked so will not follow their ranking; calibrate again "
        "(--overwrite) on slide-negative slides scored with --rank-by auto"
    )


def resolve_rank_by(
    rank_by: str, morph: Morphometric | None, validation: dict | None, why: str | None = None
) -> str:
    """``model``, ``morphometry`` or ``model+morphometry`` for ``--rank-by``; an explicit ranking
    that needs a morphometric score the bundle does not record is a one-line error, with the
    reason training recorded (``why``, ``training_data.morphometry_why``) where there is one."""
    rank_by = RANK_BY_ALIASES.get(rank_by, rank_by)
    if rank_by not in RANK_BY:
        raise ConfigError(f"{said('rank_by')} must be one of {', '.join(RANK_BY)}, got {rank_by!r}")
    if rank_by == "auto":
        how = choose_ranking(validation)[0]
        return how if how == "model" or morph is not None else "model"
    if rank_by != "model" and morph is None and why:
        raise ConfigError(
            f"{passing('rank_by', rank_by)}: this bundle has no morphometric score of its "
            f"training normals: at training {why}; train again on crops of cells, or rank by the "
            "model alone"
        )
    if rank_by != "model" and morph is None:
        raise ConfigError(
            f"{passing('rank_by', rank_by)}: this bundle records no morphometry of its training "
            "normals (trained before cyto recorded it, or without normal cells); retrain it, or "
            "rank by the model alone"
        )
    return rank_by


def scorer_rank_by(scorer, rank_by: str) -> tuple[str, Morphometric | None]:
    """``rank_by`` resolved for a loaded scorer's bundle (:func:`resolve_rank_by`), and the
    bundle's morphometric score (None when it records none): every table carries its score."""
    spec = scorer.spec
    morph = Morphometric.of_spec(spec)
    return resolve_rank_by(rank_by, morph, spec.validation, spec.morphometry_why), morph
