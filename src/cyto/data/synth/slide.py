"""Synthetic whole-slide images with planted abnormal cells and a ground-truth table.

The slide is drawn in blocks of 512 x 512 px, one row of blocks at a time, and each row is pushed
through the pyramid writers straight away, so a 40,000 x 40,000 px slide with 10^5 cells is made in
memory that depends on its width only. Optional focal planes (a z-stack) draw every cell with a blur
that grows with its distance from the cell's own plane of best focus.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from cyto.data.synth.cells import (
    ABNORMAL_CLASSES,
    CELL_CLASSES,
    DEFAULT_SCALE,
    MPP_AT_SCALE_1,
    NORMAL_CLASS,
    StainStyle,
    od_to_rgb,
    sample_cell,
)
from cyto.data.synth.formats import SUFFIX_FORMATS, SlideFormat
from cyto.data.synth.scene import (
    KIND_DEBRIS,
    KIND_RBC,
    Scene,
    WindowCache,
    background_objects,
    cell_objects,
    render_od,
)
from cyto.data.synth.tiffio import (
    ASCII,
    FLOAT,
    LONG,
    NDPI_FORMAT_FLAG,
    NDPI_SOURCELENS,
    NDPI_XOFFSET,
    NDPI_YOFFSET,
    NDPI_ZOFFSET,
    RATIONAL,
    SHORT,
    SLONG,
    NdpiLevel,
    Page,
    Tag,
    TiledLevel,
    assemble,
)
from cyto.errors import ConfigError, InputPathError
from cyto.flags import (
    JpegQuality,
    Positive,
    check_mpp,
    check_seed,
    check_value,
    named,
    passing,
    said,
)
from cyto.outputs_check import refuse_to_replace
from cyto.progress import progress
from cyto.staging import dir_beside
from cyto.tables import json_text
from cyto.version import __version__

BLOCK = 512


@dataclass(frozen=True)
class SlideSynthConfig:
    """What ``cyto synth slide`` draws.

    Attributes:
        width, height: level-0 size in px, at least 512, rounded up to a multiple of 512.
        n_cells: nucleated cells; default: one per (69 x scale)^2 px of smear (about 10^5 on a
            40,000 x 40,000 px slide at the default scale).
        abnormal_fraction: share of abnormal cells (the witness rate), planted exactly.
        abnormal_classes: which abnormal classes to plant.
        planes: focal planes in um (e.g. ``(-1.0, 0.0, 1.0)``); 0 is the main plane.
        tile: tile size of the TIFF pyramid, and restart-interval width of NDPI levels.
        quality: JPEG quality.
        seed: the same seed gives the same bytes; with another ``abnormal_fraction``, the same
            slide but for the cells planted.
        scale: length scale of cells, as for synthetic patches.
        mpp: microns per pixel written in the metadata; default: 0.18 / scale.
        objective: objective magnification written in the metadata.
        stain_seed: draw the staining and illumination style from this seed instead of from
            ``seed``: slides with one ``stain_seed`` come from one staining batch (their normal
            cells are exchangeable); by default every slide has its own style.
        defocus: um by which every plane is drawn away from the cells' plane of best focus
            (0: in focus): a slide scanned out of focus, for the adequacy checks.
        smear_extent: half-axes of the smear's ellipse as a share of the slide's width and
            height (0.46: the slide nearly covered; 0.1: mostly glass).
    """

    width: int = 8192
    height: int = 8192
    n_cells: int | None = None
    abnormal_fraction: float = 0.01
    abnormal_classes: tuple[str, ...] = ABNORMAL_CLASSES
    planes: tuple[float, ...] = (0.0,)
    tile: int = 256
    quality: int = 85
    seed: int = 0
    scale: float = DEFAULT_SCALE
    mpp: float | None = None
    objective: float = 60.0
    rbc_per_cell: float = 2.0
    debris_per_cell: float = 0.6
    stain_seed: int | None = None
    defocus: float = 0.0
    smear_extent: float = 0.46

    def __post_init__(self) -> None:
        if self.width < BLOCK or self.height < BLOCK:
            raise ConfigError(
                f"slide must be at least {BLOCK}x{BLOCK} px, got {self.width}x{self.height}"
            )
        if not 0.0 <= self.abnormal_fraction <= 1.0:
            raise ConfigError(
                f"{said('abnormal_fraction')} must be in [0, 1], got {self.abnormal_fraction}"
            )
        if self.n_cells is not None and self.n_cells < 0:
            raise ConfigError(f"{said('n_cells')} must be >= 0, got {self.n_cells}")
        if self.tile % 16 or not 64 <= self.tile <= BLOCK:
            raise ConfigError(
                f"{said('tile')} must be a multiple of 16 in [64, {BLOCK}], got {self.tile}"
            )
        if 0.0 not in self.planes or len(set(self.planes)) != len(self.planes):
            raise ConfigError(f"planes must be distinct and include 0.0, got {self.planes}")
        unknown = [c for c in self.abnormal_classes if c not in ABNORMAL_CLASSES]
        if unknown or not self.abnormal_classes:
            raise ConfigError(
                f"abnormal classes must be among {', '.join(ABNORMAL_CLASSES)}, "
                f"got {', '.join(self.abnormal_classes) or 'none'}"
            )
        for name in ("scale", "objective"):  # each named by its own flag, with its value
            if getattr(self, name) is not None:
                check_value(name, getattr(self, name), Positive)
        check_mpp("mpp", self.mpp)
        if not 0.02 <= self.smear_extent <= 0.5:
            raise ConfigError(
                f"{said('smear_extent')} must be in [0.02, 0.5], got {self.smear_extent}"
            )
        if not abs(self.defocus) <= 20.0:
            raise ConfigError(
                f"{said('defocus')} must be within 20 um of focus, got {self.defocus}"
            )
        check_value("quality", self.quality, JpegQuality)
        check_seed(self.seed)
        if self.stain_seed is not None:
            check_seed(self.stain_seed, "stain_seed")

    @property
    def microns_per_px(self) -> float:
        return self.mpp if self.mpp is not None else MPP_AT_SCALE_1 / self.scale

    @property
    def size(self) -> tuple[int, int]:
        """The level-0 size actually written (rounded up to whole blocks)."""
        return (-(-self.width // BLOCK) * BLOCK, -(-self.height // BLOCK) * BLOCK)


@dataclass(frozen=True)
class SlideLayout:
    """Where every object is: cells (with class) and the background clutter."""

    scene: Scene
    cell_x: np.ndarray
    cell_y: np.ndarray
    cell_class: np.ndarray  # index into CELL_CLASSES
    style: StainStyle


def smear_mask(x: np.ndarray, y: np.ndarray, w: int, h: int, extent: float = 0.46) -> np.ndarray:
    """Inside the smear: an ellipse leaving empty glass at the edges and corners."""
    return ((x - w / 2) / (extent * w)) ** 2 + ((y - h / 2) / (extent * h)) ** 2 <= 1.0


def cell_count(config: SlideSynthConfig) -> int:
    """The nucleated cells of a slide: ``n_cells``, or one per 69 x 69 px (at scale 1) of smear."""
    if config.n_cells is not None:
        return config.n_cells
    w, h = config.size
    e = config.smear_extent
    return int(np.pi * (e * w) * (e * h) / (69.0 * config.scale) ** 2)


# What drawing a slide holds in memory, measured (tracemalloc, 4096^2 and 8192^2 px slides at
# the default clutter): the layout peaks at about 450 bytes per cell while it is placed (its
# grid, the objects, their index) and keeps about 180 (every drawing process holds a copy); a
# row of blocks is 512 x width x 3 bytes per plane, and the writer's pyramid step makes a
# float32 copy of it (4 bytes a sample) beside the JPEG encoder's.
_LAYOUT_PEAK_PER_CELL = 450
_LAYOUT_KEPT_PER_CELL = 180
_STRIP_COPIES_MAIN = 7  # the row in hand, its float32 copy (4), the downsampled rows, the encoder
_STRIP_COPIES_WORKER = 2
_PROCESS_BASE = 150 << 20  # Python, numpy, the synthesis code


def memory_needed(config: SlideSynthConfig, workers: int) -> int:
    """Bytes drawing ``config`` with ``workers`` processes (0 or 1: in this process) needs at
    its peak, from :data:`_LAYOUT_PEAK_PER_CELL` and the rows in flight
    (:func:`_rendered_rows`): a layout in proportion to the slide's area, rows to its width."""
    w, _ = config.size
    n = cell_count(config)
    strip = len(config.planes) * BLOCK * w * 3
    need = _PROCESS_BASE + _LAYOUT_PEAK_PER_CELL * n + _STRIP_COPIES_MAIN * strip
    if workers > 1:
        need += (workers + 1) * strip  # rows drawn, waiting for their turn to be written
        need += workers * (_PROCESS_BASE + _LAYOUT_KEPT_PER_CELL * n + _STRIP_COPIES_WORKER * strip)
    return need


