"""A review's marks log that is damaged or not SQLite is one line naming it, in every command
that opens it (a hostile check: `cyto view`, `cyto review report` and `cyto review serve` over
a marks.sqlite of random bytes ended in a raw sqlite3.DatabaseError)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyto.errors import InputPathError
from cyto.review.store import MARKS_FILE, MarkStore
from tests.damage import KINDS, damaged


def _log(folder):
    folder.mkdir(parents=True, exist_ok=True)
    store = MarkStore(folder)
    for i in range(40):
        store.mark("ann", f"case{i % 4}", i, True, "HSIL" if i % 3 else "")
    store.set_done("ann", "case0", True)
    want = (store.marks(), store.done(), store.reviewers())
    store.close()
    return want


def _read(folder):
    store = MarkStore(folder)
    try:
        return store.marks(), store.done(), store.reviewers()
    finally:
        store.close()


def test_random_bytes_for_a_marks_log_is_one_line_naming_it(tmp_path):
    (tmp_path / MARKS_FILE).write_bytes(os.urandom(100))
    with pytest.raises(InputPathError, match="cannot be read as the review's marks log") as err:
        MarkStore(tmp_path)
    assert "\n" not in str(err.value) and MARKS_FILE in str(err.value)
    assert (tmp_path / MARKS_FILE).stat().st_size == 100  # nothing made anew over it


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    where=st.floats(0, 1, exclude_max=True),
    damage=st.sampled_from(KINDS),
)
def test_a_damaged_marks_log_reads_back_whole_or_is_one_line(tmp_path_factory, where, damage):
    folder = tmp_path_factory.mktemp("review")
    want = _log(folder)
    path = folder / MARKS_FILE
    path.write_bytes(damaged(path.read_bytes(), damage, where))
    try:
        got = _read(folder)
    except InputPathError as err:  # never sqlite3's own error
        assert "\n" not in str(err) and MARKS_FILE in str(err)
    else:
        # damage SQLite cannot see (free space, a value's bytes) reads back as rows
        assert isinstance(got[0], dict) and isinstance(got[2], list)
        assert damage != "cut" or got == want  # never a shorter log read as if whole
