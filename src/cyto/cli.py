"""The ``cyto`` command line: thin commands over the library.

Heavy libraries (torch, onnxruntime, pyvips, numba, numpy-heavy modules) are imported inside the
command bodies, so ``cyto --help`` starts fast. Library errors become one line on stderr and a
non-zero exit code; ``CYTO_DEBUG=1`` shows the full traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from cyto import __version__
from cyto.data.synth.formats import SlideFormat
from cyto.errors import CytoError

app = typer.Typer(
    name="cyto",
    help="Find the few malignant cells among ~10^5 normal ones on a whole-slide cytology image.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
synth_app = typer.Typer(
    help="Draw synthetic cytology data (the built-in demo data).", no_args_is_help=True
)
data_app = typer.Typer(help="Inspect cell-patch datasets.", no_args_is_help=True)
app.add_typer(synth_app, name="synth")
app.add_typer(data_app, name="data")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cyto {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """cyto: one-class models rank every cell of a slide by how abnormal it looks."""


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(s.strip() for s in text.split(",") if s.strip())


@synth_app.command("patches")
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
    seed: Annotated[int, typer.Option(help="Same seed, same bytes.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty OUT.")] = False,
) -> None:
    """Draw a class-folder dataset of stained cells: 'normal' plus abnormal morphologies."""
    from cyto.data.synth.cells import ABNORMAL_CLASSES
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    config = PatchSynthConfig(
        n_normal=n_normal,
        n_abnormal=n_abnormal,
        abnormal_classes=_csv(classes) or ABNORMAL_CLASSES,
        size=size,
        seed=seed,
        scale=scale,
    )
    counts = write_patches(out, config, overwrite=overwrite)
    total = sum(counts.values())
    typer.echo(
        f"wrote {total} patches to {out}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
    )


@synth_app.command("slide")
def synth_slide(
    out: Annotated[
        Path, typer.Argument(help="Slide file to write: NAME.tif, NAME.tiff or NAME.ndpi.")
    ],
    width: Annotated[
        int, typer.Option(help="Width in px (rounded up to a multiple of 512).")
    ] = 8192,
    height: Annotated[
        int, typer.Option(help="Height in px (rounded up to a multiple of 512).")
    ] = 8192,
    cells: Annotated[
        int | None, typer.Option(help="Nucleated cells (default: one per 140x140 px of smear).")
    ] = None,
    abnormal_fraction: Annotated[
        float, typer.Option(help="Share of planted abnormal cells (witness rate), 0..1.")
    ] = 0.01,
    classes: Annotated[
        str | None, typer.Option(help="Abnormal classes to plant, comma-separated (default: all).")
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
    seed: Annotated[int, typer.Option(help="Same seed, same bytes.")] = 0,
    workers: Annotated[
        int | None, typer.Option(help="Drawing processes (default: one per CPU, at most 4).")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Draw a whole slide with planted abnormal cells, plus NAME.cells.parquet (ground truth)."""
    from cyto.data.synth.cells import ABNORMAL_CLASSES
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.errors import ConfigError

    try:
        zs = tuple(float(z) for z in planes.split(",") if z.strip())
    except ValueError as exc:
        raise ConfigError(f"--planes must be numbers separated by commas, got {planes!r}") from exc
    config = SlideSynthConfig(
        width=width,
        height=height,
        n_cells=cells,
        abnormal_fraction=abnormal_fraction,
        abnormal_classes=_csv(classes) or ABNORMAL_CLASSES,
        planes=zs,
        tile=tile,
        quality=quality,
        scale=scale,
        seed=seed,
    )
    res = write_slide(out, config, fmt=fmt, overwrite=overwrite, workers=workers)
    w, h = res.size
    typer.echo(
        f"wrote {', '.join(map(str, res.paths))} ({w}x{h} px, {len(res.levels)} levels, "
        f"{res.n_cells} cells, {res.n_abnormal} abnormal) and {res.ground_truth}"
    )


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
    split = one_class_split(info.classes, normal, abnormal, path) if normal or abnormal else None
    if as_json:
        import json

        payload = {
            "source": str(info.source),
            "files": info.n_files,
            "classes": info.classes,
            "sizes": info.sizes,
            "modes": info.modes,
            "bags": info.bags,
            "unreadable": [{"path": str(p), "reason": r} for p, r in info.unreadable],
            "split": split,
        }
        typer.echo(json.dumps(payload, indent=2))
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
        typer.echo(
            f"one-class split: normal {split['normal']} ({', '.join(split['normal_classes'])}),"
            f" abnormal {split['abnormal']} ({', '.join(split['abnormal_classes'])}),"
            f" left out {split['excluded']}"
        )
    if info.unreadable:
        typer.echo(f"unreadable: {len(info.unreadable)}")
        for p, reason in info.unreadable:
            typer.echo(f"  {p}: {reason}")
    else:
        typer.echo("unreadable: 0")


@data_app.command("mosaic")
def data_mosaic_cmd(
    path: Annotated[Path, typer.Argument(help="Folder of class sub-folders, or a manifest.")],
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("mosaic.png"),
    per_class: Annotated[int, typer.Option(help="Images per class (one row each).")] = 8,
    tile: Annotated[int, typer.Option(help="Side of each image in the mosaic, px.")] = 128,
    seed: Annotated[int, typer.Option(help="Which images are picked.")] = 0,
) -> None:
    """A PNG with one labelled row of sample images per class, for a first look at a dataset."""
    from cyto.data.mosaic import class_mosaic

    class_mosaic(path, out, per_class=per_class, tile=tile, seed=seed)
    typer.echo(f"wrote {out}")


@app.command("demo")
def demo_cmd(
    out: Annotated[Path, typer.Option(help="Folder for everything the demo makes.")] = Path(
        "demo_out"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
) -> None:
    """The main job on built-in synthetic data, end to end, on the CPU."""
    from cyto.demo import run_demo

    run_demo(out, seed=seed, echo=typer.echo)


def main() -> None:
    """Entry point: run the app, turning library errors into one line and an exit code."""
    try:
        app()
    except CytoError as exc:
        if os.environ.get("CYTO_DEBUG") == "1":
            raise
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
