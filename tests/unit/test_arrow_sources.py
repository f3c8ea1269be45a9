"""Arrow never reads a Python file object (cyto.tables.arrow_source): buffers it wraps from one
take the GIL when freed, and Arrow's I/O threads freed the last of them at the interpreter's
exit, aborting the process (`cyto eval scores` exited 134 in about one run of ten)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cyto.tables import arrow_source, read_table

SRC = Path(__file__).resolve().parents[2] / "src" / "cyto"
READERS = {"read_table", "ParquetFile", "read_csv", "read_json", "open_file", "open_stream"}


def _handles(tree: ast.AST) -> set[str]:
    """Names bound to ``open(...)`` in ``with`` statements."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and getattr(call.func, "id", getattr(call.func, "attr", "")) == "open"
                    and isinstance(item.optional_vars, ast.Name)
                ):
                    names.add(item.optional_vars.id)
    return names


def test_no_arrow_reader_is_given_a_python_file_object():
    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        handles = _handles(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            arg = node.args[0]
            if name in READERS and isinstance(arg, ast.Name) and arg.id in handles:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}({arg.id})")
    assert not found, "Arrow given an open file: " + ", ".join(found)


def test_a_file_whose_name_is_not_utf8_is_read_from_a_buffer_arrow_owns(tmp_path):
    table = pa.table({"x": np.arange(5.0), "y": np.arange(5.0)})
    odd = Path(str(tmp_path).encode().decode() + "/cells-\udcff.parquet")
    with open(odd, "wb") as fh:
        pq.write_table(table, fh)
    source = arrow_source(odd)
    assert isinstance(source, pa.BufferReader)
    assert read_table(odd).equals(table)
    plain = tmp_path / "cells.parquet"
    pq.write_table(table, plain)
    assert arrow_source(plain) == str(plain) and read_table(plain).equals(table)
