"""Figure: synthetic cells (cyto synth patches) next to real bone-marrow cells.

Usage:
    python docs/synthetic_vs_real.py --real ../shared/data/bone_marrow \
        --out docs/synthetic_vs_real.png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from cyto.data.dataset import load_records
from cyto.data.mosaic import class_rows, render_rows
from cyto.data.synth.patches import PatchSynthConfig, write_patches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--real", type=Path, required=True, help="class folder of real cells")
    ap.add_argument("--out", type=Path, default=Path("docs/synthetic_vs_real.png"))
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--tile", type=int, default=96)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        synth = Path(tmp) / "synth"
        write_patches(synth, PatchSynthConfig(n_normal=args.per_class, n_abnormal=args.per_class))
        srows = class_rows(load_records(synth), args.per_class, args.tile, seed=0)
    rrows = class_rows(load_records(args.real), args.per_class, args.tile, seed=0)
    order = [
        "normal",
        "enlarged",
        "irregular",
        "nucleolar",
        "coarse",
        "multinucleated",
        "hyperchromatic",
    ]
    srows = sorted(srows, key=lambda r: order.index(r[0]))
    rrows = sorted(rrows, key=lambda r: (r[0] != "LYT", r[0]))
    left = render_rows([(f"synth {c}", r) for c, r in srows], title="cyto synth patches")
    right = render_rows([(f"real {c}", r) for c, r in rrows], title=f"real: {args.real.name}")
    h = max(left.height, right.height)
    canvas = Image.new("RGB", (left.width + right.width + 20, h), "white")
    canvas.paste(left, (0, 0))
    canvas.paste(right, (left.width + 20, 0))
    canvas.save(args.out)
    print(f"wrote {args.out} ({canvas.width}x{canvas.height}); mean RGB of rows:")
    for name, rows in (("synth", srows), ("real", rrows)):
        for c, r in rows:
            print(f"  {name:5s} {c:15s} {np.round(r.reshape(-1, 3).mean(0)).astype(int)}")


if __name__ == "__main__":
    main()
