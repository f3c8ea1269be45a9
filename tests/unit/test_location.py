"""An output location (cyto.location) without a server: what it prints, where it stages, what it
refuses, and that it travels to another process (a Ray actor) as the prefix, not as a path."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cyto.errors import InputPathError
from cyto.location import OutputLocation, output_location, shown


def test_a_prefix_stages_in_the_cache_and_prints_as_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    where = output_location("s3://bucket/scored", {"endpoint_url": "http://127.0.0.1:9"})
    assert where.is_remote and str(where) == "s3://bucket/scored"
    assert where.local.is_relative_to(tmp_path / "cache" / "outputs")
    slide = where.child("s1")
    assert str(slide) == "s3://bucket/scored/s1" and slide.local == where.local / "s1"
    # the summary and cohort.csv record the prefix, never the staging folder
    assert shown(slide.local) == "s3://bucket/scored/s1"
    assert shown(slide.local / "scores.parquet") == "s3://bucket/scored/s1/scores.parquet"
    assert shown(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")
    assert slide.words(f"cannot write {slide.local}/x") == "cannot write s3://bucket/scored/s1/x"
    # the same bucket on another endpoint is another place
    other = output_location("s3://bucket/scored", {"endpoint_url": "http://127.0.0.1:10"})
    assert other.local != where.local


def test_a_location_travels_as_the_prefix(tmp_path, monkeypatch):
    """Unpickled under another cache (another node), a slide's folder stages there, with its
    storage options."""
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "a"))
    slide = output_location("s3://bucket/p/", {"key": "k"}).child("s1")
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "b"))
    there = pickle.loads(pickle.dumps(slide))
    assert str(there) == "s3://bucket/p/s1" and there.ref.options == {"key": "k"}
    assert there.local.is_relative_to(tmp_path / "b") and there.local.name == "s1"
    local = pickle.loads(pickle.dumps(output_location(tmp_path / "out").child("s1")))
    assert not local.is_remote and local.local == tmp_path / "out" / "s1"


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("https://host/out/", "to a local folder or to s3:// or gs:// prefixes, not https://"),
        ("s3://bucket/out/?X-Amz-Signature=abc", "without a query string"),
    ],
)
def test_what_cannot_be_an_output_is_one_line(out, words, tmp_path, monkeypatch):
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path))
    with pytest.raises(InputPathError, match=words) as info:
        OutputLocation(out)
    assert "abc" not in str(info.value)


KEY = "abcdefghijklmnopqrstuvwxyz0123456789-_."


@given(
    parts=st.lists(
        st.text(KEY, min_size=1, max_size=12).filter(lambda k: k not in (".", "..")),
        min_size=1,
        max_size=4,
    ),  # fmt: skip
    spelled_as_prefix=st.booleans(),
    tail=st.sampled_from(["", "/summary.json", "/"]),
    around=st.sampled_from(["{} is being written", "x ({}) y", "{}: no seal", "'{}'"]),
)
def test_one_folder_of_objects_is_one_staging_folder_and_is_said_as_its_url(
    parts, spelled_as_prefix, tail, around, tmp_path_factory
):
    """Hostile round 31 (3, 6): a slide's folder given as the cohort's prefix and a child, or
    as its own URL, is one staging folder (they were two: a result kept in one was not found
    by the other); and any message naming a path in it says the URL instead (a lock's
    refusal named cyto's cache)."""
    import os

    from cyto.location import urls_for_staging

    before = os.environ.get("CYTO_CACHE_DIR")
    os.environ["CYTO_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        url = "s3://bucket/" + "/".join(parts)
        whole = output_location(url + "/")
        head = output_location("s3://bucket/" + "/".join(parts[:-1]))
        spelled = head.child(parts[-1]) if spelled_as_prefix else whole
        assert spelled.local == whole.local and str(spelled) == url
        message = around.format(f"{whole.local}{tail}")
        assert urls_for_staging(message) == around.format(f"{url}{tail}")
        elsewhere = around.format(f"{tmp_path_factory.getbasetemp()}/x{tail}")
        assert urls_for_staging(elsewhere) == elsewhere
    finally:
        if before is None:
            del os.environ["CYTO_CACHE_DIR"]
        else:
            os.environ["CYTO_CACHE_DIR"] = before


def test_a_prefix_of_dot_segments_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(InputPathError, match="a prefix of . or .. segments"):
        output_location("s3://bucket/a/../b/")


def test_a_retried_prefix_is_said_as_a_prefix(tmp_path, monkeypatch, caplog):
    """Hostile round 32 (6): a request to an output prefix that was retried was said "(said
    once per slide)", where no slide is involved."""
    import logging

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("time.sleep", lambda _s: None)
    loc = OutputLocation("s3://bucket/runs/")
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("no answer")
        return 7

    with caplog.at_level(logging.WARNING, logger="cyto"):
        assert loc._call(flaky, "list") == 7
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note:")]
    assert notes == [
        "note: s3://bucket/runs: the server did not answer in time; retrying (said once)"
    ]


@pytest.mark.parametrize("scheme", ["file", "ftp", "dicomweb+http"])
def test_an_out_of_a_scheme_cyto_does_not_write_to_says_where_outputs_go(scheme):
    """Hostile round 45 (14): ``--out file:///x`` was told "cyto reads slides from s3://, ...",
    the refusal of a slide, not of an output."""
    with pytest.raises(InputPathError) as err:
        OutputLocation(f"{scheme}://host/work/o")
    assert str(err.value) == (
        f"--out {scheme}://host/work/o: cyto writes outputs to a local folder or to s3:// or "
        f"gs:// prefixes, not {scheme}://"
    )
