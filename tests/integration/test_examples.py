"""The example scripts of examples/: each runs as a user runs it, in a subprocess (with the
session's small exported bundle as ``--model``), and the tiny model a script trains without
``--model`` is trained here (in this process, where torch is loaded once per test session)."""

from __future__ import annotations

import importlib.util
import os
import re
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


def _example(script: str):
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_run_as_scripts(exported_dsvdd, tmp_path):
    cells = _run(
        "score_cells.py", "--out", str(tmp_path / "cells"), "--model", str(exported_dsvdd),
        cwd=tmp_path,
    )  # fmt: skip
    assert re.search(r"loaded .*d\.cyto: \w+ on cpu", cells), cells[:2000]
    assert "58 cells scored into" in cells and "AUROC" in cells  # 40 normal + 6 x 3 abnormal
    assert cells.count("  rank ") == 5
    # in memory and in the table, one ranking (hostile round 64, 4: the example resized its
    # patches otherwise than cyto predict, and the graph resized what it was given otherwise)
    lines = cells.splitlines()
    at = lines.index("the five most abnormal-looking cells (in memory):")
    in_memory = [ln.split("/")[-1] for ln in lines[at + 1 : at + 6]]
    in_table = [ln.split()[-1] for ln in lines if ln.startswith("  rank ")]
    assert in_memory == in_table, cells
    assert (tmp_path / "cells" / "scores.parquet").is_file()
    slide = _run(
        "score_slide.py", "--out", str(tmp_path / "slide"), "--model", str(exported_dsvdd),
        cwd=tmp_path,
    )  # fmt: skip
    assert "the ten most abnormal-looking cells" in slide
    assert slide.count("  rank ") == 10
    # the paper's metrics against the planted cells (cyto.evaluate), at K = 20 and the pool
    assert re.search(r"  Recall@20 [0-9.]+, AUROC [0-9.]+", slide), slide[-2000:]
    assert (tmp_path / "slide" / "scored" / "scores.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells", "slide"]  # nothing elsewhere


def test_the_tiny_model_of_an_example_trains_exports_and_verifies(tmp_path):
    """score_cells.py's model, as the script trains it without ``--model`` (score_slide.py's is
    the same recipe on its own cells; one is trained here, to keep the test run short)."""
    import cyto
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    cells = tmp_path / "cells"
    write_patches(cells, PatchSynthConfig(n_normal=40, n_abnormal=3, size=48, seed=1))
    bundle = _example("score_cells.py").tiny_model(cells, tmp_path / "dsvdd.cyto")
    scorer = cyto.load_model(bundle, device="cpu")
    assert scorer.verification.status == "passed"
    assert scorer.graph_file is not None  # exported: the graph scores, not the PyTorch network
