"""cyto.reuse.check_reuse over generated keys and damaged artifacts."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from cyto.reuse import Artifact, check_reuse, key_sha256

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6))
keys = st.dictionaries(
    st.text("abcdefgh_", min_size=1, max_size=6),
    st.one_of(
        scalars, st.dictionaries(st.text("xyz", min_size=1, max_size=3), scalars, max_size=3)
    ),
    max_size=6,
)


@given(keys)
def test_a_key_matches_itself_and_its_json_copy(key):
    import json

    assert check_reuse(key, key).ok
    assert check_reuse(json.loads(json.dumps(key)), key).ok
    assert key_sha256(key) == key_sha256(json.loads(json.dumps(key)))


@given(keys, keys)
def test_any_difference_is_named_by_its_flag(recorded, current):
    import json

    def text(d, name):
        return json.dumps(d.get(name), sort_keys=True)  # a field absent reads as its default

    reuse = check_reuse(recorded, current)
    moved = [n for n in {*recorded, *current} if text(recorded, n) != text(current, n)]
    assert reuse.ok == (not moved)
    for name in moved:
        assert f"--{name.replace('_', '-')}" in reuse.words()


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_a_secret_is_never_shown(seed_then, seed_now):
    reuse = check_reuse({"seed": seed_then}, {"seed": seed_now}, secret={"seed"})
    assert reuse.ok == (seed_then == seed_now)
    assert str(seed_then) not in reuse.words() and str(seed_now) not in reuse.words()
    if not reuse.ok:
        assert "--seed differs" in reuse.words()


def test_no_record_is_no_reuse():
    assert check_reuse(None, {"a": 1}).missing and not check_reuse(None, {}).ok


@given(st.integers(0, 40), st.integers(0, 40), st.sampled_from(["cut", "empty", "gone", "whole"]))
def test_parquet_artifacts_read_back_with_their_rows(tmp_path_factory, n, claimed, damage):
    path = tmp_path_factory.mktemp("a") / "t.parquet"
    pq.write_table(pa.table({"score": [float(i) for i in range(n)]}), path)
    data = path.read_bytes()
    if damage == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "gone":
        path.unlink()
    problem = Artifact(path, "parquet", rows=claimed, columns=("score",)).problem()
    assert (problem is None) == (damage == "whole" and n == claimed)
    if problem:
        assert "t.parquet" in problem
    if damage == "whole":
        assert "lacks the column(s) rank" in Artifact(path, "parquet", columns=("rank",)).problem()
