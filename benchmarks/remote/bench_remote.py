"""Scoring a slide read in place (HTTP, S3, DICOMweb) against the same slide read from its file.

One synthetic pyramidal JPEG TIFF is scored (``cyto score``, each run in a process of its own,
an empty cyto cache each) from its file; from nginx on loopback; from nginx behind a proxy that
holds each request ``--delay-ms`` (tests/servers.py's DelayingProxy: a server that far away,
per request), with cyto's read-ahead (the default) and without it (``CYTO_READ_AHEAD_MB=0``);
from moto's S3 server (what s3fs's own tests run) through a counting proxy; and, converted to a
DICOM whole-slide series (uncompressed frames of the TIFF's decoded pixels, tests/dicom_wsi.py),
from Orthanc's DICOMweb plugin through a counting proxy, with and without the delay.

For each run: cells/s (the summary's), the ratio to the local run of the same round, and the
bytes that came over the wire against the bytes of the tiles of the levels the run read: for
HTTP, nginx's log (body bytes; a level is read when any range asked for falls in its tile data;
the TIFF's directories and tables are not tile bytes); for S3, the proxy's count (answers with
their headers) and the ranges asked; for DICOMweb, the proxy's count (answers with their
headers, the metadata included) against the frames of the instances whose frames were asked,
and how many frames were asked more than once.

    python benchmarks/remote/bench_remote.py --model MODEL.cyto --work /tmp/remotebench \\
        --out benchmarks/results/xeon-2core/remote [--size 6144] [--rounds 2] \\
        [--sources local,http,http+20ms,...]
"""

from __future__ import annotations

import argparse
import contextlib
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
from tests.servers import delaying_proxy, moto_s3, nginx, orthanc  # noqa: E402

NO_AHEAD = {"CYTO_READ_AHEAD_MB": "0"}


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


def tiff_share(levels, ranges, got: int) -> dict:
    touched = [lv for lv in levels if any(a < lv[1] and b > lv[0] for a, b in ranges)]
    tile_bytes = sum(lv[2] for lv in touched)
    return {
        "tile_bytes_of_levels_read": tile_bytes,
        "levels_read": len(touched),
        "fetched_over_tiles": round(got / tile_bytes, 3) if tile_bytes else None,
    }


def frames_share(lines: list[str], frames_of: dict, frame_bytes: int, got: int) -> dict:
    """What a DICOMweb run asked: frames in all, distinct frames, the frames of the instances
    asked (their bytes: tile bytes)."""
    asked: list[tuple[str, int]] = []
    for line in lines:
        m = re.search(r"/instances/([^/]+)/frames/([0-9,]+)", line)
        if m:
            asked += [(m.group(1), int(f)) for f in m.group(2).split(",")]
    uids = {u for u, _ in asked}
    tile_bytes = sum(frames_of.get(u, 0) for u in uids) * frame_bytes
    return {
        "frames_asked": len(asked),
        "frames_distinct": len(set(asked)),
        "tile_bytes_of_levels_read": tile_bytes,
        "levels_read": len(uids),
        "fetched_over_tiles": round(got / tile_bytes, 3) if tile_bytes else None,
    }


def score(source: str, model: Path, out: Path, workers: int, env: dict | None = None) -> dict:
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
        env={**os.environ, "CYTO_PROGRESS": "0", "CYTO_CACHE_DIR": str(cache), **(env or {})},
    )
    if proc.returncode:
        raise SystemExit(proc.stderr)
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    return summary


