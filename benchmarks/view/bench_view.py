"""``cyto view`` on a large slide: time to the first view, tile latency cold and cached, the
markers' drawing time per frame, and the server's peak memory.

The slide is ``cyto synth slide`` output (give it with --slide; 40,000 x 40,000 px carries about
10^5 cells). Scoring 10^5 cells on a 2-core machine takes far longer than this measures, so the
score table is built from the synthetic slide's own cells (its ground truth: every cell's
position) with a seeded score: normal noise, plus 3 for the planted abnormal cells. This measures
the viewer, not the scorer. The folder gets the summary and table ``cyto score`` writes, with the
slide's real identity, so ``cyto view`` checks and opens it as it does a scored folder.

    python benchmarks/view/bench_view.py --slide /tmp/big.tif --work /tmp/viewbench \\
        --out benchmarks/results/vm-2core/view [--screenshots docs/_static]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def scored_folder(slide: Path, out: Path, seed: int = 0) -> Path:
    """A folder as ``cyto score`` leaves it, scores seeded (see the module docstring)."""
    from cyto.data.synth.slide import ground_truth_path
    from cyto.infer.outputs import TABLE_COLUMNS
    from cyto.infer.store import slide_identity
    from cyto.slides import open_slide

    gt = pq.read_table(ground_truth_path(slide))
    n = gt.num_rows
    rng = np.random.default_rng(seed)
    score = rng.normal(0.0, 1.0, n) + 3.0 * np.asarray(gt["label"], np.float64)
    order = np.argsort(-score, kind="stable")
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(1, n + 1)
    identity = slide_identity(slide)
    table = pa.table(
        {
            "slide_id": gt["slide_id"],
            "cell_id": gt["cell_id"],
            "x": gt["x"],
            "y": gt["y"],
            "score": pa.array(score),
            "rank": pa.array(rank),
        }
    ).replace_schema_metadata(
        {"cyto.slide_identity": identity, "cyto.manifest_sha256": "seeded-scores"}
    )
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "scores.parquet", row_group_size=8192)
    reader = open_slide(slide)
    info = reader.info
    reader.close()
    summary = {
        "slide": str(slide),
        "output": str(out),
        "slide_identity": identity,
        "model": "seeded-scores",
        "model_sha256": "seeded-scores",
        "method": "no model: bench_view.py",
        "cells_scored": n,
        "rank_by": "score",
        "burden": {"status": "not calibrated", "reason": "a benchmark's seeded scores"},
        "resolution": {"slide_mpp": info.mpp},
        "tiles": {"total": None},
        "output_key": {"tile": 1024, "planes": "none", "top_k": 100},
        "outputs": {
            "scores.parquet": {"kind": "parquet", "rows": n, "columns": list(TABLE_COLUMNS)}
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return out


class Server:
    def __init__(self, folder: Path, cache: Path) -> None:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cyto", "view", str(folder), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "CYTO_PROGRESS": "0", "CYTO_CACHE_DIR": str(cache)},
        )
        for line in self.proc.stdout:
            if line.startswith("open http://"):
                self.url = line.split()[1]
                break
        else:
            raise SystemExit("cyto view did not start")
        self.start_s = time.perf_counter() - t0

    def status(self, field: str) -> float:
        """A memory field of /proc/PID/status in MiB (VmRSS, VmHWM: its peak)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def tile_times(url: str, paths: list[str]) -> list[float]:
    """Seconds per GET of each path, over one keep-alive connection (the body read whole)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    out = []
    for p in paths:
        t0 = time.perf_counter()
        conn.request("GET", p)
        r = conn.getresponse()
        body = r.read()
        out.append(time.perf_counter() - t0)
        if r.status != 200 or not body.startswith(b"\xff\xd8"):
            raise SystemExit(f"{p}: {r.status}")
    conn.close()
    return out


def stats(ms: list[float]) -> dict:
    ms = sorted(ms)
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
    return {"n": len(ms), "median_ms": statistics.median(ms), "p90_ms": q(0.9), "max_ms": ms[-1]}


JPEG = {"type": "jpeg", "quality": 80}
FIRST_VIEW = (
    "() => window.cytoView && cytoView.ready && cytoView.mapItem && "
    "cytoView.viewer.world.getItemAt(0).getFullyLoaded() && cytoView.mapItem.getFullyLoaded()"
)


def first_view(browser, url: str, shots: Path | None, name: str) -> float:
    """Seconds from navigation to the whole first view drawn (tiles of the home view loaded,
    the cells and the map in), in a fresh browser context (no browser cache)."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url)
    while not page.evaluate(FIRST_VIEW):
        page.wait_for_timeout(10)
    s = time.perf_counter() - t0
    if shots:
        page.wait_for_timeout(300)
        page.screenshot(path=shots / name, **JPEG)
    ctx.close()
    return s


