"""Score a whole slide with cyto's Python API and look at its top cells.

Draws a small synthetic slide with planted abnormal cells (and its ground truth), trains a tiny
Deep SVDD model on synthetic cell patches unless ``--model`` names a bundle, scores every cell of
the slide (``cyto.score_slide``, which returns the score table as a pyarrow Table) and prints the
top of the ranking beside the planted cells. Runs in about a minute on two CPU cores:

    python examples/score_slide.py --out /tmp/cyto-slide
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

import cyto
from cyto.data.synth.cells import DEFAULT_SCALE, MPP_AT_SCALE_1
from cyto.data.synth.patches import PatchSynthConfig, write_patches

PATCH = 96  # px: the training patches and the crops cut around each nucleus of the slide
# a model small enough to train in seconds (the fast preset, made smaller still)
TINY = {
    "input_size": 32,
    "load_size": None,
    "ae_epochs": 1,
    "epochs": 2,
    "n_seeds": 1,
    "embedding_dim": 16,
    "batch_size": 32,
    "tta_views": ("orig",),
    "mpp": round(MPP_AT_SCALE_1 / DEFAULT_SCALE, 4),  # the synthetic patches' resolution
}


def tiny_model(out: Path) -> Path:
    """Train and export a tiny Deep SVDD model on synthetic normal cells."""
    cells = out / "cells"
    write_patches(cells, PatchSynthConfig(n_normal=40, n_abnormal=0, size=PATCH), overwrite=True)
    res = cyto.train(
        "dsvdd", cells, out / "dsvdd.cyto", normal="normal", preset="fast", overrides=TINY,
        device="cpu", overwrite=True,
    )  # fmt: skip
    cyto.export(res.bundle, echo=None)
    return res.bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for everything made (default: a temp)")
    parser.add_argument("--model", type=Path, help="a bundle to score with (default: train one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="cyto-slide-"))
    out.mkdir(parents=True, exist_ok=True)

    slide = cyto.synth_slide(out / "slide.tif", width=1024, height=1024, abnormal_fraction=0.05,
                             seed=2, overwrite=True, workers=0, echo=None)  # fmt: skip
    print(
        f"drew {slide['slide']}: {slide['n_cells']} cells, {slide['n_abnormal']} planted abnormal"
    )
    if args.model is None:
        print("training a tiny model (seconds of training: expect little of its ranking)")
    model = args.model or tiny_model(out)

    scored = out / "scored"
    shutil.rmtree(scored, ignore_errors=True)  # a rerun into the same --out scores anew
    table = cyto.score_slide(
        slide["slide"], model, scored, device="cpu", workers=0, patch_size=PATCH, top_k=20,
        mosaic=0, truth=slide["truth"], echo=None,
    )  # fmt: skip
    print(f"scored {table.num_rows} cells into {scored / 'scores.parquet'}")

    truth = pq.read_table(slide["truth"]).to_pylist()
    planted = [(r["x"], r["y"]) for r in truth if r["label"] == 1]

    def near_planted(x: float, y: float) -> bool:
        return any((x - px) ** 2 + (y - py) ** 2 <= 20**2 for px, py in planted)

    # the paper's metrics of the table against the truth it was scored with; the rank follows
    # the column of the ranking the run used (rank_by: the model's score, the morphometric
    # score or their fusion), which evaluate names as the column it judged
    judged = cyto.evaluate(scored, k=[20, 100], echo=None)["overall"]
    ranked_by = judged[0]["score_column"]
    print(f"the ten most abnormal-looking cells (ranked by {ranked_by}):")
    for row in table.sort_by("rank").slice(0, 10).to_pylist():
        mark = "planted abnormal" if near_planted(row["x"], row["y"]) else ""
        print(f"  rank {row['rank']:3d}  x {row['x']:6.0f}  y {row['y']:6.0f}  "
              f"{ranked_by} {row[ranked_by]:9.4f}  {mark}")  # fmt: skip
    for row in judged:
        print(f"  Recall@{row['k']} {row['recall_at_k']:.3f}, AUROC {row['auroc']:.3f}")


if __name__ == "__main__":
    main()
