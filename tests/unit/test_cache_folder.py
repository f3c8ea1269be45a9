"""cyto's cache folder (hostile round 5, WS 1.13): a CYTO_CACHE_DIR that cannot be used was
passed over for a temporary folder without a word, and `cyto doctor` said "everything asked for
runs here". The folder the user named is used or refused in one line; a default folder that
cannot be written is said once, and doctor shows either."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

from tests.cli_runner import run_cyto


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_a_cache_folder_the_user_named_is_used_or_refused_in_one_line(tmp_path, kind):
    import os

    bad = tmp_path / "cache"
    if kind == "file":
        bad.write_text("not a folder")
    else:
        bad.mkdir()
        bad.chmod(0o500)
        if os.access(bad, os.W_OK):  # root writes anywhere: nothing to refuse
            pytest.skip("this user writes read-only folders (root)")
    env = {"CYTO_CACHE_DIR": str(bad)}
    proc = run_cyto("doctor", env=env, process=True)
    # the label column is as wide as the longest label: the CPU's name sets it ("cpu AMD EPYC"
    # is narrower than an Intel Xeon's), so the row is matched by its words
    assert re.search(
        rf"^  cache folder +FAILED +CYTO_CACHE_DIR={re.escape(str(bad))} ", proc.stdout, re.M
    ), proc.stdout
    assert "everything asked for runs here" not in proc.stdout
    proc = run_cyto("info", str(tmp_path / "missing.cyto"), env=env, process=True)
    assert "Traceback" not in proc.stderr  # the cache is no reason for a traceback at import


def _files(folder):
    return {p: p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def test_cyto_refuses_an_unusable_cache_folder_before_any_work(exported_dsvdd, tmp_path):
    """The refusal came after `cyto export` had written the bundle's graph again (where it
    first used the cache): the CLI and the Python API refuse before they touch anything."""
    import cyto
    from cyto.errors import ConfigError

    bad = tmp_path / "cachefile"
    bad.write_text("x")
    line = (
        f"CYTO_CACHE_DIR={bad} cannot be cyto's cache folder (a file, not a folder): "
        "point it at a folder you can write, or unset it"
    )
    before = _files(exported_dsvdd)
    proc = run_cyto(
        "export", str(exported_dsvdd), "--precision", "fp16", env={"CYTO_CACHE_DIR": str(bad)},
        process=True,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {line}"]
    assert _files(exported_dsvdd) == before
    proc = run_cyto("export", "--help", env={"CYTO_CACHE_DIR": str(bad)}, process=True)
    assert proc.returncode == 0 and "--precision" in proc.stdout  # help is no work
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CYTO_CACHE_DIR", str(bad))
        with pytest.raises(ConfigError) as err:
            cyto.export(exported_dsvdd, precisions="fp16", echo=None)
    assert str(err.value) == line
    assert _files(exported_dsvdd) == before


def test_a_default_cache_folder_that_cannot_be_written_is_said_once(tmp_path, monkeypatch):
    import cyto
    import cyto.cachedir

    home = tmp_path / "xdg"
    home.write_text("a file where the cache home would be")
    monkeypatch.delenv("CYTO_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.setattr(cyto.cachedir, "_SAID_CACHE", set())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first, second = cyto.cache_dir(), cyto.cache_dir()
    assert first == second and first.name.startswith("cyto-cache-")
    [line] = [str(w.message) for w in said]
    assert line.startswith(f"cyto's cache folder {home / 'cyto'} cannot be written")


@pytest.mark.parametrize("written", ["~/c", " {home}/c", "{home}/c \n", "~/c "])
def test_a_cache_folder_is_the_one_the_user_meant(tmp_path, monkeypatch, written):
    """CYTO_CACHE_DIR='~/c' (as .env files and systemd units write it) or with blanks around it
    made ./~/c or './ /abs/c' in the current folder with no word (hostile round 7, H43): ~ is
    the home, surrounding blanks are not the folder's, in cyto.cache_dir and doctor alike."""
    import cyto
    from cyto.doctor import OK, cache_check

    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CYTO_CACHE_DIR", written.format(home=home))
    assert cyto.cache_dir() == home / "c" and (home / "c").is_dir()
    check = cache_check()
    assert check.status == OK and check.detail == str(home / "c")
    assert list(here.iterdir()) == []  # nothing made where cyto was started


