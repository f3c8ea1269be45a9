"""Every number cyto reads from its environment is read alike (cyto.envvars.env_number): the
blanks around it are not its, a value that is not a finite number of 0 or more (above 0 for a
timeout, a day at most for seconds) is refused in one line naming the variable (hostile round
41, 6-7: a negative or nan CYTO_REMOTE_TIMEOUT was taken and every request "timed out" at once,
blamed on the server; CYTO_READ_AHEAD_MB=inf overflowed; CYTO_REMOTE_BLOCKS_MB=-1 was refused by
one reader and read as 0 by another; round 42, 5: a timeout of 1e10 s overflowed the clock in a
traceback)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cyto.errors import ConfigError


def _readers():
    from cyto.slides import ahead, remote

    return {
        # reader, scale, above 0, at most
        "CYTO_REMOTE_TIMEOUT": (remote.timeout, 1.0, True, 86400.0),
        "CYTO_REMOTE_BLOCKS_MB": (
            lambda: remote.megabytes(remote.SHARED_BYTES_ENV, 0),
            2**20,
            False,
            math.inf,
        ),
        "CYTO_DOWNLOAD_MB": (
            lambda: remote.megabytes(remote.DOWNLOAD_BYTES_ENV, 0),
            2**20,
            False,
            math.inf,
        ),
        "CYTO_READ_AHEAD_MB": (ahead.budget, 2**20, False, math.inf),
    }


@pytest.mark.parametrize("variable", sorted(_readers()))
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=32),
        st.sampled_from(["abc", "1e999", "-inf", "nan", " 7 ", "", "0", "-0", "86400", "1e10"]),
    )
)
def test_a_number_of_the_environment_is_taken_or_refused_by_one_rule(variable, value):
    import os

    read, scale, positive, most = _readers()[variable]
    text = value if isinstance(value, str) else repr(value)
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    ok = text.strip() == "" or (
        math.isfinite(number) and number >= 0 and (number > 0 or not positive) and number <= most
    )
    saved = os.environ.get(variable)
    os.environ[variable] = text
    try:
        if variable == "CYTO_READ_AHEAD_MB":
            os.environ["CYTO_REMOTE_BLOCKS_MB"] = "1000000"  # its bound: half of this
        if ok:
            got = read()
            if text.strip():
                want = int(number * scale) if scale > 1 else number
                if variable == "CYTO_READ_AHEAD_MB":  # at most half the shared blocks' bound
                    want = min(want, (1_000_000 << 20) // 2)
                assert got == pytest.approx(want, abs=1)
        else:
            with pytest.raises(ConfigError) as info:
                read()
            assert str(info.value).startswith(f"{variable}={text.strip()!r}: give ")
            assert "\n" not in str(info.value)
    finally:
        os.environ.pop("CYTO_REMOTE_BLOCKS_MB", None)
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved


def test_every_cyto_variable_is_read_through_the_one_rule():
    """Hostile round 44 (4): CYTO_DEBUG was compared raw (``" 1 "`` printed no traceback) where
    every other variable is read without its blanks; every read of a CYTO_ variable (by name or
    by a ``*_ENV`` constant) goes through cyto.envvars, never os.environ directly."""
    import re
    from pathlib import Path

    import cyto

    src = Path(cyto.__file__).parent
    read = re.compile(r"os\.(environ\.get|getenv)\((\"CYTO_|[A-Z_]*_ENV\b)")
    found = [
        f"{p.relative_to(src)}:{n}"
        for p in sorted(src.rglob("*.py"))
        if p.name != "envvars.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if read.search(line)
    ]
    assert found == [], found


@given(
    blank=st.sampled_from(["", " ", "\t", "  \n"]),
    word=st.sampled_from(["1", "0", "true", "False", "YES", "no", "on", "Off", "2", "debug"]),
    name=st.sampled_from(["CYTO_DEBUG", "CYTO_PROGRESS"]),
)
def test_a_switch_is_read_without_its_blanks_and_refused_in_one_line_otherwise(blank, word, name):
    """Round 44 (4): ``CYTO_DEBUG=" 1 "`` printed no traceback; round 45 (11): ``true`` and
    ``off`` were passed over without a word, where the docs said anything else is refused."""
    import os

    from cyto.envvars import SWITCHES, check_switches, env_switch

    saved = os.environ.get(name)
    os.environ[name] = f"{blank}{word}{blank}"
    try:
        on = word.lower() in ("1", "true", "yes", "on")
        off = word.lower() in ("0", "false", "no", "off")
        assert env_switch(name) == (on or (not off and SWITCHES[name]))
        if on or off:
            check_switches()
        else:
            with pytest.raises(ConfigError, match=rf"^{name}='{word}': give 1 \(or true"):
                check_switches()
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def test_cyto_debug_with_blanks_shows_the_traceback(tmp_path):
    from tests.cli_runner import run_cyto

    (tmp_path / "junk.cyto").mkdir()
    proc = run_cyto("info", str(tmp_path / "junk.cyto"), env={"CYTO_DEBUG": " 1 "}, process=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr, proc.stderr
    proc = run_cyto("info", str(tmp_path / "junk.cyto"), env={"CYTO_DEBUG": "maybe"}, process=True)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: CYTO_DEBUG='maybe': give 1 (or true, yes, on) or 0 (or false, no, off), or unset it"
    ), proc.stderr


def test_a_bad_remote_timeout_is_one_line_before_any_work(tmp_path, exported_dsvdd):
    """Hostile round 45 (12): ``CYTO_REMOTE_TIMEOUT=1e10`` was said once per URL slide, each a
    failed slide, after the model had loaded and been verified."""
    from tests.cli_runner import run_cyto

    proc = run_cyto(
        "score", "http://127.0.0.1:9/a.tif", "http://127.0.0.1:9/b.tif", "--model",
        str(exported_dsvdd), "--out", str(tmp_path / "o"),
        env={"CYTO_REMOTE_TIMEOUT": "1e10"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: CYTO_REMOTE_TIMEOUT='1e10': give seconds, a number above 0 and at most 86400, "
        "e.g. 30"
    ]
    assert not (tmp_path / "o").exists()
