"""Calibrate a model on slide-negative slides, and apply that calibration to a scored slide.

``cyto calibrate MODEL neg1/scores.parquet neg2/scores.parquet ...`` stores every score of those
slides, sorted, with the slide each came from (``calibration.npz`` in the bundle), and records in
the manifest what they are valid for: the model (:attr:`Bundle.scoring_id`), the graph and
precision that scored them, and the scoring options (crop size, detection, planes, mpp). It also
runs the procedures leave-one-slide-out on the calibration slides themselves: each slide against
the others, where every flag is a false one.

``cyto score`` then gives every cell a conformal p-value, flags cells at a false discovery rate,
estimates the abnormal burden with an interval, tests the slide against normal slides and checks
that the bulk of its scores looks like the calibration's (see :mod:`cyto.stats.conformal`).

The scores ``cyto train`` records for its own training cells are in-sample (lower than a new
slide's normal cells); they give quantiles for ``cyto info`` but no p-values or burden.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np

from cyto.bundle import CALIBRATION_FILE, CALIBRATION_QUANTILES, add_files, load_bundle
from cyto.data.morphometry import calibrated_column
from cyto.errors import ConfigError, CytoError, InputPathError, as_arg, warn_caller
from cyto.outputs_check import refuse_to_replace
from cyto.seal import check_rows, check_sealed_table, is_cyto_table
from cyto.staging import staged_dir
from cyto.stats import conformal
from cyto.tables import read_table

FDR_ALPHA = 0.1  # default target false discovery rate of the flagged cells
TRIAGE_LEVEL = 0.05  # default level of the slide test
TRIAGE_EXCESS, TRIAGE_NONE = "excess", "no excess"  # slide test at the triage level
#: fewer calibration slides than this measure the spread between normal slides (the bulk
#: check's tolerance) only roughly, and a refusal says so
FEW_CALIBRATION_SLIDES = 5
#: the burden status of a slide whose scores do not look like the calibration slides'
CALIBRATION_MISMATCH = "calibration mismatch"
BURDEN_QUANTILE = 0.99  # the burden counts cells above this quantile of the normal scores
#: fewer evaluable calibration cells than this: the burden counts every cell (see :func:`apply`)
MIN_EVALUABLE = 100
#: what the burden counts (``burden["counted"]``)
COUNTED_EVALUABLE, COUNTED_ALL = "evaluable", "all"
#: what ``cyto score --burden-cells`` may ask the burden to count
BURDEN_CELLS = (COUNTED_EVALUABLE, COUNTED_ALL)
# scoring options that change scores; a calibration holds only for the same values. Each by
# its field of a calibration's record (calibration_key_names); the settings (JSON) by their flags
_META_KEYS = {
    "cyto.scoring_id": "model",
    "cyto.precision": "precision",
    "cyto.graph": "graph",
    "cyto.result_key": None,
}


def _refuse_scored_otherwise(metas: list[dict], names: list[str]) -> None:
    """Calibration tables scored otherwise than the first (another model, precision, graph or
    setting) refused in one line naming the table and what differs as the user set it (``--tile
    1024 -> 512``), as ``cyto score`` says a slide scored unlike its calibration; it printed the
    two settings' whole JSON under an internal name (hostile round 37, 3)."""
    from cyto.reuse import differences

    first = metas[0]
    for meta, name in zip(metas[1:], names[1:], strict=True):
        for key, field in _META_KEYS.items():
            was, now = first.get(key), meta.get(key)
            if was == now:
                continue
            moved: list[str] = []
            if field is not None:
                moved = differences({field: was}, {field: now}, calibration_key_names())
            else:  # the settings the table was scored with (cyto.result_key, JSON)
                with contextlib.suppress(TypeError, ValueError):
                    moved = differences(json.loads(was or "{}"), json.loads(now or "{}"))
            why = "; ".join(moved) or f"{key.removeprefix('cyto.')} {was} -> {now}"
            raise ConfigError(
                f"{name} was scored otherwise than {names[0]} ({why}): score every "
                "slide-negative slide the same way"
            )


def _pooled(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scores of all slides, sorted (stable), the slide (index in ``parts``) of each, and
    the order that sorts the slides' scores put end to end."""
    if not parts:
        return np.empty(0), np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int64)
    values = np.concatenate(parts)
    slide = np.concatenate([np.full(len(p), i, dtype=np.int32) for i, p in enumerate(parts)])
    order = np.argsort(values, kind="stable")
    return values[order], slide[order], order


