"""`make test`'s leftover check counts what the suite left, not what another cyto process of the
same user wrote meanwhile (issue 68, class 7): the suite runs with a scratch folder of its own as
cyto's cache, the user cache home and Ray's temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _make_test(tmp_path: Path, pytest_body: str) -> subprocess.CompletedProcess:
    """`make test` with a stand-in for the venv's python whose `-m pytest` runs ``pytest_body``
    (bash); the set-up targets are taken as done."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (tmp_path / "pyproject.toml").touch()
    os.utime(tmp_path / "pyproject.toml", (1, 1))
    (venv / ".installed-test").touch()
    fake = venv / "bin" / "python"
    fake.write_text(f"#!/bin/bash\n{pytest_body}\nexit 0\n")
    fake.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CYTO_CACHE_DIR", "XDG_CACHE_HOME", "RAY_TMPDIR", "MAKEFLAGS", "MAKELEVEL")
    }
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path))
    deps = ("system-deps", "browser-deps", "server-deps")
    return subprocess.run(
        ["make", "-s", "-f", str(MAKEFILE), *(f"-o{d}" for d in deps), "VENV=venv", "test"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_another_cyto_process_writing_the_users_cache_is_not_a_leftover(tmp_path):
    other = 'mkdir -p "$HOME/.cache/cyto/verified" && touch "$HOME/.cache/cyto/verified/x.json"'
    proc = _make_test(tmp_path, other)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "home/.cache/cyto/verified/x.json").is_file()  # left alone
    assert not list(tmp_path.glob("cyto-make-test-*"))  # the scratch folder is removed


@pytest.mark.parametrize("where", ["$CYTO_CACHE_DIR", "$XDG_CACHE_HOME/cyto"])
def test_what_the_suite_leaves_in_its_own_cache_still_fails_it(tmp_path, where):
    proc = _make_test(tmp_path, f'mkdir -p "{where}" && touch "{where}/left.bin"')
    assert proc.returncode != 0
    assert "left files behind" in proc.stdout and "left.bin" in proc.stdout
