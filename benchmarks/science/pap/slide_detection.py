"""Nuclei found on whole slides composed of real Pap cells (``cyto synth slide --cells``), per
class, for two background openings of the Pap detection (16 um, before stop 79, and 20 um).

Per seed, 400 NILM, 50 ASC-US and 50 LSIL crops are drawn from CRIC's development blocks (never
the final block), composed into a 3,072 px slide at 0.258 um/px with the lesions at 10 %, and
detected with the slide's threshold. A planted cell counts as found when a detection lies
within 10 um of its crop's centre (a NILM crop's annotated point is often off its nucleus) and,
stricter, within 5 um. The slide is detected whole (one tile, the slide's threshold from 1,024 px
windows), not tiled as ``cyto score`` reads it.

    python benchmarks/science/pap/slide_detection.py --data ../shared/data/cric \\
        --out /tmp/slides > benchmarks/results/epyc-2core/pap/detection/slide_detection.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pap_ranking import MPP, blocks  # noqa: E402

from cyto.data.dataset import PatchDataset  # noqa: E402
from cyto.detect import detect_nuclei, detection_preset, match, slide_threshold  # noqa: E402

CLASSES = {"NILM": 400, "ASC-US": 50, "LSIL": 50}
OPENINGS = {"16 um": 133.0, "20 um": 167.0}  # at 0.12 um/px, as the preset


class _Array:
    def __init__(self, a: np.ndarray):
        self.a, self.info = a, SimpleNamespace(width=a.shape[1], height=a.shape[0])

    def read_region(self, x, y, w, h):
        return self.a[y : y + h, x : x + w]


def main() -> None:
    import pyarrow.parquet as pq
    import pyvips

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="a folder for the slides")
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    ds = PatchDataset.from_path(args.data, normal="NILM", size=100)
    dev, _ = blocks(ds, 0.25, tuple(CLASSES))
    cl = np.array(ds.classes)
    rows: dict[str, list] = {name: [] for name in OPENINGS}
    cyto = Path(sys.executable).with_name("cyto")
    for seed in map(int, args.seeds.split(",")):
        rng = np.random.default_rng(seed)
        d = args.out / f"s{seed}"
        if d.exists():  # never a slide of an earlier run's crops
            shutil.rmtree(d)
        for c, n in CLASSES.items():
            (d / "cells" / c).mkdir(parents=True, exist_ok=True)
            for i in rng.choice(dev[cl[dev] == c], n, replace=False):
                dst = d / "cells" / c / ds.records[i].path.name
                os.symlink(ds.records[i].path.resolve(), dst)
        slide = d / "s.tif"
        subprocess.run(
            [str(cyto), "synth", "slide", str(slide), "--cells", str(d / "cells"),
             "--normal", "NILM", "--abnormal-fraction", "0.1", "--mpp", str(MPP),
             "--width", "3072", "--height", "3072", "--seed", str(seed)],
            check=True, capture_output=True,
        )  # fmt: skip
        a = pyvips.Image.new_from_file(str(slide)).numpy()[..., :3]
        gt = pq.read_table(d / "s.cells.parquet")
        centres = np.column_stack([np.asarray(gt["x"]), np.asarray(gt["y"])])
        kind = np.asarray(gt["class"])
        origins = [(x, y) for y in range(0, a.shape[0], 1024) for x in range(0, a.shape[1], 1024)]
        for name, side in OPENINGS.items():
            p = dataclasses.replace(detection_preset("pap"), background=side).at(MPP)
            t = slide_threshold(_Array(a), origins, p)
            found = detect_nuclei(a, dataclasses.replace(p, threshold=t))
            row = [len(found)] + [
                float(match(found, centres[kind == c], um / MPP)[0])
                for um in (10, 5)
                for c in CLASSES
            ]
            rows[name].append(row)
            print(f"seed {seed}, {name}: {np.round(row, 3).tolist()}", flush=True)
    head = ["cells"] + [f"{c} within {um} um" for um in (10, 5) for c in CLASSES]
    print("\nmean +- sd (sample) over seeds", args.seeds)
    for name, r in rows.items():
        r = np.array(r)
        print(
            name,
            "; ".join(
                f"{h} {m:.3f} +- {s:.3f}"
                for h, m, s in zip(head, r.mean(0), r.std(0, ddof=1), strict=True)
            ),
        )


if __name__ == "__main__":
    main()
