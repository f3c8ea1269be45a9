"""``cyto eval scores``: every metric for any score table (cyto's own or a user's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.data.morphometry import RANK_COLUMNS, ranked_column
from cyto.errors import InputPathError, MetricError, first_line
from cyto.eval.metrics import all_metrics
from cyto.flags import Placeholder, comma_list, passing, said
from cyto.tables import parquet_file, read_table


def check_parquet(path: Path, fix: str) -> None:
    """Refuse a Parquet file that cannot be opened (truncated by a full disk or a copy cut
    short, or not Parquet at all) in one line that names it and says ``fix``; its footer, which
    a cut file loses first, is read, not its rows."""
    import pyarrow as pa

    try:
        parquet_file(path)  # cyto.tables: a name Arrow takes, or the file's bytes
    except (pa.ArrowException, OSError) as exc:
        raise InputPathError(
            f"{path} is truncated or damaged ({_first_words(exc)}); {fix}"
        ) from exc


def read_score_table(
    path: Path,
    score_column: str,
    label_column: str,
    need_label: bool = True,
    echo=None,
    with_column: bool = False,
    seen: dict | None = None,
):
    """(scores, labels) of a table, higher = more abnormal; ``score_column`` ``auto``:
    :func:`ranked_column`; labels None when the table has no ``label_column`` and
    ``need_label`` is False. A rank column (:data:`RANK_COLUMNS`, 1 = most abnormal) is read
    the other way round, and ``echo`` told so: read as scores, cyto's own ``rank`` turned the
    AUROC of a predict table from 0.7768 to 0.2232 without a word. ``with_column``: also the
    name of the column judged, (scores, labels, column)."""
    import pyarrow as pa

    from cyto.seal import check_rows, check_sealed_table, refuse_unfinished

    path = Path(path)
    if path.is_dir() and (path / "scores.parquet").is_file():  # a slide's cyto score folder
        path = path / "scores.parquet"
    if path.is_dir():
        slides = sorted(p.parent.name for p in path.glob("*/scores.parquet"))
        if slides:  # a cohort's folder (round 29, 13): its slides named
            raise InputPathError(
                f"{path} is a cohort's folder (a folder per slide: {', '.join(slides[:3])}"
                f"{', ...' if len(slides) > 3 else ''}): give one slide's, e.g. {path / slides[0]}"
            )
        refuse_unfinished(path)  # a slide's run stopped before its first table
        raise InputPathError(f"{path} is a folder without scores.parquet: give a score table")
    if path.name == "cohort.csv":  # a row per slide, not per cell
        raise InputPathError(
            f"{path} is a cohort's table (a row per slide), not a score table (a row per cell): "
            f"give a slide's folder beside it"
        )
    if not path.is_file():
        raise InputPathError(f"score table {path} does not exist")
    check_sealed_table(path)  # a scored folder's table only as it was written
    try:
        table = read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputPathError(f"cannot read {path} as Parquet or CSV: {exc}") from exc
    # a cyto table (cyto score's, cyto predict's) holds the rows cyto wrote, wherever it lies
    check_rows(table, path, "make it again (cyto score, cyto predict)")
    _refuse_extract(table, path)
    trained = _say_trained_on(table, path, echo)
    if seen is not None:  # what the table says beside its rows, for the caller's JSON
        seen["trained_on"] = trained
    if score_column == "auto":
        meta = table.schema.metadata or {}
        rank_by = meta.get(b"cyto.rank_by", b"").decode(errors="replace") or None
        score_column = ranked_column(table.column_names, rank_by)
        if rank_by is None and "rank" in table.column_names:
            score_column = _column_of_rank(table, score_column, echo)
        elif rank_by is None and echo is not None:
            _say_unranked(table, score_column, echo)
    if not need_label and label_column not in table.column_names:
        label_column = None
    fields = ((score_column, "score_column"), (label_column, "label_column"))
    for col, field in (c for c in fields if c[0] is not None):
        if col not in table.column_names:
            # a table of classes without labels (predict without normal=): judged per class
            per_class = (
                f"; judge its classes with {passing('by_class')} and "
                f"{passing('normal', Placeholder('CLASS'))}"
                if field == "label_column" and "class" in table.column_names
                else ""
            )
            raise MetricError(
                f"{path} has no column {col!r} ({passing(field, col)}); columns: "
                f"{', '.join(table.column_names)}{per_class}"
            )
    for col, field in fields:
        if col is None:
            continue
        kind = table.schema.field(col).type
        if not (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_decimal(kind)
            or pa.types.is_null(kind)
        ):
            raise MetricError(
                f"{path}: column {col!r} ({passing(field, col)}) holds {kind} values, not "
                "numbers; give the column of numeric scores and 0/1 labels"
            )
    scores = np.asarray(table[score_column].to_numpy(zero_copy_only=False), dtype=np.float64)
    scores = _unmeasured_lowest(scores, score_column, echo)
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:  # named as the table's rows: the metrics' 0-based positions misled (round 43)
        rows = ", ".join(str(i + 1) for i in bad[:5])
        raise MetricError(
            f"{bad.size} score(s) are NaN or infinite in {score_column!r} of {path} (e.g. its "
            f"row(s) {rows}, counted from 1 below the header); remove or rescore those cells"
        )
    if score_column in RANK_COLUMNS:
        scores = -scores
        if echo is not None:
            echo(f"note: {score_column}: 1 = most abnormal, read as such (lower = more abnormal)")
    labels = (
        None
        if label_column is None
        else np.asarray(table[label_column].to_numpy(zero_copy_only=False))
    )
    return (scores, labels, score_column) if with_column else (scores, labels)


#: how a note on a table without its ranking's record begins (:func:`_say_unranked`,
#: :func:`_column_of_rank`)
_UNRANKED = (
    "note: the table records no ranking (cyto.rank_by, in a cyto Parquet table's metadata, "
    "which a CSV copy loses)"
)


def _say_trained_on(table, path: Path, echo) -> int | None:
    """A cyto predict table's rows of images its model was trained on (its ``trained_on``
    column): said before any metric over them (the warning predict gave was lost by the next
    step, and the metrics over the mix went unsaid: hostile round 40, 2); how many (None: a
    table without the column)."""
    if "trained_on" not in table.column_names:
        return None
    flags = np.asarray(table["trained_on"].to_numpy(zero_copy_only=False))
    n = int(np.nansum(flags.astype(float)))
    if n and echo is not None:
        echo(
            f"note: {n} of the {len(flags)} rows of {path.name} are images its model was "
            "trained on or chose its ranking on (its trained_on column): a metric over them is "
            "not one of held-out cells; leave those rows out to measure held-out cells"
        )
    return n


def _refuse_extract(table, path: Path) -> None:
    """cyto score's ``topk.parquet`` (its metadata says so, under any name; a copy of it named
    ``topk``, which a CSV copy keeps) holds a slide's top cells only: metrics over it are not the
    slide's (AUROC 0.71 over its 400 rows for the slide's 0.83: hostile rounds 28, 5; 29, 1)."""
    meta = table.schema.metadata or {}
    if b"cyto.extract" in meta or path.stem == "topk":
        raise InputPathError(
            f"{path} holds a slide's top cells only (cyto score's topk.parquet, for review): "
            "metrics over it are not the slide's; give the slide's scores.parquet (or its folder)"
        )


def _metric_rows(scores, labels, k: list[int], column: str, seen: dict | None = None) -> list[dict]:
    """Every metric at each of ``k``, each row naming the column judged (``--json`` too), and
    the table's rows of training images where it flags them (``trained_on``: round 42, 7)."""
    extra = {} if seen is None or seen.get("trained_on") is None else seen
    return [{**all_metrics(scores, labels, kk), "score_column": column, **extra} for kk in k]


