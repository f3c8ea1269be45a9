"""How the Pap centre-nucleus share answers a known zoom: CRIC NILM development crops (the first
75 % of ids), each zoomed about its centre by s (cyto.data.scale.zoom_patch), median share
against the unzoomed median; the factor the check reads against the true one."""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from cyto.data.images import resize_rgb
from cyto.data.scale import zoom_patches
from cyto.detect.morphometry import scale_shares

root = Path(sys.argv[1]) / "NILM"
files = sorted(root.glob("*.png"), key=lambda p: int(p.stem))
files = files[: int(len(files) * 0.75)]  # the development ids
imgs = np.stack([resize_rgb(np.asarray(Image.open(f).convert("RGB")), 100) for f in files])
rng = np.random.default_rng(0)
for block, idx in (("A", np.arange(0, 800)), ("B", np.arange(800, len(imgs)))):
    x = imgs[idx]
    ref = float(np.median(scale_shares(x, "pap")))
    row = []
    for s in (0.5, 0.625, 0.8, 1.25, 1.6, 2.0, 2.5, 3.0):
        m = float(np.median(scale_shares(zoom_patches(x, s), "pap")))
        read = np.sqrt(m / ref)
        row.append(f"{s}:{read:.2f}(g={2 * np.log(read) / np.log(s):.2f})")
    print(block, f"ref {ref:.4f}", " ".join(row), flush=True)
