"""Scoring a slide read in place over HTTP against the same slide read from its file.

One synthetic pyramidal TIFF is scored (``cyto score``, each run in a process of its own) from
its file, from nginx on loopback, and from nginx behind a proxy that holds each request
``--delay-ms`` (tests/servers.py's DelayingProxy: a server that far away, per request). For
each run: cells/s (the summary's), the ratio to the local run of the same round, and the bytes
that came over the wire (nginx's log: body bytes of every answer) against the bytes of the
slide's tiles in the levels the run read (a level is read when any range it asked for falls in
its tile data; the TIFF's directories and tables are not counted as tile bytes).

    python benchmarks/remote/bench_remote.py --model MODEL.cyto --work /tmp/remotebench \\
        --out benchmarks/results/vm-2core/remote [--size 3072] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _results import machine, write  # noqa: E402
from tests.servers import delaying_proxy, nginx  # noqa: E402


def level_extents(slide: Path) -> list[tuple[int, int, int]]:
    """(first byte, end byte, tile bytes) of each level's tile data."""
    import tifffile

    out = []
    with tifffile.TiffFile(slide) as tf:
        for page in tf.pages:
            pairs = [
                (o, c) for o, c in zip(page.dataoffsets, page.databytecounts, strict=True) if c
            ]
            out.append(
                (min(o for o, _ in pairs), max(o + c for o, c in pairs), sum(c for _, c in pairs))
            )
    return out


def served(log: Path, since: int) -> tuple[int, int, list[tuple[int, int]]]:
    """(body bytes, requests, byte ranges asked) of the slide's GETs logged after line
    ``since``."""
    lines = log.read_text().splitlines()[since:]
    total = n = 0
    ranges = []
    for line in lines:
        status, size, rest = line.split(" ", 2)
        if "GET /" not in rest:
            continue
        total += int(size)
        n += 1
        m = re.search(r"bytes=(\d+)-(\d+)", rest)
        if m:
            ranges.append((int(m.group(1)), int(m.group(2)) + 1))
    return total, n, ranges


def score(source: str, model: Path, out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cache = out.with_name(out.name + "-cache")  # no block shared from an earlier run
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cyto",
            "score",
            source,
            "--model",
            str(model),
            "--out",
            str(out),
            "--mosaic",
            "0",
            "--workers",
            str(workers),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CYTO_PROGRESS": "0", "CYTO_CACHE_DIR": str(cache)},
    )
    if proc.returncode:
        raise SystemExit(proc.stderr)
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", type=int, default=3072)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    served_dir = args.work / "served"
    slide = served_dir / "bench.tif"
    if not slide.exists():
        write_slide(slide, SlideSynthConfig(width=args.size, height=args.size, seed=7), workers=0)
    levels = level_extents(slide)
    rows = []
    with (
        nginx(served_dir, args.work / "nginx") as server,
        delaying_proxy(server.port, args.delay_ms / 1000) as proxy,
    ):
        sources = {
            "local": str(slide),
            "http": f"{server.url}/bench.tif",
            f"http+{args.delay_ms:g}ms": f"{proxy.url}/bench.tif",
        }
        for rnd in range(args.rounds):
            for name, source in sources.items():
                since = len(server.log.read_text().splitlines()) if server.log.exists() else 0
                s = score(source, args.model, args.work / f"out-{name}", args.workers)
                row = {
                    "round": rnd,
                    "source": name,
                    "cells": s["cells_scored"],
                    "cells_per_s": s["cells_per_s"],
                    "seconds": s["seconds"],
                    "wall_s": s["wall_s"],
                    "peak_rss_mb": s.get("peak_rss_mb"),
                }
                if name != "local":
                    got, n, ranges = served(server.log, since)
                    touched = [
                        lv for lv in levels if any(a < lv[1] and b > lv[0] for a, b in ranges)
                    ]
                    tile_bytes = sum(lv[2] for lv in touched)
                    row.update(
                        fetched_bytes=got,
                        requests=n,
                        tile_bytes_of_levels_read=tile_bytes,
                        levels_read=len(touched),
                        fetched_over_tiles=round(got / tile_bytes, 3),
                    )
                rows.append(row)
                print(json.dumps(row))
    for r in rows:
        local = next(x for x in rows if x["round"] == r["round"] and x["source"] == "local")
        r["ratio_to_local"] = round(r["cells_per_s"] / local["cells_per_s"], 3)
    by = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r)
    meta = {
        **machine(),
        "slide": f"synthetic {args.size}x{args.size} pyramidal JPEG TIFF, "
        f"{slide.stat().st_size} bytes",
        "model": str(args.model.name),
        "workers": args.workers,
        "delay_ms": args.delay_ms,
        "rounds": args.rounds,
    }
    md = [
        "# cyto score: a slide read in place over HTTP against its file",
        "",
        f"`python benchmarks/remote/bench_remote.py --size {args.size} --rounds {args.rounds} "
        f"--delay-ms {args.delay_ms:g} --workers {args.workers}` on {meta['host']} "
        f"({meta['cpu_count']} CPUs, {meta['cpu']}); {meta['slide']}.",
        "",
        "| source | cells/s (median) | ratio to local (median) | fetched / tile bytes | requests |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, rs in by.items():
        ratio = statistics.median(r["ratio_to_local"] for r in rs)
        fetched = rs[0].get("fetched_over_tiles", "")
        md.append(
            f"| {name} | {statistics.median(r['cells_per_s'] for r in rs):.1f} | {ratio:.3f} "
            f"| {fetched} | {rs[0].get('requests', '')} |"
        )
    write(args.out, "remote", meta, rows, md)


if __name__ == "__main__":
    main()
