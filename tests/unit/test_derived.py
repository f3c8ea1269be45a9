"""A kept derived engine is loaded only as the bytes its record names (issue 68, class 1): any
damage to the file (bytes flipped, cut short, grown, replaced, deleted) or to its record is
found before a runtime gets the bytes, and said in words."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cyto.runtime.derived import EngineFile, KeptEngine, read_engine

KEY = {"graph_sha256": "a" * 64, "openvino": "2026.4.1", "precision": "fp32", "cpu": ["FP32"]}
BLOB = bytes(range(256)) * 8


def _kept(tmp_path, key=KEY) -> KeptEngine:
    return KeptEngine(tmp_path / "ov", "compiled", ".blob", key)


def test_kept_bytes_load_back_with_their_sha256_and_a_new_engine_replaces_the_old(tmp_path):
    kept = _kept(tmp_path)
    assert kept.load() == (None, None, "")  # never kept: nothing to say
    engine = kept.keep(BLOB)
    data, loaded, why = kept.load()
    assert data == BLOB and loaded == engine and why == ""
    assert engine.sha256 == hashlib.sha256(BLOB).hexdigest() and engine.size == len(BLOB)
    assert engine.as_key() == {
        "engine": engine.path.name,
        "engine_sha256": engine.sha256,
        "engine_size": len(BLOB),
    }
    again = kept.keep(BLOB[::-1])  # compiled anew: another file, and the old one gone
    assert again.path != engine.path and not engine.path.exists()
    assert kept.load()[0] == BLOB[::-1]


def _damage(data: bytes, how: tuple) -> bytes:
    kind = how[0]
    if kind == "flip":
        out = bytearray(data)
        for where, mask in how[1]:
            out[int(where * len(out))] ^= mask
        return bytes(out)
    if kind == "truncate":
        return data[: int(how[1] * len(data))]
    if kind == "grow":
        return data + how[1]
    return how[1]  # replaced by other bytes


DAMAGE = st.one_of(
    st.tuples(
        st.just("flip"),
        st.lists(
            st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
            min_size=1,
            max_size=4,
            unique_by=lambda t: int(t[0] * len(BLOB)),
        ),
    ),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("grow"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("replace"), st.binary(max_size=4096).filter(lambda b: b != BLOB)),
)


@settings(max_examples=25, deadline=None)
@given(how=DAMAGE)
def test_a_damaged_engine_is_never_loaded_and_the_reason_is_said(tmp_path_factory, how):
    kept = _kept(tmp_path_factory.mktemp("d"))
    engine = kept.keep(BLOB)
    engine.path.write_bytes(_damage(BLOB, how))
    data, loaded, why = kept.load()
    assert data is None and loaded is None
    assert engine.path.name in why
    assert any(w in why for w in ("does not match its sha256", "cut short", "grown")), why


def test_a_deleted_engine_or_a_forged_record_is_never_trusted(tmp_path):
    kept = _kept(tmp_path)
    engine = kept.keep(BLOB)
    engine.path.unlink()
    assert kept.load()[2] == f"{engine.path.name} is missing"
    engine = kept.keep(BLOB)
    record = json.loads(kept.record_path.read_text())
    # a record that names a file outside its folder, or does not read back
    for forged in ({**record, "file": "../elsewhere.blob"}, {**record, "size": "big"}, []):
        kept.record_path.write_text(json.dumps(forged))
        assert "does not read back" in kept.load()[2]
    kept.record_path.write_text("{not json")
    assert "does not read back" in kept.load()[2]
    # another model's engine and record copied in: built for another graph
    kept = KeptEngine(kept.folder, "compiled", ".blob", KEY)
    other = _kept(tmp_path / "other", {**KEY, "graph_sha256": "b" * 64})
    other.keep(b"another model")
    kept.record_path.write_bytes(other.record_path.read_bytes())
    (kept.folder / json.loads(other.record_path.read_text())["file"]).write_bytes(b"another model")
    data, _, why = kept.load()
    assert (
        data is None
        and "does not match the folder it is kept in (changed or damaged: graph_sha256 bbbb" in why
    ), why


@pytest.mark.parametrize("size", [None, len(BLOB)])
def test_read_engine_checks_the_sha256_and_the_size(tmp_path, size):
    path = tmp_path / "e.plan"
    path.write_bytes(BLOB)
    sha = hashlib.sha256(BLOB).hexdigest()
    assert read_engine(path, sha, size) == (BLOB, "")
    path.write_bytes(BLOB[:-1])
    data, why = read_engine(path, sha, size)
    assert data is None and ("cut short" in why if size else "sha256" in why)
    assert EngineFile.of(path, BLOB).sha256 == sha
