"""Comparing score tables in tests: NaN is a value a table holds on purpose (a cell whose nucleus
was not found has no N/C ratio), and Arrow's ``Table.equals`` holds NaN unequal to itself."""

from __future__ import annotations

import numpy as np


def same_table(a, b, rtol: float = 0.0) -> bool:
    """Whether Arrow tables ``a`` and ``b`` hold the same columns, types and values, NaN equal to
    NaN (schema metadata aside, as ``Table.equals`` has it); floating values within ``rtol`` of
    each other where it is given (lengths in um from a pixel size written as a decimal string)."""
    import pyarrow as pa

    if a.schema.remove_metadata() != b.schema.remove_metadata() or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x, y = a[name], b[name]
        if pa.types.is_floating(x.type):
            u, v = x.to_numpy(zero_copy_only=False), y.to_numpy(zero_copy_only=False)
            if not (np.allclose(u, v, rtol=rtol, atol=0.0, equal_nan=True) if rtol else
                    np.array_equal(u, v, equal_nan=True)):  # fmt: skip
                return False
        elif not x.equals(y):
            return False
    return True
