"""Tables the user names (nuclei, truth, manifests, score tables): read by a file handle, and
their columns checked the same way for every reader.

Arrow takes a path as UTF-8 text only: a file whose name is not UTF-8 (``b'cells-\\xff.csv'``,
which Python holds with surrogate escapes) failed with a UnicodeEncodeError traceback wherever
a table was read by name. Python opens any name; Arrow reads the open file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.errors import InputPathError


def read_table(path: Path, csv_options=None, columns: list[str] | None = None):
    """The CSV (by suffix) or Parquet table at ``path`` as a pyarrow Table; Arrow's errors and
    OSError pass through for the caller to put in one line naming its flag."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(path)
    with open(path, "rb") as fh:
        if path.suffix.lower() == ".csv":
            if csv_options is None:
                return pacsv.read_csv(fh)
            return pacsv.read_csv(fh, convert_options=csv_options)
        return pq.read_table(fh, columns=columns)


def named_columns(table, where: str) -> dict[str, str]:
    """A table's column names by their lower-case form; a name given twice (``x`` and ``X``,
    or ``x`` twice in a CSV header) is an :class:`InputPathError`: which one is meant?"""
    cols: dict[str, str] = {}
    for c in table.column_names:
        if c.lower() in cols:
            raise InputPathError(f"{where}: column {c!r} is given more than once; keep one")
        cols[c.lower()] = c
    return cols


def number_column(column) -> np.ndarray:
    """A table column as one float per row (None: NaN), or a ValueError / TypeError for a
    column of lists, structs or text that is no number."""
    values = np.asarray(column.to_pylist(), dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"one number per row expected, got {column.type}")
    return values


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a library's may span several)."""
    return " ".join(str(exc).split())
