"""Whole slides composed from a folder of real cell crops (``cyto synth slide --cells DIR``).

A slide of real cell appearance with a known truth: the normal class's crops are the background
population, the abnormal classes' crops are planted at a witness rate, each on a jittered grid a
little wider than a crop, so the crops never overlap. Each crop is pasted with its border feathered
into the glass (a tenth of its side), turned and flipped at random (eight ways), and the truth
table records where each crop's centre went (the point the crop was cut around: an annotated
nucleus in a set like CRIC), its class and its file. Detection, morphometry and ranking can then be
measured end to end on real cells: the nuclei the detector must find are the crops' own, and each
planted cell is one of the abnormal crops.

What it is not: a smear. Crops are tiles of other slides, so a cell's neighbours are pieces of
other fields, cut at the crop's edge, and the glass between crops is plain. Several crops of one
class often come from one image (CRIC): neighbouring crops of a slide share their colours only by
chance.

Crops of sizes apart (more than :data:`cyto.data.dataset.SIZE_SPREAD`) are refused, as every
reader of a crop folder refuses them; a crop of another size within it than the folder's most
common one is padded (smaller, or not square) with its own edge colour or cut about its centre
(larger), never resampled: all of a slide's pixels are of one size, ``mpp``, which the crops do
not state and the caller gives.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cyto.data.synth.slide import BLOCK, PLANT_STREAM, SlideResult, planted_words
from cyto.errors import ConfigError, DatasetError
from cyto.flags import JpegQuality, check_mpp, check_seed, check_value, named, passing, said

#: the share of a crop's side over which its border fades into the glass
FEATHER = 0.1


@dataclass(frozen=True)
class CellSlideConfig:
    """What ``cyto synth slide --cells`` draws.

    Attributes:
        cells: a folder of class sub-folders (or a manifest) of cell crops.
        normal: the normal class(es): the background population.
        abnormal: the classes planted (None: every other class).
        mpp: the crops' microns per pixel, written as the slide's (crops do not state it).
        abnormal_fraction: the share of planted cells (the witness rate), planted exactly.
        width, height: level-0 size in px, at least 512, rounded up to a multiple of 512.
        n_cells: cells placed (default: as many as the grid holds).
        spacing: the grid's step as a multiple of a crop's side (> 1: crops never overlap).
        seed: the same seed and crops give the same bytes.
    """

    cells: Path
    normal: tuple[str, ...]
    mpp: float
    abnormal: tuple[str, ...] | None = None
    abnormal_fraction: float = 0.01
    width: int = 8192
    height: int = 8192
    n_cells: int | None = None
    spacing: float = 1.15
    seed: int = 0
    tile: int = 256
    quality: int = 90
    objective: float = 40.0
    planes: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        if self.width < BLOCK or self.height < BLOCK:
            raise ConfigError(
                f"slide must be at least {BLOCK}x{BLOCK} px, got {self.width}x{self.height}"
            )
        if not 0.0 <= self.abnormal_fraction <= 1.0:
            raise ConfigError(
                f"{said('abnormal_fraction')} must be in [0, 1], got {self.abnormal_fraction}"
            )
        check_mpp("mpp", self.mpp)
        if self.n_cells is not None and self.n_cells < 1:
            raise ConfigError(
                f"{said('n_cells')} must be >= 1 for a slide composed from crops, got "
                f"{self.n_cells} (a slide of no cells is a drawn one)"
            )
        if not 1.0 <= self.spacing <= 4.0:
            raise ConfigError(f"spacing must be in [1, 4] crop sides, got {self.spacing}")
        if self.tile % 16 or not 64 <= self.tile <= BLOCK:
            raise ConfigError(
                f"{said('tile')} must be a multiple of 16 in [64, {BLOCK}], got {self.tile}"
            )
        check_value("quality", self.quality, JpegQuality)
        check_seed(self.seed)

    @property
    def microns_per_px(self) -> float:
        return self.mpp

    @property
    def size(self) -> tuple[int, int]:
        return (-(-self.width // BLOCK) * BLOCK, -(-self.height // BLOCK) * BLOCK)


@dataclass(frozen=True)
class CellPlacement:
    """Where each crop goes: its file, the top-left corner of its square on the slide, and which
    of the eight turns and flips it is drawn with."""

    paths: tuple[str, ...]
    x0: np.ndarray
    y0: np.ndarray
    turn: np.ndarray  # 0..7: rot90 count (0..3), flipped when >= 4
    side: int
    glass: tuple[int, int, int]


def _fit(img: np.ndarray, side: int) -> np.ndarray:
    """``img`` as a ``side`` square without resampling: squared, then padded with its edge
    colour or its centre cut (:func:`cyto.data.images.field_rgb`, the rule of every crop)."""
    from cyto.data.images import field_rgb, square_rgb

    return field_rgb(square_rgb(img), side)


def _alpha(side: int) -> np.ndarray:
    """(side, side, 1) float32 opacity: 1 inside, fading to 0 over the outer :data:`FEATHER`."""
    f = max(1.0, FEATHER * side)
    d = np.minimum(np.arange(side), np.arange(side)[::-1]) + 0.5
    ramp = np.clip(d / f, 0.0, 1.0)
    return (np.outer(ramp, ramp) ** 0.5)[..., None].astype(np.float32)


class CellRowRenderer:
    """Draws one row of blocks of a composed slide (picklable for worker processes): glass,
    then every crop whose square meets the row."""

    def __init__(self, place: CellPlacement, width: int) -> None:
        self.place, self.width = place, width

    @functools.cached_property
    def alpha(self) -> np.ndarray:
        return _alpha(self.place.side)

    def crop(self, i: int) -> np.ndarray:
        return _read_crop(self.place.paths[i], self.place.side)

    def __call__(self, by: int) -> list[np.ndarray]:
        p, side = self.place, self.place.side
        y_top = by * BLOCK
        strip = np.empty((BLOCK, self.width, 3), dtype=np.float32)
        strip[:] = p.glass
        for i in np.flatnonzero((p.y0 < y_top + BLOCK) & (p.y0 + side > y_top)):
            img = self.crop(int(i))
            t = int(p.turn[i])
            img = np.rot90(img, t % 4)
            if t >= 4:
                img = img[:, ::-1]
            ya, yb = max(int(p.y0[i]), y_top), min(int(p.y0[i]) + side, y_top + BLOCK)
            xa, xb = max(int(p.x0[i]), 0), min(int(p.x0[i]) + side, self.width)
            src = img[ya - int(p.y0[i]) : yb - int(p.y0[i]), xa - int(p.x0[i]) : xb - int(p.x0[i])]
            a = self.alpha[
                ya - int(p.y0[i]) : yb - int(p.y0[i]), xa - int(p.x0[i]) : xb - int(p.x0[i])
            ]
            dst = strip[ya - y_top : yb - y_top, xa:xb]
            dst *= 1.0 - a
            dst += a * src
        return [np.rint(strip).clip(0, 255).astype(np.uint8)]


@functools.lru_cache(maxsize=2048)
def _read_crop(path: str, side: int) -> np.ndarray:
    from cyto.data.images import read_image
    from cyto.errors import UnreadableImageError

    try:
        return _fit(read_image(Path(path)), side)
    except UnreadableImageError as exc:  # no --skip-unreadable here: advise only what helps
        raise UnreadableImageError(exc.path, exc.reason, None) from None


def _grey(records, n: int = 16) -> bool:
    """Whether the crops are greyscale: up to ``n`` of them, spread over the list, each with
    (nearly) equal colour channels (round 29, 4: a grey slide was composed without a word, where
    predict said it of the same crops)."""
    from cyto.data.images import read_image

    step = max(1, len(records) // n)
    seen = []
    for r in records[::step][:n]:
        try:
            img = read_image(Path(r.path)).astype(np.int16)
        except Exception:  # noqa: BLE001 - an unreadable crop is said where it is drawn
            continue
        seen.append(int((img.max(axis=2) - img.min(axis=2)).max()) <= 2)
    return bool(seen) and all(seen)


def _copies(records) -> str | None:
    """The line train and predict say of byte-identical crops (:func:`copies_words`), for the
    crops a slide is composed from."""
    import hashlib

    from cyto.data.images import copies_words

    digests = []
    for r in records:
        try:
            digests.append(hashlib.sha256(Path(r.path).read_bytes()).hexdigest())
        except OSError:  # an unreadable crop is said where it is drawn
            digests.append(None)
    return copies_words([r.path for r in records], digests, [r.cls for r in records])


def _grey_modes(paths: list[str]) -> str | None:
    """The line predict and train say of grayscale or 16-bit images (:func:`mode_words`), for
    the crops a slide is composed of, from their files' headers: such crops among colour ones
    went onto the slide without a word (hostile round 43, 5)."""
    from PIL import Image

    from cyto.data.images import mode_words, noted_mode

    notes = []
    for path in paths:
        try:
            with Image.open(path) as im:
                mode = noted_mode(im)
                if mode is not None:
                    notes.append((path, mode))
        except Exception:  # noqa: BLE001, S112 - an unreadable crop is said where it is drawn
            continue
    return mode_words(notes, len(paths))


def place_cells(config: CellSlideConfig, echo=None):
    """(placement, truth table, abnormal count) of a composed slide (see the module)."""
    import pyarrow as pa

    from cyto.data.dataset import (
        empty_class_words,
        load_records,
        refuse_mixed_sizes,
        resolve_classes,
    )

    records = load_records(Path(config.cells))
    known = {r.cls for r in records}
    normal_t, abnormal_t = resolve_classes(known, config.normal, config.abnormal, config.cells)
    empty = empty_class_words(config.cells, known, config.abnormal)
    if empty and echo is not None:
        echo(empty)
    normals = [r for r in records if r.cls in normal_t]
    abnormals = [r for r in records if r.cls in abnormal_t]
    if not normals:
        raise DatasetError(
            f"no crop of the normal class(es) {', '.join(normal_t)} in {config.cells}"
        )
    # crops of sizes apart are no one field of view: refused as every reader of a crop folder
    # refuses them (363 px blood cells were cut into 100 px Pap "NILM" crops: round 25, 24)
    sides = refuse_mixed_sizes(normals + abnormals, config.cells)  # the longer side of each
    if not sides:
        raise DatasetError("no readable crop among the chosen classes")
    side = sides.most_common(1)[0][0]
    odd = sum(n for s, n in sides.items() if s != side)
    cut = sum(n for s, n in sides.items() if s > side)
    if odd and echo is not None:
        echo(
            f"note: {odd} of {sum(sides.values())} crops are not {side} px a side, never "
            f"resampled: {odd - cut} padded with their edge colour, {cut} cut about their "
            "centre (a cell wider than the field loses its edges)"
        )
    if echo is not None and _grey(normals + abnormals):
        echo(
            "warning: the crops are greyscale (one value in every colour channel), so the slide "
            "is grey: its stain cannot be checked against a model's (cyto score says so), and "
            "a model trained on colour crops sees other cells; compose from colour crops"
        )
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 66]))
    w, h = config.size
    step = config.spacing * side
    gx = np.arange(step / 2, w - side / 2, step)
    gy = np.arange(step / 2, h - side / 2, step)
    X, Y = (a.ravel() for a in np.meshgrid(gx, gy))
    X = X + rng.uniform(-0.4, 0.4, X.size) * (step - side)
    Y = Y + rng.uniform(-0.4, 0.4, Y.size) * (step - side)
    n = len(X) if config.n_cells is None else config.n_cells
    if n > len(X) or n == 0:
        raise ConfigError(
            f"{n} cells of {side} px do not fit on a {w}x{h} slide (at most {len(X)}): ask for "
            "fewer cells or a larger slide"
        )
    pick = np.sort(rng.choice(len(X), size=n, replace=False))
    X, Y = X[pick], Y[pick]
    n_abn = int(round(n * config.abnormal_fraction))
    if n_abn and not abnormals:
        raise DatasetError(
            f"{passing('abnormal_fraction', config.abnormal_fraction)}: no crop of the abnormal "
            "classes "
            f"{', '.join(abnormal_t) or '(none)'} to plant"
        )
    # every place takes a normal crop, then the planted cells replace some, drawn from a stream
    # of their own: one seed's slide with and without lesions is the same slide but for the
    # planted cells (round 67, 4)
    chosen = [normals[i] for i in _draw(rng, len(normals), n)]
    order = rng.permutation(n)  # the normal crops' places
    chosen = [chosen[i] for i in order]
    plant = np.random.default_rng(np.random.SeedSequence([config.seed, PLANT_STREAM]))
    where = np.sort(plant.choice(n, size=n_abn, replace=False))  # anywhere on the grid
    for at, i in zip(where, _draw(plant, len(abnormals), n_abn), strict=True):
        chosen[at] = abnormals[i]
    if echo is not None:
        normal_fix = (
            f"give more crops of the normal class, a smaller slide or fewer {named('n_cells')}"
        )
        abnormal_fix = f"give more crops of those classes or a lower {named('abnormal_fraction')}"
        planted_at = set(where.tolist())
        used_normal = [str(r.path) for k, r in enumerate(chosen) if k not in planted_at]
        used_abnormal = [str(chosen[k].path) for k in where]
        for words in _reused(used_normal, len(normals), "normal", normal_t, normal_fix) + _reused(
            used_abnormal, len(abnormals), "planted abnormal", abnormal_t, abnormal_fix
        ):
            echo(words)
        planted = planted_words(config.abnormal_fraction, n, n_abn)  # none, or off the rate
        if planted:
            echo(planted)
        if not _grey(normals + abnormals):  # some grey crops among colour ones: said too
            grey = _grey_modes(sorted({str(r.path) for r in chosen}))
            if grey:
                echo(f"warning: {grey}")
        copies = _copies(normals + abnormals)  # "each crop used up to 7 times" undercounted
        if copies:  # a cell whose crop is in the folder 8 times (round 45, 7)
            echo(f"warning: {copies}")
    label = np.array([0 if r.cls in normal_t else 1 for r in chosen], dtype=np.int8)
    glass = _glass([r.path for r in normals[:: max(1, len(normals) // 200)]], side)
    x0 = np.rint(X - side / 2).astype(np.int64)
    y0 = np.rint(Y - side / 2).astype(np.int64)
    place = CellPlacement(
        tuple(str(r.path) for r in chosen), x0, y0, rng.integers(0, 8, n), side, glass
    )
    truth = pa.table(
        {
            "cell_id": pa.array(np.arange(n, dtype=np.int64)),
            "x": pa.array((x0 + (side - 1) / 2).astype(np.float64)),
            "y": pa.array((y0 + (side - 1) / 2).astype(np.float64)),
            "label": pa.array(label),
            "class": pa.array([r.cls for r in chosen], pa.string()),
            "source": pa.array([r.path.name for r in chosen], pa.string()),
            "cell_radius": pa.array(np.full(n, side / 2, dtype=np.float32)),
            "focus_z": pa.array(np.zeros(n, dtype=np.float32)),
        }
    )
    return place, truth, n_abn


def _reused(used: list[str], pool: int, what: str, classes, fix: str) -> list[str]:
    """A note when the places of ``used`` (the crop each takes) take a crop of a pool of
    ``pool`` more than once, so the slide holds copies of one cell (a recall then counts
    copies: 34 planted ASC-H cells were 7 crops, said nowhere), and ``fix``: what lowers it for
    that pool (a lower --abnormal-fraction was advised for the normal crops too, which it only
    draws more of: hostile round 25)."""
    from collections import Counter

    most = max(Counter(used).values(), default=0)
    if most <= 1:
        return []
    return [
        f"note: {len(used)} {what} cells from {pool} crop(s) of {', '.join(classes)}: each crop "
        f"is used up to {most} times, so the slide holds copies of one cell (the recall counts "
        f"them each); {fix}"
    ]


def _draw(rng, pool: int, k: int) -> np.ndarray:
    """``k`` indices into a pool of ``pool``: each at most once while the pool lasts, then round
    again (every crop used before any is used twice)."""
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    rounds = -(-k // pool)
    return np.concatenate([rng.permutation(pool) for _ in range(rounds)])[:k]


def _glass(paths, side: int) -> tuple[int, int, int]:
    """The glass colour: the brightest tenth of the crops' corner pixels, their median."""
    corners = []
    for p in paths:
        img = _read_crop(str(p), side)
        corners.append(np.concatenate([img[:4, :4].reshape(-1, 3), img[-4:, -4:].reshape(-1, 3)]))
    px = np.concatenate(corners).astype(np.float64)
    bright = px[px.sum(axis=1) >= np.percentile(px.sum(axis=1), 90)]
    return tuple(int(v) for v in np.median(bright, axis=0))


