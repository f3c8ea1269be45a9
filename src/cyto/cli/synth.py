"""``cyto synth patches|slide`` and ``cyto demo``: synthetic data, and the main job on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import _csv, app, seed_option, synth_app
from cyto.data.synth.formats import SlideFormat


@synth_app.command(
    "patches", short_help="Draw a class-folder dataset of normal and abnormal cells."
)
def synth_patches(
    out: Annotated[Path, typer.Argument(help="Folder to create (one sub-folder per class).")],
    n_normal: Annotated[int, typer.Option(help="Normal (lymphocyte-like) patches.")] = 600,
    n_abnormal: Annotated[int, typer.Option(help="Patches per abnormal class.")] = 40,
    classes: Annotated[
        str | None,
        typer.Option(help="Abnormal classes to draw, comma-separated (default: all six)."),
    ] = None,
    size: Annotated[int, typer.Option(help="Patch side in pixels.")] = 192,
    scale: Annotated[float, typer.Option(help="Cell size (1.5: 100x oil look, 0.12 um/px).")] = 1.5,
    seed: Annotated[int, seed_option("Same seed, same bytes.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty OUT.")] = False,
) -> None:
    """Draw a class-folder dataset of stained cells: 'normal' plus abnormal morphologies."""
    from cyto.data.synth.cells import ABNORMAL_CLASSES, MPP_AT_SCALE_1
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    config = PatchSynthConfig(
        n_normal=n_normal,
        n_abnormal=n_abnormal,
        abnormal_classes=_csv(classes, "--classes") or ABNORMAL_CLASSES,
        size=size,
        seed=seed,
        scale=scale,
    )
    counts = write_patches(out, config, overwrite=overwrite, name=f"OUT {out}")
    total = sum(counts.values())
    mpp = round(MPP_AT_SCALE_1 / scale, 4)
    typer.echo(
        f"wrote {total} patches to {out} at {mpp} um/px: "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
        + f"; train with --set mpp={mpp} so cyto score can check a slide's scale"
    )


@synth_app.command(
    "slide", short_help="Draw a whole slide with planted abnormal cells and their truth."
)
def synth_slide(
    out: Annotated[
        Path, typer.Argument(help="Slide file to write: NAME.tif, NAME.tiff or NAME.ndpi.")
    ],
    width: Annotated[
        int, typer.Option(help="Width in px, at least 512 (rounded up to a multiple of 512).")
    ] = 8192,
    height: Annotated[
        int, typer.Option(help="Height in px, at least 512 (rounded up to a multiple of 512).")
    ] = 8192,
    cells: Annotated[
        Path | None,
        typer.Option(
            help="Compose the slide from this folder of real cell crops (one sub-folder per "
            "class): --normal's crops are the background, the --abnormal classes are planted at "
            "--abnormal-fraction; give the crops' --mpp."
        ),
    ] = None,
    n_cells: Annotated[
        int | None,
        typer.Option(
            help="Nucleated cells (default: one per 140x140 px of smear; with --cells: "
            "as many as fit)."
        ),
    ] = None,
    normal: Annotated[
        str | None, typer.Option(help="With --cells: the normal class(es), comma-separated.")
    ] = None,
    abnormal: Annotated[
        str | None,
        typer.Option(help="With --cells: the classes to plant (default: every other class)."),
    ] = None,
    mpp: Annotated[
        float | None,
        typer.Option(help="Microns per pixel of the slide (with --cells: of the crops, required)."),
    ] = None,
    abnormal_fraction: Annotated[
        float, typer.Option(help="Share of planted abnormal cells (witness rate), 0..1.")
    ] = 0.01,
    classes: Annotated[
        str | None,
        typer.Option(
            help="A drawn slide's abnormal classes to plant, comma-separated (default: all); "
            "with --cells, --abnormal names them."
        ),
    ] = None,
    planes: Annotated[
        str, typer.Option(help="Focal planes in um, comma-separated, including 0 (e.g. -1,0,1).")
    ] = "0",
    fmt: Annotated[
        SlideFormat | None,
        typer.Option("--format", help="Container; default: from the file name."),
    ] = None,
    tile: Annotated[
        int, typer.Option(help="Tile size (TIFF) / restart-interval width (NDPI).")
    ] = 256,
    quality: Annotated[int, typer.Option(help="JPEG quality.")] = 85,
    scale: Annotated[float, typer.Option(help="Cell size (1.5: 100x oil look, 0.12 um/px).")] = 1.5,
    defocus: Annotated[
        float,
        typer.Option(
            help="Draw every plane this many um from the cells' plane of best focus (a slide "
            "scanned out of focus; 0: in focus)."
        ),
    ] = 0.0,
    smear_extent: Annotated[
        float,
        typer.Option(
            help="Half-axes of the smear's ellipse as a share of the slide's width and height "
            "(0.46: nearly covered; 0.1: mostly glass). The default cell count follows its area."
        ),
    ] = 0.46,
    seed: Annotated[
        int,
        seed_option(
            "Same seed, same bytes; with another --abnormal-fraction, the same slide but for "
            "the cells planted."
        ),
    ] = 0,
    stain_seed: Annotated[
        int | None,
        typer.Option(
            help="Draw the stain and illumination from this seed, not from --seed: slides of "
            "one stain seed are one staining batch (default: each slide its own)."
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Drawing processes (default: one per CPU, at most 4).")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Draw a whole slide with planted abnormal cells, plus NAME.cells.parquet (ground truth)."""
    from cyto.data.synth.make import make_slide

    res = make_slide(
        out, cells=cells, width=width, height=height, n_cells=n_cells, normal=normal,
        abnormal=abnormal, mpp=mpp, abnormal_fraction=abnormal_fraction, classes=classes,
        planes=planes, fmt=fmt, tile=tile, quality=quality, scale=scale, defocus=defocus,
        smear_extent=smear_extent, seed=seed, stain_seed=stain_seed, workers=workers,
        overwrite=overwrite,
        echo=typer.echo,
    )  # fmt: skip
    w, h = res.size
    typer.echo(
        f"wrote {', '.join(map(str, res.paths))} ({w}x{h} px, {len(res.levels)} levels, "
        f"{res.n_cells} cells, {res.n_abnormal} abnormal) and {res.ground_truth}"
    )


@app.command("demo", short_help="The main job on built-in synthetic data, end to end.")
def demo_cmd(
    out: Annotated[Path, typer.Option(help="Folder for everything the demo makes.")] = Path(
        "demo_out"
    ),
    seed: Annotated[int, seed_option("Seed of the synthetic data.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace what a non-empty OUT holds.")] = False,
) -> None:
    """The main job on built-in synthetic data, end to end, on the CPU."""
    from cyto.demo import run_demo

    run_demo(out, seed=seed, echo=typer.echo, overwrite=overwrite)
