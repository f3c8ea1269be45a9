"""The example scripts of examples/ run as a user runs them, each in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_examples_run_on_synthetic_data(tmp_path):
    """score_cells.py trains its own tiny model; score_slide.py scores with it (``--model``)."""
    cells = _run("score_cells.py", "--out", str(tmp_path / "cells"), cwd=tmp_path)
    assert "verification passed" in cells
    assert "58 cells scored into" in cells and "AUROC" in cells  # 40 normal + 6 x 3 abnormal
    assert (tmp_path / "cells" / "scores.parquet").is_file()
    bundle = tmp_path / "cells" / "dsvdd.cyto"
    slide = _run("score_slide.py", "--out", str(tmp_path / "slide"), "--model", str(bundle),
                 cwd=tmp_path)  # fmt: skip
    assert "the ten most abnormal-looking cells" in slide
    assert slide.count("  rank ") == 10
    assert (tmp_path / "slide" / "scored" / "scores.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells", "slide"]  # nothing elsewhere
