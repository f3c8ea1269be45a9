"""The MGG whole-crop nucleus share against a known zoom (bone-marrow crops of two classes)."""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from cyto.data.images import resize_rgb
from cyto.data.scale import zoom_patches
from cyto.detect.morphometry import scale_shares

for cls in sys.argv[2:]:
    files = sorted((Path(sys.argv[1]) / cls).glob("*.jpg"))[:400]
    x = np.stack([resize_rgb(np.asarray(Image.open(f).convert("RGB")), 100) for f in files])
    ref = float(np.median(scale_shares(x, "mgg")))
    row = []
    for s in (0.5, 0.625, 0.8, 1.25, 1.6, 2.0):
        m = float(np.median(scale_shares(zoom_patches(x, s), "mgg")))
        read = np.sqrt(m / ref)
        row.append(f"{s}:{read:.2f}(g={2 * np.log(read) / np.log(s):.2f})")
    print(cls, f"ref {ref:.4f}", " ".join(row), flush=True)