def write_cell_slide(
    out: Path, config: CellSlideConfig, fmt=None, overwrite: bool = False,
    workers: int | None = None, echo=None,
) -> SlideResult:  # fmt: skip
    """Compose ``config.cells``' crops into the slide ``out`` (``.tif``/``.tiff``/``.ndpi``)
    and its truth table ``NAME.cells.parquet`` (see the module)."""
    import pyarrow as pa

    from cyto.data.synth.slide import (
        _utf8,
        refuse_to_replace_slide,
        slide_format,
        write_pyramid,
    )

    out = Path(out)
    fmt = slide_format(out, fmt)
    refuse_to_replace_slide(out, fmt, config.planes, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    place, truth, n_abn = place_cells(config, echo)
    truth = truth.add_column(0, "slide_id", pa.array([_utf8(out.stem)] * truth.num_rows))
    renderer = CellRowRenderer(place, config.size[0])
    return write_pyramid(out, fmt, config, renderer, truth, n_abn, workers)


#: the options of every slide, drawn or composed: its container, workers and overwrite
_EVERY_SLIDE = ("fmt", "workers", "overwrite")
#: compose_slide's parameters that are no option of a composed slide's own: the slide and
#: the crops, the options of every slide and the plumbing
_NOT_COMPOSED = frozenset({"out", "cells", "echo", "drawn", *_EVERY_SLIDE})


def composed_options() -> list[str]:
    """The options of ``cyto synth slide`` (and :func:`cyto.synth_slide`) a slide composed from
    ``cells`` takes, beside those of every slide, in the caller's words: read from
    :func:`compose_slide`'s parameters, so the refusal of a drawn slide's option lists what is
    taken (it left out ``--seed``, ``--tile`` and ``--quality``)."""
    import inspect

    from cyto.flags import named

    names = inspect.signature(compose_slide).parameters
    return [named(name) for name in names if name not in _NOT_COMPOSED]


def compose_slide(
    out, cells, normal, abnormal, mpp, n_cells, abnormal_fraction, width, height, seed, tile,
    quality, fmt, overwrite, workers, echo, drawn: list[str],
) -> SlideResult:  # fmt: skip
    """A slide composed from the crops of ``cells``: the options checked (``drawn``: the
    fields of a drawn slide's options given, which a composed slide does not take), then
    :func:`write_cell_slide`. Messages name options in the caller's words (``--mpp`` at the
    command line, ``mpp=`` from Python)."""
    from cyto.flags import UM_PER_PX, Placeholder, named, passing, said

    crops = passing("cells", Placeholder("DIR"))
    if drawn:  # what it takes, its own and every slide's (round 68: the list read as all)
        *most, last = composed_options()
        *every, final = (named(f) for f in _EVERY_SLIDE)
        raise ConfigError(
            f"{', '.join(named(f) for f in drawn)}: "
            f"{'options' if len(drawn) > 1 else 'an option'} of a drawn slide; a slide composed "
            f"from {named('cells')} takes {', '.join(most)} and {last}, and every slide's "
            f"{', '.join(every)} and {final}"
        )
    if not Path(cells).exists() and str(cells).isdigit():
        raise ConfigError(
            f"{passing('cells', cells)}: {said('cells')} takes a folder of cell crops now; give "
            f"the number of cells with {passing('n_cells', int(str(cells)))}"
        )
    if not normal:
        raise ConfigError(
            f"{crops} needs {passing('normal', Placeholder('CLASS'))}: the crops of the "
            "background cells"
        )
    if mpp is None:
        raise ConfigError(
            f"{crops} needs {passing('mpp', UM_PER_PX)}: the crops' pixel size (crops do "
            "not state it), written as the slide's so cyto score measures and detects at the "
            "right size"
        )
    from cyto.data.dataset import parse_classes

    config = CellSlideConfig(
        cells=Path(cells), normal=parse_classes(normal), abnormal=parse_classes(abnormal),
        mpp=mpp, abnormal_fraction=abnormal_fraction, width=width, height=height,
        n_cells=n_cells, seed=seed, tile=tile, quality=quality,
    )  # fmt: skip
    return write_cell_slide(out, config, fmt, overwrite, workers, echo)
