"""`cyto view`: the scored slide in a real browser (tiles at several zoom levels, a top cell's
marker on its pixel, the map's toggle), what the server refuses, the review guard, and the cells
the page is sent."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import ConfigError
from cyto.infer import ScoreOptions, score_slide
from tests.cli_runner import run_cyto
from tests.killers import as_in_a_terminal
from tests.raw_http import raw_get

K = 30


@pytest.fixture(scope="module")
def scored(exported_dsvdd, tmp_path_factory) -> Path:
    """A 3072 x 2048 px synthetic slide with a second focal plane (-1 um), scored by the small
    Deep SVDD bundle: the folder cyto score writes."""
    root = tmp_path_factory.mktemp("view")
    s = write_slide(
        root / "slide.tif",
        SlideSynthConfig(
            width=3072, height=2048, n_cells=300, abnormal_fraction=0.05, planes=(-1.0, 0.0), seed=5
        ),
        workers=1,
    )
    out = root / "out"
    score_slide(
        s.paths[0],
        exported_dsvdd,
        out,
        ScoreOptions(mosaic=0, workers=0, top_k=K, truth=s.ground_truth),
        echo=lambda _: None,
    )
    return out


@pytest.fixture(scope="module")
def calibrated(exported_dsvdd, tmp_path_factory) -> Path:
    """A 1024 x 1024 px slide with 20% abnormal cells, scored by a copy of the small Deep SVDD
    bundle calibrated (cyto calibrate) on three small slide-negative slides, at FDR 0.2: a
    table with p_value and flagged_bh, a summary with a burden and a triage."""
    root = tmp_path_factory.mktemp("view-cal")
    model = root / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    quiet = lambda _: None  # noqa: E731
    tables = []
    for i in range(3):
        neg = write_slide(
            root / f"neg{i}.tif",
            SlideSynthConfig(width=1024, height=1024, n_cells=120, abnormal_fraction=0.0, seed=i),
            workers=1,
        )
        out = root / f"neg{i}"
        score_slide(neg.paths[0], model, out, ScoreOptions(mosaic=0, workers=0), echo=quiet)
        tables.append(str(out / "scores.parquet"))
    proc = run_cyto("calibrate", str(model), *tables)
    assert proc.returncode == 0, proc.stderr
    pos = write_slide(
        root / "pos.tif",
        SlideSynthConfig(width=1024, height=1024, n_cells=120, abnormal_fraction=0.2, seed=9),
        workers=1,
    )
    out = root / "pos"
    score_slide(
        pos.paths[0],
        model,
        out,
        ScoreOptions(mosaic=0, workers=0, top_k=K, fdr_alpha=0.2),
        echo=quiet,
    )
    return out


def _client(slides, cache, **kw):
    from starlette.testclient import TestClient

    from cyto.view.server import make_app

    return TestClient(make_app(slides, cache, **kw), base_url="http://127.0.0.1:8766")


def _table(folder: Path) -> dict:
    t = pq.read_table(folder / "scores.parquet").sort_by("rank")
    return {c: np.asarray(t[c]) for c in ("x", "y", "score", "rank", "cell_id")}


# --- a real browser against `cyto view` ------------------------------------------------------


class Server:
    """``cyto view FOLDER --port 0`` in a subprocess; ``url`` once it listens."""

    def __init__(self, folder: Path, *args: str, cache: Path) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cyto", "view", str(folder), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "CYTO_PROGRESS": "0", "CYTO_CACHE_DIR": str(cache)},
            preexec_fn=as_in_a_terminal,
        )
        seen = []
        for line in self.proc.stdout:
            seen.append(line)
            if line.startswith("open http://"):
                self.url = line.split()[1]
                self.said = seen
                return
        self.proc.wait()
        raise AssertionError("cyto view did not start: " + "".join(seen))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _wait(page, js: str, timeout_ms: int = 15000):
    """Poll ``js`` (a function of no argument) until it returns something truthy."""
    for _ in range(timeout_ms // 50):
        got = page.evaluate(js)
        if got:
            return got
        page.wait_for_timeout(50)
    raise AssertionError(f"timed out waiting for {js}")


# where a level-0 pixel of the slide is on the screen, by OpenSeadragon's own transform
TO_WINDOW = """([x, y]) => {
    const item = cytoView.viewer.world.getItemAt(0);
    const w = cytoView.viewer.viewport.viewportToWindowCoordinates(
        item.imageToViewportCoordinates(x, y));
    return [w.x, w.y];
}"""
# the overlay canvas's pixel at a window position: [r, g, b, alpha]
CANVAS_AT = """([x, y]) => {
    const c = document.getElementById("cells");
    const box = c.getBoundingClientRect();
    const k = c.width / box.width;
    return Array.from(c.getContext("2d").getImageData(
        Math.round((x - box.left) * k), Math.round((y - box.top) * k), 1, 1).data);
}"""
FULLY_LOADED = "() => cytoView.viewer.world.getItemAt(0).getFullyLoaded()"
ZOOM_TO = """(px) => {  // px: screen px per level-0 px
    const v = cytoView.viewer;
    v.viewport.zoomTo(v.world.getItemAt(0).imageToViewportZoom(px), null, true);
    cytoView.tileLevelsBefore = Object.keys(cytoView.tileLevels).length;
}"""


def _click_top_cell(page, entries, table, rank: int) -> tuple[float, float]:
    """Click the listed top cell ``rank`` and check the ring lands on its pixel (the table's
    x, y through the page's transform, within 2 px); returns that pixel on the screen."""
    entries.nth(rank - 1).click()
    page.wait_for_timeout(100)
    x, y = table["x"][rank - 1], table["y"][rank - 1]
    sx, sy = page.evaluate(TO_WINDOW, [float(x), float(y)])
    ring = page.locator("#selected").bounding_box()
    cx, cy = ring["x"] + ring["width"] / 2, ring["y"] + ring["height"] / 2
    assert abs(cx - sx) < 2 and abs(cy - sy) < 2, (rank, (cx, cy), (sx, sy))
    return sx, sy


def _open_page(playwright, url: str):
    """(browser, page, the page's errors as they come) of system Chromium at 1440 x 900 on
    ``url``."""
    from tests.conftest import CHROMIUM

    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.goto(url)
    return browser, page, errors


@pytest.mark.browser
def test_view_in_a_real_browser(scored, tmp_path):
    """Tiles load at three zoom levels; a top cell clicked is put in the middle of the view with
    its marker on the cell's pixel (the score table's x, y through the page's transform); the
    map toggles; the plane switches; paths outside the folder are refused."""
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("CYTO_VIEW_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    table = _table(scored)
    server = Server(scored, cache=tmp_path / "cache")
    try:
        with sync_playwright() as p:
            browser, page, errors = _open_page(p, server.url)
            _wait(page, "() => cytoView.ready && cytoView.mapItem && cytoView.slideItem")
            _wait(page, FULLY_LOADED)
            page.screenshot(path=shots / "view-overview.jpg", type="jpeg", quality=80)
            levels = set(page.evaluate("() => Object.keys(cytoView.tileLevels)"))
            for px in (0.1, 1.0):
                page.evaluate(ZOOM_TO, px)
                page.wait_for_timeout(100)
                _wait(page, FULLY_LOADED)
                levels |= set(page.evaluate("() => Object.keys(cytoView.tileLevels)"))
            assert len(levels) >= 3, levels
            assert page.evaluate("() => cytoView.tileErrors") == 0

            # a top cell: the viewport goes to it, its marker lies on its pixel
            stage = page.locator("#osd").bounding_box()
            middle = (stage["x"] + stage["width"] / 2, stage["y"] + stage["height"] / 2)
            entries = page.locator("#topk li")
            assert entries.count() == K
            for rank in (1, 7, K):
                sx, sy = _click_top_cell(page, entries, table, rank)
                # centred, unless the cell is too near the slide's edge for that
                assert abs(sx - middle[0]) < 3 and abs(sy - middle[1]) < 3, (rank, sx, sy)
                assert page.evaluate("() => cytoView.cellsDrawn") > 0
                rgba = page.evaluate(CANVAS_AT, [sx, sy])
                assert rgba[3] > 150, (rank, rgba)  # the cell's own dot, drawn on its pixel
                assert page.locator("#topk li.current").get_attribute("data-rank") == str(rank)
            page.screenshot(path=shots / "view-cell.jpg", type="jpeg", quality=80)

            # the map toggles; it is faint under readable dots, strong without them
            page.evaluate("() => cytoView.viewer.viewport.goHome(true)")
            page.wait_for_timeout(100)
            _wait(page, FULLY_LOADED)
            opacity = "() => cytoView.mapItem.getOpacity()"
            assert page.evaluate(opacity) > 0
            before = page.locator("#osd").screenshot()
            page.locator("#show-map").uncheck()
            page.wait_for_timeout(200)
            assert page.evaluate(opacity) == 0
            assert page.locator("#osd").screenshot() != before
            page.locator("#show-map").check()
            page.locator("#show-cells").uncheck()
            page.wait_for_timeout(200)
            assert page.evaluate(opacity) > 0.3 and page.evaluate("() => cytoView.cellsDrawn") == 0
            page.locator("#show-cells").check()
            page.locator("#show-skipped").check()
            page.wait_for_timeout(200)
            assert page.evaluate("() => cytoView.skipped.tiles") > 0

            # the other focal plane: its own tiles
            page.locator("#plane").select_option("1")
            _wait(page, "() => Object.keys(cytoView.tileLevels).length > 0")
            url = page.evaluate("() => cytoView.viewer.world.getItemAt(0).source.getTileUrl(9,0,0)")
            assert "/1/9/0_0.jpeg" in url
            assert page.evaluate("() => cytoView.tileErrors") == 0
            assert errors == []
            browser.close()
        # nothing outside the folder, written any way
        root = str(scored.parent)
        for path in (
            "/static/../summary.json",
            "/static/..%2f..%2f..%2fsummary.json",
            "/static/%2e%2e/%2e%2e/folder.py",
            "/static//etc/passwd",
            "//etc/passwd",
            f"/{root}/out/summary.json",
            f"/static/{root}/out/summary.json",
            "/api/slides/0/..%2f..%2fsummary.json",
            "/api/slides/0/%2Fetc%2Fpasswd",
            "/tiles/0/x/0/9/0_0.jpeg",
            "/tiles/0/..%2f..%2f/0/9/0_0.jpeg",
            "/api/slides/-1",
            "/api/slides/1",
        ):
            status, data = raw_get(server.url, path)
            assert status in (400, 404), (path, status)
            assert b"slide_identity" not in data and b"root:" not in data, path
    finally:
        server.kill()


FLAG_RGB = {False: (70, 110, 200), True: (215, 25, 28), None: (150, 150, 150)}  # view.js
SUMMARY_ROWS = """() => Object.fromEntries(Array.from(document.querySelectorAll("#summary tr"))
    .map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent]))"""


def _another_run(folder: Path, out: Path) -> Path:
    """A copy of a scored folder as another run of its slide would write it (its own timings,
    sealed): a plain copy is one run counted twice, which every reader refuses."""
    shutil.copytree(folder, out)
    summary = out / "summary.json"
    s = json.loads(summary.read_text())
    s["seconds"] = float(s["seconds"]) + 1.0
    summary.write_text(json.dumps(s, indent=2))
    _reseal(out)
    return out


def _with_flags(folder: Path, out: Path, flags_by_rank: dict) -> Path:
    """A copy of a calibrated slide's folder whose ``flagged_bh`` column is ``flags_by_rank``
    (rank -> True, False or None), False for the ranks not given."""
    _another_run(folder, out)
    path = out / "scores.parquet"
    t = pq.read_table(path)
    flags = [flags_by_rank.get(r, False) for r in t["rank"].to_pylist()]
    i = t.column_names.index("flagged_bh")
    t2 = t.set_column(i, "flagged_bh", pa.array(flags, pa.bool_()))
    pq.write_table(t2.replace_schema_metadata(t.schema.metadata), path)
    _reseal(out)  # as a run that flagged these cells would have sealed it
    return out


@pytest.mark.browser
def test_view_a_calibrated_slide_in_a_real_browser(calibrated, tmp_path):
    """A slide scored by a calibrated bundle: the summary shows its burden, triage and FDR
    count, the top cells are listed in sight beside it (a long triage once pushed them out of
    view), each with its p-value, and a click goes to the cell; the dots are coloured by the FDR
    flag, as the legend says (none is flagged here: the top cells are blue, not the score's
    red). The same slide with some flags set and one withheld: red, grey, blue, and the list
    marks the flagged cells."""
    import json

    from playwright.sync_api import sync_playwright

    cohort = tmp_path / "cohort"
    shutil.copytree(calibrated, cohort / "a")
    _with_flags(calibrated, cohort / "b", {1: True, 2: True, 3: True, 4: None})
    table = _table(calibrated)
    t = pq.read_table(calibrated / "scores.parquet").sort_by("rank")
    p_values, flags = t["p_value"].to_pylist(), t["flagged_bh"].to_pylist()
    burden = json.loads((calibrated / "summary.json").read_text())["burden"]
    assert burden["status"] == "ok" and burden["triage"]
    top_n = min(K, t.num_rows)
    server = Server(cohort, cache=tmp_path / "cache")
    try:
        with sync_playwright() as p:
            browser, page, errors = _open_page(p, server.url)
            _wait(page, "() => cytoView.ready && cytoView.slideItem && cytoView.info.index === 0")
            _wait(page, FULLY_LOADED)

            rows = page.evaluate(SUMMARY_ROWS)
            assert rows["burden"] == burden["status"] and rows["triage"] == burden["triage"]
            assert rows[f"flagged at FDR {burden['fdr_alpha']}"] == str(burden["flagged_bh"])
            assert rows["abnormal burden"].startswith(f"{100 * burden['abnormal_fraction']:.1f}%")
            # what the p-values follow, from summary.json (sent, not drawn: round 58)
            assert (
                burden["column"] == "score" and rows["p-values of"] == "the model's score (score)"
            )
            words = page.locator("#legend-words").text_content()
            assert "cells: red flagged at the FDR (flagged_bh), blue not, grey unknown" in words

            # the top cells: all listed, the first ones in sight without scrolling
            entries = page.locator("#topk li")
            assert entries.count() == top_n
            for i in range(5):
                box = entries.nth(i).bounding_box()
                assert box and box["height"] > 0 and box["y"] + box["height"] <= 900, (i, box)
            for i in range(top_n):
                text = entries.nth(i).text_content()
                got = float(text.split("· p ")[1].split("flagged")[0])
                assert abs(got - p_values[i]) <= 0.05 * p_values[i], (i, text, p_values[i])
                assert ("flagged" in text) == bool(flags[i]), (i, text)

            def click_and_colour(rank: int) -> tuple[int, ...]:
                sx, sy = _click_top_cell(page, entries, table, rank)
                assert page.locator("#topk li.current").get_attribute("data-rank") == str(rank)
                rgba = page.evaluate(CANVAS_AT, [sx, sy])
                assert rgba[3] > 150, (rank, rgba)  # the cell's own dot
                return tuple(rgba[:3])

            def near(rgb, want) -> bool:
                return all(abs(a - b) <= 30 for a, b in zip(rgb, want, strict=True))

            for rank in (1, 2, top_n):
                rgb = click_and_colour(rank)
                assert near(rgb, FLAG_RGB[bool(flags[rank - 1])]), (rank, rgb)
            page.screenshot(path=tmp_path / "view-calibrated.jpg", type="jpeg", quality=80)

            # the same slide with flags: red where flagged, grey where withheld, blue else
            page.locator("#slide").select_option("1")
            _wait(page, "() => cytoView.ready && cytoView.slideItem && cytoView.info.index === 1")
            _wait(page, FULLY_LOADED)
            marked = [
                int(entries.nth(i).get_attribute("data-rank"))
                for i in range(entries.count())
                if "flagged" in entries.nth(i).text_content()
            ]
            assert marked == [1, 2, 3]
            for rank, want in ((1, True), (3, True), (4, None), (5, False)):
                rgb = click_and_colour(rank)
                assert near(rgb, FLAG_RGB[want]), (rank, rgb)
            assert page.evaluate("() => cytoView.tileErrors") == 0
            assert errors == []
            tile = page.evaluate(
                "() => cytoView.viewer.world.getItemAt(0).source.getTileUrl(9,0,0)"
            )
            browser.close()
        # another cyto view trimming the shared cache to nothing: the slides this server shows
        # are kept (it holds them), a slide nobody shows goes, and the tiles still come
        from cyto.view.cache import TileCache

        idle = _fake_slide_folder(tmp_path / "cache", "idle", 1, 0)
        shown = {f.name for f in (tmp_path / "cache" / "view-tiles").iterdir()} - {idle.name}
        assert len(shown) == 1  # the two folders show one slide file: one pyramid
        assert TileCache(tmp_path / "cache", 0).trim() == ["idle"]
        assert {f.name for f in (tmp_path / "cache" / "view-tiles").iterdir()} == shown
        assert raw_get(server.url, tile)[0] == 200
    finally:
        server.kill()


# --- the server's rules, the review guard, the cells sent ------------------------------------


def test_the_cells_sent_are_the_score_table_in_rank_order(scored, tmp_path):
    from cyto.view.folder import open_view

    (slide,) = open_view(scored)
    t = _table(scored)
    with _client([slide], tmp_path) as c:
        cells = np.frombuffer(c.get("/api/slides/0/cells.bin").content, "<f4").reshape(-1, 4)
        info = c.get("/api/slides/0").json()
        legend = c.get("/api/slides/0/map.json").json()
        png = c.get("/api/slides/0/map.png")
        assert c.get("/").headers["content-security-policy"].startswith("default-src 'self'")
        # a POST is no request of this server
        assert c.post("/api/slides/0", content=b"x" * 100).status_code in (405, 413)
    np.testing.assert_allclose(cells[:, 0], t["x"], atol=1e-3)
    np.testing.assert_allclose(cells[:, 1], t["y"], atol=1e-3)
    np.testing.assert_allclose(cells[:, 2], t["score"], rtol=1e-6)
    assert np.isnan(cells[:, 3]).all()  # no calibration: no flags
    assert info["colour_by"] == "score" and info["cells"] == len(t["x"])
    assert [c["cell_id"] for c in info["top"]] == list(t["cell_id"][:K])
    assert [z["z_um"] for z in info["planes"]] == [0.0, -1.0]
    assert info["summary"]["adequacy"] is None or "result" in info["summary"]["adequacy"]
    # the morphometric slide score is sent beside the model's (round 58)
    summary = json.loads((scored / "summary.json").read_text())
    assert "slide_morphometry_mean_top_k" in summary, sorted(summary)
    assert (
        info["summary"]["slide_morphometry_mean_top_k"] == (summary["slide_morphometry_mean_top_k"])
    )
    # the map is cyto.infer.maps' own: one pixel per window
    from PIL import Image

    from cyto.infer.maps import map_of_table

    m = map_of_table(pq.read_table(scored / "scores.parquet"), 3072, 2048, info["mpp"])
    assert (legend["rows"], legend["cols"]) == m.shape and legend["kind"] == m.kind
    assert Image.open(io.BytesIO(png.content)).size == (m.shape[1], m.shape[0])


def test_flagged_cells_are_coloured_by_their_flag(scored, tmp_path):
    """A table with FDR flags (a calibrated bundle) colours by the flag, nulls as unknown."""
    from cyto.view.folder import open_view

    folder = tmp_path / "out"
    shutil.copytree(scored, folder)
    path = folder / "scores.parquet"
    t = pq.read_table(path)
    n = t.num_rows
    flags = [None if i % 10 == 0 else i % 3 == 0 for i in range(n)]
    t2 = t.append_column("flagged_bh", pa.array(flags, pa.bool_()))
    pq.write_table(t2.replace_schema_metadata(t.schema.metadata), path)
    _reseal(folder)  # as a calibrated run would have sealed it
    (slide,) = open_view(folder)
    cells = np.frombuffer(slide.cells_bin(), "<f4").reshape(-1, 4)
    order = np.argsort(np.asarray(t["rank"]))
    want = np.array([np.nan if f is None else float(f) for f in flags])[order]
    np.testing.assert_array_equal(cells[:, 3], want)
    assert slide.info(0, 256)["colour_by"] == "flagged_bh"
    assert slide.abnormality_map().kind == "fraction_flagged"
    # the windows of the run's own map: cyto score --map-um
    summary = folder / "summary.json"
    summary.write_text(summary.read_text().replace('"map_um": 50.0', '"map_um": 25.0'))
    _reseal(folder)  # as a run at --map-um 25 would have sealed it
    (again,) = open_view(folder)
    assert again.abnormality_map().window_um == 25.0


def test_a_calibrated_slide_s_map_is_the_one_its_run_wrote(calibrated):
    """The viewer's map of a calibrated slide is cyto score's own (``abnormality.ome.tif``'s
    statistic: :func:`cyto.infer.maps.map_of_table` given the summary's burden), whatever that
    statistic is."""
    import json

    from cyto.infer.maps import map_of_table
    from cyto.view.folder import open_view

    (slide,) = open_view(calibrated)
    summary = json.loads((calibrated / "summary.json").read_text())
    table = pq.read_table(calibrated / "scores.parquet")
    want = map_of_table(table, slide.width, slide.height, slide.mpp, burden=summary["burden"])
    got = slide.abnormality_map()
    assert got.kind == want.kind and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(want.values))
    np.testing.assert_allclose(
        got.values[np.isfinite(want.values)], want.values[np.isfinite(want.values)]
    )


def test_an_unfinished_review_is_not_unblinded(scored, tmp_path):
    from cyto.review.session import build_session
    from cyto.review.store import MarkStore
    from cyto.view.folder import open_view

    folder = tmp_path / "out"
    shutil.copytree(scored, folder)
    session = build_session([folder], folder / "review", k=10, seed=0, echo=lambda _: None)
    with pytest.raises(ConfigError, match="blinded review with nothing marked yet.*--unblind"):
        open_view(folder)
    store = MarkStore(session.root)
    store.mark("ann", session.case_ids()[0], 0, True)
    with pytest.raises(ConfigError, match="ann has not finished"):
        open_view(folder)
    proc = run_cyto("view", str(folder))
    assert proc.returncode != 0 and "--unblind" in proc.stderr and "\n" not in proc.stderr.strip()
    assert len(open_view(folder, unblind=True)) == 1
    for case in session.case_ids():
        store.set_done("ann", case, True)
    store.close()
    assert len(open_view(folder)) == 1  # finished: viewing it unblinds nothing


def test_an_unfinished_review_with_its_session_elsewhere_is_not_unblinded(scored, tmp_path):
    """`cyto review --session ELSEWHERE`: the scored folder records the review, so the view
    finds it there (it looked only beside the folder, and served every rank)."""
    from cyto.review.session import build_session
    from cyto.view.folder import open_view

    folder = tmp_path / "out"
    shutil.copytree(scored, folder)
    elsewhere = tmp_path / "other" / "place" / "rv"
    build_session([folder], elsewhere, k=5, seed=0, echo=lambda _: None)
    with pytest.raises(ConfigError, match="rv is a blinded review with nothing marked yet"):
        open_view(folder)
    proc = run_cyto("view", str(folder))
    assert proc.returncode != 0 and "--unblind" in proc.stderr


def test_a_changed_slide_or_a_review_folder_is_refused(scored, tmp_path):
    from cyto.errors import InputPathError
    from cyto.view.folder import open_view
    from cyto.view.tiles import TilePyramid

    root = tmp_path / "copy"
    shutil.copytree(scored.parent, root, ignore=shutil.ignore_patterns("review"))
    folder = root / "out"
    summary = folder / "summary.json"
    summary.write_text(summary.read_text().replace(str(scored.parent), str(root)))
    _reseal(folder)  # as a run of the copied slide would have sealed it
    (slide,) = open_view(folder)
    first = TilePyramid(slide, tmp_path / "cache").dir
    # the same name, other pixels: refused, never drawn under the old markers
    write_slide(
        root / "slide.tif",
        SlideSynthConfig(width=3072, height=2048, n_cells=300, seed=6),
        overwrite=True,
        workers=1,
    )
    with pytest.raises(ConfigError, match="the slide file slide.tif's content .*score it again"):
        open_view(folder)
    # its tiles would be another cache folder: the key holds the slide's identity
    slide.identity = {str(root / "slide.tif"): "another"}
    assert TilePyramid(slide, tmp_path / "cache").dir != first
    with pytest.raises(InputPathError, match="no scored slide"):
        open_view(tmp_path / "cache")


def test_a_slide_changed_under_a_running_viewer_is_said_and_read_again_when_put_back(
    scored, tmp_path
):
    """A hostile check: the slide file replaced while `cyto view` served it answered 500 with a
    JPEG decoder's words; a slide of the same structure would have been drawn under the old
    slide's cells, and its tiles kept. Now each read checks the files first."""
    from cyto.view.folder import open_view

    root = tmp_path / "copy"
    shutil.copytree(scored.parent, root, ignore=shutil.ignore_patterns("review"))
    folder = root / "out"
    summary = folder / "summary.json"
    summary.write_text(summary.read_text().replace(str(scored.parent), str(root)))
    _reseal(folder)
    (slide,) = open_view(folder)
    original = (root / "slide.tif").read_bytes()
    with _client([slide], tmp_path / "cache") as c:
        info = c.get("/api/slides/0").json()
        assert c.get(_tile_url(info, 0, 0)).status_code == 200
        write_slide(
            root / "slide.tif",
            SlideSynthConfig(width=3072, height=2048, n_cells=300, seed=6),
            overwrite=True,
            workers=1,
        )
        changed = c.get(_tile_url(info, 1, 0))
        assert changed.status_code == 500
        said = changed.json()["error"]
        assert "slide.tif changed or moved since cyto view opened it" in said, said
        assert "Not a JPEG" not in said and "\n" not in said
        (root / "slide.tif").write_bytes(original)  # put back as it was
        back = c.get(_tile_url(info, 1, 0))
        assert back.status_code == 200 and back.content[:2] == b"\xff\xd8"


def test_help_says_it_unblinds():
    proc = run_cyto("view", "--help")
    assert proc.returncode == 0
    assert "UNBLINDS" in proc.stdout and "--unblind" in proc.stdout


def test_responses_on_a_kept_alive_connection_are_not_held_back():
    """bind() made its socket with proto 0, on which asyncio never sets TCP_NODELAY: each
    response after a connection's first waited for the browser's delayed ACK (44 ms a tile,
    measured). The accepted connections of a bound socket now send at once."""
    import asyncio
    import socket

    from cyto.localserver import bind

    sock = bind("127.0.0.1", 0)
    seen = {}

    async def run():
        async def handle(reader, writer):
            s = writer.get_extra_info("socket")
            seen["nodelay"] = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        port = sock.getsockname()[1]
        _, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        w.close()
        server.close()

    asyncio.run(run())
    assert seen["nodelay"] != 0


def test_score_says_how_to_view_the_slide(scored):
    from cyto.view.folder import view_words

    summary = {"output": str(scored)}
    assert view_words([summary], scored.parent) == (
        f"see the whole slide, every cell on it: cyto view {scored} "
        "(shows ranks: unblinded; docs/how-to/view-slide.md)"
    )
    two = [summary, {"output": str(scored.parent / "b")}]
    assert f"cyto view {scored.parent} " in view_words(two, scored.parent)
    assert view_words([], scored.parent) is None


def test_a_cohort_folder_lists_its_slides_and_beyond_loopback_needs_the_key(scored, tmp_path):
    from cyto.view.folder import open_view

    cohort = tmp_path / "cohort"
    shutil.copytree(scored, cohort / "a")
    _another_run(scored, cohort / "b")
    slides = open_view(cohort)
    assert [s.name for s in slides] == ["a", "b"]
    with _client(slides, tmp_path / "cache") as c:
        listed = c.get("/api/slides").json()["slides"]
        assert [s["name"] for s in listed] == ["a", "b"]
        assert c.get("/api/slides/1").json()["name"] == "b"
        assert c.get("/api/slides/0", headers={"Host": "evil.example"}).status_code == 400
    base = "http://192.0.2.10:8766"
    from starlette.testclient import TestClient

    from cyto.view.server import make_app

    app = make_app(slides, tmp_path / "cache", hosts=("*",), access_key="s3cret")
    with TestClient(app, base_url=base) as stranger:
        for path in ("/", "/api/slides", "/api/slides/0/cells.bin", "/static/view.js", "/?key=no"):
            assert stranger.get(path).status_code == 401, path
    with TestClient(app, base_url=base) as viewer:
        assert viewer.get("/?key=s3cret").status_code == 200
        assert viewer.get("/api/slides/0/cells.bin").status_code == 200  # the cookie holds it


def _reseal(folder: Path) -> None:
    """Seal a folder whose summary a test edited, as cyto score seals what it writes."""
    import json

    from cyto.seal import seal_outputs

    seal_outputs(folder, json.loads((folder / "summary.json").read_text())["outputs"])


def test_an_edited_output_is_refused_by_its_seal(scored, tmp_path):
    """A summary edited by hand (its triage, its top cells) is not shown: the folder's seal
    (cyto.seal) no longer holds."""
    from cyto.view.folder import open_view

    folder = tmp_path / "out"
    shutil.copytree(scored, folder, ignore=shutil.ignore_patterns("review"))
    summary = folder / "summary.json"
    summary.write_text(summary.read_text().replace('"seconds"', '"seconds" ', 1))
    with pytest.raises(ConfigError, match=r"changed since they were written \(summary.json\)"):
        open_view(folder)


def _hand_scored(folder: Path, slide: Path, xs, ys, scores) -> Path:
    """A scored folder as cyto score leaves one, with the given cells (no model run)."""
    import json

    from cyto.infer.outputs import TABLE_COLUMNS
    from cyto.infer.store import slide_identity
    from cyto.seal import seal_outputs

    n = len(xs)
    rank = np.empty(n, np.int64)
    rank[np.argsort(-np.asarray(scores))] = np.arange(1, n + 1)
    identity = slide_identity(slide)
    table = pa.table(
        {
            "slide_id": [slide.stem] * n,
            "cell_id": np.arange(n),
            "x": np.asarray(xs, np.float64),
            "y": np.asarray(ys, np.float64),
            "score": np.asarray(scores, np.float64),
            "rank": rank,
        }
    ).replace_schema_metadata({"cyto.slide_identity": identity, "cyto.manifest_sha256": "m"})
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "scores.parquet")
    summary = {
        "slide": str(slide),
        "slide_identity": identity,
        "model_sha256": "m",
        "cells_scored": n,
        "output_key": {"tile": 512, "planes": "none", "top_k": 5},
        "outputs": {"scores.parquet": {"kind": "parquet", "rows": n, "columns": TABLE_COLUMNS}},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, summary["outputs"])  # as cyto score seals it (cyto.seal)
    return folder