def _say_unranked(table, column: str, echo) -> None:
    """A table that records no ranking and has no ``rank`` to follow (a CSV copy with its rank
    dropped) is judged by ``column``; where it holds another of cyto's score columns, which
    one was judged is said: judged by the model's score, a table cyto had ranked by its
    morphometric score read AUROC 0.604 for 0.874, without a word (hostile round 26, 2)."""
    from cyto.data.morphometry import RANKED_COLUMN

    others = [c for c in dict.fromkeys(RANKED_COLUMN.values()) if c != column]
    others = [c for c in others if c in table.column_names]
    if others:
        echo(
            f"{_UNRANKED} and has no rank column: judged by {column!r}; "
            f"it also holds {', '.join(repr(c) for c in others)}: "
            f"{passing('score_column', 'COLUMN')} to judge another"
        )


def _unmeasured_lowest(scores: np.ndarray, column: str, echo) -> np.ndarray:
    """A morphometry column cyto writes (:data:`cyto.detect.morphometry.COLUMNS`) is NaN where
    no nucleus was measured near a crop's centre, as documented: those cells rank lowest, said
    in a note (the column was refused, "remove or rescore those cells": hostile round 33). Any
    other column's NaN is still refused, by the metrics."""
    from cyto.detect.morphometry import COLUMNS

    missing = np.isnan(scores)
    if column not in COLUMNS or not missing.any() or missing.all():
        return scores
    if echo is not None:
        echo(
            f"note: {column}: {int(missing.sum())} cell(s) with no nucleus measured (NaN) "
            "ranked lowest"
        )
    low = float(np.min(scores[~missing]))
    return np.where(missing, low - 1.0 - abs(low), scores)


