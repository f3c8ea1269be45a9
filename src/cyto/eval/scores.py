"""``cyto eval scores``: every metric for any score table (cyto's own or a user's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.errors import InputPathError, first_line
from cyto.eval.metrics import MetricError, all_metrics

#: the column a cyto table's ``rank`` follows under each ranking (``--rank-by``)
RANKED_COLUMN = {
    "model": "score",
    "morphometry": "morphometry_score",
    "model+morphometry": "fused_score",
    "model+nucleus": "fused_score",
}


def ranked_column(columns, rank_by: str | None = None) -> str:
    """The column a cyto table's ``rank`` follows: the one of its ranking (``rank_by``, its
    ``cyto.rank_by`` metadata), else ``fused_score`` where there is one, else ``score``."""
    column = RANKED_COLUMN.get(rank_by or "")
    if column is not None and column in columns:
        return column
    return "fused_score" if "fused_score" in columns else "score"


def check_parquet(path: Path, fix: str) -> None:
    """Refuse a Parquet file that cannot be opened (truncated by a full disk or a copy cut
    short, or not Parquet at all) in one line that names it and says ``fix``; its footer, which
    a cut file loses first, is read, not its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open(path, "rb") as fh:  # a handle: Arrow takes a path in UTF-8 only
            pq.ParquetFile(fh).close()
    except (pa.ArrowException, OSError) as exc:
        raise InputPathError(
            f"{path} is truncated or damaged ({_first_words(exc)}); {fix}"
        ) from exc


def read_score_table(path: Path, score_column: str, label_column: str):
    """(scores, labels) of a table; ``score_column`` ``auto``: :func:`ranked_column`."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputPathError(f"score table {path} does not exist")
    try:
        with open(path, "rb") as fh:  # a handle: Arrow takes a path in UTF-8 only
            table = pacsv.read_csv(fh) if path.suffix.lower() == ".csv" else pq.read_table(fh)
    except (pa.ArrowException, OSError) as exc:
        raise InputPathError(f"cannot read {path} as Parquet or CSV: {exc}") from exc
    if score_column == "auto":
        meta = table.schema.metadata or {}
        rank_by = meta.get(b"cyto.rank_by", b"").decode(errors="replace") or None
        score_column = ranked_column(table.column_names, rank_by)
    for col in (score_column, label_column):
        if col not in table.column_names:
            raise MetricError(
                f"{path} has no column {col!r}; columns: {', '.join(table.column_names)}"
            )
    for col, flag in ((score_column, "--score-column"), (label_column, "--label-column")):
        kind = table.schema.field(col).type
        if not (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_decimal(kind)
            or pa.types.is_null(kind)
        ):
            raise MetricError(
                f"{path}: column {col!r} ({flag}) holds {kind} values, not numbers; give the "
                "column of numeric scores and 0/1 labels"
            )
    scores = np.asarray(table[score_column].to_numpy(zero_copy_only=False), dtype=np.float64)
    labels = np.asarray(table[label_column].to_numpy(zero_copy_only=False))
    return scores, labels


def evaluate_table(
    path: Path, k: list[int], score_column: str = "auto", label_column: str = "label"
) -> list[dict[str, float]]:
    scores, labels = read_score_table(path, score_column, label_column)
    return [all_metrics(scores, labels, kk) for kk in k]


def _first_words(exc: Exception) -> str:
    """The first sentence of a library's error (Arrow adds guesses after it)."""
    return first_line(exc).split(". ")[0].rstrip(".")