@pytest.mark.pyvips
def test_the_skipped_layer_marks_the_tiles_without_tissue(tmp_path):
    """Tissue on the left, glass on the right: the tiles the pipeline never visits (no tissue
    in them) are the layer's strong tint, tissue is clear."""
    import pyvips
    from PIL import Image

    from cyto.view.folder import open_view

    pixels = np.full((2048, 3072, 3), 255, np.uint8)
    pixels[:, :1536] = (190, 120, 180)
    slide = tmp_path / "half.tif"
    pyvips.Image.new_from_array(pixels).tiffsave(
        str(slide), tile=True, pyramid=True, compression="jpeg", Q=90
    )
    rng = np.random.default_rng(0)
    xs, ys = rng.uniform(50, 1450, 40), rng.uniform(50, 2000, 40)
    (view,) = open_view(_hand_scored(tmp_path / "out", slide, xs, ys, rng.normal(size=40)))
    got = view.skipped()
    assert got["tiles"] == 24 and got["tile"] == 512
    skipped = {tuple(t) for t in got["skipped"]}
    assert all(x0 >= 1536 for x0, _ in skipped)  # glass only
    assert {(x0, y0) for x0 in (2048, 2560) for y0 in (0, 512, 1024, 1536)} <= skipped
    assert got["visited"] == 24 - len(skipped)
    mask = np.asarray(Image.open(io.BytesIO(view.mask_png())))
    ds = got["mask_downsample"]
    assert mask[int(1000 / ds), int(500 / ds), 3] == 0  # tissue: clear
    assert mask[int(1000 / ds), int(2800 / ds), 3] == 150  # a skipped tile: tinted


