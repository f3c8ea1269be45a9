"""A review folder: the blinded cases a reviewer sees, and the key that unblinds them.

Built once from scored slide folders (``cyto score`` output: ``scores.parquet`` + ``summary.json``)
and reused by every reviewer and by the report:

- ``cases.json`` (what the page may know): anonymized case ids, the number of cells in each grid,
  the grid width, the labels a reviewer can give.
- ``key.json`` (never served): for every case, the slide, the models that scored it, and for each
  grid position the cell's level-0 centre, the rank and score each model gave it, and its
  ground-truth label when the slide was scored with ``--truth``.
- ``crops/CASE/POS.png``: the cell at full resolution (level-0 pixels, the area the model saw).

Each scored folder records the reviews made of it, wherever their ``--session`` folder is
(``reviews.json``, :func:`record_review`, written before the review is built): ``cyto view``
learns of an unfinished blinded review from the folder it is asked to show, not by looking
beside it. The review is also registered in cyto's cache by the slide's content identity
(:func:`registered_reviews`), so a scored folder that lost its ``reviews.json``, or the same
slide scored again by any model into another folder, is still known to be under review on this
machine.

As in the paper's evaluation, each slide's top-K cells are shown in a seeded random order, slides
are anonymized and their order is randomized per reviewer. Several models' top-K of one slide are
pooled and deduplicated (detections closer than a merge radius are one cell), so the reviewer cannot
tell which model surfaced a cell. The folder is written to a temporary name and renamed into place,
so a half-built folder is never used, and two reviewers starting at once get the same folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from cyto import staging
from cyto.errors import ConfigError, CytoError, CytoWarning, InputPathError, first_line, warn_caller
from cyto.flags import check_seed
from cyto.reuse import check_reuse
from cyto.seal import refuse_being_written, unfinished
from cyto.tables import json_text

CASES_FILE, KEY_FILE, CROPS = "cases.json", "key.json", "crops"
#: in a scored folder: the review folders made of it (:func:`record_review`)
REVIEWS_FILE = "reviews.json"
REVIEWS_FORMAT = "cyto-reviews"
FORMAT = "cyto-review/1"
DEFAULT_K, COLS = 100, 10
DEFAULT_MERGE_UM = 4.0  # about half a lymphocyte nucleus: two detections this close are one cell
# the second-level labels a suspicious cell can get; a mark without one is just "suspicious"
DETAILS = ("malignant", "atypical", "artifact")


@dataclass(frozen=True)
class Source:
    """One scored slide folder: a model's ranking of one slide."""

    folder: Path
    model: str  # the bundle's name, e.g. "dsvdd" for dsvdd.cyto: how the report names it
    method: str
    slide: str
    identity: str
    crop_px: int
    mpp: float | None
    planted: int | None  # planted abnormal cells when the slide was scored with --truth
    #: the slide's adequacy under the run's --adequacy rule ("RESULT: REASONS"; None: no rule)
    adequacy: str | None = None
    #: the summary's burden block (its triage and slide p-value where the model is calibrated)
    burden: dict | None = None
    #: the storage options its slide is read with (``--storage-option``; a URL slide's only)
    options: dict | None = field(default=None, repr=False, compare=False)
    #: what its ``rank`` column follows (the summary's ``rank_by``: ``model``, ``morphometry``,
    #: ``model+morphometry``; None from a cyto that did not record it)
    rank_by: str | None = None

    def ranking(self) -> str:
        """Its ranking as the console names it: the model's, and by what where that is not the
        network's score ("the top 100 of dsvdd's ranking" of cells ranked by their morphometry:
        hostile round 66, 7)."""
        if self.rank_by in (None, "model"):
            return f"{self.model}'s ranking"
        return f"{self.model}'s ranking by {self.rank_by}"


