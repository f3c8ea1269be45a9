"""``cyto view``: the whole slide in a browser, every scored cell on it (unblinded)."""

from __future__ import annotations

from typing import Annotated

import typer

from cyto.cli._app import StorageOption, app


@app.command("view", short_help="Pan and zoom a scored slide: every cell, the map (unblinded).")
def view_cmd(
    scored: Annotated[
        str,
        typer.Argument(
            help="An output folder of cyto score: a slide's folder, or a cohort's folder of "
            "them; a path or a URL (s3://BUCKET/OUT/SLIDE: pulled to cyto's cache, checked "
            "through its seal).",
            metavar="SCORED",
        ),
    ],
    host: Annotated[
        str, typer.Option(help="Address to listen on; the default keeps it on this computer.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8766,
    unblind: Annotated[
        bool,
        typer.Option(
            "--unblind",
            help="Serve a folder whose blinded review (cyto review serve) is not finished.",
        ),
    ] = False,
    tile_cache: Annotated[
        str | None,
        typer.Option(
            "--tile-cache",
            metavar="SIZE",
            help="Most disk the tile cache (view-tiles/ in cyto's cache folder) may take, e.g. "
            "4GiB, 500MB, 0 (only the slides shown now); slides not viewed for longest are "
            "evicted first. Default: $CYTO_VIEW_TILE_CACHE, else 4GiB.",
        ),
    ] = None,
    storage_option: StorageOption = None,
) -> None:
    """Serve a page that shows a scored slide whole: pan and zoom at every level, each cell as a
    marker coloured by its score (or its FDR flag, with a calibrated model), the abnormality
    map at low zoom, the top cells (click one to go there), the tissue mask and the tiles the
    pipeline skipped, and the slide's summary.

    It UNBLINDS: it shows every cell's rank and score. It refuses a folder whose blinded review
    is not finished by every reviewer unless --unblind is given. Tiles are read from the slide
    file (or the URL it was scored from) on request and cached in cyto's cache folder
    (view-tiles/), keyed by the slide's identity, the cache kept to --tile-cache; beyond this
    computer (another --host) the page needs the access key printed with its address.
    """
    from cyto.view.cache import cap_from
    from cyto.view.folder import open_view
    from cyto.view.server import serve

    cap_from(tile_cache)  # a bad size fails before anything opens
    from cyto.errors import CytoError
    from cyto.location import scored_here
    from cyto.slides.remote import parse_options

    options = parse_options(storage_option)
    folder, where = scored_here(scored, options)
    try:
        slides = open_view(folder, unblind=unblind, options=options)
    except CytoError as exc:
        raise where.translated(exc) from None
    serve(slides, host=host, port=port, echo=typer.echo, tile_cache=tile_cache)
