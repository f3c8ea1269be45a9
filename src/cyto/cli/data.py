"""``cyto data info|mosaic|field|cells``: cell-patch datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import StorageOption, data_app, seed_option
from cyto.tables import json_text


@data_app.command("info")
def data_info_cmd(
    path: Annotated[
        Path, typer.Argument(help="Folder of class sub-folders, or a CSV/Parquet manifest.")
    ],
    normal: Annotated[
        str | None, typer.Option(help="Normal class(es), comma-separated: also check the split.")
    ] = None,
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes, comma-separated (default: all others).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Classes, counts, image sizes and modes, and every unreadable file."""
    from cyto.data.dataset import data_info, one_class_split

    info = data_info(path)
    # the split of what train and predict read: the readable images
    split = one_class_split(info.readable, normal, abnormal, path) if normal or abnormal else None
    if as_json:
        payload = {
            "source": str(info.source),
            "files": info.n_files,
            "classes": info.classes,
            "sizes": info.sizes,
            "modes": info.modes,
            "bags": info.bags,
            "unreadable": [{"path": str(p), "reason": r} for p, r in info.unreadable],
            "split": split,
            "copies": info.copies,
        }
        typer.echo(json_text(payload, indent=2))
        return
    typer.echo(
        f"{info.source}: {info.n_files} files, {len(info.classes)} classes"
        + (f", {info.bags} bags" if info.bags else "")
    )
    width = max(len(c) for c in info.classes)
    for cls, n in info.classes.items():
        typer.echo(f"  {cls:<{width}}  {n:>6}")
    typer.echo("sizes: " + ", ".join(f"{s} ({n})" for s, n in info.sizes.items()))
    typer.echo("modes: " + ", ".join(f"{m} ({n})" for m, n in info.modes.items()))
    if split is not None:
        of = " of the readable images" if info.unreadable else ""
        typer.echo(
            f"one-class split{of}: normal {split['normal']} "
            f"({', '.join(split['normal_classes'])}), abnormal {split['abnormal']} "
            f"({', '.join(split['abnormal_classes'])}), left out {split['excluded']}"
        )
    if info.copies:
        typer.echo(f"copies: {info.copies}")
    if info.unreadable:
        typer.echo(f"unreadable: {len(info.unreadable)}")
        for p, reason in info.unreadable:
            typer.echo(f"  {p}: {reason}")
    else:
        typer.echo("unreadable: 0")


@data_app.command("mosaic", short_help="A PNG with a labelled row of sample images per class.")
def data_mosaic_cmd(
    path: Annotated[Path, typer.Argument(help="Folder of class sub-folders, or a manifest.")],
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("mosaic.png"),
    per_class: Annotated[int, typer.Option(help="Images per class (one row each).")] = 8,
    tile: Annotated[int, typer.Option(help="Side of each image in the mosaic, px.")] = 128,
    seed: Annotated[int, seed_option("Which images are picked.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out image.")] = False,
) -> None:
    """A PNG with one labelled row of sample images per class, for a first look at a dataset."""
    from cyto.data.mosaic import class_mosaic

    class_mosaic(
        path, out, per_class=per_class, tile=tile, seed=seed, overwrite=overwrite, echo=typer.echo
    )
    typer.echo(f"wrote {out}")


@data_app.command(
    "field", short_help="Centre crops of several sizes in one field of view, at their own scale."
)
def data_field_cmd(
    path: Annotated[Path, typer.Argument(help="Folder of class sub-folders, or a manifest.")],
    out: Annotated[
        Path, typer.Option(help="New folder: OUT/CLASS/*.png and OUT/field.csv (each source).")
    ],
    px: Annotated[
        int | None,
        typer.Option(help="Side of the field, px (default: the longest crop side: none is cut)."),
    ] = None,
    skip_unreadable: Annotated[
        bool, typer.Option(help="Skip and count unreadable images instead of stopping.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Replace OUT if cyto data field wrote it.")
    ] = False,
) -> None:
    """Crops cut to each cell's box (SIPaKMeD, Herlev): every crop centred in one square field
    at its own pixel size, padded with its edge colour or cut to its centre, never resampled,
    so every cell keeps its scale. cyto train and cyto predict refuse a folder of crops of
    several sizes; they take the new one."""
    from cyto.data.field import fit_field

    res = fit_field(
        path, out, px=px, overwrite=overwrite, skip_unreadable=skip_unreadable, echo=typer.echo
    )
    typer.echo(
        f"wrote {res['crops']} crops of {res['sizes']} size(s) in one {res['px']} px field "
        f"to {res['folder']} and {res['table']}"
    )


@data_app.command(
    "cells", short_help="Cut the cells of scored negative slides into a training folder."
)
def data_cells_cmd(
    scored: Annotated[
        list[str],
        typer.Argument(
            help="Output folders of cyto score (a slide's, or a cohort's) of slides "
            "known to be negative, as paths or URLs (s3://BUCKET/OUT/SLIDE)."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Dataset folder: OUT/LABEL/ and OUT/cells-LABEL.csv.")],
    label: Annotated[str, typer.Option(help="Class folder the cells go to.")] = "normal",
    per_slide: Annotated[
        int | None, typer.Option(help="At most this many cells per slide, drawn at random.")
    ] = None,
    seed: Annotated[int, seed_option("Which cells --per-slide draws.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT/LABEL if it exists.")] = False,
    storage_option: StorageOption = None,
) -> None:
    """Training cells from negative slides: every cell cyto score found, cut at the area the
    model saw, into a class folder for cyto train (the paper trains on such cells)."""
    from cyto.eval.scores import check_parquet
    from cyto.location import scored_folders
    from cyto.review.cells import harvest_cells, mpp_words
    from cyto.review.session import find_scored
    from cyto.slides.remote import parse_options

    options = parse_options(storage_option)
    scored = scored_folders(scored, options)
    for folder in find_scored(scored):  # a cut table: one line naming it, before any cell
        check_parquet(folder / "scores.parquet", "score its slide again with cyto score")
    res = harvest_cells(
        scored,
        out,
        label=label,
        per_slide=per_slide,
        seed=seed,
        overwrite=overwrite,
        echo=typer.echo,
        options=options,
    )
    typer.echo(
        f"wrote {res['cells']} cells of {res['slides']} slide(s) to {res['folder']} "
        f"and {res['manifest']}"
    )
    typer.echo(f"note: {mpp_words(res['mpp'])}")