def test_a_home_that_cannot_be_found_is_one_line(tmp_path, monkeypatch):
    import cyto
    from cyto.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CYTO_CACHE_DIR", "~nosuchuser4711/c")
    with pytest.raises(ConfigError) as info:
        cyto.cache_dir()
    assert str(info.value) == (
        "CYTO_CACHE_DIR=~nosuchuser4711/c starts with a ~ that cannot be expanded here (no such "
        "user): give the folder's absolute path"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_temp_fallback_is_this_users_alone(tmp_path, monkeypatch):
    """Hostile round 41 (3): the fallback for a cache that cannot be written was made 0755, and
    another user's 0777 folder of its name was taken without a word (it holds compiled kernels,
    verification records and slides' cells). It is this user's alone: made 0700, an open one
    of this user's closed, one open to others (or not this user's) passed over for a fresh one."""
    import os
    import stat
    import tempfile

    import cyto.cachedir as cachedir
    from cyto.cachedir import private_temp

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    uid = os.getuid()

    def mode(path):
        return stat.S_IMODE(os.lstat(path).st_mode)

    def next_process():  # what a process chose is its own
        monkeypatch.setattr(cachedir, "_PRIVATE", {})

    next_process()
    fresh = private_temp("cyto-cache")
    assert fresh == tmp_path / f"cyto-cache-{uid}" and mode(fresh) == 0o700
    fresh.chmod(0o755)  # an earlier cyto's: this user's, closed now
    next_process()
    assert private_temp("cyto-cache") == fresh and mode(fresh) == 0o700
    planted = tmp_path / f"cyto-numba-{uid}"
    planted.mkdir()
    os.chmod(planted, 0o777 | stat.S_ISVTX)
    other = private_temp("cyto-numba")
    assert other == tmp_path / f"cyto-numba-{uid}-1" and mode(other) == 0o700
    # the same folder at every call, and in the next run (round 42, 1: a fresh random folder
    # at every call kept nothing and filled the temp dir)
    assert {private_temp("cyto-numba") for _ in range(5)} == {other}
    next_process()
    assert private_temp("cyto-numba") == other
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cyto-numba")) == [
        f"cyto-numba-{uid}",
        f"cyto-numba-{uid}-1",
    ]
    (tmp_path / f"cyto-x-{uid}").write_text("a file of that name")
    assert private_temp("cyto-x").is_dir()


@pytest.mark.parametrize("variable", ["CYTO_CACHE_DIR", "CYTO_REVIEW_REGISTRY"])
def test_every_folder_variable_is_read_alike(variable, tmp_path, monkeypatch):
    """Hostile round 41 (11, 13): CYTO_REVIEW_REGISTRY='~/x' made ./~/x where the review was
    started, and a relative CYTO_CACHE_DIR moved with the working folder. One reading
    (cyto.envvars.env_folder): blanks around it are not its, ~ is the home, and a relative path
    or a URL is refused in one line naming the variable."""
    from cyto.envvars import env_folder
    from cyto.errors import ConfigError
    from cyto.review.session import _registry_file

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    read = {"CYTO_CACHE_DIR": lambda: __import__("cyto").cache_dir(),
            "CYTO_REVIEW_REGISTRY": lambda: _registry_file("x").parent}[variable]  # fmt: skip
    monkeypatch.setenv(variable, " ~/kept \n")
    assert env_folder(variable) == home / "kept" and read() == home / "kept"
    for bad, words in (("relative/x", "is a relative path"), ("s3://b/c", "is a URL")):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(ConfigError) as info:
            read()
        assert str(info.value).startswith(f"{variable}={bad} {words}"), info.value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # nothing made here


