"""How far apart the stain vectors of sets of normal cells lie (cyto.detect.stain), within a lab
and between labs and stains: what ``cyto.detect.stain.ADVISE_DEGREES`` was set from.

Sets: CRIC's development NILM cells in three blocks by acquisition order (one lab, many slides;
its final block is left out), CRIC's development abnormal cells; the bone-marrow lymphocytes in
two halves; the other lab's blood lymphocytes in two halves (every crop at 100 px, the stained
pixels of each set pooled).

    python benchmarks/science/pap/stain_angles.py --data ../shared/data \\
        --out benchmarks/results/xeon-2core/pap/stain
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: _results.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # pap_ranking
from _results import machine, write  # noqa: E402

from cyto.data.dataset import PatchDataset, acquisition_key  # noqa: E402
from cyto.detect.stain import ADVISE_DEGREES, compare, estimate_images  # noqa: E402


def parts(root: Path, normal: str, cls: str, n: int, dev_only: bool = False) -> list[np.ndarray]:
    """The images of class ``cls`` (``*abnormal``: every other class) in ``n`` blocks by
    acquisition order, at 100 px; ``dev_only``: CRIC's development pool alone (its final block,
    the latest 25 % of each class, is left out: pap_ranking.blocks)."""
    ds = PatchDataset.from_path(root, normal=normal, abnormal=None, size=100)
    keep = set(range(len(ds)))
    if dev_only:
        from pap_ranking import blocks

        keep = set(blocks(ds, 0.25, ("NILM", "ASC-US", "LSIL"))[0].tolist())
    idx = [
        i
        for i, r in enumerate(ds.records)
        if i in keep and (r.cls == cls or (cls == "*abnormal" and ds.labels[i]))
    ]
    idx = sorted(idx, key=lambda i: acquisition_key(ds.records[i].path))
    return [np.asarray(ds.images)[b] for b in np.array_split(np.array(idx), n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--data", type=Path, required=True, help="the folder of cric/, bone_marrow/, pbc/"
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sets: dict[str, np.ndarray] = {}
    for i, block in enumerate(parts(args.data / "cric", "NILM", "NILM", 3, dev_only=True)):
        sets[f"CRIC NILM block {i + 1}"] = block
    sets["CRIC abnormal"] = parts(args.data / "cric", "NILM", "*abnormal", 1, dev_only=True)[0]
    for i, half in enumerate(parts(args.data / "bone_marrow", "LYT", "LYT", 2)):
        sets[f"bone marrow LYT half {i + 1}"] = half
    for i, half in enumerate(parts(args.data / "pbc", "lymphocyte", "lymphocyte", 2)):
        sets[f"blood (other lab) lymphocyte half {i + 1}"] = half
    est = {name: estimate_images(images) for name, images in sets.items()}
    rows = []
    for a, b in itertools.combinations(est, 2):
        rows.append({"a": a, "b": b, "degrees": round(compare(est[a], est[b]), 2)})
        print(rows[-1], flush=True)
    md = [
        "# Stain vectors of normal-cell sets: degrees apart (cyto.detect.stain)", "",
        f"`{' '.join(sys.argv)}`; said past {ADVISE_DEGREES:g} degrees", "",
        "| set | set | degrees |", "|---|---|---|",
        *(f"| {r['a']} | {r['b']} | {r['degrees']:.1f} |" for r in rows),
        "", "| set | cells | vectors (R, G, B optical density) |", "|---|---|---|",
        *(f"| {n} | {len(sets[n])} | {np.round(e.vectors, 3).tolist()} |" for n, e in est.items()),
    ]  # fmt: skip
    write(args.out, "stain_angles", machine(), rows, md)


if __name__ == "__main__":
    main()