def test_cyto_score_ends_with_the_view_command(scored, exported_dsvdd, tmp_path):
    from cyto.view.folder import open_view

    out = tmp_path / "again"
    proc = run_cyto(
        "score",
        str(scored.parent / "slide.tif"),
        "--model",
        str(exported_dsvdd),
        "--out",
        str(out),
        "--workers",
        "0",
        "--mosaic",
        "0",
        "--qupath",
        "none",
    )
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stdout.splitlines() if "cyto view " in line]
    assert len(said) == 1 and "unblinded" in said[0]
    folder = Path(said[0].split("cyto view ", 1)[1].split(" (")[0])
    assert len(open_view(folder)) == 1  # the folder it names opens


# --- the tile cache's bound ------------------------------------------------------------------


def _fake_slide_folder(root: Path, name: str, mb: int, used_s_ago: float) -> Path:
    """A slide's tile folder as another slide's viewing left it: ``mb`` MiB of tiles, last
    used ``used_s_ago`` seconds ago."""
    import time

    folder = root / "view-tiles" / name
    (folder / "p0" / "9").mkdir(parents=True)
    (folder / "key.json").write_text("{}")
    for i in range(mb):
        (folder / "p0" / "9" / f"{i}_0.jpeg").write_bytes(b"\xff" * 2**20)
    used = folder / "used"
    used.touch()
    t = time.time() - used_s_ago
    os.utime(used, (t, t))
    return folder