def dicom_series(slide: Path, folder: Path, tile: int) -> tuple[list[Path], dict, int]:
    """The slide as a DICOM whole-slide series (uncompressed frames of its decoded levels):
    (files, frames per SOP Instance UID, bytes per frame)."""
    import pydicom
    from tests.dicom_wsi import write_dicom_wsi

    from cyto.slides import open_slide

    files = sorted(folder.glob("*.dcm"))
    if not files:
        reader = open_slide(slide)
        levels = [
            reader.read_region(0, 0, w, h, level=i)
            for i, (w, h) in enumerate(reader.info.level_dims)
        ]
        mpp = reader.info.mpp
        reader.close()
        files = write_dicom_wsi(folder, levels, mpp, tile=tile)
        del levels
    frames_of = {}
    for f in files:
        ds = pydicom.dcmread(f, stop_before_pixels=True)
        frames_of[str(ds.SOPInstanceUID)] = int(getattr(ds, "NumberOfFrames", 1))
    return files, frames_of, tile * tile * 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", type=int, default=3072, help="the slide's side in pixels")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--sources",
        default="local,http,http+delay,http+delay-noahead,s3,dicomweb,dicomweb+delay,"
        "dicomweb+delay-noahead",
        help="comma-separated, in the order run each round (local always runs first)",
    )
    args = ap.parse_args()
    d = f"{args.delay_ms:g}ms"
    wanted = [w.strip() for w in args.sources.split(",") if w.strip()]
    wanted = ["local"] + [w for w in wanted if w != "local"]

    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    served_dir = args.work / f"served-{args.size}"
    slide = served_dir / "bench.tif"
    if not slide.exists():
        write_slide(slide, SlideSynthConfig(width=args.size, height=args.size, seed=7), workers=0)
    levels = level_extents(slide)
    need_s3 = any(w.startswith("s3") for w in wanted)
    need_dw = any(w.startswith("dicomweb") for w in wanted)
    rows = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(nginx(served_dir, args.work / "nginx"))
        proxy = stack.enter_context(delaying_proxy(server.port, args.delay_ms / 1000))
        sources = {
            "local": (str(slide), {}, None),
            "http": (f"{server.url}/bench.tif", {}, "nginx"),
            f"http+{d}": (f"{proxy.url}/bench.tif", {}, "nginx"),
            f"http+{d}-noahead": (f"{proxy.url}/bench.tif", NO_AHEAD, "nginx"),
        }
        if need_s3:
            s3 = stack.enter_context(moto_s3(args.work / "moto"))
            s3.client().create_bucket(Bucket="bench")
            s3.client().upload_file(str(slide), "bench", "bench.tif")
            s3_proxy = stack.enter_context(delaying_proxy(s3.port, 0.0))
            env = {**s3.env(), "AWS_ENDPOINT_URL": s3_proxy.url}
            sources["s3"] = ("s3://bench/bench.tif", env, s3_proxy)
        if need_dw:
            import pydicom

            files, frames_of, frame_bytes = dicom_series(
                slide, args.work / f"dicom-{args.size}", 256
            )
            archive = stack.enter_context(orthanc(args.work / "orthanc", files))
            first = pydicom.dcmread(files[0], stop_before_pixels=True)
            tail = f"/dicom-web/studies/{first.StudyInstanceUID}/series/{first.SeriesInstanceUID}"
            for name, delay in (("dicomweb", 0.0), (f"dicomweb+{d}", args.delay_ms / 1000)):
                p = stack.enter_context(delaying_proxy(archive.port, delay))
                sources[name] = (f"dicomweb+{p.url}{tail}", {}, p)
                if delay:
                    sources[f"{name}-noahead"] = (f"dicomweb+{p.url}{tail}", NO_AHEAD, p)
        names = {"http+delay": f"http+{d}", "http+delay-noahead": f"http+{d}-noahead"}
        names["dicomweb+delay"] = f"dicomweb+{d}"
        names["dicomweb+delay-noahead"] = f"dicomweb+{d}-noahead"
        order = [names.get(w, w) for w in wanted]
        unknown = [w for w in order if w not in sources]
        if unknown:
            raise SystemExit(f"unknown sources {unknown}; known: {', '.join(sources)}")
        for rnd in range(args.rounds):
            for name in order:
                source, env, counter = sources[name]
                since = len(server.log.read_text().splitlines()) if server.log.exists() else 0
                if counter not in (None, "nginx"):
                    before = (counter.answered, len(counter.lines), len(counter.ranges))
                s = score(source, args.model, args.work / f"out-{name}", args.workers, env)
                row = {
                    "round": rnd,
                    "source": name,
                    "read_ahead": "CYTO_READ_AHEAD_MB" not in env and name != "local",
                    "cells": s["cells_scored"],
                    "cells_per_s": s["cells_per_s"],
                    "seconds": s["seconds"],
                    "wall_s": s["wall_s"],
                    "peak_rss_mb": s.get("peak_rss_mb"),
                }
                if counter == "nginx":
                    got, n, ranges = served(server.log, since)
                    row.update(fetched_bytes=got, requests=n, **tiff_share(levels, ranges, got))
                elif counter is not None:
                    got = counter.answered - before[0]
                    lines = counter.lines[before[1] :]
                    row.update(fetched_bytes=got, requests=len(lines))
                    if name.startswith("s3"):
                        row.update(tiff_share(levels, counter.ranges[before[2] :], got))
                    else:
                        row.update(frames_share(lines, frames_of, frame_bytes, got))
                rows.append(row)
                print(json.dumps(row), flush=True)
    for r in rows:
        local = next(x for x in rows if x["round"] == r["round"] and x["source"] == "local")
        r["ratio_to_local"] = round(r["cells_per_s"] / local["cells_per_s"], 3)
    by: dict = {}
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
        "sources": order,
    }
    md = [
        "# cyto score: a slide read in place (HTTP, S3, DICOMweb) against its file",
        "",
        f"`python benchmarks/remote/bench_remote.py --size {args.size} --rounds {args.rounds} "
        f"--delay-ms {args.delay_ms:g} --workers {args.workers}` on {meta['host']} "
        f"({meta['cpu_count']} CPUs, {meta['cpu']}); {meta['slide']}.",
        "",
        "| source | read-ahead | cells/s (median) | ratio to local (median, min-max) "
        "| fetched / tile bytes | requests |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, rs in by.items():
        ratios = [r["ratio_to_local"] for r in rs]
        fetched = rs[0].get("fetched_over_tiles", "")
        md.append(
            f"| {name} | {'yes' if rs[0]['read_ahead'] else 'no'} "
            f"| {statistics.median(r['cells_per_s'] for r in rs):.1f} "
            f"| {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) "
            f"| {fetched} | {rs[0].get('requests', '')} |"
        )
    write(args.out, "remote", meta, rows, md)


if __name__ == "__main__":
    main()
