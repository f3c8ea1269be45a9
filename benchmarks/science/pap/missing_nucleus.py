"""What a cell whose nucleus the Pap mask does not find should score: 0 (the normals' side, as
``Morphometric.score`` gives it), the measured cells' median or mean, or the top. On the
development folds of ``pap_ranking.py``: how many crops of each class have no measured nucleus,
and the AUROC (NILM against the lesions) under each choice (hostile round 25 found a planted
ASC-US with a large pale nucleus ranked near the bottom, its score 0).

    PYTHONPATH=../../../src python missing_nucleus.py --data ../../../../shared/data/cric
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pap_ranking as pr
from sklearn.metrics import roc_auc_score

from cyto.data.dataset import PatchDataset
from cyto.data.morphometry import Morphometric
from cyto.detect.morphometry import measure_stain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--mpp", type=float, default=pr.MPP)
    args = ap.parse_args()
    ds = PatchDataset.from_path(args.data, normal="NILM", size=100)
    dev, _ = pr.blocks(ds, 0.25, ("NILM", "ASC-US", "LSIL"))
    a, b = pr.halves(ds, dev)
    images, labels, classes = np.asarray(ds.images), np.asarray(ds.labels), np.array(ds.classes)
    for fold, (tr, te) in {"A": (a, b), "B": (b, a)}.items():
        normals = tr[labels[tr] == 0]
        fit = Morphometric.fit(measure_stain(images[normals], args.mpp, "pap"), "pap")
        measured = measure_stain(images[te], args.mpp, "pap")
        s, y = fit.score(measured), labels[te]
        miss = ~np.isfinite(measured["nucleus_area_um2"])
        by_class = {str(c): int(miss[classes[te] == c].sum()) for c in sorted(set(classes[te]))}
        print(f"fold {fold}: no nucleus measured in {by_class} (of {len(te)} crops)")
        for name, value in (
            ("0 (the normals' side)", None),
            ("the measured cells' median", np.median(s[~miss])),
            ("the measured cells' mean", np.mean(s[~miss])),
            ("the top", np.inf),
        ):
            t = s.copy()
            if value is not None:
                t[miss] = min(value, 1e9)
            print(f"  {name:28s} AUROC {roc_auc_score(y, t):.4f}")


if __name__ == "__main__":
    main()