def _tile_url(info: dict, col: int, row: int = 0) -> str:
    return f"/tiles/0/{info['tiles_key']}/0/{info['max_level']}/{col}_{row}.jpeg"


def test_the_tile_cache_is_trimmed_to_its_cap_oldest_slide_first(scored, tmp_path):
    """Four other slides' tiles (3 MiB each) and this slide's; a cap of 8 MiB: at start the two
    least recently used are evicted, except the one another cyto view is showing (its lock
    held), and this slide's own folder is kept though it is the oldest. Serving this slide's
    tiles past the cap evicts the next oldest."""
    import time

    from cyto.view.cache import hold
    from cyto.view.folder import open_view
    from cyto.view.tiles import TilePyramid

    cache = tmp_path / "cache"
    (slide,) = open_view(scored)
    p = TilePyramid(slide, cache)
    p.close()
    mine = p.dir
    t = time.time() - 10_000  # this slide: viewed longest ago
    os.utime(mine / "used", (t, t))
    shown = _fake_slide_folder(cache, "shown-elsewhere", 3, 5000)
    _fake_slide_folder(cache, "old", 3, 4000)
    _fake_slide_folder(cache, "mid", 3, 3000)
    new = _fake_slide_folder(cache, "new", 3, 10)
    other_server = hold(shown)
    try:
        cap = 6 * 2**20 + 64 * 2**10
        with _client([slide], cache, tile_cache=cap) as c:
            left = {f.name for f in (cache / "view-tiles").iterdir()}
            assert left == {mine.name, shown.name, new.name}, left  # old, then mid: evicted
            # this slide's tiles take the folder past the cap: new goes, the shown one stays
            info = c.get("/api/slides/0").json()
            for col in range(12):
                assert c.get(_tile_url(info, col)).status_code == 200
                assert c.get(_tile_url(info, col, 1)).status_code == 200
            left = {f.name for f in (cache / "view-tiles").iterdir()}
            rendered = sum(f.stat().st_size for f in (mine / "p0").rglob("*.jpeg"))
        assert rendered > 64 * 2**10 and left == {mine.name, shown.name}, (rendered, left)
    finally:
        os.close(other_server)
    # a fresh start under a cap of 0 keeps only what is shown
    with _client([slide], cache, tile_cache="0"):
        assert {f.name for f in (cache / "view-tiles").iterdir()} == {mine.name}
    assert (mine / "used").stat().st_mtime > t + 5000  # closing recorded the use


