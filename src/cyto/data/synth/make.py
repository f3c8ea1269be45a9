"""One way to make a slide with its truth, for ``cyto synth slide`` and :func:`cyto.synth_slide`
alike: composed from a folder of real cell crops (``cells``, :mod:`cyto.data.synth.from_cells`)
or drawn (:mod:`cyto.data.synth.slide`). Both callers' options are checked here, and named in
the caller's words."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

from cyto.data.synth.formats import SlideFormat
from cyto.data.synth.slide import SlideResult, planted_words
from cyto.flags import JpegQuality, Mpp, Positive, Range, Seed, Share, SlideSide

#: the options of a drawn slide that a composed slide does not take: one given otherwise than
#: its default (:func:`make_slide`'s) is refused by name for a slide composed from ``cells``
DRAWN_ONLY = ("classes", "planes", "defocus", "scale", "smear_extent", "stain_seed")


def make_slide(
    out: Path,
    *,
    cells: Path | None = None,
    width: SlideSide = 8192,
    height: SlideSide = 8192,
    n_cells: Annotated[int | None, Range(0)] = None,
    normal: str | None = None,
    abnormal: str | None = None,
    mpp: Mpp | None = None,
    abnormal_fraction: Share = 0.01,
    classes: str | None = None,
    planes: str | Sequence[float] = "0",
    fmt: SlideFormat | str | None = None,
    tile: Annotated[int, Range(64, 512, "px, a multiple of 16")] = 256,
    quality: JpegQuality = 85,
    scale: Positive = 1.5,
    defocus: Annotated[float, Range(-20, 20, "um from the plane of best focus")] = 0.0,
    smear_extent: Annotated[float, Range(0.02, 0.5, "a share of the slide's sides")] = 0.46,
    seed: Seed = 0,
    stain_seed: Seed | None = None,
    workers: Annotated[int | None, Range(0)] = None,
    overwrite: bool = False,
    echo: Callable[[str], None] | None = None,
) -> SlideResult:
    """The slide ``out`` (``.tif``, ``.tiff`` or ``.ndpi``) and ``NAME.cells.parquet``: composed
    from ``cells`` (``normal``'s crops the background, ``abnormal``'s planted at
    ``abnormal_fraction``; ``mpp`` the crops' pixel size, required), else drawn."""
    from cyto.errors import ConfigError
    from cyto.flags import Placeholder, passing, said

    if cells is not None:
        import inspect

        from cyto.data.synth.from_cells import compose_slide

        given = locals()
        defaults = inspect.signature(make_slide).parameters
        drawn = [f for f in DRAWN_ONLY if not _same(given[f], defaults[f].default)]
        return compose_slide(
            out, cells, normal, abnormal, mpp, n_cells, abnormal_fraction, width, height, seed,
            tile, quality, fmt, overwrite, workers, echo, drawn,
        )  # fmt: skip
    if normal is not None or abnormal is not None:
        crops = passing("cells", Placeholder("DIR"))
        raise ConfigError(f"{said('normal')} and {said('abnormal')} name the classes of {crops}")
    res = _draw(out, width, height, n_cells, abnormal_fraction, classes, planes, fmt, tile,
                quality, scale, mpp, defocus, smear_extent, seed, stain_seed, workers,
                overwrite)  # fmt: skip
    planted = planted_words(abnormal_fraction, res.n_cells, res.n_abnormal)
    if planted and echo is not None:
        echo(planted)
    return res


def _same(value, default) -> bool:
    """``value`` is an option's default (the planes ``"0"`` given as ``[0.0]`` too)."""
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value] == [0.0] and default == "0"
    return value == default


def _draw(
    out, width, height, n_cells, abnormal_fraction, classes, planes, fmt, tile, quality, scale,
    mpp, defocus, smear_extent, seed, stain_seed, workers, overwrite,
) -> SlideResult:  # fmt: skip
    """A slide of drawn cells (:mod:`cyto.data.synth.slide`)."""
    from cyto.data.synth.cells import ABNORMAL_CLASSES
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.errors import ConfigError
    from cyto.flags import comma_list, said

    if isinstance(planes, str):
        try:
            zs = comma_list(planes, "planes", float)
        except ValueError as exc:
            raise ConfigError(
                f"{said('planes')} must be numbers separated by commas, got {planes!r}"
            ) from exc
    else:
        zs = tuple(float(z) for z in planes)
    drawn = comma_list(classes, "classes") if classes is not None else None
    config = SlideSynthConfig(
        width=width,
        height=height,
        n_cells=n_cells,
        abnormal_fraction=abnormal_fraction,
        abnormal_classes=drawn or ABNORMAL_CLASSES,
        planes=zs,
        tile=tile,
        quality=quality,
        scale=scale,
        seed=seed,
        stain_seed=stain_seed,
        defocus=defocus,
        smear_extent=smear_extent,
        mpp=mpp,
    )
    return write_slide(out, config, fmt=fmt, overwrite=overwrite, workers=workers)