def _column_of_rank(table, default: str, echo) -> str:
    """The column a table's ``rank`` follows, where the table does not record its ranking (a
    CSV copy, Parquet without its metadata: ``cyto.rank_by``), and ``echo`` told which: the
    default (:func:`ranked_column`) where it follows that, else another ranked column it
    follows, else ``rank`` itself. Judged by the model's ``score``, a predict table cyto had
    ranked by its morphometric score read AUROC 0.539 for 0.796 (hostile round 25)."""
    import pyarrow as pa

    from cyto.data.morphometry import RANKED_COLUMN

    if not pa.types.is_integer(table.schema.field("rank").type) or table["rank"].null_count:
        return default
    order = np.argsort(table["rank"].to_numpy(), kind="stable")
    candidates = [default] + [c for c in RANKED_COLUMN.values() if c != default]
    for column in dict.fromkeys(c for c in candidates if c in table.column_names):
        values = np.asarray(table[column].to_numpy(zero_copy_only=False), dtype=np.float64)
        values = np.nan_to_num(values[order], nan=-np.inf)
        if np.all(values[:-1] >= values[1:]):  # never higher further down the ranking
            found = column
            break
    else:
        found = "rank"
    if echo is not None:
        how = (
            "its rank follows no score column: judged by rank (1 = most abnormal)"
            if found == "rank"
            else f"judged by {found!r}, the column its rank follows"
        )
        echo(f"{_UNRANKED}: {how}; {passing('score_column', 'COLUMN')} to judge another")
    return found


def check_ks(k: list[int]) -> None:
    """Each K at least 1 and given once, refused in one line in the caller's words (``--k``,
    ``k=``) before the table is read: the metric's own "K must be >= 1" named no option."""
    from cyto.errors import ConfigError

    if not k:  # k=[]: no row, said as nothing judged (hostile round 28, 6)
        raise ConfigError(f"{said('k')} names no K: give one or more")
    for i, kk in enumerate(k):
        if kk < 1:
            raise ConfigError(
                f"{said('k')} must be >= 1 (cells at the top of the ranking), got {kk}"
            )
        if kk in k[:i]:  # two identical rows (hostile round 29, 13), as comma lists refuse
            raise ConfigError(f"{said('k')} lists {kk} twice")


