"""Tables the user names (nuclei, truth, manifests, score tables), read by a file handle.

Arrow takes a path as UTF-8 text only: a file whose name is not UTF-8 (``b'cells-\\xff.csv'``,
which Python holds with surrogate escapes) failed with a UnicodeEncodeError traceback wherever
a table was read by name. Python opens any name; Arrow reads the open file.
"""

from __future__ import annotations

from pathlib import Path


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