def test_a_tile_evicted_under_a_running_server_is_rendered_again(scored, tmp_path, monkeypatch):
    """Another cyto view evicting this slide's folder (or the cache emptied by hand) while the
    server runs: the next request for a tile renders it again; one whose file vanishes between
    being found and being read too, never a 500."""
    import shutil as sh

    from cyto.view.folder import open_view

    (slide,) = open_view(scored)
    with _client([slide], tmp_path / "cache") as c:
        info = c.get("/api/slides/0").json()
        url = _tile_url(info, 3, 2)
        first = c.get(url)
        assert first.status_code == 200
        folder = tmp_path / "cache" / "view-tiles" / info["tiles_key"]
        tile = folder / "p0" / str(info["max_level"]) / "3_2.jpeg"
        assert tile.is_file()
        # found, then evicted before it is read
        read_bytes = Path.read_bytes

        def evicted_first(self):
            if self == tile:
                self.unlink(missing_ok=True)
            return read_bytes(self)

        monkeypatch.setattr(Path, "read_bytes", evicted_first)
        again = c.get(url)
        monkeypatch.undo()
        assert again.status_code == 200 and again.content == first.content
        # the whole folder gone
        sh.rmtree(folder)
        third = c.get(url)
        assert third.status_code == 200 and third.content == first.content
        assert tile.is_file()