def test_doctor_says_a_cache_folder_this_user_cannot_write_and_where_kernels_go(
    tmp_path, monkeypatch
):
    """Hostile round 41 (5): in a cache shared by two users, the second could not add compiled
    engines to the first one's openvino/ and numba moved to the temp dir without a word, while
    `cyto doctor` said "cache folder ok" and "numba ok". It says which folders this user cannot
    write, and where numba keeps its kernels."""
    import os

    import cyto.doctor as doctor

    cache = tmp_path / "shared"
    (cache / "openvino").mkdir(parents=True)
    (cache / "numba").mkdir()
    monkeypatch.setenv("CYTO_CACHE_DIR", str(cache))
    real = os.access
    # the other user's folder (root here writes anywhere: the check is stood in for)
    monkeypatch.setattr(
        doctor.os, "access", lambda p, mode: real(p, mode) and "openvino" not in str(p)
    )
    check = doctor.cache_check()
    assert check.status == doctor.INFO, check
    assert "this user cannot write its openvino/" in check.detail and "numba/" not in check.detail
    rows = {c.item: c.detail for c in doctor.runtime_checks("cpu")}
    assert "kernels kept in " in rows["numba"], rows


def test_the_fallback_is_said_by_the_command_not_raw_at_import(tmp_path):
    """Hostile round 41 (4): said while cyto was imported, before the command line's warning
    form was set up, the fallback printed as ``<frozen runpy>:112: CytoWarning: ...``, which a
    log filter on ``warning:`` misses."""
    home = tmp_path / "xdg"
    home.write_text("a file where the cache home would be")
    env = {"CYTO_CACHE_DIR": "", "XDG_CACHE_HOME": str(home), "NUMBA_CACHE_DIR": ""}
    proc = run_cyto("doctor", env=env, process=True)  # said in its cache row
    row = r"^  cache folder +info +cyto's cache folder .* cannot be written"
    assert re.search(row, proc.stdout, re.M), proc.stdout
    assert "CytoWarning" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("what", ["file", "broken link"])
def test_numba_kernels_moved_out_of_the_cache_are_said_with_why(tmp_path, what):
    """Hostile round 53, 6: with cyto's ``numba`` folder made a file, numba's kernels moved to a
    folder in the temp dir without a word (cyto doctor said only where they were). The first
    kernel used says what could not be written and where the kernels went, and doctor's numba
    row gives the same reason."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if what == "file":
        (cache / "numba").write_text("not a folder")
        why = "a file, not a folder"
    else:  # it read "File exists" (hostile round 54, 6)
        (cache / "numba").symlink_to(tmp_path / "gone")
        why = f"a broken link to {tmp_path / 'gone'}"
    temp = tmp_path / "temp"  # the fallback folder, kept out of the machine's temp dir
    temp.mkdir()
    env = {"CYTO_CACHE_DIR": str(cache), "TMPDIR": str(temp)}
    code = "import cyto.runtime.heads"
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}, **env},
    )
    assert proc.returncode == 0, proc.stderr
    moved = [line for line in proc.stderr.splitlines() if "cannot be written" in line]
    assert len(moved) == 1, proc.stderr
    assert f"{cache / 'numba'} cannot be written ({why})" in moved[0]
    assert f"kept in {temp}/cyto-numba-" in moved[0], moved
    proc = run_cyto("doctor", env=env, unset=("NUMBA_CACHE_DIR",))
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("numba "))
    assert f"({cache / 'numba'} cannot be written ({why}))" in row, row
    # there, in the row alone (it was said twice, as a warning too: hostile round 54, 11)
    assert (proc.stdout + proc.stderr).count("cannot be written") == 1, proc.stderr
