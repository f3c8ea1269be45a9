"""The main process gives back what its threads' malloc arenas hold free (cyto.infer.memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAGMENT = r"""
import threading
from cyto.infer.memory import proc_status_mb, trim_malloc

held = []
def make():  # what the worker pool's thread does: unpickle crops into its own arena
    blocks = [bytearray(4096) for _ in range(60000)]
    held.append(blocks[::64])  # a few stay alive, so the arena cannot shrink from its top
threading.Thread(target=make).start()
while not held:
    pass
before = proc_status_mb("VmRSS")
trimmed = trim_malloc()
print(trimmed, before, proc_status_mb("VmRSS"))
"""


def test_trim_gives_back_a_threads_fragmented_arena():
    ok = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libc.so.6').malloc_trim"],
        capture_output=True,
    )
    if ok.returncode != 0:
        pytest.skip("not glibc: no malloc_trim, trim_malloc does nothing")
    proc = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    trimmed, before, after = proc.stdout.split()
    assert trimmed == "True"
    assert float(before) - float(after) > 150, (before, after)  # of ~240 MB freed in fragments
