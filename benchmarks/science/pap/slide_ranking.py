"""How a whole slide composed of real Pap cells ranks its planted lesions, end to end (``cyto
train``, ``cyto synth slide --cells``, ``cyto score``): the share of planted cells among a
slide's top 50 and top 100 cells and its top 5 %, under the morphometric score as scored and
under the nucleus's share alone (the score before the contour discount of stop 83, recomputed
from the bundle's record and the table's columns).

``--stage dev``: per development fold (A trains on the earlier half of each class, B the other
way round, as ``pap_ranking.py``), a Pap bundle of the training half (its held-back cells choose
the ranking) and slides of the other half's crops. ``--stage final``: a bundle of every
development crop and slides of the final block's crops (the latest 25 % of NILM, ASC-US, LSIL).
Per seed, one 3,072 px slide at 0.258 um/px, the lesions planted at ``--rate`` of its cells. A
detection within 10 um of a planted crop's centre is that cell (a NILM crop's annotated point is
often off its nucleus); detections near no planted centre (a crop's other nuclei, debris) count
as normal. The model is the fast preset cut to a minute (its ranking is not what this measures).

    python benchmarks/science/pap/slide_ranking.py --data ../shared/data/cric --stage dev \\
        --out /tmp/pap-slides > benchmarks/results/epyc-2core/pap/slides/slide_ranking_dev.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pap_ranking import MPP, blocks, halves  # noqa: E402

from cyto.data.dataset import PatchDataset  # noqa: E402

CLASSES = ("NILM", "ASC-US", "LSIL")
QUICK = ("load_size=64", "input_size=32", "epochs=1", "ae_epochs=0", "n_seeds=1", "tta_views=orig")


def _columns(path: Path) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    return {n: np.asarray(t[n].to_pylist()) for n in t.schema.names}


def _link(dest: Path, ds: PatchDataset, idx) -> None:
    cl = np.array(ds.classes)
    for i in idx:
        (dest / cl[i]).mkdir(parents=True, exist_ok=True)
        os.symlink(ds.records[i].path.resolve(), dest / cl[i] / ds.records[i].path.name)


def _run(*args: str) -> None:
    cyto = Path(sys.executable).with_name("cyto")
    proc = subprocess.run([str(cyto), *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"cyto {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


def measure(table: dict, truth: dict, bundle: Path) -> dict:
    """One slide's figures under the scored morphometric column and the share alone."""
    from scipy.spatial import cKDTree
    from sklearn.metrics import roc_auc_score

    from cyto.bundle import load_bundle
    from cyto.data.morphometry import Morphometric

    d, j = cKDTree(np.column_stack([truth["x"], truth["y"]])).query(
        np.column_stack([table["x"], table["y"]])
    )
    near = d < 10 / MPP
    planted = near & (truth["label"][j] == 1)
    which = np.where(planted, j, -1)
    n_planted = int(truth["label"].sum())
    morph = Morphometric.of_spec(load_bundle(bundle, weights=False).spec)
    measures = {f.name: table[f.name].astype(float) for f in morph.features}
    scores = {
        "scored": table["morphometry_score"].astype(float),
        "share alone": Morphometric(morph.stain, morph.features[:1]).score(measures),
    }
    n = len(table["x"])
    out = {"cells": n, "planted": n_planted, "discount": len(morph.features) > 1}
    for name, s in scores.items():
        order = np.argsort(-s, kind="stable")
        for label, k in (("top 50", 50), ("top 100", 100), ("top 5%", int(round(0.05 * n)))):
            hit = set(which[order[:k]][planted[order[:k]]].tolist())
            out[f"{name}: {label}"] = len(hit) / n_planted
        out[f"{name}: AUROC"] = float(roc_auc_score(planted, s))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--stage", choices=("dev", "final"), default="dev")
    ap.add_argument("--out", type=Path, required=True, help="a folder for bundles and slides")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rate", type=float, default=0.05, help="planted share of a slide's cells")
    args = ap.parse_args()
    ds = PatchDataset.from_path(args.data, normal="NILM", size=100)
    dev, final = blocks(ds, 0.25, CLASSES)
    cl = np.array(ds.classes)
    if args.stage == "dev":
        a, b = halves(ds, dev)
        runs = {"A": (a, b), "B": (b, a)}
    else:
        runs = {"final": (dev, final)}
    rows = []
    for name, (train, test) in runs.items():
        root = args.out / args.stage / name
        if root.exists():  # never a slide of an earlier run's crops
            shutil.rmtree(root)
        _link(root / "train", ds, train)
        _link(root / "test", ds, [i for i in test if cl[i] in CLASSES])
        bundle = root / "pap.cyto"
        quick = [x for kv in QUICK for x in ("--set", kv)]
        _run("train", "dsvdd", "--data", str(root / "train"), "--normal", "NILM", "--out",
             str(bundle), "--preset", "fast", "--set", "stain=pap", "--set", f"mpp={MPP}",
             *quick)  # fmt: skip
        for seed in map(int, args.seeds.split(",")):
            slide = root / f"s{seed}.tif"
            _run("synth", "slide", str(slide), "--cells", str(root / "test"), "--normal", "NILM",
                 "--abnormal-fraction", str(args.rate), "--mpp", str(MPP), "--width", "3072",
                 "--height", "3072", "--seed", str(seed))  # fmt: skip
            truth = slide.with_name(f"s{seed}.cells.parquet")
            _run("score", str(slide), "--model", str(bundle), "--out", str(root / "scored"),
                 "--workers", "0", "--mosaic", "0")  # fmt: skip
            row = measure(
                _columns(root / "scored" / f"s{seed}" / "scores.parquet"), _columns(truth), bundle
            )
            rows.append(row)
            print(json.dumps({"run": name, "seed": seed, **row}), flush=True)
    keys = [k for k in rows[0] if ":" in k]
    print(f"\nmean +- sd (sample) over {len(rows)} slides ({', '.join(runs)}; seeds {args.seeds})")
    for k in keys:
        v = np.array([r[k] for r in rows])
        print(f"{k:22s} {v.mean():.3f} +- {v.std(ddof=1) if len(v) > 1 else 0:.3f}")


if __name__ == "__main__":
    main()