def test_a_kept_tile_damaged_or_copied_from_elsewhere_is_rendered_again_and_said(scored, tmp_path):
    """A hostile check: a tile copied over another's file in the cache was served in its place
    (another region of the slide), and one overwritten with 8 bytes was served as is; both 200.
    Each kept tile is sealed to its place: neither is served, each is rendered again."""
    from cyto.errors import CytoWarning
    from cyto.view.folder import open_view

    (slide,) = open_view(scored)
    with _client([slide], tmp_path / "cache") as c:
        info = c.get("/api/slides/0").json()
        urls = {xy: _tile_url(info, *xy) for xy in ((0, 0), (1, 1), (2, 2))}
        first = {xy: c.get(u).content for xy, u in urls.items()}
        assert len(set(first.values())) == 3 and all(b[:2] == b"\xff\xd8" for b in first.values())
        level = (
            tmp_path / "cache" / "view-tiles" / info["tiles_key"] / "p0" / str(info["max_level"])
        )
        (level / "0_0.jpeg").write_bytes((level / "1_1.jpeg").read_bytes())  # another place's
        (level / "2_2.jpeg").write_bytes(b"GARBAGE\n")
        with pytest.warns(CytoWarning, match="does not match its seal") as said:
            again = {xy: c.get(u) for xy, u in urls.items()}
        assert all(r.status_code == 200 for r in again.values())
        assert {xy: r.content for xy, r in again.items()} == first
        assert len([w for w in said if "does not match its seal" in str(w.message)]) == 1


