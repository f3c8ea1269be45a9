"""Every JSON file cyto writes is strict JSON (:func:`cyto.tables.json_text`): a number that is
not finite is written as null, which every parser reads (issue 68, hostile round 11, N31)."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cyto.tables import finite, json_text

_odd = st.sampled_from(
    [
        math.nan,
        math.inf,
        -math.inf,
        np.float32("nan"),
        np.float64("inf"),
        np.float16("-inf"),
        np.float32(1.5),
        np.int64(3),
    ]
)
_leaf = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(), _odd)
_values = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
    ),
    max_leaves=20,
)


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _same(read, value) -> None:
    """``read`` is ``value`` as written: lists for tuples, null for what is not finite."""
    if isinstance(value, dict):
        assert read.keys() == value.keys()
        for k in value:
            _same(read[k], value[k])
    elif isinstance(value, list | tuple):
        assert len(read) == len(value)
        for r, v in zip(read, value, strict=True):
            _same(r, v)
    else:
        v = value.item() if isinstance(value, np.generic) else value
        if isinstance(v, float) and not math.isfinite(v):
            assert read is None
        else:
            assert read == v


@given(_values)
def test_written_json_is_strict_and_reads_back(value):
    text = json_text({"v": value}, indent=1)
    _same(_strict(text)["v"], value)


@given(_values)
def test_defaults_results_are_made_finite_too(value):
    class Odd:
        pass

    text = json_text([Odd()], default=lambda o: {"odd": value})
    _same(_strict(text)[0]["odd"], value)


def test_arrays_and_nested_numpy():
    out = finite({"a": np.array([1.0, np.nan]), "b": [np.float32("inf"), (np.int8(2),)]})
    assert out == {"a": [1.0, None], "b": [None, [2]]}
