"""numba's kept kernels are loaded only from files their record vouches for (issue 68, class 1:
a flipped byte in a kept ``.nbi`` stopped ``cyto score`` with a raw UnicodeDecodeError from
numba's unpickling; flipped machine code could load and score otherwise)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyto.errors import CytoWarning
from cyto.runtime import kernels
from tests.damage import KINDS, damaged

FILES = {
    "heads_abc/dsvdd.dsvdd_scores-19.py312.nbi": bytes(range(200)),
    "heads_abc/dsvdd.dsvdd_scores-19.py312.1.nbc": bytes(range(256)) * 4,
    "heads_abc/knn.knn_scores-20.py312.nbi": b"index" * 30,
}


def _write(folder):
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _guard(folder):
    kernels._guarded.discard(folder)  # a new process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        changed = kernels.guard(folder)
    return changed, [str(w.message) for w in caught if issubclass(w.category, CytoWarning)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    victim=st.sampled_from(sorted(FILES)),
    damage=st.sampled_from(KINDS),
    where=st.floats(0, 1, exclude_max=True),
)
def test_a_damaged_kept_kernel_is_removed_and_said_and_the_others_kept(
    tmp_path_factory, victim, damage, where
):
    folder = tmp_path_factory.mktemp("numba")
    _write(folder)
    kernels.record(folder)
    path = folder / victim
    path.write_bytes(damaged(path.read_bytes(), damage, where))
    changed, said = _guard(folder)
    assert changed == [victim] and not path.exists()
    assert len(said) == 1 and victim in said[0] and "compiled anew" in said[0]
    for name in set(FILES) - {victim}:
        assert (folder / name).read_bytes() == FILES[name]  # the sound ones still load


def test_files_no_process_recorded_are_removed_quietly_and_a_recorded_folder_kept(tmp_path):
    """A damaged record is said (hostile round 71, 2: every kernel it vouched for was compiled
    anew without a word, where one damaged kernel file was said)."""
    _write(tmp_path)
    assert _guard(tmp_path) == ([], [])  # written by a process that never got to record them
    assert not any((tmp_path / name).exists() for name in FILES)
    _write(tmp_path)
    kernels.record(tmp_path)
    assert _guard(tmp_path) == ([], [])
    assert all((tmp_path / name).read_bytes() == data for name, data in FILES.items())
    record = json.loads((tmp_path / kernels.RECORD).read_text())
    assert sorted(record["files"]) == sorted(FILES)
    (tmp_path / kernels.RECORD).write_text("{not json")  # a record that does not read back
    changed, said = _guard(tmp_path)
    assert changed == [] and not any((tmp_path / name).exists() for name in FILES)
    assert len(said) == 1 and said[0].startswith(
        f"the record of numba's kept kernels {tmp_path / kernels.RECORD} is not as cyto wrote it"
    ), said
    assert said[0].endswith("compiled anew")


SCORE = """
import numpy as np
from cyto.runtime.heads.dsvdd import dsvdd_scores
from cyto.runtime import kernels
rng = np.random.default_rng(0)
emb = rng.normal(size=(2, 1, 64, 16)).astype(np.float32)
centres = rng.normal(size=(2, 16)).astype(np.float32)
print(repr(dsvdd_scores(emb, centres, 0.5).sum()))
kernels.record()
"""


def _scoring(tmp_path):
    """A fresh process scoring with the kept kernels under ``tmp_path/numba`` (then recording
    them), as a call: its completed process."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONWARNINGS": "always"}
    return lambda: subprocess.run(
        [sys.executable, "-c", SCORE], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """One process's kept kernels, compiled and recorded, and what it printed: each test
    damages a copy (numba's index is keyed on the source file, not the folder)."""
    folder = tmp_path_factory.mktemp("compiled")
    first = _scoring(folder)()
    assert first.returncode == 0, first.stderr
    return folder / "numba", first


def _kept_copy(compiled, tmp_path):
    """``compiled``'s kernels copied under ``tmp_path/numba``; the first run's output."""
    folder, first = compiled
    shutil.copytree(folder, tmp_path / "numba")
    return first


@pytest.mark.parametrize("suffix", [".nbi", ".nbc"])
def test_a_run_after_numba_kernels_are_damaged_scores_the_same_and_says_why(
    compiled, tmp_path, suffix
):
    run = _scoring(tmp_path)
    first = _kept_copy(compiled, tmp_path)
    kept = sorted((tmp_path / "numba").rglob(f"dsvdd.dsvdd_scores*{suffix}"))
    assert kept, "numba kept no kernel to damage"
    data = bytearray(kept[0].read_bytes())
    for at in range(len(data) // 3, len(data) // 3 + 64):
        data[at] ^= 0x5A
    kept[0].write_bytes(bytes(data))
    second = run()
    assert second.returncode == 0, second.stderr  # before: a raw UnicodeDecodeError
    assert second.stdout == first.stdout
    assert "did not match its record" in second.stderr and "compiled anew" in second.stderr
    third = run()  # compiled anew and recorded: nothing more to say
    assert third.returncode == 0 and third.stdout == first.stdout
    assert "did not match its record" not in third.stderr


@pytest.mark.parametrize("suffix", [".nbi", ".nbc"])
def test_damaged_kernels_whose_record_was_forged_to_match_still_score_the_same(
    compiled, tmp_path, suffix
):
    """A hostile check (round 3): machine code damaged and its sha256 and size written into
    cyto-kernels.json passed the guard, and numba's load ended cyto score and doctor in an
    80-line LLVM bitcode traceback. A kept kernel that does not load is removed and compiled
    anew, said in one line."""
    import hashlib

    run = _scoring(tmp_path)
    first = _kept_copy(compiled, tmp_path)
    folder = tmp_path / "numba"
    (kept,) = sorted(folder.rglob(f"dsvdd.dsvdd_scores*{suffix}"))
    data = bytearray(kept.read_bytes())
    # inside the LLVM bitcode numba keeps (after its magic), where a flip stops the load
    start = max(data.find(b"BC\xc0\xde"), 0) + 256 if suffix == ".nbc" else len(data) // 3
    for at in range(start, min(start + 64, len(data))):
        data[at] ^= 0x5A
    kept.write_bytes(bytes(data))
    record = json.loads((folder / kernels.RECORD).read_text())
    name = kept.relative_to(folder).as_posix()
    record["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (folder / kernels.RECORD).write_text(json.dumps(record))
    second = run()
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr
    assert second.stdout == first.stdout
    said = [ln for ln in second.stderr.splitlines() if "compiled anew" in ln]
    if suffix == ".nbc":  # a damaged index numba reads as a miss itself, and compiles anew
        assert len(said) == 1 and "did not load" in said[0], second.stderr


def test_a_folder_under_a_kernel_files_name_is_removed_and_said(tmp_path):
    """A hostile check (round 4): a kept index replaced by a folder ended cyto predict and
    doctor in a raw IsADirectoryError traceback from numba."""
    _write(tmp_path)
    kernels.record(tmp_path)
    odd = tmp_path / "heads_abc/dsvdd.dsvdd_scores-19.py312.nbi"
    odd.unlink()
    (odd / "inside").mkdir(parents=True)
    changed, said = _guard(tmp_path)
    assert not odd.exists() and changed == ["heads_abc/dsvdd.dsvdd_scores-19.py312.nbi"]
    assert len(said) == 1 and "compiled anew" in said[0]


def test_a_kernel_that_could_not_be_kept_is_said_so_not_as_one_that_did_not_load(monkeypatch):
    """Hostile round 47, 8: with cyto's cache on a full disk, the line said a kept kernel "did
    not load ... removed and compiled anew", where none was ever kept: numba could not write it."""
    import errno
    import warnings

    calls = []

    class Dispatcher:
        def py_func(self):
            """doc"""

        def __call__(self, *args):
            calls.append(args)
            if len(calls) == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return 7

    monkeypatch.setattr(kernels, "_forget_kept", lambda d: ["softmax.softmax_abnormal-17.nbi"])
    kernel = kernels.KeptKernel(Dispatcher())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernel(1) == 7
    [said] = [str(w.message) for w in caught]
    assert said == (
        "numba kernel softmax.softmax_abnormal-17.nbi could not be kept in cyto's cache (the "
        "disk is full): compiled for this run only"
    ), said


def test_a_first_run_on_a_cache_that_takes_nothing_compiles_for_itself(monkeypatch):
    """Hostile round 48: a first run whose cache disk was full stopped at the kernel (nothing
    was kept to remove): the kernel is compiled for that run alone, and said."""
    import errno
    import warnings

    def add_one(x):
        return x + 1

    class Dispatcher:
        py_func = staticmethod(add_one)
        targetoptions = {"cache": True}

        def __call__(self, *args):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kernels, "_forget_kept", lambda d: [])
    kernel = kernels.KeptKernel(Dispatcher())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernel(1) == 2
        assert kernel(2) == 3  # the run's own kernel from then on, said once
    said = [str(w.message) for w in caught]
    assert said == [
        "numba kernel add_one could not be kept in cyto's cache (the disk is full): compiled "
        "for this run only"
    ], said
