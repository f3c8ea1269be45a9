"""Sheets for the eye audit of Pap nucleus detection (detection.md): 15 NILM and 15 abnormal
development crops drawn with ``--seed``, each enlarged 2x with the Pap preset's detections (green:
centre and equivalent circle) and a yellow circle of 3 um around the crop's centre (the annotated
point). A person then says, per crop, whether a nucleus lies under the yellow circle and whether
the detector found it. With ``--blind`` the sheet has no detections: judge where the point lies
on it first, then on the sheet with them whether that nucleus was found (the judgments of the
sheets judged that way: ``eye_audit_<seed>.csv`` beside them).

    python benchmarks/science/pap/eye_audit.py --data ../shared/data/cric --seed 1 \\
        --out benchmarks/results/xeon-2core/pap/detection/eye_audit_1.jpg
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pap_ranking import MPP, blocks  # noqa: E402

from cyto.data.dataset import PatchDataset  # noqa: E402
from cyto.detect import detect_nuclei, detection_preset  # noqa: E402


def main() -> None:
    import cv2
    from PIL import Image

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--blind", action="store_true", help="draw no detections")
    ap.add_argument("--stage", choices=("dev", "final"), default="dev", help="the crops' block")
    args = ap.parse_args()
    ds = PatchDataset.from_path(args.data, normal="NILM", size=100)
    dev, final = blocks(ds, 0.25, ("NILM", "ASC-US", "LSIL"))
    dev = dev if args.stage == "dev" else final  # the final block: once, after every choice
    classes = np.array(ds.classes)
    rng = np.random.default_rng(args.seed)
    idx = np.concatenate(
        [
            rng.choice(dev[classes[dev] == "NILM"], 15, replace=False),
            rng.choice(dev[classes[dev] != "NILM"], 15, replace=False),
        ]
    )
    params = detection_preset("pap").at(MPP)
    tiles = []
    for j, i in enumerate(idx):
        img = np.asarray(ds.images[i])
        a = cv2.resize(img, (200, 200), interpolation=cv2.INTER_NEAREST)
        for x, y, area in [] if args.blind else detect_nuclei(img, params):
            centre = (int(2 * x + 1), int(2 * y + 1))
            cv2.circle(a, centre, int(2 * np.sqrt(area / np.pi)), (0, 255, 0), 1)
            cv2.circle(a, centre, 3, (0, 255, 0), -1)
        cv2.circle(a, (100, 100), int(2 * 3 / MPP), (255, 255, 0), 1)
        cv2.putText(a, str(j), (3, 15), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1)
        tiles.append(a)
    rows = [np.concatenate(tiles[r * 6 : (r + 1) * 6], 1) for r in range(5)]
    Image.fromarray(np.concatenate(rows, 0)).save(args.out, quality=82)
    for j, i in enumerate(idx):
        print(j, classes[i], ds.records[i].path.name)


if __name__ == "__main__":
    main()
