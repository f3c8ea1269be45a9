"""Nucleus detection on real Pap cells (CRIC crops, each cut around an annotated cell's point):
is the nucleus at the crop's centre found, and how many nuclei does a crop give (issue 66).

Each crop is one tile to the detector (its own threshold: no slide threshold for a 100 px crop),
with a detection preset at the crops' pixel size (0.258 um/px, README.md). Per class:

* ``point``: a detection within 3 um of the crop's centre (the annotated point);
* ``inside``: the crop's centre within 3 um of a detected nucleus's outline (its centre closer
  than its equivalent radius + 3 um): a large nucleus is found though its centre lies more than
  3 um from a point annotated anywhere on it;
* detections per crop (neighbours' nuclei are real nuclei too: not a false-positive count).

The annotated point of many crops lies off any nucleus (most NILM crops: README.md, the eye
audit), so neither share can reach 1 there whatever the detector.

    python benchmarks/science/pap/detection.py --data ../shared/data/cric --stage dev \\
        --out benchmarks/results/xeon-2core/pap/detection
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _results.py
from _results import machine, write  # noqa: E402
from pap_ranking import MPP, blocks  # noqa: E402

from cyto.data.dataset import PatchDataset  # noqa: E402
from cyto.detect import detect_nuclei, detection_preset  # noqa: E402

#: the presets compared: the MGG smear, and the Pap one with the variants it was chosen over
VARIANTS = {
    "smear": ("smear", {}),
    "pap": ("pap", {}),
    "pap, no background, 3 classes": (
        "pap",
        {"background": 0.0, "classes": 3, "min_threshold": 0.1},
    ),
    "pap, 3 classes": ("pap", {"classes": 3}),
    "pap, 16 um background (before stop 79)": ("pap", {"background": 133.0}),
}


def check(images: np.ndarray, params) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per crop: a detection within 3 um of its centre, its centre inside a detected nucleus
    (+3 um), and the detections it gives."""
    point, inside, count = [], [], []
    for img in images:
        found = detect_nuclei(img, params)
        count.append(len(found))
        if not len(found):
            point.append(False)
            inside.append(False)
            continue
        c = (img.shape[0] - 1) / 2
        d = np.hypot(found[:, 0] - c, found[:, 1] - c) * MPP
        r = np.sqrt(found[:, 2] / np.pi) * MPP
        point.append(bool(d.min() <= 3.0))
        inside.append(bool(np.any(d <= r + 3.0)))
    return np.array(point), np.array(inside), np.array(count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--stage", choices=("dev", "final"), default="dev")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ds = PatchDataset.from_path(args.data, normal="NILM", size=100)
    dev, final = blocks(ds, 0.25, ("NILM", "ASC-US", "LSIL"))
    idx = dev if args.stage == "dev" else final
    images, classes = np.asarray(ds.images)[idx], np.array(ds.classes)[idx]
    rows = []
    for name, (kind, changes) in VARIANTS.items():
        params = dataclasses.replace(detection_preset(kind), **changes).at(MPP)
        point, inside, count = check(images, params)
        for cls in sorted(set(classes)):
            m = classes == cls
            rows.append(
                {
                    "variant": name,
                    "class": cls,
                    "crops": int(m.sum()),
                    "point_3um": round(float(point[m].mean()), 3),
                    "inside_3um": round(float(inside[m].mean()), 3),
                    "per_crop": round(float(count[m].mean()), 2),
                }  # fmt: skip
            )
            print(rows[-1], flush=True)
    md = [
        f"# Nuclei found on CRIC crops ({args.stage})", "", f"`{' '.join(sys.argv)}`", "",
        "| variant | class | crops | a detection within 3 um of the centre | the centre in a "
        "found nucleus (+3 um) | detections per crop |",
        "|---|---|---|---|---|---|",
        *(f"| {r['variant']} | {r['class']} | {r['crops']} | {r['point_3um']:.3f} | "
          f"{r['inside_3um']:.3f} | {r['per_crop']:.2f} |" for r in rows),
    ]  # fmt: skip
    write(args.out, f"detection_{args.stage}", {**machine(), "mpp": MPP}, rows, md)


if __name__ == "__main__":
    main()