@dataclass
class Session:
    """An opened review folder."""

    root: Path
    cases: list[dict]  # public: [{"case", "n"}], in the built (not the shown) order
    seed: int
    cols: int
    key: dict = field(repr=False)
    #: the review's own id (drawn when it is built, under its seal): its marks log carries it,
    #: so marks copied from another review are refused (None: built by an older cyto)
    session_id: str | None = None
    #: the sha256 of each crop as built (``"CASE/POS.png"``), from the seal; None: not sealed
    crop_hashes: dict[str, str] | None = field(default=None, repr=False)

    def case_ids(self) -> list[str]:
        return [c["case"] for c in self.cases]

    def order_for(self, reviewer: str) -> list[str]:
        """The case order this reviewer sees: random, different per reviewer, stable."""
        digest = hashlib.sha256(f"{self.seed}:{reviewer}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        ids = self.case_ids()
        return [ids[i] for i in rng.permutation(len(ids))]

    def __post_init__(self) -> None:
        self._sizes = {c["case"]: int(c["n"]) for c in self.cases}

    def n_cells(self, case: str) -> int | None:
        return self._sizes.get(case)

    def crop_path(self, case: str, position: int) -> Path | None:
        """The crop file of a grid cell, or None when the case or position does not exist."""
        n = self.n_cells(case)
        if n is None or not 0 <= position < n:
            return None
        return self.root / CROPS / case / f"{position:03d}.png"


def find_scored(folders: list[Path]) -> list[Path]:
    """Scored slide folders among ``folders``: each folder itself when it holds a finished
    ``scores.parquet`` and ``summary.json``, else its direct sub-folders that do (a cohort run)."""
    found: list[Path] = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            # a path that is not there said so, from where it was looked for (a relative path
            # given from another folder was told "is not a folder": hostile round 75, 15)
            there = (
                "is not a folder"
                if folder.exists()
                else f"does not exist (looked for in {Path.cwd()})"
                if not folder.is_absolute()
                else "does not exist"
            )
            raise InputPathError(f"{folder} {there} (give the output folder of cyto score)")
        if _is_scored(folder):
            found.append(folder.resolve())
            continue
        dirs = sorted(p.resolve() for p in folder.iterdir() if p.is_dir())
        subs = [p for p in dirs if _is_scored(p)]
        # a cohort's slide that a run is writing now (an --overwrite, a resume scoring it
        # again, a first scoring) or that a stopped run left unfinished is left out, said;
        # the others are read (a slide being scored again refused them all, one scored for
        # the first time was left out unsaid: hostile round 48, 4)
        from cyto.locks import OutputLock

        busy = [p for p in dirs if OutputLock(p).holder() is not None]
        stopped = [p for p in dirs if p not in busy and not _is_scored(p) and unfinished(p)]
        subs = [p for p in subs if p not in busy]
        for left, why in (
            (busy, "being written by another cyto score now: read them again once it has finished"),
            (stopped, "unfinished (a run stopped): finish them with cyto score --resume"),
        ):
            if left and subs:
                names = ", ".join(p.name for p in left[:3]) + (", ..." if len(left) > 3 else "")
                warn_caller(
                    f"{len(left)} slide folder(s) of {folder} are left out ({names}), {why}",
                    CytoWarning,
                )
        if not subs and (busy or stopped):
            first = (busy or stopped)[0]
            refuse_being_written(first, InputPathError)
            raise InputPathError(f"{first}: {unfinished(first)}")
        if not subs and unfinished(folder):
            raise InputPathError(f"{folder}: {unfinished(folder)}")
        if not subs:
            raise InputPathError(
                f"{folder} holds no scored slide (no scores.parquet with summary.json in it or in "
                "its sub-folders); run cyto score first"
            )
        found += subs
    if len(set(found)) != len(found):
        raise ConfigError("a scored folder was given twice")
    refuse_copies(found)
    return found


def refuse_copies(found: list[Path]) -> None:
    """Two of ``found`` that are copies of one scoring run (the same ``summary.json``, whose
    timings change whenever a slide is scored again) are one slide counted twice: listed
    twice by ``cyto view``, its cells cut twice by ``cyto data cells``, its cells reviewed as
    two models' by ``cyto review``. One line naming both, whether the user gave both or a
    cohort folder that holds a copy beside the original."""
    seen: dict[str, Path] = {}
    for folder in found:
        try:
            print_ = _fingerprint(folder)
        except OSError:
            continue  # read again (and refused in its words) by whatever reads it
        if print_ in seen:
            first = seen[print_]
            if first.parent == folder.parent:
                where = f"{first.parent} holds {first.name} and {folder.name},"
                do = f"keep one of them in {first.parent.name}"
            else:
                where, do = f"{first} and {folder} are", "give one of them"
            raise ConfigError(
                f"{where} copies of one scoring run of the same slide (the same "
                f"summary.json): {do} (each scored slide counts once)"
            )
        seen[print_] = folder


def _is_scored(folder: Path) -> bool:
    return (folder / "scores.parquet").is_file() and (folder / "summary.json").is_file()


def read_source(folder: Path, options: dict | None = None) -> Source:
    """A scored folder, trusted only through its seal (:func:`cyto.seal.read_sealed`): the cases
    of a review are cut from what the run wrote, never from outputs edited since. ``options``:
    the storage options its slide, a URL, is read with (``--storage-option``)."""
    from cyto.seal import SCORE_AGAIN, read_sealed

    refuse_being_written(folder, InputPathError)
    sealed = read_sealed(folder)
    if not sealed.ok:
        raise InputPathError(f"{folder}: {sealed.words()}: {SCORE_AGAIN}")
    try:
        s = sealed.summary
        model = Path(s["model"]).name
        return Source(
            folder=folder,
            model=model[: -len(".cyto")] if model.endswith(".cyto") else model,
            method=str(s["method"]),
            slide=str(scored_slide(s["slide"], folder)),
            identity=str(s["slide_identity"]),
            crop_px=int(s["resolution"]["crop_px_level0"]),
            mpp=s["resolution"].get("slide_mpp"),
            planted=(s.get("truth") or {}).get("planted_abnormal"),
            adequacy=_adequacy_words(s.get("adequacy")),
            burden=s.get("burden") if isinstance(s.get("burden"), dict) else None,
            options=options or None,
            rank_by=str(s["rank_by"]) if s.get("rank_by") else None,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputPathError(
            f"{folder / 'summary.json'} is not a cyto score summary ({exc}); rerun cyto score"
        ) from exc


def _adequacy_words(block: dict | None) -> str | None:
    """A summary's adequacy block as the report shows it: ``satisfactory`` or
    ``unsatisfactory: REASONS``."""
    if not isinstance(block, dict) or "result" not in block:
        return None
    reasons = "; ".join(block.get("reasons") or ())
    return f"{block['result']}: {reasons}" if reasons else str(block["result"])


def scored_slide(slide: str, folder: Path, options: dict | None = None):
    """The slide a scored folder's summary names: a local path (an older summary's relative
    path resolved as :func:`_slide_path` does), or the URL it was scored from, as a
    :class:`~cyto.slides.remote.SlideURL` with the storage ``options`` (``--storage-option``);
    its credentials come from the standard chains, never from the summary, which holds the URL
    without them. A URL is read as :func:`as_scored` reads it (a format read from a local file
    through the copy in cyto's cache)."""
    from cyto.slides.remote import is_url

    if is_url(slide):
        return _scored_ref(slide, options)
    return _slide_path(Path(slide), folder)


def _scored_ref(slide, options: dict | None = None):
    """A scored slide as the commands that read it back open it (``cyto view``, ``cyto
    review``, ``cyto data cells``): with the storage options given to them, and a URL in a
    format read from a local file (SVS, NDPI, DICOM files) through a copy in cyto's cache, as
    ``cyto score --download`` read it (the copy of that run is reused while the object is
    unchanged): it was scored, so it is read (they said "pass --download", which none of them
    takes, and read the slide without the storage options: hostile round 30, 1 and 2). A
    pyramidal TIFF is read in place as ever."""
    from cyto.slides.remote import slide_ref

    return slide_ref(slide, options or None, download=True)


def as_scored(slide, identity: str | None, what: str = "its cells", options: dict | None = None):
    """``slide`` (a path or a URL) opened as the slide it was scored from: a URL pinned to the
    version the server has now (read as :func:`_scored_ref` reads it, with the storage
    ``options``), and its content identity compared with the summary's ``identity``; a slide
    replaced since it was scored is one line (the cells' places would be read from another
    slide's pixels). ``identity`` None: nothing to compare (as it was)."""
    from cyto.infer.store import identity_name, slide_identity
    from cyto.slides.remote import pinned_ref, redact

    ref = pinned_ref(_scored_ref(slide, options))
    if identity is not None and slide_identity(ref) != identity:
        # what changed named as cyto view names it: a URL's version, which the same bytes
        # copied anew change too, was said "its content changed" (hostile round 74, 1)
        raise InputPathError(
            f"{redact(str(slide))} is not the slide it was scored as: {identity_name(ref)} "
            f"changed since it was scored (or another file is at its place), so {what} would "
            "be cut from other pixels; score it again"
        )
    return ref


def _slide_path(slide: Path, folder: Path) -> Path:
    """The scored slide: summaries of older cyto runs hold its path relative to the folder where
    ``cyto score`` ran, which is this folder or one above it (newer summaries hold it absolute)."""
    if slide.is_absolute():
        return slide
    for base in (Path.cwd(), *Path(folder).absolute().parents):
        if (base / slide).exists():  # a file, or a DICOM slide's folder
            return (base / slide).absolute()
    return slide


def _top_cells(src: Source, k: int) -> list[dict]:
    return _top_of(src.folder, src.model, k)


def _cut(folder: Path, k: int) -> str:
    """The identity of the cells a review cuts from a scored folder: its top ``k`` (id, place,
    rank, score, truth label). Outputs written again from the same cells and ranking (another
    ``--fdr`` or top-K on ``--resume``) leave it as it was; another ranking or other cells do
    not."""
    cells = [{n: c[n] for n in ("cell_id", "x", "y", "rank", "score", "label")}
             for c in _top_of(Path(folder), "", k)]  # fmt: skip
    return hashlib.sha256(json_text(cells, sort_keys=True).encode()).hexdigest()


def _holds(key: dict, folder: Path) -> bool:
    """Whether a review (its ``key``) still holds the scored ``folder`` it lists: not written
    again since (its summary's fingerprint), or written again with the top ``k`` cells it was
    cut from (``cut``) the same. The one rule of reopening (:func:`build_session`) and of the
    warning a run gives (:func:`cut_changed`)."""
    if (key.get("fingerprints") or {}).get(str(folder)) == _fingerprint(folder):
        return True
    cut, k = key.get("cut") or {}, key.get("k")
    return str(folder) in cut and isinstance(k, int) and cut[str(folder)] == _cut(folder, k)


def cut_changed(folder: Path) -> list[tuple[Path, int]]:
    """The reviews made of the scored ``folder`` (recorded by it, registered by its slide, or
    beside it) whose cases are no longer cut from its top cells: the folder was written again
    since, and its top ``k`` (the cells their key records, ``cut``) changed. (review, k) each:
    reopened, each is refused (:func:`build_session`)."""
    from cyto.reuse import read_record

    folder = Path(folder).resolve()
    places = [*recorded_reviews(folder), *registered_reviews(folder)]
    places += [folder / "review", folder.parent / "review"]
    out = []
    for review in dict.fromkeys(p.resolve() for p in places):
        key = read_record(review / KEY_FILE)
        if key is None or str(folder) not in map(str, key.get("scored") or []):
            continue
        if not _holds(key, folder):
            out.append((review, key.get("k")))
    return out


def _top_of(folder: Path, model: str, k: int) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / "scores.parquet"
    try:
        names = pq.read_schema(path).names
        cols = ["cell_id", "x", "y", "score", "rank"] + (["label"] if "label" in names else [])
        t = pq.read_table(path, columns=cols, filters=[("rank", "<=", k)]).to_pydict()
    except (OSError, pa.ArrowException) as exc:  # ArrowInvalid, a missing column, a cut file
        first = first_line(exc)
        raise InputPathError(
            f"{path} cannot be read as a cyto score table ({first}); score the slide again"
        ) from exc
    cells = [
        {
            "model": model,
            "cell_id": int(t["cell_id"][i]),
            "x": float(t["x"][i]),
            "y": float(t["y"][i]),
            "rank": int(t["rank"][i]),
            "score": float(t["score"][i]),
            "label": None if "label" not in t else int(t["label"][i]),
        }
        for i in range(len(t["rank"]))
    ]
    return sorted(cells, key=lambda c: c["rank"])


def pool(cells: list[dict], radius_px: float) -> list[dict]:
    """Merge detections of several models within ``radius_px`` into one reviewed cell each.

    Cells are taken best rank first; a cell joins the first pooled cell within the radius that
    this model has not already filled, else starts a new one (so one model never merges two of
    its own cells).
    """
    pooled: list[dict] = []
    centres = np.empty((0, 2))
    for c in sorted(cells, key=lambda c: (c["rank"], c["model"])):
        target = None
        if len(pooled):
            d = np.hypot(centres[:, 0] - c["x"], centres[:, 1] - c["y"])
            for j in np.flatnonzero(d <= radius_px)[np.argsort(d[d <= radius_px], kind="stable")]:
                if c["model"] not in pooled[j]["sources"]:
                    target = int(j)
                    break
        src = {"cell_id": c["cell_id"], "rank": c["rank"], "score": c["score"]}
        if target is None:
            pooled.append({"x": c["x"], "y": c["y"], "label": c["label"], "sources": {}})
            centres = np.vstack([centres, [c["x"], c["y"]]])
            target = len(pooled) - 1
        cell = pooled[target]
        cell["sources"][c["model"]] = src
        if c["label"] is not None:
            cell["label"] = max(cell["label"] or 0, c["label"])
    return pooled


def _group(sources: list[Source]) -> list[list[Source]]:
    """Sources of the same slide (by content identity), each slide's models named apart."""
    by_slide: dict[str, list[Source]] = {}
    for s in sources:
        by_slide.setdefault(s.identity, []).append(s)
    for group in by_slide.values():
        names = [s.model for s in group]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            folders = ", ".join(str(s.folder) for s in group if s.model in dup)
            raise ConfigError(
                f"slide {group[0].slide} was scored more than once by model {sorted(dup)[0]} "
                f"({folders}); give one folder per model and slide"
            )
    return list(by_slide.values())


def build_session(
    scored: list[Path],
    root: Path,
    k: int | None = None,
    seed: int | None = None,
    merge_um: float | None = None,
    echo=print,
    options: dict | None = None,
) -> Session:
    """Build the review folder ``root`` from scored folders (or open it when it was already built
    from the same folders: its settings are kept, and a different ``k``, ``seed`` or ``merge_um``
    asked for is refused). A setting not given (None) is the earlier session's when reopening,
    else its default (:data:`DEFAULT_K`, :data:`DEFAULT_MERGE_UM`): only what the caller gave
    is compared, so reopening without ``--k`` never reads as ``--k 20 -> 100``.

    The order of cases and cells comes from ``seed``; by default a secret one is drawn and kept in
    the key only, so nothing the page can read (the code, the case sizes) tells a grid position's
    rank. Pooled cells are put in slide order (by position) before they are shuffled, so their
    order carries no rank either. ``options``: the storage options of slides scored from URLs
    (``--storage-option``)."""
    if k is not None and k < 1:
        raise ConfigError(f"--k must be at least 1, got {k}")
    if seed is not None:
        seed = check_seed(seed)
    if merge_um is not None and not merge_um >= 0:
        raise ConfigError(f"--merge-um must be >= 0, got {merge_um}")
    folders = find_scored(scored)
    root = Path(root)
    if (root / KEY_FILE).is_file():
        session = open_session(root)
        if sorted(session.key["scored"]) != sorted(map(str, folders)):
            raise ConfigError(
                f"{root} is a review of other scored folders ({', '.join(session.key['scored'])});"
                " give those, or another --session folder for a new review"
            )
        # a folder whose outputs were written again since: the review holds while the cells it
        # cut are those of the folder's top (a resume that kept its cells for another --fdr
        # refused a review part way through, "its cells may differ": hostile round 77, 1)
        n = session.key.get("k")
        changed = [f for f in folders if not _holds(session.key, f)]
        if changed:
            raise ConfigError(
                f"{changed[0]} was scored again after the review in {root} was built, and the "
                f"top {n} cells it was cut from changed (other cells, or ranked otherwise). Start "
                "a new review with --session NEW_FOLDER (the old one keeps its marks and its key)"
            )
        # the settings asked for again (only those given), against those it was built with;
        # the seed is the blinding's secret: that it differs is said, never its value
        given = {"k": k, "merge_um": merge_um, "seed": seed}
        asked = {name: value for name, value in given.items() if value is not None}
        kept = {"k": session.key.get("k"), "merge_um": session.key.get("merge_um")}
        kept["seed"] = session.seed
        recorded = {name: kept[name] for name in asked if kept[name] is not None}
        reuse = check_reuse(recorded, {n: asked[n] for n in recorded}, secret={"seed"})
        other = list(reuse.differs)
        if other:
            raise ConfigError(
                f"{root} is a review built with other settings: {'; '.join(other)}. Reopen it "
                "without them, or start a new review with --session NEW_FOLDER"
            )
        return session
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InputPathError(f"{root} exists and is not a review folder; choose another --session")
    k = DEFAULT_K if k is None else k
    merge_um = DEFAULT_MERGE_UM if merge_um is None else merge_um
    groups = _group([read_source(f, options) for f in folders])
    import secrets

    if seed is None:
        seed = secrets.randbits(63)  # kept in the key only
    rng = np.random.default_rng(seed)
    groups = [groups[i] for i in rng.permutation(len(groups))]  # case numbers say nothing
    record_review(folders, root)  # first: a review the scored folders do not know is no review
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        return _build(folders, root, groups, rng, k, merge_um, seed, echo)
    except BaseException:
        if not (root / KEY_FILE).is_file():
            # no review came to be (a full disk, Ctrl-C): the record that blinds its slides
            # goes with it; it held every view of them, and every later scoring said it
            # waited for a review that was never made (hostile round 47, 4)
            forget_review(folders, root)
        raise


def _build(folders, root: Path, groups, rng, k: int, merge_um: float, seed: int, echo):
    """The review's folder built beside ``root`` and renamed into place, sealed."""
    import secrets

    tmp = staging.dir_beside(root, "building")
    try:
        public, key_cases = [], {}
        for n, group in enumerate(groups, start=1):
            case = f"case-{n:03d}"
            cells = pool([c for s in group for c in _top_cells(s, k)], _radius_px(group, merge_um))
            cells.sort(key=lambda c: (c["y"], c["x"]))  # pooled in rank order: forget it
            cells = [cells[i] for i in rng.permutation(len(cells))]
            crop = max(s.crop_px for s in group)
            # "100 cells from pap" read as a stain: round 58
            rankings = [s.ranking() for s in group]
            by = rankings[0] if len(rankings) == 1 else f"each: {', '.join(rankings)}"
            echo(f"{case}: {len(cells)} cells, the top {k} of {by}")
            _write_crops(group[0], cells, crop, tmp / CROPS / case)
            key_cases[case] = {
                "slide": group[0].slide,
                "slide_identity": group[0].identity,
                "slide_mpp": group[0].mpp,
                "crop_px": crop,
                "planted_abnormal": group[0].planted,
                "models": [
                    {"model": s.model, "method": s.method, "folder": str(s.folder)}
                    | ({"adequacy": s.adequacy} if s.adequacy is not None else {})
                    for s in group
                ],
                "cells": [{"position": p, **c} for p, c in enumerate(cells)],
            }
            public.append({"case": case, "n": len(cells)})
        # the review's identity: its marks log is stamped with it (cyto.review.store)
        meta = {
            "format": FORMAT,
            "cols": COLS,
            "k": k,
            "merge_um": merge_um,
            "session_id": secrets.token_hex(16),
        }
        (tmp / KEY_FILE).write_text(
            json_text(
                {
                    **meta,
                    "seed": seed,
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "scored": sorted(map(str, folders)),
                    "fingerprints": {str(f): _fingerprint(f) for f in folders},
                    "cut": {str(f): _cut(f, k) for f in folders},  # the cells it was cut from
                    # the models whose top-K was reviewed (refine checks it is given one)
                    "scoring_ids": {str(f): scoring_id_of(f) for f in folders},
                    "cases": key_cases,
                },
                indent=1,
            )
        )
        (tmp / CASES_FILE).write_text(
            json_text({**meta, "details": list(DETAILS), "cases": public}, indent=1)
        )
        _seal_review(tmp)  # last: a folder renamed into place is whole and sealed
        try:
            if root.is_dir():
                root.rmdir()  # empty (checked above); a non-empty one means another build won
            os.rename(tmp, root)
        except OSError:
            if not (root / KEY_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_session(root)


def recorded_reviews(folder: Path) -> list[Path]:
    """The review folders ``folder`` (a scored folder) records as made of it."""
    try:
        data = json.loads((Path(folder) / REVIEWS_FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("format") != REVIEWS_FORMAT:
        return []
    return [Path(p) for p in data.get("reviews", []) if isinstance(p, str)]


#: in cyto's cache: the reviews of each slide by content identity (:func:`registered_reviews`)
REGISTRY = "reviews"


def _slide_and_model(folder: Path) -> tuple[str, str | None] | None:
    """(slide content identity, scoring id) of a scored folder; None where its summary does not
    say (no identity to register or look up by)."""
    try:
        summary = json.loads((Path(folder) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    identity = summary.get("slide_identity") if isinstance(summary, dict) else None
    if not isinstance(identity, str) or not identity:
        return None
    return identity, scoring_id_of(folder)


def _registry_file(identity: str) -> Path:
    """``$CYTO_REVIEW_REGISTRY`` (a folder: one shared by a lab's machines keeps the reviews
    of all of them), else ``reviews/`` in cyto's cache; one file per slide identity."""
    from cyto.cachedir import cache_dir
    from cyto.envvars import env_folder

    name = hashlib.sha256(identity.encode()).hexdigest()[:32]
    root = env_folder("CYTO_REVIEW_REGISTRY")  # ~ as a shell makes it (it made ./~/...)
    return (root or cache_dir() / REGISTRY) / f"{name}.json"


def _registered(identity: str) -> list[dict]:
    """The registry's entries for a slide identity; a registry that is there but cannot be
    read fails closed (one line naming it): a damaged record must not unblind a review."""
    path = _registry_file(identity)
    if path.parent.exists() and not path.parent.is_dir():
        raise InputPathError(
            f"the review registry {path.parent} is not a folder (CYTO_REVIEW_REGISTRY): "
            "point it at a folder"
        )
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise InputPathError(
            f"the review registry's record {path} cannot be read ({first_line(exc)}): it may "
            "name a blinded review of this slide; restore it, or remove it to forget them"
        ) from None
    if not isinstance(data, dict) or data.get("format") != REVIEWS_FORMAT:
        raise InputPathError(
            f"the review registry's record {path} is not one cyto wrote: it may name a blinded "
            "review of this slide; restore it, or remove it to forget them"
        )
    return [e for e in data.get("reviews", []) if isinstance(e, dict) and "review" in e]


def register_review(folders: list[Path], root: Path) -> None:
    """Register the review ``root`` in cyto's cache under each scored folder's slide identity
    and scoring model (where the cache cannot be written, the folders' own record stands)."""
    import contextlib

    from cyto.bundle import atomic_write
    from cyto.locks import file_lock

    root_s = str(Path(root).absolute())
    for folder in folders:
        got = _slide_and_model(folder)
        if got is None:
            continue
        identity, model = got
        path = _registry_file(identity)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(path.parent / ".lock"):
                entries = _registered(identity)
                entry = {"review": root_s, "scoring_id": model}
                if entry not in entries:
                    body = {"format": REVIEWS_FORMAT, "reviews": [*entries, entry]}
                    atomic_write(path, json_text(body, indent=1).encode())


def registered_reviews(folder: Path) -> list[Path]:
    """The reviews registered on this machine of the slide a scored folder holds, by any model,
    that are still there: found whatever the folder records. A review blinds the slide, not one
    model's ranking of it: another model's ranks would show the reviewed cells as high."""
    got = _slide_and_model(folder)
    if got is None:
        return []
    identity, _ = got
    return [Path(e["review"]) for e in _registered(identity) if Path(e["review"]).is_dir()]


def forget_review(folders: list[Path], root: Path) -> None:
    """Take the review ``root`` out of each scored folder's :data:`REVIEWS_FILE` and out of
    the registry (:func:`register_review`): for a build that made no review. Best effort:
    what cannot be written stays, blinding as before."""
    import contextlib

    from cyto.bundle import atomic_write
    from cyto.locks import file_lock

    root_s = str(Path(root).absolute())
    for folder in folders:
        known = [str(p) for p in recorded_reviews(folder)]
        if root_s in known:
            text = json_text(
                {"format": REVIEWS_FORMAT, "reviews": [p for p in known if p != root_s]}, indent=1
            )
            with contextlib.suppress(OSError):
                atomic_write(Path(folder) / REVIEWS_FILE, text.encode())
        got = _slide_and_model(folder)
        if got is None:
            continue
        path = _registry_file(got[0])
        with contextlib.suppress(OSError, CytoError), file_lock(path.parent / ".lock"):
            entries = _registered(got[0])
            kept = [e for e in entries if e.get("review") != root_s]
            if kept != entries:
                body = {"format": REVIEWS_FORMAT, "reviews": kept}
                atomic_write(path, json_text(body, indent=1).encode())


def record_review(folders: list[Path], root: Path) -> None:
    """Add the review folder ``root`` to the :data:`REVIEWS_FILE` of each scored folder, so
    that whoever shows a folder's ranks (``cyto view``) finds the review wherever its
    ``--session`` is. A folder where it cannot be written is refused in one line: a review
    the folder does not know of could be unblinded without a word."""
    from cyto.bundle import atomic_write

    register_review(folders, root)
    root = str(Path(root).absolute())
    for folder in folders:
        known = [str(p) for p in recorded_reviews(folder)]
        if root in known:
            continue
        text = json_text({"format": REVIEWS_FORMAT, "reviews": [*known, root]}, indent=1)
        try:
            atomic_write(Path(folder) / REVIEWS_FILE, text.encode())
        except OSError as exc:
            raise InputPathError(
                f"cannot record the review in {folder} ({exc.strerror or exc}): cyto view "
                "learns of a blinded review from there; make the folder writable"
            ) from exc


def scoring_id_of(folder: Path) -> str | None:
    """The model that scored a folder (its table's ``cyto.scoring_id``: the trained arrays,
    the same after the bundle is exported or calibrated); None when the table lacks it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(Path(folder) / "scores.parquet").metadata or {}
    except (OSError, pa.ArrowException):
        return None
    value = meta.get(b"cyto.scoring_id")
    return value.decode() if value else None


def reviewed_models(session: Session) -> dict[str, str | None]:
    """The scoring id of each scored folder a review was built from (recorded when it was
    built; read from the folders for a review of an older cyto)."""
    kept = session.key.get("scoring_ids")
    if isinstance(kept, dict):
        return {str(k): v for k, v in kept.items()}
    return {str(f): scoring_id_of(Path(f)) for f in session.key.get("scored", [])}


def _fingerprint(folder: Path) -> str:
    """Identity of a scoring run: its summary (timings included) changes whenever it is rerun."""
    return hashlib.sha256((folder / "summary.json").read_bytes()).hexdigest()


def _radius_px(group: list[Source], merge_um: float) -> float:
    mpp = group[0].mpp
    if mpp:
        return merge_um / mpp
    return max(s.crop_px for s in group) / 8  # no scale known: an eighth of the model's view


def crop_cells(
    slide: str | Path,
    centres,
    crop: int,
    paths,
    each=None,
    identity: str | None = None,
    options: dict | None = None,
) -> None:
    """Write the ``crop`` x ``crop`` level-0 square about each (x, y) of ``centres`` on ``slide``
    to the matching path of ``paths`` (PNG); ``each()``, if given, is called after every cell.
    ``identity``: the slide's content identity when it was scored (:func:`as_scored`);
    ``options``: a URL slide's storage options."""
    from PIL import Image

    from cyto.slides import open_slide

    reader = open_slide(as_scored(slide, identity, options=options))
    try:
        half = crop // 2
        for (x, y), path in zip(centres, paths, strict=True):
            x0, y0 = int(round(x)) - half, int(round(y)) - half
            Image.fromarray(reader.read_region(x0, y0, crop, crop)).save(path)
            if each is not None:
                each()
    finally:
        reader.close()


def _write_crops(src: Source, cells: list[dict], crop: int, folder: Path) -> None:
    folder.mkdir(parents=True)
    paths = [folder / f"{p:03d}.png" for p in range(len(cells))]
    centres = [(c["x"], c["y"]) for c in cells]
    crop_cells(src.slide, centres, crop, paths, identity=src.identity, options=src.options)


#: a review folder's seal: the sha256 of its key, its public cases and every crop as built
#: (``/1``, of an older cyto: the key and the cases only)
REVIEW_SEAL, REVIEW_SEAL_FORMAT = "seal.json", "cyto-review-seal/2"
_SEAL_FORMATS = ("cyto-review-seal/1", REVIEW_SEAL_FORMAT)


def _crop_files(folder: Path) -> dict[str, Path]:
    """Every entry under a review's ``crops/`` (files, links, anything but a real folder), by
    its path in it (``CASE/POS.png``)."""
    crops = folder / CROPS
    if not crops.is_dir():
        return {}
    return {
        p.relative_to(crops).as_posix(): p
        for p in crops.rglob("*")
        if p.is_symlink() or not p.is_dir()
    }


def _seal_review(folder: Path) -> None:
    from cyto.bundle import atomic_write, sha256_file

    files = {n: sha256_file(folder / n) for n in (KEY_FILE, CASES_FILE)}
    crops = {
        name: {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for name, path in sorted(_crop_files(folder).items())
    }
    record = {"format": REVIEW_SEAL_FORMAT, "files": files, "crops": crops}
    atomic_write(folder / REVIEW_SEAL, json_text(record, indent=1).encode())


def _check_crops(root: Path, sealed: dict) -> dict[str, str]:
    """The crops as built (``sealed``: the seal's record of each), or one line naming the first
    crop changed, missing or added since: the page would show the expert other cells than
    those the key unblinds the marks to. Returns each crop's sha256 (the server checks the
    file it serves against it)."""
    from cyto.bundle import sha256_file

    found = _crop_files(root)
    wrong: list[str] = []
    for name in sorted(set(sealed) | set(found)):
        want, path = sealed.get(name), found.get(name)
        if not isinstance(want, dict):
            wrong.append(f"{CROPS}/{name} was added")
        elif path is None:
            wrong.append(f"{CROPS}/{name} is missing")
        elif (
            path.is_symlink()
            or not path.is_file()
            or path.stat().st_size != want.get("size")
            or sha256_file(path) != want.get("sha256")
        ):
            wrong.append(f"{CROPS}/{name} changed")
    if wrong:
        more = f" (and {len(wrong) - 1} more crop(s) differ)" if len(wrong) > 1 else ""
        raise InputPathError(
            f"{root}: {wrong[0]} since the review was built{more}: the expert would mark other "
            "cells than its key names; build the review again into a new folder (cyto review "
            "SCORED_DIR... --session NEW_FOLDER)"
        )
    return {name: str(want["sha256"]) for name, want in sealed.items()}


def _check_review_seal(root: Path) -> dict[str, str] | None:
    """A review's key (the truth of each grid position, its rank and score), its cases and its
    crops are read only as they were built: a file that differs from the folder's seal is one
    line (its report would count edited truth: a precision of 0.40 read as 1.00; a swapped crop
    is marked as the cell the key names). A folder without a seal, or with one of a cyto before
    crops were sealed, is said once, and read. Returns the sealed crops' sha256, by
    ``CASE/POS.png`` (None: not sealed)."""

    from cyto.bundle import sha256_file
    from cyto.errors import CytoWarning

    try:
        record = json.loads((root / REVIEW_SEAL).read_text())
    except FileNotFoundError:
        warn_caller(
            f"{root} carries no seal (built by an older cyto, or its seal was removed): "
            "its key cannot be checked against edits",
            CytoWarning,
        )
        return None
    except (OSError, ValueError):
        record = None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or record.get("format") not in _SEAL_FORMATS:
        raise InputPathError(f"{root}: its seal {REVIEW_SEAL} is not one cyto writes")
    changed = [
        n for n in (KEY_FILE, CASES_FILE)
        if not (root / n).is_file() or sha256_file(root / n) != files.get(n)
    ]  # fmt: skip
    if changed:
        raise InputPathError(
            f"{root}: {', '.join(changed)} changed since the review was built (edited by hand?): "
            "its truth and ranks cannot be trusted; start a new review with --session NEW_FOLDER"
        )
    crops = record.get("crops")
    if record["format"] != REVIEW_SEAL_FORMAT:  # sealed by an older cyto: key and cases only
        warn_caller(
            f"{root}: its seal ({record['format']}, an older cyto's) does not cover the "
            "crops: a crop replaced by hand cannot be found",
            CytoWarning,
        )
        return None
    if not isinstance(crops, dict):
        raise InputPathError(f"{root}: its seal {REVIEW_SEAL} is not one cyto writes")
    return _check_crops(root, crops)


def open_session(root: Path) -> Session:
    """Open a built review folder, checked against its seal (:func:`_check_review_seal`). Its
    root is held absolute, as a built one's is: the marks' path was said relative when the
    folder was given so ("marks go to review/marks.sqlite"; hostile round 66, 10), and a
    relative root names another folder once the working folder changes."""
    root = Path(os.path.abspath(root))
    crop_hashes = None
    if (root / KEY_FILE).is_file() and (root / CASES_FILE).is_file():
        crop_hashes = _check_review_seal(root)
    try:
        public = json.loads((root / CASES_FILE).read_text())
        key = json.loads((root / KEY_FILE).read_text())
    except FileNotFoundError as exc:
        raise InputPathError(
            f"{root} is not a review folder (no {exc.filename and Path(exc.filename).name}); "
            "start one with cyto review SCORED_DIR..."
        ) from exc
    except ValueError as exc:
        raise InputPathError(f"{root}: a review file is damaged ({exc})") from exc
    if public.get("format") != FORMAT:
        raise InputPathError(f"{root}: unknown review format {public.get('format')!r}")
    return Session(
        root=root,
        cases=public["cases"],
        seed=int(key.get("seed", public.get("seed", 0))),  # older folders kept it public
        cols=int(public["cols"]),
        key=key,
        session_id=key.get("session_id") if isinstance(key.get("session_id"), str) else None,
        crop_hashes=crop_hashes,
    )


def context_slide(session: Session, case: str):
    """The slide of ``case`` as it was scored (:func:`as_scored`): the file at its place is
    compared with the identity the key records, and another file there (a slide rescanned
    under its name) is one line. The context view read whatever file had the path, and showed
    a reviewer another slide's cells around the crop being marked (hostile round 37, 1)."""
    from cyto.errors import CytoError, system_words

    info = session.key["cases"][case]
    try:
        return as_scored(info["slide"], info.get("slide_identity"), "the context view")
    except OSError as exc:  # gone or moved: one line, never a server error (round 38, 1)
        raise CytoError(f"{info['slide']}: {system_words(exc) or exc.strerror or exc}") from None


def context_image(
    session: Session,
    case: str,
    position: int,
    scale: int = 4,
    side: int | None = None,
    slide=None,
):
    """A larger view around one cell, read from the slide, with the cell boxed (PIL image):
    ``scale`` times the crop, at the slide's own pixels (or ``side`` pixels wide). ``slide``:
    the case's slide as :func:`context_slide` checked it (checked here when not given)."""
    from PIL import Image, ImageDraw

    from cyto.slides import open_slide

    info = session.key["cases"][case]
    cell = info["cells"][position]
    crop = int(info["crop_px"])
    size = crop * scale
    x0, y0 = int(round(cell["x"])) - size // 2, int(round(cell["y"])) - size // 2
    reader = open_slide(slide if slide is not None else context_slide(session, case))
    try:
        img = Image.fromarray(reader.read_region(x0, y0, size, size))
    finally:
        reader.close()
    side = side or size
    f = side / size
    if side != size:
        img = img.resize((side, side), Image.Resampling.BILINEAR)
    lo, hi = (size - crop) / 2 * f, (size + crop) / 2 * f
    ImageDraw.Draw(img).rectangle([lo, lo, hi, hi], outline=(255, 255, 0), width=2)
    return img
