"""Is ``--zoom auto`` good advice for Pap crops? How one lab's own NILM nucleus share drifts with
acquisition order, and how a Pap bundle ranks crops at a known wrong scale scored as they are,
with ``--zoom auto`` (the factor read from their nuclei) and with ``--patch-mpp`` (the factor from
the pixel sizes).

CRIC development crops only (the first 75 % of each class by id; the final block untouched).
The bundle (``--model``) is trained on the earliest development ids; the test crops are later
development ids it never saw: NILM 1000-1299, ASC-US and LSIL from their 31st id to the end of
their development block. Each test crop is zoomed about its centre by s (0.7: another lab's
cells 1.43x smaller; 1.4: larger; 1: as they are) and scored by ``cyto predict`` three ways.

    PYTHONPATH=src python benchmarks/science/pap/zoom_advice.py ../shared/data/cric \
        --model pap.cyto --work /tmp/zoom_advice
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from cyto.data.images import resize_rgb
from cyto.data.scale import zoom_patches
from cyto.detect.morphometry import scale_shares

DEV = 0.75
MPP = 0.258


def ids(root: Path, cls: str) -> list[Path]:
    files = sorted((root / cls).glob("*.png"), key=lambda p: int(p.stem))
    return files[: int(round(DEV * len(files)))]


def load(files) -> np.ndarray:
    return np.stack([resize_rgb(np.asarray(Image.open(f).convert("RGB")), 100) for f in files])


def drift(root: Path, block: int = 200) -> list[tuple[int, float]]:
    """The median centre-nucleus share of each block of ``block`` development NILM crops, as
    the folder check reads them (at the fast preset's 80 px of 100 px)."""
    files = ids(root, "NILM")
    out = []
    for start in range(0, len(files) - block + 1, block):
        crops = load(files[start : start + block])
        small = np.stack([resize_rgb(c, 80) for c in crops])
        out.append((start, float(np.median(scale_shares(small, "pap", MPP * 100 / 80)))))
    return out


def write(folder: Path, sets: dict[str, list[Path]], s: float) -> None:
    for cls, files in sets.items():
        (folder / cls).mkdir(parents=True, exist_ok=True)
        crops = load(files)
        if s != 1.0:
            crops = zoom_patches(crops, s)
        for f, c in zip(files, crops, strict=True):
            Image.fromarray(c).save(folder / cls / f.name)


def predict(model: Path, data: Path, out: Path, **how) -> dict:
    """``cyto.predict`` on ``data``: its AUROC, the zoom it applied and the scale lines it said."""
    import warnings

    import cyto

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = cyto.predict(model, data, out, normal="NILM", overwrite=True, echo=None, **how)
    lines = [str(w.message) for w in said if "look" in str(w.message)]
    return {"auroc": got["auroc"], "zoom": got.get("zoom"), "warned": lines}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cric", type=Path)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    print("# NILM development blocks of 200 by id: median centre-nucleus share")
    blocks = drift(args.cric)
    ref = blocks[0][1]
    for start, share in blocks:
        print(f"ids {start}-{start + 199}: {share:.4f} (reads {np.sqrt(ref / share):.3f}x)")
    sets = {"NILM": ids(args.cric, "NILM")[1000:1300]}
    for cls in ("ASC-US", "LSIL"):
        sets[cls] = ids(args.cric, cls)[30:]
    print("# test: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()))
    for s in (1.0, 0.7, 1.4):
        folder = args.work / f"s{s}"
        shutil.rmtree(folder, ignore_errors=True)
        write(folder, sets, s)
        ways = {"as they are": {}, "--zoom auto": {"zoom": "auto"},
                "--patch-mpp": {"patch_mpp": round(MPP / s, 4)}}  # fmt: skip
        for i, (name, how) in enumerate(ways.items()):
            got = predict(args.model, folder, args.work / f"s{s}-{i}.parquet", **how)
            print(f"zoom {s}: {name}: AUROC {got['auroc']:.3f}; zoom {got['zoom']}; "
                  f"warned: {' | '.join(w[:160] for w in got['warned']) or '-'}")  # fmt: skip


if __name__ == "__main__":
    main()