class Calibration:
    """A bundle's slide-negative calibration: each calibration slide's scores, how they are
    normalized, and what they hold for.

    ``evaluable``: per slide, which of its cells its score table marked evaluable (in focus,
    not crowded, at the model's scale: :mod:`cyto.infer.quality`), or None when a table had no
    such column (scored with ``--adequacy none``, or by a cyto before it): the burden then
    counts every cell."""

    def __init__(self, parts: list[np.ndarray], info: dict, evaluable=None):
        self.parts, self.info = parts, info
        self.evaluable: list[np.ndarray] | None = evaluable
        self.normalization = str(info.get("normalization", "none"))
        self.reference, self.reference_slide, _ = _pooled(
            [conformal.normalize(p, self.normalization)[0] for p in parts]
        )

    @classmethod
    def of(cls, bundle) -> Calibration | None:
        info = bundle.manifest.get("calibration") or {}
        if info.get("kind") != "slides" or CALIBRATION_FILE not in bundle.manifest["files"]:
            return None
        with np.load(io.BytesIO(bundle.file_bytes(CALIBRATION_FILE)), allow_pickle=False) as z:
            scores, slide = z["scores"], z["slide"]
            ev = z["evaluable"] if "evaluable" in z.files else None
        n = len(info.get("slides", []))
        return cls(
            [scores[slide == j] for j in range(n)],
            info,
            None if ev is None else [ev[slide == j] for j in range(n)],
        )

    @property
    def column(self) -> str:
        """The score table's column the calibration holds (:func:`calibrated_column`): the
        model's ``score`` for a calibration made before it was recorded."""
        return str(self.info.get("column") or "score")

    @property
    def evaluable_cells(self) -> int | None:
        """How many calibration cells are evaluable (None: not recorded)."""
        return None if self.evaluable is None else int(sum(e.sum() for e in self.evaluable))

    def evaluable_parts(self) -> list[np.ndarray]:
        """Each calibration slide's evaluable cells' scores (slides without one left out)."""
        return [p[e] for p, e in zip(self.parts, self.evaluable, strict=True) if e.any()]

    def rate(self, quantile: float = BURDEN_QUANTILE, evaluable: bool = False):
        """The normal cells' exceedance rate at ``quantile`` (:func:`conformal.normal_rate`);
        with ``evaluable``, that of the evaluable calibration cells only, each slide's
        normalized by its evaluable cells."""
        if not evaluable:
            return conformal.normal_rate(self.reference, self.reference_slide, quantile)
        ref, slide, _ = _pooled(
            [conformal.normalize(p, self.normalization)[0] for p in self.evaluable_parts()]
        )
        return conformal.normal_rate(ref, slide, quantile)

    def counted(
        self, evaluable: np.ndarray | None, why_all: str | None = None
    ) -> tuple[str, str | None]:
        """(what the burden of a slide with per-cell ``evaluable`` (None: not judged) counts,
        :data:`COUNTED_EVALUABLE` or :data:`COUNTED_ALL`; why all cells, when it could not
        count the evaluable ones). Cells out of focus, crowded or off the model's scale are the
        ones a one-class model ranks high for the wrong reason: counted, a blurred slide reads
        as an excess of abnormal cells. The normal rate they are held against then has to come
        from the calibration's evaluable cells too. ``why_all``: why ``evaluable`` is None
        (the default: the slide was not judged)."""
        if evaluable is None:
            return COUNTED_ALL, why_all or "the slide's cells were not judged (--adequacy none)"
        if self.evaluable is None:
            return COUNTED_ALL, (
                "the calibration slides' tables mark no evaluable cells (scored with "
                "--adequacy none, or before cyto recorded them): calibrate again from tables "
                "scored with an adequacy rule to count evaluable cells only"
            )
        if self.evaluable_cells < MIN_EVALUABLE:
            return COUNTED_ALL, (
                f"only {self.evaluable_cells} of the calibration's {len(self.reference)} cells "
                f"are evaluable, fewer than {MIN_EVALUABLE}"
            )
        return COUNTED_EVALUABLE, None

    def differences(self, scorer, result_key: dict) -> list[str]:
        """How this run differs from the runs the calibration slides were scored with, by flag
        (:func:`cyto.reuse.check_reuse`: a calibration is reused only for the scoring it was
        made with); a field the calibration did not record is not compared."""
        from cyto.reuse import check_reuse

        valid = self.info.get("valid_for", {})
        now = {
            "model": scorer.bundle.scoring_id,
            "precision": scorer.precision,
            "graph": scorer.graph_ran,
        }
        calibrated = valid.get("options") or {}
        options = {
            k: v
            for k, v in json.loads(json.dumps(result_key, default=str)).items()
            if k in calibrated and k not in ("precision", *READ_AT_MODEL_SCALE)
        }
        recorded = {k: valid[k] for k in now if k in valid}
        recorded["options"] = {k: calibrated[k] for k in options}
        current = {**{k: now[k] for k in recorded if k in now}, "options": options}
        return list(check_reuse(recorded, current, names=calibration_key_names()).differs)


def held_values(cal: Calibration, scores: np.ndarray, table) -> tuple[np.ndarray, str | None]:
    """(the values of a slide's cells that ``cal`` holds, why they are not there or None): its
    ``score`` (``scores``), or the column of ``table`` its :attr:`Calibration.column` names."""
    if cal.column == "score":
        return scores, None
    if table is None or cal.column not in table.column_names:
        return (
            scores,
            f"the calibration holds {cal.column!r}, which this table has not: calibrate again",
        )
    return np.asarray(table[cal.column].to_numpy(zero_copy_only=False), dtype=np.float64), None


def held_words(info: dict) -> str:
    """What a calibration (its manifest record) holds, in words: what its p-values, flags and
    burden are of (``cyto calibrate``, ``cyto info``)."""
    if (info.get("column") or "score") == "morphometry_score":
        return "the morphometric score (morphometry_score), which ranks the cells"
    fused = info.get("rank_by") == "model+morphometry"
    return "the model's score" + (" (a fused ranking ranks within each slide)" if fused else "")


def ranking_words(column: str, rank_by: str) -> str | None:
    """Why p-values, flags and burden follow another score than the cells' ranking, or None."""
    if calibrated_column(rank_by) == column:
        return None
    if rank_by == "model+morphometry":
        return (
            "the cells are ranked by the fused score, which ranks them within the slide: no "
            f"calibration holds it, so p-values, FDR flags and burden follow {column!r}"
        )
    return (
        f"the cells are ranked by {rank_by}, but the calibration holds {column!r}: p-values, "
        f"FDR flags and burden follow {column!r}, not the ranking; calibrate again (cyto "
        "calibrate --overwrite) on slide-negative slides scored with this ranking"
    )


#: options that only bring a slide to the model's scale, which a calibration assumes of its
#: slides: not a way of scoring that differs from theirs (`--rescale` on a case was told to
#: "calibrate again", though on slides at the model's scale it changes no score: round 69, 4)
READ_AT_MODEL_SCALE = ("rescale",)


def calibration_key_names() -> dict[str, str]:
    """The fields of a calibration's record by the user's names."""
    from cyto.flags import ran

    return {
        "model": "MODEL (its trained arrays)",
        # auto chooses the precision when --precision is not given: named as what ran, not as
        # a flag the user never passed ("--precision bf16 -> int8" after an int8 export)
        "precision": ran("precision"),
        "graph": "the graph scored with (--backend, --precision)",
        "options": "",
    }


def _table_of(path: Path) -> Path:
    """``path``'s score table: the file itself, or a slide's cyto score folder (its
    scores.parquet). A cohort's output folder is refused by name: it may hold slides that are
    not negative, and every slide given is taken as negative."""
    if path.is_file():
        return path
    if not path.exists():
        raise InputPathError(f"score table {path} does not exist")
    if (path / "scores.parquet").is_file():
        return path / "scores.parquet"
    slides = sorted(p.name for p in path.iterdir() if (p / "scores.parquet").is_file())
    if slides:
        names = ", ".join(slides[:4]) + (" ..." if len(slides) > 4 else "")
        raise InputPathError(
            f"{path} holds the scores of {len(slides)} slide(s) ({names}): give the "
            f"slide-negative ones by name (e.g. {path / slides[0]}), never the whole folder"
        )
    from cyto.seal import refuse_unfinished

    refuse_unfinished(path)  # a slide's run stopped before its first table
    raise InputPathError(f"{path} is a folder without scores.parquet: give cyto score's tables")


