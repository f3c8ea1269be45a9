"""Synthetic cell-patch datasets: one class folder per cell type, like the bone-marrow data."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from cyto.bundle import temp_dir_beside
from cyto.data.synth.cells import (
    ABNORMAL_CLASSES,
    CELL_CLASSES,
    DEFAULT_SCALE,
    NORMAL_CLASS,
    StainStyle,
    od_to_rgb,
)
from cyto.data.synth.scene import (
    KIND_DEBRIS,
    KIND_RBC,
    Scene,
    background_objects,
    cell_objects,
    render_od,
)
from cyto.errors import ConfigError
from cyto.flags import JpegQuality, Positive, check_seed, check_value
from cyto.outputs_check import refuse_to_replace
from cyto.progress import progress


@dataclass(frozen=True)
class PatchSynthConfig:
    """What ``cyto synth patches`` draws.

    Attributes:
        n_normal: number of normal (lymphocyte-like) patches.
        n_abnormal: patches per abnormal class.
        abnormal_classes: which abnormal classes to draw (default: all).
        size: patch side in pixels.
        seed: the same seed gives the same bytes.
        scale: length scale of cells (1.0: lymphocyte nucleus radius about 19 px; default 1.5).
        quality: JPEG quality (4:4:4 chroma).
    """

    n_normal: int = 600
    n_abnormal: int = 40
    abnormal_classes: tuple[str, ...] = ABNORMAL_CLASSES
    size: int = 192
    seed: int = 0
    scale: float = DEFAULT_SCALE
    quality: int = 95

    def __post_init__(self) -> None:
        if self.n_normal < 1 or self.n_abnormal < 0:
            from cyto.flags import said

            raise ConfigError(  # in the caller's words (round 69, 8)
                f"{said('n_normal')} must be >= 1 and {said('n_abnormal')} >= 0, got "
                f"{self.n_normal} and {self.n_abnormal}"
            )
        if self.size < 32:
            raise ConfigError(f"patch size must be at least 32 px, got {self.size}")
        unknown = [c for c in self.abnormal_classes if c not in ABNORMAL_CLASSES]
        if unknown:
            raise ConfigError(
                f"unknown abnormal class(es) {', '.join(unknown)}; known: "
                f"{', '.join(ABNORMAL_CLASSES)}"
            )
        check_value("scale", self.scale, Positive)
        check_value("quality", self.quality, JpegQuality)
        check_seed(self.seed)


def render_patch(
    cls: str, rng: np.random.Generator, size: int = 192, scale: float = DEFAULT_SCALE
) -> np.ndarray:
    """One patch centred on a cell of class ``cls``, with neighbours, red cells and debris."""
    style = StainStyle.sample(rng)
    cx, cy = size / 2 + rng.normal(0, 1.5 * scale, size=2)
    xs, ys, cl = [cx], [cy], [CELL_CLASSES.index(cls)]
    # neighbours cut by the patch edge
    for _ in range(int(rng.poisson(1.3))):
        a = rng.uniform(0, 2 * np.pi)
        d = size / 2 * rng.uniform(0.85, 1.15) + 10 * scale
        xs.append(cx + d * np.cos(a))
        ys.append(cy + d * np.sin(a))
        cl.append(CELL_CLASSES.index(NORMAL_CLASS))
    cells = cell_objects(np.array(xs), np.array(ys), np.array(cl), rng)

    def scatter(n: int, keep_out: float) -> tuple[np.ndarray, np.ndarray]:
        px = rng.uniform(-10, size + 10, size=n)
        py = rng.uniform(-10, size + 10, size=n)
        ok = np.hypot(px - cx, py - cy) > keep_out
        return px[ok], py[ok]

    rx, ry = scatter(int(rng.poisson(6)), 48 * scale)
    dx, dy = scatter(int(rng.poisson(3)), 30 * scale)
    scene = Scene.concat(
        [
            cells,
            background_objects(rx, ry, KIND_RBC, rng, scale),
            background_objects(dx, dy, KIND_DEBRIS, rng, scale),
        ],
        scale=scale,
    )
    z = float(rng.normal(0.0, 0.35))
    od = render_od(scene, 0, 0, size, size, style, z=z)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size - 0.5
    a, b = rng.uniform(-0.08, 0.08, size=2)
    illumination = (1.0 + a * xx + b * yy).astype(np.float32)
    return od_to_rgb(od, style, rng, illumination)


def patch_seed(seed: int, cls: str, index: int) -> np.random.SeedSequence:
    """Seed of one patch: adding patches or classes never changes the others."""
    return np.random.SeedSequence([seed, CELL_CLASSES.index(cls), index])


def patch_names() -> list[str]:
    """The names :func:`write_patches` writes (``normal/normal_00001.jpg``), by which a dataset
    folder is known as cyto's (it holds no record of its own: a dataset's folders hold images
    only)."""
    return [f"{c}/{c}_[0-9][0-9][0-9][0-9][0-9]*.jpg" for c in CELL_CLASSES]


def write_patches(
    out: Path, config: PatchSynthConfig, overwrite: bool = False, name: str | None = None
) -> dict[str, int]:
    """Draw a class-folder dataset into ``out``; returns the count per class.

    The folder is written under a temporary name and renamed when complete, so an interrupted run
    never leaves a dataset that looks finished. ``name``: ``out`` in the caller's words (``OUT
    PATH`` of ``cyto synth patches``, whose output is positional: it was said ``--out PATH``,
    hostile round 45, 18)."""
    from cyto.locks import folder_lock

    out = Path(out)
    refuse_to_replace(out, overwrite, name=name, known=patch_names())
    out.parent.mkdir(parents=True, exist_ok=True)
    # one run at a time draws into the folder above ``out``: another one waits, then finds
    # the dataset this one wrote and is refused as a later run is (both said "wrote", one
    # dataset was lost); no lock file is left beside the dataset
    with folder_lock(out.parent):
        refuse_to_replace(out, overwrite, name=name, known=patch_names())
        return _write_patches(out, config)


def _write_patches(out: Path, config: PatchSynthConfig) -> dict[str, int]:
    # a name of this run's own: a stopped run's leftovers never look like a dataset
    tmp = temp_dir_beside(out)
    jobs: list[tuple[str, int]] = [(NORMAL_CLASS, i) for i in range(config.n_normal)]
    for cls in config.abnormal_classes:
        jobs += [(cls, i) for i in range(config.n_abnormal)]
    counts: dict[str, int] = {}
    try:
        with progress("synth patches", total=len(jobs), unit="patches") as bar:
            for cls, i in jobs:
                rng = np.random.default_rng(patch_seed(config.seed, cls, i))
                img = render_patch(cls, rng, config.size, config.scale)
                folder = tmp / cls
                folder.mkdir(exist_ok=True)
                Image.fromarray(img).save(
                    folder / f"{cls}_{i + 1:05d}.jpg", quality=config.quality, subsampling=0
                )
                counts[cls] = counts.get(cls, 0) + 1
                bar.advance()
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone once renamed; a stopped run's, else
    return counts
