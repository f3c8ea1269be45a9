"""A closed-loop reading of a Pap crop folder's scale, tried against the check's square root
(stop 91): find the zoom z that brings the folder's median centre-nucleus share to the training
normals' (bisection on log z in 0.25-4), instead of sqrt(reference / median). The share answers
a zoom weakly (power 1-1.8, not 2: `../scale_response.py`), which the square root reads short;
the loop reads it in the share's own response.

Reference: CRIC NILM development block A (the first 800 by id); test: draws of 64 and 128
crops of block B, as they are, shrunk onto their glass colour, and zoomed in place.

    PYTHONPATH=../../../../src python scale_loop.py ../../../../../shared/data/cric
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from folder_scale import LOAD, MPP, load, on_glass  # noqa: E402

from cyto.data.scale import zoom_patches  # noqa: E402
from cyto.detect.morphometry import scale_shares  # noqa: E402


def med(x: np.ndarray, z: float) -> float:
    return float(np.median(scale_shares(zoom_patches(x, z, LOAD), "pap", MPP)))


def loop(x: np.ndarray, ref: float, steps: int = 10) -> float:
    lo, hi = np.log(0.25), np.log(4.0)
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if med(x, np.exp(mid)) < ref else (lo, mid)
    return float(np.exp((lo + hi) / 2))


def main(cric: Path) -> None:
    files = sorted((cric / "NILM").glob("*.png"), key=lambda p: int(p.stem))[: int(2235 * 0.75)]
    a, b = load(files[:800]), load(files[800:])
    ref = med(a, 1.0)
    for n in (64, 128):
        rows: dict[str, list] = {}
        for seed in range(3):
            x = b[np.random.default_rng(seed).choice(len(b), n, replace=False)]
            cases = {"as they are (truth 1.00)": x}
            cases |= {f"on glass {s} (truth {1 / s:.2f})": on_glass(x, s) for s in (0.6, 0.7, 0.8)}
            cases |= {
                f"zoom {s} (truth {1 / s:.2f})": zoom_patches(x, s, 100) for s in (0.8, 1.25, 1.67)
            }
            for name, c in cases.items():
                rows.setdefault(name, []).append((np.sqrt(ref / med(c, 1.0)), loop(c, ref)))
        for name, r in rows.items():
            r = np.asarray(r)
            print(
                f"n {n}, {name}: square root {r[:, 0].mean():.2f} +- {r[:, 0].std():.2f}, "
                f"loop {r[:, 1].mean():.2f} +- {r[:, 1].std():.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