def _read_table(path: Path, bundle) -> tuple[np.ndarray, dict[str, str], str, np.ndarray | None]:
    """(scores, file metadata, slide identity, the ``evaluable`` column or None) of a
    slide-negative score table, or the one-line error of a table that cannot calibrate this
    bundle."""
    path = _table_of(Path(path))
    check_sealed_table(path)  # a scored folder's table only through its seal
    try:
        table = read_table(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        from cyto.slides.readers import SLIDE_SUFFIXES

        if path.suffix.lower() in SLIDE_SUFFIXES:  # the natural mistake: the slide, unscored
            raise ConfigError(
                f"{path} is a slide, not a score table: score it first (cyto score {as_arg(path)} "
                f"--model {as_arg(bundle.path)} --out DIR), then give DIR/{path.stem} or its "
                "scores.parquet"
            ) from exc
        raise ConfigError(f"{path} is not a readable Parquet score table ({exc})") from exc
    if "score" not in table.column_names:
        raise ConfigError(f"{path} has no 'score' column: pass scores.parquet from cyto score")
    meta0 = table.schema.metadata or {}
    held = calibrated_column(meta0.get(b"cyto.rank_by", b"").decode(errors="replace") or None)
    if held not in table.column_names:
        raise ConfigError(
            f"{path} is ranked by its {held} but has no such column: score the slide again "
            "with cyto score"
        )
    if not is_cyto_table(table):  # another model's scores, with their record stripped, were
        raise ConfigError(  # recorded as a calibration valid for this one
            f"{path} carries no record of the model that scored it (not a table cyto score "
            f"wrote): calibrate from the score tables of this model's own runs (cyto score "
            f"--model {bundle.path})"
        )
    check_rows(table, path, "score its slide again with cyto score")
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if "cyto.slide" not in meta and "cyto.slide_identity" not in meta:
        # a cyto predict table (patches) was taken for a slide's, its labels called "--truth"
        raise ConfigError(
            f"{path} is a table of patches (cyto predict), not a slide's score table: a "
            f"calibration is made from slide-negative slides scored with cyto score --model "
            f"{bundle.path}"
        )
    method = meta.get("cyto.method", "")
    if method and method != bundle.method:
        raise ConfigError(
            f"{path} was scored by a {method} model, not this {bundle.method} bundle: scores "
            "of different models cannot calibrate each other"
        )
    if meta.get("cyto.scoring_id", bundle.scoring_id) != bundle.scoring_id:
        raise ConfigError(
            f"{path} was scored by another model (other weights) than {bundle.path}: "
            "score the slide-negative slides with this bundle first"
        )
    planted, labelled = _planted(path, table, meta.get("cyto.slide"))
    refuse_planted(
        meta.get("cyto.slide") or path,
        planted,
        "calibrate",
        labelled=labelled,
        slide_path=meta.get("cyto.slide"),
    )
    summary = _sealed_summary(path, meta.get("cyto.slide"))
    warn_unsatisfactory(meta.get("cyto.slide") or path, summary.get("adequacy"), "calibrate")
    burden = summary.get("burden")
    if isinstance(burden, dict) and str(burden.get("triage") or "").startswith(TRIAGE_EXCESS):
        # taken (a new calibration may be what corrects the one that triaged it), but said:
        # a slide of abnormal cells taken as negative raises the null for every slide after

        from cyto.errors import CytoWarning

        p = burden.get("slide_p_value")
        p_words = f", slide p={p:.2g}" if isinstance(p, (int, float)) else ""
        warn_caller(
            f"{meta.get('cyto.slide') or path}: its calibrated scoring triaged it "
            f"{TRIAGE_EXCESS!r}{p_words}, yet it is taken as a negative slide: calibrate "
            "on slides known to be negative (leave it out, unless that calibration was "
            "wrong)",
            CytoWarning,
        )
    slide = meta.get("cyto.slide_identity") or meta.get("cyto.slide") or str(path)
    evaluable = None
    if "evaluable" in table.column_names:
        column = table["evaluable"]
        evaluable = np.asarray(column.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(table[held], dtype=np.float64), meta, slide, evaluable


def _planted(path: Path, table, slide: str | None) -> tuple[int, bool]:
    """The abnormal cells of the ground truth a score table's slide was scored with: the count
    in its summary (``summary.json`` beside ``scores.parquet``, of the same slide, trusted only
    when the folder's seal holds: :func:`cyto.seal.read_sealed`), else the cells its ``label``
    column marks abnormal (a table copied on its own, or a folder edited since: then
    ``labelled``, as two detections may match one planted cell); 0 without truth."""
    data = _sealed_summary(path, slide)
    if data:
        truth = data.get("truth")
        if isinstance(truth, dict) and isinstance(truth.get("planted_abnormal"), int):
            return truth["planted_abnormal"], False
    if "label" in table.column_names:
        labels = np.asarray(table["label"].to_numpy(zero_copy_only=False), dtype=np.float64)
        return int(np.sum(labels == 1)), True
    return 0, False


def _sealed_summary(path: Path, slide: str | None) -> dict:
    """The ``summary.json`` beside a score table, when its folder's seal holds and it is of
    the same slide (:func:`cyto.seal.read_sealed`); {} otherwise (a table copied on its own,
    or a folder edited since)."""
    from cyto.seal import read_sealed

    sealed = read_sealed(path.parent)
    data = sealed.summary if sealed.ok else {}
    return data if isinstance(data, dict) and data.get("slide") == slide else {}


def truth_beside(slide: object, options: dict | None = None) -> tuple[object, int] | None:
    """The ground truth cyto synth wrote beside a slide (``NAME.cells.parquet``,
    :func:`cyto.data.synth.slide.ground_truth_path`; beside a slide's URL too, read with the
    storage ``options``: a composed slide uploaded with its truth) and the cells it marks
    abnormal, when it marks any; None otherwise (no such table, one without a ``label``
    column, a DICOMweb series). A slide scored without ``--truth`` holds its planted cells all
    the same."""
    from cyto.data.synth.slide import ground_truth_path
    from cyto.slides.remote import is_url

    if not slide:
        return None
    if is_url(slide):
        return _truth_at_url(str(slide), options)
    path = ground_truth_path(Path(str(slide)))
    try:
        if not path.is_file():
            return None
        table = read_table(path, columns=["label"])
    except Exception:  # noqa: BLE001 - not a truth table of cyto's: nothing known of the slide
        return None
    return _abnormal(path, table)


def _abnormal(where: object, table) -> tuple[object, int] | None:
    try:
        labels = np.asarray(table["label"].to_numpy(zero_copy_only=False), dtype=np.float64)
    except Exception:  # noqa: BLE001 - no label column of numbers: nothing known
        return None
    n = int(np.sum(labels == 1))
    return (where, n) if n else None


def _truth_at_url(url: str, options: dict | None) -> tuple[object, int] | None:
    """:func:`truth_beside` of a slide by URL: ``NAME.cells.parquet`` beside it on the same
    server, read by byte range; None where there is none or it cannot be read."""
    import pyarrow.parquet as pq

    from cyto.data.synth.slide import ground_truth_path
    from cyto.errors import CytoError
    from cyto.slides.remote import RemoteObject, SlideURL

    ref = SlideURL(url, options)
    if ref.dicomweb or "?" in url or not ref.name:
        return None
    head = url[: len(url) - len(url.rpartition("/")[2])]  # the name beside it, as synth names it
    truth = SlideURL(head + ground_truth_path(Path(ref.name)).name, options)
    try:
        # asked of the server now (never an object opened earlier in this process)
        table = pq.read_table(RemoteObject(truth).file(), columns=["label"])
    except (CytoError, OSError, ValueError, KeyError):
        return None
    return _abnormal(truth, table)


def refuse_planted(
    slide: object,
    planted: int | None,
    use: str,
    burden: dict | None = None,
    labelled: bool = False,
    slide_path: object = None,
    options: dict | None = None,
) -> None:
    """A scored slide whose own ground truth (``cyto score --truth``, or the table cyto synth
    wrote beside ``slide_path``: :func:`truth_beside`) holds abnormal cells is no negative
    slide: refused in one line naming it and the count. ``cyto calibrate`` takes every cell it
    is given as normal, and so does ``cyto data cells`` (``use``: what the command does with
    them). Nor is a slide whose own calibrated scoring triaged it ``excess`` (its summary's
    ``burden``): ``cyto data cells`` gives it; ``cyto calibrate`` does not, as a new
    calibration may be what corrects the one that triaged it. Options in the caller's words
    (``truth=`` to a Python caller: round 73, 3)."""
    from cyto.flags import said

    truth = said("truth").rstrip("=")
    if planted and labelled:  # counted from a loose table's label column: detections
        raise ConfigError(
            f"{slide}: its score table marks {planted} detected cell(s) abnormal (its label "
            f"column, from {truth}); {use} from negative slides only"
        )
    if planted:
        raise ConfigError(
            f"{slide}: the slide was scored with {truth} holding {planted} abnormal cell(s); "
            f"{use} from negative slides only"
        )
    beside = truth_beside(slide_path, options) if slide_path is not None else None
    if beside is not None:  # cyto synth's planted cells were cut as normal, without a word
        raise ConfigError(
            f"{slide}: the slide's ground truth beside it ({beside[0]}) marks {beside[1]} "
            f"cell(s) abnormal; {use} from negative slides only"
        )
    if isinstance(burden, dict) and burden.get("triage") == TRIAGE_EXCESS:
        p = burden.get("slide_p_value")
        p_words = f", slide p={p:.2g}" if isinstance(p, (int, float)) else ""
        raise ConfigError(
            f"{slide}: its calibrated scoring triaged the slide {TRIAGE_EXCESS!r}{p_words}; "
            f"{use} from negative slides only"
        )
    if isinstance(burden, dict) and burden.get("status") == CALIBRATION_MISMATCH:
        # a slide whose scores do not look like the negatives' (a 30 % abnormal slide shifts
        # them so) was cut as normal training cells without a word
        why = str(burden.get("reason") or "").split(":")[0] or CALIBRATION_MISMATCH
        raise ConfigError(
            f"{slide}: its calibrated scoring could not judge the slide ({why}), so nothing "
            f"says it is negative; {use} from slides it triaged 'no excess' (slides of another "
            "preparation: calibrate the model on negative slides like them first)"
        )


def calibration_slide_words(info: dict, identity: str, name: str) -> str | None:
    """Why a slide's calibrated result is no test of it, when ``identity`` is one of the slides
    the calibration ``info`` was made from (its cells are in the null it is held against, so
    it reads "no excess" whatever it holds); None otherwise, or for a calibration that did not
    record its slides' identities."""
    slides = info.get("slides") or ()
    if identity and any(isinstance(s, dict) and s.get("identity") == identity for s in slides):
        return (
            f"{name} is one of this calibration's own negative slides: its cells are in the "
            "null its p-values, flags and burden are held against, so they are no test of it"
        )
    return None


def training_slide_words(manifest: dict, identity: str, name: str) -> str | None:
    """Why a slide's ranking is no test of the model, when its cells trained it (``cyto data
    cells`` -> ``cyto train``: the bundle's ``training_data.slides``): its cells score low for
    having been learned, not for being normal. None otherwise."""
    trained = (manifest.get("training_data") or {}).get("slides") or ()
    if identity and identity in trained:
        return (
            f"{name} is one of the slides this model's training cells were cut from (cyto data "
            "cells): its cells score low for having been learned, so its ranking and burden "
            "are no test of the model; score slides it did not train on"
        )
    return None


def _quantiles(parts: list[np.ndarray], marked: list[np.ndarray] | None) -> dict | None:
    """:data:`CALIBRATION_QUANTILES` of the cells ``marked`` evaluable in ``parts`` (None:
    not marked, or none evaluable)."""
    if marked is None:
        return None
    kept = np.concatenate([p[e] for p, e in zip(parts, marked, strict=True)])
    if not len(kept):
        return None
    return {str(q): float(np.quantile(kept, q)) for q in CALIBRATION_QUANTILES}


def quantile_words(record: dict) -> str:
    """The median and 99th percentile of a calibration ``record``'s cells, as
    ``cyto calibrate`` says them: of every cell, and of the evaluable cells where the burden
    counts those (:func:`burden_counts_words`); said to be of the raw scores where the record
    normalizes each slide's."""
    q = record["quantiles"]
    # of the scores as scored: under a normalization they read the same whatever it is, and
    # were taken for its (hostile round 67, 12)
    raw = "" if record.get("normalization", "none") == "none" else "raw scores: "
    said = f"{raw}median {q['0.5']:.4g}, 99th percentile {q['0.99']:.4g}"
    ev, qe = record.get("evaluable_cells"), record.get("quantiles_evaluable")
    if ev is not None and ev >= MIN_EVALUABLE and qe:
        said += (
            f" (of the {ev:,} evaluable cells the burden counts: {qe['0.5']:.4g}, {qe['0.99']:.4g})"
        )
    return said


def burden_counts_words(record: dict) -> str:
    """What the burden of slides scored against the calibration ``record`` counts, by the rule
    :meth:`Calibration.counted` applies (evaluable cells where at least :data:`MIN_EVALUABLE`
    of the calibration's are, else every cell), in one line."""
    from cyto.flags import passing

    n, ev = record.get("n"), record.get("evaluable_cells")
    if ev is None:
        return (
            "the burden counts every cell: a table marks no evaluable cells (scored with "
            f"{passing('adequacy', 'none')}?)"
        )
    if ev < MIN_EVALUABLE:
        return (
            f"the burden counts every cell: only {ev:,} of the {n:,} calibration cells are "
            f"evaluable (in focus, not crowded, at the model's scale), fewer than {MIN_EVALUABLE}"
        )
    return (
        f"the burden counts evaluable cells: {ev:,} of the {n:,} calibration cells are (in "
        "focus, not crowded, at the model's scale)"
    )


def above_words(quantile: float | None) -> str:
    """What the burden counts, in a few words: the cells above the normal cells' threshold
    (``above the normal 99th percentile``). Its interval is of those cells; an abnormal cell the
    model scores as normal is not counted, so the burden is a lower bound (hostile round 10,
    N32: "0.00% (95% CI 0.00-0.00%)" read as no abnormal cell on a slide with three)."""
    if quantile is None:
        return "above the normal cells' threshold"
    pct = 100 * float(quantile)
    shown = f"{pct:.1f}".rstrip("0").rstrip(".")
    suffix = "th"
    if shown.isdigit() and int(shown) % 100 not in (11, 12, 13):
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(int(shown) % 10, "th")
    return f"above the normal {shown}{suffix} percentile"


#: what a burden counts, recorded beside it (summary.json ``burden.counts``)
BURDEN_COUNTS = (
    "cells scoring {above}; an abnormal cell the model scores as normal is not counted, so the "
    "burden and its interval are a lower bound"
)


def warn_unsatisfactory(slide: object, adequacy: dict | str | None, use: str) -> None:
    """A scored slide its own adequacy rule judged unsatisfactory (too few evaluable cells:
    out of focus, crowded, off the model's scale) is a poor sample of a negative slide's
    normal cells: said in one warning with the rule's reasons (its cells are still taken: a
    lab may judge otherwise, and a slide read at the wrong scale is scored again first).
    ``adequacy``: the summary's block (``result``, ``reasons``) or its words
    (``unsatisfactory: REASONS``); None: not judged."""
    if isinstance(adequacy, dict):
        reasons = "; ".join(map(str, adequacy.get("reasons") or ()))
        adequacy = f"{adequacy.get('result')}: {reasons}"
    if isinstance(adequacy, str) and adequacy.startswith("unsatisfactory"):
        from cyto.errors import CytoWarning
        from cyto.flags import said

        why = adequacy.partition(":")[2].strip() or "unsatisfactory"
        warn_caller(
            f"{slide}: its adequacy is unsatisfactory ({why}): its cells are a poor "
            f"sample of a negative slide's; {use} from satisfactory negative slides (a "
            f"slide read at the wrong scale: score it again with its true {said('slide_mpp')})",
            CytoWarning,
        )


def refuse_training_slide(manifest: dict, identity: str, name: object) -> None:
    """A slide whose cells trained the model (``cyto data cells`` -> ``cyto train``: the bundle's
    ``training_data.slides``) is no calibration slide: the model has seen its cells, so they
    score lower than an unseen negative slide's, and the null drawn from them would call
    "excess" on negative slides too often."""
    trained = (manifest.get("training_data") or {}).get("slides") or ()
    if identity in trained:
        raise ConfigError(
            f"{name}: its cells trained this model (cut by cyto data cells), so its scores are "
            "not those of an unseen negative slide: calibrate on negative slides the model did "
            "not train on"
        )


def refuse_repeated_slides(given: list[tuple[str, object]]) -> None:
    """Where each slide counts once (a calibration's negative slides, training cells cut from
    slides): refuse two of ``given`` ((slide identity, what the user named)) that are the same
    slide by content, whatever their names or folders, in one line naming both."""
    seen: dict[str, object] = {}
    for identity, name in given:
        if identity in seen:
            raise ConfigError(f"{name} and {seen[identity]} score the same slide: give it once")
        seen[identity] = name


def calibrate_from_tables(
    model: Path,
    tables: list[Path],
    min_cells: int = 100,
    alpha: float = FDR_ALPHA,
    normalization: str = conformal.DEFAULT_NORMALIZATION,
    overwrite: bool = False,
    storage_options: dict | None = None,
) -> dict:
    """Store the slide-negative calibration of ``tables`` in the bundle; returns its record.
    A table may be given by its URL (``s3://bucket/out/slide/scores.parquet`` or the slide's
    folder, with fsspec ``storage_options``): it is read through its seal, as a local one.
    A bundle's calibration is replaced only with ``overwrite``; a table whose slide was scored
    with truth holding abnormal cells is refused (:func:`refuse_planted`)."""
    from cyto.flags import check_choice, said

    check_choice("normalize", normalization, conformal.NORMALIZATIONS)
    from cyto.bundle import rewriting

    # --overwrite replaces the calibration: a damaged or missing one is what it repairs
    with rewriting([CALIBRATION_FILE] if overwrite else []):
        bundle = load_bundle(Path(model), weights=False)
    from cyto.outputs_check import check_writable, named_input

    check_writable(bundle.path, flag=f"{named_input('MODEL', model)}:")  # before the work
    if not tables:
        raise ConfigError("give at least one scores.parquet of a slide-negative slide")
    from cyto.location import table_here

    parts, evaluable, metas, names, seen = [], [], [], [], []
    for given in tables:
        t, where = table_here(given, storage_options)
        try:
            scores, meta, identity, ev = _read_table(Path(t), bundle)
        except CytoError as exc:
            raise where.translated(exc) from None
        seen.append((identity, given))
        refuse_repeated_slides(seen)
        refuse_training_slide(bundle.manifest, identity, meta.get("cyto.slide", str(t)))
        parts.append(scores)
        evaluable.append(ev)
        metas.append(meta)
        names.append(meta.get("cyto.slide", str(t)))
    _refuse_scored_otherwise(metas, [str(g) for g in tables])
    rankings = [m.get("cyto.rank_by") or "model" for m in metas]
    columns = [calibrated_column(r) for r in rankings]
    if len(set(columns)) > 1:
        other = next(i for i, c in enumerate(columns) if c != columns[0])
        raise ConfigError(
            f"{tables[0]} is ranked by {rankings[0]} and {tables[other]} by {rankings[other]}: "
            "a calibration holds one score; score the slide-negative slides with one "
            f"{said('rank_by').rstrip('=')}"
        )
    n = sum(len(p) for p in parts)
    if n < min_cells:
        raise ConfigError(f"need at least {min_cells} scored cells to calibrate, got {n}")
    replaced = f"the calibration of {bundle.path} ({CALIBRATION_FILE})"
    # after the tables are checked: what is wrong with them first
    refuse_to_replace(bundle.path / CALIBRATION_FILE, overwrite, name=replaced)
    allv, slide, order = _pooled(parts)
    # the burden counts evaluable cells only when every calibration table says which they are
    marked = None if any(e is None for e in evaluable) else evaluable
    spread = [conformal.location_scale(p) for p in parts]
    first = metas[0]
    record = {
        "kind": "slides",
        "file": CALIBRATION_FILE,
        "source": f"{n} cells of {len(tables)} slide-negative slide(s)",
        "n": int(n),
        # None: a table did not mark its evaluable cells, and the burden counts every cell
        "evaluable_cells": None if marked is None else int(sum(e.sum() for e in marked)),
        "normalization": normalization,
        # the score table's column held (calibrated_column), and the ranking it was made under
        "column": columns[0],
        "rank_by": rankings[0],
        "slides": [
            {
                "slide": names[i],
                # what a slide scored later is known by (a calibration slide is no test of it)
                "identity": seen[i][0],
                "table": str(tables[i]),
                "cells": int(len(p)),
                "evaluable_cells": None if marked is None else int(marked[i].sum()),
                "median": spread[i][0],
                "iqr": spread[i][1],
            }
            for i, p in enumerate(parts)
        ],
        "quantiles": {str(q): float(np.quantile(allv, q)) for q in CALIBRATION_QUANTILES},
        # of the evaluable cells, which the burden counts (calibrate printed all cells' 99th
        # percentile beside a burden of the evaluable ones: round 58); None: none marked
        "quantiles_evaluable": _quantiles(parts, marked),
        "ties": conformal.TIES,
        "valid_for": {
            "model": bundle.scoring_id,
            "precision": first.get("cyto.precision"),
            "graph": first.get("cyto.graph"),
            "options": json.loads(first["cyto.result_key"]) if "cyto.result_key" in first else None,
        },
    }
    record.update(leave_one_slide_out(parts, normalization, alpha, marked))
    for i, row in enumerate((record["leave_one_slide_out"] or {}).get("per_slide", ())):
        row["slide"] = names[i]  # which slide each is (round 69, 5)
    arrays = {"scores": allv, "slide": slide}
    if marked is not None:
        arrays["evaluable"] = np.concatenate(marked)[order]

    def unless_calibrated(manifest: dict) -> dict:
        # again under the bundle's lock: another calibration written since the check above
        # (two runs at once) is refused as one written before, never replaced unasked
        if not overwrite and ("calibration" in manifest or CALIBRATION_FILE in manifest["files"]):
            refuse_to_replace(bundle.path / CALIBRATION_FILE, False, name=replaced)
        return {"calibration": record}

    with staged_dir(bundle.path, "calibrating") as tmp:  # one per run
        target = tmp / CALIBRATION_FILE
        np.savez(target, **arrays)
        add_files(bundle.path, {CALIBRATION_FILE: target}, unless_calibrated)
    from cyto.data.morphometry import held_otherwise

    other = held_otherwise(record, bundle.manifest.get("validation"))
    if other is not None:
        from cyto.errors import CytoWarning

        warn_caller(f"{bundle.path}: {other}", CytoWarning)
    return record


def calibrated_lines(model: Path | str, cal: dict) -> list[str]:
    """What ``cyto calibrate`` says of the calibration ``cal`` it stored in ``model``, each a
    line: where it is and what it holds, the leave-one-slide-out check, what the burden counts
    and what it assumes; :func:`cyto.calibrate` returns and echoes the same lines."""
    lines = [
        f"calibrated {model} on {cal['source']} ({cal['normalization']} normalization), "
        f"holding {held_words(cal)}: {quantile_words(cal)}"
    ]
    loso = loso_words(cal)
    if loso:
        lines.append(loso)
    return [*lines, burden_counts_words(cal), f"assumes: {cal['assumes']}"]


def _against(
    scores: np.ndarray,
    cal: Calibration,
    alpha: float,
    interval: float,
    confidence: float | None = None,
    evaluable: np.ndarray | None = None,
    why_all: str | None = None,
) -> dict:
    """Everything one slide's scores give against a calibration; the flags from
    calibration-conditional p-values when ``confidence`` is given. p-values and flags are every
    cell's; the burden and the slide test count the cells :meth:`Calibration.counted` says:
    the evaluable ones (normalized by themselves) against the calibration's evaluable ones,
    where both are marked; ``burden`` is None when the slide has none. The bulk check is made
    over every cell (``bulk``: it guards the flags, which are every cell's) and, when the
    evaluable cells are counted, over those too (``bulk_counted``: it guards the burden)."""
    x, loc, scale = conformal.normalize(scores, cal.normalization)
    counted, why = cal.counted(evaluable, why_all)
    use = counted == COUNTED_EVALUABLE
    rate = cal.rate(evaluable=use)
    if use:  # blurred or crowded cells would move the slide's location as well
        x_counted, loc, scale = (
            conformal.normalize(scores[evaluable], cal.normalization)
            if evaluable.any()
            else (None, loc, scale)
        )
    else:
        x_counted = x
    p = conformal.p_values(x, cal.reference)
    p_flag = (
        p if confidence is None else conformal.conditional_p_values(x, cal.reference, confidence)
    )
    return {
        "p": p,
        "p_flag": p_flag,
        "rate": rate,
        "counted": counted,
        "counted_why": why,
        "raw_threshold": loc + rate.threshold * scale,
        "burden": None if x_counted is None else conformal.burden(x_counted, rate, interval),
        "slide_p": None if x_counted is None else conformal.slide_p_value(x_counted, rate),
        "flagged": conformal.bh(p_flag, alpha),
        "bulk": conformal.bulk_deviations(scores, cal.parts, cal.normalization),
        "bulk_counted": (
            conformal.bulk_deviations(scores[evaluable], cal.evaluable_parts(), cal.normalization)
            if use
            else None
        ),
    }


def loso_words(cal: dict, level: float = TRIAGE_LEVEL) -> str | None:
    """The leave-one-slide-out check of a calibration record in one line: how often BH flagged
    a normal slide's cells, whether the burden interval held 0, and the normal slides the
    slide test would call an excess at ``level``, by name (one of five negatives read p=0.011,
    unsaid: hostile round 69, 5). None without the check (one slide)."""
    loso = cal.get("leave_one_slide_out")
    if not loso:
        return None
    rows = loso.get("per_slide") or []
    excess = [
        f"{r.get('slide') or f'slide {i + 1}'} p={r['slide_p_value']:.2g}"
        for i, r in enumerate(rows)
        if r.get("slide_p_value") is not None and r["slide_p_value"] <= level
    ]
    over = loso["slides_with_false_flags"] / loso["slides"] > loso["alpha"]
    return (
        f"leave one slide out: BH at {loso['alpha']} flagged cells on "
        f"{loso['slides_with_false_flags']}/{loso['slides']} normal slides (all flags false; "
        f"expected at most {loso['alpha']:.0%} of slides"
        + ("; more here: chance on few slides, or a slide unlike the others" if over else "")
        + f"), burden interval held 0 on {loso['burden_interval_holds_zero']}/"
        f"{loso['slides_with_a_burden']}; the slide test at {level:g} would call "
        f"{len(excess)}/{len(rows)} normal slides an excess"
        + (f" ({', '.join(excess)})" if excess else "")
    )


def leave_one_slide_out(
    parts: list[np.ndarray],
    normalization: str = conformal.DEFAULT_NORMALIZATION,
    alpha: float = FDR_ALPHA,
    evaluable: list[np.ndarray] | None = None,
) -> dict:
    """Each calibration slide scored as a new slide against the others (needs two or more):
    all its cells are normal, so every flag is false. Records how often BH flagged anything
    (FDR of an all-normal slide = P(any flag) <= alpha if slides are exchangeable), whether the
    burden interval held 0, the slide p-values, and the spread of the bulk check that sets its
    tolerance. ``evaluable`` (per slide, or None): the burden counts as a scored slide's
    would."""
    if len(parts) < 2:
        return {
            "leave_one_slide_out": None,
            "bulk_tolerance": {},
            "assumes": (
                "one calibration slide: the spread between normal slides is unknown and taken "
                "as none; p-values, FDR and burden hold only if this slide's normal cells score "
                "like the calibration slide's. Calibrate on several slide-negative slides."
            ),
        }
    rows = []
    for j, own in enumerate(parts):
        others = Calibration(
            [p for i, p in enumerate(parts) if i != j],
            {"normalization": normalization},
            None if evaluable is None else [e for i, e in enumerate(evaluable) if i != j],
        )
        c = _against(own, others, alpha, 0.95, None, None if evaluable is None else evaluable[j])
        rows.append(
            {
                "cells": int(len(own)),
                "burden_counted": c["counted"],
                "flagged_bh": int(c["flagged"].sum()),
                # None: the slide has no evaluable cell, so no burden
                "burden_interval": c["burden"] and c["burden"]["abnormal_cells_interval"],
                "slide_p_value": c["slide_p"],
                "bulk": c["bulk"],
                "bulk_evaluable": c["bulk_counted"],
            }
        )
    judged = [r for r in rows if r["burden_interval"] is not None]
    return {
        "leave_one_slide_out": {
            "alpha": alpha,
            "slides": len(rows),
            "slides_with_false_flags": sum(r["flagged_bh"] > 0 for r in rows),
            "slides_with_a_burden": len(judged),
            "burden_interval_holds_zero": sum(r["burden_interval"][0] == 0 for r in judged),
            "slide_p_values": [
                None if r["slide_p_value"] is None else round(r["slide_p_value"], 4) for r in rows
            ],
            "per_slide": rows,
        },
        "bulk_tolerance": conformal.bulk_tolerance([r["bulk"] for r in rows]),
        # the same over the evaluable cells (a slide without one has no bulk to compare)
        "bulk_tolerance_evaluable": conformal.bulk_tolerance(
            [r["bulk_evaluable"] for r in rows if r["bulk_evaluable"]]
        ),
        "assumes": (
            "the normal cells of a scored slide, after the slide's own normalization "
            f"({normalization}), are exchangeable with the calibration cells (same model, scoring "
            "options and preparation); the FDR of flagged cells holds under that. The burden "
            f"interval and slide test also allow for the spread between the {len(parts)} "
            "calibration slides."
        ),
    }


def _mismatch_words(deviations: dict[str, float], tolerance: dict[str, float], of="") -> list:
    """Each bulk statistic out of its tolerance, said with its value and the tolerance; the
    IQR's log ratio as a factor too (an H&E section's Pap scores, nearly all 0, read
    "iqr_log_ratio -19.82" alone: hostile round 68, 8)."""
    return [
        f"{k}{of} {deviations[k]:+.2f}{_iqr_words(k, deviations[k])} (normal slides: within "
        f"{conformal.tolerance_of(tolerance, k):.2f})"
        for k in conformal.bulk_mismatch(deviations, tolerance)
    ]


def known_cause(differs: list[str], scale: dict | None) -> str | None:
    """What this run knows makes a slide's scores unlike the calibration slides', said in
    place of "another stain, scanner or preparation?" (a slide off the model's scale, or cut
    with another --patch-size, was asked so: hostile round 69, 4)."""
    if differs:
        return f"it was scored unlike them ({'; '.join(differs)})"
    factor = (scale or {}).get("factor")
    if (scale or {}).get("advised") and factor:
        times, how = (factor, "smaller") if factor > 1 else (1 / factor, "larger")
        return f"its cells look {times:.2f}x {how} than the model's training cells"
    return None


def _raised(deviations: dict[str, float], tolerance: dict[str, float]) -> bool:
    """Some bulk statistic out of its tolerance on the abnormal side: the slide's scores
    higher or wider than the calibration slides' (as many abnormal cells make them)."""
    return any(deviations[k] > 0 for k in conformal.bulk_mismatch(deviations, tolerance))


def _iqr_words(name: str, value: float) -> str:
    """What an ``iqr_log_ratio`` says: the slide's IQR as a multiple of the normal slides'."""
    if name != "iqr_log_ratio":
        return ""
    factor = float(np.exp(value))
    if factor < 0.01:
        return ": its scores hardly spread between their quartiles (an IQR of about 0)"
    return f": its IQR {factor:.2g}x the normal slides'"


def too_few_to_flag(
    cells: int, calibration_cells: int, alpha: float, confidence: float | None = None
) -> int:
    """The calibration size needed when ``calibration_cells`` cannot flag a single cell of a
    slide of ``cells`` at FDR ``alpha`` (the smallest conformal p-value, 1 / (n + 1), or the
    conditional one, above BH's first step, alpha / cells); 0 when it can."""
    step = alpha / cells if cells else 1.0
    if cells == 0 or conformal.smallest_p(calibration_cells, confidence) <= step:
        return 0
    if confidence is None:
        return int(np.ceil(cells / alpha)) - 1
    # 1 - delta ** (1 / k) <= step  <=>  k >= log(delta) / log(1 - step), with k = ceil(n / 2)
    k = int(np.ceil(np.log(1.0 - confidence) / np.log1p(-step)))
    return 2 * k - 1


def fewest_flagged(
    cells: int, calibration_cells: int, alpha: float, confidence: float | None = None
) -> int:
    """The fewest cells BH can flag at once on a slide of ``cells`` at FDR ``alpha`` when no
    p-value falls below :func:`conformal.smallest_p` of ``calibration_cells``: BH flags ``k``
    cells when ``k`` of them have p <= k alpha / cells (a step-up: its first step, alpha / cells,
    need not be reached), so fewer than ``ceil(cells * p_min / alpha)`` are never flagged."""
    if cells == 0:
        return 0
    p_min = conformal.smallest_p(calibration_cells, confidence)
    # the smallest k with p_min <= k alpha / cells (a hair of slack for the division's rounding)
    return max(1, int(np.ceil(cells * p_min / alpha - 1e-9)))


def apply(
    scores: np.ndarray,
    calibration: Calibration,
    alpha: float = FDR_ALPHA,
    triage_level: float = TRIAGE_LEVEL,
    interval: float = 0.95,
    confidence: float | None = None,
    evaluable: np.ndarray | None = None,
    why_all: str | None = None,
    cause: str | None = None,
) -> dict:
    """``{"columns": {name: per-cell array}, "burden": summary block}`` for one slide: columns
    ``p_value``, ``flagged_bh``, ``flagged_adaptive``. On a bulk mismatch the flags are None
    and the block gives the reason instead of a burden. With ``confidence``, the flags come from
    calibration-conditional p-values (FDR at most ``alpha`` for this calibration with that
    probability); ``p_value`` stays the marginal one.

    ``evaluable`` (bool per cell, the adequacy's; None: not judged): the burden and the slide
    test count the evaluable cells only, against the calibration's evaluable cells, when the
    calibration marks them (``burden["counted"]`` says which, ``counted_why`` why all); a
    slide with none gets no burden. Every cell keeps its p-value and flag. ``why_all``: why
    ``evaluable`` is None, for ``counted_why``. ``cause``: what the caller knows makes this
    slide's scores differ (scored otherwise, off the model's scale), said as the likely cause
    of a bulk mismatch in place of the question of another stain."""
    if evaluable is not None:
        evaluable = np.asarray(evaluable, dtype=bool)
        if len(evaluable) != len(scores):
            raise ValueError(f"evaluable has {len(evaluable)} values for {len(scores)} cells")
    c = _against(scores, calibration, alpha, interval, confidence, evaluable, why_all)
    tol = calibration.info.get("bulk_tolerance") or {}
    # every cell's bulk guards the flags; the evaluable cells' the burden over them
    mismatch = _mismatch_words(c["bulk"], tol)
    raised = _raised(c["bulk"], tol)
    out = {
        "calibration": calibration.info.get("source"),
        "normalization": calibration.normalization,
        "bulk_deviation": {k: round(v, 4) for k, v in c["bulk"].items()},
        "bulk_tolerance": {k: round(v, 4) for k, v in tol.items()},
        "assumes": calibration.info.get("assumes"),
    }
    if c["bulk_counted"] is not None:
        tol_e = calibration.info.get("bulk_tolerance_evaluable") or {}
        mismatch += _mismatch_words(c["bulk_counted"], tol_e, " of the evaluable cells")
        raised = raised or _raised(c["bulk_counted"], tol_e)
        out["bulk_deviation_evaluable"] = {k: round(v, 4) for k, v in c["bulk_counted"].items()}
        out["bulk_tolerance_evaluable"] = {k: round(v, 4) for k, v in tol_e.items()}
    if len(scores) == 0:
        out["status"] = "no cells"
        out["reason"] = "no cells were found on this slide: no burden, p-values or flags"
        empty = np.zeros(0, dtype=bool)
        return {
            "columns": {"p_value": c["p"], "flagged_bh": empty, "flagged_adaptive": empty},
            "burden": out,
        }
    if mismatch:
        said = ", ".join(mismatch)
        out["status"] = CALIBRATION_MISMATCH
        n_slides = len(calibration.info.get("slides") or ())
        few = (  # the tolerance of a few slides is their spread measured roughly (round 67, 4)
            f" (a calibration of {n_slides} slides measures how much normal slides vary only "
            "roughly: calibrate on more)"
            if 0 < n_slides < FEW_CALIBRATION_SLIDES
            else ""
        )
        if cause:
            why = f"{cause}. No burden or FDR flags are reported"
        else:  # many abnormal cells raise a slide's scores as a stain does (round 69, 1)
            lesions = (
                ", or many abnormal cells (they raise a slide's median and spread as a stain "
                "does: read its ranking)"
                if raised
                else ""
            )
            why = (
                f"another stain, scanner or preparation{lesions}? No burden or FDR flags are "
                f"reported; calibrate on slide-negative slides like this one{few}"
            )
        out["reason"] = (
            f"this slide's scores do not look like the calibration slides' ({said}): {why}"
        )
        return {
            "columns": {"p_value": c["p"], "flagged_bh": None, "flagged_adaptive": None},
            "burden": out,
        }
    flagged_adaptive, pi0 = conformal.adaptive_bh(c["p_flag"], alpha)
    columns = {"p_value": c["p"], "flagged_bh": c["flagged"], "flagged_adaptive": flagged_adaptive}
    out["counted"] = c["counted"]
    if c["counted_why"]:
        out["counted_why"] = c["counted_why"]
    if c["burden"] is None:
        out["status"] = "no evaluable cells"
        out["reason"] = (
            f"none of the slide's {len(scores)} cells is evaluable (out of focus, crowded or off "
            "the model's scale: see its adequacy): no burden or slide test"
        )
        out["flagged_bh"] = int(c["flagged"].sum())
        return {"columns": columns, "burden": out}
    b = c["burden"]
    b["threshold_normalized"] = b.pop("threshold")
    out.update(
        {
            "status": "ok",
            **b,
            "threshold": c["raw_threshold"],
            "fdr_alpha": alpha,
            "fdr_guarantee": "on average over calibrations"
            if confidence is None
            else f"for this calibration with probability {confidence:g}",
            "counts": BURDEN_COUNTS.format(
                above=above_words(b.get("threshold_quantile_of_normals"))
            ),
            "flagged_bh": int(c["flagged"].sum()),
            "flagged_adaptive": int(flagged_adaptive.sum()),
            "null_share_storey": round(pi0, 4),
            "slide_p_value": c["slide_p"],
            "triage_level": triage_level,
            "triage": TRIAGE_EXCESS if c["slide_p"] <= triage_level else TRIAGE_NONE,
            "normal_rate_between_slides_sd": round(float(np.sqrt(c["rate"].tau2)), 6),
        }
    )
    n_cal = len(calibration.reference)
    needed = too_few_to_flag(len(scores), n_cal, alpha, confidence)
    if needed:
        fewest = fewest_flagged(len(scores), n_cal, alpha, confidence)
        out["note"] = (
            f"BH on {len(scores)} cells at FDR {alpha} flags k cells only when k of them have "
            f"p-values at most k x {alpha / len(scores):.2g}, and {n_cal} calibration cells give "
            f"none below {conformal.smallest_p(n_cal, confidence):.2g}: fewer than {fewest} "
            f"abnormal-looking cells are never flagged. Calibrate on at least {needed} cells "
            "(more slide-negative slides) to flag a single cell"
        )
    return {"columns": columns, "burden": out}
