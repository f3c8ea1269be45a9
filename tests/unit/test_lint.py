"""House style: ruff lint and format are clean (pyproject.toml holds the configuration)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it comes with the 'test' extra)")
    return [exe]


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args):
    proc = subprocess.run(
        [*_ruff(), *args, "src", "tests", "benchmarks", "docs", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
