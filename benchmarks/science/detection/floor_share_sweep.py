"""The choice of ``NucleusParams.floor_share`` (see ``README.md`` here): for each share, the
smear preset on three cases the threshold's floor decides:

- the development seeds 1-12 of ``smear_floor.py`` (2048 px synthetic MGG smears, read as
  ``cyto score`` reads them): recall and precision against the drawn cells;
- the dense band of dark nuclei pressed together of ``tests/integration/test_nuclei.py``:
  nuclei found of 96;
- three generated Pap tiles (``tests/unit/test_pap_detection.py``) under the smear preset:
  recall and precision (a stained cytoplasm must not become nuclei).

    PYTHONPATH=src:. python benchmarks/science/detection/floor_share_sweep.py --out DIR 0 0.5 0.6
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from smear_floor import detect_slide, match  # noqa: E402


def band() -> tuple[np.ndarray, np.ndarray]:
    """The test's band: radius 22 px nuclei 38-40 px apart, jittered by seed 0."""
    rng = np.random.default_rng(0)
    rgb = np.full((512, 512, 3), (235, 225, 230), dtype=np.uint8)
    yy, xx = np.mgrid[:512, :512]
    truth = []
    for row, cy in enumerate(range(25, 300, 38)):
        for cx in range(25 + (row % 2) * 19, 490, 40):
            cy_j, cx_j = cy + rng.integers(-2, 3), cx + rng.integers(-2, 3)
            rgb[(yy - cy_j) ** 2 + (xx - cx_j) ** 2 <= 22**2] = (70, 30, 110)
            truth.append((cx_j, cy_j))
    return rgb, np.array(truth, dtype=np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("shares", type=float, nargs="+")
    args = ap.parse_args()
    import pyarrow.parquet as pq
    from tests.unit.test_pap_detection import MPP, _ArrayReader, _recall_precision, pap_tile

    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.detect import NucleusParams, detect_nuclei, detection_preset, slide_threshold
    from cyto.detect import match as points_match

    args.out.mkdir(parents=True, exist_ok=True)
    slides = []
    for seed in range(1, 13):
        path = args.out / f"s{seed}.tif"
        if not path.exists():
            write_slide(path, SlideSynthConfig(width=2048, height=2048, seed=seed))
        t = pq.read_table(args.out / f"s{seed}.cells.parquet")
        slides.append((path, np.column_stack([t["x"].to_numpy(), t["y"].to_numpy()])))
    rgb, truth = band()
    for share in args.shares:
        params = NucleusParams(floor_share=share)
        got = [match(t, detect_slide(p, params)[0]) for p, t in slides]
        rec = [g["recall"] for g in got]
        pre = [g["precision"] for g in got]
        found = detect_nuclei(rgb, params)
        b_rec, b_pre = points_match(found, truth, radius=19)
        paps = []
        for seed in (0, 5, 17):
            tile, centres = pap_tile(seed, size=640)
            at = dataclasses.replace(detection_preset("smear").at(MPP), floor_share=share)
            t = slide_threshold(_ArrayReader(tile), [(0, 0)], at)
            f = detect_nuclei(tile, dataclasses.replace(at, threshold=t))
            r, p = _recall_precision(f, centres)
            paps.append(f"{r:.2f}/{p:.2f}")
        print(
            f"floor_share {share}: slides recall {np.mean(rec):.3f} (min {min(rec):.3f}), "
            f"precision {np.mean(pre):.3f} (min {min(pre):.3f}); band {len(found)} of "
            f"{len(truth)} found (recall {b_rec:.2f}, precision {b_pre:.2f}); Pap tiles "
            f"recall/precision {', '.join(paps)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
