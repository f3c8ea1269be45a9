"""Tables the user names (nuclei, truth, manifests, score tables): read the one way
(:func:`arrow_source`), and their columns checked the same way for every reader.

Arrow takes a path as UTF-8 text only: a file whose name is not UTF-8 (``b'cells-\\xff.csv'``,
which Python holds with surrogate escapes) failed with a UnicodeEncodeError traceback wherever
a table was read by name; such a file is read whole into a buffer Arrow owns.

Every JSON file cyto writes (summaries, reports, manifests, records) is made by :func:`json_text`:
strict JSON, a number that is not finite (NaN, inf) written as ``null``, which every JSON parser
reads (``NaN`` is no JSON: a browser's ``JSON.parse`` refuses it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cyto.errors import InputPathError


def arrow_source(path: Path):
    """What Arrow reads the file ``path`` from: its name, where it is UTF-8 (Arrow's own file
    reader), else its bytes copied into a buffer Arrow owns; never a Python file object.

    Arrow wraps what it reads from a Python file in buffers that take the GIL when they are
    freed, and its I/O threads free the last of them late (a Parquet file's read-ahead): at the
    interpreter's exit such a thread is stopped with a C++ frame on its stack, and the process
    aborted (`cyto eval scores` exited 134, "terminate called without an active exception", in
    about one run of ten). A name Arrow cannot take (not UTF-8) is read whole instead."""
    import os

    import pyarrow as pa

    path = Path(path)
    try:
        os.fsdecode(path).encode("utf-8")
        return str(path)
    except UnicodeEncodeError:  # surrogate escapes: a name that is not UTF-8
        with open(path, "rb") as fh:
            data = fh.read()
        buf = pa.allocate_buffer(len(data))
        np.frombuffer(buf, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        return pa.BufferReader(buf)


def read_table(path: Path, csv_options=None, columns: list[str] | None = None):
    """The CSV (by suffix) or Parquet table at ``path`` as a pyarrow Table, read from
    :func:`arrow_source`; Arrow's errors and OSError pass through for the caller to put in one
    line naming its flag."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():  # Arrow's own message for a missing file names no flag
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if path.suffix.lower() == ".csv":
        with open(path, "rb") as fh:
            if fh.read(4) == b"PAR1":  # its bytes went into the CSV parser's message
                import pyarrow as pa

                raise pa.ArrowInvalid(
                    "it holds a Parquet table under a .csv name: rename it .parquet"
                )
    source = arrow_source(path)
    if path.suffix.lower() == ".csv":
        if csv_options is None:
            return pacsv.read_csv(source)
        return pacsv.read_csv(source, convert_options=csv_options)
    return pq.read_table(source, columns=columns)


def parquet_file(path: Path, **kwargs):
    """``pyarrow.parquet.ParquetFile`` of ``path``, read from :func:`arrow_source`."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(arrow_source(Path(path)), **kwargs)


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


def finite(obj: Any) -> Any:
    """``obj`` with every number that is not finite (NaN, inf, -inf, numpy's too) as ``None``,
    through nested dicts, lists and tuples; numpy scalars and arrays as plain Python values."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(obj: Any, *, default: Callable[[Any], Any] | None = None, **options: Any) -> str:
    """``obj`` as strict JSON (``json.dumps`` ``options``): what is not finite as ``null``
    (:func:`finite`), and a value that still is not (from ``default``) refused, never ``NaN``."""

    def convert(value: Any) -> Any:
        if default is None:
            raise TypeError(f"not JSON serializable: {type(value).__name__}")
        return finite(default(value))

    return json.dumps(finite(obj), allow_nan=False, default=convert, **options)
