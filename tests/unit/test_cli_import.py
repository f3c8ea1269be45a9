"""`cyto --help` must not import the heavy libraries (STYLE habit 6)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["torch", "onnxruntime", "pyvips", "numba", "openslide", "albumentations", "sklearn"]

PROBE = """
import json, sys
sys.argv = {argv!r}
from cyto import cli
try:
    cli.main()
except SystemExit:
    pass
print("@@" + json.dumps([m for m in {heavy!r} if m in sys.modules]))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["cyto", "--help"],
        ["cyto", "synth", "--help"],
        ["cyto", "data", "--help"],
        ["cyto", "--version"],
    ],
)
def test_help_does_not_import_heavy_libraries(argv):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert marker, proc.stdout
    assert json.loads(marker[-1][2:]) == []
    assert "cyto" in proc.stdout


def test_console_script_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "cyto", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    assert proc.stdout.strip().startswith("cyto ")