def main() -> None:
    from _results import machine, write
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slide", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiles", type=int, default=300, help="Tiles requested cold, then cached.")
    ap.add_argument("--cold", type=int, default=3, help="First views on a new server and cache.")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--screenshots", type=Path, help="Save the 1440x900 views here.")
    args = ap.parse_args()
    meta = machine(" ".join(["python", *sys.argv]))
    meta["load_average_at_start"] = os.getloadavg()
    folder = scored_folder(args.slide.resolve(), args.work / "scored")
    n_cells = pq.read_metadata(folder / "scores.parquet").num_rows
    rows = []
    cold, starts = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        for i in range(args.cold):  # each a new server on an empty tile cache
            cache = args.work / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            server = Server(folder, cache)
            starts.append(server.start_s)
            last = i == args.cold - 1
            shots = args.screenshots if last else None
            try:
                cold.append(first_view(browser, server.url, shots, "view-large-overview.jpg"))
            except BaseException:
                server.stop()
                raise
            if not last:
                server.stop()
        browser.close()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            warm = [first_view(browser, server.url, None, "") for _ in range(3)]
            # panning where every cell's dot is drawn: the markers' time per frame
            ctx = browser.new_context(viewport={"width": 1440, "height": 900})
            page = ctx.new_page()
            page.goto(server.url)
            while not page.evaluate(FIRST_VIEW):
                page.wait_for_timeout(10)
            info = page.evaluate("() => cytoView.info")
            page.evaluate(
                "() => { const v = cytoView.viewer; v.viewport.zoomTo("
                "v.world.getItemAt(0).imageToViewportZoom(0.12), null, true); }"
            )
            draws, drawn = [], []
            for i in range(40):
                page.evaluate(
                    "(i) => cytoView.viewer.viewport.panBy("
                    "new OpenSeadragon.Point(0.004 * Math.cos(i / 6), 0.004 * Math.sin(i / 6)),"
                    " true)",
                    i,
                )
                page.wait_for_timeout(30)
                draws.append(page.evaluate("() => cytoView.drawMs"))
                drawn.append(page.evaluate("() => cytoView.cellsDrawn"))
            top = page.locator("#topk li").nth(0)
            top.click()
            page.wait_for_timeout(1500)
            if args.screenshots:
                page.screenshot(
                    path=args.screenshots / "view-large-cell.jpg", type="jpeg", quality=80
                )
            ctx.close()
            browser.close()
        # tiles: a random sample over the levels a user pans through, cold then cached
        rng = random.Random(0)
        ml, key, t = info["max_level"], info["tiles_key"], info["tile_size"]
        paths = []
        for _ in range(args.tiles):
            level = rng.randint(ml - 6, ml)
            scale = 2 ** (ml - level)
            cols = math.ceil(math.ceil(info["width"] / scale) / t)  # tiles across the level
            down = math.ceil(math.ceil(info["height"] / scale) / t)
            col, row = rng.randrange(cols), rng.randrange(down)
            paths.append(f"/tiles/0/{key}/0/{level}/{col}_{row}.jpeg")
        paths = list(dict.fromkeys(paths))
        tiles_dir = cache / "view-tiles" / key
        already = sum(  # rendered while the browser panned: not cold
            (tiles_dir / "p0" / q.split("/")[5] / q.split("/")[6]).is_file() for q in paths
        )
        rss_before_tiles = server.status("VmRSS")
        cold_tiles = tile_times(server.url, paths)
        cached_tiles = tile_times(server.url, paths)
        peak = server.status("VmHWM")
        rss_end = server.status("VmRSS")
    finally:
        server.stop()
    ms = lambda xs: [1000 * x for x in xs]  # noqa: E731
    result = {
        "slide": str(args.slide),
        "width": info["width"],
        "height": info["height"],
        "cells": n_cells,
        "server_start_s": [round(x, 3) for x in starts],
        "first_view_cold_cache_s": [round(c, 3) for c in cold],
        "first_view_cold_cache_median_s": round(statistics.median(cold), 3),
        "first_view_cached_s": [round(w, 3) for w in warm],
        "first_view_cached_median_s": round(statistics.median(warm), 3),
        "tiles_cold": stats(ms(cold_tiles)),
        "tiles_cold_already_cached": already,
        "tiles_cached": stats(ms(cached_tiles)),
        "marker_draw_ms": stats(draws),
        "cells_drawn_per_frame_median": statistics.median(drawn),
        "server_rss_mb_before_tiles": round(rss_before_tiles, 1),
        "server_rss_mb_end": round(rss_end, 1),
        "server_peak_rss_mb": round(peak, 1),
        "load_average_at_end": os.getloadavg(),
    }
    rows.append(result)
    print(json.dumps(result, indent=1))
    md = [
        f"# cyto view on {info['width']} x {info['height']} px, {n_cells} cells",
        "",
        f"first view {statistics.median(cold):.2f} s (median of {len(cold)}, tiles rendered on "
        f"request), {statistics.median(warm):.2f} s "
        f"cached; tiles median {result['tiles_cold']['median_ms']:.0f} ms cold, "
        f"{result['tiles_cached']['median_ms']:.1f} ms cached; peak RSS {peak:.0f} MiB",
    ]
    write(args.out, "view", meta, rows, md)


if __name__ == "__main__":
    main()
