"""The tests' table comparison holds NaN equal to NaN and nothing else looser than Arrow's."""

import pyarrow as pa

from tests.tables import same_table


def test_same_table_holds_nan_equal_and_tells_a_changed_value():
    a = pa.table({"x": [1.0, float("nan")], "n": ["a", "b"]})
    assert not a.equals(a)  # why the helper exists: Arrow holds NaN unequal to itself
    assert same_table(a, pa.table({"x": [1.0, float("nan")], "n": ["a", "b"]}))
    assert not same_table(a, pa.table({"x": [1.0, 2.0], "n": ["a", "b"]}))
    assert not same_table(a, pa.table({"x": [1.0, float("nan")], "n": ["a", "c"]}))
    assert not same_table(a, pa.table({"x": [1.0, float("nan")]}))
    assert not same_table(a, pa.table({"x": pa.array([1.0, None], pa.float32()), "n": ["a", "b"]}))


def test_same_table_within_a_relative_tolerance_only_where_asked():
    a, b = pa.table({"x": [100.0, 1.0]}), pa.table({"x": [100.0 * (1 + 1e-10), 1.0]})
    assert not same_table(a, b) and same_table(a, b, rtol=1e-8)
    assert not same_table(a, pa.table({"x": [100.001, 1.0]}), rtol=1e-8)
