"""One table, one ranking: `cyto predict` and `cyto eval scores` break ties the same way and say
when ties decide the top K (hostile round 12, N6: Recall@5 1.000 and 0.000 of one table)."""

from __future__ import annotations

import re

from PIL import Image

from tests.cli_runner import run_cyto


def test_predict_and_eval_agree_on_a_table_of_equal_scores(exported_dsvdd, tmp_path):
    data = tmp_path / "cells"
    for cls in ("normal", "bad"):
        (data / cls).mkdir(parents=True)
        for i in range(5):  # the same image in both classes: equal scores
            Image.new("RGB", (96, 96), (200, 120, 160)).save(data / cls / f"{i}.png")
    out = tmp_path / "p.parquet"
    pred = run_cyto("predict", str(exported_dsvdd), "--data", str(data), "--normal", "normal",
                    "--out", str(out))  # fmt: skip
    assert pred.returncode == 0, pred.stderr
    recall = float(re.search(r"Recall@5 ([0-9.]+) \(K = the 5 abnormal cells\)", pred.stdout)[1])
    assert "note: 10 cells share the score at rank 5" in pred.stdout
    ev = run_cyto("eval", "scores", str(out), "--k", "5")
    assert ev.returncode == 0, ev.stderr
    assert "note: 10 cells share the score at rank 5" in ev.stdout + ev.stderr
    row = next(line for line in ev.stdout.splitlines() if line.split()[:1] == ["5"])
    assert float(row.split()[2]) == recall == 0.0
