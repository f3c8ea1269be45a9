"""``cyto calibrate``: a model's slide-negative calibration, for p-values, FDR flags and burden."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import BUNDLE, StorageOption, app


@app.command("calibrate", short_help="Calibrate on negative slides: p-values, FDR flags, burden.")
def calibrate_cmd(
    model: Annotated[Path, typer.Argument(parser=BUNDLE, help="Model bundle to calibrate.")],
    tables: Annotated[
        list[str],
        typer.Argument(
            help="scores.parquet of slide-negative (healthy) slides, or their cyto score "
            "folders; one per slide; a path or a URL (s3://BUCKET/OUT/SLIDE, gs://...).",
            metavar="TABLES...",
        ),
    ],
    normalize: Annotated[
        str,
        typer.Option(
            help="median: centre each slide's scores on its own median (absorbs stain shifts "
            "between slides); median-iqr: also divide by its IQR; none: raw scores."
        ),
    ] = "median",
    overwrite: Annotated[
        bool, typer.Option(help="Replace the bundle's calibration if it has one.")
    ] = False,
    storage_option: StorageOption = None,
) -> None:
    """Calibrate a model on slides known to be negative, for p-values, FDR flags and burden.

    Keeps every score of those slides in the bundle (calibration.npz) and records the model,
    graph and scoring options they were made with. cyto score then gives each cell a conformal
    p-value, flags cells at a false discovery rate, and reports the abnormal burden with an
    interval and a slide-level test. Give several slides: the spread between normal slides is
    part of the interval, and each slide is checked against the others (leave one out).
    """
    from cyto.slides.remote import parse_options
    from cyto.stats.calibrate import calibrate_from_tables, calibrated_lines

    cal = calibrate_from_tables(
        model,
        tables,
        normalization=normalize,
        overwrite=overwrite,
        storage_options=parse_options(storage_option),
    )
    for line in calibrated_lines(model, cal):
        typer.echo(line)