def available_memory() -> int | None:
    """Bytes this process can still take: the smaller of the machine's available memory
    (``MemAvailable``) and what is left under its cgroup's limit (a container's); None where
    neither can be read (off Linux)."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            cap, used = Path(limit).read_text().strip(), Path(usage).read_text().strip()
        except OSError:
            continue
        if cap.isdigit() and used.isdigit() and int(cap) < 1 << 60:  # "max": no limit
            found.append(max(int(cap) - int(used), 0))
        break
    return min(found) if found else None


def _drawing_processes(workers: int | None, rows: int) -> int:
    """How many processes :func:`_rendered_rows` draws with (1: this one)."""
    n = min(os.cpu_count() or 1, 4) if workers is None else workers
    return 1 if n <= 1 or rows < 4 else n


def check_memory(config: SlideSynthConfig, workers: int | None) -> None:
    """Refuse, before anything is allocated, a slide this machine has not the memory to draw:
    one line with the size asked, the memory it needs and the largest square slide that fits."""
    avail = available_memory()
    w, h = config.size
    n = _drawing_processes(workers, h // BLOCK)
    need = memory_needed(config, n)
    if avail is None or need <= avail:
        return
    from dataclasses import replace

    lo, hi = BLOCK, max(w, h)  # the largest square side (whole blocks, as asked) that fits
    while hi - lo > BLOCK:
        mid = (lo + hi) // 2 // BLOCK * BLOCK
        trial = replace(
            config,
            width=mid,
            height=mid,
            n_cells=None if config.n_cells is None else int(config.n_cells * mid * mid / (w * h)),
        )
        if memory_needed(trial, _drawing_processes(workers, mid // BLOCK)) <= avail:
            lo = mid
        else:
            hi = mid
    fewer = f" with {n} drawing processes ({named('workers')})" if n > 1 else ""
    raise ConfigError(
        f"{passing('width', config.width)} {passing('height', config.height)}: a {w:,} x {h:,} "
        "px slide of "
        f"{cell_count(config):,} cells needs about {_gib(need)} of memory to draw{fewer}, and "
        f"this machine has {_gib(avail)} available: the largest square slide that fits is "
        f"about {lo:,} x {lo:,} px; ask for a smaller one"
        + (f" or fewer {named('workers')}" if n > 1 else "")
    )


def _utf8(name: str) -> str:
    """A file name as UTF-8: the bytes of one that is not (``b"s-\\xff.tif"``) as ``\\xff``, as
    :func:`cyto.slides.base.printable` writes it for the score table's ``slide_id``."""
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def planted_words(fraction: float, n: int, planted: int) -> str | None:
    """What a slide's planted count says of the witness rate asked (``fraction`` of ``n``
    cells, rounded to ``planted``): a warning where none is planted, a note where the count
    puts the slide's own rate a quarter or more off the one asked (0.008 of 64 cells planted
    1, a slide at 1.6 %, unsaid: hostile round 68, 9); None otherwise."""
    if fraction <= 0 or n == 0:
        return None
    asked = passing("abnormal_fraction", float(f"{fraction:g}"))
    if planted == 0:
        return (
            f"warning: {asked} of {n} cells plants none ({n * fraction:.2g} rounds to 0): give "
            f"a larger slide, more {named('n_cells')} or a higher {named('abnormal_fraction')}"
        )
    share = planted / n
    if abs(share - fraction) < 0.25 * fraction:
        return None
    return (
        f"note: {asked} of {n} cells plants {planted} ({n * fraction:.2g} rounded): the slide's "
        f"witness rate is {share:.2%}, not {fraction:.2%}"
    )