def test_the_viewer_says_what_set_its_tile_cache_bound(scored, tmp_path, monkeypatch):
    """Hostile rounds 41 (12) and 42 (2): `cyto view` said "--tile-cache" of a bound the
    variable or the default set (the command resolved the bound before the server said it)."""
    from cyto.view.cache import CAP_ENV

    for env, words in ((None, "4.0 GiB: the default"), ("1GiB", f"1.0 GiB: ${CAP_ENV})")):
        if env is None:
            monkeypatch.delenv(CAP_ENV, raising=False)
        else:
            monkeypatch.setenv(CAP_ENV, env)
        server = Server(scored, cache=tmp_path / "c")
        server.kill()
        line = next(ln for ln in server.said if ln.startswith("tiles cached in"))
        assert f"of at most {words}" in line, line


def test_bad_tile_cache_sizes_give_one_readable_line(scored, monkeypatch):
    for bad in ("lots", "-1GiB", "4XB", "GiB", "1e9"):
        proc = run_cyto("view", str(scored), "--tile-cache", bad)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and "\n" not in err, (bad, proc.stderr)
        assert f"--tile-cache {bad!r} is not a size: give it like 4GiB" in err, err
    from cyto.view.cache import CAP_ENV, DEFAULT_CAP, cap_from, parse_size

    monkeypatch.setenv(CAP_ENV, "big")
    proc = run_cyto("view", str(scored))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and f"${CAP_ENV} 'big' is not a size" in err
    from cyto.view.cache import cap_source

    monkeypatch.setenv(CAP_ENV, "2GiB")
    assert cap_from(None) == 2 * 2**30 and cap_from("1.5G") == 3 * 2**29  # the option first
    # said by what set it (the variable's cap was credited to --tile-cache: hostile round 41)
    assert (cap_source(None), cap_source("1.5G")) == (f"${CAP_ENV}", "--tile-cache")
    monkeypatch.setenv(CAP_ENV, "  ")  # blank: unset
    assert cap_from(None) == DEFAULT_CAP and cap_source(None).startswith("the default")
    monkeypatch.delenv(CAP_ENV)
    assert cap_from(None) == DEFAULT_CAP == parse_size("4GiB")
    assert [parse_size(s) for s in ("0", "4096", "500MB", "500 MiB", "2kb")] == [
        0,
        4096,
        500 * 10**6,
        500 * 2**20,
        2000,
    ]