def evaluate_table(
    path: Path,
    k: list[int],
    score_column: str = "auto",
    label_column: str = "label",
    echo=print,
) -> list[dict[str, float]]:
    """Every metric at each of ``k`` for the table at ``path`` (:func:`read_score_table`)."""
    check_ks(k)
    seen: dict = {}
    scores, labels, column = read_score_table(
        path, score_column, label_column, echo=echo, with_column=True, seen=seen
    )

    rows = _metric_rows(scores, labels, k, column, seen)  # a table it refuses: its one line
    _say_k(scores, k, echo)
    few = few_cells_words(None, int((labels == 1).sum()), int((labels == 0).sum()))
    if few is not None and echo is not None:
        echo(f"note: {few}")
    return rows


def _say_k(scores, k: list[int], echo) -> None:
    """What the rows at each K do not say: ties across the K-th place, and a K above the
    table's cells (the rows say K as the pool; the K asked was not said: hostile round 25)."""
    from cyto.eval.metrics import ties_words

    if echo is None:
        return
    for line in dict.fromkeys(filter(None, (ties_words(scores, kk) for kk in k))):
        echo(line)
    above = _above(k, len(scores))
    if above:
        echo(f"note: {above} more than the table's {len(scores)} cells: the whole table")


def _say_k_of_classes(pools: dict[str, int], k: list[int], echo) -> None:
    """A K above the cells of a class with the normal ones (``pools``): the by-class rows
    clamped K without a word (round 28, 4)."""
    above = _above(k, min(pools.values())) if pools and echo is not None else None
    if above:
        small = ", ".join(f"{c} {p}" for c, p in pools.items() if p < max(k))
        echo(
            f"note: {above} more than the cells of a class with the normal ones ({small}):"
            " its row judges them all (Recall@K of that class is then 1 where K is its pool)"
        )


def _above(k: list[int], n: int) -> str | None:
    """The Ks asked above ``n`` cells, as the caller gives them, with their verb; None: none."""
    above = sorted({kk for kk in k if kk > n})
    if not above:
        return None
    return f"{', '.join(passing('k', kk) for kk in above)} {'is' if len(above) == 1 else 'are'}"


def _first_words(exc: Exception) -> str:
    """The first sentence of a library's error (Arrow adds guesses after it)."""
    return first_line(exc).split(". ")[0].rstrip(".")


#: more distinct values than this, and more than half the rows, are no column of classes (a
#: column of file names or ids, each its own "class" of one cell: hostile round 25, 26)
MANY_CLASSES = 20


