"""How far a set of one lab's cells reads from a model's stain by how many it holds, drawn at
random or taken together as a batch (consecutive CRIC ids: cells of a few images), which the
stain check's bound for few cells (``cyto.detect.stain.FEW_CELLS``, ``ADVISE_DEGREES_FEW``) is
set from (hostile round 68, 2: 80 later crops read 19.0 degrees, "another lab").

CRIC development crops only (the first 75 % of NILM by id; the final block untouched): the
model's stain from the first 240, the sets from the rest.

    PYTHONPATH=src python benchmarks/science/pap/stain_batches.py ../shared/data/cric
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from cyto.detect.stain import compare, estimate_images


def main() -> None:
    root = Path(sys.argv[1])
    files = sorted((root / "NILM").glob("*.png"), key=lambda p: int(p.stem))
    files = files[: int(round(0.75 * len(files)))]
    images = [np.asarray(Image.open(f).convert("RGB")) for f in files]
    model, pool = estimate_images(images[:240]), images[240:]
    rng = np.random.default_rng(0)
    print("# degrees from the stain of the first 240 development NILM crops")
    for n in (32, 64, 80, 128, 200, 400):
        drawn = np.array(
            [
                compare(model, estimate_images([pool[i] for i in rng.choice(len(pool), n, False)]))
                for _ in range(60)
            ]
        )
        print(f"{n} drawn at random (60 draws): median {np.median(drawn):.1f}, "
              f"99th percentile {np.percentile(drawn, 99):.1f}, max {drawn.max():.1f}")  # fmt: skip
    for n in (40, 64, 80, 128, 200, 300):
        batches = [compare(model, estimate_images(pool[s : s + n]))
                   for s in range(0, len(pool) - n + 1, n)]  # fmt: skip
        print(f"{n} in a row ({len(batches)} batches): max {max(batches):.1f}; "
              + " ".join(f"{b:.1f}" for b in batches))  # fmt: skip


if __name__ == "__main__":
    main()
