"""The viewer's web server: a Starlette app served by uvicorn, read-only.

What it serves, and nothing else: its own page and assets (``cyto/view/static``, OpenSeadragon
vendored under ``static/vendor``, no CDN), each slide's description, cells (one binary array per
slide), abnormality map and skipped-region layer, and deep-zoom tiles addressed by numbers
(slide, pyramid key, plane, level, column, row) that are checked against the pyramid. No file
path comes from a request, so nothing outside the scored folder and the tile cache is reached.
It answers GET (and HEAD) only, with no request body (:data:`MAX_BODY`); the posture is
:mod:`cyto.localserver`'s: loopback names only in ``Host`` by default, an access key beyond this
computer, no framing, the page's own scripts only.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from cyto.localserver import LOCAL_HOSTS, AccessKey, SecurityHeaders, bind, posture, run_server

STATIC = Path(__file__).parent / "static"
MAX_BODY = 0  # the viewer takes no uploads: a request with a body is refused
#: a tile's URL holds its pyramid's key, so a browser may keep it (a new slide: a new URL)
TILE_CACHE = "private, max-age=86400, immutable"
#: the one inline style the page allows: OpenSeadragon 6.1.1's own ``<style>`` for touch screens,
#: by its hash (a new vendored version has another: the browser's console names it)
OSD_STYLE = "'sha256-9xTiqzfwFaL2SGb1rmr8gysEwVVjIvqWAgmZgqFqpEE='"
CSP = f"default-src 'self'; img-src 'self'; style-src 'self' {OSD_STYLE}; frame-ancestors 'none'"


def make_app(
    slides,
    cache_root: Path,
    hosts=LOCAL_HOSTS,
    access_key: str | None = None,
    tile_cache: int | str | None = None,
):
    """The Starlette app showing ``slides`` (:class:`cyto.view.folder.ViewSlide`), tiles cached
    under ``cache_root`` and that cache kept to ``tile_cache`` bytes (``--tile-cache``,
    :func:`cyto.view.cache.cap_from`), trimmed now and as it grows; with ``access_key``, nothing
    is served to a browser that has not opened the address holding it."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from cyto.errors import CytoError
    from cyto.view.cache import TileCache, cap_from
    from cyto.view.tiles import TilePyramid

    cache = TileCache(cache_root, cap_from(tile_cache))
    pyramids = [TilePyramid(s, cache_root, cache=cache) for s in slides]
    cache.trim()
    page = (STATIC / "index.html").read_text()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def slide_of(request):
        i = request.path_params["i"]
        return (slides[i], pyramids[i]) if 0 <= i < len(slides) else (None, None)

    async def index(request):
        return HTMLResponse(page)

    async def no_icon(request):  # browsers ask for one; the page has none
        return Response(status_code=204)

    def slide_list(request):
        return JSONResponse(
            {
                "slides": [
                    {"index": i, "name": s.name, "slide": s.slide.name, "cells": s.table.num_rows}
                    for i, s in enumerate(slides)
                ]
            }
        )

    def slide_info(request):
        s, p = slide_of(request)
        if s is None:
            return error(404, "no such slide")
        try:
            info = s.info(request.path_params["i"], p.tile)
        except CytoError as exc:  # its results written again since: one line, not stale ranks
            return error(409, str(exc))
        return JSONResponse({**info, "tiles_key": p.dir.name})

    def cells(request):
        s, _ = slide_of(request)
        if s is None:
            return error(404, "no such slide")
        try:
            return Response(s.cells_bin(), media_type="application/octet-stream")
        except CytoError as exc:
            return error(409, str(exc))

    def layer(request):
        s, _ = slide_of(request)
        if s is None:
            return error(404, "no such slide")
        name = request.path_params["name"]
        try:
            if name == "map.png":
                return Response(s.map_png()[0], media_type="image/png")
            if name == "map.json":
                return JSONResponse(s.map_png()[1])
            if name == "mask.png":
                return Response(s.mask_png(), media_type="image/png")
            if name == "skipped.json":
                return JSONResponse(s.skipped())
        except CytoError as exc:
            return error(500, f"the slide cannot be read: {exc}")
        return error(404, "no such layer")

    def tile(request):
        s, p = slide_of(request)
        pp = request.path_params
        if s is None or pp["key"] != p.dir.name:
            return error(404, "no such tile (reload the page)")
        where = (pp["plane"], pp["level"], pp["col"], pp["row"])
        if not p.exists(*where):
            return error(404, "no such tile")
        try:
            data = p.read(*where)  # a few kB: read here, in this worker thread
        except CytoError as exc:
            return error(500, f"the slide cannot be read there: {exc}")
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": TILE_CACHE})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        for p in pyramids:
            p.close()
        for s in slides:
            s.close()

    tiles = "/tiles/{i:int}/{key:str}/{plane:int}/{level:int}/{col:int}_{row:int}.jpeg"
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/favicon.ico", no_icon),
            Route("/api/slides", slide_list),
            Route("/api/slides/{i:int}", slide_info),
            Route("/api/slides/{i:int}/cells.bin", cells),
            Route("/api/slides/{i:int}/{name:str}", layer),
            Route(tiles, tile),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)),
            Middleware(SecurityHeaders, overrides={"Content-Security-Policy": CSP}),
            *(
                [Middleware(AccessKey, key=access_key, cookie="cyto_view_key", what="this viewer")]
                if access_key
                else []
            ),
        ],
        lifespan=lifespan,
        max_body_size=MAX_BODY,
    )
    app.state.tile_cache = cache
    return app


def _warm_quietly(slides) -> None:
    """The other slides' maps and masks, in a thread: a slide that fails is met, in its own
    words, when it is shown, and a Ctrl-C is the main thread's to say (a thread's traceback
    was printed: hostile round 62, 3)."""
    for s in slides:
        try:
            s.warm()
        except KeyboardInterrupt:
            return
        except Exception:  # noqa: BLE001 - said when the slide is asked for
            continue


def serve(
    slides,
    host: str = "127.0.0.1",
    port: int = 8766,
    cache_root: Path | None = None,
    echo=print,
    tile_cache: int | str | None = None,
) -> None:
    """Serve the viewer until Ctrl-C; prints the address first. ``tile_cache``: the tile
    cache's cap (:func:`cyto.view.cache.cap_from`)."""
    import threading

    from cyto.cachedir import cache_dir, size_words

    sock = bind(host, port)
    port = sock.getsockname()[1]
    hosts, access_key, shown = posture(host)
    # the first slide's map and mask before the address is given, so its first view waits for
    # neither; a cohort's other slides in the background
    if slides:
        slides[0].warm()
        threading.Thread(target=_warm_quietly, args=(slides[1:],), daemon=True).start()
    app = make_app(
        slides,
        cache_root or cache_dir(),
        hosts=hosts,
        access_key=access_key,
        tile_cache=tile_cache,
    )
    if access_key:
        echo(
            f"warning: listening on {host}, beyond this computer: the page opens only with the "
            "access key in the address below (printed once)"
        )
    n = sum(s.table.num_rows for s in slides)
    echo(
        f"viewer of {len(slides)} slide(s), {n} cells; it shows every cell's rank and score "
        "(unblinded)"
    )
    cache = app.state.tile_cache
    from cyto.view.cache import cap_source

    echo(
        f"tiles cached in {cache.root} ({size_words(cache.total)} of at most "
        f"{size_words(cache.cap)}: {cap_source(tile_cache)})"
    )
    address = f"http://{shown}:{port}/" + (f"?key={access_key}" if access_key else "")
    echo(f"open {address}  (Ctrl-C stops)")
    run_server(app, sock)
