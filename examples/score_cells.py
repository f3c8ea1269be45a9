"""Score a folder of cell patches with cyto's Python API.

Draws a small synthetic dataset (normal lymphocyte-like cells and a few abnormal ones), trains a
tiny Deep SVDD model on it unless ``--model`` names a bundle, exports it, loads it verified on
this machine (``cyto.load_model``) and scores the patches two ways: in memory with
``scorer.score`` and into a Parquet table with ``cyto.predict``. Runs in well under a minute on
two CPU cores:

    python examples/score_cells.py --out /tmp/cyto-cells
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

import cyto
from cyto.data.synth.patches import PatchSynthConfig, write_patches

# a model small enough to train in seconds (the fast preset, made smaller still); real data
# wants the method's defaults or its fast preset as it is
TINY = {
    "input_size": 32,
    "load_size": None,
    "ae_epochs": 1,
    "epochs": 2,
    "n_seeds": 1,
    "embedding_dim": 16,
    "batch_size": 32,
    "tta_views": ("orig",),
}


def tiny_model(cells: Path, out: Path) -> Path:
    """Train and export a tiny Deep SVDD model on the normal cells of ``cells``."""
    res = cyto.train(
        "dsvdd", cells, out, normal="normal", preset="fast", overrides=TINY, device="cpu"
    )
    cyto.export(res.bundle, echo=None)
    return res.bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for everything made (default: a temp)")
    parser.add_argument("--model", type=Path, help="a bundle to score with (default: train one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="cyto-cells-"))
    out.mkdir(parents=True, exist_ok=True)

    cells = out / "cells"
    counts = write_patches(
        cells, PatchSynthConfig(n_normal=40, n_abnormal=3, size=48, seed=1), overwrite=True
    )
    print(f"drew {sum(counts.values())} cells into {cells}: {counts}")
    if args.model is None:
        print("training a tiny model (seconds of training: expect little of its ranking)")
    model = args.model or tiny_model(cells, out / "dsvdd.cyto")

    # in memory: uint8 RGB (N, H, W, 3) patches -> one score each; patches of another side
    # than the model's crop size are resized as cyto predict resizes its files (an area
    # filter), so each scores as in the table below
    scorer = cyto.load_model(model, device="cpu")
    print(f"loaded {model}: {scorer.describe()}, verification {scorer.verification.status}")
    files = sorted(cells.rglob("*.jpg"))
    patches = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])
    scores = scorer.score(patches)
    print("the five most abnormal-looking cells (in memory):")
    for i in np.argsort(-scores)[:5]:
        print(f"  {scores[i]:10.4f}  {files[i].relative_to(cells)}")

    # into a table: cyto predict's library call, with AUROC as the classes are known
    summary = cyto.predict(
        model, cells, out / "scores.parquet", normal="normal", device="cpu", overwrite=True
    )
    table = pq.read_table(summary["out"]).sort_by("rank")
    print(f"{summary['n']} cells scored into {summary['out']}, AUROC {summary['auroc']:.3f}")
    for row in table.slice(0, 5).to_pylist():
        print(f"  rank {row['rank']:3d}  {row['class']:>15}  {Path(row['path']).name}")


if __name__ == "__main__":
    main()