#: the seed-sequence key of the planted cells' own generator (which cells and their classes),
#: apart from the layout's ``7``: lesions planted or not, the rest of the slide is drawn the same
PLANT_STREAM = 13


def layout(config: SlideSynthConfig) -> SlideLayout:
    """Place cells on a jittered grid inside the smear, plant abnormal cells, scatter clutter.

    One seed gives one slide whatever ``abnormal_fraction`` plants in it: the cells' places,
    their looks, the clutter and the stain are drawn alike (a paired negative)."""
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 7]))
    w, h = config.size
    e = config.smear_extent
    area = np.pi * (e * w) * (e * h)
    n = cell_count(config)
    margin = 30 * config.scale
    xs = ys = np.empty(0)
    spacing = np.sqrt(area / max(n, 1))
    min_spacing = 30.0 * config.scale  # closer than this, cells would pile on each other
    while spacing >= min_spacing:
        gx = np.arange(spacing / 2, w, spacing)
        gy = np.arange(spacing / 2, h, spacing)
        X, Y = np.meshgrid(gx, gy)
        X = X.ravel() + rng.uniform(-0.3, 0.3, X.size) * spacing
        Y = Y.ravel() + rng.uniform(-0.3, 0.3, Y.size) * spacing
        ok = smear_mask(X, Y, w, h, e) & (margin < X) & (w - margin > X)
        ok &= (margin < Y) & (h - margin > Y)
        xs, ys = X[ok], Y[ok]
        if len(xs) >= n:
            break
        spacing *= 0.95
    if len(xs) < n:
        raise ConfigError(f"{n} cells do not fit on a {w}x{h} slide; ask for fewer cells")
    pick = np.sort(rng.choice(len(xs), size=n, replace=False))
    xs, ys = xs[pick], ys[pick]
    # row-major order (top to bottom, then left to right) gives stable, readable cell ids
    order = np.lexsort((xs, np.floor(ys / BLOCK)))
    xs, ys = xs[order], ys[order]

    n_abn = int(round(n * config.abnormal_fraction))
    cls = np.full(n, CELL_CLASSES.index(NORMAL_CLASS), dtype=np.int8)
    if n_abn:  # from a stream of their own: one seed's slide with and without lesions is the
        # same slide, cell for cell, but for the planted ones (round 67, 4)
        plant = np.random.default_rng(np.random.SeedSequence([config.seed, PLANT_STREAM]))
        where = plant.choice(n, size=n_abn, replace=False)
        kinds = np.resize([CELL_CLASSES.index(c) for c in config.abnormal_classes], n_abn)
        cls[where] = plant.permutation(kinds)
    cells = cell_objects(xs, ys, cls, rng)

    def scatter(count: int) -> tuple[np.ndarray, np.ndarray]:
        px = rng.uniform(0, w, size=int(count * 1.4) + 8)
        py = rng.uniform(0, h, size=px.size)
        ok = smear_mask(px, py, w, h, e)
        return px[ok][:count], py[ok][:count]

    rx, ry = scatter(int(n * config.rbc_per_cell))
    dx, dy = scatter(int(n * config.debris_per_cell))
    scene = Scene.concat(
        [
            cells,
            background_objects(rx, ry, KIND_RBC, rng, config.scale),
            background_objects(dx, dy, KIND_DEBRIS, rng, config.scale),
        ],
        scale=config.scale,
    )
    scene.build_index(BLOCK)
    return SlideLayout(
        scene=scene, cell_x=xs, cell_y=ys, cell_class=cls, style=_style(rng, config.stain_seed)
    )


