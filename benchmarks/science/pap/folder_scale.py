"""How `cyto predict`'s folder scale check reads Pap crops, measured as of no pixel size (before
hostile round 33) and at the model's crop pixel size (after): its answer to a known zoom of real
cells, to cells shrunk onto their own glass colour, and its false alarms at the training scale.

CRIC NILM development crops only (the first 75 % by id; the final block untouched): block A =
the first 800 (the reference, as a bundle's training normals), block B = the next 876. Crops at
the fast preset's load size (80 px of 100 px at 0.258 um/px: 0.3225 um/px).

    python benchmarks/science/pap/folder_scale.py ../shared/data/cric
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.special import bdtr

from cyto.data.images import resize_rgb
from cyto.data.scale import zoom_patches
from cyto.detect.morphometry import scale_shares

LOAD, MPP = 80, 0.258 * 100 / 80


def load(files) -> np.ndarray:
    return np.stack([resize_rgb(np.asarray(Image.open(f).convert("RGB")), 100) for f in files])


def on_glass(crops: np.ndarray, s: float) -> np.ndarray:
    """Each crop shrunk by s onto its own glass colour (the 97th percentile), as hostile round
    33 made another lab's smaller cells."""
    out = []
    for a in crops:
        glass = tuple(int(v) for v in np.percentile(a.reshape(-1, 3), 97, axis=0))
        canvas = Image.new("RGB", (100, 100), glass)
        side = round(100 * s)
        canvas.paste(
            Image.fromarray(a).resize((side, side), Image.BICUBIC), ((100 - side) // 2,) * 2
        )
        out.append(np.asarray(canvas))
    return np.stack(out)


def said(v, ref, conf=0.80) -> bool:
    """The check's rule (cyto.data.scale.share_check): every median the sample allows past 1.25x."""
    f = np.sqrt(ref / np.median(v))
    if 0.8 <= f <= 1.25:
        return False
    v = np.sort(v)
    n, tail = len(v), (1 - conf) / 2
    if bdtr(0, n, 0.5) > tail:
        return False
    k = 0
    while k + 1 <= n // 2 and bdtr(k + 1, n, 0.5) <= tail:
        k += 1
    ends = [np.sqrt(ref / s) if s > 0 else np.inf for s in (v[k], v[n - 1 - k])]
    return all(x > 1.25 for x in ends) if f > 1 else all(x < 0.8 for x in ends)


def main(cric: Path) -> None:
    files = sorted((cric / "NILM").glob("*.png"), key=lambda p: int(p.stem))[: int(2235 * 0.75)]
    a, b = load(files[:800]), load(files[800:])
    rng = np.random.default_rng(0)
    for name, mpp in (("no pixel size (before)", None), ("crop pixel size (after)", MPP)):
        ref = float(np.median(scale_shares(zoom_patches(a, 1.0, LOAD), "pap", mpp)))
        base = scale_shares(zoom_patches(b, 1.0, LOAD), "pap", mpp)
        row = [f"B/A {np.sqrt(ref / np.median(base)):.3f}"]
        for s in (0.6, 0.8, 1.25, 1.67, 2.0):
            m = np.median(scale_shares(zoom_patches(b, s, LOAD), "pap", mpp))
            row.append(f"zoom {s}: {np.sqrt(np.median(base) / m):.2f}")
        for s in (0.6, 0.8):
            m = np.median(scale_shares(zoom_patches(on_glass(b, s), 1.0, LOAD), "pap", mpp))
            row.append(f"on glass {s}: {np.sqrt(np.median(base) / m):.2f}")
        alarms = [
            np.mean([said(rng.choice(base, n, replace=False), ref) for _ in range(300)])
            for n in (12, 33, 64, 142, 500)
        ]
        print(f"{name}: ref {ref:.4f}; " + "; ".join(row))
        said_share = " ".join(f"{x:.3f}" for x in alarms)
        print(f"  told another scale at the training scale (n = 12/33/64/142/500): {said_share}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