def test_a_running_viewer_says_when_its_folder_is_scored_again(scored, tmp_path):
    """Hostile round 9 (N19): a running `cyto view` kept serving the old ranks after its
    folder was scored again with other ranking (rank 2 was cell 10 in the viewer, cell 182 on
    disk), with no word. The ranks are refused in one line once the folder's seal changes."""
    from cyto.view.folder import open_view

    folder = tmp_path / "s"
    shutil.copytree(scored, folder)
    slides = open_view(folder)
    with _client(slides, tmp_path / "cache") as c:
        assert c.get("/api/slides/0/cells.bin").status_code == 200
        assert c.get("/api/slides/0").status_code == 200
        summary = folder / "summary.json"
        s = json.loads(summary.read_text())
        s["seconds"] = float(s["seconds"]) + 1.0  # scored again: a new summary, sealed anew
        summary.write_text(json.dumps(s))
        _reseal(folder)
        for path in ("/api/slides/0/cells.bin", "/api/slides/0"):
            r = c.get(path)
            assert r.status_code == 409, (path, r.status_code)
            assert "was scored again since cyto view opened it" in r.text, r.text


@pytest.mark.parametrize("stop", ["SIGHUP", "SIGTERM"])
def test_a_closed_terminal_stops_the_viewer_as_sigterm_does(scored, tmp_path, stop):
    """A closed terminal's SIGHUP reached cyto's handler inside the server's event loop: a
    traceback (CancelledError) before "stopped (SIGHUP)" (hostile round 59, 1). The server
    takes it as its own stop, as SIGTERM: no traceback, the stop's line and exit code."""
    import signal
    import urllib.request

    server = Server(scored, cache=tmp_path / "cache")
    try:
        with urllib.request.urlopen(server.url, timeout=30) as r:  # serving
            assert r.status == 200
        server.proc.send_signal(getattr(signal, stop))
        rest = server.proc.stdout.read()
        code = server.proc.wait(timeout=60)
    finally:
        if server.proc.poll() is None:
            server.kill()
    assert code == {"SIGHUP": 129, "SIGTERM": 143}[stop], rest
    assert "Traceback" not in rest and rest.rstrip().endswith(f"stopped ({stop})"), rest
