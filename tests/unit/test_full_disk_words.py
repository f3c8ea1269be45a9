"""A full disk whose error names no file (a write on an open file) is said with the place that
is full among the command's paths and cyto's cache (hostile round 47, 5: export, calibrate,
data cells, synth slide and review said only "the disk is full")."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cyto.errors import PLACES, system_words


@pytest.fixture
def full(monkeypatch):
    """Make the file systems of the folders given full (0 bytes free), the others roomy."""
    full_devs: set[int] = set()
    real = os.statvfs

    class Vfs:
        def __init__(self, free_blocks):
            self.f_bavail, self.f_frsize = free_blocks, 4096

    def statvfs(path):
        real(path)  # a missing path still fails as it would
        return Vfs(0 if os.stat(path).st_dev in full_devs else 1 << 20)

    monkeypatch.setattr(os, "statvfs", statvfs)
    return lambda folder: full_devs.add(os.stat(folder).st_dev)


def test_the_full_place_among_the_commands_paths_is_named(full, tmp_path):
    out = tmp_path / "not-yet" / "m.cyto"  # named by its nearest folder that exists
    full(tmp_path)
    token = PLACES.set((str(out),))
    try:
        words = system_words(OSError(errno.ENOSPC, "No space left on device"))
    finally:
        PLACES.reset(token)
    assert words == f"the disk is full ({out}: 0 kB free)", words


def test_a_file_named_by_the_error_is_said_as_before_and_room_everywhere_says_no_place(
    full, tmp_path
):
    named = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f"))
    assert system_words(named) == f"{tmp_path / 'f'}: the disk is full"
    token = PLACES.set((str(tmp_path),))  # nothing is full: no place is guessed
    try:
        assert system_words(OSError(errno.ENOSPC, "No space")) == "the disk is full"
    finally:
        PLACES.reset(token)


def test_the_cli_names_the_full_disk_of_a_command_that_met_one(full, tmp_path, monkeypatch):
    """`cyto synth slide` onto a full disk: the write of a spool file names no file."""
    import cyto.data.synth.slide as slide_mod
    from tests.cli_runner import run_cyto

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(slide_mod, "write_slide", no_room)
    out = tmp_path / "disk" / "s.tif"
    out.parent.mkdir()
    full(out.parent)
    proc = run_cyto("synth", "slide", str(out), "--width", "1024", "--height", "1024")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: the disk is full ({out}: 0 kB free)", proc.stderr
    assert Path(out).parent.is_dir()