def _style(rng: np.random.Generator, stain_seed: int | None) -> StainStyle:
    """The slide's own style (drawn from its layout's generator, as always), or the one of the
    staining batch ``stain_seed``; the layout generator advances the same either way."""
    own = StainStyle.sample(rng)
    if stain_seed is None:
        return own
    return StainStyle.sample(np.random.default_rng(np.random.SeedSequence([stain_seed, 11])))


def _illumination(x0: int, y0: int, w: int, h: int, fov: int = 1024) -> np.ndarray:
    """Shading of each scanner field of view (fields are stitched into the slide).

    It depends on the block's position within a field only, so the few distinct patterns are
    computed once and reused (read-only) for every block of the slide.
    """
    return _field_shading(x0 % fov, y0 % fov, w, h, fov)


@functools.lru_cache(maxsize=64)
def _field_shading(x0: int, y0: int, w: int, h: int, fov: int) -> np.ndarray:
    yy, xx = np.mgrid[y0 : y0 + h, x0 : x0 + w].astype(np.float32)
    u = (xx % fov) / fov - 0.5
    v = (yy % fov) / fov - 0.5
    shading = (1.0 - 0.06 * (u * u + v * v)).astype(np.float32)
    shading.flags.writeable = False
    return shading


class RowRenderer:
    """Draws one row of blocks (all focal planes) of a slide; picklable for worker processes."""

    def __init__(self, lay: SlideLayout, seed: int, planes: tuple[float, ...], width: int) -> None:
        self.lay, self.seed, self.planes, self.width = lay, seed, planes, width
        self.cache = WindowCache()

    def __call__(self, by: int) -> list[np.ndarray]:
        strips = []
        for p, z in enumerate(self.planes):
            self.cache.clear()
            strip = np.empty((BLOCK, self.width, 3), dtype=np.uint8)
            for bx in range(self.width // BLOCK):
                x0, y0 = bx * BLOCK, by * BLOCK
                self.cache.drop_left_of(x0)
                od = render_od(self.lay.scene, x0, y0, BLOCK, BLOCK, self.lay.style, z, self.cache)
                noise = np.random.default_rng([self.seed, p, by, bx])
                strip[:, x0 : x0 + BLOCK] = od_to_rgb(
                    od, self.lay.style, noise, _illumination(x0, y0, BLOCK, BLOCK)
                )
            strips.append(strip)
        self.cache.clear()
        return strips


_WORKER_RENDERER: RowRenderer | None = None


def _init_worker(renderer: RowRenderer) -> None:
    global _WORKER_RENDERER
    _WORKER_RENDERER = renderer


def _render_in_worker(by: int) -> list[np.ndarray]:
    if _WORKER_RENDERER is None:
        raise RuntimeError("slide worker started without its renderer")
    return _WORKER_RENDERER(by)


def _rendered_rows(renderer: RowRenderer, rows: int, workers: int | None):
    """Rendered rows in order; at most ``workers + 1`` rows are in flight, so memory stays flat."""
    n = min(os.cpu_count() or 1, 4) if workers is None else workers
    if n <= 1 or rows < 4:
        for by in range(rows):
            yield renderer(by)
        return
    from collections import deque

    from cyto.interrupts import spawn_pool

    with spawn_pool(n, _init_worker, (renderer,)) as pool:
        pending: deque = deque()
        nxt = 0
        while nxt < rows or pending:
            while nxt < rows and len(pending) < n + 1:
                pending.append(pool.submit(_render_in_worker, nxt))
                nxt += 1
            yield pending.popleft().result()


def _downsample(strip: np.ndarray) -> np.ndarray:
    h, w = strip.shape[0] // 2 * 2, strip.shape[1] // 2 * 2
    s = strip[:h, :w].astype(np.float32)
    s = s.reshape(h // 2, 2, w // 2, 2, 3).mean(axis=(1, 3))
    return np.rint(s).astype(np.uint8)


def ndpi_tile(width: int, tile: int) -> int | None:
    """Restart-interval width (px) for an NDPI level: the widest multiple of 8 up to ``tile``
    that divides ``width``, at least 32 px (OpenSlide needs whole intervals per MCU row)."""
    if width % 8:
        return None
    mcus = width // 8
    for n in range(tile // 8, 3, -1):
        if mcus % n == 0:
            return n * 8
    return None


def _level_sizes(config: SlideSynthConfig, fmt: str) -> list[tuple[int, int]]:
    """Pyramid levels, halving until the long side is under 1024 px.

    A block row must give whole strips at every level (and, for NDPI, whole 8-row JPEG MCU rows
    and widths that are whole restart intervals).
    """
    w, h = config.size
    sizes = [(w, h)]
    while True:
        w2, h2 = w // 2, h // 2
        if max(w2, h2) < 512 or BLOCK >> len(sizes) < 8 or w % 2 or h % 2:
            break
        if fmt == "ndpi" and (ndpi_tile(w2, config.tile) is None or h2 % 8):
            break
        sizes.append((w2, h2))
        w, h = w2, h2
    return sizes


def ground_truth_table(lay: SlideLayout, slide_id: str):
    import pyarrow as pa

    names = np.array(CELL_CLASSES, dtype=object)
    n = len(lay.cell_x)
    radius = np.empty(n, dtype=np.float32)
    focus = np.empty(n, dtype=np.float32)
    for i in range(n):  # cells come first in the scene, in cell-id order
        spec = sample_cell(
            CELL_CLASSES[int(lay.cell_class[i])],
            np.random.default_rng(int(lay.scene.seed[i])),
            lay.scene.scale,
        )
        radius[i], focus[i] = spec.cell_radius, spec.focus_z
    return pa.table(
        {
            "slide_id": pa.array([slide_id] * len(lay.cell_x), pa.string()),
            "cell_id": pa.array(np.arange(len(lay.cell_x), dtype=np.int64)),
            "x": pa.array(lay.cell_x.astype(np.float64)),
            "y": pa.array(lay.cell_y.astype(np.float64)),
            "label": pa.array((lay.cell_class != CELL_CLASSES.index(NORMAL_CLASS)).astype(np.int8)),
            "class": pa.array(names[lay.cell_class.astype(np.int64)], pa.string()),
            "cell_radius": pa.array(radius),
            "focus_z": pa.array(focus),
        }
    )


def plane_path(out: Path, z: float) -> Path:
    """Where a TIFF z-stack writes plane ``z`` (plane 0 is ``out`` itself)."""
    if z == 0.0:
        return out
    return out.with_name(f"{out.stem}_z{z:+.2f}um{out.suffix}")


def ground_truth_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.cells.parquet")


@dataclass(frozen=True)
class SlideResult:
    paths: list[Path]
    ground_truth: Path
    size: tuple[int, int]
    n_cells: int
    n_abnormal: int
    levels: list[tuple[int, int]]


def write_slide(
    out: Path,
    config: SlideSynthConfig,
    fmt: SlideFormat | str | None = None,
    overwrite: bool = False,
    workers: int | None = None,
) -> SlideResult:
    """Draw a synthetic slide into ``out`` (``.tif``/``.tiff`` or ``.ndpi``) plus ground truth.

    Rows of blocks are drawn by ``workers`` processes (default: one per CPU, at most 4; 0 draws in
    this process) and written in order; the bytes do not depend on the number of workers. Files
    appear under their final names only when complete (atomic rename).
    """
    out = Path(out)
    fmt = slide_format(out, fmt)
    refuse_to_replace_slide(out, fmt, config.planes, overwrite)
    check_memory(config, workers)
    out.parent.mkdir(parents=True, exist_ok=True)  # as every other command's outputs
    from cyto.locks import folder_lock

    # one run at a time writes slides into this folder: another one waits, then finds the
    # slide written and is refused as a later run is (both said "wrote", one was lost)
    with folder_lock(out.parent):
        refuse_to_replace_slide(out, fmt, config.planes, overwrite)
        return _write_slide(out, fmt, config, workers)


def _write_slide(out: Path, fmt: str, config: SlideSynthConfig, workers: int) -> SlideResult:
    lay = layout(config)
    planes = sorted(config.planes, key=lambda z: (z != 0.0, z))
    # a defocused scan: every plane drawn that far from the cells' plane of best focus
    renderer = RowRenderer(
        lay, config.seed, tuple(z + config.defocus for z in planes), config.size[0]
    )
    gt = ground_truth_table(lay, _utf8(out.stem))
    n_abnormal = int((lay.cell_class != CELL_CLASSES.index(NORMAL_CLASS)).sum())
    return write_pyramid(out, fmt, config, renderer, gt, n_abnormal, workers)


def slide_format(out: Path, fmt: SlideFormat | str | None) -> str:
    """The container of ``out``: ``fmt``, else from its suffix; one line when neither says, or
    when they disagree (an NDPI written under ``.tif``: readers go by the name; round 28, 12)."""
    named = SUFFIX_FORMATS.get(out.suffix.lower())
    if fmt is None:
        if named is None:
            raise InputPathError(
                f"cannot tell the slide format from {out.name!r}: end the name "
                f"in .tif, .tiff or .ndpi, or pass {said('fmt')}"
            )
        fmt = named
    try:
        fmt = SlideFormat(fmt)
    except ValueError as exc:
        raise ConfigError(f"unknown slide format {fmt!r}; known: tiff, ndpi") from exc
    if named is not None and fmt != named:
        suffix = ".ndpi" if fmt is SlideFormat.ndpi else ".tif"
        raise ConfigError(
            f"{passing('fmt', fmt.value)} and the name {out.name!r} ({named.value}) disagree: "
            f"name the file {suffix}, or leave out {said('fmt')}"
        )
    return fmt.value


def refuse_to_replace_slide(out: Path, fmt: str, planes, overwrite: bool) -> None:
    """Every file a slide writes (its planes, its ground truth) is replaced only with
    ``overwrite``, and only when it is a synthetic slide's own (:func:`synthetic_file`): a
    user's file under one of those names is refused with or without it, naming it."""
    from cyto.outputs_check import refuse_foreign

    targets = [out] if fmt == "ndpi" else [plane_path(out, z) for z in planes]
    targets.append(ground_truth_path(out))
    for target in targets:
        # a user's own file is refused as such at once: the advice to pass overwrite, which
        # then refused it too, came first (hostile round 28, 13)
        if target.exists() and not synthetic_file(target):
            refuse_foreign([target.name], str(target.parent))
        refuse_to_replace(target, overwrite, name=str(target))


def synthetic_file(path: Path) -> bool:
    """Whether ``path`` is a file ``cyto synth slide`` wrote: a TIFF whose description is its
    record (``cyto_synthetic``), or a ground-truth table carrying ``cyto.synthetic``."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head == b"PAR1":
            import pyarrow.parquet as pq

            return b"cyto.synthetic" in (pq.read_schema(path).metadata or {})
        if head[:2] in (b"II", b"MM"):
            import tifffile

            with tifffile.TiffFile(path) as tif:
                text = tif.pages[0].description or ""
            return json.loads(text).get("cyto_synthetic") is not None
    except Exception:  # unreadable, not JSON, not a table: not ours
        return False
    return False


def write_pyramid(
    out: Path, fmt: str, config, renderer, gt_table, n_abnormal: int, workers: int | None
) -> SlideResult:
    """Write the rows ``renderer(by)`` draws (one list of strips per row of blocks, a strip per
    focal plane of ``config.planes``) as the pyramid of ``out``, and ``gt_table`` beside it.
    ``config`` gives the size, tile, quality, planes, pixel size and objective (a
    :class:`SlideSynthConfig`, or one with the same fields)."""
    import pyarrow.parquet as pq

    from cyto.interrupts import refuse_unguarded

    if workers != 0:
        # a public call from a script's top level is refused at every size, not only where a
        # pool starts (a script tried on a small slide failed once it grew: round 29, 12), and
        # only once every argument is checked (the guard answered a missing mpp first: round 73)
        refuse_unguarded()
    w, h = config.size
    sizes = _level_sizes(config, fmt)
    planes = sorted(config.planes, key=lambda z: (z != 0.0, z))
    tmpdir = dir_beside(out, "writing")
    spools: dict[tuple[int, int], tuple[Path, BinaryIO]] = {}
    levels: dict[tuple[int, int], TiledLevel | NdpiLevel] = {}
    try:
        for p in range(len(planes)):
            for li, (lw, lh) in enumerate(sizes):
                path = tmpdir / f"p{p}_l{li}.spool"
                spools[p, li] = (path, open(path, "wb"))  # noqa: SIM115 - closed in finally
                if fmt == "ndpi":
                    tile = ndpi_tile(lw, config.tile)
                    levels[p, li] = NdpiLevel(lw, lh, tile, config.quality, spools[p, li][1])
                else:
                    levels[p, li] = TiledLevel(
                        lw, lh, config.tile, config.quality, spools[p, li][1]
                    )
        rows = h // BLOCK
        with progress(f"synth slide {out.name}", total=rows, unit="rows") as bar:
            for strips in _rendered_rows(renderer, rows, workers):
                for p, strip in enumerate(strips):
                    s = strip
                    for li in range(len(sizes)):
                        if li:
                            s = _downsample(s)
                        levels[p, li].push(s)
                bar.advance()
        for key, level in levels.items():
            level.finish()
            spools[key][1].close()

        results = []
        describe = {
            "cyto_synthetic": __version__,
            "seed": config.seed,
            "mpp": config.microns_per_px,
            "objective": config.objective,
            "n_cells": gt_table.num_rows,
            "config": json.loads(json.dumps(asdict(config), default=str)),
        }
        if fmt == "ndpi":
            pages = []
            for p, z in enumerate(planes):
                for li, (lw, lh) in enumerate(sizes):
                    tags = _common_tags(lw, lh, config, li, describe | {"z_um": z}, ndpi=True)
                    tags += [
                        Tag(NDPI_FORMAT_FLAG, LONG, (1,)),
                        Tag(NDPI_SOURCELENS, FLOAT, (config.objective / 2**li,)),
                        Tag(NDPI_XOFFSET, SLONG, (0,)),
                        Tag(NDPI_YOFFSET, SLONG, (0,)),
                        Tag(NDPI_ZOFFSET, SLONG, (int(round(z * 1000)),)),
                        Tag(271, ASCII, "Hamamatsu"),
                        Tag(272, ASCII, "cyto synthetic NanoZoomer-like"),
                    ]
                    pages.append(Page(levels[p, li], spools[p, li][0], tags))
            partial = tmpdir / "slide.partial"
            assemble(partial, pages, ndpi=True)
            os.replace(partial, out)
            results.append(out)
        else:
            for p, z in enumerate(planes):
                pages = [
                    Page(
                        levels[p, li],
                        spools[p, li][0],
                        _common_tags(lw, lh, config, li, describe | {"z_um": z}, ndpi=False),
                    )
                    for li, (lw, lh) in enumerate(sizes)
                ]
                partial = tmpdir / f"plane{p}.partial"
                assemble(partial, pages, ndpi=False)
                target = plane_path(out, z)
                os.replace(partial, target)
                results.append(target)
        gt = ground_truth_path(out)
        table = gt_table.replace_schema_metadata(
            {
                b"cyto.synthetic": json_text(describe).encode(),
                b"cyto.slide": _utf8(out.name).encode(),
            }
        )
        with open(tmpdir / "gt.parquet", "wb") as fh:  # Arrow takes a path in UTF-8 only
            pq.write_table(table, fh)
        os.replace(tmpdir / "gt.parquet", gt)
    finally:
        for _, fh in spools.values():
            fh.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
    return SlideResult(
        paths=results,
        ground_truth=gt,
        size=(w, h),
        n_cells=gt_table.num_rows,
        n_abnormal=n_abnormal,
        levels=sizes,
    )


def _common_tags(
    w: int, h: int, config: SlideSynthConfig, level: int, describe: dict, ndpi: bool
) -> list[Tag]:
    px_per_cm = 10000.0 / (config.microns_per_px * 2**level)
    tags = [
        Tag(254, LONG, (0 if level == 0 else 1,)),
        Tag(256, LONG, (w,)),
        Tag(257, LONG, (h,)),
        Tag(258, SHORT, (8, 8, 8)),
        Tag(259, SHORT, (7,)),  # JPEG
        Tag(262, SHORT, (6,)),  # YCbCr
        Tag(270, ASCII, json_text(describe | {"level": level})),
        Tag(277, SHORT, (3,)),
        Tag(282, RATIONAL, ((int(round(px_per_cm * 1000)), 1000),)),
        Tag(283, RATIONAL, ((int(round(px_per_cm * 1000)), 1000),)),
        Tag(284, SHORT, (1,)),
        Tag(296, SHORT, (3,)),  # centimetre
        Tag(305, ASCII, f"cyto {__version__}"),
        Tag(530, SHORT, (1, 1)),  # 4:4:4
    ]
    if not ndpi:
        tags.append(Tag(532, RATIONAL, ((0, 1), (255, 1), (128, 1), (255, 1), (128, 1), (255, 1))))
    return tags
