"""``--storage-option``: one set for every URL of a run, each store given the options its file
system takes; an option no store takes is one line naming the nearest (hostile round 30, 3 and
8: an S3 endpoint beside an HTTP slide, and a misspelt ``endpont_url``, each failed the slide
"cannot read it (TypeError)", with nothing more under CYTO_DEBUG=1)."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cyto.errors import ConfigError
from cyto.slides.remote import SlideURL, _filesystem, _taken_by, options_for, parse_options
from tests.cli_runner import run_cyto

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fsspec", "s3fs", "aiohttp")),
    reason="fsspec, s3fs and aiohttp are cyto's remote extra (pip install -e '.[test]')",
)


def test_each_store_takes_its_own_options_of_one_set():
    both = {"endpoint_url": "http://127.0.0.1:9", "headers": {"X-Lab": "1"}}
    assert options_for("s3", both) == {"endpoint_url": "http://127.0.0.1:9"}
    assert options_for("http", both) == {"headers": {"X-Lab": "1"}}
    # the file systems are made with them (no connection yet): no TypeError for either
    fs, _, _ = _filesystem(SlideURL("s3://bucket/a.tif", both))
    given_to = (getattr(fs, "endpoint_url", None), fs.client_kwargs.get("endpoint_url"))
    assert "http://127.0.0.1:9" in given_to
    _filesystem(SlideURL("http://127.0.0.1:9/a.tif", both))


@given(st.sampled_from(sorted(_taken_by("s3") or ["endpoint_url"])), st.integers(0, 10**6))
def test_a_misspelt_option_is_refused_naming_the_nearest(name, seed):
    """A real S3 option with one letter dropped is no option of any store (unless it happens
    to be another's): refused, naming the option it was nearest to, before any slide is read."""
    if len(name) < 6:
        return
    i = 1 + seed % (len(name) - 2)
    typo = name[:i] + name[i + 1 :]
    known = set().union(*(_taken_by(s) or () for s in ("s3", "http", "gs")))
    if typo in known:
        return
    with pytest.raises(ConfigError) as err:
        parse_options([f"{typo}=1"])
    line = str(err.value)
    assert line.startswith(f"--storage-option {typo}: no option of") and "\n" not in line
    with pytest.raises(ConfigError, match=r"did you mean endpoint_url\?"):
        options_for("s3", {"endpont_url": "http://x"})


@given(
    st.sampled_from(["client_kwargs", "config_kwargs", "headers"]),
    st.dictionaries(st.sampled_from(["region_name", "X-Lab", "secret"]),
                    st.text(max_size=6).map(lambda t: f"s3cr3t{t}"), min_size=1),
    st.data(),
)  # fmt: skip
def test_a_mapping_option_that_is_no_mapping_is_refused_without_its_value(name, mapping, data):
    """Hostile round 72, 2: `--storage-option 'client_kwargs={"region_name": 5'` (one brace
    short) was passed on as text, and s3fs failed deep inside: "cannot write --out s3://...:
    cannot read it (AttributeError)", exit 1. JSON cut short is refused naming the option and
    the JSON error; a mapping option given no mapping (from Python too) is refused; neither
    shows the value (a header's may be a secret)."""
    import json

    text = json.dumps(mapping)
    cut = text[: data.draw(st.integers(1, len(text) - 1))]
    with pytest.raises(ConfigError) as err:
        parse_options([f"{name}={cut}"])
    line = str(err.value)
    assert line.startswith(f"--storage-option {name}: its value does not read as JSON (")
    assert "\n" not in line and "s3cr3t" not in line
    assert parse_options([f"{name}={text}"]) == {name: mapping}  # whole, it is taken
    for wrong in ("eu-west-1", 5, ["a"]):
        with pytest.raises(ConfigError, match=f"^--storage-option {name} takes a mapping"):
            options_for("s3", {name: wrong})
    from cyto.flags import python_words

    with python_words("score_slide"), pytest.raises(ConfigError) as err:
        options_for("s3", {name: "x"})
    assert str(err.value).startswith(f"storage_options[{name!r}] takes a mapping")


def test_the_command_refuses_it_before_any_work(tmp_path, exported_dsvdd):
    out = tmp_path / "out"
    proc = run_cyto(
        "score", "s3://bucket/a.tif", "--model", str(exported_dsvdd), "--out", str(out),
        "--storage-option", "endpont_url=http://127.0.0.1:9",
    )  # fmt: skip
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --storage-option endpont_url: no option of cyto's remote")
    assert "(did you mean endpoint_url?)" in last
    assert not out.exists()


@given(
    st.sampled_from(["s3", "gs", "http", "https", "S3", "dicomweb+https"]),
    st.text("ab/.", max_size=8),
)
def test_a_url_with_one_slash_is_said_to_be_one(scheme, rest):
    """`cyto score s3:/bucket/a.tif` was read as a local path and said "no such file" (hostile
    round 30, 15): a known scheme with one slash is named as the URL it was meant to be."""
    from cyto.errors import InputPathError
    from cyto.slides.remote import slide_ref

    with pytest.raises(InputPathError) as err:
        slide_ref(f"{scheme}:/bucket{rest}")
    assert f"a URL takes two slashes after {scheme}: ({scheme}://...)" in str(err.value)
    assert isinstance(slide_ref(f"{scheme}://bucket/a.tif"), SlideURL)
    assert not isinstance(slide_ref("c:/slides/a.tif"), SlideURL)  # no scheme of a store


def test_doctor_says_which_stores_it_reads_and_what_to_install(monkeypatch):
    """`cyto doctor` said nothing of remote slides (hostile round 30, 14): a line names each
    store it reads here with its library, and what to install for those it does not."""
    import importlib.util

    from cyto.doctor import OK, remote_check
    from cyto.slides.remote import SCHEMES

    line = remote_check()
    assert line.status == OK
    assert all(lib in line.detail for lib in set(SCHEMES.values()))  # every store is named
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a)
    )
    line = remote_check()
    assert line.status != OK and line.detail.endswith("; not gs://: pip install 'cyto[remote]'")


def test_a_refused_certificate_is_said_as_one_whatever_library_wraps_it():
    """The TLS words of a failed request (round 30, 15) read the whole chain of the error: a
    certificate refused under botocore's or aiohttp's own error is said to be a certificate,
    not a server that speaks no HTTPS."""
    import ssl

    from cyto.slides.remote import SlideURL, _tls

    ref = SlideURL("https://slides.lab/a.tif")

    class SSLError(Exception):  # botocore.exceptions.SSLError, by its name
        pass

    try:
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed")
        except ssl.SSLError as inner:
            raise SSLError("SSL validation failed") from inner
    except SSLError as outer:
        said = _tls(outer, ref)
    assert said.startswith("its TLS certificate was not accepted")
    assert _tls(ssl.SSLError(1, "WRONG_VERSION_NUMBER"), ref).startswith("the TLS handshake")
    assert _tls(ConnectionResetError(), ref) is None
