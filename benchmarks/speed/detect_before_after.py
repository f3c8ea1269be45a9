"""Nucleus detection alone, an old commit's code against the working tree's, in one run.

Each slide's tissue tiles (1,024 px with a 64 px margin, as `cyto score` reads them) are decoded
once; the detector then runs over all of them with the slide's threshold, in a process of its own
per tree, alternating old and new for ``--rounds`` rounds. The table gives ms per tile (each
round's time over the tiles; the best round and the mean) and a hash of the detections, which
must be equal when a change is meant to keep the output.

    python benchmarks/speed/detect_before_after.py e477bb5 \\
        --slide ../shared/data/wsi/cmu1_small_region.svs --slide slide.tif \\
        --kind smear --kind tissue --rounds 3 --out benchmarks/results/vm-2core/detect-speed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]


def measure(slide: str, kind: str, tile: int = 1024, margin: int = 64) -> dict:
    """Runs in the tree under test (its ``src`` first on the path)."""
    from dataclasses import replace

    import numpy as np

    from cyto.detect import THRESHOLD_WINDOW, detect_nuclei, detection_preset, slide_threshold
    from cyto.slides.grid import tile_grid, tissue_mask
    from cyto.slides.readers import open_slide

    reader = open_slide(slide)
    info = reader.info
    params = detection_preset(kind).at(info.mpp or 0.25)
    mask, ds = tissue_mask(reader)
    origins = [(x, y) for _, x, y in tile_grid(info.width, info.height, THRESHOLD_WINDOW, mask, ds)]
    threshold = slide_threshold(reader, origins, params)
    if threshold is not None:
        params = replace(params, threshold=round(threshold, 6))
    tiles = [
        reader.read_region(x - margin, y - margin, tile + 2 * margin, tile + 2 * margin)
        for _, x, y in tile_grid(info.width, info.height, tile, mask, ds)
    ]
    detect_nuclei(tiles[0], params)  # imports, first calls
    t0 = time.perf_counter()
    found = [detect_nuclei(t, params) for t in tiles]
    seconds = time.perf_counter() - t0
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(f).tobytes() for f in found))
    return {
        "tiles": len(tiles),
        "nuclei": int(sum(len(f) for f in found)),
        "ms_per_tile": 1000 * seconds / len(tiles),
        "sha256": digest.hexdigest()[:16],
    }


def _run_in(tree: Path, slide: str, kind: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "CYTO_PROGRESS": "0"}
    proc = subprocess.run(
        [sys.executable, str(HERE), "--measure", slide, kind],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", nargs="?", help="the commit to compare the working tree with")
    ap.add_argument("--slide", action="append", default=[])
    ap.add_argument("--kind", action="append", default=[], help="smear, tissue (default: both)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--measure", nargs=2, metavar=("SLIDE", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    if not (args.old and args.slide and args.out):
        ap.error("give OLD, at least one --slide and --out")
    kinds = args.kind or ["smear", "tissue"]
    old_tree = Path(tempfile.mkdtemp(prefix="cyto-old-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), args.old],
        check=True,
        capture_output=True,
    )
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    rows = []
    try:
        for slide in args.slide:
            for kind in kinds:
                got = {"old": [], "new": []}
                for _ in range(args.rounds):
                    for which, tree in (("old", old_tree), ("new", ROOT)):
                        got[which].append(_run_in(tree, slide, kind))
                        print(Path(slide).name, kind, which, got[which][-1], flush=True)
                for which in ("old", "new"):
                    ms = [r["ms_per_tile"] for r in got[which]]
                    rows.append(
                        {
                            "slide": Path(slide).name,
                            "kind": kind,
                            "code": args.old if which == "old" else f"{head} + working tree",
                            "tiles": got[which][0]["tiles"],
                            "nuclei": got[which][0]["nuclei"],
                            "ms_per_tile_rounds": [round(v, 1) for v in ms],
                            "ms_per_tile_best": round(min(ms), 1),
                            "ms_per_tile_mean": round(statistics.mean(ms), 1),
                            "sha256": sorted({r["sha256"] for r in got[which]}),
                        }
                    )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
            capture_output=True,
        )
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _results import machine, write

    meta = {**machine(), "command": " ".join(["python", *sys.argv]), "rounds": args.rounds}
    md = [
        "# Nucleus detection alone: before and after",
        "",
        f"`{meta['command']}` on {meta['host']} ({meta['cpu_count']} CPUs, {meta['cpu']}; "
        f"flags {', '.join(meta.get('cpu_flags', []))}).",
        "",
        "| slide | detection | code | tiles | nuclei | ms/tile (best) | ms/tile (mean) | rounds | "
        "detections sha256 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['slide']} | {r['kind']} | {r['code']} | {r['tiles']} | {r['nuclei']:,} | "
            f"{r['ms_per_tile_best']} | {r['ms_per_tile_mean']} | "
            f"{', '.join(map(str, r['ms_per_tile_rounds']))} | {', '.join(r['sha256'])} |"
        )
    write(args.out, "detect", meta, rows, md)


if __name__ == "__main__":
    main()