def evaluate_by_class(
    path: Path,
    k: list[int],
    normal: str | None = None,
    score_column: str = "auto",
    class_column: str = "class",
    label_column: str = "label",
    echo=print,
) -> list[dict]:
    """Per abnormal class of a multi-class table (a Bethesda class, a cell type): its cells
    against the normal class's alone, AUROC and each metric at each of ``k``. ``normal``: the
    normal class(es), comma-separated; None: the classes whose rows are all labelled 0."""
    import pyarrow as pa

    scores, labels, column = read_score_table(
        path, score_column, label_column, False, echo, with_column=True
    )
    path = Path(path) / "scores.parquet" if Path(path).is_dir() else Path(path)
    table = _read(path)
    if class_column not in table.column_names:
        raise MetricError(
            f"{path} has no column {class_column!r} ({passing('class_column', class_column)}); "
            "columns: "
            f"{', '.join(table.column_names)}"
        )
    classes = np.asarray(table[class_column].cast(pa.string()).to_pylist(), dtype=object)
    known = sorted({c for c in classes if c is not None})
    if len(known) > MANY_CLASSES and len(known) > len(classes) / 2:
        raise MetricError(
            f"{said('class_column')} {class_column}: {len(known)} distinct values in "
            f"{len(classes)} rows of {path} (e.g. {known[0]!r}): a column of classes names a "
            "few, each of many cells; is it a file or id column? Name the column of class names"
        )
    if labels is not None:  # a class of cells is one label throughout (round 26, 13)
        mixed = [c for c in known if len(set(labels[classes == c].tolist()) & {0, 1}) == 2]
        if mixed:
            c = mixed[0]
            ones = int(np.sum(labels[classes == c] == 1))
            raise MetricError(
                f"{said('class_column')} {class_column}: {len(mixed)} of its {len(known)} values "
                f"hold cells labelled both 0 and 1 ({c!r}: {ones} of "
                f"{int(np.sum(classes == c))} labelled 1): a column of classes gives each "
                f"class one label ({label_column!r}); name the column of class names"
            )
    if normal:
        normals = list(comma_list(normal, "normal"))
        unknown = [c for c in normals if c not in known]
        if unknown:  # a case slip answered, as train and predict answer it (round 27, 16)
            from cyto.data.dataset import case_hint

            raise MetricError(
                f"{said('normal')} {', '.join(c + case_hint(c, known) for c in unknown)}: no such "
                f"class in {path}; classes: {', '.join(known)} (names are case-sensitive)"
            )
    elif labels is not None:
        normals = [c for c in known if not np.any(labels[classes == c] == 1)]
    else:
        raise MetricError(
            f"{path} has no {label_column!r} column: name the normal class(es) with "
            f"{said('normal')}"
        )
    if not normals:
        raise MetricError(
            f"no normal class in {path} (every class has abnormal rows): give {said('normal')}"
        )
    if normal and labels is not None:
        _check_normal_against_labels(normal, normals, known, classes, labels, path, label_column)
    is_normal = np.isin(classes, normals)
    rows = []
    for cls in known:
        if cls in normals:
            continue
        pick = is_normal | (classes == cls)
        y = (classes[pick] == cls).astype(np.int64)
        per_k = [all_metrics(scores[pick], y, kk) for kk in k]
        rows.append(
            {
                "class": cls,
                "normal": ",".join(normals),
                "n_normal": int(is_normal.sum()),
                "n_class": int(y.sum()),
                "auroc": per_k[0]["auroc"],
                "by_k": per_k,
                "score_column": column,
                # fewer cells than measure a class (FEW_CLASS_CELLS): its note, in the row a
                # script reads too (it went to stderr beside --json only: round 59, 10)
                "too_few": few_cells_words(cls, int(y.sum()), int(is_normal.sum())),
            }
        )
    return rows


def evaluate_with_classes(
    path: Path,
    k: list[int],
    normal: str | None = None,
    score_column: str = "auto",
    class_column: str = "class",
    label_column: str = "label",
    echo=print,
) -> dict:
    """``cyto eval scores --by-class``: the overall metrics (``overall``: as
    :func:`evaluate_table`; None when the table has no ``label_column``) and each abnormal
    class against the normal class alone (``by_class``: :func:`evaluate_by_class`)."""
    check_ks(k)
    classes = evaluate_by_class(path, k, normal, score_column, class_column, label_column, echo)
    seen: dict = {}
    scores, labels, column = read_score_table(
        path, score_column, label_column, need_label=False, with_column=True, seen=seen
    )
    overall = None if labels is None else _metric_rows(scores, labels, k, column, seen)
    if overall is not None:
        _say_k(scores, k, echo)
    _say_k_of_classes({c["class"]: c["n_normal"] + c["n_class"] for c in classes}, k, echo)
    for c in classes:
        words = few_cells_words(c["class"], c["n_class"], c["n_normal"])
        if words is not None and echo is not None:
            echo(f"note: {words}")
    return {"overall": overall, "by_class": classes}


#: a class of fewer cells than this is said to be too few for its metrics to measure it
FEW_CLASS_CELLS = 10


def few_cells_words(cls: str | None, n: int, n_normal: int) -> str | None:
    """Why a class of few cells' AUROC does not measure the class, or None: ASC-H's one cell
    on a composed slide printed AUROC 0.248 as if it did (hostile round 57, 8). ``cls`` None:
    the abnormal cells of a whole table (its overall AUROC was said bare: round 63, 4)."""
    if n >= FEW_CLASS_CELLS:
        return None
    if cls is None:
        who, cells, its, what = "the table has", "abnormal cell", "the", "a ranking"
        ranks = "how abnormal cells rank"
    else:
        who, cells, its, what = f"{cls} has", "cell", "its", "the class"
        ranks = "how the class ranks"
    if n == 1:
        return (
            f"{who} 1 {cells}: {its} AUROC is where that one cell ranks among the {n_normal} "
            f"normal cells, not {ranks}"
        )
    return (
        f"{who} {n} {cells}s: each moves {its} AUROC by up to {1 / n:.2g}, too few to measure "
        f"{what} (fewer than {FEW_CLASS_CELLS})"
    )


def evaluate_scores(
    path: Path,
    k: list[int],
    score_column: str = "auto",
    label_column: str = "label",
    by_class: bool = False,
    class_column: str = "class",
    normal: str | None = None,
    echo=print,
    storage_options: dict | None = None,
) -> dict:
    """``cyto eval scores`` and :func:`cyto.evaluate`: ``overall`` (:func:`evaluate_table`) and
    ``by_class`` (:func:`evaluate_with_classes`; None unless asked). A class option given
    without ``by_class`` is refused, not ignored (hostile round 28, 8). ``path``: a table or a
    slide's folder, here or by its URL (``s3://BUCKET/OUT/SLIDE``: pulled with its seal,
    :func:`cyto.location.table_here`; ``storage_options`` its store's)."""
    from cyto.errors import CytoError
    from cyto.location import table_here

    local, where = table_here(path, storage_options)
    try:
        return _evaluate_scores(
            local, k, score_column, label_column, by_class, class_column, normal, echo
        )
    except CytoError as exc:  # named as the URL given, not cyto's cache
        raise where.translated(exc) from None


def _evaluate_scores(
    path: Path,
    k: list[int],
    score_column: str,
    label_column: str,
    by_class: bool,
    class_column: str,
    normal: str | None,
    echo,
) -> dict:
    if not by_class:
        given = [f for f, v in (("normal", normal), ("class_column", class_column))
                 if v is not None and v != "class"]  # fmt: skip
        if given:
            from cyto.errors import ConfigError

            raise ConfigError(
                f"{', '.join(said(f) for f in given)} name{'s' if len(given) == 1 else ''} the "
                f"classes of the by-class rows: add {passing('by_class')}"
            )
        return {"overall": evaluate_table(path, k, score_column, label_column, echo),
                "by_class": None}  # fmt: skip
    return evaluate_with_classes(path, k, normal, score_column, class_column, label_column, echo)


def _check_normal_against_labels(
    given: str, normals: list[str], known: list[str], classes, labels, path: Path, column: str
) -> None:
    """``--normal`` that the table's own labels contradict scored a label-0 class as an
    abnormal one, with no word: a named class with rows labelled 1, or a class left out whose
    rows are all labelled 0, is refused in one line naming the classes the labels call normal."""
    from cyto.flags import said

    flagged = {c: bool(np.any(labels[classes == c] == 1)) for c in known}
    zero = [c for c in known if not flagged[c]]
    where = f"in {path}'s {column!r} column"
    wrong = [c for c in normals if flagged[c]]
    if wrong:
        if zero:
            are = "class is" if len(zero) == 1 else "classes are"
            fix = f"whose label-0 {are} {', '.join(zero)}; give {said('normal')} {','.join(zero)}"
            fix += f" (or leave {said('normal')} out)"
        else:
            fix = f"where no class is labelled 0 throughout; check {said('label_column')}"
        raise MetricError(
            f"{said('normal')} {given}: the rows of {', '.join(wrong)} are labelled 1 "
            f"(abnormal) {where}, {fix}"
        )
    left = [c for c in zero if c not in normals]
    if left:
        it = "it" if len(left) == 1 else "each"
        raise MetricError(
            f"{said('normal')} {given} leaves out {', '.join(left)}, whose rows are all labelled "
            f"0 (normal) {where}: {it} would be scored as an abnormal class; add it to "
            f"{said('normal')} (or leave {said('normal')} out)"
        )


def _read(path: Path):
    return read_table(path)
